"""Throughput of the SCB scoring job: sentences per second, per method, on this machine.

    python -m eval.benchmark --data OUT [--encoder SPEC ...] [--model-dir DIR ...] [--output DIR]
        [--max-articles N] [--encode-only true] [--sentence-transformers true] [--onnx true [--batch-size N]]

For each method separately it times (1) encoding alone: `encode` over every SCB article, as the
job calls it, and (2) the whole Beam job (DirectRunner: read, encode each article in the job,
three clusterings x two variants, metrics, write), and prints sentences/s for both and the share
of the job spent encoding. Sentences are counted by the job's own `scb_eval_sentences_scored` counter.

`--max-articles N` times a seeded sample of N articles (the SCB job's own sample); `--encode-only
true` times encoding alone, each method's sentences/s also as a multiple of the first method's
(the encoding cost of a distilled student beside its teacher, of a BiLSTM beside a transformer).

A second table gives each clustering's milliseconds per article (both variants, the calls of
`eval.clustering` on one method's embeddings), and Iclust's rate on its products (2 N^2 k FLOPs
per self-consistent update of a run) against this machine's float64 matmul peak on one BLAS
thread, the one thread Iclust runs on: how far its element-wise work keeps it from the bound.

`--sentence-transformers true` (it needs sentence-transformers, hence PyTorch, installed; CI has
neither) also times, for each `--model-dir` holding a SENTENCE_TRANSFORMERS export, that folder
loaded by `SentenceTransformer(folder, device="cpu")` against the Keras export on the same
articles: one call each per article, in turn (a load on a shared machine falls on both alike),
at the same batch size and on the same number of threads (PyTorch's set to TensorFlow's), after a
warm-up article. It prints both sentences/s, their ratio (Keras / sentence-transformers) and the
min and median cosine between the two embeddings of each sentence.

`--onnx true` exports each transformer `--model-dir` as ONNX, float32 and int8 (`model.export
--format onnx`, into `--output`'s `onnx/`), and times side by side, on the same articles, one
call each per article in turn, at `--batch-size` and on TensorFlow's thread count: the SavedModel
export, the two ONNX exports, and sentence-transformers' own `backend="onnx"` int8 export (its
`export_dynamic_quantized_onnx_model`, "avx2") of the model dir's SENTENCE_TRANSFORMERS folder
where sentence-transformers (with optimum) is installed; a row says why it is absent otherwise. It
prints each one's sentences/s, its ratio to the SavedModel's, and the min and median cosine of its
embeddings to the SavedModel's, and writes them to `onnx.md` and `.json` in `--output`.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from core.cli import UsageError, parse_config, run_cli
from eval.config import ScbBenchmarkConfig
from model.encoding.encoders import load_pytorch_first


def sentence_transformers_class() -> Callable[..., Any]:
    """`SentenceTransformer`, imported before TensorFlow loads (PyTorch after it can crash the
    process: model.encoding.encoders); where it is not installed, a usage error naming the flag."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise UsageError("--sentence-transformers true needs sentence-transformers (PyTorch) installed: "
                         "pip install sentence-transformers") from None
    return SentenceTransformer


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_config(ScbBenchmarkConfig, argv, "python -m eval.benchmark", __doc__.split("\n\n")[0])
    sentence_transformer = sentence_transformers_class() if args.sentence_transformers else None
    if args.onnx:
        load_pytorch_first()   # sentence-transformers' ONNX row, where installed: PyTorch before TensorFlow
    from eval import benchmark_job  # Beam and the SCB job load once the flags are parsed

    return benchmark_job.run(args, sentence_transformer)


if __name__ == "__main__":
    sys.exit(run_cli(main))
