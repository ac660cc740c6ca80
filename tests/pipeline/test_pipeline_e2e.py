"""The whole pipeline on the real embedded Wikipedia excerpt, outputs read back with tf.data.

Checks the data contracts independently of the pipeline's own bookkeeping: anchors and
positives are located in the passages file (same section, paragraph openers, at most 3
paragraphs apart), negatives in the neighbouring section, token counts recounted with spaCy,
page counts recounted with mwxml.
"""
import bz2
import glob
import gzip
import html
import json
import subprocess
import sys
from pathlib import Path

import mwxml
import pytest
import tensorflow as tf
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, SetupOptions, StandardOptions
from dump_support import ALL_NEGATIVES

from core.cli import UsageError
from core.counters import PAGE_OUTCOMES
from core.records import SENTENCE_DATASETS
from core.splits import SPLITS, split_of
from model.training.tf_input import triplet_feature_spec
from pipeline import run
from pipeline.parse.sentences import SentenceSplitter
from pipeline.read.dumps import DumpInputError, embedded_dump_path
from pipeline.triplets.rules import is_removed_section

pytestmark = pytest.mark.slow   # whole pipeline runs

DATASETS = ("triplets-sen", "triplets-sen-same_article", "triplets-sen-other_article", "triplets-titles")


def read_triplets(out: Path, dataset: str, split: str) -> list[dict]:
    files = sorted(glob.glob(str(out / dataset / split / "part-*-of-*.tfrecord.gz")))
    assert files, f"no shard for {dataset}/{split}"
    parsed = tf.data.TFRecordDataset(files, compression_type="GZIP").map(
        lambda record: tf.io.parse_single_example(record, triplet_feature_spec())
    )
    return [
        {name: (value.numpy().decode("utf-8") if value.dtype == tf.string else int(value))
         for name, value in ex.items()}
        for ex in parsed
    ]


def read_json_lines(out: Path, folder: str) -> list[dict]:
    return [json.loads(line) for path in sorted(glob.glob(str(out / folder / "*.jsonl.gz")))
            for line in gzip.open(path, "rt")]


@pytest.fixture(scope="module")
def outputs(embedded_pipeline_output):
    out = embedded_pipeline_output
    return {
        "stats": json.loads((out / "stats.json").read_text()),
        "triplets": {(d, s): read_triplets(out, d, s) for d in DATASETS for s in SPLITS},
        "passages": {p["article_id"]: p for p in read_json_lines(out, "passages")},
        "scb": read_json_lines(out, "scb"),
        "dead_letters": read_json_lines(out, "dead_letters"),
    }


def test_counters_reconcile_with_the_dump_and_the_outputs(outputs):
    counters = outputs["stats"]["counters"]
    with bz2.open(embedded_dump_path()) as stream:
        pages = [(page.namespace, page.redirect) for page in mwxml.Dump.from_file(stream)]
    assert counters["pages_read"] == len(pages)
    assert counters["pages_non_article"] == sum(1 for ns, _ in pages if ns != 0)
    assert counters["pages_redirect"] == sum(1 for ns, redirect in pages if ns == 0 and redirect)
    outcomes = outputs["stats"]["reconciliation"]["outcomes"]
    assert set(outcomes) == set(PAGE_OUTCOMES)
    assert counters["pages_read"] == sum(counters[name] for name in PAGE_OUTCOMES)
    assert outputs["stats"]["reconciliation"]["balanced"] is True
    assert counters["articles_used"] == counters["passages_articles"] == len(outputs["passages"]) > 20
    for (dataset, split), records in outputs["triplets"].items():
        assert counters[f"{dataset}/{split}"] == len(records)
    # Every (positive pair, neighbour) slot gives a triplet or is counted as unfilled, per strategy.
    unfilled = {"adjacent": "triplets_adjacent_no_opener_negative",
                "same_article": "triplets_same_article_no_opener_negative",
                "other_article": "triplets_other_article_no_donor"}
    for dataset, strategy in SENTENCE_DATASETS.items():
        written = sum(len(outputs["triplets"][(dataset, split)]) for split in SPLITS)
        assert written + counters[unfilled[strategy]] == counters["triplet_slots"] > written / 2
    assert counters["triplets_adjacent_no_opener_negative"] > 0  # the excerpt has sections without openers
    assert counters["scb_articles"] == len(outputs["scb"])
    assert counters["scb_sentences"] == sum(len(a["sentences"]) for a in outputs["scb"])
    assert counters["dead_letters_written"] == len(outputs["dead_letters"])
    assert counters["sentences_too_short"] > 0 and counters["sentences_too_long"] > 0
    assert counters["sections_removed_by_title"] > 0


