"""Result files of the evaluation jobs: JSON (machine-readable), Markdown tables shaped like the
paper's, and PNG plots, all written through Beam's `FileSystems` (local paths or gs://)."""
from __future__ import annotations

import io
import json

from core.files import write_bytes
from core.records import PAPER_DATASET
from eval.config import ALGORITHMS, METRICS, VARIANTS
from eval.evaluator import EvalResult
from eval.intervals import interval_text, value_text
from model.config import NetworkKind
from model.training.model_dir import History

# Ein Dor et al. 2018, Table 3 (triplet accuracy on their triplets-sen test set), as quoted by the
# sentence-transformers documentation of its wikipedia-sections models. Their numbers, on their
# data (Wikipedia 2017, GloVe 840B); shown beside ours for orientation only.
PAPER_TRIPLET_ACCURACY = {
    "mean-vectors": 0.65,
    "skip-thoughts-CS": 0.615,
    "skip-thoughts-SICK": 0.547,
    PAPER_DATASET: 0.74,
}
PAPER_LABEL = "paper (Ein Dor et al. 2018, Table 3; their data)"


def pyplot():
    """matplotlib's pyplot, drawing into files, never a window; loaded by the first figure, not
    by the commands' imports (their --help loads no heavy library)."""
    import matplotlib

    matplotlib.use("Agg")   # pyplot picks its backend at the first figure, so before or after its import
    import matplotlib.pyplot as plt

    return plt


def read_jsonl(pattern: str) -> list[dict]:
    """All JSON lines of the files matching `pattern` (none match: an empty list)."""
    from apache_beam.io.filesystems import FileSystems

    rows = []
    for metadata in sorted(FileSystems.match([pattern])[0].metadata_list, key=lambda m: m.path):
        with FileSystems.open(metadata.path) as handle:
            rows += [json.loads(line) for line in handle.read().decode("utf-8").splitlines() if line.strip()]
    return rows


# What the eval commands write into their --output (one report folder may hold all of them): a
# folder holding anything else, a model dir or a run, is refused (`core.folders.claim_folder`).
REPORT_WRITES = ("report.", "summary.", "scb", "triplets", "sick", "learning_curves", "qs3m", "embeddings", "onnx",
                 "beam-temp-")


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def write_json(path: str, value) -> None:
    write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def write_figure(path: str, figure) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(figure)
    write_bytes(path, buffer.getvalue())


def write_result(evaluation: EvalResult, output: str) -> None:
    """An evaluation's files in `output`: `<name>.json`, `<name>.md` and its figures' PNGs."""
    from apache_beam.io.filesystems import FileSystems

    write_json(FileSystems.join(output, f"{evaluation.name}.json"), evaluation.result)
    write_text(FileSystems.join(output, f"{evaluation.name}.md"), evaluation.markdown)
    for figure in evaluation.figures:
        write_figure(FileSystems.join(output, figure.file), figure.figure)


def markdown_table(header: list[str], rows: list[list]) -> str:
    def cell(value):
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _methods_in_order(result: dict, entries: list[dict]) -> list[str]:
    """The methods of `entries` in the job's order (its specs'), not the order its workers finished in."""
    present = {entry["method"] for entry in entries}
    return [method for method in result["methods"] if method in present]


