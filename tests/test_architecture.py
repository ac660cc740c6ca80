"""The codebase's shape, read from the source (no imports): the stages depend one way
(core <- pipeline <- model <- eval <- infra; the shared base `core` under them all), no module
imports itself back through others (function-level imports included), neither the pipeline nor
core imports TensorFlow, and each contract (split names, dataset names, feature keys) is defined
once, by its producer."""
import ast
import graphlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STAGES = ("core", "pipeline", "model", "eval", "infra")
TENSORFLOW = ("tensorflow", "tensorflow_text", "keras", "tensorflow_hub")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {_module_name(path): path for stage in STAGES for path in sorted((REPO / stage).rglob("*.py"))}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in SOURCES.items()}


def _imports(module: str) -> set[str]:
    """Every module `module` imports, anywhere in its body (relative imports resolved)."""
    package = module if SOURCES[module].name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in SOURCES}
    return found


GRAPH = {module: {name for name in _imports(module) if name in SOURCES and name != module} for module in SOURCES}


def test_the_source_was_found():
    assert {"pipeline.run", "model.train", "eval.scb", "infra.submit", "model.qs3m.train"} <= set(GRAPH)


def test_no_import_cycle():
    graphlib.TopologicalSorter(GRAPH).prepare()   # raises CycleError naming the cycle


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_only_itself_and_the_stages_below(stage):
    allowed = set(STAGES[:STAGES.index(stage) + 1])
    upward = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() if module.split(".")[0] == stage
                    for target in targets if target.split(".")[0] not in allowed)
    assert upward == []


# Inside `model/`, the rooms depend one way too: the network, what training needs around it, the
# written forms of an encoder, the encoders the jobs score; the entry points (`model.train`,
# `model.export`, ...) and `model.qs3m` at the top; `model.config` (the flags) and
# `model.similarity` and `model.checkpoints` (what each `--encoder` checkpoint is) are the shared
# facts every room may read.
MODEL_ROOMS = ("model.net", "model.training", "model.formats", "model.encoding")
MODEL_SHARED = ("model", "model.config", "model.similarity", "model.checkpoints")


def _room(module: str) -> str | None:
    return next((room for room in MODEL_ROOMS if module == room or module.startswith(room + ".")), None)


# `pipeline/` is the Beam job alone, in the rooms of its stages (docs/pipeline.md): read (dump ->
# pages), parse (wikitext -> sentences), triplets (the paper's rules), write (the run's files); its
# entry points (`pipeline.run` launches and watches, `pipeline.publish`, `pipeline.benchmark`) on top.
PIPELINE_ROOMS = ("pipeline.read", "pipeline.parse", "pipeline.triplets", "pipeline.write")
# What the other stages may use of the job: its launch (`pipeline.run`, e.g. a Flex Template's
# launcher), and the embedded dump and the dump writers that size a run (`infra.sizing`).
PIPELINE_FOR_OTHERS = ("pipeline", "pipeline.run", "pipeline.read.dumps", "pipeline.read.dump_writers")


def test_pipeline_is_the_job_in_the_rooms_of_its_stages():
    top = sorted(module for module in SOURCES if module.startswith("pipeline.") and module.count(".") == 1)
    assert top == ["pipeline.benchmark", "pipeline.parse", "pipeline.publish", "pipeline.read", "pipeline.run",
                   "pipeline.triplets", "pipeline.write"]
    upward = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() for target in targets
                    if module.startswith(PIPELINE_ROOMS) and target.startswith("pipeline.")
                    and not target.startswith(PIPELINE_ROOMS))
    assert upward == []   # a room never imports an entry point


def test_the_other_stages_use_the_pipeline_only_to_run_it():
    reached = sorted(f"{module} -> {target}" for module, targets in GRAPH.items()
                     if module.split(".")[0] in ("model", "eval", "infra")
                     for target in targets if target.split(".")[0] == "pipeline" and target not in PIPELINE_FOR_OTHERS)
    assert reached == []


def test_model_is_grouped_into_its_rooms():
    top = sorted(module for module in SOURCES if module.count(".") == 1 and module.startswith("model.")
                 and _room(module) is None and module not in MODEL_SHARED)
    assert set(MODEL_ROOMS) <= set(SOURCES)
    assert top == ["model.benchmark", "model.curves", "model.embed", "model.export", "model.pretrained",
                   "model.qs3m", "model.soup", "model.train"]


@pytest.mark.parametrize("room", MODEL_ROOMS)
def test_a_model_room_imports_only_the_shared_facts_and_the_rooms_below(room):
    allowed = set(MODEL_ROOMS[:MODEL_ROOMS.index(room) + 1])
    upward = sorted(f"{module} -> {target}" for module, targets in GRAPH.items() if _room(module) == room
                    for target in targets if target.startswith("model")
                    and target not in MODEL_SHARED and _room(target) not in allowed)
    assert upward == []


def test_the_shared_facts_of_model_import_no_room():
    assert sorted(f"{module} -> {target}" for module in MODEL_SHARED for target in GRAPH[module]
                  if target.startswith("model.")) == ["model.config -> model.checkpoints",
                                                      "model.config -> model.similarity"]


