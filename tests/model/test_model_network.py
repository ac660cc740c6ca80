"""The network on hand-made tensors: token ids, shapes, attention masking, the paper's loss, export."""
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from core.cli import UsageError
from model.config import ENCODERS, NetworkKind, TrainConfig, parse_args
from model.encoding.encoder import SavedModelEncoder, SentenceEncoder
from model.formats.saved_model import ExportableEncoder
from model.net.head import (
    COSINE_SCALE,
    in_batch_loss,
    in_batch_scores,
    triplet_accuracy,
    triplet_and_in_batch_loss,
    triplet_loss,
)
from model.net.network import LENGTH_SLICES, build_models, build_sentence_encoder, build_triplet_model
from model.net.text import WordIds
from model.training.model_dir import ENCODER

REPO = Path(__file__).resolve().parents[2]


# The sections of the four hand-made sentences of the triplet-model tests below.
SECTIONS = np.array([7, 7, 8, 9], np.int64)


def _matrix(rows, dim=6, seed=0):
    return np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)


def test_word_ids_padding_vocabulary_and_oov_buckets():
    word_ids = WordIds(["the", "cat", "sat"], num_oov_buckets=2, max_tokens=4)
    ids = word_ids(tf.constant(["The cat sat.", "cat", "", "the the the the the"])).numpy()
    assert word_ids.num_ids == 6
    assert ids.shape == (4, 4)                       # longest row capped at max_tokens
    assert list(ids[0, :3]) == [1, 2, 3] and ids[0, 3] in (4, 5)   # "." is out of vocabulary
    assert list(ids[1]) == [2, 0, 0, 0] and list(ids[2]) == [0, 0, 0, 0]
    assert word_ids(tf.constant([""])).numpy().shape == (1, 1)      # a time axis even when empty


def test_sentence_embedding_is_600_d_by_default():
    encoder = build_sentence_encoder(_matrix(10, 50))
    assert encoder(np.array([[1, 2, 3, 0]], np.int32)).shape == (1, 600)


def test_attention_ignores_padding():
    encoder = build_sentence_encoder(_matrix(10), lstm_units=4, attention_size=3)
    short = encoder(np.array([[4, 7, 2]], np.int32)).numpy()
    padded = encoder(np.array([[4, 7, 2, 0, 0, 0]], np.int32)).numpy()
    np.testing.assert_allclose(short, padded, rtol=1e-5, atol=1e-6)
    other = encoder(np.array([[4, 7, 3]], np.int32)).numpy()
    assert not np.allclose(short, other)


@pytest.mark.parametrize("slices", [1, 3])
def test_triplet_model_outputs_l1_distances_from_shared_sentences(slices):
    encoder = build_sentence_encoder(_matrix(10), lstm_units=4, attention_size=3)
    model = build_triplet_model(encoder, slices=slices)
    sentences = np.array([[3, 0, 0], [1, 2, 0], [4, 5, 0], [6, 7, 9]], np.int32)   # distinct, shortest first
    roles = np.array([[1, 1, 3], [0, 2, 0]], np.int32)                           # rows of (x, x+, x-)
    distances = model({"sentences": sentences[None], "roles": roles[None], "sections": SECTIONS[None]}).numpy()
    assert distances.shape == (2, 2)
    embedded = encoder(sentences).numpy()
    for triplet, (anchor, positive, negative) in enumerate(roles):
        np.testing.assert_allclose(distances[triplet], [np.abs(embedded[anchor] - embedded[positive]).sum(),
                                                           np.abs(embedded[anchor] - embedded[negative]).sum()],
                                   rtol=1e-5)
    assert distances[0, 0] == 0 and distances[1, 1] == 0         # a sentence is at distance 0 of itself


def test_cosine_head_gives_scaled_cosine_distances():
    encoder = build_sentence_encoder(_matrix(10), lstm_units=4, attention_size=3)
    model = build_triplet_model(encoder, slices=2, distance="cosine")
    sentences = np.array([[3, 0, 0], [1, 2, 0], [4, 5, 0], [6, 7, 9]], np.int32)
    roles = np.array([[1, 1, 3], [0, 2, 0]], np.int32)
    distances = model({"sentences": sentences[None], "roles": roles[None], "sections": SECTIONS[None]}).numpy()
    unit = encoder(sentences).numpy()
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    for triplet, (anchor, positive, negative) in enumerate(roles):
        np.testing.assert_allclose(distances[triplet], COSINE_SCALE * (1 - np.array(
            [unit[anchor] @ unit[positive], unit[anchor] @ unit[negative]])), rtol=1e-4, atol=1e-5)
    assert abs(distances[0, 0]) < 1e-5 and abs(distances[1, 1]) < 1e-5


