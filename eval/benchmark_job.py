"""The measurements of `python -m eval.benchmark` (its docstring says what each one times)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems

from core.cli import UsageError
from core.files import is_remote
from eval import scb_job
from eval.clustering import average_link_labels, cosine_geometry, kmeans_labels
from eval.config import VARIANTS, ScbBenchmarkConfig, ScbConfig
from eval.evaluator import Inputs
from eval.iclust import IclustConfig, iclust_with_updates
from eval.report import markdown_table, write_result, write_text
from eval.scb_job import check_scb_input, read_articles, variant_subset
from model.encoding.encoder import OnnxEncoder, SavedModelEncoder
from model.encoding.encoders import EncoderSpec, Methods, SpecKind, load_encoder
from model.encoding.trained_net import recorded_config
from model.export import is_off_the_shelf
from model.export import main as export
from model.similarity import Similarity
from model.training.model_dir import SENTENCE_TRANSFORMERS


def matmul_peak_gflops(size: int = 1024, repeats: int = 5) -> float:
    """GFLOP/s of a float64 numpy matmul of two [size, size] matrices on one BLAS thread (the best
    of `repeats`): the bound Iclust's products are measured against."""
    from threadpoolctl import threadpool_limits

    left, right = np.random.default_rng(0).random((2, size, size))
    best = np.inf
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(repeats):
            start = time.perf_counter()
            left @ right
            best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best / 1e9


def clustering_seconds(record, embeddings, seed: int = 0) -> defaultdict[str, float]:
    """Seconds of each algorithm (kmeans, iclust, average-link) on one article's embeddings,
    clustered as the SCB job does (each variant with two or more sections), and the FLOPs of
    Iclust's products (iclust_flops)."""
    spent: defaultdict[str, float] = defaultdict(float)
    labels = np.asarray(record.labels)
    for variant in VARIANTS:
        subset = variant_subset(record, variant)
        n_clusters = len(np.unique(labels[subset]))
        if n_clusters < 2:
            continue
        unit, similarity = cosine_geometry(embeddings[subset])
        start = time.perf_counter()
        kmeans_labels(unit, n_clusters, seed)
        spent["kmeans"] += time.perf_counter() - start
        start = time.perf_counter()
        _, updates = iclust_with_updates([similarity], n_clusters, IclustConfig(seed=seed))
        spent["iclust"] += time.perf_counter() - start
        spent["iclust_flops"] += 2.0 * len(subset) ** 2 * n_clusters * float(updates.sum())
        start = time.perf_counter()
        average_link_labels(similarity, n_clusters)
        spent["average-link"] += time.perf_counter() - start
    return spent


def encoding_speed(spec: EncoderSpec, articles: list) -> dict:
    """Sentences/s of `encode` over the articles' sentences, one call per article as the job makes
    (after one warm-up article: the first call loads and traces the graph)."""
    encoder = load_encoder(spec)
    encoder.encode(list(articles[0].sentences))
    start = time.perf_counter()
    for article in articles:
        encoder.encode(list(article.sentences))
    sentences = sum(len(article.sentences) for article in articles)
    seconds = time.perf_counter() - start
    return {"method": encoder.name, "articles": len(articles), "sentences": sentences, "encode_seconds": seconds,
            "encode_sentences_per_s": sentences / seconds}


def sentence_transformers_folder(spec: EncoderSpec) -> str | None:
    """The local SENTENCE_TRANSFORMERS export inside a saved method's model dir (`model.train`
    writes one for a transformer); none for any other method."""
    if spec.kind is not SpecKind.SAVED:
        return None
    folder = os.path.join(spec.paths[0], SENTENCE_TRANSFORMERS)
    return folder if os.path.exists(os.path.join(folder, "modules.json")) else None


def tensorflow_threads() -> int:
    """The threads TensorFlow runs one op on: its intra-op setting, or where that is 0 (the
    default) the CPUs this process may run on, which TensorFlow then takes."""
    import tensorflow as tf

    return tf.config.threading.get_intra_op_parallelism_threads() or len(os.sched_getaffinity(0))


def speed_ratio(method: str, sentences: int, keras_seconds: float, sentence_transformers_seconds: float,
                cosines: np.ndarray, threads: dict[str, int], max_seq_length: dict[str, int | None]) -> dict:
    """The comparison's row: each side's sentences/s over the same sentences, the Keras export's
    as a multiple of sentence-transformers', and how closely their embeddings agree."""
    keras_rate, theirs_rate = sentences / keras_seconds, sentences / sentence_transformers_seconds
    return {"method": method, "sentences": sentences, "threads": threads, "max_seq_length": max_seq_length,
            "keras_seconds": keras_seconds, "sentence_transformers_seconds": sentence_transformers_seconds,
            "keras_sentences_per_s": keras_rate, "sentence_transformers_sentences_per_s": theirs_rate,
            "keras_over_sentence_transformers": keras_rate / theirs_rate,
            "cosine_min": float(cosines.min()), "cosine_median": float(np.median(cosines))}