def test_the_pipeline_never_imports_tensorflow():
    offending = sorted(f"{module} -> {name}" for module in SOURCES if module.split(".")[0] in ("core", "pipeline")
                       for name in _imports(module) if name.split(".")[0] in TENSORFLOW)
    assert offending == []


CONTRACTS = {
    "core.splits": ("SPLITS",),
    "pipeline.triplets.make": ("Triplet",),
    "core.records": ("NegativeStrategy", "TripletKind", "TRIPLET_DATASETS", "SENTENCE_DATASETS",
                     "DATASET_OF_STRATEGY", "TITLES_DATASET", "PAPER_DATASET", "ROLES", "TRIPLET_FEATURES",
                     "BYTES_FEATURES", "INT64_FEATURES", "ScbRecord", "PassagesRecord", "RecordError", "SCB",
                     "PASSAGES", "DEAD_LETTERS"),
    "core.published": ("MANIFEST", "MANIFEST_VERSION", "Manifest", "Run"),
    "core.folders": ("LOCK", "READERS", "COMMAND_CLAIM"),
}


@pytest.mark.parametrize("name, owner", [(name, owner) for owner, names in CONTRACTS.items() for name in names])
def test_each_contract_is_defined_once_by_its_producer(name, owner):
    definers = sorted(module for module, tree in TREES.items() for node in ast.walk(tree)
                      if (isinstance(node, ast.ClassDef) and node.name == name)
                      or (isinstance(node, (ast.Assign, ast.AnnAssign))
                          and any(isinstance(target, ast.Name) and target.id == name
                                  for target in (node.targets if isinstance(node, ast.Assign) else [node.target]))))
    assert definers == [owner]


def _contract_literals() -> dict[str, str]:
    """{literal: its one defining module}: the dataset names, the negative strategies, the manifest's
    file name and the triplet features a consumer could spell out instead of importing."""
    from core import published, records
    from core.records import NegativeStrategy

    literals = dict.fromkeys(records.TRIPLET_DATASETS, "core.records")
    literals[published.MANIFEST] = "core.published"
    literals |= dict.fromkeys((strategy.value for strategy in NegativeStrategy), "core.records")
    # Every feature name but the generic words that also name other things (a title, an article id).
    literals |= dict.fromkeys((name for name in records.TRIPLET_FEATURES
                               if name not in ("title", "kind", "strategy", "article_id")), "core.records")
    return literals


def test_the_contracts_literals_are_spelt_out_only_where_they_are_defined():
    restated = sorted(f"{module}:{node.lineno} spells {node.value!r} ({owner} defines it)"
                      for literal, owner in _contract_literals().items()
                      for module, tree in TREES.items() if module != owner for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and node.value == literal)
    assert restated == []


def test_the_job_does_not_load_the_dump_writers():
    """What `python -m pipeline.run` loads (and so every Beam worker) excludes the writers of test dumps."""
    loaded, todo = set(), ["pipeline.run"]
    while todo:
        module = todo.pop()
        if module not in loaded:
            loaded.add(module)
            todo += GRAPH[module]
    assert "pipeline.read.pages" in loaded and "pipeline.read.dump_writers" not in loaded


# Folders are owned in one place: `core.folders` claims, locks, leases and tells a live owner from
# a dead one for run folders, model dirs, exports, reports and temporary folders; `model.training.claim`
# adds what a model dir's claim checks of the training's inputs.
FOLDER_OWNERS = ("core.folders", "model.training.claim")
OWNING = {"claim", "claiming", "lease", "lock", "owner", "alive", "stale", "tempdir", "reading"}


def test_folders_are_claimed_leased_and_owned_in_one_module_and_the_trainers_claim():
    owning = sorted(f"{module}.{node.name}" for module, tree in TREES.items() if module not in FOLDER_OWNERS
                    for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and OWNING & set(node.name.lower().split("_")))
    assert owning == []


def test_one_way_launches_a_beam_job():
    """`core.jobserver.run_job` is the only caller of a Beam pipeline's `run()` (temporary folder, job
    server, cancel on error, Ctrl-C, one error line): a command that launched its job by hand skipped them."""
    launchers = sorted(module for module, tree in TREES.items() for node in ast.walk(tree)
                       if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                       and node.func.attr == "run" and isinstance(node.func.value, ast.Name)
                       and node.func.value.id == "pipeline")
    assert launchers == ["core.jobserver"]


def _in_function_imports_of_the_project() -> list[str]:
    """`module:line` of every import of a project module inside a function (each import once)."""
    found = {}
    for module, tree in TREES.items():
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(function):
                    names = ([node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                             else [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
                    if any(name.split(".")[0] in STAGES for name in names):
                        found[f"{module}:{node.lineno}"] = True
    return sorted(found)


def test_commands_import_their_job_once_and_modules_import_at_the_top():
    """An entry point imports its job module once its flags are parsed; project modules are imported
    at the top, but for the few that would load TensorFlow where a JAX run must not, or Keras before
    its backend is chosen (each says why where it imports)."""
    assert len(_in_function_imports_of_the_project()) <= 60
