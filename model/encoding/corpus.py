"""A corpus embedded by a trained encoder through Beam's RunInference into Parquet: the job
`python -m model.embed` runs (its docstring says what it reads and writes)."""
from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.ml.inference.base import KeyedModelHandler, PredictionResult, RunInference
from apache_beam.options.pipeline_options import PipelineOptions

from core import jobserver, records
from core.cli import UsageError, refuse_file_as_folder
from core.counters import NAMESPACE, job_totals
from core.folders import claim_folder, reading
from core.published import Run
from core.records import DEAD_LETTERS, SCB
from core.splits import stable_hash
from model.encoding.embedding_cache import parquet_schema
from model.encoding.encoder import is_onnx_export, load_encoder, not_utf8
from model.encoding.encoders import EncoderSpec, SpecKind
from model.encoding.inference import EncoderModelHandler, threads_per_worker

SENTENCES_EMBEDDED = "embed_sentences"   # the job's counter of sentences (or paragraphs) embedded
LINES_SET_ASIDE = "embed_lines_set_aside"   # input lines that break their format, in DIR/dead_letters-*
# What model.embed writes into --output (Beam's temp folders included): a rerun with --overwrite
# deletes these and nothing else.
WRITES = ("embeddings-", f"{DEAD_LETTERS}-", "beam-temp-")


def embedding_width(model_dir: str) -> int:
    """The encoder's output width, read once at pipeline construction (the Parquet schema needs it)."""
    return load_encoder(model_dir).dim


def sentences_of_record(file_name: str, line: str, source: str) -> list[tuple[str, str]]:
    """(id, text) of every sentence (scb) or paragraph (passages) of one pipeline record's JSON line;
    records.RecordError when the line breaks the contract."""
    if source == SCB:
        article = records.ScbRecord.from_json(line)
        return [(f"{article.article_id}:{index}", text) for index, text in enumerate(article.sentences)]
    record = records.PassagesRecord.from_json(line)
    return [(f"{record.article_id}:{section}:{paragraph}", passage.text)
            for section, content in enumerate(record.sections) for paragraph, passage in enumerate(content.paragraphs)]


def sentence_of_json_line(file_name: str, line: str, text_field: str, id_field: str) -> list[tuple[str, str]]:
    """[(id, text)] of one JSON line of `--input`; ValueError naming the field when it has no text."""
    record = json.loads(line)
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        raise ValueError(f"no string field {text_field!r}")
    text = record[text_field]
    return [(str(record[id_field]) if id_field in record else line_id(file_name, text), text)]


