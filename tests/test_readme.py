"""The README as a user reads it: its "Using the results from your own code" snippets run as they
stand on a real pipeline run and trained model, and every repository file the docs name exists."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
SECTION = "## Using the results from your own code"
DOCS = [REPO / "README.md", REPO / "infra" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _snippets() -> list[str]:
    section = README[README.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_snippets_run_on_a_real_run_and_model(embedded_pipeline_output, tiny_model, capsys):
    from model.encoding.encoder import load_encoder

    shards, inference, plain = _snippets()
    names = {"OUT": str(embedded_pipeline_output), "MODEL": tiny_model}

    exec(shards, dict(names))
    printed = capsys.readouterr().out
    assert all(re.search(f"'{key}': b['\"]", printed) for key in ("anchor", "positive", "negative", "title"))

    exec(inference, dict(names))
    dim = load_encoder(tiny_model).dim
    assert sorted(capsys.readouterr().out.split("\n")) == ["", f"s1 ({dim},)", f"s2 ({dim},)"]

    exec(plain, dict(names))   # asserts Keras' vectors are TensorFlow's


def test_every_repository_file_the_docs_name_exists():
    rooted = re.compile(r"(?<![\w/.:-])((?:pipeline|model|eval|infra|tests|docs)/[\w./-]*?"
                        r"(?:\.(?:py|md|yaml|json|txt)|Dockerfile))(?![\w/])")
    bare = re.compile(r"`(\w+\.py)`")
    files = {path.name for path in REPO.rglob("*.py") if ".venv" not in path.parts}
    missing = sorted({f"{doc.name}: {path}" for doc in DOCS for path in rooted.findall(doc.read_text())
                      if not (REPO / path).exists()} |
                     {f"{doc.name}: {name}" for doc in DOCS for name in bare.findall(doc.read_text())
                      if name not in files})
    assert missing == []
