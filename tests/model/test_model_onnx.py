"""The ONNX export of a transformer model dir (`model.export --format onnx`): its graph gives the
Keras Net's embeddings, its tokenizer the SavedModel's ids on every excerpt sentence, and every job
loads the folder as an encoder (`load_encoder(DIR)`, the spec `onnx:DIR`, RunInference)."""
import json
import os
import stat

import numpy as np
import pytest
import tensorflow as tf

from core.cli import run_cli
from core.folders import COMMAND_CLAIM
from model.encoding.encoder import load_encoder
from model.encoding.encoders import EncoderSpec, EncoderSpecError, SpecKind, as_encoder_spec, load_encoders
from model.export import main as export
from model.net.transformer import token_ids
from model.net.wordpieces import wordpieces

SENTENCES = ["The café in Zürich opened in 1901.", "A short one.", "",
             "Rivers of the world flow into seas and oceans of many kinds, " * 6]


def _cosines(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    return (left * right).sum(1) / np.linalg.norm(left, axis=1) / np.linalg.norm(right, axis=1)


def _excerpt_sentences(pipeline_output) -> list[str]:
    """Every distinct sentence of the excerpt's run: its SCB articles' and its triplets' (every
    dataset and split), which together hold every sentence the pipeline kept."""
    from core.published import Run
    from core.records import ROLES
    from eval.scb_job import read_articles
    from model.training.arrays import split_triplets
    from model.training.shards import open_run

    sentences: dict[str, None] = {}
    for article in read_articles(str(pipeline_output)):
        sentences.update(dict.fromkeys(article.sentences))
    run = open_run(str(pipeline_output))
    for name in Run.open(str(pipeline_output)).manifest.outputs:
        if name.startswith("triplets"):
            dataset, split = name.rsplit("/", 1)
            sentences.update(dict.fromkeys(triplet[role] for triplet in split_triplets(run, dataset, split)
                                           for role in ROLES))
    return list(sentences)


def test_onnx_specs_parse_once_and_print_back():
    plain, named = EncoderSpec.parse("onnx:/models/minilm-int8"), EncoderSpec.parse("onnx:int8=/models/minilm-int8/")
    assert (plain.kind, plain.name, plain.paths) == (SpecKind.ONNX, "minilm-int8", ("/models/minilm-int8",))
    assert (named.name, named.paths) == ("int8", ("/models/minilm-int8/",))
    assert EncoderSpec.parse(str(plain)) == plain and EncoderSpec.parse(str(named)) == named
    with pytest.raises(EncoderSpecError, match="onnx:DIR"):
        EncoderSpec.parse("onnx:")


def test_quantize_is_refused_without_the_onnx_format(tmp_path, capsys):
    status = run_cli(export, ["--model-dir", str(tmp_path), "--output", str(tmp_path / "out"), "--quantize", "int8"])
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1 and error.startswith("error: --quantize int8: only int8, with")


@pytest.mark.parametrize("sentence", ["ж" * 60 + " word", "日本" * 18 + "ж" * 40, "a\u2028b c\u2029d", "x" * 101])
def test_words_past_tensorflow_texts_byte_limit_and_line_separators_tokenize_alike(sentence):
    """tensorflow-text makes a word of more than 100 bytes [UNK] (the checkpoint's tokenizer counts
    characters) and does not split on U+2028/U+2029."""
    in_graph = token_ids(64)(tf.constant([sentence])).numpy()
    np.testing.assert_array_equal(wordpieces(64)([sentence]), in_graph)


@pytest.mark.slow   # the MiniLM checkpoint built and run
def test_the_graph_gives_the_keras_nets_embeddings_and_int8_stays_close():
    import onnxruntime

    from model.formats.hf import hf_bert_weights
    from model.formats.onnx_export import bert_graph, quantized_int8
    from model.net.backbone import build_transformer_encoder

    net = build_transformer_encoder()
    backbone = net.get_layer(index=1)
    model = bert_graph(hf_bert_weights(backbone), layers=backbone.num_layers, heads=backbone.num_heads,
                       epsilon=1e-12, name="minilm")
    ids = wordpieces(64)(SENTENCES).astype(np.int64)
    feed = {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)}
    fp32 = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    np.testing.assert_allclose(fp32, net(ids).numpy(), atol=1e-5)
    int8 = onnxruntime.InferenceSession(quantized_int8(model)).run(None, feed)[0]
    assert np.median(_cosines(int8, fp32)) >= 0.99
    # The word table int8 per row (what --quantize int8 writes beside the int8 matrix products): a
    # quarter of its bytes, the embeddings all but unchanged.
    weights = hf_bert_weights(backbone)
    rows = bert_graph(weights, layers=backbone.num_layers, heads=backbone.num_heads, epsilon=1e-12, name="minilm",
                      int8_embeddings=True)
    by_rows = onnxruntime.InferenceSession(rows.SerializeToString()).run(None, feed)[0]
    assert _cosines(by_rows, fp32).min() >= 0.9999
    table = weights["embeddings.word_embeddings.weight"]
    assert model.ByteSize() - rows.ByteSize() >= 0.74 * table.nbytes