def utf8_pairs(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (id, text) pairs, when each can be encoded as UTF-8 (Beam's coders, Parquet and
    TensorFlow take only that); a ValueError naming the field that cannot (a lone surrogate,
    which a JSON line's valid `\\ud800` escape gives)."""
    for key, text in pairs:
        for field, value in (("id", key), ("text", text)):
            why = not_utf8(value)
            if why:
                raise ValueError(f"its {field} {why}")
    return pairs


class SentencesOfLinesFn(beam.DoFn):
    """(file, line) -> its (id, text) pairs by `parse(file, line)`; a line `parse` refuses (ValueError,
    which RecordError and JSONDecodeError are), or whose id or text is not valid Unicode
    (`utf8_pairs`) -> the `dead_letters` output, counted."""

    def __init__(self, parse: Callable[[str, str], list[tuple[str, str]]]):
        self.parse = parse
        self.set_aside = beam.metrics.Metrics.counter(NAMESPACE, LINES_SET_ASIDE)

    def process(self, named_line: tuple[str, str]):
        file_name, line = named_line
        try:
            pairs = utf8_pairs(self.parse(file_name, line))
        except ValueError as error:
            self.set_aside.inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, {
                "stage": "embed", "source": file_name, "page_id": None, "title": None,
                "reason": type(error).__name__, "detail": f"{error}: {line[:200]}"})
            return
        yield from pairs


def read_inputs(pipeline: beam.Pipeline, args: Any) -> tuple[beam.PCollection, beam.PCollection | None]:
    """(id, text) pairs of every input sentence, and the dead letters of lines set aside (None:
    plain text lines, none set aside)."""
    if args.data:
        files = Run.open(args.data).paths(args.source)
        lines = (pipeline
                 | "ListRecords" >> beam.Create(files)
                 | "ReadRecords" >> beam.io.ReadAllFromText(with_filename=True))
        parse = functools.partial(sentences_of_record, source=args.source)
    else:
        assert args.input is not None   # EmbedConfig: exactly one of --input and --data
        lines = pipeline | "ReadLines" >> beam.io.ReadFromTextWithFilename(args.input)
        if not args.input.removesuffix(".gz").endswith((".jsonl", ".json")):
            return (lines
                    | "NonEmpty" >> beam.Filter(lambda named_line: named_line[1].strip())
                    | "Ids" >> beam.Map(lambda named_line: (line_id(*named_line), named_line[1]))), None
        parse = functools.partial(sentence_of_json_line, text_field=args.text_field, id_field=args.id_field)
    parsed = (lines | "Sentences" >> beam.ParDo(SentencesOfLinesFn(parse))
              .with_outputs(DEAD_LETTERS, main="sentences"))
    return parsed.sentences, parsed[DEAD_LETTERS]


def line_id(file_name: str, text: str) -> str:
    """The id of a line that carries none: its file and a stable hash of its text."""
    return f"{file_name}#{stable_hash(text):016x}"


def to_row(keyed: tuple[str, Any]) -> dict:
    """A Parquet row from RunInference's (id, PredictionResult)."""
    key, result = keyed
    return {"id": key, "text": result.example, "embedding": np.asarray(result.inference, np.float32).tolist()}


class ToRowsFn(beam.DoFn):
    """`to_row`, counting the sentences embedded: a Beam counter (the job's page on Dataflow, the
    summary line here) and, on a terminal, a progress bar in sentences."""

    def setup(self):
        from tqdm import tqdm

        self.sentences = beam.metrics.Metrics.counter(NAMESPACE, SENTENCES_EMBEDDED)
        self.progress = tqdm(desc="model.embed", unit=" sentences", disable=None, mininterval=2)

    def process(self, keyed: tuple[str, Any]):
        self.sentences.inc()
        self.progress.update()
        yield to_row(keyed)

    def teardown(self):
        self.progress.close()


def build(pipeline: beam.Pipeline, args: Any, dim: int) -> None:
    spec = (EncoderSpec(SpecKind.ONNX, "embed", (args.model_dir,)) if is_onnx_export(args.model_dir)
            else EncoderSpec(SpecKind.SAVED, "embed", (args.model_dir,)))
    handler: KeyedModelHandler[str, Any, PredictionResult, Any] = KeyedModelHandler(
        EncoderModelHandler(spec, args.min_batch, args.max_batch, threads_per_worker(pipeline.options)))
    sentences, dead_letters = read_inputs(pipeline, args)
    (sentences
     | "Embed" >> RunInference(handler)
     | "ToRows" >> beam.ParDo(ToRowsFn())
     | "WriteParquet" >> beam.io.WriteToParquet(FileSystems.join(args.output, "embeddings"), parquet_schema(dim),
                                                 file_name_suffix=".parquet"))
    if dead_letters is not None:
        (dead_letters
         | "DeadLettersToJson" >> beam.Map(records.json_line)
         | "WriteDeadLetters" >> beam.io.WriteToText(FileSystems.join(args.output, DEAD_LETTERS),
                                                     file_name_suffix=".jsonl", skip_if_empty=True))


def embed_corpus(args: Any, beam_args: list[str]) -> dict:
    """Runs the job of `args` (`model.embed.EmbedConfig`; Beam's options `beam_args`): the input
    checked before any work, the output claimed, the corpus embedded; its summary."""
    if args.input and not FileSystems.match([args.input])[0].metadata_list:
        raise UsageError(f"--input {args.input} matches no file")
    refuse_file_as_folder("--output", args.output)
    with reading(Run.open(args.data)) if args.data else contextlib.nullcontext():   # a lease while reading it
        if args.data:
            Run.open(args.data).verify(args.source)     # a published run holding the whole source
        dim = embedding_width(args.model_dir)     # a missing encoder is FileNotFoundError: one line, exit 2
        options = PipelineOptions(beam_args)
        jobserver.prepare_portable_run(options)   # a runner that cannot run refused before the claim
        claim_folder(args.output, "model.embed", WRITES, "--output", args.overwrite)
        pipeline = beam.Pipeline(options=options)
        build(pipeline, args, dim)
        with jobserver.run_job(pipeline) as result:
            totals = job_totals(result)
    files = sorted(m.path for m in FileSystems.match([FileSystems.join(args.output, "embeddings-*.parquet")])[0]
                   .metadata_list)
    sentences, set_aside = totals.get(SENTENCES_EMBEDDED, 0), totals.get(LINES_SET_ASIDE, 0)
    print(f"{sentences} sentences embedded ({dim} float32 each, not normalised) in {len(files)} Parquet file(s) "
          f"under {args.output}" + (f"; {set_aside} malformed line(s) set aside in {DEAD_LETTERS}-*.jsonl there"
                                    if set_aside else ""))
    return {"dim": dim, "files": files, "sentences": sentences, "set_aside": set_aside}
