"""The fine-tuned transformer Net: the checkpoint's own tokenisation in the graph, the untrained
export equal to the backbone's mean-pooled states, and the trainer fine-tuning it end to end."""
import importlib.util
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
import yaml

from model.config import TrainConfig
from model.encoding.encoder import SavedModelEncoder
from model.net.backbone import build_transformer_encoder, checkpoint_dir
from model.net.transformer import token_ids
from model.training.model_dir import HISTORY, LEARNING_CURVE, SENTENCE_TRANSFORMERS

pytestmark = pytest.mark.slow   # the MiniLM checkpoint built and run

# Accents, ligatures, full-width forms, CJK, emoji, right-to-left scripts, zero-width and soft
# hyphens, Greek variants, dashes and quotes: where tensorflow-text's own lower-casing (NFKC)
# parts from the checkpoint's.
HARD_SENTENCES = [
    "Café in Zürich, naïve façade — 10 km² (Straße) ﬁne ＡＢＣ",
    "He said: \"don't\"\tgo… now",
    "Φ φ ϕ İstanbul Ångström Øresund",
    "日本語のテキスト and 中文 text",
    "emoji 😀 test\u200b zero\u00adwidth\u00a0space",
    "right to left: مرحبا بالعالم and שלום עולם",
]


@pytest.fixture(scope="module")
def reference_tokenizer():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(checkpoint_dir(), "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def real_sentences(pipeline_output, limit=1500) -> list[str]:
    """Kept sentences of the excerpt's SCB articles (plain JSON lines, as the pipeline writes them)."""
    from core.files import read_bytes
    from core.records import ScbRecord
    from eval.scb_job import scb_files

    sentences = []
    for path in scb_files(str(pipeline_output)):
        for line in read_bytes(path).decode("utf-8").splitlines():
            sentences += ScbRecord.from_json(line).sentences
    return sentences[:limit]


def test_in_graph_tokenizer_gives_the_checkpoints_ids(embedded_pipeline_output, reference_tokenizer):
    sentences = HARD_SENTENCES + real_sentences(embedded_pipeline_output)
    assert len(sentences) > 500 and any(not sentence.isascii() for sentence in sentences[len(HARD_SENTENCES):])
    ids = token_ids(max_tokens=512).ragged(tf.constant(sentences)).to_list()
    mismatches = [(sentence, mine) for sentence, mine in zip(sentences, ids)
                  if mine != reference_tokenizer.encode(sentence).ids]
    assert not mismatches, mismatches[:3]


def test_truncation_keeps_cls_and_sep(reference_tokenizer):
    sentence = " ".join(["thematic similarity"] * 40)
    ids = token_ids(max_tokens=16)(tf.constant([sentence])).numpy()[0]
    reference = reference_tokenizer.encode(sentence).ids
    assert ids.tolist() == reference[:15] + [reference[-1]]


def test_untrained_export_equals_the_backbones_mean_pooled_states(tmp_path, reference_tokenizer):
    from model.pretrained import main as export_pretrained

    export_pretrained(["--model-dir", str(tmp_path / "minilm")])
    encoder = SavedModelEncoder(str(tmp_path / "minilm"))
    sentences = ["The café in Zürich opened in 1901.", "A short one.",
                 "Rivers of the world flow into seas and oceans of many kinds."]
    exported = encoder.encode(sentences)
    backbone = build_transformer_encoder().get_layer(index=1)
    for sentence, row in zip(sentences, exported):
        ids = np.array([reference_tokenizer.encode(sentence).ids])
        states = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids),
                           "segment_ids": np.zeros_like(ids)})["sequence_output"]
        np.testing.assert_allclose(row, np.asarray(states)[0].mean(axis=0), atol=1e-5)