def test_the_committed_int8_encoder_loads_and_groups_a_sections_sentences():
    """docs/results/2019-gpu-eval's int8 export (the GPU soup of minilm-sen, 23.5 MB): any user
    loads it with load_encoder; sentences of one topic are nearer each other than another's."""
    folder = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results", "2019-gpu-eval",
                          "minilm-gpu-soup-int8")
    encoder = load_encoder(folder)
    assert (encoder.dim, encoder.similarity_fn_name) == (384, "cosine")
    assert os.path.getsize(os.path.join(folder, "model.onnx")) <= 30 * 2**20
    rivers, rivers_too, war = encoder.encode(["The river rises in the mountains and flows into the sea.",
                                              "Its tributaries drain a basin of 40,000 square kilometres.",
                                              "The army surrendered after the siege of the capital."])
    assert _cosines(rivers[None], rivers_too[None])[0] > _cosines(rivers[None], war[None])[0]



@pytest.mark.parametrize("damage", ["model.onnx cut short", "vocab.txt emptied"])
def test_a_cut_short_graph_or_an_empty_vocabulary_is_a_usage_error_naming_the_file(tmp_path, damage):
    """A copy of the committed int8 export, one file damaged: loading names that file in one line
    (a UsageError: run_cli's `error:` line), not ONNX Runtime's InvalidProtobuf or an IndexError."""
    from core.cli import UsageError

    committed = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results", "2019-gpu-eval",
                             "minilm-gpu-soup-int8")
    folder = tmp_path / "int8"
    folder.mkdir()
    for name in ("onnx.json", "vocab.txt", "tokenizer.json"):
        (folder / name).write_bytes(open(os.path.join(committed, name), "rb").read())
    with open(os.path.join(committed, "model.onnx"), "rb") as graph:
        (folder / "model.onnx").write_bytes(graph.read(100_000))   # the first 0.4 %: a download cut short
    damaged = folder / damage.split()[0]
    if damage == "vocab.txt emptied":
        damaged.write_text("")
    with pytest.raises(UsageError) as refused:
        load_encoder(str(folder))
    assert str(refused.value).startswith(f"{damaged}: ") and "\n" not in str(refused.value)


@pytest.fixture(scope="module")
def onnx_exports(fine_tuned, tmp_path_factory):
    """The fine-tuned model dir's ONNX exports, float32 and int8."""
    model_dir, _ = fine_tuned
    folders = {}
    for quantize in ("float32", "int8"):
        folder = tmp_path_factory.mktemp("onnx") / quantize
        export(["--model-dir", str(model_dir), "--format", "onnx", "--output", str(folder),
                *(["--quantize", quantize] if quantize == "int8" else [])])
        folders[quantize] = folder
    return model_dir, folders


