"""Writes the headline results table of an `eval.all` report into a Markdown file's marked block.

    python -m eval.readme --report EVAL --readme README.md

The README's results table is this command's output, never typed by hand: it replaces what lies
between `<!-- results:begin -->` and `<!-- results:end -->` with one row per method (triplet
accuracy by cosine and by L1, SCB mean ARI per algorithm on all sentences, each with its 95 %
interval, and SICK's Pearson r where it ran) and a line naming the report, its n and wall time.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from core.cli import UsageError, flag, parse_config, run_cli
from eval.config import ALGORITHMS
from eval.intervals import value_text
from eval.report import markdown_table

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


@dataclass(frozen=True)
class ReadmeConfig:
    """Flags of `python -m eval.readme`."""

    report: str = flag(help="an eval.all --output folder (its report.json)")
    readme: str = flag("README.md", help="the Markdown file whose marked block is replaced")


def headline_markdown(report: dict, source: str) -> str:
    """One row per method: triplet accuracy (cosine, L1), SCB mean ARI (all sentences) per algorithm, SICK r."""
    triplets = {entry["method"]: entry for entry in report["triplets"]["methods"]}
    scb = {(entry["method"], entry["algorithm"]): entry for entry in report["scb"] if entry["variant"] == "all"}
    sick = {entry["method"]: entry for entry in (report.get("sick") or {}).get("methods", [])}
    header = ["method", "triplets (cosine)", "triplets (L1)", *(f"SCB ARI {a}" for a in ALGORITHMS)]
    header += ["SICK r"] if sick else []
    rows = []
    for method in triplets:
        row = [method, *(value_text(triplets[method][f"interval_{d}"]) for d in ("cosine", "l1"))]
        row += [value_text(scb[(method, a)]["ARI_interval"]) if (method, a) in scb else "-" for a in ALGORITHMS]
        if sick:
            entry = sick.get(method)
            row.append(value_text({"mean": entry["pearson"], "low": entry["pearson_low"],
                                   "high": entry["pearson_high"]}) if entry else "-")
        rows.append(row)
    articles = max((entry["articles"] for entry in scb.values()), default=0)
    seconds = report.get("seconds", {})
    runs = report.get("runs", [])
    resumed = (f"; {sum(run['seconds'] for run in runs) / 60:.1f} min over the {len(runs)} runs whose kept "
               "results it reuses, killed ones included" if len(runs) > 1 else "")
    return (markdown_table(header, rows)
            + f"\nn = {report['triplets']['triplets']} test triplets and {articles} SCB articles, "
              f"95 % intervals in brackets; from `{source}/report.md` (wall time "
              f"{sum(seconds.values()) / 60:.1f} min: "
              + ", ".join(f"{step} {value / 60:.1f}" for step, value in seconds.items()) + resumed + ").\n")


def replace_block(text: str, block: str, path: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise UsageError(f"{path}: needs one {BEGIN} ... {END} block")
    return text[:text.index(BEGIN) + len(BEGIN)] + "\n" + block + text[text.index(END):]


def main(argv: list[str] | None = None) -> str:
    config = parse_config(ReadmeConfig, argv, "python -m eval.readme", __doc__.split("\n\n")[0])
    report_path = Path(config.report) / "report.json"
    if not report_path.is_file():
        raise UsageError(f"--report {config.report}: no report.json (python -m eval.all writes it)")
    readme = Path(config.readme)
    if not readme.is_file():
        raise UsageError(f"--readme {config.readme}: no such file")
    block = headline_markdown(json.loads(report_path.read_text()), config.report.rstrip("/"))
    readme.write_text(replace_block(readme.read_text(), block, config.readme))
    print(block)
    print(f"written into {config.readme}")
    return block


if __name__ == "__main__":
    sys.exit(run_cli(main))
