"""The NumPy tokenizer (`model.net.wordpieces`, Hugging Face tokenizers) gives the in-graph
tokenizer's ids (`model.net.transformer.BertIds`, tensorflow-text, the export's) on hard text and on
every sentence of the excerpt's run."""
import numpy as np
import pytest
import tensorflow as tf

from core.records import ROLES, TRIPLET_DATASETS
from core.splits import SPLITS
from model.net.transformer import token_ids
from model.net.wordpieces import wordpieces
from model.training.arrays import split_triplets
from model.training.shards import open_run

HARD = ["Café au lait in São Paulo…", "Die Straße in Zürich.", "東京は日本の首都です。", "Party 🎉🎈 tonight!",
        "مرحبا بالعالم", "שלום עולם", "ǅemal from İstanbul, ﬁne ligatures", "a\u00a0b\u200bc\ufffd d\te\nf",
        "x" * 120, "Ünïcödé ÀÉÎÕÜ", "", "   ", "word " * 80, "U.S.-based (1999–2001) \"quotes\" & [brackets]"]


def _assert_same_ids(sentences: list[str], max_tokens: int) -> None:
    in_graph = token_ids(max_tokens)(tf.constant(sentences)).numpy()
    numpy_ids = wordpieces(max_tokens)(sentences)
    assert numpy_ids.dtype == np.int32 and numpy_ids.shape == in_graph.shape
    differing = [sentences[row] for row in np.flatnonzero((numpy_ids != in_graph).any(axis=1))]
    assert differing == []


@pytest.mark.parametrize("max_tokens", [8, 64])
def test_hard_text_gets_the_in_graph_tokenizers_ids(max_tokens):
    _assert_same_ids(HARD, max_tokens)


def test_every_sentence_of_the_excerpts_run_gets_the_in_graph_tokenizers_ids(embedded_pipeline_output):
    run = open_run(str(embedded_pipeline_output))
    sentences = set()
    for dataset in TRIPLET_DATASETS:
        for split in SPLITS:
            sentences.update(triplet[role] for triplet in split_triplets(run, dataset, split) for role in ROLES)
    assert len(sentences) > 1000
    _assert_same_ids(sorted(sentences), 64)
