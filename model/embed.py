"""Embeds a corpus with a trained encoder through Beam's RunInference, into Parquet.

    python -m model.embed --model-dir MODEL --output DIR (--input 'GLOB' | --data RUN --source scb|passages)
        [--text-field text] [--id-field id] [Beam options]

Inputs: text files (one sentence per line; id `file#hash`, a stable hash of the line, since
Beam reads a file in parallel ranges without line numbers), JSON lines (`--text-field`,
`--id-field`, the same `file#hash` where a record has no id; a `.jsonl.gz` is read as gzip), or
a pipeline run's `scb/` (every sentence; id `article_id:index`) or `passages/` (every paragraph
of the kept sections; id `article_id:section:paragraph`), the latter two listed from the run's
manifest. Output: `DIR/embeddings-NNNNN-of-MMMMM.parquet` with columns `id` (string), `text`
(string) and `embedding` (fixed-size list of float32, the encoder's width), written by Beam's
`WriteToParquet` (pyarrow). A JSON line that is not JSON, lacks the text field, breaks the
run's record contract (`core.records`), or whose text or id is not valid Unicode (a lone
surrogate such as JSON's `\\ud800`, which UTF-8 cannot encode) is counted (`embed_lines_set_aside`)
and set aside in `DIR/dead_letters-*.jsonl` with its file and reason, never fatal; the summary
line names them.

`model.encoding.inference.EncoderModelHandler` is the project's RunInference handler, for any method's
encoder (`eval.scb` embeds its articles with it too): Beam batches sentences (`BatchElements`,
`--min-batch`/`--max-batch`), loads the encoder once per worker process and shares it across
threads, and calls `encode` on each batch. It is keyed (`KeyedModelHandler`) so ids travel with
their sentences.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from core.cli import UsageError, flag, parse_config, run_cli
from core.records import PASSAGES, SCB
from model.training.model_dir import ENCODER

SOURCES = (SCB, PASSAGES)
PROG = "python -m model.embed"


@dataclass(frozen=True)
class EmbedConfig:
    """Flags of `python -m model.embed` (the rest are Beam's pipeline options)."""

    model_dir: str = flag(help=f"a trained model dir (holding {ENCODER}/), or an ONNX export folder (model.export "
                               "--format onnx), local or gs://")
    output: str = flag(help="folder for embeddings-*.parquet, local or gs://")
    input: str | None = flag(None, help="text or JSON-lines files (glob), local or gs://")
    data: str | None = flag(None, help="a pipeline run folder; with --source")
    source: str = flag("scb", help=f"which output of the run to embed: one of {', '.join(SOURCES)}")
    text_field: str = flag("text", help="JSON lines: the field holding the sentence")
    id_field: str = flag("id", help="JSON lines: the field holding its id")
    min_batch: int = flag(32, help="smallest batch RunInference forms")
    max_batch: int = flag(512, help="largest batch RunInference forms")
    overwrite: bool = flag(False, help="replace the embeddings an earlier model.embed wrote to --output; a folder "
                                       "holding anything else is refused either way")

    def __post_init__(self):
        if bool(self.input) == bool(self.data):
            raise UsageError("give exactly one of --input GLOB and --data RUN_FOLDER")
        if self.source not in SOURCES:
            raise UsageError(f"--source must be one of {SOURCES}, got {self.source!r}")
        if not 1 <= self.min_batch <= self.max_batch:
            raise UsageError(f"--min-batch {self.min_batch} / --max-batch {self.max_batch}: need 1 <= min <= max")


def parse_flags(argv: list[str] | None) -> tuple[EmbedConfig, list[str]]:
    """(config, Beam's pipeline options), from the flags alone."""
    return parse_config(EmbedConfig, argv, PROG, __doc__.split("\n\n")[0], passthrough=True)


def main(argv: list[str] | None = None) -> dict:
    config, beam_args = parse_flags(argv)
    from model.encoding.corpus import embed_corpus  # Beam and the encoder: after the flags

    return embed_corpus(config, beam_args)


if __name__ == "__main__":
    sys.exit(run_cli(main))