def test_paper_loss_and_accuracy_on_hand_made_distances():
    distances = tf.constant([[0.0, 100.0], [100.0, 0.0], [3.0, 3.0], [1.0, 2.0]])
    labels = tf.zeros([4], tf.int32)
    loss = triplet_loss(labels, distances).numpy()
    np.testing.assert_allclose(loss[:3], [0.0, 2.0, 1.0], atol=1e-6)    # p(d+)=0 -> 0, p(d+)=1 -> 2
    np.testing.assert_allclose(loss[3], 2 * np.exp(1) / (np.exp(1) + np.exp(2)), rtol=1e-5)
    np.testing.assert_array_equal(triplet_accuracy(labels, distances).numpy(), [1, 0, 0, 1])


# Five distinct sentences as 2-d unit vectors, their sections (-1: a padding row), and two
# triplets (anchor, positive, negative rows) of section 7.
EMBEDDINGS = np.array([[1, 0], [0.6, 0.8], [0, 1], [-1, 0], [0.8, 0.6]], np.float32)
BATCH_SECTIONS = np.array([7, 7, 8, 7, -1], np.int64)
BATCH_ROLES = np.array([[0, 1, 2], [3, 1, 2]], np.int32)


def test_the_in_batch_mask_leaves_out_exactly_the_anchors_section_and_padding():
    scores = in_batch_scores(EMBEDDINGS[None], BATCH_ROLES[None], BATCH_SECTIONS[None],
                             "cosine").numpy()
    assert scores.shape == (2, 1 + 5)
    candidates = scores[:, 1:] > -1e8
    # Rows 0, 1 and 3 are section 7 (the anchors', the positive and the other anchor); row 4 pads.
    np.testing.assert_array_equal(candidates, [[False, False, True, False, False]] * 2)
    other_sections = np.array([7, 8, 9, 8, -1], np.int64)      # row 3 now of section 9, row 1 of 8
    scores = in_batch_scores(EMBEDDINGS[None], np.array([[[0, 1, 2]]]), other_sections[None],
                             "l1").numpy()
    np.testing.assert_array_equal(scores[0, 1:] > -1e8, [False, True, True, True, False])
    np.testing.assert_allclose(scores[0, 0], -np.abs(EMBEDDINGS[0] - EMBEDDINGS[1]).sum(), rtol=1e-6)