def keras_vs_sentence_transformers(spec: EncoderSpec, folder: str, articles: list,
                                   sentence_transformer: Callable[..., Any]) -> dict:
    """The Keras export and sentence-transformers (`folder`: the same weights) timed on the same
    articles, one call each per article in turn, at the Keras encoder's batch size, PyTorch on
    TensorFlow's thread count; after one warm-up article each (graph tracing, lazy loading)."""
    import torch

    keras = SavedModelEncoder(spec.paths[0], name=spec.name)
    torch.set_num_threads(tensorflow_threads())
    theirs = sentence_transformer(folder, device="cpu")

    def encode_theirs(sentences: list[str]) -> np.ndarray:
        return theirs.encode(sentences, batch_size=keras.batch_size, show_progress_bar=False)

    keras.encode(list(articles[0].sentences))
    encode_theirs(list(articles[0].sentences))
    keras_seconds = theirs_seconds = 0.0
    cosines = []
    for article in articles:
        sentences = list(article.sentences)
        start = time.perf_counter()
        ours = keras.encode(sentences)
        keras_seconds += time.perf_counter() - start
        start = time.perf_counter()
        their_embeddings = encode_theirs(sentences)
        theirs_seconds += time.perf_counter() - start
        cosines.append(Similarity.COSINE.pairwise(ours, their_embeddings))
    return speed_ratio(spec.name, sum(len(article.sentences) for article in articles), keras_seconds, theirs_seconds,
                       np.concatenate(cosines), {"tensorflow": tensorflow_threads(), "torch": torch.get_num_threads()},
                       {"keras": keras.max_seq_length, "sentence_transformers": theirs.max_seq_length})


def sentence_transformers_markdown(rows: list[dict]) -> str:
    """The comparison's table: sentences/s of both, the ratio, the threads and the agreement."""
    return "## The Keras export against sentence-transformers (same weights, sentences, threads)\n\n" + markdown_table(
        ["method", "sentences", "threads (TF / torch)", "Keras sentences/s", "sentence-transformers sentences/s",
         "Keras / sentence-transformers", "cosine min", "cosine median"],
        [[r["method"], r["sentences"], f"{r['threads']['tensorflow']} / {r['threads']['torch']}",
          r["keras_sentences_per_s"], r["sentence_transformers_sentences_per_s"],
          r["keras_over_sentence_transformers"], f"{r['cosine_min']:.6f}", f"{r['cosine_median']:.6f}"]
         for r in rows])


def is_transformer(spec: EncoderSpec) -> bool:
    """Whether a saved method's model dir holds a transformer (what exports to ONNX)."""
    path = spec.paths[0]
    return is_off_the_shelf(path) or recorded_config(path)[1].network.kind.exports_sentence_transformers


def onnx_exports(spec: EncoderSpec, folder: str) -> dict[str, str]:
    """The model dir's ONNX exports, float32 and int8, written by `model.export` into `folder`."""
    folders = {}
    for quantize in ("float32", "int8"):
        path = os.path.join(folder, f"{spec.name}-{quantize}")
        export(["--model-dir", spec.paths[0], "--format", "onnx", "--output", path, "--overwrite", "true",
                *(["--quantize", quantize] if quantize != "float32" else [])])
        folders[quantize] = path
    return folders


def sentence_transformers_onnx_int8(folder: str | None, work: str, threads: int,
                                    batch_size: int) -> Callable[[list[str]], np.ndarray] | str:
    """sentence-transformers' ONNX int8 export of `folder` (a copy in `work`: "avx2", its
    `export_dynamic_quantized_onnx_model`) as an encode function, or why there is none."""
    if folder is None:
        return f"absent: the model dir holds no {SENTENCE_TRANSFORMERS}/ export"
    try:
        import onnxruntime
        from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model
    except ImportError as error:
        return f"absent: sentence-transformers (with optimum) is not installed here ({error.name})"
    copy = os.path.join(work, SENTENCE_TRANSFORMERS)
    shutil.copytree(folder, copy, dirs_exist_ok=True)
    export_dynamic_quantized_onnx_model(SentenceTransformer(copy, device="cpu", backend="onnx"), "avx2", copy)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    model = SentenceTransformer(copy, device="cpu", backend="onnx",
                                model_kwargs={"file_name": "model_qint8_avx2.onnx", "session_options": options})
    return lambda sentences: model.encode(sentences, batch_size=batch_size, show_progress_bar=False)


