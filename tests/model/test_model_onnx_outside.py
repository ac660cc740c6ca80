"""The committed int8 export's README, for users outside the project: its snippet (onnxruntime,
numpy and `tokenizers` only) gives `load_encoder`'s vectors, and what it says of the graph holds,
so the README cannot drift from the code."""
import os
import re

import numpy as np
import pytest

from model.encoding.encoder import load_encoder

FOLDER = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "results", "2019-gpu-eval",
                      "minilm-gpu-soup-int8")
FOLDER_LINE = 'folder = "minilm-gpu-soup-int8"'

# 20 sentences, so the default batches of 16 are two: short and long (past 64 wordpieces), accents,
# CJK, digits and punctuation, and an empty one.
SENTENCES = [
    "The river rises in the Alps and flows north into the North Sea.",
    "Its tributaries drain a basin of about 185,000 square kilometres.",
    "The army surrendered after a siege of the capital that lasted eleven months.",
    "In 1871 the city became the capital of the newly unified German Empire.",
    "Zürich's Café Odeon opened in 1911 and was frequented by Einstein and Lenin.",
    "Les Misérables is a French historical novel by Victor Hugo, first published in 1862.",
    "東京は日本の首都であり、世界最大の都市圏を持つ。",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The species is listed as vulnerable on the IUCN Red List (2016).",
    "He was elected to the Royal Society in 1662; his law of elasticity followed in 1678.",
    "Yes.",
    "",
    "The album peaked at number three on the Billboard 200 and was certified platinum by the RIAA.",
    "The station is served by regional trains to Basel, Lucerne and Zürich HB every 30 minutes.",
    "Mitochondria — the \"powerhouse of the cell\" — have their own circular DNA.",
    "Der Vertrag von Versailles wurde am 28. Juni 1919 unterzeichnet.",
    "The team won the 1998–99 UEFA Champions League final 2–1 against Bayern Munich.",
    "Sales fell 12 % year on year, to $4.3 billion, according to the company's annual report.",
    ("The cathedral, begun in 1163 under Bishop Maurice de Sully and largely completed by 1260, was "
     "modified frequently in the following centuries, restored in the nineteenth century after "
     "damage during the Revolution, and badly damaged by fire in April 2019."),
    "Rivers of the world flow into seas and oceans of many kinds, " * 6,
]


def _readme() -> str:
    with open(os.path.join(FOLDER, "README.md"), encoding="utf-8") as handle:
        return handle.read()


def _snippet_encode():
    """The README's first ```python block, run with `folder` pointing at the export: its `encode`."""
    code = re.search(r"```python\n(.*?)```", _readme(), re.S).group(1)
    assert code.count(FOLDER_LINE) == 1, f"the snippet no longer sets {FOLDER_LINE!r}: update this test"
    namespace: dict = {}
    exec(code.replace(FOLDER_LINE, f"folder = {FOLDER!r}"), namespace)
    assert namespace["vectors"].shape == (2, 384)
    return namespace["encode"]


def _cosines(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    return (left * right).sum(1) / np.linalg.norm(left, axis=1) / np.linalg.norm(right, axis=1)


def test_the_readmes_snippet_gives_load_encoders_vectors():
    """Equal in practice (measured: 0.0 apart); the tolerance is for ONNX Runtime's thread count,
    which differs (load_encoder's: the CPUs the process may use; the snippet's: ONNX Runtime's
    default) and may reorder float sums by ~1e-6. It still catches drift: batching otherwise
    (one batch of all 20) moves rows to cosine ~0.98, another tokenizer or pooling further."""
    snippet = _snippet_encode()(SENTENCES)
    ours = load_encoder(FOLDER).encode(SENTENCES)
    assert snippet.dtype == np.float32 and snippet.shape == ours.shape == (len(SENTENCES), 384)
    assert _cosines(snippet, ours).min() >= 0.99999
    np.testing.assert_allclose(snippet, ours, rtol=0, atol=1e-5)


@pytest.mark.parametrize("sentence", ["ж" * 60 + " word", "x" * 101])
def test_the_readmes_byte_limit_caveat_holds(sentence):
    """The README says the plain tokenizer.json differs from the project's only on a non-ASCII word
    of more than 100 bytes but at most 100 characters (tensorflow-text's byte limit)."""
    from tokenizers import Tokenizer

    from model.net.wordpieces import WordPieces

    plain = Tokenizer.from_file(os.path.join(FOLDER, "tokenizer.json")).encode(sentence).ids
    ours = WordPieces(os.path.join(FOLDER, "vocab.txt"), 64)([sentence])[0].tolist()
    assert (plain == ours) == sentence.isascii()


def test_the_graph_pools_inside_as_the_readme_says():
    """Why sentence-transformers' ONNX backend cannot load it (the README's last section): it feeds
    token ids and pools the graph's token states itself; this graph takes no token_type_ids and
    gives only the pooled `sentence_embedding` [n, 384]."""
    import onnxruntime

    session = onnxruntime.InferenceSession(os.path.join(FOLDER, "model.onnx"), providers=["CPUExecutionProvider"])
    assert [node.name for node in session.get_inputs()] == ["input_ids", "attention_mask"]
    assert [(node.name, node.shape[1]) for node in session.get_outputs()] == [("sentence_embedding", 384)]
