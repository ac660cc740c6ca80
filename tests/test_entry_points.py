"""Every `python -m` entry point, run for real: `--help` answers on stdout with nothing on stderr
and before any heavy library loads (the flags parse first), and a misspelt flag is one `error:`
line naming it, exit 2. Importing `model` or an eval job loads no PyTorch, even with the minilm
extra installed; choosing minilm loads it before TensorFlow, or says why it cannot."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import COMMANDS, _config

from core.cli import config_parser

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = sorted([*COMMANDS, "model.qs3m.train"])
CONFIG_OF = {"model.qs3m.train": "model.qs3m"}
# What `--help` must not load: each costs seconds (TensorFlow 8-20 s under load) or prints on stderr.
HEAVY = ("tensorflow", "keras", "torch", "sklearn", "scipy", "matplotlib", "pyarrow", "spacy", "apache_beam")
# Runs a module as `python -m` does, then reports which heavy libraries it loaded, to a file (so
# the module's own stdout and stderr stay as they are).
AS_MAIN = """import atexit, os, runpy, sys
def report():
    loaded = sorted({name.split(".")[0] for name in sys.modules} & set(os.environ["HEAVY"].split(",")))
    open(os.environ["LOADED_TO"], "w").write(",".join(loaded))
atexit.register(report)
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _env(**extra) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    return {**env, "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]), **extra}


def _run(args: list[str], cwd: Path = REPO, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                          env=_env(**env))


def test_every_module_that_runs_a_command_is_listed():
    found = {".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__main__")
             for stage in ("pipeline", "model", "eval", "infra") for path in (REPO / stage).rglob("*.py")
             if "run_cli(" in path.read_text()}
    # core.cli defines run_cli; the Flex Template's entry file is run as a file (test_cli).
    assert found - {"core.cli", "infra.flex_launcher"} == set(ENTRY_POINTS)


@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_help_is_on_stdout_alone_and_loads_no_heavy_library(command, tmp_path):
    loaded = tmp_path / "loaded"
    done = _run(["-c", AS_MAIN, command, "--help"], LOADED_TO=str(loaded), HEAVY=",".join(HEAVY))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"usage: python -m {CONFIG_OF.get(command, command)}")
    assert loaded.read_text() == ""


def _misspelt_argv(command: str) -> tuple[list[str], str]:
    """The command's required flags (dummy values) and one of its optional flags misspelt."""
    parser = config_parser(_config(CONFIG_OF.get(command, command)), "p", "")
    required = [arg for action in parser._actions if action.required and action.option_strings
                for arg in (action.option_strings[0], "x")]
    optional = next(option for action in parser._actions if not action.required
                    for option in action.option_strings if option.startswith("--") and option != "--help")
    misspelt = optional[:-1]   # e.g. --max-triplet for --max-triplets
    return [*required, *(["layout"] if command == "infra.submit" else []), misspelt, "1"], misspelt


@pytest.mark.parametrize("command", ENTRY_POINTS)
def test_a_misspelt_flag_is_one_error_line_and_exit_2(command):
    argv, misspelt = _misspelt_argv(command)
    done = _run(["-m", command, *argv])
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error:")
    assert re.search(re.escape(misspelt) + r"\b", done.stderr)
    assert done.stdout == ""


def _fake_minilm_extra(root: Path) -> Path:
    """Stand-ins for the minilm extra (sentence_transformers and torch): importing torch leaves
    a mark, so a test sees whether anything imported it."""
    (root / "sentence_transformers").mkdir(parents=True)
    (root / "sentence_transformers" / "__init__.py").write_text("")
    (root / "torch").mkdir()
    (root / "torch" / "__init__.py").write_text("")
    (root / "torch" / "_dynamo.py").write_text("")
    return root


@pytest.mark.slow   # seconds of a real Beam or tf.data run: the full tier
def test_importing_model_and_the_eval_jobs_loads_no_pytorch_even_with_the_extra(tmp_path):
    fake = _fake_minilm_extra(tmp_path / "site")
    done = _run(["-c", "import sys, importlib.util\n"
                       "assert importlib.util.find_spec('sentence_transformers')\n"
                       "import model, model.encoding.encoder, model.encoding.encoders, model.embed, eval.scb, "
                       "eval.triplets, eval.sick, eval.all, eval.benchmark, eval.qs3m\n"
                       "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorflow')))"],
                PYTHONPATH=os.pathsep.join([str(REPO), str(fake)]))
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_choosing_minilm_loads_pytorch_before_tensorflow_or_says_why_it_cannot(tmp_path):
    fake = _fake_minilm_extra(tmp_path / "site")
    chosen = _run(["-c", "import sys\nfrom model.encoding.encoders import Methods\n"
                         "Methods(encoders=('minilm',)).specs()\nprint('torch._dynamo' in sys.modules)"],
                  PYTHONPATH=os.pathsep.join([str(REPO), str(fake)]))
    assert (chosen.returncode, chosen.stdout.strip()) == (0, "True"), chosen.stderr
    # TensorFlow first (a stand-in: the check reads sys.modules): one clear error, not a segfault.
    too_late = _run(["-c", "import sys, types\nsys.modules['tensorflow'] = types.ModuleType('tensorflow')\n"
                           "from model.encoding.encoders import EncoderSpec, EncoderSpecError, load_encoder\n"
                           "try:\n    load_encoder(EncoderSpec.parse('minilm'))\n"
                           "except EncoderSpecError as error:\n    print(error)"],
                    PYTHONPATH=os.pathsep.join([str(REPO), str(fake)]))
    assert too_late.returncode == 0 and "before importing tensorflow" in too_late.stdout, too_late.stderr
    without_extra = _run(["-c", "import sys, types\nsys.modules['tensorflow'] = types.ModuleType('tensorflow')\n"
                                "sys.modules['sentence_transformers'] = None   # not installed\n"
                                "from model.encoding.encoders import EncoderSpec, EncoderSpecError, load_encoder\n"
                                "try:\n    load_encoder(EncoderSpec.parse('minilm'))\n"
                                "except EncoderSpecError as error:\n    print(error)"])
    assert "needs the optional extra" in without_extra.stdout, without_extra.stderr


