"""Scores QS3M subtopic clustering against unsupervised baselines, as in the second seed's Table 1.

Each test-split article is a query; its passages are clustered by average-link agglomerative
clustering into k = the true number of clusters, on a distance that each method supplies:
embedding Euclidean (the reference), embedding cosine, TF-IDF cosine, LDA topics with the
Jensen-Shannon divergence, and 1 - predicted similarity for every trained QS3M / QSS /
QS3M-no-q model. ARI is macro-averaged over queries and each method is compared with the
reference by a paired t-test, on the flat (top-level section) and hierarchical (heading path)
benchmarks.

    python -m eval.qs3m --passages OUT|'GLOB' --model-dir MODEL_DIR --output EVAL_DIR [--max-queries N]

Writes `qs3m.json`, `qs3m.md` and `qs3m-<labeling>.png` (per-query ARI helps / hurts) to
`--output`, local or gs://.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from core.cli import parse_config, run_cli
from core.files import read_bytes
from core.folders import claim_folder, reading_if_run
from core.progress import progress_bar
from core.splits import SPLITS
from eval.config import Qs3mEvalConfig
from eval.evaluator import EvalResult, Figure, Inputs
from eval.report import REPORT_WRITES, markdown_table, pyplot, write_result
from model.encoding.encoder import SentenceEncoder
from model.encoding.encoders import EncoderSpec, load_encoders
from model.qs3m.data import QUERY_REPRESENTATIONS, embed_queries, read_queries
from model.qs3m.network import MODEL_LABELS, load_model, similarity_matrix
from model.qs3m.pairs import LABELINGS, Query

NAME = "qs3m"
REFERENCE = "embedding Euclidean"


# ---------------------------------------------------------------- clustering and scoring

def cluster(distances: np.ndarray, num_clusters: int) -> np.ndarray:
    """Average-link agglomerative clustering of a precomputed distance matrix into `num_clusters`."""
    from sklearn.cluster import AgglomerativeClustering

    distances = np.clip((distances + distances.T) / 2.0, 0.0, None)
    np.fill_diagonal(distances, 0.0)
    return AgglomerativeClustering(n_clusters=num_clusters, metric="precomputed",
                                   linkage="average").fit_predict(distances)


def jensen_shannon_divergences(topic_mixtures: np.ndarray) -> np.ndarray:
    """Pairwise JS divergence in bits (in [0, 1]) from scipy's `rel_entr`.

    Not `pdist(..., "jensenshannon") ** 2`: that distance takes a square root of a rounding-level
    negative for near-identical topic mixtures (common with LDA) and returns NaN.
    """
    from scipy.special import rel_entr

    first, second = topic_mixtures[:, None, :], topic_mixtures[None, :, :]
    middle = (first + second) / 2.0
    divergence = (rel_entr(first, middle) + rel_entr(second, middle)).sum(axis=-1) / (2.0 * np.log(2.0))
    return np.clip(divergence, 0.0, 1.0)


def compare_with_reference(scores: dict[str, list[float]], reference: str = REFERENCE) -> dict[str, dict[str, Any]]:
    """Macro-averaged ARI per method and a paired t-test of each method against the reference."""
    from scipy import stats

    base = np.asarray(scores[reference])
    summary = {}
    for method, method_scores in scores.items():
        values = np.asarray(method_scores)
        difference = values - base
        row = {"ari": float(values.mean()), "sem": float(stats.sem(values)) if len(values) > 1 else None,
               "delta": float(difference.mean()), "helps": int((difference > 1e-9).sum()),
               "hurts": int((difference < -1e-9).sum()), "ties": int((np.abs(difference) <= 1e-9).sum()),
               "t": None, "p": None}
        if method != reference and len(values) > 1 and np.any(np.abs(difference) > 1e-12):
            test = stats.ttest_rel(values, base)
            row["t"], row["p"] = float(test.statistic), float(test.pvalue)
        summary[method] = row
    return summary


# ---------------------------------------------------------------- distance methods

DistanceFn = Callable[[int], np.ndarray]  # query index -> passage distance matrix


def baseline_methods(queries: Sequence[Query], passage_vectors: Callable[[int], np.ndarray],
                     corpus: list[str], lda_topics: int, seed: int) -> dict[str, DistanceFn]:
    """The four unsupervised baselines, all on `model.net.text.tokenize` tokens.

    TF-IDF and LDA are fitted once on every passage of `corpus` (the articles of every split, or a
    seeded sample of `--corpus-queries` of them; no labels are used). Not
    `model.encoding.encoders.TfidfEncoder`: it fits its IDF on each call, i.e. on one query's few passages,
    which on the embedded excerpt scored a flat ARI of 0.054 against 0.122 with corpus IDF.
    """
    from sklearn.decomposition import LatentDirichletAllocation
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, CountVectorizer, TfidfVectorizer
    from sklearn.metrics.pairwise import cosine_distances, euclidean_distances

    from model.net.text import tokenize

    tokens = tokenize(corpus)
    tfidf = TfidfVectorizer(analyzer=lambda words: words, sublinear_tf=True).fit(tokens)
    counts = CountVectorizer(analyzer=lambda words: [w for w in words if w.isalnum() and w not in ENGLISH_STOP_WORDS])
    topics = LatentDirichletAllocation(n_components=lda_topics, random_state=seed).fit(counts.fit_transform(tokens))

    def query_tokens(i: int) -> list[list[str]]:
        return tokenize(list(queries[i].passages))

    return {
        REFERENCE: lambda i: euclidean_distances(passage_vectors(i)),
        "embedding cosine": lambda i: cosine_distances(passage_vectors(i)),
        "TF-IDF cosine": lambda i: cosine_distances(tfidf.transform(query_tokens(i))),
        "LDA + JS divergence":
            lambda i: jensen_shannon_divergences(topics.transform(counts.transform(query_tokens(i)))),
    }


def model_methods(model_dir: str, trained: dict[str, dict[str, Any]], embeddings) -> dict[str, DistanceFn]:
    """1 - predicted same-cluster probability for each model listed in the model dir's config.json."""
    methods: dict[str, DistanceFn] = {}
    for _name, spec in trained.items():
        model = load_model(f"{model_dir.rstrip('/')}/{spec['path']}")
        label = MODEL_LABELS[spec["kind"]] + (f" ({spec['query']})" if spec["query"] else "")
        query_table = embeddings.queries[spec["query"] or "P"]

        def distance(i: int, model=model, kind: str = spec["kind"], table=query_table) -> np.ndarray:
            return 1.0 - similarity_matrix(model, kind, embeddings.passages_of(i), table[i])

        methods[label] = distance
    return methods