def test_splits_are_disjoint_by_article_and_follow_the_article_hash(outputs):
    articles_by_split = {split: set() for split in SPLITS}
    for (_, split), records in outputs["triplets"].items():
        for record in records:
            assert split_of(record["article_id"], 0) == split
            articles_by_split[split].add(record["article_id"])
    assert all(articles_by_split.values()), "every split of the excerpt gets articles"
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not articles_by_split[a] & articles_by_split[b]
    for article in outputs["passages"].values():
        assert article["split"] == split_of(article["article_id"], 0)


def _locate(passage_section: dict, sentence: str) -> list[int]:
    """Indices of the section's paragraphs that contain the sentence."""
    return [i for i, p in enumerate(passage_section["paragraphs"]) if sentence in p["text"]]


def test_sentence_triplets_follow_the_paper_rules(outputs):
    passages = outputs["passages"]
    checked = 0
    for dataset in DATASETS[:3]:
        for split in SPLITS:
            for t in outputs["triplets"][(dataset, split)]:
                sections = passages[t["article_id"]]["sections"]
                anchor_section = sections[t["anchor_section_index"]]
                assert anchor_section["title"] == t["anchor_section"]
                # Anchor and positive open their paragraphs in the anchor's section, <= 3 apart.
                paragraphs = anchor_section["paragraphs"]
                assert paragraphs[t["anchor_paragraph"]]["text"].startswith(t["anchor"])
                assert paragraphs[t["positive_paragraph"]]["text"].startswith(t["positive"])
                assert 0 < t["positive_paragraph"] - t["anchor_paragraph"] <= 3
                negative_sections = passages[t["negative_article_id"]]["sections"]
                negative_section = negative_sections[t["negative_section_index"]]
                assert negative_section["title"] == t["negative_section"]
                # The negative opens its paragraph too: all three sentences are paragraph openers.
                assert negative_section["paragraphs"][t["negative_paragraph"]]["text"].startswith(t["negative"])
                assert (t["kind"], t["strategy"]) == ("sen", SENTENCE_DATASETS[dataset])
                if t["strategy"] == "adjacent":
                    assert t["negative_article_id"] == t["article_id"]
                    assert abs(t["negative_section_index"] - t["anchor_section_index"]) == 1
                elif t["strategy"] == "same_article":
                    assert t["negative_article_id"] == t["article_id"]
                    assert t["negative_section_index"] != t["anchor_section_index"]
                else:
                    assert t["negative_article_id"] != t["article_id"]
                checked += 1
    assert checked > 1000


def test_no_removed_sections_and_token_counts_within_5_to_50(outputs):
    splitter = SentenceSplitter()
    sentences = set()
    for records in outputs["triplets"].values():
        for t in records:
            assert not is_removed_section(t["anchor_section"]) and not is_removed_section(t["negative_section"])
            sentences.add(t["anchor"])
            if t["kind"] == "sen":
                sentences.update((t["positive"], t["negative"]))
    for article in outputs["passages"].values():
        assert not any(is_removed_section(s["title"]) for s in article["sections"])
        assert len(article["sections"]) >= 5
    sentences = sorted(sentences)
    counts = [sum(sentence.n_tokens for sentence in split) for split in splitter.split(sentences)]
    assert all(5 <= n <= 50 for n in counts)


