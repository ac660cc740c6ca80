"""The Makefile's set-up, as `make -n` prints it (nothing run, no venv made): the editable install
keeps setuptools' 10-line notice off the terminal."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# What setuptools' editable_wheel warns after every editable install, as recent setuptools (the
# build backend pip's isolated build fetches for a setup.py project) words it:
# `InformationOnly.emit("Editable installation.", details)`, a UserWarning of about 10 lines. The
# filter matches a message's start; the details' layout here is approximate. (Setuptools 65, the
# venv's own, warns the details alone; pip does not build with it.)
NOTICE = "\n".join([
    "Editable installation.",
    "!!",
    "",
    "        " + "*" * 80,
    "",
    "        Please be careful with folders in your working directory with the same",
    "        name as your package as they may take precedence during imports.",
    "",
    "        " + "*" * 80,
    "",
    "!!",
])


def _editable_install_env(tmp_path) -> dict[str, str]:
    """The variables the Makefile sets on its `pip install -e` line, for a venv that does not
    exist (so `make -n` prints every step of `$(VENV)/.installed`)."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    venv = tmp_path / "venv"
    printed = subprocess.run(["make", "-n", f"VENV={venv}", f"{venv}/.installed"], cwd=REPO, capture_output=True,
                             text=True, check=True, timeout=30).stdout
    (line,) = [line for line in printed.splitlines() if " pip install " in line and " -e " in line]
    words = shlex.split(line)
    assignments = words[:next(index for index, word in enumerate(words) if "=" not in word)]
    return dict(word.split("=", 1) for word in assignments)


def _warn(env: dict[str, str]) -> str:
    """The stderr of a Python that warns the notice as setuptools does, under `env`."""
    code = f"import warnings\nclass InformationOnly(UserWarning): pass\nwarnings.warn({NOTICE!r}, InformationOnly)"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONWARNINGS": "", **env},
                          capture_output=True, text=True, check=True, timeout=30).stderr


def test_the_editable_install_silences_setuptools_notice(tmp_path):
    env = _editable_install_env(tmp_path)
    assert "PYTHONWARNINGS" in env, "the Makefile's editable install sets no PYTHONWARNINGS"
    assert "Editable installation." in _warn({}), "the notice shows without the filter"
    assert _warn(env) == ""
