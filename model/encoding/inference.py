"""The project's handler for Beam's RunInference: any method's encoder in one's own pipeline.

    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
    from model.encoding.inference import EncoderModelHandler
    embedded = keyed_sentences | RunInference(KeyedModelHandler(EncoderModelHandler("MODEL_DIR")))

Its own module, imported by the jobs only as they build a pipeline: Beam's RunInference module
imports PyTorch when it is installed (seconds, and PyTorch must not load after TensorFlow for
`minilm`, `model.encoding.encoders`), which importing `model.embed` or an eval job must not do.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

from apache_beam.ml.inference.base import ModelHandler, PredictionResult
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

from core.runner import Runner
from model.encoding.encoders import EncoderSpec, as_encoder_spec, load_encoder


class _ResourceWarningFilter(logging.Filter):
    """Drops Beam 2.77's "Resource module is not available ... memory usage cannot be fetched",
    logged on every RunInference batch where PyTorch is absent: Beam imports the `resource`
    module beside a PyTorch-only one and takes the failure of either for a platform without
    `resource`. The memory figure it would log is not used here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Resource module is not available")


logging.getLogger().addFilter(_ResourceWarningFilter())   # Beam logs it through the root logger


class EncoderModelHandler(ModelHandler[Any, PredictionResult, Any]):
    """RunInference over any method's encoder (`model.encoding.encoders.load_encoder(spec)`: a trained
    model, `mean-vectors`, `tfidf`, ...).

    An element is either one sentence (str), and a batch of them is encoded in one `encode` call,
    or a tuple of sentences that are encoded together into one [n, d] array (an SCB article: a
    method fitted on the set it compares, like TF-IDF, then sees exactly that set). An empty
    tuple is not encoded: its inference is None (an article the SCB job does not embed again)."""

    def __init__(self, spec: EncoderSpec | str, min_batch_size: int = 32, max_batch_size: int = 512,
                 threads: int | None = None):
        """`spec`: an encoder spec, its text, or a trained encoder's path (checked here, not at run
        time). `threads`: the encoder's threads in each worker process (`threads_per_worker`);
        none = every CPU the worker may run on."""
        super().__init__()
        self.spec = as_encoder_spec(spec)
        self.min_batch_size = min_batch_size
        self.max_batch_size = max_batch_size
        self.threads = threads

    def load_model(self):
        return load_encoder(self.spec, threads=self.threads)

    def run_inference(self, batch: Sequence[Any], model, inference_args=None) -> Iterable[PredictionResult]:
        if batch and isinstance(batch[0], str):
            embeddings = model.encode(list(batch))
        else:
            embeddings = [model.encode(list(sentences)) if sentences else None for sentences in batch]
        return [PredictionResult(example, embedding) for example, embedding in zip(batch, embeddings)]

    def batch_elements_kwargs(self):
        return {"min_batch_size": self.min_batch_size, "max_batch_size": self.max_batch_size}

    def share_model_across_processes(self) -> bool:
        return False

    def get_metrics_namespace(self) -> str:
        return "wikisim_embed"


def threads_per_worker(options: PipelineOptions) -> int:
    """An encoder's threads in each worker process of a job run with `options`: the CPUs shared
    out among the DirectRunner's workers (`--direct_num_workers`, 0 = one per CPU), and one on any
    other runner, which runs an SDK process per core (Dataflow's Python workers). Encoders that
    each take every CPU in several workers on the same cores wait on each other: on 2 cores, 60
    SCB articles took 252 CPU-seconds with 2 threads per worker and 240 with one
    (docs/results.md, issue 64); the more cores per worker, the more it matters."""
    if not Runner.of(options).is_direct:
        return 1
    cpus = len(os.sched_getaffinity(0))
    workers = options.view_as(DirectOptions).direct_num_workers
    return max(1, cpus // (workers or cpus))
