"""The one interface of the evaluations (as big_vision's evaluators): each is a name and a `run`
that takes its flags (its config, `eval.config`) and what a combined run shares (`Inputs`), and
returns an `EvalResult`, which `eval.report.write_result` writes (JSON, Markdown, PNGs). `eval.all`
composes them through its registry (`eval.all_job.EVALUATORS`); each `python -m eval.<name>` runs one."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from model.encoding.encoders import EncoderSpec


@dataclass(frozen=True)
class Figure:
    """A plot of a result: its PNG file in the report folder, its caption in report.md, the matplotlib figure."""

    file: str
    caption: str
    figure: Any


@dataclass(frozen=True)
class EvalResult:
    """What an evaluation found: `<name>.json` (`result`), `<name>.md` (`markdown`), its figures,
    and `summary`, its main table in eval.all's summary.md."""

    name: str
    result: dict
    markdown: str
    figures: tuple[Figure, ...]
    summary: str

    def section(self) -> str:
        """Its section of eval.all's report.md: the Markdown, each figure under it."""
        return self.markdown + "".join(f"\n![{figure.caption}]({figure.file})\n" for figure in self.figures)


@dataclass(frozen=True)
class Inputs:
    """What eval.all shares with every evaluation beyond its flags (a command of one evaluation
    passes what it has): Beam's options for a Beam job, the methods as the specs of the embeddings
    cached for all of them, the test triplets read once."""

    beam_args: list[str] = field(default_factory=list)
    specs: list[EncoderSpec] | None = None
    triplets: dict[str, list[str]] | None = None


class Evaluator(Protocol):
    """An evaluation: `NAME` (its report files' stem and its step in report.json's `seconds`) and
    `run`; each is a job module (`eval.scb_job`, `eval.triplets_job`, `eval.sick`, `eval.qs3m`)."""

    NAME: str

    def run(self, config: Any, inputs: Inputs) -> EvalResult: ...
