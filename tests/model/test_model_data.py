"""The trainer's input (`model.training.arrays`): every triplet once per pass, roles aligned,
shared sentences encoded once, each with its section; article chunks, length groups."""
import collections
import itertools
import random

import numpy as np
import pytest

from core.records import ROLES
from model.net.text import ArrayIds, WordIds
from model.training.arrays import LENGTH_BOUNDARIES, batch_arrays, grouped, shuffled

WORDS = [f"w{i}" for i in range(40)]


def _triplets(n: int, seed: int = 0, articles: int = 7) -> list[dict]:
    """Triplet k's sentences start with the marker word `k{k}` and differ in length (2..60 tokens),
    from section k % 3 of its article; its negative is one of a few sentences of its article
    (sections 10, 11, 12), shared with the article's other triplets."""
    rng = random.Random(seed)
    shared = {a: [f"shared{a} " + " ".join(rng.choices(WORDS, k=rng.randint(1, 40))) for _ in range(3)]
              for a in range(articles)}
    triplets = []
    for k in range(n):
        article = k % articles
        triplet = {key: " ".join([f"k{k}"] + rng.choices(WORDS, k=rng.randint(1, 59)))
                   for key in ("anchor", "positive")}
        negative = rng.randrange(3)
        triplets.append({**triplet, "negative": shared[article][negative], "article_id": article,
                         "anchor_section_index": k % 3, "negative_article_id": article,
                         "negative_section_index": 10 + negative})
    return triplets


def _word_ids(n):
    return ArrayIds(WordIds([f"k{k}" for k in range(n)] + [f"shared{a}" for a in range(10)] + WORDS, max_tokens=64))


def training_batches(triplets, tokenizer, batch_size, replicas=1, static=False, **grouping):
    """The trainer's batches of `triplets` (`grouped`, then `batch_arrays`)."""
    grouping = {"article_chunk": 16, **grouping}
    for group in grouped(triplets, batch_size * replicas, tokenizer, **grouping):
        yield batch_arrays(group, tokenizer, batch_size, replicas, static=static)


def _decoded_triplets(inputs, weights, vocabulary):
    """The (anchor, positive, negative) token lists of every real (weight 1) triplet of a batch."""
    words = ["<pad>"] + vocabulary
    out = []
    blocks = inputs["roles"].shape[0]
    for sentences, roles, weight in zip(inputs["sentences"], inputs["roles"], weights.reshape(blocks, -1)):
        text = [" ".join(words[i] for i in row if i) for row in sentences]
        out += [tuple(text[row] for row in triplet) for triplet, w in zip(roles, weight) if w]
    return out


@pytest.mark.parametrize("options", [dict(article_chunk=4), dict(article_chunk=0),
                                     dict(article_chunk=0, group_by_length=False), dict(article_chunk=4, replicas=3),
                                     dict(article_chunk=4, replicas=2, static=True)])
def test_every_triplet_once_per_pass_with_its_roles_together(options):
    triplets = _triplets(300)
    word_ids = _word_ids(300)
    vocabulary = [f"k{k}" for k in range(300)] + [f"shared{a}" for a in range(10)] + WORDS
    expected = collections.Counter(tuple(t[key] for key in ROLES) for t in triplets)
    seen = collections.Counter()
    for inputs, labels, weights in training_batches(triplets, word_ids, 16, shuffle_buffer=100, seed=3, **options):
        replicas = options.get("replicas", 1)
        assert inputs["sentences"].shape[0] == inputs["roles"].shape[0] == replicas
        assert labels.shape == weights.shape == (replicas * inputs["roles"].shape[1],)   # one per triplet
        assert weights.sum() <= 16 * replicas
        seen.update(_decoded_triplets(inputs, weights, vocabulary))
    assert seen == expected                                # each triplet exactly once, roles aligned


def _records_of(plan, limit):
    """The (shard, record index) a reader of `shard_stream`'s plan reads, up to `limit` of them."""
    read = []
    for path, skip in plan:
        read += [(path, index) for index in range(skip, SHARD_SIZES[path])]
        if len(read) >= limit:
            return read[:limit]
    return read


SHARD_SIZES = {"a": 5, "b": 0, "c": 7, "d": 3, "e": 6}


