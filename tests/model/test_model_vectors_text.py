"""Word vectors (embedded GloVe, streamed GloVe text local and gs://) and the in-graph tokenizer."""
import gzip

import numpy as np
import pytest

from model.net.text import tokenize, tokenize_graph
from model.net.vectors import WordVectorsError, load_word_vectors

GLOVE_TEXT = (
    "the 0.1 0.2 0.3\n"
    ", 0.4 0.5 0.6\n"
    ". . . 1.0 1.0 1.0\n"      # 840B has words containing spaces
    "broken 0.1 oops 0.3\n"    # non-numeric: counted, skipped
    "short\n"                  # too few fields: counted, skipped
    "cat 0.7 0.8 0.9\n"
    "the 9 9 9\n"              # duplicate keeps the first vector
)


def test_embedded_glove_restricted_to_vocabulary():
    vectors = load_word_vectors(vocabulary=["the", "cat", "zzznotaword"])
    assert sorted(vectors.words) == ["cat", "the"]
    assert vectors.matrix.shape == (2, 50) and vectors.matrix.dtype == np.float32
    full = load_word_vectors(vocabulary=["the"])
    np.testing.assert_array_equal(full.matrix[0], vectors.matrix[vectors.index()["the"]])


@pytest.mark.parametrize("compressed", [False, True])
def test_glove_text_streamed_and_restricted(tmp_path, compressed):
    path = tmp_path / ("glove.txt.gz" if compressed else "glove.txt")
    if compressed:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(GLOVE_TEXT)
    else:
        path.write_text(GLOVE_TEXT, encoding="utf-8")
    vectors = load_word_vectors(str(path), vocabulary=["the", "cat", ". . .", "broken", "dog"])
    assert vectors.words == ["the", ". . .", "cat"]
    np.testing.assert_allclose(vectors.matrix[0], [0.1, 0.2, 0.3])
    np.testing.assert_allclose(vectors.matrix[2], [0.7, 0.8, 0.9])
    assert vectors.malformed_lines == 2


def test_glove_text_from_gcs(gcs_emulator):
    from apache_beam.io.filesystems import FileSystems

    path = gcs_emulator() + "/glove.txt"
    with FileSystems.create(path) as handle:
        handle.write(GLOVE_TEXT.encode("utf-8"))
    vectors = load_word_vectors(path, vocabulary=["cat"])
    assert vectors.words == ["cat"] and vectors.dim == 3


def test_glove_text_bad_input_names_the_file(tmp_path):
    with pytest.raises(WordVectorsError, match="missing.txt"):
        load_word_vectors(str(tmp_path / "missing.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(WordVectorsError, match="empty.txt"):
        load_word_vectors(str(empty))


def test_tokenizer_lower_cases_and_splits_like_glove():
    assert tokenize(["Don't STOP: John's car!", "", "  two   words "]) == [
        ["do", "n't", "stop", ":", "john", "'s", "car", "!"], [], ["two", "words"]]
    glove_words = set(load_word_vectors(vocabulary=["do", "n't", "'s", "john", ":"]).words)
    assert glove_words == {"do", "n't", "'s", "john", ":"}


def test_python_tokenize_matches_graph():
    import tensorflow as tf

    sentences = ["The Éiffel tower, built in 1889.", "Ça va?"]
    graph = tf.function(tokenize_graph)(tf.constant(sentences)).to_list()
    assert [[t.decode() for t in row] for row in graph] == tokenize(sentences)
