"""What a killed evaluation keeps, and when a rerun into the same --output may reuse it.

Two things cost an evaluation its time: each method's embeddings of the triplets' and SICK's
sentences (`model.encoding.embedding_cache`, one Parquet file per method, written whole), and the
SCB job's per-article rows (embedding and clustering every article by every method). Both are
kept as they complete, under a key of what they depend on:

- a method's embeddings: its encoder spec and the SHA-256 of its files (`encoder_fingerprint`),
  and the sentences (`<output>/embeddings/<method>.json`);
- a method's SCB rows, in `<output>/scb/rows/<method>/`: the same encoder key, the run's
  manifest SHA-256 (`Run.sha256`) and the clustering seed (`key.json`, written before the job).
  The job writes the rows of the articles it has scored in files written whole (`KeepRowsFn`),
  every `--keep-seconds` and at the end of each bundle, so a kill loses at most that much. Before
  each, `<file>.whole.json` gives its row count and SHA-256 (a kill between the two leaves a proof
  of nothing, which nothing reads): a rerun reuses only a file that matches its own
  (`whole_rows`), so a file cut at a line boundary, which parses, is never mistaken for the
  whole one.

A rerun with the same key does only the rest: each method embeds and clusters only the articles
whose rows it does not keep. A method whose kept files have another key (another model in the
same folder, another run's data or seed) is refused with one line before any work
(`check_kept`): a report never mixes two models' or two runs' rows. So is a kept file that cannot
be read (a rows file cut short, an embeddings file without its Parquet footer: both are written
whole, so only a damaged disk or a hand makes one): one line names it and says to delete it and
rerun, which scores its articles or sentences again. It is not deleted here: a file nobody can
read is evidence of a damage the user should see, and a rerun costs only that file's share. A
rows file that reads but does not match its `.whole.json` (cut at a line boundary, or kept
without one: written before there were any) is set aside as `<file>.incomplete` with one stderr
line naming it, and its articles are scored again: a report never mixes articles with all their
rows and articles missing some. A row is one (article,
method, variant, algorithm); a bundle retried by the runner writes its rows again, and
`read_kept_rows` keeps one of each (they are equal: the clustering is seeded).
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from core.cli import UsageError
from core.files import read_bytes, read_json_object, write_bytes
from eval.config import ALGORITHMS
from model.encoding.embedding_cache import EMBEDDINGS_FOLDER, encoder_fingerprint
from model.encoding.encoders import EncoderSpec, method_names

ROWS_FOLDER = "scb/rows"
WHOLE_SUFFIX = ".whole.json"   # beside each rows file, written before it: its row count and SHA-256
SET_ASIDE_SUFFIX = ".incomplete"   # a rows file that does not match its WHOLE_SUFFIX, out of the rows' pattern
KEY_FILE = "key.json"
RUNS_FILE = "report.runs.json"   # the wall time of each run that went into the report (`runs_ledger`)
HEARTBEAT_SECONDS = 30


def encoder_key(spec: EncoderSpec) -> dict:
    """What a method's kept embeddings and rows are of: its spec and its encoder's files."""
    return {"spec": str(spec), "encoder_sha256": encoder_fingerprint(spec)}


def rows_key(spec: EncoderSpec, data_sha256: str, seed: int) -> dict:
    return {**encoder_key(spec), "data_sha256": data_sha256, "seed": seed}


def rows_folder(output: str, method: str) -> str:
    return FileSystems.join(output, ROWS_FOLDER, method)


def _read_key(path: str) -> dict | None:
    return read_json_object(path) if FileSystems.exists(path) else None


# What each key field tells a user who reruns into a folder that keeps other results.
DIFFERENCES = {"spec": "encoder spec", "encoder_sha256": "encoder (its files changed)",
               "data_sha256": "pipeline run (another manifest)", "seed": "--seed"}


def _refuse_other(path: str, kept: dict | None, key: dict, fields: tuple[str, ...], output: str) -> None:
    differing = [DIFFERENCES[field] for field in fields if kept is not None and kept.get(field) != key[field]]
    if differing:
        raise UsageError(f"--output {output}: {path} keeps results of another {' and '.join(differing)}; a report "
                         "never mixes them: choose another --output")


def refuse_other_source(path: str, key: dict, output: str) -> None:
    """UsageError (one line) unless the encoder key kept at `path` (an int8 export's
    `NAME.source.json`, `eval.all`) is `key`: the results the report keeps under that name are of
    that export, and no other model is exported over it."""
    kept = _read_key(path)
    if kept is None:
        raise UsageError(f"--output {output} keeps results that no int8 export of {key['spec']} made (no {path}); "
                         "a report never mixes two models: choose another --output")
    _refuse_other(path, kept, key, ("spec", "encoder_sha256"), output)


def keeps_results(output: str, method: str) -> bool:
    """Whether `output` keeps embeddings or SCB rows under `method`."""
    return FileSystems.exists(FileSystems.join(output, EMBEDDINGS_FOLDER, f"{method}.json")) or bool(
        _rows_files(output, method))


def check_kept(output: str, specs: list[EncoderSpec], data_sha256: str, seed: int) -> dict[str, dict]:
    """Before any work: UsageError (one line) when a method's kept embeddings or SCB rows in
    `output` are of another encoder, run or seed, or cannot be read; returns each method's SCB
    rows key."""
    keys = {}
    for spec, method in zip(specs, method_names(specs)):
        key = rows_key(spec, data_sha256, seed)
        embeddings_key = FileSystems.join(output, EMBEDDINGS_FOLDER, f"{method}.json")
        _refuse_other(embeddings_key, _read_key(embeddings_key), key, ("spec", "encoder_sha256"), output)
        _refuse_unreadable_embeddings(FileSystems.join(output, EMBEDDINGS_FOLDER, f"{method}.parquet"), output)
        scb_key = FileSystems.join(rows_folder(output, method), KEY_FILE)
        rows_files = _rows_files(output, method)
        if rows_files:   # a key without rows (a job that failed first) keeps nothing
            _refuse_other(scb_key, _read_key(scb_key), key, ("spec", "encoder_sha256", "data_sha256", "seed"), output)
        for path in rows_files:
            _refuse_unreadable_rows(path, output)
        keys[method] = key
    return keys


def _damaged(path: str, output: str, what: str, kept: str) -> UsageError:
    return UsageError(f"--output {output}: the kept file {path} is damaged ({what}); delete that file and rerun: "
                      f"its {kept} are scored again")


def _refuse_unreadable_embeddings(path: str, output: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not FileSystems.exists(path):
        return
    try:
        with FileSystems.open(path) as handle:
            pq.read_metadata(handle)
    except (pa.ArrowException, ValueError, OSError) as error:
        raise _damaged(path, output, f"not a whole Parquet file: {str(error).splitlines()[0][:200]}",
                       "sentences") from None


def _refuse_unreadable_rows(path: str, output: str) -> None:
    for number, line in enumerate(read_bytes(path).decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or "article_id" not in row:
            raise _damaged(path, output, f"line {number} is not an SCB row", "articles") from None


def kept_articles(output: str, keys: dict[str, dict]) -> dict[str, frozenset[int]]:
    """method -> the ids of the articles whose SCB rows it keeps (after `check_kept`); writes
    each method's key first, so every rows file has one, and sets aside each rows file that does
    not prove itself whole (`whole_rows`), so its articles are scored again."""
    kept = {}
    for method, key in keys.items():
        folder = rows_folder(output, method)
        if _read_key(FileSystems.join(folder, KEY_FILE)) != key:   # only where no rows are kept (`check_kept`)
            write_bytes(FileSystems.join(folder, KEY_FILE), (json.dumps(key, indent=2, sort_keys=True) + "\n").encode())
        article_ids: set[int] = set()
        for path in _rows_files(output, method):
            rows, why = whole_rows(path)
            if rows is None:
                FileSystems.rename([path], [path + SET_ASIDE_SUFFIX])
                print(f"eval.scb: the kept file {path} is not whole ({why}); set aside as {path}{SET_ASIDE_SUFFIX}: "
                      "its articles are scored again", file=sys.stderr)
                continue
            article_ids.update(row["article_id"] for row in rows)
        kept[method] = frozenset(article_ids)
    return kept


def whole_proof(data: bytes) -> dict:
    """What a rows file's `WHOLE_SUFFIX` holds: a copy cut at a line boundary parses, so only its
    count and digest tell it from the whole file."""
    return {"rows": sum(1 for line in data.splitlines() if line.strip()), "sha256": hashlib.sha256(data).hexdigest()}


def whole_rows(path: str) -> tuple[list[dict] | None, str]:
    """(the rows of the kept file `path`, "") where it matches its `WHOLE_SUFFIX`, else (None, why)."""
    proof_path = path + WHOLE_SUFFIX
    if not FileSystems.exists(proof_path):
        return None, f"no {proof_path}"
    try:
        proof = json.loads(read_bytes(proof_path))
    except ValueError:
        proof = None
    data = read_bytes(path)
    actual = whole_proof(data)
    if not isinstance(proof, dict) or "rows" not in proof:
        return None, f"{proof_path} is not a row count and SHA-256"
    if proof["rows"] != actual["rows"]:
        return None, f"{actual['rows']} rows where {proof_path} counts {proof['rows']}"
    if proof.get("sha256") != actual["sha256"]:
        return None, f"its SHA-256 is not the one in {proof_path}"
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()], ""


def _rows_pattern(output: str, method: str) -> str:
    return FileSystems.join(rows_folder(output, method), "part-*.jsonl")


def _rows_files(output: str, method: str) -> list[str]:
    return [metadata.path for metadata in FileSystems.match([_rows_pattern(output, method)])[0].metadata_list]


def read_kept_rows(output: str, methods: list[str], article_ids: set[int]) -> list[dict]:
    """The methods' kept rows of `article_ids` (the articles this run scores), one of each
    (method, article, variant, algorithm), in that order: the same report however the runs that
    wrote them were cut."""
    rows: dict[tuple, dict] = {}
    for position, method in enumerate(methods):
        for path in sorted(_rows_files(output, method)):
            for row in whole_rows(path)[0] or []:   # `kept_articles` set aside any other
                if row["article_id"] not in article_ids:
                    continue
                algorithm = ALGORITHMS.index(row["algorithm"]) if "algorithm" in row else -1   # skipped: none
                rows.setdefault((position, row["article_id"], row["variant"], algorithm), row)
    return [rows[key] for key in sorted(rows)]


class KeepRowsFn(beam.DoFn):
    """Writes the SCB rows it receives to their method's rows folder, each file whole, every
    `keep_seconds` (0: after each article's rows) and at the end of each bundle."""

    def __init__(self, output: str, keep_seconds: float):
        self.output = output
        self.keep_seconds = keep_seconds

    def start_bundle(self) -> None:
        self.pending: dict[str, list[dict]] = {}
        self.last_write = time.monotonic()

    def process(self, rows: list[dict]):   # one article's rows, all methods it scored
        for row in rows:
            self.pending.setdefault(row["method"], []).append(row)
        if time.monotonic() - self.last_write >= self.keep_seconds:
            self._write()

    def finish_bundle(self):
        self._write()

    def _write(self):
        for method, rows in self.pending.items():
            data = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows).encode("utf-8")
            path = FileSystems.join(rows_folder(self.output, method), f"part-{uuid.uuid4().hex}.jsonl")
            # The proof first: no rows file is ever without it, even when a kill falls between the two.
            write_bytes(path + WHOLE_SUFFIX, (json.dumps(whole_proof(data)) + "\n").encode())
            write_bytes(path, data)
        self.pending = {}
        self.last_write = time.monotonic()


@contextlib.contextmanager
def runs_ledger(output: str) -> Iterator[list[dict]]:
    """The wall time of each run into `output`, this one last: what the report's kept results
    cost, a resumed report's or one that added methods to an earlier one's. Each run's entry in
    `RUNS_FILE` is rewritten whole every HEARTBEAT_SECONDS, so a killed run counts to within
    that; the caller marks it `finished` before writing the report, and the yielded list is the
    ledger then."""
    path = FileSystems.join(output, RUNS_FILE)
    earlier = json.loads(read_bytes(path)) if FileSystems.exists(path) else []
    entry = {"started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
             "seconds": 0.0, "finished": False}
    ledger = [*earlier, entry]
    start, stop = time.monotonic(), threading.Event()

    def write() -> None:
        if not entry["finished"]:   # a finished run's seconds are the report's
            entry["seconds"] = round(time.monotonic() - start, 1)
        write_bytes(path, (json.dumps(ledger, indent=2) + "\n").encode("utf-8"))

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            write()

    write()
    heartbeat = threading.Thread(target=beat, name="eval-runs-ledger", daemon=True)
    heartbeat.start()
    try:
        yield ledger
    finally:
        stop.set()
        heartbeat.join()
        write()
