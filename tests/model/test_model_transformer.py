"""The fine-tuned transformer Net: the checkpoint's own tokenisation in the graph, the untrained
export equal to the backbone's mean-pooled states, and the trainer fine-tuning it end to end."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from model.config import TrainConfig
from model.encoder import SavedModelEncoder
from model.transformer import build_transformer_encoder, checkpoint_dir, token_ids

pytestmark = pytest.mark.slow   # the MiniLM checkpoint built and run

# Accents, ligatures, full-width forms, CJK, emoji, zero-width and soft hyphens, Greek variants,
# dashes and quotes: where tensorflow-text's own lower-casing (NFKC) parts from the checkpoint's.
HARD_SENTENCES = [
    "Café in Zürich, naïve façade — 10 km² (Straße) ﬁne ＡＢＣ",
    "He said: \"don't\"\tgo… now",
    "Φ φ ϕ İstanbul Ångström Øresund",
    "日本語のテキスト and 中文 text",
    "emoji 😀 test\u200b zero\u00adwidth\u00a0space",
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
    from eval.scb import scb_files
    from pipeline.outputs import read_bytes
    from pipeline.records import ScbRecord

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


def test_trainer_fine_tunes_the_transformer_and_exports_it(embedded_pipeline_output, tmp_path):
    from model.train import train

    model_dir = tmp_path / "minilm-sen"
    summary = train(TrainConfig.from_flags(data=str(embedded_pipeline_output), model_dir=str(model_dir),
                                           encoder="minilm", epochs=1, steps=2, batch_size=8, max_tokens=32,
                                           warmup_triplets=8, evaluation_triplets=16, progress=False))
    assert summary["distance"] == "cosine" and summary["learning_rate"] == 5e-5
    assert summary["learning_curve"][0]["triplets_seen"] == 16
    history = json.loads((model_dir / "history.json").read_text())
    assert history["config"]["encoder"] == "minilm"
    assert (model_dir / "learning_curve.png").stat().st_size > 0
    encoder = SavedModelEncoder(str(model_dir))
    embeddings = encoder.encode(["Rivers flow into seas.", "Zürich is a city."])
    assert embeddings.shape == (2, 384) and np.isfinite(embeddings).all()
    untrained = build_transformer_encoder()(token_ids(32)(tf.constant(["Rivers flow into seas."]))).numpy()
    assert not np.allclose(untrained[0], embeddings[0], atol=1e-4)   # two AdamW steps moved the weights