def test_the_export_writes_a_claimed_folder_whole_and_refuses_to_overwrite_without_the_flag(onnx_exports, capsys):
    model_dir, folders = onnx_exports
    folder = folders["float32"]
    assert sorted(os.listdir(folder)) == [COMMAND_CLAIM, "model.onnx", "onnx.json", "tokenizer.json", "vocab.txt"]
    assert all(stat.S_IMODE(os.stat(folder / name).st_mode) == 0o644 for name in os.listdir(folder))
    settings, int8 = (json.loads((folders[kind] / "onnx.json").read_text()) for kind in ("float32", "int8"))
    assert (settings["embedding_dim"], settings["max_seq_length"], settings["similarity_fn_name"]) == (384, 32,
                                                                                                    "cosine")
    assert settings["quantization"] is None and int8["quantization"]["type"] == "int8"
    assert (folders["int8"] / "model.onnx").stat().st_size < 0.7 * (folder / "model.onnx").stat().st_size
    status = run_cli(export, ["--model-dir", str(model_dir), "--format", "onnx", "--output", str(folder)])
    assert status == 2 and "--overwrite" in capsys.readouterr().err


def test_the_onnx_encoder_gives_the_saved_models_embeddings(onnx_exports, embedded_pipeline_output):
    from model.encoding.encoder import OnnxEncoder, SavedModelEncoder

    model_dir, folders = onnx_exports
    sentences = SENTENCES + _excerpt_sentences(embedded_pipeline_output)[:300]
    saved = SavedModelEncoder(str(model_dir)).encode(sentences)
    fp32, int8 = (load_encoder(str(folders[kind])) for kind in ("float32", "int8"))
    assert isinstance(fp32, OnnxEncoder)
    assert (fp32.dim, fp32.max_seq_length, fp32.similarity_fn_name) == (384, 32, "cosine")
    np.testing.assert_allclose(fp32.encode(sentences, batch_size=7), saved, atol=1e-4)
    assert np.median(_cosines(int8.encode(sentences), saved)) >= 0.99
    assert fp32.encode("A short one.").shape == (384,)
    np.testing.assert_allclose(fp32.encode(["A short one."], normalize_embeddings=True)[0],
                               saved[1] / np.linalg.norm(saved[1]), atol=1e-4)


def test_the_onnx_tokenizer_gives_the_saved_models_ids_on_every_excerpt_sentence(onnx_exports,
                                                                                 embedded_pipeline_output):
    _, folders = onnx_exports
    encoder = load_encoder(str(folders["int8"]))
    sentences = _excerpt_sentences(embedded_pipeline_output)
    assert len(sentences) > 4000 and sum(not sentence.isascii() for sentence in sentences) > 100
    for max_tokens in (encoder.max_seq_length, 512):   # the export's, and one that truncates nothing
        pieces = encoder.pieces if max_tokens == encoder.max_seq_length else wordpieces(max_tokens)
        in_graph = token_ids(max_tokens)(tf.constant(sentences)).numpy()
        ids = pieces(sentences)
        assert ids.shape == in_graph.shape
        assert [sentences[row] for row in np.flatnonzero((ids != in_graph).any(axis=1))] == []


def test_the_onnx_encoder_loads_and_encodes_without_tensorflow(onnx_exports):
    import subprocess
    import sys

    _, folders = onnx_exports
    script = ("import sys; from model.encoding.encoder import load_encoder; "
              f"print(load_encoder({str(folders['int8'])!r}).encode(['Rivers flow.']).shape, "
              "sorted({'tensorflow', 'keras'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.stdout.strip() == "(1, 384) []"


def test_a_folder_that_is_no_onnx_export_is_one_error_line(tmp_path, capsys):
    from core.files import JsonFileError
    from eval.triplets import main as triplets

    status = run_cli(triplets, ["--data", str(tmp_path / "no-run"), "--output", str(tmp_path / "out"),
                                "--encoder", f"onnx:{tmp_path / 'missing'}"])
    error = capsys.readouterr().err   # refused before the missing run is read
    assert status == 2 and error.count("\n") == 1 and "no ONNX export there" in error
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "onnx.json").write_text('{"format": "wikisim-onnx"')   # cut short by a kill
    with pytest.raises(JsonFileError, match="onnx.json"):
        load_encoder(str(tmp_path / "broken"))


