"""The flags of the evaluations, each command's config dataclass, and the names of what the SCB
scores. Light (no heavy library): the entry modules parse them before any job loads, and the job
modules take them."""
from __future__ import annotations

from dataclasses import dataclass

from core.cli import UsageError, flag
from core.records import PAPER_DATASET, TRIPLET_DATASETS
from core.splits import SPLITS
from model.encoding.encoders import Methods
from model.training.model_dir import SENTENCE_TRANSFORMERS

VARIANTS = ("all", "openers")   # the SCB's sentences clustered: all of an article's, its paragraph openers'
ALGORITHMS = ("kmeans", "iclust", "average-link")   # `eval.clustering`
METRICS = ("MI", "AMI", "RI", "ARI")


@dataclass(frozen=True)
class ScbConfig:
    """Flags of `python -m eval.scb` (and of eval.all's SCB step)."""

    data: str = flag(help="the pipeline's --output (its manifest lists scb/); local or gs://")
    output: str = flag(help="where the results go; local or gs://")
    methods: Methods = Methods()
    seed: int = flag(0, help="seed of the clustering and of the article sample")
    max_articles: int | None = flag(None, help="score a seeded sample of this many articles; none = all")
    keep_seconds: float = flag(30.0, help="how often the job writes the rows it has scored, which a rerun into the "
                                          "same --output reuses (eval.kept); 0 = after each article")


@dataclass(frozen=True)
class TripletsConfig:
    """Flags of `python -m eval.triplets` (and of eval.all's triplet step)."""

    data: str = flag(help="the pipeline's --output (its manifest lists the shards); local or gs://")
    output: str = flag(help="where the results go; local or gs://")
    dataset: str = flag(PAPER_DATASET, help=f"triplet dataset: one of {', '.join(TRIPLET_DATASETS)}")
    split: str = flag("test", help=f"split scored: one of {', '.join(SPLITS)}")
    methods: Methods = Methods()
    max_triplets: int | None = flag(None, help="score a seeded sample of this many triplets; none = the whole split")
    seed: int = flag(0, help="seed of the triplet sample")

    def __post_init__(self):
        if self.dataset not in TRIPLET_DATASETS:
            raise UsageError(f"--dataset must be one of {TRIPLET_DATASETS}, got {self.dataset!r}")
        if self.split not in SPLITS:
            raise UsageError(f"--split must be one of {SPLITS}, got {self.split!r}")


DEFAULT_C_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0)


@dataclass(frozen=True)
class SickConfig:
    """Flags of `python -m eval.sick` (and of eval.all's SICK step)."""

    sick: str = flag(help="SICK.txt (tab-separated, with SemEval_set); local or gs://")
    output: str = flag(help="where the results go; local or gs://")
    methods: Methods = Methods()
    c_grid: tuple[float, ...] = flag(DEFAULT_C_GRID, help="inverse regularisation strengths tried, chosen on TRIAL")
    full_c_grid: bool = flag(False, help="fit every C of the grid (default: stop at the first C whose TRIAL r "
                                         "falls below the best so far)")


@dataclass(frozen=True)
class Qs3mEvalConfig:
    """Every flag of `python -m eval.qs3m` (and of eval.all's QS3M step)."""

    passages: str = flag(help="a pipeline run folder (its manifest lists passages/) or a glob of passages files, "
                              "local or gs://")
    model_dir: str = flag(help="the --output of python -m model.qs3m")
    output: str = flag(help="where qs3m.json, qs3m.md and qs3m-*.png go (local or gs://)")
    split: str = flag("test", help="the article split whose queries are clustered")
    encoder: str = flag("from-model", help="a model.encoding.encoders spec; from-model = the one the models were "
                                                    "trained on")
    lda_topics: int = flag(20, help="topics of the LDA baseline")
    max_queries: int | None = flag(None, help="score a seeded sample of this many articles of --split; none = all")
    corpus_queries: int | None = flag(2000, help="articles (a seeded sample of every split) that TF-IDF and LDA "
                                                 "are fitted on; none = all")
    seed: int = flag(0, help="seed of the clustering baselines and of the article samples")

    def __post_init__(self):
        if self.split not in SPLITS:
            raise ValueError(f"--split must be one of {SPLITS}, got {self.split!r}")
        for name in ("max_queries", "corpus_queries"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 or none, got {getattr(self, name)}")
        if self.lda_topics < 2:
            raise ValueError(f"--lda-topics must be >= 2, got {self.lda_topics}")


@dataclass(frozen=True)
class ReportConfig:
    """Flags of `python -m eval.all`."""

    data: str = flag(help="the pipeline's --output; local or gs://")
    output: str = flag(help="where the results go; local or gs://")
    methods: Methods = Methods()
    sick: str | None = flag(None, help="SICK.txt; without it the SICK step is skipped")
    qs3m: str | None = flag(None, help="a python -m model.qs3m --output: also scores its models' subtopic clustering "
                                       "of --data's passages (eval.qs3m); without it the QS3M step is skipped")
    seed: int = flag(0, help="seed of the clustering and of the samples")
    max_triplets: int | None = flag(None, help="score a seeded sample of this many test triplets; none = all")
    max_scb_articles: int | None = flag(None, help="score a seeded sample of this many SCB articles; none = all")
    int8: bool = flag(False, help="encode each transformer --model-dir with its int8 ONNX export (model.export "
                                  "--format onnx --quantize int8, written into <output>/onnx/NAME): about 2x the "
                                  "SavedModel's speed on CPU, triplet accuracy within 0.001 (docs/export.md)")
    keep_seconds: float = flag(30.0, help="how often the SCB job writes the rows it has scored, which a rerun into "
                                          "the same --output reuses (eval.kept); 0 = after each article")


@dataclass(frozen=True)
class ScbBenchmarkConfig:
    """Flags of `python -m eval.benchmark`."""

    data: str = flag(help="the pipeline's --output (its manifest lists scb/)")
    methods: Methods = Methods()
    output: str | None = flag(None, help="where to keep the job outputs and benchmark.md; none = a temp dir")
    max_articles: int | None = flag(None, help="time a seeded sample of this many SCB articles; none = all")
    encode_only: bool = flag(False, help="time encoding alone (no clustering, no job), as multiples of the first "
                                         "method's sentences/s too")
    sentence_transformers: bool = flag(False, help=f"also time each --model-dir's {SENTENCE_TRANSFORMERS}/ export in "
                                                   "sentence-transformers against its Keras export, same sentences "
                                                   "and threads (needs sentence-transformers installed)")
    onnx: bool = flag(False, help="also export each transformer --model-dir as ONNX (float32, int8) and time them "
                                  "beside its SavedModel (and sentence-transformers' ONNX int8 where installed)")
    batch_size: int = flag(512, help="--onnx: sentences per batch, every encoder alike (the SavedModel's own "
                                     "batch size)")