def test_a_resumed_stream_starts_at_its_record_without_reading_what_came_before():
    """What `model.train` relies on when it resumes at a backup's step: the stream, planned
    again from the record its step reached, skips whole shards unread and continues exactly
    there (across pass boundaries too)."""
    from model.training.shards import shard_stream

    shards = list(SHARD_SIZES.items())
    unbroken = _records_of(shard_stream(shards, seed=3), 80)          # 21 records a pass: nearly 4 passes
    for start in (0, 4, 5, 13, 21, 30, 61):
        plan = list(itertools.islice(shard_stream(shards, seed=3, start=start), 20))
        assert _records_of(plan, 80 - start) == unbroken[start:]
        assert plan[0][1] < SHARD_SIZES[plan[0][0]]                   # the first shard is read from its record on
    passes = [sorted(unbroken[21 * p:21 * (p + 1)]) for p in range(3)]
    assert passes[0] == passes[1] == passes[2] == sorted((path, i) for path, n in shards for i in range(n))
    assert unbroken[:21] != unbroken[21:42]                          # each pass in another shard order


def test_workers_stream_disjoint_shards_and_every_record_once_per_pass():
    from model.training.shards import TripletDataError, shard_stream

    shards = list(SHARD_SIZES.items())
    for workers in (2, 3):
        for passes in range(3):   # pass p: worker w reads every workers-th shard of the pass's permutation
            order = np.random.default_rng([3, passes]).permutation(len(shards))
            owned = [[shards[i][0] for i in order[worker::workers] if shards[i][1]] for worker in range(workers)]
            assert sorted(path for paths in owned for path in paths) == sorted(p for p, n in shards if n)
            for worker in range(workers):
                before = sum(SHARD_SIZES[shards[i][0]] for p in range(passes)
                             for i in np.random.default_rng([3, p]).permutation(len(shards))[worker::workers])
                plan = list(itertools.islice(shard_stream(shards, 3, worker, workers, start=before),
                                             len(owned[worker])))
                assert [path for path, _ in plan] == owned[worker] and all(skip == 0 for _, skip in plan)
    with pytest.raises(TripletDataError, match="5 shard"):
        next(shard_stream(shards, 3, 0, 6))


def test_shared_sentences_are_encoded_once_and_sorted_by_length():
    triplets = [t for t in _triplets(60) if t["article_id"] == 0]
    inputs, _, weights = batch_arrays(triplets, _word_ids(60), len(triplets), static=False)
    sentences = inputs["sentences"][0]
    assert len(sentences) == len({t[key] for t in triplets for key in ROLES}) < 3 * len(triplets)
    lengths = (sentences > 0).sum(axis=1)
    assert (np.diff(lengths) >= 0).all()                    # shortest first: slices cut padding
    assert weights.sum() == len(triplets)


@pytest.mark.parametrize("replicas", [1, 2])
def test_each_sentence_carries_its_section_and_padding_none(replicas):
    """What the in-batch loss masks by: the anchor's and positive's section is the anchor's, the
    negative's its own, numbered within the block (int32: one number per section key, and one key
    per number); the rows padding a block to the batch's size have no section."""
    from model.training.shards import NO_SECTION, SECTIONS_PER_ARTICLE

    triplets = _triplets(40, articles=3)
    vocabulary = ["<pad>"] + [f"k{k}" for k in range(40)] + [f"shared{a}" for a in range(10)] + WORDS
    section_of = {}
    for t in triplets:
        section_of[t["anchor"]] = section_of[t["positive"]] = t["article_id"] * SECTIONS_PER_ARTICLE + \
            t["anchor_section_index"]
        section_of[t["negative"]] = t["negative_article_id"] * SECTIONS_PER_ARTICLE + t["negative_section_index"]
    inputs, _, _ = batch_arrays(triplets[:39], _word_ids(40), 20, replicas, static=False)
    distinct = 0
    assert inputs["sections"].dtype == np.int32
    for sentences, sections in zip(inputs["sentences"], inputs["sections"]):
        key_of_number: dict[int, int] = {}
        for row, section in zip(sentences, sections):
            text = " ".join(vocabulary[i] for i in row if i)
            if section == NO_SECTION:
                continue
            assert section >= 0 and key_of_number.setdefault(int(section), section_of[text]) == section_of[text]
            distinct += 1
        assert len(set(key_of_number.values())) == len(key_of_number)   # another key, another number
    per_block = [len({t[key] for t in block for key in ROLES})
                 for block in ([triplets[:39]] if replicas == 1 else [triplets[:20], triplets[20:39]])]
    assert distinct == sum(per_block)
    assert (inputs["sections"] == NO_SECTION).sum() == replicas * max(per_block) - sum(per_block)