# ---------------------------------------------------------------- report

def qs3m_markdown(results: dict[str, Any]) -> str:
    """Rows = methods; per benchmark the ARI, its difference to the reference and the t-test's p."""
    def ari_cell(row: dict[str, Any]) -> str:
        sem = f" ± {row['sem']:.3f}" if row["sem"] is not None else ""
        significant = row["p"] is not None and row["p"] < 0.05
        marker = ("▲" if row["delta"] > 0 else "▼") if significant else ""
        return f"{row['ari']:.3f}{sem}{marker}"

    benchmarks = [b for b in LABELINGS if results["benchmarks"][b]["methods"]]
    header = ["Method"]
    for benchmark in benchmarks:
        header += [f"{benchmark} ARI (n={results['benchmarks'][benchmark]['queries']})", f"{benchmark} Δ",
                   f"{benchmark} p"]
    rows = []
    for method in results["benchmarks"][benchmarks[0]]["methods"] if benchmarks else []:
        cells = [method]
        for benchmark in benchmarks:
            row = results["benchmarks"][benchmark]["methods"][method]
            cells += [ari_cell(row), f"{row['delta']:+.3f}", "—" if row["p"] is None else f"{row['p']:.3g}"]
        rows.append(cells)
    caption = (f"QS3M subtopic clustering, split `{results['split']}`, encoder `{results['encoder']}`; "
               "ARI macro-averaged over queries (± standard error); ▲ / ▼ = better / worse than "
               f"{REFERENCE} with p < 0.05 in a paired t-test (scipy ttest_rel), no correction for the "
               "number of methods.\n\n")
    return caption + markdown_table(header, rows)


def helps_hurts_figure(per_query: dict[str, list[float]], title: str):
    """PNG: for each method, per-query ARI minus the reference's, sorted; green helps, red hurts."""
    plt = pyplot()
    methods = [method for method in per_query if method != REFERENCE]
    columns = min(4, max(1, len(methods)))
    rows = -(-len(methods) // columns) or 1
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.6 * rows), squeeze=False, sharey=True)
    base = np.asarray(per_query[REFERENCE])
    for axis, method in zip(axes.ravel(), methods):
        difference = np.sort(np.asarray(per_query[method]) - base)
        axis.bar(range(len(difference)), difference,
                 color=["tab:green" if d > 1e-9 else "tab:red" if d < -1e-9 else "tab:gray" for d in difference])
        axis.axhline(0.0, color="black", linewidth=0.6)
        axis.set_title(f"{method}: {(difference > 1e-9).sum()} helps, {(difference < -1e-9).sum()} hurts", fontsize=8)
        axis.set_xticks([])
    for axis in axes.ravel()[len(methods):]:
        axis.set_visible(False)
    for axis in axes[:, 0]:
        axis.set_ylabel(f"ARI − {REFERENCE}", fontsize=7)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    return figure


