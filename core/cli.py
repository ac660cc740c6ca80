"""The one convention of every `python -m` entry point (pipeline, model, eval, infra).

A command's `main(argv)` does the work; `run_cli(main)` is its shell face:

* a bad flag, path or input (`UsageError`, or a missing file) is one line `error: ...` naming
  it, exit status 2; commands check these before any work starts;
* data lost while the job ran (`DataLossError`: a run that finished but lost more of its
  input than allowed) is one line `error: ...`, exit status 1, after the outputs and stats
  that explain it were written;
* Ctrl-C is one line `interrupted`, exit status 130, after the command released what it held;
* anything else is a bug and keeps its traceback.

Every command's flags come from one config dataclass (`config_parser`): a field is a flag spelt
`--with-dashes` (the old `--with_underscores` spelling is still accepted, unlisted), its help
text is the field's `flag(help=...)`, a tuple is a comma-separated list, a field whose type is
itself a config (a dataclass) adds that config's flags, and `__post_init__` checks the values.
The flags are one namespace: code builds and reads a nested config by its flags' field names too
(`config_from_flags`, `config_flags`). Beam's own pipeline options keep Beam's spelling
(`--direct_num_workers`) and pass through untouched where a command runs a Beam job.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, cast, get_type_hints, overload

from core.runner import Runner

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# A config dataclass: what `parse_config`, `build_config` and `config_from_flags` build, typed as given.
ConfigT = TypeVar("ConfigT", bound="DataclassInstance")


class UsageError(ValueError):
    """A flag, path or input the command cannot run with; the message names it."""


class DataLossError(RuntimeError):
    """The job ran but lost more of its input than allowed; its outputs stay unpublished."""


def run_cli(main: Callable[[list[str]], object], argv: list[str] | None = None) -> int:
    """Runs `main` on the command line's arguments; returns the exit status (see module docstring)."""
    try:
        main(sys.argv[1:] if argv is None else argv)
    except (UsageError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except DataLossError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # Ctrl-C: the command's own cleanup ran on the way out (locks released)
        print("interrupted", file=sys.stderr)
        return 130
    return 0


def parse_first(parse: Callable[[list[str]], object]) -> None:
    """The flags before the heavy imports: an entry module that needs TensorFlow or Keras at
    import time calls this under `if __name__ == "__main__":` above those imports, so `--help`
    answers and a bad flag is refused (`run_cli`'s one `error:` line, exit 2) before they load.
    `parse` must only read the flags (its `main` parses them again)."""
    status = run_cli(parse)
    if status:
        sys.exit(status)


def flag(default: Any = dataclasses.MISSING, *, help: str, name: str | None = None,
         repeatable: bool = False) -> Any:
    """A config field that is also a command-line flag; its help text lives beside it. `name`:
    the flag when it is not the field's name (`model_dirs` <- repeatable `--model-dir`)."""
    return dataclasses.field(default=default, metadata={"help": help, "name": name, "repeatable": repeatable})


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose refusals are a `UsageError` (one `error:` line from `run_cli`, exit 2)
    rather than a usage block."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parse_bool(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def _value_type(annotation: str) -> Callable[[str], Any]:
    """int/float/str from the field's annotation; an optional one also takes `none`."""
    parse = int if annotation.startswith("int") else float if annotation.startswith("float") else str
    if annotation.endswith("| None"):
        return lambda text: None if text.lower() == "none" else parse(text)
    return parse


def _list_type(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    """A comma-separated list of `item`s (blank items dropped); a lambda, as argparse names it in
    its `invalid <lambda> value` refusal."""
    return lambda text: tuple(item(v) for v in text.split(",") if v.strip())


def _nested_configs(config_type: type) -> dict[str, type]:
    """The fields of `config_type` whose type is a config (a dataclass): field name -> that type."""
    types = get_type_hints(config_type)
    return {field.name: types[field.name] for field in dataclasses.fields(config_type)
            if dataclasses.is_dataclass(types[field.name])}


def flag_fields(config_type: type) -> list[dataclasses.Field[Any]]:
    """The fields that are flags, with those of nested configs in their place."""
    nested = _nested_configs(config_type)
    fields: list[dataclasses.Field[Any]] = []
    for field in dataclasses.fields(config_type):
        if field.name in nested:
            fields += flag_fields(nested[field.name])
        else:
            fields.append(field)
    return fields


def _shown_default(default: Any) -> str | None:
    """A flag's default as the user would type it (`T,D,P`, `false`); None where it says nothing
    (none, an empty text or list) and the help text's own words tell what leaving the flag out does."""
    if default is None or default == argparse.SUPPRESS or default in ("", ()):
        return None
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, tuple):
        return ",".join(str(item) for item in default)
    return str(default)


class _HelpFormatter(argparse.HelpFormatter):
    """A flag's default in its help only where it tells something: not `None`, and not when the
    help text already names it. A description's paragraphs are re-wrapped, a URL or a hyphenated
    word never broken across lines; an indented line (a usage example) is kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        shown = _shown_default(action.default)
        if shown is None or action.required or not action.option_strings or "default" in help_text.lower():
            return action.help
        return f"{help_text} (default: {shown.replace('%', '%%')})"   # argparse %-formats help texts

    def _split_lines(self, text: str, width: int) -> list[str]:
        """A flag's help, never broken inside a hyphenated value (`sentence-transformers`, `gs://`)."""
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_long_words=False, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import inspect
        import textwrap

        lines: list[str] = []
        words: list[str] = []

        def wrap_words() -> None:
            if words:
                lines.extend(textwrap.wrap(" ".join(words), width, initial_indent=indent, subsequent_indent=indent,
                                           break_long_words=False, break_on_hyphens=False))
                words.clear()

        for line in inspect.cleandoc(text).splitlines():
            if line and not line[0].isspace():
                words.extend(line.split())
                continue
            wrap_words()
            if line.strip():
                lines.append(indent + line.rstrip())
            elif lines and lines[-1]:   # one blank line between paragraphs
                lines.append("")
        wrap_words()
        return "\n".join(lines).rstrip("\n")


def _flag_groups(config_type: type) -> list[tuple[str | None, list[dataclasses.Field[Any]]]]:
    """The flags in `flag_fields`' order, each with the field of `config_type` holding its nested
    config (None: a field of `config_type` itself): `--help` lists a nested config's flags under
    that field's name, so a long list (`model.train`'s) reads in the configs it is built from."""
    nested = _nested_configs(config_type)
    groups: list[tuple[str | None, list[dataclasses.Field[Any]]]] = []
    for field in dataclasses.fields(config_type):
        group = field.name if field.name in nested else None
        fields = flag_fields(nested[field.name]) if group else [field]
        if groups and groups[-1][0] == group:
            groups[-1][1].extend(fields)
        else:
            groups.append((group, fields))
    return groups


# More flags than this and `--help`'s usage line names only the required ones (`model.train`'s 43).
_FULL_USAGE_FLAGS = 30


def config_parser(config_type: type, prog: str, description: str, epilog: str | None = None) -> ArgumentParser:
    """One flag per field of `config_type` (and of its nested configs, each config's in a group of its own)."""
    parser = ArgumentParser(prog=prog, description=description, epilog=epilog, allow_abbrev=False,
                            formatter_class=_HelpFormatter)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for group, fields in _flag_groups(config_type):
        container: argparse._ActionsContainer = parser
        if group:
            container = groups.get(group) or groups.setdefault(group, parser.add_argument_group(
                group.replace("_", " ")))
        for field in fields:
            _add_flag(container, field)
    actions = [action for action in parser._actions if action.option_strings]
    if len(actions) > _FULL_USAGE_FLAGS:   # its usage would be a page of its own: the required flags, the rest below
        required = [f"{action.option_strings[0]} {action.metavar or action.dest.upper()}"
                    for action in actions if action.required]
        parser.usage = " ".join(["%(prog)s [-h]", *required, "[FLAG ...]"])
    return parser


def _add_flag(parser: argparse._ActionsContainer, field: dataclasses.Field[Any]) -> None:
    """`field` as a flag of `parser` (see the module docstring)."""
    name = "--" + (field.metadata.get("name") or field.name.replace("_", "-"))
    help_text = field.metadata["help"]
    if field.metadata.get("repeatable"):   # `--model-dir A --model-dir B` -> ("A", "B")
        parser.add_argument(name, dest=field.name, action="append", help=help_text + " (repeatable)")
    elif field.default is dataclasses.MISSING:
        parser.add_argument(name, dest=field.name, type=_value_type(str(field.type)), required=True,
                            default=argparse.SUPPRESS, help=help_text)
    elif isinstance(field.default, tuple):   # a comma-separated list of its default's item type
        item_type = type(field.default[0]) if field.default else str
        parser.add_argument(name, dest=field.name, default=field.default, metavar="A,B,...", help=help_text,
                            type=_list_type(item_type))
    elif str(field.type) == "bool":   # `--overwrite` or `--overwrite true|false`
        parser.add_argument(name, dest=field.name, type=_parse_bool, nargs="?", const=True,
                            default=field.default, metavar="true|false", help=help_text)
    else:
        parser.add_argument(name, dest=field.name, type=_value_type(str(field.type)), default=field.default,
                            help=help_text)


def _current_spelling(argv: list[str], old_names: dict[str, str]) -> list[str]:
    """`--page_shards 4` -> `--page-shards 4` (and a renamed flag's old name -> its field's
    flag) for the config's own flags; every other argument untouched."""
    out = []
    for arg in argv:
        flag_name, equals, value = arg.partition("=")
        if flag_name.startswith("--") and flag_name[2:] in old_names:
            arg = "--" + old_names[flag_name[2:]].replace("_", "-") + equals + value
        out.append(arg)
    return out


def _built(config_type: type[ConfigT], values: dict[str, Any]) -> ConfigT:
    """`config_type` from flag values by field name, each nested config built from its own."""
    nested = _nested_configs(config_type)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(config_type):
        if field.name in nested:
            kwargs[field.name] = _built(nested[field.name], values)
        elif field.metadata.get("repeatable"):
            # a repeatable flag's field defaults to a tuple (`flag((), repeatable=True, ...)`)
            kwargs[field.name] = tuple(values.get(field.name) or cast(Iterable[Any], field.default))
        elif field.name in values:
            kwargs[field.name] = values[field.name]
    return config_type(**kwargs)


def build_config(config_type: type[ConfigT], values: dict[str, Any]) -> ConfigT:
    """`config_type` from the parsed flags' values (other keys ignored), nested configs built from
    their own fields; a value its `__post_init__` refuses (ValueError) is a UsageError."""
    try:
        return _built(config_type, values)
    except UsageError:
        raise
    except ValueError as error:
        raise UsageError(str(error)) from error


def config_from_flags(config_type: type[ConfigT], values: dict[str, Any]) -> ConfigT:
    """`config_type` as code writes it: flag values by field name, whichever nested config holds
    the field (`{"data": ..., "epochs": 1}`), the rest at their defaults. A name that is no flag
    of it is a TypeError; `__post_init__`'s refusals stay ValueErrors."""
    unknown = sorted(set(values) - {field.name for field in flag_fields(config_type)})
    if unknown:
        raise TypeError(f"{config_type.__name__} has no flag field {unknown[0]!r}")
    return _built(config_type, values)


def config_flags(config: Any) -> dict[str, Any]:
    """A config's flag values by field name, nested configs' among its own (`config_from_flags`
    builds the same config back from them)."""
    nested = _nested_configs(type(config))
    values = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name in nested:
            values.update(config_flags(value))
        else:
            values[field.name] = value
    return values


def refuse_file_as_folder(flag_name: str, path: str) -> None:
    """An output folder flag naming an existing local file: one `error:` line, before any work
    (rather than a traceback from whatever first writes into it)."""
    if "://" not in path and os.path.isfile(path):
        raise UsageError(f"{flag_name} {path} is a file, not a folder")


# Where a command that passes Beam's options through says they are documented (`--help`'s epilog).
BEAM_OPTIONS_EPILOG = (
    "Every other flag is one of Beam's pipeline options, passed to the job unchanged: --runner "
    "DirectRunner (the default; --direct_num_workers, --direct_running_mode), PrismRunner (--prism_location "
    "PATH, which make prism builds; --job_endpoint HOST:PORT for a Prism job server of your own), FlinkRunner "
    "(--flink_master=[local] or HOST:PORT of a Flink 1.16 session cluster, --parallelism N; Beam's Flink job "
    "server, which make flink builds, is started per run) or DataflowRunner (--project, --region, "
    "--temp_location). The tests run the job on the first three and compare its bytes; SparkRunner is "
    "untested. This project's runners are described in docs/pipeline.md; all of Beam's options in "
    "https://beam.apache.org/documentation/programming-guide/#configuring-pipeline-options"
)


def dataflow_option_errors(beam_args: list[str]) -> list[str]:
    """Beam's own validation of Dataflow's options (PipelineOptionsValidator), with no call to the
    cloud: `--dry_run` skips the bucket look-ups, and with neither a temp nor a staging location
    Beam's validation would create a default bucket online, so their errors are reported instead
    (beside the project's and region's)."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions
    from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    options = PipelineOptions([*beam_args, "--dry_run=True"])
    validator: Any = cast(Any, PipelineOptionsValidator)(options, cast(Any, DataflowRunner)())
    cloud = options.view_as(GoogleCloudOptions)
    temp_errors = validator.validate_gcs_path(cloud, "temp_location")
    staging_errors = validator.validate_gcs_path(cloud, "staging_location")
    if temp_errors and staging_errors:
        return [*temp_errors, *(staging_errors if cloud.staging_location else []),
                *validator.validate_cloud_options(cloud)]
    return list(validator.validate())


def _beam_options(beam_args: list[str]) -> dict[str, Any]:
    """Beam's parse of `beam_args`, unknown flags kept. A value Beam's parser refuses is a
    UsageError naming the option (with a choice's allowed values), not Beam's usage block of
    every option it has."""
    import contextlib
    import io

    from apache_beam.options.pipeline_options import PipelineOptions

    refusal = io.StringIO()
    try:
        with contextlib.redirect_stderr(refusal):
            return PipelineOptions(beam_args).get_all_options(retain_unknown_options=True)
    except SystemExit:
        message = (refusal.getvalue().strip().splitlines() or ["a Beam option is refused"])[-1]
        raise UsageError("Beam pipeline option " + message.split(": error: ", 1)[-1].removeprefix("argument ")
                         ) from None


def check_beam_flags(beam_args: list[str], prog: str) -> None:
    """Every flag a command does not define must be one of Beam's pipeline options: Beam itself
    only logs a warning and drops an unknown one, so `--max-triplet 10` (for `--max-triplets`)
    would run with the default. Beam's own option parser, asked to keep unknown flags, tells them.
    A value Beam refuses, an unknown runner, and Dataflow without the options it needs are
    refused here too, before any work."""
    from apache_beam.options.pipeline_options import PipelineOptions

    known = PipelineOptions([]).get_all_options()
    given = _beam_options(beam_args)
    unknown = sorted(set(given) - set(known))
    if unknown:
        spelt = next((arg.split("=", 1)[0] for arg in beam_args
                      if arg.startswith("-") and arg.lstrip("-").split("=", 1)[0].replace("-", "_") == unknown[0]),
                     f"--{unknown[0]}")
        raise UsageError(f"unknown flag {spelt} (neither a flag of {prog} nor a Beam pipeline option)")
    runner = given.get("runner")
    if runner and "." not in runner:   # a dotted path names a runner class of the user's own
        from apache_beam.options.pipeline_options import StandardOptions

        names = [path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS]
        if runner.lower() not in {name.lower() for name in names} | {name.lower().removesuffix("runner")
                                                                      for name in names}:
            raise UsageError(f"--runner {runner}: not a Beam runner (one of {', '.join(sorted(set(names)))})")
    if Runner(runner).is_dataflow:
        errors = dataflow_option_errors(beam_args)
        if errors:   # Beam's messages, its option names spelt as flags
            named = [re.sub(r"option: (\w+)", r"option --\1", error).rstrip(".") for error in errors]
            raise UsageError(f"--runner {runner}: Beam refuses the Dataflow options: {'; '.join(named)} "
                             f"(see docs/pipeline.md)")


def _is_beam_option(name: str) -> bool:
    from apache_beam.options.pipeline_options import PipelineOptions

    return name.lstrip("-").replace("-", "_") in PipelineOptions([]).get_all_options()


def _refuse_misspelt_flags(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """A flag that is not the command's but close to one of its own (`--ouput`) is named, with
    the one meant, before argparse reports the required flag it left missing."""
    import difflib

    options = [option for action in parser._actions for option in action.option_strings]
    for arg in argv:
        name = arg.split("=", 1)[0]
        if name.startswith("--") and name not in options:
            close = difflib.get_close_matches(name, options, n=1, cutoff=0.75)
            if close and not _is_beam_option(name):
                raise UsageError(f"unknown flag {name} (did you mean {close[0]}?)")


@overload
def parse_config(config_type: type[ConfigT], argv: list[str] | None, prog: str, description: str,
                 passthrough: Literal[False] = False, renamed: dict[str, str] | None = None) -> ConfigT: ...


@overload
def parse_config(config_type: type[ConfigT], argv: list[str] | None, prog: str, description: str,
                 passthrough: Literal[True], renamed: dict[str, str] | None = None) -> tuple[ConfigT, list[str]]: ...


def parse_config(config_type: type[ConfigT], argv: list[str] | None, prog: str, description: str,
                 passthrough: bool = False,
                 renamed: dict[str, str] | None = None) -> ConfigT | tuple[ConfigT, list[str]]:
    """`config_type` from the command line; with `passthrough`, (config, the flags that are not
    its own) for a command that hands the rest to Beam. `renamed`: old flag name -> field, still
    accepted (unlisted) for one release."""
    argv = sys.argv[1:] if argv is None else argv
    parser = config_parser(config_type, prog, description, BEAM_OPTIONS_EPILOG if passthrough else None)
    old_names = {field.name: field.name for field in flag_fields(config_type) if "_" in field.name}
    argv = _current_spelling(argv, {**old_names, **(renamed or {})})
    _refuse_misspelt_flags(parser, argv)
    if passthrough:
        args, rest = parser.parse_known_args(argv)
        check_beam_flags(rest, prog)
        return build_config(config_type, vars(args)), rest
    return build_config(config_type, vars(parser.parse_args(argv)))