def test_article_chunks_keep_an_article_together():
    triplets = sorted(_triplets(280, articles=7), key=lambda t: t["article_id"])   # as written: articles together
    batches = training_batches(triplets, _word_ids(280), 8, shuffle_buffer=280, article_chunk=8)
    for inputs, _, _ in batches:      # 8 triplets = one chunk = one article: its 3 negatives are shared
        shared_rows = [row for row in inputs["sentences"][0] if row[0] > 280]
        assert len({row[0] for row in shared_rows}) == 1
        assert len(shared_rows) <= 3


def test_length_groups_pad_to_similar_lengths():
    triplets = _triplets(400)
    lengths = {t["anchor"].split()[0]: max(len(t[key].split()) for key in ROLES) for t in triplets}
    vocabulary = ["<pad>"] + [f"k{k}" for k in range(400)]
    seen = 0
    for inputs, _, weights in training_batches(triplets, _word_ids(400), 16, article_chunk=0, shuffle_buffer=50):
        markers = {vocabulary[row[0]] for row in inputs["sentences"][0] if 0 < row[0] <= 400}
        groups = {sum(lengths[m] >= bound for bound in LENGTH_BOUNDARIES) for m in markers}
        assert len(groups) == 1                                # a batch holds one length group
        seen += int(weights.sum())
    assert seen == 400


def test_a_shuffle_buffer_gives_every_item_once_in_another_seeded_order():
    items = list(range(100))
    once, again, other = (list(shuffled(items, 10, seed)) for seed in (3, 3, 4))
    assert sorted(once) == items and once == again != other != items
    assert all(item - 10 <= position for position, item in enumerate(once))   # none out before the buffer reached it


@pytest.mark.slow   # Keras training
def test_keras_metrics_weigh_every_triplet_alike_across_uneven_batches():
    """evaluate's accuracy is the share of triplets right, not a mean of batch means (the last,
    smaller batch of a pass must not count as much as a full one). Multi-replica blocks are
    checked by the mirrored training test."""
    from model.net.network import build_sentence_encoder, build_triplet_model, compile_triplet_model

    triplets = _triplets(70)
    word_ids = _word_ids(70)
    matrix = np.random.default_rng(0).normal(size=(word_ids.num_ids, 6)).astype(np.float32)
    model = build_triplet_model(build_sentence_encoder(matrix, lstm_units=4, attention_size=3))
    compile_triplet_model(model)
    from model.training.tf_input import dataset

    batches = list(training_batches(triplets, word_ids, 16, article_chunk=0, group_by_length=False))   # 4 x 16 + 6
    right = 0
    for inputs, _, _ in batches:
        distances = model(inputs).numpy()
        right += int((distances[:, 0] < distances[:, 1]).sum())
    fed = dataset(lambda: iter(batches), length=len(batches))
    assert model.evaluate(fed, verbose=0, return_dict=True)["triplet_accuracy"] == pytest.approx(right / 70)


def test_a_run_whose_triplets_carry_other_features_is_refused_naming_the_manifest(tmp_path):
    import json

    from core.folders import write_manifest
    from core.published import MANIFEST
    from model.training.shards import TripletDataError, list_shards

    written = write_manifest(str(tmp_path), {"triplets-sen/train": 0}).to_json()
    assert list_shards(str(tmp_path), "triplets-sen", "train") == []
    features = {**written["triplet_features"], ROLES[2]: "int64"}
    features.pop("article_id")
    (tmp_path / MANIFEST).write_text(json.dumps({**written, "triplet_features": features}))
    with pytest.raises(TripletDataError, match=r"manifest.json: its triplets carry negative \(int64\), "
                                               r"article_id \(missing\)"):
        list_shards(str(tmp_path), "triplets-sen", "train")
