"""One way to encode sentences: objects with `encode(list[str]) -> np.ndarray`.

`SavedModelEncoder` loads the trainer's export (the model dir's ENCODER), whose
`serving_default` signature maps a 1-D tf.string tensor of raw sentences to
`{"embeddings": float32 [n, d]}`; tokenisation and the vocabulary live inside the graph.
`OnnxEncoder` runs an ONNX export folder (`model.export --format onnx`) with ONNX Runtime, without
TensorFlow; `load_encoder` and the spec `onnx:DIR` (`model.encoding.encoders`) load it, and every
job then uses it as the SavedModel export. Like a SavedModel, a graph is code: load only exports
you trust.
A remote export (`gs://...`) is first downloaded to a local temporary directory through Beam
FileSystems (`core.storage`: TensorFlow's GCS filesystem cannot reach the test emulator).

A model dir is code, not data: a SavedModel's graph runs whatever ops it holds when it is loaded
and called (it could read or write files: `tf.io.write_file`), so load only exports you trust,
as with a pickle.

`load_encoder(path)` is the standalone entry point: it works in a fresh interpreter because loading
imports `tensorflow_text`, which registers the tokenizer's ops (`CaseFoldUTF8`,
`RegexSplitWithOffsets`) that the SavedModel's graph uses; plain `tf.saved_model.load` of an
export needs `import tensorflow_text` first for the same reason. TensorFlow itself is imported
when an encoder is loaded, not with this module: its `SentenceEncoder` protocol is for every job.
"""
from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Literal, Protocol, overload, runtime_checkable

import numpy as np

from core.cli import UsageError
from core.files import JsonFileError, is_remote, read_json_object
from core.storage import download_tree
from model.formats.onnx_export import CONFIG_FILE, FORMAT, OUTPUT
from model.net.wordpieces import WordPieces
from model.similarity import Similarity, unit_rows
from model.training.model_dir import ENCODER

SIGNATURE = "serving_default"
PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")   # sentence-transformers' `precision`
OUTPUT_KEY = "embeddings"
INPUT_KEY = "sentences"


@runtime_checkable
class SentenceEncoder(Protocol):
    """Anything that turns sentences into float32 [n, d] vectors (TF-IDF's are a SciPy sparse
    matrix, which the jobs that score every method accept). `SavedModelEncoder.encode` takes
    sentence-transformers' further arguments too; called with the sentences alone it is this."""

    name: str

    def encode(self, sentences: list[str]) -> np.ndarray: ...


def sentence_list(sentences) -> list[str]:
    """The sentences as a list: a list, tuple or any iterable (a generator) of strings. A clear
    TypeError for what is not: None, bytes, numbers, or an iterable holding a non-string."""
    if sentences is None or isinstance(sentences, (bytes, bytearray)) or not hasattr(sentences, "__iter__"):
        raise TypeError(f"encode takes a string or an iterable of strings, got {type(sentences).__name__}")
    listed = list(sentences)
    for index, sentence in enumerate(listed):
        if not isinstance(sentence, str):
            raise TypeError(f"encode takes strings: item {index} is a {type(sentence).__name__} ({sentence!r:.40})")
    return utf8_sentences(listed)


