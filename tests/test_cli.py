"""Every command is built the one way (`core.cli.parse_config`): dashed flags, each with help,
`python -m` usage, old underscore spellings accepted, refusals as `UsageError` (one line, exit 2)."""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

import pytest

from core.cli import UsageError, config_flags, config_from_flags, config_parser, flag, parse_config

COMMANDS = {   # python -m module -> its config class
    "pipeline.run": "PipelineConfig", "pipeline.benchmark": "BenchmarkConfig",
    "model.train": "TrainConfig", "model.benchmark": "TrainerBenchmarkConfig", "model.embed": "EmbedConfig",
    "model.qs3m": "Qs3mConfig", "model.pretrained": "PretrainedConfig", "eval.scb": "ScbConfig",
    "eval.triplets": "TripletsConfig", "eval.sick": "SickConfig", "eval.all": "ReportConfig",
    "eval.benchmark": "ScbBenchmarkConfig", "eval.readme": "ReadmeConfig",
    "eval.qs3m": "Qs3mEvalConfig", "infra.sizing": "SizingConfig", "infra.submit": "CloudConfig",
    "infra.recipe": "RecipeConfig", "model.export": "ExportConfig", "model.curves": "CurvesConfig",
    "infra.scale_benchmark": "ScaleBenchmarkConfig", "model.soup": "SoupConfig",
    "pipeline.publish": "PublishConfig", "infra.accelerator.summary": "SummaryConfig",
    "infra.accelerator.kit": "KitConfig",
}
DEFINED_IN = {"model.train": "model.config", "model.qs3m": "model.qs3m.train",
              **{command: "eval.config" for command in ("eval.scb", "eval.triplets", "eval.sick", "eval.all",
                                                       "eval.benchmark", "eval.qs3m")}}


def _config(command: str) -> type:
    return getattr(importlib.import_module(DEFINED_IN.get(command, command)), COMMANDS[command])


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_flag_is_dashed_and_has_help(command):
    parser = config_parser(_config(command), f"python -m {command}", "")
    flags = [(option, action.help) for action in parser._actions for option in action.option_strings
             if option not in ("-h", "--help")]
    assert flags
    assert [option for option, _ in flags if not re.fullmatch(r"--[a-z0-9]+(-[a-z0-9]+)*", option)] == []
    assert [option for option, text in flags if not text] == []
    assert parser.format_usage().startswith(f"usage: python -m {command}")


def test_an_old_underscore_spelling_and_a_bad_value():
    from eval.config import TripletsConfig

    config = parse_config(TripletsConfig, ["--data", "d", "--output", "o", "--max_triplets=7",
                                           "--model-dir", "a", "--model-dir", "b"], "p", "")
    assert (config.max_triplets, config.methods.model_dirs) == (7, ("a", "b"))
    with pytest.raises(UsageError, match="--split"):
        parse_config(TripletsConfig, ["--data", "d", "--output", "o", "--split", "dev"], "p", "")
    with pytest.raises(UsageError, match="--max-triplets"):
        parse_config(TripletsConfig, ["--data", "d", "--output", "o", "--max-triplets", "seven"], "p", "")


