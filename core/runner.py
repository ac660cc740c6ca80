"""The Beam runner a job runs on, read once from its options (`--runner`) into a value that says
what it is: the DirectRunner in any of its spellings, Prism, a Java job-server runner (Flink,
Spark), or Dataflow."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

DIRECT_KINDS = ("", "direct", "bundlebaseddirect", "switchingdirect")
# Beam's job-service runners: the job goes to a job server (one this launcher starts, or --job_endpoint).
PORTABLE_KINDS = ("prism", "portable", "flink", "spark")
DATAFLOW_KINDS = ("dataflow", "testdataflow")


@dataclass(frozen=True)
class Runner:
    """`--runner` as given (None: Beam's default, the DirectRunner)."""

    name: str | None = None

    @classmethod
    def of(cls, options: PipelineOptions) -> Runner:
        from apache_beam.options.pipeline_options import StandardOptions

        return cls(options.view_as(StandardOptions).runner)

    @property
    def kind(self) -> str:
        """The runner's class name, lower case, without `Runner` (`DataflowRunner`, `dataflow` and a
        dotted path to it are all `dataflow`); "" when none is given."""
        return str(self.name or "").rsplit(".", 1)[-1].lower().removesuffix("runner")

    @property
    def is_direct(self) -> bool:
        """The DirectRunner (none given, `DirectRunner`, `direct`, its dotted path)."""
        return self.kind in ("", "direct")

    @property
    def is_local(self) -> bool:
        """Whether the job's workers run on this machine: the DirectRunner in any of its forms, or
        Prism (its workers are local processes; Flink, Spark and Dataflow run theirs elsewhere)."""
        return self.kind in (*DIRECT_KINDS, "prism")

    @property
    def is_portable(self) -> bool:
        return self.kind in PORTABLE_KINDS

    @property
    def is_dataflow(self) -> bool:
        return self.kind in DATAFLOW_KINDS

    def __str__(self) -> str:
        return self.name or "DirectRunner"
