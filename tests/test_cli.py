"""Every command is built the one way (`pipeline.cli.parse_config`): dashed flags, each with help,
`python -m` usage, old underscore spellings accepted, refusals as `UsageError` (one line, exit 2)."""
import importlib
import re

import pytest

from pipeline.cli import UsageError, config_parser, parse_config

COMMANDS = {   # python -m module -> its config class
    "pipeline.run": "PipelineConfig", "pipeline.benchmark": "BenchmarkConfig",
    "model.train": "TrainConfig", "model.benchmark": "TrainerBenchmarkConfig", "model.embed": "EmbedConfig",
    "model.qs3m": "Qs3mConfig", "model.pretrained": "PretrainedConfig", "eval.scb": "ScbConfig",
    "eval.triplets": "TripletsConfig", "eval.sick": "SickConfig", "eval.all": "ReportConfig",
    "eval.benchmark": "ScbBenchmarkConfig", "eval.readme": "ReadmeConfig",
    "eval.qs3m": "Qs3mEvalConfig", "infra.sizing": "SizingConfig", "infra.submit": "CloudConfig",
    "infra.recipe": "RecipeConfig",
}
DEFINED_IN = {"model.train": "model.config", "model.qs3m": "model.qs3m.train"}


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
    from eval.triplets import TripletsConfig

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