def not_utf8(text: str) -> str | None:
    """Why `text` cannot be encoded as UTF-8, or None when it can. A Python string can hold a lone
    surrogate (JSON's `"\\ud800"` escape gives one), which UTF-8 cannot encode, and TensorFlow's
    and Beam's strings are UTF-8 bytes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (f"{text!r:.60} holds the lone surrogate {text[error.start]!r} at character {error.start}, "
                "not valid Unicode (UTF-8 cannot encode it)")
    return None


def utf8_sentences(sentences: list[str]) -> list[str]:
    """The sentences, when every one can be encoded as UTF-8; a ValueError naming the first that
    cannot, by its index (`not_utf8`). One encode of them all when they can."""
    try:
        "".join(sentences).encode("utf-8")
    except UnicodeEncodeError:
        for index, sentence in enumerate(sentences):
            why = not_utf8(sentence)
            if why:
                raise ValueError(f"encode takes valid Unicode text: item {index} {why}") from None
    return sentences


def _encoder_dir(path: str) -> str:
    """Accepts the SavedModel folder itself or the model dir holding its ENCODER, local or remote."""
    path = str(path)
    join: Callable[[str, str], str]
    exists: Callable[[str], bool]
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        join, exists = FileSystems.join, FileSystems.exists
    else:
        join, exists = os.path.join, os.path.exists
    if exists(join(path, "saved_model.pb")):
        return path
    nested = join(path, ENCODER)
    if exists(join(nested, "saved_model.pb")):
        return nested
    raise FileNotFoundError(f"no SavedModel encoder at {path} (nor at {nested})")


class ExportedEncoder:
    """What every exported encoder gives beside `encode(list[str])`: sentence-transformers'
    `encode` arguments and `similarity`, by the similarity the export records. A subclass sets
    `name`, `dim`, `batch_size`, `similarity_function` (`similarity_fn_name`) and
    `max_seq_length`, and embeds a list of valid sentences in `_embed`."""

    name: str
    dim: int
    batch_size: int
    similarity_function: Similarity
    similarity_fn_name: str
    max_seq_length: int | None

    def get_sentence_embedding_dimension(self) -> int:
        return self.dim

    # The default (NumPy) is an array: the `SentenceEncoder` every job calls; `convert_to_numpy=False` gives rows.
    @overload
    def encode(self, sentences: str | Iterable[str], batch_size: int | None = None,
               show_progress_bar: bool | None = None, output_value: str = "sentence_embedding",
               precision: str = "float32", convert_to_numpy: Literal[True] = True, convert_to_tensor: bool = False,
               device: str | None = None, normalize_embeddings: bool = False) -> np.ndarray: ...

    @overload
    def encode(self, sentences: str | Iterable[str], batch_size: int | None = None,
               show_progress_bar: bool | None = None, output_value: str = "sentence_embedding",
               precision: str = "float32", convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               device: str | None = None, normalize_embeddings: bool = False) -> np.ndarray | list[np.ndarray]: ...

    def encode(self, sentences: str | Iterable[str], batch_size: int | None = None,
               show_progress_bar: bool | None = None, output_value: str = "sentence_embedding",
               precision: str = "float32", convert_to_numpy: bool = True, convert_to_tensor: bool = False,
               device: str | None = None, normalize_embeddings: bool = False) -> np.ndarray | list[np.ndarray]:
        """float32 [n, d] embeddings of sentences (a list or any iterable of strings), [d] of a
        single string, with sentence-transformers' `encode` arguments: `normalize_embeddings`
        scales each row to unit length (cosine similarity becomes a dot product); `precision`
        quantises as its `quantize_embeddings` does (`quantize`); `convert_to_numpy=False` gives a
        list of rows. It runs where its runtime places it and returns NumPy: `device` and
        `convert_to_tensor` are refused."""
        if convert_to_tensor or device is not None:
            raise TypeError(f"{type(self).__name__}.encode returns NumPy arrays and runs where its runtime places "
                            "it: convert_to_tensor and device are not supported (hide GPUs with CUDA_VISIBLE_DEVICES)")
        if output_value != "sentence_embedding":
            raise TypeError(f"output_value={output_value!r}: the export gives sentence embeddings only")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if isinstance(sentences, str):
            return self.encode([sentences], batch_size, show_progress_bar, output_value, precision, convert_to_numpy,
                               normalize_embeddings=normalize_embeddings)[0]
        sentences = sentence_list(sentences)
        embeddings = self._embed(sentences, batch_size or self.batch_size, bool(show_progress_bar))
        if normalize_embeddings:
            embeddings = unit_rows(embeddings)
        embeddings = quantize(embeddings, precision)
        return embeddings if convert_to_numpy else list(embeddings)

    def _embed(self, sentences: list[str], batch_size: int, show_progress_bar: bool) -> np.ndarray:
        raise NotImplementedError

    def similarity(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """[n, m] similarities of two sets of embeddings (a single one, [d], counts as [1, d]),
        by the similarity the export records: cosine, or for `manhattan` the negative L1 distance
        (higher is more similar either way, as sentence-transformers' `similarity`)."""
        left, right = np.atleast_2d(left).astype(np.float32), np.atleast_2d(right).astype(np.float32)
        return self.similarity_function.matrix(left, right)

    def similarity_pairwise(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        """[n] similarities of row i of `left` with row i of `right`, as sentence-transformers'
        `similarity_pairwise`."""
        left, right = np.atleast_2d(left).astype(np.float32), np.atleast_2d(right).astype(np.float32)
        if left.shape != right.shape:
            raise ValueError(f"similarity_pairwise takes two [n, d] arrays of one shape, got {left.shape} and "
                             f"{right.shape}")
        return self.similarity_function.pairwise(left, right)


def tensorflow_threads(threads: int) -> None:
    """TensorFlow's threads per operator and operators at once in this process, which it fixes
    when its runtime starts: set before the process's first TensorFlow work (a Beam worker's first
    encoder). Where it has started already, it keeps the threads it has (logged, not an error: the
    embeddings are the same, only their speed differs)."""
    import tensorflow as tf

    if (tf.config.threading.get_intra_op_parallelism_threads() == threads
            and tf.config.threading.get_inter_op_parallelism_threads() == threads):
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError as error:   # "... cannot be modified after initialization"
        logging.getLogger(__name__).info("TensorFlow keeps its threads: %s", error)


class SavedModelEncoder(ExportedEncoder):
    """Encodes with an exported encoder SavedModel, in batches of `batch_size` sentences."""

    def __init__(self, path: str, name: str | None = None, batch_size: int = 512, threads: int | None = None):
        """`threads`: TensorFlow's threads in this process (`tensorflow_threads`); none = its default."""
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  registers the tokenizer ops the exported graph uses

        if threads:
            tensorflow_threads(threads)
        self.path = _encoder_dir(path)
        self.name = name or os.path.basename(os.path.dirname(self.path.rstrip("/"))) or "saved"
        self.batch_size = batch_size
        local = self.path
        if is_remote(self.path):   # kept (and removed with the encoder): restored tables may read assets
            self._download = tempfile.TemporaryDirectory(prefix="saved-encoder-")
            local = self._download.name
            download_tree(self.path, local)
        self._module = tf.saved_model.load(local)
        self._serve = self._module.signatures[SIGNATURE]
        self.dim = int(self._module.embedding_dim.numpy())
        # What the embeddings were trained for (sentence-transformers' name) and the tokens
        # (wordpieces) kept per sentence, as the export records them (`ExportableEncoder`).
        self.similarity_function = Similarity.named(self._module.similarity.numpy().decode())
        self.similarity_fn_name = self.similarity_function.fn_name
        self.max_seq_length = int(self._module.max_seq_length.numpy())
        # The checkpoint a `model.pretrained` export is (a trained export records none).
        recorded = getattr(self._module, "checkpoint", None)
        self.checkpoint = recorded.numpy().decode() if recorded is not None else None

    def embed_tensor(self, sentences):
        """float32 [n, d] of a 1-D tf.string tensor, in TensorFlow: the export's signature, for a
        graph (a tf.data map: `model.train --teacher` embeds each batch's sentences so)."""
        return self._serve(**{INPUT_KEY: sentences})[OUTPUT_KEY]

    def _embed(self, sentences: list[str], batch_size: int, show_progress_bar: bool) -> np.ndarray:
        """float32 [n, d], in batches of similar length: each is padded to its longest sentence, so
        a random mix would spend most steps on padding. The order is undone; each row is the same."""
        if not sentences:
            return np.zeros((0, self.dim), np.float32)
        import tensorflow as tf
        from tqdm import tqdm

        order = np.argsort([len(sentence) for sentence in sentences], kind="stable")
        chunks = []
        for start in tqdm(range(0, len(sentences), batch_size), desc="Batches", unit="batch",
                          disable=not show_progress_bar):
            batch = tf.constant([sentences[i] for i in order[start:start + batch_size]], dtype=tf.string)
            chunks.append(self.embed_tensor(batch).numpy())
        embeddings = np.empty((len(sentences), self.dim), np.float32)
        embeddings[order] = np.concatenate(chunks)
        return embeddings


def read_settings(folder: str) -> dict:
    """The folder's `onnx.json`, checked to be this format's (`JsonFileError`, one line naming it,
    otherwise); FileNotFoundError where there is none."""
    path = os.path.join(folder, CONFIG_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no ONNX export at {folder} (no {CONFIG_FILE}; python -m model.export --format onnx "
                                "writes one)")
    settings = read_json_object(path, {"format": str, "embedding_dim": int, "max_seq_length": int,
                                       "similarity_fn_name": str, "graph": str, "vocabulary": str})
    if settings["format"] != FORMAT:
        raise JsonFileError(f"{path}: format {settings['format']!r}, not {FORMAT!r}")
    return settings


def session_options(threads: int):
    """ONNX Runtime's options: every graph optimization (it fuses the int8 products' quantize,
    multiply and rescale), `threads` for one operator, one operator at a time."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3   # no warnings about the contrib operators' shape inference
    # Idle threads sleep instead of spinning: on shared cores (a Beam worker's other threads, other
    # processes) a spinning pool takes the time the working threads need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def onnx_session(graph: str, threads: int, shown: str | None = None):
    """ONNX Runtime's session of the graph file `graph` on the CPU; a graph it cannot read (cut
    short, not ONNX, absent) is a UsageError naming the file (`shown`: its remote path, where
    `graph` is the downloaded copy), not ONNX Runtime's own exception."""
    import onnxruntime
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidGraph, InvalidProtobuf, NoSuchFile

    try:
        return onnxruntime.InferenceSession(graph, session_options(threads), providers=["CPUExecutionProvider"])
    except (InvalidProtobuf, InvalidGraph, NoSuchFile, Fail) as error:
        raise UsageError(f"{shown or graph}: ONNX Runtime cannot load it ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][-200:]}); export the encoder again "
                         "(python -m model.export --format onnx)") from None


def per_sentence_runs(settings: dict) -> bool:
    """Whether an export's graph (its `onnx.json` settings) quantizes activations dynamically, by
    each run's range (`quantize_dynamic`), so that only a run of one sentence is batch-invariant:
    every int8 export, those written before `onnx.json` recorded its activations included."""
    quantization = settings.get("quantization") or {}
    return bool(quantization.get("type")) and quantization.get("activations", "dynamic") == "dynamic"


class OnnxEncoder(ExportedEncoder):
    """Encodes with an ONNX export folder (`model.export --format onnx`, `model.formats.onnx_export`)
    without TensorFlow: `model.net.wordpieces` tokenizes (the SavedModel's ids), ONNX Runtime runs
    the graph, in batches of `batch_size` sentences of like length. `threads`: ONNX Runtime's
    threads per operator (none = the CPUs this process may run on, as TensorFlow takes them).

    Batches of 16: an SCB article's sentences in one batch of 512 are all padded to its longest, and
    16 encode them 2.2-2.6x faster on 2 cores, float32 to the same embeddings (cosine 0.9999998;
    docs/results.md, issue 64).

    A dynamically quantized graph (`per_sentence_runs`: every int8 export so far) runs each
    sentence on its own, unpadded: it scales each run's activations by their range, one scale per
    tensor, so in a batch a sentence's vector moved with its batch-mates and their padding (cosine
    0.98-0.995 of its own) and cached embeddings disagreed with reruns. Alone, the vector depends
    on the sentence only, whatever the batch or `batch_size`. It costs speed, not accuracy: on the
    2019 test split's 34,565 sentences 1.9x the CPU time of batches of 16 (1.1-2.9x the wall time
    on 2 busy cores), triplet accuracy 0.7675 -> 0.7680 (docs/results.md, issue 70 item 5). Fixed
    activation scales (static quantization) would keep batches, but need the float graph, which a
    committed int8 export does not hold."""

    def __init__(self, path: str, name: str | None = None, batch_size: int = 16, threads: int | None = None):
        self.path = str(path).rstrip("/")
        self.name = name or os.path.basename(self.path) or "onnx"
        self.batch_size = batch_size
        local = self.path
        if is_remote(self.path):
            self._download = tempfile.TemporaryDirectory(prefix="onnx-encoder-")
            local = self._download.name
            download_tree(self.path, local)
        settings = read_settings(local)
        self.settings = settings
        self.dim = int(settings["embedding_dim"])
        self.max_seq_length = int(settings["max_seq_length"])
        self.similarity_function = Similarity.named(settings["similarity_fn_name"])
        self.similarity_fn_name = self.similarity_function.fn_name
        self.quantization = (settings.get("quantization") or {}).get("type")
        self.per_sentence = per_sentence_runs(settings)
        self.threads = threads or len(os.sched_getaffinity(0))
        self.pieces = WordPieces(os.path.join(local, settings["vocabulary"]), self.max_seq_length)
        self._session = onnx_session(os.path.join(local, settings["graph"]), self.threads,
                                     f"{self.path}/{settings['graph']}")

    def embed_ids(self, ids: np.ndarray) -> np.ndarray:
        """float32 [n, d] of wordpiece ids [n, t] (0 = padding), as the tokenizer gives them; for a
        dynamically quantized graph each row is run alone, cut to its own wordpieces (the class
        docstring says why)."""
        ids = np.asarray(ids, np.int64)
        if not self.per_sentence:
            return self._run(ids)
        lengths = (ids != 0).sum(axis=1)
        embeddings = np.empty((len(ids), self.dim), np.float32)
        for row, length in enumerate(lengths):
            embeddings[row] = self._run(ids[row:row + 1, :length])[0]
        return embeddings

    def _run(self, ids: np.ndarray) -> np.ndarray:
        return self._session.run([OUTPUT], {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)})[0]

    def _embed(self, sentences: list[str], batch_size: int, show_progress_bar: bool) -> np.ndarray:
        """float32 [n, d], in batches of like length (by wordpieces), each cut to its longest
        sentence (a dynamically quantized graph's, to each sentence: `embed_ids`); the order is undone."""
        if not sentences:
            return np.zeros((0, self.dim), np.float32)
        from tqdm import tqdm

        ids = self.pieces(sentences)
        lengths = (ids != 0).sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        embeddings = np.empty((len(sentences), self.dim), np.float32)
        for start in tqdm(range(0, len(sentences), batch_size), desc="Batches", unit="batch",
                          disable=not show_progress_bar):
            rows = order[start:start + batch_size]
            embeddings[rows] = self.embed_ids(ids[rows, :lengths[rows].max()])
        return embeddings


def quantize(embeddings: np.ndarray, precision: str) -> np.ndarray:
    """float32 [n, d] embeddings at `precision`, as sentence-transformers' `quantize_embeddings`
    does without calibration data (written here: that library brings PyTorch): int8/uint8 map each
    dimension's range over these embeddings onto 256 steps; binary/ubinary pack each row's signs
    (> 0) into bits, 8 dimensions per byte, its last byte padded with 0 bits: [n, ceil(d / 8)]
    (binary: offset by -128 into int8)."""
    if precision == "float32" or not len(embeddings):
        return embeddings.astype(np.float32) if precision == "float32" else embeddings
    if precision in ("int8", "uint8"):
        starts, ends = embeddings.min(axis=0), embeddings.max(axis=0)
        steps = (ends - starts) / 255
        scaled = (embeddings - starts) / np.where(steps > 0, steps, 1.0)
        return (scaled - 128).astype(np.int8) if precision == "int8" else scaled.astype(np.uint8)
    packed = np.packbits(embeddings > 0, axis=1)   # each row on its own, its last byte padded with 0 bits
    return (packed.astype(np.int16) - 128).astype(np.int8) if precision == "binary" else packed


def is_onnx_export(path: str) -> bool:
    """Whether `path` (local or remote) is a folder `model.export --format onnx` wrote (its `onnx.json`)."""
    if is_remote(path):
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.exists(FileSystems.join(path.rstrip("/"), CONFIG_FILE))
    return os.path.exists(os.path.join(path, CONFIG_FILE))


def load_encoder(path: str, batch_size: int | None = None) -> ExportedEncoder:
    """The trained encoder at `path`: a model dir, its encoder folder, or an ONNX export folder
    (`OnnxEncoder`), local or `gs://`, encoding in batches of `batch_size` (none: the encoder's
    own default). Loading runs the export's graph: load only exports you trust (see the module
    docstring)."""
    if is_onnx_export(str(path)):
        return OnnxEncoder(str(path), batch_size=batch_size) if batch_size else OnnxEncoder(str(path))
    return SavedModelEncoder(path, batch_size=batch_size) if batch_size else SavedModelEncoder(path)
