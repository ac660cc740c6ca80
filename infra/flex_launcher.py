"""Entry file of the Dataflow Flex Template (FLEX_TEMPLATE_PYTHON_PY_FILE in infra/Dockerfile).

Dataflow's launcher runs a .py file with the template parameters as `--name=value` flags; this
hands them to `pipeline.run`'s command line, so every transform stays in the installed `pipeline`
package (importable on workers) rather than in `__main__`.
"""
import sys

from core.cli import run_cli
from pipeline.run import main

if __name__ == "__main__":
    sys.exit(run_cli(main))
