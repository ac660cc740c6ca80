"""Baseline encoders behind the one SentenceEncoder interface, and encoder spec parsing."""
import shutil

import numpy as np
import pytest
from scipy import sparse

from model.encoder import SentenceEncoder
from model.encoders import (
    ConcatEncoder,
    EncoderSpecError,
    MeanVectorsEncoder,
    TfidfEncoder,
    default_encoder_specs,
    load_encoders,
    model_dir_specs,
)
from model.text import tokenize
from model.vectors import load_word_vectors


@pytest.fixture(scope="module")
def mean_vectors():
    return MeanVectorsEncoder()


def test_mean_vectors_is_the_mean_glove_vector_of_the_tokens(mean_vectors):
    sentence = "The cat sat on the mat."
    tokens = tokenize([sentence])[0]
    vectors = load_word_vectors(vocabulary=tokens)
    row_of = vectors.index()
    expected = np.mean([vectors.matrix[row_of[token]] for token in tokens], axis=0)
    embedding = mean_vectors.encode([sentence, "zzqqxx qqzzyy"])
    assert isinstance(mean_vectors, SentenceEncoder)
    assert embedding.dtype == np.float32 and embedding.shape == (2, 50)
    np.testing.assert_allclose(embedding[0], expected, rtol=1e-5)
    assert not embedding[1].any()  # no known token: the zero vector


def test_tfidf_is_sparse_shares_one_vocabulary_per_call_and_is_unit_length():
    encoder = TfidfEncoder()
    vectors = encoder.encode(["red apples and green apples", "green grass", "blue sky"])
    assert sparse.issparse(vectors) and vectors.shape[0] == 3 and vectors.nnz < vectors.shape[0] * vectors.shape[1]
    embedding = vectors.toarray()
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, rtol=1e-5)
    assert embedding[0] @ embedding[1] > 0  # share "green"
    assert embedding[0] @ embedding[2] == 0  # share nothing
    assert encoder.encode(["!!!", "..."]).shape[0] == 2  # no tokens at all still gives one row each


def test_concat_encoder_stacks_embeddings(mean_vectors):
    concat = ConcatEncoder("both", [mean_vectors, mean_vectors])
    embedding = concat.encode(["a dog barks loudly"])
    assert embedding.shape == (1, 100)
    np.testing.assert_array_equal(embedding[0, :50], embedding[0, 50:])


def test_load_encoders_parses_specs_and_rejects_bad_ones():
    encoders = load_encoders(["tfidf"])
    assert [encoder.name for encoder in encoders] == ["tfidf"]
    with pytest.raises(EncoderSpecError, match="unknown encoder spec 'bert'"):
        load_encoders(["bert"])
    with pytest.raises(EncoderSpecError, match="saved:<name>=<path>"):
        load_encoders(["saved:/no/name"])
    with pytest.raises(EncoderSpecError, match="repeated"):
        load_encoders(["tfidf", "tfidf"])
    with pytest.raises(FileNotFoundError, match="/no/such/model"):
        load_encoders(["saved:m=/no/such/model"])


def test_a_concatenation_shares_the_loaded_exports_of_its_parts(tiny_model, tmp_path):
    titles_dir = shutil.copytree(tiny_model, tmp_path / "titles")
    sen, titles, sen_titles = load_encoders(model_dir_specs([f"triplets-sen={tiny_model}",
                                                             f"triplets-titles={titles_dir}"]))
    assert sen_titles.encoders[0] is sen and sen_titles.encoders[1] is titles
    embedding = sen_titles.encode(["A dog barks."])
    np.testing.assert_array_equal(embedding, np.hstack([sen.encode(["A dog barks."])] * 2))


def test_model_dir_specs_names_dirs_and_adds_the_sen_titles_concatenation():
    specs = model_dir_specs(["runs/triplets-sen", "triplets-titles=/m/t"])
    assert specs == ["saved:triplets-sen=runs/triplets-sen", "saved:triplets-titles=/m/t",
                     "concat:triplets-sen-titles=runs/triplets-sen+/m/t"]


@pytest.mark.skipif("minilm" not in default_encoder_specs(), reason="optional extra 'minilm' not installed")
def test_minilm_embeds_related_sentences_closer():
    (encoder,) = load_encoders(["minilm"])
    embedding = encoder.encode(["A man is playing a guitar.", "Someone plays a guitar.", "The stock market fell."])
    unit = embedding / np.linalg.norm(embedding, axis=1, keepdims=True)
    assert embedding.shape == (3, 384)
    assert unit[0] @ unit[1] > unit[0] @ unit[2]