def _one_error_line(done: subprocess.CompletedProcess, *named: str) -> None:
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error:"), done.stderr[-3000:]
    for text in named:
        assert text in done.stderr


def test_an_unknown_runner_is_one_line_before_anything_is_written(tmp_path):
    out = tmp_path / "out"
    done = _run(["-m", "pipeline.run", "--input", str(tmp_path / "dump.xml.bz2"), "--output", str(out),
                 "--runner", "DataFlowRunnr"])
    _one_error_line(done, "--runner DataFlowRunnr: not a Beam runner", "DataflowRunner")
    assert not out.exists()


@pytest.mark.parametrize("command", ["pipeline.run", "eval.all"])   # one shared check (core.cli)
def test_dataflow_without_its_options_is_one_line_before_anything_is_written(tmp_path, command):
    out = tmp_path / "out"
    # An empty gcloud configuration, so no region comes from this machine's gcloud
    done = _run(["-m", command, *(["--data", str(tmp_path)] if command == "eval.all" else []), "--output", str(out),
                 "--runner", "DataflowRunner"], CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    _one_error_line(done, "--runner DataflowRunner: Beam refuses the Dataflow options", "--temp_location",
                    "--project", "--region")
    assert not out.exists()


@pytest.mark.parametrize("command", ["pipeline.run", "eval.all"])
def test_a_bad_value_of_a_beam_option_is_one_line_naming_its_choices(tmp_path, command):
    out = tmp_path / "out"
    done = _run(["-m", command, *(["--data", str(tmp_path)] if command == "eval.all" else []), "--output", str(out),
                 "--direct_running_mode=multiprocessing"])
    _one_error_line(done, "Beam pipeline option --direct_running_mode: invalid choice: 'multiprocessing'",
                    "'in_memory', 'multi_threading', 'multi_processing'")
    assert not out.exists()


@pytest.mark.parametrize("command", ["pipeline.run", "pipeline.benchmark", "eval.all", "eval.scb", "model.embed"])
def test_the_help_of_a_command_that_runs_beam_says_where_beams_options_are_documented(command):
    done = _run(["-m", command, "--help"])
    text = " ".join(done.stdout.split())
    assert done.returncode == 0 and "Every other flag is one of Beam's pipeline options" in text
    assert "--direct_num_workers" in text and "docs/pipeline.md" in text
    assert "https://beam.apache.org/documentation/programming-guide/#configuring-pipeline-options" in done.stdout


def test_a_misspelt_required_flag_names_the_flag_meant(tmp_path):
    done = _run(["-m", "eval.all", "--data", str(tmp_path), "--ouput", str(tmp_path / "report")])
    _one_error_line(done, "unknown flag --ouput (did you mean --output?)")


def test_an_encoder_typo_is_refused_before_the_data_is_read(tmp_path):
    done = _run(["-m", "eval.all", "--data", str(tmp_path / "no-run"), "--output", str(tmp_path / "report"),
                 "--encoder", "mean-vectorz"])
    _one_error_line(done, "unknown encoder spec 'mean-vectorz'")   # not the missing run: the spec comes first
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("command,flag_name", [   # the two that load TensorFlow or Beam first: the full tier
    pytest.param("model.train", "--model-dir", marks=pytest.mark.slow), ("eval.all", "--output"),
    pytest.param("model.embed", "--output", marks=pytest.mark.slow), ("model.export", "--output")])
def test_an_output_folder_that_is_a_file_is_one_line(tmp_path, command, flag_name):
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    source = tmp_path / "sentences.txt"
    source.write_text("A sentence.\n")
    argv = {"model.train": ["--data", str(tmp_path), "--model-dir", str(a_file)],
            "eval.all": ["--data", str(tmp_path), "--output", str(a_file)],
            "model.embed": ["--model-dir", str(tmp_path), "--input", str(source), "--output", str(a_file)],
            "model.export": ["--model-dir", str(tmp_path), "--output", str(a_file)]}[command]
    _one_error_line(_run(["-m", command, *argv]), f"{flag_name} {a_file} is a file, not a folder")
    assert a_file.read_text() == "mine"


def test_helps_examples_are_lines_of_their_own_in_the_users_words():
    """`model.export --help`: its two usage examples as written (not re-wrapped into one
    paragraph), and none of the code's own names; `model.train --help`: its flags in groups."""
    done = _run(["-m", "model.export", "--help"], COLUMNS="100")
    assert (done.returncode, done.stderr) == (0, "")
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert [line.split(" [")[0] for line in lines if line.startswith("python -m model.export")] == [
        "python -m model.export --model-dir MODEL --output DIR",
        "python -m model.export --model-dir MODEL --format onnx"]
    assert not re.search(r"COMMAND_CLAIM|end_claim|INPUTS|model\.formats", done.stdout)
    assert "(default: None)" not in done.stdout
    train = _run(["-m", "model.train", "--help"], COLUMNS="100")
    assert (train.returncode, train.stderr) == (0, "")
    assert {"inputs:", "network:", "optimizer:", "runtime:"} <= set(train.stdout.splitlines())
    assert "(default: None)" not in train.stdout