def test_every_job_takes_the_folder_as_a_method(onnx_exports):
    from model.encoding.embedding_cache import encoder_fingerprint
    from model.encoding.inference import EncoderModelHandler

    _, folders = onnx_exports
    spec = EncoderSpec.parse(f"onnx:int8={folders['int8']}")
    [encoder] = load_encoders([spec])
    assert encoder.name == "int8" and encoder.encode(["Rivers flow."]).shape == (1, 384)
    assert as_encoder_spec(str(folders["int8"])).kind is SpecKind.ONNX   # a bare folder, as model.embed passes it
    handler = EncoderModelHandler(str(folders["int8"]))
    [result] = handler.run_inference(["Rivers flow."], handler.load_model())
    np.testing.assert_allclose(result.inference, encoder.encode(["Rivers flow."])[0], atol=1e-6)
    assert encoder_fingerprint(spec) != encoder_fingerprint(EncoderSpec.parse(f"onnx:int8={folders['float32']}"))


def test_model_embed_embeds_with_the_onnx_folder(onnx_exports, tmp_path):
    import pyarrow.parquet as pq

    from model.embed import main as embed

    _, folders = onnx_exports
    (tmp_path / "in.txt").write_text("Rivers flow into seas.\nThe café in Zürich opened in 1901.\n")
    result = embed(["--model-dir", str(folders["int8"]), "--input", str(tmp_path / "in.txt"),
                    "--output", str(tmp_path / "out")])
    assert (result["dim"], result["sentences"]) == (384, 2)
    rows = pq.read_table([str(path) for path in result["files"]]).to_pylist()
    embedded = {row["text"]: np.array(row["embedding"]) for row in rows}
    expected = load_encoder(str(folders["int8"])).encode(sorted(embedded))
    np.testing.assert_allclose(np.stack([embedded[text] for text in sorted(embedded)]), expected, atol=1e-5)


@pytest.mark.slow   # the MiniLM checkpoint exported off the shelf
def test_an_off_the_shelf_model_dir_exports_too(tmp_path):
    from model.encoding.encoder import SavedModelEncoder
    from model.pretrained import main as pretrained

    pretrained(["--model-dir", str(tmp_path / "minilm"), "--max-tokens", "16"])
    export(["--model-dir", str(tmp_path / "minilm"), "--format", "onnx", "--output", str(tmp_path / "onnx")])
    encoder = load_encoder(str(tmp_path / "onnx"))
    assert encoder.max_seq_length == 16
    np.testing.assert_allclose(encoder.encode(SENTENCES), SavedModelEncoder(str(tmp_path / "minilm")).encode(SENTENCES),
                               atol=1e-4)