def side_by_side(encoders: dict[str, Callable[[list[str]], np.ndarray]], articles: list) -> list[dict]:
    """Each encoder on the same articles, one call each per article in turn (a load on a shared
    machine falls on all alike), after a warm-up article each: seconds, and the cosines of each
    sentence's embedding to the first encoder's."""
    for encode in encoders.values():
        encode(list(articles[0].sentences))
    seconds = dict.fromkeys(encoders, 0.0)
    cosines: dict[str, list[np.ndarray]] = {name: [] for name in encoders}
    for article in articles:
        sentences, embeddings = list(article.sentences), {}
        for name, encode in encoders.items():
            start = time.perf_counter()
            embeddings[name] = np.asarray(encode(sentences), np.float32)
            seconds[name] += time.perf_counter() - start
        reference = embeddings[next(iter(encoders))]
        for name, rows in embeddings.items():
            cosines[name].append(Similarity.COSINE.pairwise(rows, reference))
    count = sum(len(article.sentences) for article in articles)
    return [{"encoder": name, "sentences": count, "seconds": seconds[name], "sentences_per_s": count / seconds[name],
             "cosine_min": float(np.concatenate(cosines[name]).min()),
             "cosine_median": float(np.median(np.concatenate(cosines[name])))} for name in encoders]


def onnx_comparison(spec: EncoderSpec, articles: list, output: str, batch_size: int) -> list[dict]:
    """The SavedModel export, its ONNX exports and sentence-transformers' ONNX int8, side by side."""
    work = tempfile.mkdtemp(prefix="eval-benchmark-onnx-") if is_remote(output) else os.path.join(output, "onnx")
    folders = onnx_exports(spec, work)
    threads = tensorflow_threads()
    saved = SavedModelEncoder(spec.paths[0], name=spec.name, batch_size=batch_size)
    encoders: dict[str, Callable[[list[str]], np.ndarray]] = {"SavedModel": saved.encode}
    for quantize, folder in folders.items():
        encoders[f"ONNX {quantize}"] = OnnxEncoder(folder, batch_size=batch_size, threads=threads).encode
    theirs = sentence_transformers_onnx_int8(sentence_transformers_folder(spec), work, threads, batch_size)
    if callable(theirs):
        encoders["sentence-transformers ONNX int8"] = theirs
    rows = side_by_side(encoders, articles)
    for row in rows:
        row.update(method=spec.name, threads=threads, batch_size=batch_size,
                   x_saved_model=row["sentences_per_s"] / rows[0]["sentences_per_s"])
    if not callable(theirs):
        rows.append({"method": spec.name, "encoder": "sentence-transformers ONNX int8", "absent": theirs})
    return rows


def onnx_markdown(rows: list[dict]) -> str:
    """The ONNX comparison's table: each encoder's sentences/s, its ratio and its agreement."""
    def cells(r: dict) -> list:
        if "absent" in r:
            return [r["method"], r["encoder"], r["absent"], "", "", "", "", ""]
        return [r["method"], r["encoder"], r["sentences"], f"{r['threads']} / {r['batch_size']}", r["sentences_per_s"],
                r["x_saved_model"], f"{r['cosine_min']:.6f}", f"{r['cosine_median']:.6f}"]

    title = "## The SavedModel export against its ONNX exports (same sentences, threads, batch size)\n\n"
    return title + markdown_table(
        ["method", "encoder", "sentences", "threads / batch", "sentences/s", "x the SavedModel",
         "cosine min to the SavedModel", "cosine median"], [cells(r) for r in rows])


def benchmark_method(spec: EncoderSpec, data: str, articles: list, output: str, peak_gflops: float,
                     max_articles: int | None = None) -> dict:
    encoder = load_encoder(spec)
    encode_seconds = 0.0
    spent: defaultdict[str, float] = defaultdict(float)
    for article in articles:
        start = time.perf_counter()
        embeddings = encoder.encode(list(article.sentences))
        encode_seconds += time.perf_counter() - start
        for algorithm, seconds in clustering_seconds(article, embeddings).items():
            spent[algorithm] += seconds
    start = time.perf_counter()
    config = ScbConfig(data=data, output=FileSystems.join(output, encoder.name),
                       methods=Methods(encoders=(str(spec),)), max_articles=max_articles)
    evaluation = scb_job.run(config, Inputs(beam_args=["--runner", "DirectRunner"]))
    write_result(evaluation, config.output)
    result = evaluation.result
    job_seconds = time.perf_counter() - start
    sentences = result["counters"]["scb_eval_sentences_scored"]
    iclust_gflops = spent["iclust_flops"] / spent["iclust"] / 1e9 if spent["iclust"] else 0.0
    return {"method": encoder.name, "articles": result["articles"], "sentences": sentences,
            "encode_seconds": encode_seconds, "encode_sentences_per_s": sentences / encode_seconds,
            "job_seconds": job_seconds, "job_sentences_per_s": sentences / job_seconds,
            "encode_share_of_job": encode_seconds / job_seconds,
            **{f"{algorithm.replace('-', '_')}_ms_per_article": 1e3 * spent[algorithm] / len(articles)
               for algorithm in ("kmeans", "iclust", "average-link")},
            "iclust_gflops": iclust_gflops, "matmul_peak_gflops": peak_gflops,
            "iclust_share_of_peak": iclust_gflops / peak_gflops}


