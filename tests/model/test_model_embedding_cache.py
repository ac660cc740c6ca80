"""The embedding cache: each distinct sentence encoded once per method, kept as Parquet, reused
only while the sentences and the encoder are the same, and never answering for a sentence it lacks."""
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from model.encoding.embedding_cache import cache_embeddings
from model.encoding.encoders import CachedEncoder, EncoderSpec, MeanVectorsEncoder, SpecKind, load_encoders

MEAN_VECTORS, TFIDF = EncoderSpec.parse("mean-vectors"), EncoderSpec.parse("tfidf")
SENTENCES = ["The river floods every spring.", "A violin has four strings.", "Stars burn hydrogen.",
             "The violin was made in Cremona."]


def test_cache_is_written_once_and_serves_the_encoders_vectors(tmp_path, capsys):
    specs = cache_embeddings([MEAN_VECTORS, TFIDF], SENTENCES, str(tmp_path))
    path = tmp_path / "mean-vectors.parquet"
    assert specs == [EncoderSpec(SpecKind.CACHED, "mean-vectors", (str(path),)), TFIDF]   # TF-IDF: never cached
    assert json.loads((tmp_path / "mean-vectors.json").read_text())["spec"] == "mean-vectors"
    table = pq.read_table(path)
    assert table.column("text").to_pylist() == SENTENCES and table.schema.field("embedding").type.list_size == 50
    expected = MeanVectorsEncoder().encode(SENTENCES)
    cached, tfidf = load_encoders(specs)
    np.testing.assert_array_equal(cached.encode(SENTENCES[::-1]), expected[::-1])
    assert cached.name == "mean-vectors" and tfidf.name == "tfidf"

    written = path.stat().st_mtime_ns
    assert cache_embeddings([MEAN_VECTORS], SENTENCES, str(tmp_path)) == specs[:1]
    assert path.stat().st_mtime_ns == written and "reused" in capsys.readouterr().out

    cache_embeddings([MEAN_VECTORS], SENTENCES[:2], str(tmp_path))   # other sentences: encoded anew
    assert pq.read_table(path).num_rows == 2
    assert json.loads((tmp_path / "mean-vectors.json").read_text())["sentences"] == 2


def test_a_sentence_missing_from_the_cache_is_an_error_naming_the_file(tmp_path):
    (spec,) = cache_embeddings([MEAN_VECTORS], SENTENCES, str(tmp_path))
    encoder = CachedEncoder(spec.paths[0], "mean-vectors")
    with pytest.raises(KeyError, match="mean-vectors.parquet: no cached embedding of the sentence 'Never seen.'"):
        encoder.encode(["Stars burn hydrogen.", "Never seen."])
