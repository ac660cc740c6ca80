"""model.embed: the excerpt's SCB sentences and a JSON-lines file embedded by RunInference into Parquet."""
import gzip
import json

import numpy as np
import pyarrow.parquet as pq

from model import embed
from model.encoding import corpus as embed_job
from model.encoding.encoder import load_encoder
from model.encoding.inference import EncoderModelHandler


def _rows(folder):
    table = pq.read_table([str(p) for p in sorted(folder.glob("embeddings-*.parquet"))])
    return {row["id"]: row for row in table.to_pylist()}, table.schema


def test_embeds_the_runs_scb_sentences_like_the_encoder(embedded_pipeline_output, tiny_model, tmp_path):
    result = embed.main(["--model-dir", tiny_model, "--data", str(embedded_pipeline_output), "--source", "scb",
                         "--output", str(tmp_path / "out"), "--max-batch", "64"])
    rows, schema = _rows(tmp_path / "out")
    articles = [json.loads(line) for path in sorted((embedded_pipeline_output / "scb").glob("*.jsonl.gz"))
                for line in gzip.open(path, "rt")]
    expected = {f"{a['article_id']}:{i}": text for a in articles for i, text in enumerate(a["sentences"])}
    assert result["dim"] == 16 and str(schema.field("embedding").type) == "fixed_size_list<item: float>[16]"
    assert {key: row["text"] for key, row in rows.items()} == expected        # every sentence once, by id
    some = sorted(expected)[:50]
    direct = load_encoder(tiny_model).encode([expected[key] for key in some])
    np.testing.assert_allclose(np.array([rows[key]["embedding"] for key in some]), direct, rtol=1e-4, atol=1e-5)


def test_embeds_json_lines_with_their_ids(tiny_model, tmp_path, capsys):
    source = tmp_path / "sentences.jsonl"
    source.write_text("".join(json.dumps({"id": f"s{i}", "text": text}) + "\n"
                              for i, text in enumerate(["The striker scored.", "Bake the bread.", "A star."])))
    result = embed.main(["--model-dir", tiny_model, "--input", str(source), "--output", str(tmp_path / "out")])
    rows, _ = _rows(tmp_path / "out")
    assert sorted(rows) == ["s0", "s1", "s2"] and rows["s1"]["text"] == "Bake the bread."
    assert result["sentences"] == 3   # counted as they are embedded (the progress bar's unit)
    printed = capsys.readouterr().out
    assert "3 sentences embedded (16 float32 each, not normalised) in " in printed and str(tmp_path / "out") in printed


def test_encode_batches_by_length_and_returns_rows_in_the_input_order(tiny_model):
    encoder = load_encoder(tiny_model, batch_size=2)      # several length-sorted batches
    sentences = ["A much longer sentence about the striker who scored twice in the cup final.", "Short one.",
                 "Bake the flour.", "The oven was hot and the bread rose well before noon today.", "Goal!"]
    together = encoder.encode(sentences)
    one_by_one = np.concatenate([encoder.encode([sentence]) for sentence in sentences])
    np.testing.assert_allclose(together, one_by_one, atol=1e-5)
    assert not np.allclose(together[0], together[1])