def test_title_triplets_pair_a_section_pivot_with_article_and_section_titles(outputs):
    passages = outputs["passages"]
    for split in SPLITS:
        for t in outputs["triplets"][("triplets-titles", split)]:
            assert t["positive"] == f"{t['title']} {t['anchor_section']}"
            assert t["negative"] == f"{t['title']} {t['negative_section']}"
            assert abs(t["negative_section_index"] - t["anchor_section_index"]) == 1
            assert _locate(passages[t["article_id"]]["sections"][t["anchor_section_index"]], t["anchor"])


def test_scb_holds_every_test_article_with_5_to_12_sections_and_nothing_else(outputs):
    scb = {a["article_id"]: a for a in outputs["scb"]}
    expected = {
        a["article_id"] for a in outputs["passages"].values() if a["split"] == "test" and 5 <= len(a["sections"]) <= 12
    }
    assert set(scb) == expected and expected
    for article_id, record in scb.items():
        assert split_of(article_id, 0) == "test"
        assert record["sections"] == [s["title"] for s in outputs["passages"][article_id]["sections"]]
        assert len(record["sentences"]) == len(record["labels"]) == len(record["openers"])
        passage_sections = outputs["passages"][article_id]["sections"]
        for sentence, label, opener in zip(record["sentences"], record["labels"], record["openers"]):
            found = _locate(passage_sections[label], sentence)
            assert found
            if opener:
                assert any(passage_sections[label]["paragraphs"][i]["text"].startswith(sentence) for i in found)
        assert any(record["openers"]) and not all(record["openers"])


# --- a small dump assembled from real pages, plus one page mwparserfromhell cannot parse ---

UNPARSABLE_ID = 999_999_001
GIANT_ID = 999_999_002


def _page_xml(page_id: int, title: str, text: str) -> str:
    return (
        f"  <page>\n    <title>{html.escape(title)}</title>\n    <ns>0</ns>\n    <id>{page_id}</id>\n"
        f"    <revision>\n      <id>{page_id}</id>\n      <timestamp>2016-04-22T10:19:33Z</timestamp>\n"
        "      <contributor>\n        <ip>127.0.0.1</ip>\n      </contributor>\n"
        "      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
        f'      <text xml:space="preserve">{html.escape(text, quote=False)}</text>\n    </revision>\n  </page>\n'
    )