def test_the_transformer_kind_builds_its_net_as_the_flags_say():
    import keras

    from model.net.network import build_models

    config = TrainConfig.from_flags(data="d", model_dir="m", encoder="minilm", frozen_layers=1, transformer_layers=2)
    encoder, model = build_models(config, None, global_batch=8)
    backbone = encoder.get_layer(index=1)
    layers = [layer for layer in backbone.layers if layer.name.startswith("transformer_layer_")]
    assert [layer.trainable for layer in layers] == [False, True]                 # 2 kept, the lowest frozen
    assert model.get_layer("distances").distance == "cosine"                       # the kind's default distance
    assert type(model.optimizer) is keras.optimizers.AdamW and model.optimizer.weight_decay == 0.01


def test_trainer_fine_tunes_the_transformer_and_exports_it(fine_tuned):
    model_dir, summary = fine_tuned
    assert summary["distance"] == "cosine" and summary["learning_rate"] == 5e-5
    assert summary["learning_curve"][0]["triplets_seen"] == 16
    history = json.loads((model_dir / HISTORY).read_text())
    assert history["config"]["encoder"] == "minilm"
    assert (model_dir / LEARNING_CURVE).stat().st_size > 0
    encoder = SavedModelEncoder(str(model_dir))
    embeddings = encoder.encode(["Rivers flow into seas.", "Zürich is a city."])
    assert embeddings.shape == (2, 384) and np.isfinite(embeddings).all()
    untrained = build_transformer_encoder()(token_ids(32)(tf.constant(["Rivers flow into seas."]))).numpy()
    assert not np.allclose(untrained[0], embeddings[0], atol=1e-4)   # two AdamW steps moved the weights