def test_in_batch_loss_by_hand():
    """InfoNCE over the positive and the unmasked candidates, with cosine scaled as the head's:
    score = -COSINE_SCALE x (1 - cos). Triplet 0: anchor (1, 0), positive (.6, .8), one
    candidate, the negative (0, 1); triplet 1: anchor (-1, 0), the same positive and negative."""
    scores = in_batch_scores(EMBEDDINGS[None], BATCH_ROLES[None], BATCH_SECTIONS[None],
                             "cosine")
    distances = tf.constant([[COSINE_SCALE * 0.4, COSINE_SCALE * 1.0], [COSINE_SCALE * 1.6, COSINE_SCALE * 1.0]])
    outputs = tf.concat([distances, scores], axis=-1)
    labels = tf.zeros([2], tf.int32)

    def by_hand(cos_positive, cos_negative):   # -log(e^{s+} / (e^{s+} + e^{s-})), s = 20 (cos - 1)
        positive, negative = COSINE_SCALE * (cos_positive - 1), COSINE_SCALE * (cos_negative - 1)
        return -positive + np.log(np.exp(positive) + np.exp(negative))

    expected = [by_hand(0.6, 0.0), by_hand(-0.6, 0.0)]
    np.testing.assert_allclose(in_batch_loss(labels, outputs).numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(triplet_and_in_batch_loss(labels, outputs).numpy(),
                               np.array(expected) + triplet_loss(labels, distances).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(triplet_accuracy(labels, outputs).numpy(), [1, 0])   # reads d+, d- alone


@pytest.mark.parametrize("loss", ["in-batch", "sum"])
def test_triplet_model_with_an_in_batch_loss_outputs_distances_then_scores(loss):
    encoder = build_sentence_encoder(_matrix(10), lstm_units=4, attention_size=3)
    model = build_triplet_model(encoder, slices=2, distance="cosine", loss=loss)
    sentences = np.array([[3, 0, 0], [1, 2, 0], [4, 5, 0], [6, 7, 9]], np.int32)
    roles = np.array([[1, 1, 3], [0, 2, 0]], np.int32)
    outputs = model({"sentences": sentences[None], "roles": roles[None], "sections": SECTIONS[None]}).numpy()
    assert outputs.shape == (2, 2 + 1 + 4)
    np.testing.assert_allclose(outputs[:, 2], -outputs[:, 0], rtol=1e-5, atol=1e-5)   # the positive's score is -d+
    unit = encoder(sentences).numpy()
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    np.testing.assert_allclose(outputs[1, 5], -COSINE_SCALE * (1 - unit[0] @ unit[2]), rtol=1e-4, atol=1e-4)
    assert (outputs[0, 3:5] < -1e8).all() and (outputs[1, 3:5] < -1e8).all()   # rows 0, 1: section 7


# ----------------------------------------------------------------------------- network kinds
def test_each_network_kind_answers_for_its_behaviour():
    assert ENCODERS == tuple(kind.value for kind in NetworkKind) == ("bilstm", "minilm", "mpnet")
    bilstm = NetworkKind.BILSTM
    assert (bilstm.pretrained, bilstm.reads_word_vectors, bilstm.weight_decay, bilstm.exports_sentence_transformers) \
        == (False, True, False, False)
    for checkpoint in (NetworkKind.MINILM, NetworkKind.MPNET):
        assert (checkpoint.pretrained, checkpoint.reads_word_vectors, checkpoint.weight_decay,
                checkpoint.exports_sentence_transformers) == (True, False, True, True)
    assert (bilstm.label(300), NetworkKind.MINILM.label(300), NetworkKind.MPNET.label(300)) \
        == ("BiLSTM 300", "minilm", "mpnet")


@pytest.mark.parametrize("encoder, learning_rate, distance, dropout", [("bilstm", 1e-3, "l1", 0.2),
                                                                      ("minilm", 5e-5, "cosine", None),
                                                                      ("mpnet", 5e-5, "cosine", None)])
def test_flags_left_at_none_take_the_kinds_defaults(encoder, learning_rate, distance, dropout):
    config = parse_args(["--data", "d", "--model-dir", "m", "--encoder", encoder])
    assert config.network.kind is NetworkKind(encoder)
    assert type(config.flags()["encoder"]) is str     # history.json and inputs.json keep the flag's string
    assert [config.resolved(name) for name in ("learning_rate", "distance", "dropout")] == [learning_rate, distance,
                                                                                            dropout]
    assert config.with_flags(teacher="t").resolved("distance") == "cosine"
    assert config.with_flags(distance="l1", dropout=0.1).resolved("distance") == "l1"


def test_an_unknown_kind_or_distance_is_refused_naming_the_choices():
    with pytest.raises(UsageError, match=r"^--encoder must be one of \('bilstm', 'minilm', 'mpnet'\), got 'lstm'$"):
        parse_args(["--data", "d", "--model-dir", "m", "--encoder", "lstm"])
    with pytest.raises(UsageError, match=r"^--distance must be one of \('l1', 'cosine'\) or none, got 'dot'$"):
        parse_args(["--data", "d", "--model-dir", "m", "--distance", "dot"])


def _tiny(**flags):
    return TrainConfig.from_flags(**{"data": "d", "model_dir": "m", "lstm_units": 4, "attention_size": 3, **flags})


def test_the_trainers_models_are_built_as_the_flags_say():
    encoder, model = build_models(_tiny(fine_tune_embeddings=True, dropout=0.3), _matrix(10), global_batch=8)
    assert encoder.get_layer("bilstm").forward_layer.units == 4 and encoder.get_layer("dropout").rate == 0.3
    assert encoder.get_layer("word_vectors").trainable
    head = model.get_layer("distances")
    assert (head.distance, head.slices) == ("l1", LENGTH_SLICES)
    assert type(model.optimizer) is keras.optimizers.Adam and not model.jit_compile   # no weight decay for a BiLSTM
    _, model = build_models(_tiny(distance="cosine", jit_compile=True), _matrix(10), global_batch=8, slices=2)
    assert (model.get_layer("distances").distance, model.get_layer("distances").slices) == ("cosine", 2)
    assert model.jit_compile


@pytest.mark.slow   # seconds of real work: the fast tier stays under 3 minutes
def test_the_benchmark_times_the_trainers_models(tmp_path):
    """Every variant but the three-call baseline is `build_models`' triplet model, compiled alike."""
    from model_shards import written_train_triplets

    from model.training.throughput import variants

    data = str(tmp_path)
    triplets = written_train_triplets(data, sizes={"train": 16, "validation": 4, "test": 4}, shards=1)
    word_ids = WordIds(["the", "a"], num_oov_buckets=1, max_tokens=8)
    timed = variants(_tiny(data=data), triplets, word_ids, _matrix(word_ids.num_ids))
    assert list(timed) == ["baseline", "+one call", "+length groups", "+batch 128", "+article chunks",
                           "+length slices 2", "+length slices 3", "+XLA"]
    _, trainers = build_models(_tiny(data=data), _matrix(word_ids.num_ids), global_batch=128)
    for name, (model, _) in timed.items():
        assert type(model.optimizer) is type(trainers.optimizer)
        assert model.jit_compile == (name == "+XLA")
        assert [w.shape for w in model.trainable_weights] == [w.shape for w in trainers.trainable_weights]
    heads = {name: model.get_layer("distances") for name, (model, _) in timed.items() if name != "baseline"}
    assert {name: head.slices for name, head in heads.items()} == {
        "+one call": 1, "+length groups": 1, "+batch 128": 1, "+article chunks": 1, "+length slices 2": 2,
        "+length slices 3": 3, "+XLA": LENGTH_SLICES}
    assert {head.distance for head in heads.values()} == {"l1"}
    assert set(timed["baseline"][0].input) == {"anchor", "positive", "negative"}   # the encoder called per role


@pytest.mark.slow   # seconds: the full tier (the fast tier stays under 3 minutes)
def test_export_load_encode_equals_in_memory(tmp_path):
    word_ids = WordIds(["the", "cat", "sat", "on", "mat"], num_oov_buckets=1, max_tokens=8)
    encoder = build_sentence_encoder(_matrix(word_ids.num_ids), lstm_units=5, attention_size=3)
    sentences = ["The cat sat on the mat.", "A dog!", "", "the " * 20]
    in_memory = encoder(word_ids(tf.constant(sentences))).numpy()
    ExportableEncoder(word_ids, encoder, similarity="l1").export(str(tmp_path / "m" / ENCODER))

    loaded = SavedModelEncoder(str(tmp_path / "m"), batch_size=3)    # model dir or encoder dir both work
    assert isinstance(loaded, SentenceEncoder) and loaded.name == "m"
    encoded = loaded.encode(sentences)
    assert encoded.dtype == np.float32 and encoded.shape == (4, 10)
    np.testing.assert_allclose(encoded, in_memory, rtol=1e-5, atol=1e-6)
    assert loaded.encode([]).shape == (0, 10)
    signature = tf.saved_model.load(str(tmp_path / "m" / ENCODER)).signatures["serving_default"]
    assert signature.structured_outputs["embeddings"].dtype == tf.float32
    with pytest.raises(FileNotFoundError, match="nowhere"):
        SavedModelEncoder(str(tmp_path / "nowhere"))
    single = loaded.encode("The cat sat on the mat.")                     # a string is one sentence: [d]
    assert single.shape == (10,)
    unit = loaded.encode(sentences[:2], normalize_embeddings=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, rtol=1e-5)
    assert loaded.similarity_fn_name == "manhattan"                      # recorded by the export, by ST's name
    assert loaded.max_seq_length == 8 and loaded.get_sentence_embedding_dimension() == 10
    similarities = loaded.similarity(single, encoded)                    # [1, 4]: negative L1 distances
    np.testing.assert_allclose(similarities, -np.abs(encoded - single).sum(axis=1)[None], rtol=1e-5)
    assert similarities.shape == (1, 4) and np.argmax(similarities) == 0

    # A fresh interpreter with nothing else imported (the tokenizer's ops must get registered).
    code = ("import sys; from model.encoding.encoder import load_encoder; "
            "print(load_encoder(sys.argv[1]).encode('The cat sat on the mat.').tolist())")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    np.testing.assert_allclose(json.loads(done.stdout.strip().splitlines()[-1]), in_memory[0], rtol=1e-5, atol=1e-6)