@pytest.fixture(scope="module")
def small_dump(tmp_path_factory) -> str:
    """The embedded dump's header and its first 30 pages, plus a page of 5000 nested templates and
    an article of 6 sections, one of them a paragraph of 1.2 M characters (more than spaCy takes)."""
    with bz2.open(embedded_dump_path(), "rt", encoding="utf-8") as stream:
        text = stream.read()
    starts = [0]
    for _ in range(31):
        starts.append(text.index("  <page>", starts[-1] + 1))
    starts = starts[1:]
    header, pages = text[: starts[0]], text[starts[0]: starts[30]]
    broken = _page_xml(UNPARSABLE_ID, "Nested templates", "{{" * 5000 + "x" + "}}" * 5000)
    opener = "The river flows through the old town and past the harbour before it reaches the sea. "
    sections = "".join(f"== Part {n} ==\n{opener * (14_000 if n == 3 else 1)}\n\n{opener}\n\n" for n in range(6))
    giant = _page_xml(GIANT_ID, "Giant paragraph", opener + "\n\n" + sections)
    path = tmp_path_factory.mktemp("dump") / "small.xml"
    path.write_text(header + pages + broken + giant + "</mediawiki>\n", encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def small_run(small_dump, tmp_path_factory) -> tuple[Path, dict]:
    """The pipeline on the small dump, default (in-memory) DirectRunner."""
    out = tmp_path_factory.mktemp("small-out")
    return out, run.main(["--output", str(out), "--input", small_dump, *ALL_NEGATIVES])


def test_a_page_that_fails_to_parse_is_counted_and_dead_lettered_and_empty_splits_are_readable(small_run):
    tmp_path, stats = small_run
    counters = stats["counters"]
    assert counters["parse_errors"] == 1 and counters["pages_paragraph_too_long"] == 1
    assert counters["pages_read"] == 32 and stats["reconciliation"]["balanced"]
    letter, giant = sorted(read_json_lines(tmp_path, "dead_letters"), key=lambda letter: letter["page_id"])
    assert (letter["page_id"], letter["stage"], letter["reason"]) == (UNPARSABLE_ID, "parse", "parse_error")
    assert "RecursionError" in letter["detail"] and letter["title"] == "Nested templates"
    assert (giant["page_id"], giant["stage"], giant["reason"]) == (GIANT_ID, "sentences", "paragraph_too_long")
    assert "a paragraph of 1,1" in giant["detail"] and "at most 1,000,000" in giant["detail"]
    # Every dataset/split folder exists and reads back, including splits that got no record.
    for dataset in DATASETS:
        for split in SPLITS:
            assert len(read_triplets(tmp_path, dataset, split)) == counters[f"{dataset}/{split}"]
    assert any(counters[f"triplets-sen/{split}"] == 0 for split in SPLITS), "the small dump leaves a split empty"
    assert counters["scb_articles"] == len(read_json_lines(tmp_path, "scb"))


def _shard_records(out: Path) -> dict:
    return {
        (d, s): sorted(r.numpy() for r in tf.data.TFRecordDataset(
            sorted(glob.glob(str(out / d / s / "*.tfrecord.gz"))), compression_type="GZIP"))
        for d in DATASETS for s in SPLITS
    }


def test_two_worker_processes_sharing_the_file_write_the_same_bytes_as_in_memory(small_dump, small_run, tmp_path):
    """Same input and seed, two worker processes each parsing half the pages of the one plain
    file (--page-shards 2): the same triplets, byte for byte, and the same counters."""
    stats = run.main(["--output", str(tmp_path), "--input", small_dump, "--runner", "DirectRunner", *ALL_NEGATIVES,
                      "--direct_running_mode=multi_processing", "--direct_num_workers=2", "--page-shards", "2"])
    in_memory_out, in_memory_stats = small_run
    assert stats["reconciliation"]["balanced"]
    assert _shard_records(tmp_path) == _shard_records(in_memory_out)
    assert sum(map(len, _shard_records(tmp_path).values())) > 1000
    assert (stats["counters"]["read_ranges"], in_memory_stats["counters"]["read_ranges"]) == (2, 1)
    assert {**stats["counters"], "read_ranges": 1} == in_memory_stats["counters"]


def test_outputs_can_go_to_gcs_and_the_default_writes_only_the_papers_datasets(small_dump, small_run, gcs_emulator):
    out = gcs_emulator()
    stats = run.main(["--output", out, "--input", small_dump])
    with FileSystems.open(f"{out}/stats.json") as handle:
        assert json.loads(handle.read())["counters"] == stats["counters"]
    written = {m.path.removeprefix(out + "/").split("/")[0]
               for m in FileSystems.match([f"{out}/triplets-*/*/part-*"])[0].metadata_list}
    assert written == {"triplets-sen", "triplets-titles"}
    # The ablation datasets are opt-in; what the default writes is the same as in a run with all.
    _, all_stats = small_run
    assert {k: v for k, v in all_stats["counters"].items() if k in stats["counters"]} == stats["counters"]
    assert not any("other_article" in name for name in stats["counters"])
    shards = FileSystems.match([f"{out}/triplets-sen/train/part-*-of-*.tfrecord.gz"])[0].metadata_list
    assert shards and all(m.size_in_bytes > 0 for m in shards)
    assert FileSystems.match([f"{out}/passages/*.jsonl.gz"])[0].metadata_list


@pytest.mark.parametrize(
    "content, complaint",
    [(None, "does not exist"), ("just some text\n", "not a MediaWiki XML dump"),
     ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><siteinfo><sitename>W</sitename></siteinfo></mediawiki>',
      "empty MediaWiki dump")],
)
def test_bad_input_stops_with_one_error_naming_the_file(tmp_path, content, complaint):
    path = tmp_path / "input.xml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DumpInputError, match=complaint) as error:
        run.main(["--output", str(tmp_path / "out"), "--input", str(path)])
    assert str(path) in str(error.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags, named",
    [(["--spacy-model", "no_such_spacy_model"], "--spacy-model"),
     (["--min-tokens", "20", "--max-tokens", "10"], "--min-tokens"),
     (["--other-article-bucket-size", "0"], "--other-article-bucket-size"),
     (["--negatives", "adjacent,nearby"], "--negatives"),
     (["--negatives", ""], "--negatives"),
     (["--page-shards", "0"], "--page-shards"),
     (["--negative", "same_article"], "--negative "),      # misspelt: Beam alone would drop it with a warning
     (["--direct_num_worker=2"], "--direct_num_worker ")],
)
def test_bad_flags_stop_before_the_job_with_an_error_naming_the_flag(tmp_path, flags, named):
    with pytest.raises(UsageError, match=named):
        run.main(["--output", str(tmp_path / "out"), *flags])
    assert not (tmp_path / "out").exists()


