"""`python -m model.qs3m`: the QS3M trainer (`model.qs3m.train`)."""
import sys

from core.cli import run_cli
from model.qs3m.train import main

sys.exit(run_cli(main))