def scb_markdown(result: dict) -> str:
    """One table per variant: methods as rows, MI/AMI/RI/ARI under each algorithm (the paper's Table 4)."""
    parts = [f"## Sentence clustering benchmark ({result['articles']} articles, "
             f"{result['dead_letters']} malformed records set aside)\n"]
    for variant in VARIANTS:
        entries = [entry for entry in result["summary"] if entry["variant"] == variant]
        if not entries:
            continue
        by_key = {(entry["method"], entry["algorithm"]): entry for entry in entries}
        header = ["method", "articles"] + [f"{algorithm} {metric}" for algorithm in ALGORITHMS for metric in METRICS]
        rows = []
        for method in _methods_in_order(result, entries):
            scored = [by_key[(method, algorithm)] for algorithm in ALGORITHMS if (method, algorithm) in by_key]
            rows.append([method, scored[0]["articles"]] + [
                by_key[(method, algorithm)][metric] if (method, algorithm) in by_key else "-"
                for algorithm in ALGORITHMS for metric in METRICS])
        label = "all sentences" if variant == "all" else "paragraph openers only"
        parts.append(f"\n### {label} (macro-average over articles; MI in nats)\n\n" + markdown_table(header, rows))
        ari_rows = [[method] + [value_text(by_key[(method, algorithm)]["ARI_interval"]) if (method, algorithm) in by_key
                                else "-" for algorithm in ALGORITHMS]
                    for method in _methods_in_order(result, entries)]
        articles = max(entry["articles"] for entry in entries)
        parts.append(f"\nmean ARI with its 95 % bootstrap interval over n = {articles} articles:\n\n"
                     + markdown_table(["method", *ALGORITHMS], ari_rows))
        parts.append(differences_markdown([row for row in result.get("differences", []) if row["variant"] == variant],
                                          "ARI", "articles", ALGORITHMS, column_key="algorithm"))
    parts.append(scb_profile_markdown(result))
    return "".join(parts)


def scb_profile_markdown(result: dict) -> str:
    """Where the SCB job's time went (`eval.scb_job.job_profile`): each method's encoding and each
    clustering step over all methods, in seconds summed over the workers, and per article this
    job clustered (a resumed job's kept articles cost it nothing)."""
    profile = result.get("profile")
    if not profile:
        return ""
    articles = max(1, max(spent["articles"] for spent in profile["clustering"].values()))   # clustered by this job
    rows = [[f"encode: {method}", spent["seconds"], spent["load_seconds"], 1e3 * spent["seconds"] / articles]
            for method, spent in profile["encoding"].items()]
    rows += [[f"cluster: {step} (all methods)", spent["seconds"], "-", 1e3 * spent["seconds"] / articles]
             for step, spent in profile["clustering"].items()]
    total = sum(row[1] for row in rows)
    rows.append(["total", total, sum(spent["load_seconds"] for spent in profile["encoding"].values()),
                 1e3 * total / articles])
    return (f"\n### Where the job's time went (seconds summed over its workers, {articles} articles)\n\n"
            + markdown_table(["step", "seconds", "model load s", "ms per article"], rows))


def scb_ari_summary(result: dict) -> str:
    """The SCB's headline only: mean ARI per method and algorithm with its 95 % interval, all
    sentences (the whole tables are `scb_markdown`'s)."""
    entries = [entry for entry in result["summary"] if entry["variant"] == "all"]
    by_key = {(entry["method"], entry["algorithm"]): entry for entry in entries}
    rows = [[method] + [value_text(by_key[(method, algorithm)]["ARI_interval"]) if (method, algorithm) in by_key
                        else "-" for algorithm in ALGORITHMS] for method in _methods_in_order(result, entries)]
    return (f"## SCB: mean ARI, all sentences, 95 % bootstrap interval over n = {result['articles']} articles\n\n"
            + markdown_table(["method", *ALGORITHMS], rows))