def test_the_int8_quantization_keeps_quiet_about_pre_processing(caplog, capfd):
    """onnxruntime logs its pre-processing advice for every graph not run through
    `quant_pre_process` (a WARNING on the root logger): the export's graph has no use for it."""
    import onnx
    from onnx import helper

    from model.formats.onnx_export import PRE_PROCESSING_ADVICE, quantized_int8

    weights = onnx.numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "weights")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "weights"], ["y"])], "matmul",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])], [weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with caplog.at_level("WARNING"):
        quantized = onnx.load_from_string(quantized_int8(model))
    assert "MatMulInteger" in {node.op_type for node in quantized.graph.node}
    assert not [record for record in caplog.records if PRE_PROCESSING_ADVICE in record.getMessage()]
    assert PRE_PROCESSING_ADVICE not in capfd.readouterr().err


# Sentences of the 2019 run's test split (triplets-sen), of 8 to 30 words.
TEST_SPLIT_SENTENCES = [
    "Camel case has been criticised as negatively impacting readability due to the removal of spaces and "
    "uppercasing of every word.",
    "Both the leads, Perkins and Leigh, were given freedom to interpret their roles and improvise as long as it did "
    "not involve moving the camera.",
    "In January 2016, Oracle announced that Java run-time environments based on JDK 9 will discontinue the browser "
    "plugin.",
    "In November 2016, Renshaw was facing criminal charges over incitement to racial hatred.",
    "In March 1173, aggrieved at his lack of power and egged on by Henry's enemies, his son by the same name, the "
    "younger Henry, launched the Revolt of 1173–1174.",
    "In addition to the above theoretical applications, many practical applications of groups exist.",
    "After trials in 1994, Tesco launched its Clubcard program, the UK's first nationwide supermarket-only loyalty "
    "card scheme, in 1995 with dunnhumby.",
    "The Arhcbishop of Malta has a palace in Mdina.",
    "The climate is generally tropical and mild, and the two major seasons are distinguishable by their raininess.",
    "All polymers (amorphous or semi-crystalline) go through glass transitions.",
]


def test_the_committed_int8_encoder_gives_a_sentence_the_same_vector_whatever_its_batch():
    """The int8 graph quantizes activations dynamically, one scale per tensor: run in a batch, a
    sentence's vector moved with its batch-mates and their padding (cosine 0.991-0.995 of its own),
    so cached embeddings and reruns disagreed. Each sentence is now run on its own."""
    folder = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results", "2019-gpu-eval",
                          "minilm-gpu-soup-int8")
    encoder = load_encoder(folder)
    short, long = "Rivers flow.", "Rivers of the world flow into seas and oceans of many kinds, " * 6
    alone = np.stack([encoder.encode([sentence])[0] for sentence in TEST_SPLIT_SENTENCES])
    for batch_size in (None, 4, 512):
        mixed = encoder.encode([long, *TEST_SPLIT_SENTENCES, short], batch_size=batch_size)
        np.testing.assert_allclose(mixed[1:-1], alone, rtol=0, atol=1e-6)
        np.testing.assert_allclose(mixed[[0, -1]], encoder.encode([long, short]), rtol=0, atol=1e-6)
    for sentence, row in zip(TEST_SPLIT_SENTENCES, alone):   # each with the long and the short neighbour
        np.testing.assert_allclose(encoder.encode([short, sentence, long])[1], row, rtol=0, atol=1e-6)


def test_only_a_graph_with_dynamic_activations_runs_one_sentence_at_a_time():
    """Exports written before `onnx.json` recorded "activations" are all dynamic int8."""
    from model.encoding.encoder import per_sentence_runs
    from model.formats.onnx_export import settings

    int8 = settings(dim=384, max_tokens=64, similarity="cosine", quantize="int8", source="minilm")
    assert per_sentence_runs(int8) and int8["quantization"]["activations"] == "dynamic"
    recorded = int8["quantization"]
    assert per_sentence_runs({**int8, "quantization": {key: recorded[key] for key in recorded if key != "activations"}})
    assert not per_sentence_runs(settings(dim=384, max_tokens=64, similarity="cosine", quantize=None, source="minilm"))
    assert not per_sentence_runs({**int8, "quantization": {**int8["quantization"], "activations": "static"}})


def test_embeddings_kept_from_batches_of_an_int8_graph_are_not_reused():
    """Kept before int8 graphs ran one sentence at a time, their vectors differ from today's: the
    fingerprint (the key of kept embeddings and SCB rows) is not the digest of the files alone."""
    import hashlib
    import os

    from model.encoding.embedding_cache import encoder_fingerprint
    from model.encoding.encoders import EncoderSpec
    from model.formats.onnx_export import CONFIG_FILE, GRAPH_FILE, VOCABULARY_FILE

    folder = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results", "2019-gpu-eval",
                          "minilm-gpu-soup-int8")
    spec = EncoderSpec.parse(f"onnx:m={folder}")
    files_alone = hashlib.sha256(str(spec).encode("utf-8"))
    for part in (CONFIG_FILE, GRAPH_FILE, VOCABULARY_FILE):
        with open(os.path.join(folder, part), "rb") as handle:
            files_alone.update(handle.read())
    assert encoder_fingerprint(spec) != files_alone.hexdigest()