def test_the_flex_template_entry_file_hands_its_flags_to_pipeline_run(tmp_path):
    """What Dataflow's launcher runs: `python flex_launcher.py --name=value ...`."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(repo / "infra" / "flex_launcher.py"), "--output", str(tmp_path / "o"),
                           "--page-shards=0"], capture_output=True, text=True, cwd=repo, timeout=300,
                          env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error: --page-shards")


@dataclass(frozen=True, kw_only=True)
class _Source:
    path: str = flag(help="required, in a group without a default")
    limit: int | None = flag(None, help="optional")


@dataclass(frozen=True, kw_only=True)
class _Sizes:
    width: int = flag(4, help="a size")
    deep: bool = flag(False, help="a switch")

    def __post_init__(self):
        if self.width < 1:
            raise ValueError(f"--width must be >= 1, got {self.width}")


@dataclass(frozen=True, kw_only=True)
class _Grouped:
    source: _Source
    sizes: _Sizes = _Sizes()
    seed: int = flag(0, help="a field of the outer config itself")


def test_a_field_whose_type_is_a_config_adds_its_flags():
    parser = config_parser(_Grouped, "p", "")
    assert [option for action in parser._actions for option in action.option_strings
            if option not in ("-h", "--help")] == ["--path", "--limit", "--width", "--deep", "--seed"]
    config = parse_config(_Grouped, ["--path", "p", "--width", "7", "--deep", "--limit", "none"], "p", "")
    assert config == _Grouped(source=_Source(path="p"), sizes=_Sizes(width=7, deep=True))
    with pytest.raises(UsageError, match="--path"):          # required inside a group: still required
        parse_config(_Grouped, ["--width", "7"], "p", "")
    with pytest.raises(UsageError, match="--width must be >= 1"):   # a group's own check, one error line
        parse_config(_Grouped, ["--path", "p", "--width", "0"], "p", "")


def test_code_builds_and_reads_a_nested_config_by_its_flags():
    config = config_from_flags(_Grouped, {"path": "p", "deep": True, "seed": 3})
    assert config == _Grouped(source=_Source(path="p"), sizes=_Sizes(deep=True), seed=3)
    assert config_flags(config) == {"path": "p", "limit": None, "width": 4, "deep": True, "seed": 3}
    assert config_from_flags(_Grouped, config_flags(config)) == config
    with pytest.raises(TypeError, match="'sizes'"):           # a group is no flag
        config_from_flags(_Grouped, {"path": "p", "sizes": _Sizes()})
    with pytest.raises(ValueError, match="--width") as refused:
        config_from_flags(_Grouped, {"path": "p", "width": 0})
    assert not isinstance(refused.value, UsageError)          # in code, the check's own ValueError


@pytest.mark.parametrize("negatives", ["", " , ", "adjacent,bogus"])
def test_negatives_naming_no_strategy_or_an_unknown_one_are_refused(negatives):
    from pipeline.run import parse_args

    with pytest.raises(UsageError, match="--negatives .*: choose one or more of adjacent, same_article, other_article"):
        parse_args(["--input", "x", "--output", "y", "--negatives", negatives])


def test_negatives_are_parsed_into_strategies_once_each_in_order():
    from core.records import NegativeStrategy
    from pipeline.run import PipelineConfig

    config = PipelineConfig(input="x", output="y", negatives=" other_article,adjacent,other_article ")
    assert config.negative_strategies() == (NegativeStrategy.OTHER_ARTICLE, NegativeStrategy.ADJACENT)


def _flag_help(help_text: str) -> dict[str, str]:
    """`--help`'s text per flag (its option line and the lines under it, joined)."""
    blocks: dict[str, str] = {}
    flag_name = None
    for line in help_text.split("\n\n", 1)[-1].splitlines():
        match = re.match(r"  (-\S+)", line)
        if match:
            flag_name = match.group(1).rstrip(",")
            blocks[flag_name] = line
        elif line.startswith("   ") and flag_name:
            blocks[flag_name] += " " + line.strip()
        else:
            flag_name = None
    return blocks


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_shows_a_default_only_where_it_tells_something(command, monkeypatch):
    """No `(default: None)` (nor an empty one), and a help text that names its default gets no second."""
    monkeypatch.setenv("COLUMNS", "100")
    blocks = _flag_help(config_parser(_config(command), f"python -m {command}", "").format_help())
    assert blocks
    for flag_name, text in blocks.items():
        assert not re.search(r"\(default: (None|\(\)|)\)", text), (flag_name, text)
        assert text.lower().count("default") <= 1, (flag_name, text)


def test_a_nested_configs_flags_are_a_group_of_its_own_and_each_flag_is_listed_once(monkeypatch):
    from model.config import TrainConfig

    monkeypatch.setenv("COLUMNS", "100")
    parser = config_parser(TrainConfig, "python -m model.train", "Trains.")
    text = parser.format_help()
    headings = [line for line in text.splitlines() if re.fullmatch(r"[a-z ]+:", line)]
    assert headings == ["options:", "inputs:", "network:", "optimizer:", "runtime:"]
    listed = re.findall(r"^  (--[a-z0-9-]+)", text, flags=re.MULTILINE)
    flags = [option for action in parser._actions for option in action.option_strings if option not in ("-h", "--help")]
    assert sorted(listed) == sorted(flags) and len(set(listed)) == len(listed) > 40
    assert text.startswith("usage: python -m model.train [-h] --data DATA --model-dir MODEL_DIR [FLAG ...]\n")