def scb_ari_figure(result: dict):
    """Box plots of per-article ARI per method; one panel per variant x algorithm."""
    from matplotlib.lines import Line2D

    plt = pyplot()
    variants = [v for v in VARIANTS if any(row["variant"] == v for row in result["rows"])] or ["all"]
    figure, axes = plt.subplots(len(variants), len(ALGORITHMS), figsize=(4.2 * len(ALGORITHMS), 4.2 * len(variants)),
                                squeeze=False, sharey=True, constrained_layout=True)
    methods = _methods_in_order(result, result["rows"])
    for row_index, variant in enumerate(variants):
        for column, algorithm in enumerate(ALGORITHMS):
            axis = axes[row_index][column]
            values = [[row["ARI"] for row in result["rows"]
                       if row["variant"] == variant and row["algorithm"] == algorithm and row["method"] == method]
                      for method in methods]
            if any(values):
                axis.boxplot(values, tick_labels=methods, showmeans=True)
            axis.set_title(f"{algorithm}, {'all sentences' if variant == 'all' else 'paragraph openers'}")
            axis.axhline(0.0, color="grey", linewidth=0.5)
            axis.tick_params(axis="x", rotation=30)
            plt.setp(axis.get_xticklabels(), horizontalalignment="right")
        axes[row_index][0].set_ylabel("per-article ARI")
    legend = [Line2D([], [], color="tab:orange", label="median"),
              Line2D([], [], color="tab:green", marker="^", linestyle="none", label="mean"),
              Line2D([], [], color="black", marker="o", markerfacecolor="none", linestyle="none",
                     label="outlier (beyond 1.5 IQR)")]
    axes[0][-1].legend(handles=legend, fontsize=8, loc="upper right")
    figure.suptitle(f"SCB: adjusted Rand index per article ({len({row['article_id'] for row in result['rows']})} "
                    "articles; box = quartiles, whiskers = 1.5 IQR)")
    return figure



def triplets_table(result: dict) -> str:
    """Accuracy with cosine and with L1 distance per method, the paper's Table 3 beside it."""
    header = ["method", "accuracy (cosine) [95 % interval]", "accuracy (L1) [95 % interval]", PAPER_LABEL]
    rows = [[entry["method"], *(value_text(entry[f"interval_{distance}"]) for distance in ("cosine", "l1")),
             PAPER_TRIPLET_ACCURACY.get(entry["method"], "-")] for entry in result["methods"]]
    return (f"## Triplet accuracy ({result['dataset']}, split {result['split']}, "
            f"n = {result['triplets']} triplets; intervals: Wilson)\n\n" + markdown_table(header, rows))


def triplets_markdown(result: dict) -> str:
    """`triplets_table` and each method's difference from the references, paired."""
    return triplets_table(result) + differences_markdown(result.get("differences", []), "accuracy", "triplets",
                                                         ("cosine", "l1"))


def differences_markdown(differences: list[dict], metric: str, items: str, columns: tuple[str, ...],
                         column_key: str = "distance") -> str:
    """Each method's difference from each reference method with its 95 % paired-bootstrap interval
    (`eval.intervals`), one column per distance or algorithm; * marks an interval that excludes 0."""
    if not differences:
        return ""
    by_key = {(row["reference"], row["method"], row[column_key]): row for row in differences}
    parts = []
    for reference in dict.fromkeys(row["reference"] for row in differences):
        methods = list(dict.fromkeys(row["method"] for row in differences if row["reference"] == reference))
        n = next(row["n"] for row in differences if row["reference"] == reference)
        rows = [[method] + [interval_text(by_key[(reference, method, column)]) if (reference, method, column)
                            in by_key else "-" for column in columns] for method in methods]
        parts.append(f"\n{metric} minus {reference}'s, 95 % paired bootstrap over n = {n} {items} "
                     f"(* the interval excludes 0):\n\n" + markdown_table(["method", *columns], rows))
    return "".join(parts)


def triplets_figure(result: dict):
    methods = [entry["method"] for entry in result["methods"]]
    figure, axis = pyplot().subplots(figsize=(1.8 * len(methods) + 2, 3.6))
    positions = range(len(methods))
    width = 0.38
    for offset, distance, label in ((-width / 2, "cosine", "cosine"), (width / 2, "l1", "L1")):
        values = [e[f"accuracy_{distance}"] for e in result["methods"]]
        errors = [[value - e[f"interval_{distance}"]["low"] for value, e in zip(values, result["methods"])],
                  [e[f"interval_{distance}"]["high"] - value for value, e in zip(values, result["methods"])]]
        axis.bar([p + offset for p in positions], values, width, yerr=errors, capsize=3, label=label)
    axis.axhline(0.5, color="grey", linestyle="--", linewidth=0.8, label="chance")
    axis.set_xticks(list(positions), methods, rotation=20)
    axis.set_ylim(0, 1)
    axis.set_ylabel("accuracy")
    axis.set_title(f"Triplet accuracy, {result['dataset']} {result['split']} ({result['triplets']} triplets; "
                   "bars: 95 % Wilson intervals)")
    axis.legend()
    return figure