def _keras_hub_embeddings(folder, sentences, reference_tokenizer, max_tokens) -> np.ndarray:
    """Embeddings by keras-hub's own Hugging Face loader: the backbone read from `folder`, mean-pooled
    over the tokens the checkpoint's tokenizer gives (truncated as sentence-transformers does)."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone.from_preset(str(folder))
    rows = []
    for sentence in sentences:
        ids = np.array([reference_tokenizer.encode(sentence).ids])
        ids = np.concatenate([ids[:, :max_tokens - 1], ids[:, -1:]], axis=1) if ids.shape[1] > max_tokens else ids
        states = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids),
                           "segment_ids": np.zeros_like(ids)})["sequence_output"]
        rows.append(np.asarray(states)[0].mean(axis=0))
    return np.array(rows)


def test_the_sentence_transformers_export_holds_the_fine_tuned_weights(fine_tuned, embedded_pipeline_output,
                                                                       reference_tokenizer):
    model_dir, _ = fine_tuned
    folder = model_dir / SENTENCE_TRANSFORMERS
    sentences = real_sentences(embedded_pipeline_output, limit=40) + HARD_SENTENCES
    keras_export = SavedModelEncoder(str(model_dir)).encode(sentences)
    by_keras_hub = _keras_hub_embeddings(folder, sentences, reference_tokenizer, max_tokens=32)
    np.testing.assert_allclose(by_keras_hub, keras_export, atol=1e-5)
    untrained = _keras_hub_embeddings(checkpoint_dir(), sentences[:3], reference_tokenizer, max_tokens=32)
    assert not np.allclose(untrained, keras_export[:3], atol=1e-4)   # the fine-tuned weights, not the checkpoint's

    # sentence-transformers' documented files: modules in order, mean pooling, its similarity name
    modules = json.loads((folder / "modules.json").read_text())
    assert [(m["idx"], m["path"], m["type"]) for m in modules] == [
        (0, "", "sentence_transformers.models.Transformer"), (1, "1_Pooling", "sentence_transformers.models.Pooling")]
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert pooling["word_embedding_dimension"] == 384 and pooling["pooling_mode_mean_tokens"]
    assert [key for key, value in pooling.items() if key.startswith("pooling_mode_") and value] == [
        "pooling_mode_mean_tokens"]
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == 32
    assert json.loads((folder / "config_sentence_transformers.json").read_text())["similarity_fn_name"] == "cosine"
    assert {"vocab.txt", "tokenizer.json", "config.json", "model.safetensors"} <= {p.name for p in folder.iterdir()}
    card = (folder / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])   # the Hub's model card metadata
    assert {key: front[key] for key in ("library_name", "pipeline_tag", "base_model", "license", "language")} == {
        "library_name": "sentence-transformers", "pipeline_tag": "sentence-similarity",
        "base_model": "sentence-transformers/all-MiniLM-L6-v2", "license": "apache-2.0", "language": ["en"]}
    assert front["datasets"] and "sentence-transformers" in front["tags"]
    assert "16 training triplets seen" in card and "articles kept of" in card and "enwiki-" in card
    assert not re.search(r"\bNone\b|\bnan\b", card) and str(model_dir.parent) not in card and "/tmp" not in card
    # every file as readable as any other the user writes (safetensors' own writer made 0600 files)
    assert {oct(path.stat().st_mode & 0o777) for path in folder.rglob("*") if path.is_file()} == {"0o644"}


def test_model_export_rewrites_the_same_folder_from_the_model_dir(fine_tuned, tmp_path):
    from safetensors.numpy import load_file

    from model.export import main as export

    model_dir, _ = fine_tuned
    export(["--model-dir", str(model_dir), "--output", str(tmp_path / "st")])
    written, at_train = load_file(tmp_path / "st" / "model.safetensors"), load_file(
        model_dir / SENTENCE_TRANSFORMERS / "model.safetensors")
    assert written.keys() == at_train.keys() and len(written) == 5 + 6 * 16 + 2
    for name in written:
        np.testing.assert_array_equal(written[name], at_train[name])


def test_a_layer_reduced_net_keeps_the_checkpoints_lowest_layers_and_exports_them(tmp_path, reference_tokenizer):
    from model.formats.hf import write_sentence_transformers

    with pytest.raises(ValueError, match="--transformer-layers must be in 1..6"):
        TrainConfig.from_flags(data="d", model_dir="m", encoder="minilm", transformer_layers=7)
    reduced = build_transformer_encoder(layers=2).get_layer(index=1)
    full = build_transformer_encoder().get_layer(index=1)
    assert (reduced.num_layers, full.num_layers) == (2, 6)
    for name in ("token_embedding", "transformer_layer_0", "transformer_layer_1"):
        for kept, checkpoint in zip(reduced.get_layer(name).weights, full.get_layer(name).weights):
            np.testing.assert_array_equal(kept.numpy(), checkpoint.numpy())

    encoder = build_transformer_encoder(layers=2)
    folder = write_sentence_transformers(encoder, checkpoint_dir(), str(tmp_path / "st"), max_tokens=32,
                                         similarity="cosine", card="")
    assert json.loads((tmp_path / "st" / "config.json").read_text())["num_hidden_layers"] == 2
    sentences = HARD_SENTENCES[:3]
    by_keras_hub = _keras_hub_embeddings(folder, sentences, reference_tokenizer, max_tokens=32)
    np.testing.assert_allclose(by_keras_hub, encoder(token_ids(32)(tf.constant(sentences))).numpy(), atol=1e-5)


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                    reason="sentence-transformers (PyTorch) not installed: docs/export.md runs this check")
def test_sentence_transformers_loads_the_export(fine_tuned, embedded_pipeline_output):
    from sentence_transformers import SentenceTransformer

    model_dir, _ = fine_tuned
    sentences = real_sentences(embedded_pipeline_output, limit=200)
    theirs = SentenceTransformer(str(model_dir / SENTENCE_TRANSFORMERS), device="cpu").encode(sentences)
    ours = SavedModelEncoder(str(model_dir)).encode(sentences)
    cosines = (theirs * ours).sum(1) / np.linalg.norm(theirs, axis=1) / np.linalg.norm(ours, axis=1)
    assert cosines.min() >= 0.9999
