"""Each method's embeddings of a set of distinct sentences, computed once and kept as Parquet.

`eval.all` scores every method on the test split's triplets and on SICK in the driver, from one
set of distinct sentences (the SCB job embeds its articles in its workers, `eval.scb`, so that no
driver holds a full dump's SCB vectors). `cache_embeddings` encodes each distinct sentence once
per method and writes `<folder>/<method>.parquet` with
`model.embed`'s columns (`id`: a stable hash of the text, `text`, `embedding`), then
`<method>.json`, the key that lets a later run reuse the file: the encoder spec, a SHA-256 of the
sentences in order, and one of the encoder's files. A spec of kind `SpecKind.CACHED`
(`model.encoding.encoders`) is an encoder that answers from such a file, so every job scores it like any
other method; a sentence that is not in the file is an error, never a silent zero.

An encoder whose vectors depend on the set encoded together (`fits_each_call`: TF-IDF, whose IDF
is fitted per call) is never cached; its spec is kept and each set is encoded on its own.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from tqdm import tqdm

from core.files import write_bytes
from core.splits import stable_hash
from model.encoding.encoder import SentenceEncoder, per_sentence_runs
from model.encoding.encoders import CachedEncoder, EncoderSpec, SpecKind, load_encoder, method_names
from model.encoding.trained_net import runs_as_net
from model.formats.onnx_export import CONFIG_FILE, GRAPH_FILE, VOCABULARY_FILE
from model.training.model_dir import ENCODER, ModelDir

# Where an evaluation keeps its embeddings, under its --output.
EMBEDDINGS_FOLDER = "embeddings"
# Sentences per encode call: long enough for the encoders' own batching, short enough to show progress.
ENCODE_CHUNK = 2048


def parquet_schema(dim: int) -> pa.Schema:
    """`model.embed`'s output columns: id, text and a fixed-width float32 embedding."""
    return pa.schema([("id", pa.string()), ("text", pa.string()), ("embedding", pa.list_(pa.float32(), dim))])


def sentences_sha256(sentences: list[str]) -> str:
    digest = hashlib.sha256()
    for sentence in sentences:
        digest.update(sentence.encode("utf-8") + b"\0")
    return digest.hexdigest()


def encoder_fingerprint(spec: EncoderSpec) -> str:
    """A SHA-256 of what makes a trained encoder (each export's graph and variable index, whose
    entries hold their tensors' checksums, or the model dir's best weights where it has no
    export; an ONNX export's settings, graph and vocabulary); a baseline's spec names it on its
    own."""
    digest = hashlib.sha256(str(spec).encode("utf-8"))
    parts = [FileSystems.join(model_dir.rstrip("/"), part) for model_dir in spec.model_dirs
             for part in (f"{ENCODER}/saved_model.pb", f"{ENCODER}/variables/variables.index")]
    # a model dir encoded by its Net (a JAX run's without its SavedModel): its best weights
    parts += [ModelDir(model_dir).best_weights for model_dir in spec.model_dirs if runs_as_net(model_dir)]
    if spec.kind is SpecKind.ONNX:
        parts = [FileSystems.join(spec.paths[0].rstrip("/"), part)
                 for part in (CONFIG_FILE, GRAPH_FILE, VOCABULARY_FILE)]
    for path in parts:
        if FileSystems.exists(path):
            with FileSystems.open(path) as handle:
                for chunk in iter(lambda: handle.read(1 << 24), b""):   # a weights file: GBs for MPNet
                    digest.update(chunk)
    if spec.kind is SpecKind.ONNX and _runs_one_sentence_at_a_time(parts[0]):
        # int8 graphs are encoded one sentence per run since issue 70: vectors kept from batches differ
        digest.update(b"one sentence per run")
    return digest.hexdigest()


def _runs_one_sentence_at_a_time(config_path: str) -> bool:
    if not FileSystems.exists(config_path):
        return False
    with FileSystems.open(config_path) as handle:
        return per_sentence_runs(json.loads(handle.read()))


def encode_with_progress(encoder: SentenceEncoder, sentences: list[str]) -> np.ndarray:
    """float32 [n, d] embeddings, encoded in length order (batches of like length pad least) in
    chunks, with a progress bar counting sentences."""
    order = np.argsort([len(sentence) for sentence in sentences], kind="stable")
    embeddings: np.ndarray | None = None
    with tqdm(total=len(sentences), desc=f"encode [{encoder.name}]", unit="sentence") as progress:
        for start in range(0, len(sentences), ENCODE_CHUNK):
            rows = order[start:start + ENCODE_CHUNK]
            chunk = np.asarray(encoder.encode([sentences[row] for row in rows]), dtype=np.float32)
            if embeddings is None:
                embeddings = np.empty((len(sentences), chunk.shape[1]), np.float32)
            embeddings[rows] = chunk
            progress.update(len(rows))
    if embeddings is None:   # no sentences: no width to give the (empty) array
        raise ValueError(f"encode [{encoder.name}]: no sentences to encode")
    return embeddings


def write_cache(path: str, sentences: list[str], embeddings: np.ndarray) -> None:
    dim = embeddings.shape[1]
    table = pa.Table.from_arrays(
        [pa.array([f"{stable_hash(sentence):016x}" for sentence in sentences]), pa.array(sentences),
         pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1)), dim)],
        schema=parquet_schema(dim))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    write_bytes(path, sink.getvalue().to_pybytes())


def cache_embeddings(specs: list[EncoderSpec], sentences: list[str], folder: str) -> list[EncoderSpec]:
    """Each spec's embeddings of `sentences` (distinct, in a fixed order) in `folder`, reused when
    its key matches, else encoded now; returns the specs to score with: cached ones, and the
    specs of encoders fitted per call as they were."""
    scored = []
    key_of = {"sentences_sha256": sentences_sha256(sentences), "sentences": len(sentences)}
    cached_exports: dict[str, CachedEncoder] = {}   # model dir -> its cached embeddings, for concatenations
    for spec, name in zip(specs, method_names(specs)):
        path = FileSystems.join(folder, f"{name}.parquet")
        key_path = FileSystems.join(folder, f"{name}.json")
        key = {"spec": str(spec), "encoder_sha256": encoder_fingerprint(spec), **key_of}
        reused = False
        if FileSystems.exists(key_path) and FileSystems.exists(path):
            with FileSystems.open(key_path) as handle:
                reused = json.load(handle) == key
            if reused:
                print(f"encode [{name}]: {len(sentences)} sentences reused from {path}")
        if not reused:
            encoder = load_encoder(spec, cached_exports)   # a concatenation of cached parts: a lookup
            if getattr(encoder, "fits_each_call", False):
                scored.append(spec)
                continue
            write_cache(path, sentences, encode_with_progress(encoder, sentences))
            write_bytes(key_path, (json.dumps(key, indent=2, sort_keys=True) + "\n").encode("utf-8"))
            del encoder   # one trained model in memory at a time
        if spec.kind is SpecKind.SAVED:
            cached_exports[spec.paths[0]] = CachedEncoder(path, name)
        scored.append(EncoderSpec(SpecKind.CACHED, name, (path,)))
    return scored