def validation_n(history: History) -> int:
    """The validation triplets each point of a model's learning curve was scored on: its seeded
    sample, or the whole split (`evaluation_triplets` "all": the split's records)."""
    sample, whole = history.evaluation_triplets, history.record_counts["validation"]["expected"]
    return whole if sample == "all" else min(int(sample), whole)


def learning_curves_figure(histories: dict[str, History]):
    """Validation triplet accuracy of each trained model against training triplets seen and
    against process CPU minutes (the `learning_curve` of each model dir's history), each with its
    untrained network as a dotted line of the same colour (for a fine-tuned checkpoint: the
    checkpoint off the shelf). Each model is validated on its own seeded sample and distance."""
    figure, axes = pyplot().subplots(1, 2, figsize=(12, 4.4), sharey=True)
    for index, (name, history) in enumerate(histories.items()):
        color = f"C{index}"
        points = history.learning_curve
        accuracy = [point["val_triplet_accuracy"] for point in points]
        label = f"{name} ({history.distance}, n = {validation_n(history):,} validation triplets)"
        for axis, key, scale in ((axes[0], "triplets_seen", 1000), (axes[1], "cpu_seconds", 60)):
            axis.plot([point[key] / scale for point in points], accuracy, "o-", color=color, markersize=3, label=label)
            axis.axhline(history.untrained_val_triplet_accuracy, color=color, ls=":",
                         label=f"{name} untrained" + (" (off the shelf)" if NetworkKind(
                             history.config.get("encoder", NetworkKind.BILSTM)).pretrained else ""))
    axes[0].set_xlabel("training triplets seen (thousands)")
    axes[1].set_xlabel("process CPU minutes")
    axes[0].set_ylabel("validation triplet accuracy")
    for axis in axes:
        axis.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower right")
    figure.suptitle("Learning curves of the trained encoders")
    return figure


def sick_markdown(result: dict) -> str:
    header = ["method", "Pearson r [95 % interval]", "Spearman rho", "MSE", "C (chosen on TRIAL)"]
    rows = [[e["method"], value_text({"mean": e["pearson"], "low": e["pearson_low"], "high": e["pearson_high"]}),
             e["spearman"], e["mse"], e["C"]] for e in result["methods"]]
    counts = ", ".join(f"{split} {count}" for split, count in result["pairs"].items())
    return (f"## SICK relatedness (pairs: {counts}; metrics on the n = {result['pairs']['TEST']} TEST pairs, "
            "interval: Fisher z)\n\n" + markdown_table(header, rows))


def sick_figure(result: dict):
    methods = [entry["method"] for entry in result["methods"]]
    figure, axis = pyplot().subplots(figsize=(1.6 * len(methods) + 2, 3.4))
    values = [entry["pearson"] for entry in result["methods"]]
    errors = [[value - entry["pearson_low"] for value, entry in zip(values, result["methods"])],
              [entry["pearson_high"] - value for value, entry in zip(values, result["methods"])]]
    axis.bar(methods, values, yerr=errors, capsize=3)
    axis.set_ylim(0, 1)
    axis.set_ylabel("Pearson r on TEST")
    axis.set_title(f"SICK relatedness (n = {result['pairs']['TEST']} TEST pairs; bars: 95 % intervals)")
    axis.tick_params(axis="x", rotation=20)
    return figure