def clustering_markdown(rows: list[dict]) -> str:
    """The clustering table of the benchmark's rows, under the matmul peak they are measured against."""
    return (f"## Clustering time per article (float64 matmul peak, one BLAS thread: "
            f"{rows[0]['matmul_peak_gflops']:.1f} GFLOP/s)\n\n" + markdown_table(
                ["method", "k-means ms/article", "Iclust ms/article", "average-link ms/article",
                 "Iclust products GFLOP/s", "Iclust share of peak"],
                [[r["method"], r["kmeans_ms_per_article"], r["iclust_ms_per_article"],
                  r["average_link_ms_per_article"], r["iclust_gflops"], r["iclust_share_of_peak"]] for r in rows]))


def run(args: ScbBenchmarkConfig, sentence_transformer: Callable[..., Any] | None) -> list[dict]:
    """Times every method as `args` say (`sentence_transformer`: sentence-transformers' class, for
    `--sentence-transformers true`), prints the tables and writes them into `args.output`; the rows."""
    check_scb_input(args.data)
    specs = args.methods.specs()
    folders = {spec.name: folder for spec in specs if (folder := sentence_transformers_folder(spec))}
    if sentence_transformer is not None and not folders:
        raise UsageError(f"--sentence-transformers true: no --model-dir holds a {SENTENCE_TRANSFORMERS}/ export "
                         "(python -m model.export writes one)")
    output = args.output or tempfile.mkdtemp(prefix="eval-benchmark-")
    articles = read_articles(args.data, args.max_articles)
    if args.encode_only:
        rows = [encoding_speed(spec, articles) for spec in specs]
        table = markdown_table(
            ["method", "articles", "sentences", "encode s", "encode sentences/s", "x the first method"],
            [[r["method"], r["articles"], r["sentences"], r["encode_seconds"], r["encode_sentences_per_s"],
              r["encode_sentences_per_s"] / rows[0]["encode_sentences_per_s"]] for r in rows])
        write_text(FileSystems.join(output, "encoding.md"), "## Encoding speed\n\n" + table)
        print(table)
    else:
        peak_gflops = matmul_peak_gflops()
        rows = [benchmark_method(spec, args.data, articles, output, peak_gflops, args.max_articles)
                for spec in specs]
        table = markdown_table(
            ["method", "articles", "sentences", "encode s", "encode sentences/s", "job s", "job sentences/s",
             "encode share of job"],
            [[r["method"], r["articles"], r["sentences"], r["encode_seconds"], r["encode_sentences_per_s"],
              r["job_seconds"], r["job_sentences_per_s"], r["encode_share_of_job"]] for r in rows])
        clustering = clustering_markdown(rows)
        write_text(FileSystems.join(output, "benchmark.md"),
                   "## SCB scoring throughput (DirectRunner)\n\n" + table + "\n" + clustering)
        write_text(FileSystems.join(output, "benchmark.json"), json.dumps(rows, indent=2) + "\n")
        print(table)
        print(clustering)
        print(f"benchmark.md, benchmark.json and the jobs' outputs in {output}")
    if args.onnx:
        onnx_rows = [row for spec in specs if spec.kind is SpecKind.SAVED and is_transformer(spec)
                     for row in onnx_comparison(spec, articles, output, args.batch_size)]
        text = onnx_markdown(onnx_rows)
        write_text(FileSystems.join(output, "onnx.md"), text)
        write_text(FileSystems.join(output, "onnx.json"), json.dumps(onnx_rows, indent=2) + "\n")
        print(text)
    if sentence_transformer is not None:
        compared = [keras_vs_sentence_transformers(spec, folders[spec.name], articles, sentence_transformer)
                    for spec in specs if spec.name in folders]
        text = sentence_transformers_markdown(compared)
        write_text(FileSystems.join(output, "sentence-transformers.md"), text)
        write_text(FileSystems.join(output, "sentence-transformers.json"), json.dumps(compared, indent=2) + "\n")
        print(text)
    return rows