# ---------------------------------------------------------------- evaluation

def run(config: Qs3mEvalConfig, inputs: Inputs) -> EvalResult:
    """eval.all's QS3M step: `score` with the config's encoder (`encoder_of`; none of eval.all's
    methods: the models score passages embedded by the encoder they were trained on)."""
    return score(config, encoder_of(config))


def encoder_of(config: Qs3mEvalConfig) -> SentenceEncoder:
    """`--encoder`, or the one the models were trained on (from-model)."""
    spec = config.encoder
    if spec == "from-model":
        spec = json.loads(read_bytes(f"{config.model_dir.rstrip('/')}/config.json"))["config"]["encoder"]
    (encoder,) = load_encoders([EncoderSpec.parse(spec)])
    return encoder


def evaluate(config: Qs3mEvalConfig, encoder: SentenceEncoder) -> dict[str, Any]:
    """`score`, its JSON, Markdown and PNGs written to `config.output`; the JSON result."""
    evaluation = score(config, encoder)
    write_result(evaluation, config.output)
    return evaluation.result


def score(config: Qs3mEvalConfig, encoder: SentenceEncoder) -> EvalResult:
    """Clusters every query of `config.split` with every method: the result, its table and a
    helps / hurts plot per benchmark."""
    from sklearn.metrics import adjusted_rand_score

    trained = json.loads(read_bytes(f"{config.model_dir.rstrip('/')}/config.json"))["models"]
    articles_per_split = dict.fromkeys(SPLITS, 0)
    corpus_queries, dead_letters = read_queries(config.passages, None, config.corpus_queries, config.seed,
                                                articles_per_split)
    queries, _ = read_queries(config.passages, (config.split,), config.max_queries, config.seed)
    if not queries:
        raise ValueError(f"--passages {config.passages!r} has no article in split {config.split!r}")
    embeddings = embed_queries(queries, encoder)
    corpus = [passage for query in corpus_queries for passage in query.passages]
    corpus_articles = len(corpus_queries)
    del corpus_queries
    methods = {**baseline_methods(queries, embeddings.passages_of, corpus, config.lda_topics, config.seed),
               **model_methods(config.model_dir, trained, embeddings)}
    distances: dict[str, list[np.ndarray]] = {method: [] for method in methods}
    for index in progress_bar(range(len(queries)), desc="qs3m distances", unit=" queries"):
        for method, distance in methods.items():
            distances[method].append(distance(index))
    results: dict[str, Any] = {
        "split": config.split, "encoder": getattr(encoder, "name", type(encoder).__name__),
        "query_representations": QUERY_REPRESENTATIONS,
        "articles_per_split": articles_per_split, "corpus_articles": corpus_articles,
        "dead_letters": dead_letters, "benchmarks": {},
    }
    figures = []
    for labeling in LABELINGS:
        usable = [i for i, query in enumerate(queries) if query.num_clusters(labeling) >= 2]
        per_query = {method: [adjusted_rand_score(queries[i].labels(labeling),
                                                  cluster(distances[method][i], queries[i].num_clusters(labeling)))
                              for i in usable] for method in methods}
        results["benchmarks"][labeling] = {
            "queries": len(usable), "skipped_single_cluster": len(queries) - len(usable),
            "article_ids": [queries[i].article_id for i in usable],
            "methods": compare_with_reference(per_query) if usable else {},
            "per_query_ari": per_query,
        }
        if usable:
            title = f"{labeling} benchmark, {len(usable)} {config.split} queries: per-query ARI vs {REFERENCE}"
            figures.append(Figure(f"qs3m-{labeling}.png", f"QS3M per-query ARI, {labeling}",
                                  helps_hurts_figure(per_query, title)))
    markdown = qs3m_markdown(results)
    return EvalResult(NAME, results, markdown, tuple(figures), markdown)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    config = parse_config(Qs3mEvalConfig, argv, "python -m eval.qs3m", __doc__.splitlines()[0])
    encoder = encoder_of(config)
    with reading_if_run(config.passages):
        claim_folder(config.output, "eval", REPORT_WRITES, "--output", None)
        results = evaluate(config, encoder)
    print(qs3m_markdown(results))
    print(f"QS3M results in {config.output} (qs3m.json, qs3m.md, qs3m-*.png)")
    return results


if __name__ == "__main__":
    sys.exit(run_cli(main))