def test_cli_reports_bad_input_as_one_line_and_exit_status_2(tmp_path):
    missing = tmp_path / "missing.xml.bz2"
    done = subprocess.run([sys.executable, "-m", "pipeline.run", "--output", str(tmp_path / "out"),
                           "--input", str(missing)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: ") and str(missing) in done.stderr


def test_dataflow_options_pass_through_unchanged():
    beam_flags = ["--runner", "DataflowRunner", "--project", "my-project", "--region", "europe-west4",
                  "--temp_location", "gs://bucket/tmp", "--setup_file", "./setup.py", "--num_workers", "8"]
    config, passed = run.parse_args(["--output", "gs://bucket/out", "--seed", "3", *beam_flags, "--max-tokens", "40",
                                     "--page_shards=2"])   # the old underscore spelling, still accepted
    assert passed == beam_flags
    assert (config.output, config.seed, config.rules.max_tokens, config.input, config.page_shards) \
        == ("gs://bucket/out", 3, 40, None, 2)
    options = PipelineOptions(passed)
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    cloud = options.view_as(GoogleCloudOptions)
    assert (cloud.project, cloud.region, cloud.temp_location) == ("my-project", "europe-west4", "gs://bucket/tmp")
    assert options.view_as(SetupOptions).setup_file == "./setup.py"


# SHA-256 of each output's records (sorted, so shard boundaries do not matter) on the embedded
# excerpt with every negative strategy and the default seed. A change to what the pipeline emits
# fails here; update the digests in the same commit and say why there.
OUTPUT_DIGESTS = {
    "triplets-sen/train": "272dd09a4936155d", "triplets-sen/validation": "9bc6ee0b2a783291",
    "triplets-sen/test": "46265ab8449554e1",
    "triplets-sen-same_article/train": "09f849e08796147a", "triplets-sen-same_article/validation": "218090071db2036f",
    "triplets-sen-same_article/test": "8ebd0472024ca613",
    "triplets-sen-other_article/train": "69c291831e6d035b", "triplets-sen-other_article/validation": "bf4cfe0cb34170fd",
    "triplets-sen-other_article/test": "e5fc759069d75b74",
    "triplets-titles/train": "0ffe490ce8e12a1a", "triplets-titles/validation": "14f056b532204e16",
    "triplets-titles/test": "f6041b408d427572",
    "scb": "dd5bbb8a1662ceae", "passages": "875f2be640a69222",
}


def _output_digests(out: Path) -> dict[str, str]:
    records = _shard_records(out)
    digests = {f"{dataset}/{split}": _digest(records[(dataset, split)]) for dataset in DATASETS for split in SPLITS}
    for folder in ("scb", "passages"):
        lines = sorted(line for path in glob.glob(str(out / folder / "*.jsonl.gz")) for line in gzip.open(path))
        digests[folder] = _digest(lines)
    return digests


def _digest(records: list[bytes]) -> str:
    import hashlib

    digest = hashlib.sha256()
    for record in records:
        digest.update(len(record).to_bytes(8, "big") + record)
    return digest.hexdigest()[:16]


def test_the_excerpts_outputs_are_pinned_byte_for_byte(embedded_pipeline_output):
    assert _output_digests(embedded_pipeline_output) == OUTPUT_DIGESTS
