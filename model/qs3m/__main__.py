"""`python -m model.qs3m`: the QS3M trainer (`model.qs3m.train`)."""
import sys

from model.qs3m.train import main
from pipeline.cli import run_cli

sys.exit(run_cli(main))