def test_embeds_from_and_to_gcs_with_a_model_on_gcs(tiny_model, gcs_emulator):
    import io

    from core.files import read_bytes, write_bytes
    from core.storage import upload_tree

    root = gcs_emulator()
    upload_tree(tiny_model, f"{root}/model")
    sentences = ["The striker scored.", "Bake the bread.", "A star."]
    write_bytes(f"{root}/in/sentences.jsonl",
                "".join(json.dumps({"id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(sentences)).encode())
    result = embed.main(["--model-dir", f"{root}/model", "--input", f"{root}/in/*.jsonl", "--output", f"{root}/out"])
    assert result["files"] and all(path.startswith(f"{root}/out/embeddings-") for path in result["files"])
    rows = {row["id"]: row for path in result["files"]
            for row in pq.read_table(io.BytesIO(read_bytes(path))).to_pylist()}
    assert sorted(rows) == ["s0", "s1", "s2"]
    np.testing.assert_allclose(np.array([rows[f"s{i}"]["embedding"] for i in range(3)]),
                               load_encoder(tiny_model).encode(sentences), rtol=1e-4, atol=1e-5)


def test_run_inference_takes_a_model_path_and_refuses_a_bad_one_at_construction(tiny_model, tmp_path):
    import apache_beam as beam
    import pytest
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    sentences = ["The striker scored.", "Bake the bread."]
    expected = load_encoder(tiny_model).encode(sentences)

    def equal_to_the_encoders(results):
        by_text = {result.example: result.inference for result in results}
        assert sorted(by_text) == sorted(sentences)
        np.testing.assert_allclose([by_text[text] for text in sentences], expected, rtol=1e-5, atol=1e-6)

    with TestPipeline() as pipeline:
        embedded = (pipeline | beam.Create(sentences)
                    | RunInference(EncoderModelHandler(tiny_model)))   # a plain model dir, not a spec
        assert_that(embedded, equal_to_the_encoders)
    from model.encoding.encoders import EncoderSpecError

    with pytest.raises(EncoderSpecError, match="nowhere"):
        EncoderModelHandler(str(tmp_path / "nowhere"))


def test_a_line_that_breaks_its_format_is_counted_and_set_aside():
    import functools

    import apache_beam as beam
    from apache_beam.testing import test_pipeline
    from apache_beam.testing.util import assert_that, equal_to

    from core.records import DEAD_LETTERS, SCB, ScbRecord

    good = ScbRecord(article_id=4, title="T", sections=("a", "b"), sentences=("x.", "y."), labels=(0, 1),
                     openers=(True, True)).to_json()
    lines = [("scb-0.jsonl.gz", good), ("scb-0.jsonl.gz", "{cut"), ("scb-1.jsonl.gz", json.dumps({"article_id": 5}))]
    pipeline = test_pipeline.TestPipeline()
    parsed = (pipeline | beam.Create(lines)
              | beam.ParDo(embed_job.SentencesOfLinesFn(functools.partial(embed_job.sentences_of_record, source=SCB)))
              .with_outputs(DEAD_LETTERS, main="sentences"))
    assert_that(parsed.sentences, equal_to([("4:0", "x."), ("4:1", "y.")]), label="Sentences")
    assert_that(parsed[DEAD_LETTERS] | beam.Map(lambda letter: (letter["source"], letter["detail"].split(":")[0])),
                equal_to([("scb-0.jsonl.gz", "not JSON"), ("scb-1.jsonl.gz", "missing field 'title'")]),
                label="DeadLetters")
    result = pipeline.run()
    result.wait_until_finish()
    from core.counters import job_totals

    assert job_totals(result)[embed_job.LINES_SET_ASIDE] == 2


def test_json_lines_without_text_are_set_aside_in_the_output_and_named_in_the_summary(tiny_model, tmp_path, capsys):
    source = tmp_path / "sentences.jsonl"
    source.write_text(json.dumps({"id": "a", "text": "The striker scored."}) + "\n" + "not json\n"
                      + json.dumps({"id": "b", "body": "no text field"}) + "\n")
    result = embed.main(["--model-dir", tiny_model, "--input", str(source), "--output", str(tmp_path / "out")])
    rows, _ = _rows(tmp_path / "out")
    assert sorted(rows) == ["a"] and result["sentences"] == 1 and result["set_aside"] == 2
    letters = [json.loads(line) for path in (tmp_path / "out").glob("dead_letters-*.jsonl")
               for line in path.read_text().splitlines()]
    assert sorted(letter["detail"][:16] for letter in letters) == ["Expecting value:", "no string field "]
    assert all(letter["source"] == str(source) and letter["stage"] == "embed" for letter in letters)
    assert "2 malformed line(s) set aside in dead_letters-*.jsonl" in capsys.readouterr().out


def test_a_used_output_folder_is_refused_unless_overwrite_which_deletes_only_the_earlier_embeddings(tiny_model,
                                                                                                    tmp_path):
    import pytest

    from core.cli import UsageError

    source = tmp_path / "sentences.txt"
    source.write_text("The striker scored.\nBake the bread.\n")
    out = tmp_path / "out"
    embed.main(["--model-dir", tiny_model, "--input", str(source), "--output", str(out)])
    first = sorted(path.name for path in out.iterdir())
    stale = out / "embeddings-00007-of-00009.parquet"          # as a run with more shards would have left it
    stale.write_bytes((out / first[0]).read_bytes() if first[0].endswith(".parquet") else b"")
    with pytest.raises(UsageError, match="already holds the output of an earlier model.embed"):
        embed.main(["--model-dir", tiny_model, "--input", str(source), "--output", str(out)])
    assert stale.exists()
    embed.main(["--model-dir", tiny_model, "--input", str(source), "--output", str(out), "--overwrite"])
    assert not stale.exists() and len(_rows(out)[0]) == 2     # only this run's rows: no earlier file left
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=r"holds files model.embed does not write \(notes.txt\)"):
        embed.main(["--model-dir", tiny_model, "--input", str(source), "--output", str(out), "--overwrite"])
    assert (out / "notes.txt").read_text() == "mine"


def test_encode_refuses_what_is_not_a_string_with_a_clear_type_error(tiny_model):
    import pytest

    encoder = load_encoder(tiny_model)
    for bad, named in [(None, "got NoneType"), (b"bytes", "got bytes"), ([1, 2], "item 0 is a int"),
                       (["fine", None], "item 1 is a NoneType"), (3.5, "got float")]:
        with pytest.raises(TypeError, match=named):
            encoder.encode(bad)
    generated = encoder.encode(sentence for sentence in ["Goal!", "Bake the bread."])   # any iterable of strings
    np.testing.assert_allclose(generated, encoder.encode(["Goal!", "Bake the bread."]), atol=1e-6)


def test_encode_takes_sentence_transformers_arguments(tiny_model, capsys):
    import pytest

    encoder = load_encoder(tiny_model)
    sentences = ["Goal!", "Bake the bread in a hot oven.", "The striker scored twice.", "Rivers flow to the sea."]
    plain = encoder.encode(sentences)
    batched = encoder.encode(sentences, batch_size=1, show_progress_bar=True)
    np.testing.assert_allclose(batched, plain, atol=1e-6)
    shown = capsys.readouterr().err
    assert "Batches: 100%" in shown and "4/4" in shown                 # one batch per sentence, with its total
    rows = encoder.encode(sentences, convert_to_numpy=False)
    assert isinstance(rows, list) and len(rows) == 4 and np.allclose(rows[2], plain[2], atol=1e-6)
    unit = encoder.encode(sentences, normalize_embeddings=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1, rtol=1e-5)

    # precision as sentence-transformers' quantize_embeddings: per-dimension ranges onto 256 steps; signs as bits
    uint8 = encoder.encode(sentences, precision="uint8")
    assert uint8.dtype == np.uint8 and (uint8.min(axis=0) == 0).all()
    assert (uint8.argmax(axis=0) == plain.argmax(axis=0)).all()
    int8 = encoder.encode(sentences, precision="int8")
    assert int8.dtype == np.int8 and (np.abs(int8.astype(int) - (uint8.astype(int) - 128)) <= 1).all()
    ubinary = encoder.encode(sentences, precision="ubinary")
    assert ubinary.dtype == np.uint8 and ubinary.shape == (4, -(-plain.shape[1] // 8))
    assert (np.unpackbits(ubinary, axis=1)[:, :plain.shape[1]] == (plain > 0)).all()
    binary = encoder.encode(sentences, precision="binary")
    assert binary.dtype == np.int8 and (binary.astype(int) + 128 == ubinary).all()

    for refused, named in [({"convert_to_tensor": True}, "convert_to_tensor"), ({"device": "cuda"}, "device"),
                           ({"output_value": "token_embeddings"}, "sentence embeddings only")]:
        with pytest.raises(TypeError, match=named):
            encoder.encode(sentences, **refused)
    with pytest.raises(ValueError, match="precision must be one of"):
        encoder.encode(sentences, precision="float16")

    # similarity by the export's own function (the tiny model: the BiLSTM's l1, sentence-transformers' manhattan)
    assert encoder.similarity_fn_name == "manhattan"
    pairwise = encoder.similarity_pairwise(plain[:2], plain[2:])
    np.testing.assert_allclose(pairwise, np.diag(encoder.similarity(plain[:2], plain[2:])), rtol=1e-6)
    np.testing.assert_allclose(pairwise, -np.abs(plain[:2] - plain[2:]).sum(axis=1), rtol=1e-5)
    with pytest.raises(ValueError, match="one shape"):
        encoder.similarity_pairwise(plain[:2], plain)


def test_a_json_line_with_a_lone_surrogate_is_set_aside_and_the_others_embedded(tiny_model, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    source = tmp_path / "sentences.jsonl"   # `\ud800` is a valid JSON escape, but no UTF-8 text
    source.write_text(json.dumps({"id": "a", "text": "The striker scored."}) + "\n"
                      + '{"id":"bad","text":"lone \\ud800 x"}\n' + '{"id":"\\udfff","text":"fine text"}\n'
                      + json.dumps({"id": "b", "text": "Bake the bread."}) + "\n")
    done = subprocess.run([sys.executable, "-m", "model.embed", "--model-dir", tiny_model, "--input", str(source),
                           "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                          cwd=Path(__file__).resolve().parents[2], env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 sentences embedded" in done.stdout and "2 malformed line(s) set aside" in done.stdout
    rows, _ = _rows(tmp_path / "out")
    assert sorted(rows) == ["a", "b"]
    letters = [json.loads(line) for path in (tmp_path / "out").glob("dead_letters-*.jsonl")
               for line in path.read_text().splitlines()]
    details = sorted(letter["detail"] for letter in letters)
    assert len(details) == 2 and details[0].startswith("its id '\\udfff' holds the lone surrogate '\\udfff' at "
                                                       "character 0")
    assert details[1].startswith("its text 'lone \\ud800 x' holds the lone surrogate '\\ud800' at character 5")
    assert all(letter["source"] == str(source) and letter["reason"] == "ValueError" for letter in letters)
    assert any('"id":"bad"' in letter["detail"] for letter in letters)   # the line itself, as read


def test_encode_names_the_sentence_that_is_not_valid_unicode(tiny_model):
    import pytest

    encoder = load_encoder(tiny_model)
    with pytest.raises(ValueError, match=r"item 1 'lone \\ud800 x' holds the lone surrogate '\\ud800' at character 5"):
        encoder.encode(["ok", "lone \ud800 x"])
    with pytest.raises(ValueError, match="item 0 "):
        encoder.encode("\udfff")


def test_binary_precision_packs_each_row_for_a_width_not_a_multiple_of_8():
    from model.encoding.encoder import quantize

    embeddings = np.random.default_rng(0).normal(size=(5, 13)).astype(np.float32)
    per_row = np.stack([np.packbits(row > 0) for row in embeddings])   # each row padded to 2 bytes on its own
    ubinary = quantize(embeddings, "ubinary")
    assert ubinary.dtype == np.uint8 and ubinary.shape == (5, 2)
    np.testing.assert_array_equal(ubinary, per_row)
    np.testing.assert_array_equal(np.unpackbits(ubinary, axis=1)[:, :13], embeddings > 0)
    assert not (np.unpackbits(ubinary, axis=1)[:, 13:]).any()            # the padding bits are 0
    binary = quantize(embeddings, "binary")
    assert binary.dtype == np.int8 and binary.shape == (5, 2)
    np.testing.assert_array_equal(binary.astype(int), per_row.astype(int) - 128)


def test_a_jobs_encoders_share_the_cpus_out_among_its_worker_processes(monkeypatch):
    """Two DirectRunner workers on two CPUs encode on one thread each (each taking both made them
    wait on each other); one in-memory worker takes every CPU; a runner that starts an SDK process
    per core (Dataflow) gets one thread per process."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from model.encoding.inference import threads_per_worker

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert threads_per_worker(PipelineOptions([])) == 4
    assert threads_per_worker(PipelineOptions(["--direct_running_mode=multi_processing",
                                               "--direct_num_workers=2"])) == 2
    assert threads_per_worker(PipelineOptions(["--direct_num_workers=0"])) == 1   # 0: a worker per CPU
    assert threads_per_worker(PipelineOptions(["--direct_num_workers=8"])) == 1
    assert threads_per_worker(PipelineOptions(["--runner=DataflowRunner"])) == 1


def test_the_handlers_threads_reach_the_encoder():
    """The committed int8 encoder loaded by RunInference's handler with one thread: its ONNX
    Runtime session runs each operator on one thread, and encodes as one on every CPU does."""
    import os

    folder = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results", "2019-gpu-eval",
                          "minilm-gpu-soup-int8")
    one_thread = EncoderModelHandler(folder, threads=1).load_model()
    every_cpu = EncoderModelHandler(folder).load_model()
    assert one_thread._session.get_session_options().intra_op_num_threads == 1
    assert every_cpu._session.get_session_options().intra_op_num_threads == len(os.sched_getaffinity(0))
    sentences = ["The river rises in the mountains.", "The army surrendered after the siege."]
    np.testing.assert_allclose(one_thread.encode(sentences), every_cpu.encode(sentences), atol=1e-6)
