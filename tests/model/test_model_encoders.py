"""Baseline encoders behind the one SentenceEncoder interface, and encoder spec parsing."""
import pickle
import shutil

import numpy as np
import pytest
from scipy import sparse

from core.cli import UsageError
from model.encoding.encoder import SentenceEncoder
from model.encoding.encoders import (
    ConcatEncoder,
    EncoderSpec,
    EncoderSpecError,
    MeanVectorsEncoder,
    Methods,
    SpecKind,
    TfidfEncoder,
    default_encoder_specs,
    load_encoders,
    model_dir_specs,
)
from model.net.text import tokenize
from model.net.vectors import load_word_vectors


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


@pytest.mark.parametrize("text, kind, name, paths", [
    ("mean-vectors", SpecKind.MEAN_VECTORS, "mean-vectors", ()),
    ("mean-vectors:gs://b/glove.840B.300d.txt", SpecKind.MEAN_VECTORS, "mean-vectors", ("gs://b/glove.840B.300d.txt",)),
    ("tfidf", SpecKind.TFIDF, "tfidf", ()),
    ("minilm", SpecKind.MINILM, "minilm", ()),
    ("saved:sen=gs://b/runs/a+b", SpecKind.SAVED, "sen", ("gs://b/runs/a+b",)),   # one dir, "+" and all
    ("concat:sen-titles=runs/sen+runs/titles", SpecKind.CONCAT, "sen-titles", ("runs/sen", "runs/titles")),
    ("cached:sen=out/embeddings/sen.parquet", SpecKind.CACHED, "sen", ("out/embeddings/sen.parquet",)),
    ("saved:a=b=c", SpecKind.SAVED, "a", ("b=c",)),
])
def test_a_spec_is_parsed_into_its_parts_and_prints_back_as_its_text(text, kind, name, paths):
    spec = EncoderSpec.parse(text)
    assert (spec.kind, spec.name, spec.paths) == (kind, name, paths)
    assert str(spec) == text and EncoderSpec.parse(str(spec)) == spec
    assert pickle.loads(pickle.dumps(spec)) == spec   # it travels to the Beam workers


@pytest.mark.parametrize("text, message", [
    ("bert", "unknown encoder spec 'bert'; expected mean-vectors[:PATH], tfidf, minilm, saved:NAME=DIR, "
             "concat:NAME=DIR1+DIR2, cached:NAME=FILE or onnx:[NAME=]DIR"),
    ("tfidf:x", "unknown encoder spec 'tfidf:x'"),
    ("saved", "unknown encoder spec 'saved'"),
    ("mean-vectorsx", "unknown encoder spec 'mean-vectorsx'"),
    ("saved:/no/name", "encoder spec 'saved:/no/name': expected 'saved:<name>=<path>'"),
    ("concat:=a+b", "encoder spec 'concat:=a+b': expected 'concat:<name>=<path>'"),
    ("cached:name=", "encoder spec 'cached:name=': expected 'cached:<name>=<path>'"),
])
def test_a_malformed_spec_is_an_error_naming_it(text, message):
    with pytest.raises(EncoderSpecError) as raised:
        EncoderSpec.parse(text)
    assert str(raised.value).startswith(message)


def test_load_encoders_refuses_repeated_names_and_missing_models():
    encoders = load_encoders([EncoderSpec.parse("tfidf")])
    assert [encoder.name for encoder in encoders] == ["tfidf"]
    with pytest.raises(EncoderSpecError, match=r"repeated: \['tfidf'\] \(specs \['tfidf', 'tfidf'\]\)"):
        load_encoders([EncoderSpec.parse("tfidf")] * 2)
    with pytest.raises(UsageError, match="/no/such/model: no trained encoder there"):
        load_encoders([EncoderSpec.parse("saved:m=/no/such/model")])


def test_a_concatenation_shares_the_loaded_exports_of_its_parts(tiny_model, tmp_path):
    titles_dir = shutil.copytree(tiny_model, tmp_path / "titles")
    sen, titles, sen_titles = load_encoders(model_dir_specs([f"triplets-sen={tiny_model}",
                                                             f"triplets-titles={titles_dir}"]))
    assert sen_titles.encoders[0] is sen and sen_titles.encoders[1] is titles
    embedding = sen_titles.encode(["A dog barks."])
    np.testing.assert_array_equal(embedding, np.hstack([sen.encode(["A dog barks."])] * 2))


def test_model_dir_specs_names_dirs_and_adds_the_sen_titles_concatenation():
    specs = model_dir_specs(["runs/triplets-sen/", "triplets-titles=/m/t"])
    assert specs == [EncoderSpec.parse(text) for text in ("saved:triplets-sen=runs/triplets-sen/",
                                                          "saved:triplets-titles=/m/t",
                                                          "concat:triplets-sen-titles=runs/triplets-sen/+/m/t")]


def test_methods_parse_the_encoder_flags_then_add_the_model_dirs():
    methods = Methods(encoders=("tfidf", "mean-vectors:glove.txt"), model_dirs=("sen=runs/a",))
    assert [str(spec) for spec in methods.specs()] == ["tfidf", "mean-vectors:glove.txt", "saved:sen=runs/a"]
    assert methods.specs()[1].paths == ("glove.txt",)
    with pytest.raises(EncoderSpecError, match="unknown encoder spec 'bert'"):
        Methods(encoders=("bert",)).specs()


@pytest.mark.skipif("minilm" not in default_encoder_specs(), reason="optional extra 'minilm' not installed")
def test_minilm_embeds_related_sentences_closer():
    (encoder,) = load_encoders([EncoderSpec.parse("minilm")])
    embedding = encoder.encode(["A man is playing a guitar.", "Someone plays a guitar.", "The stock market fell."])
    unit = embedding / np.linalg.norm(embedding, axis=1, keepdims=True)
    assert embedding.shape == (3, 384)
    assert unit[0] @ unit[1] > unit[0] @ unit[2]


def test_the_baselines_name_a_sentence_that_is_not_valid_unicode(mean_vectors):
    for encoder in (mean_vectors, TfidfEncoder()):   # TF-IDF took TensorFlow's refusal for an empty vocabulary
        with pytest.raises(ValueError, match=r"item 2 'lone \\ud800 x' holds the lone surrogate '\\ud800'"):
            encoder.encode(["ok", "fine", "lone \ud800 x"])
