"""infra/: the submission wrapper, the Vertex AI and Flex Template specs, the container recipe.

Nothing here calls Google Cloud: Dataflow options are checked with Beam's own validator, the
specs with the Vertex AI / Dataflow client libraries' message types.
"""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import apache_beam
import pytest
import yaml
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    WorkerOptions,
)
from apache_beam.options.pipeline_options_validator import PipelineOptionsValidator
from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
from google.cloud.aiplatform_v1.types import AcceleratorType, CustomJobSpec
from google.cloud.dataflow_v1beta3.types import TemplateMetadata
from google.protobuf import json_format

from infra import submit
from infra.recipe import RECIPES
from model.training.model_dir import ENCODER

REPO = Path(submit.__file__).resolve().parent.parent
CLOUD = ["--project", "wikisim-demo", "--region", "europe-west4", "--bucket", "wikisim-data"]


def printed_commands(capsys, argv: list[str]) -> list[list[str]]:
    submit.main([*argv, *CLOUD, "--dry-run"])
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    return [shlex.split(line) for line in lines]


def beam_errors(args: list[str]) -> tuple[PipelineOptions, list[str]]:
    """Beam's validation as the DataflowRunner would run it (dry_run: no bucket look-ups)."""
    options = PipelineOptions([*args, "--dry_run=True"])
    return options, PipelineOptionsValidator(options, DataflowRunner()).validate()


def as_custom_job_spec(spec: dict):
    return json_format.ParseDict(spec, CustomJobSpec.pb(CustomJobSpec()))


def test_pipeline_dry_run_prints_a_dataflow_submission_beam_accepts(capsys):
    [command] = printed_commands(capsys, ["pipeline"])
    assert command[:3] == ["python", "-m", "pipeline.run"]
    assert command[command.index("--output") + 1] == "gs://wikisim-data/wikisim/enwiki-latest/data"
    assert command[command.index("--input") + 1].startswith("gs://wikisim-data/dumps/")

    from pipeline.run import parse_args as pipeline_args

    config, beam_args = pipeline_args(command[3:])  # pipeline.run's own flags take the rest
    assert config.output == "gs://wikisim-data/wikisim/enwiki-latest/data"
    assert config.input.startswith("gs://wikisim-data/dumps/")
    options, errors = beam_errors(beam_args)
    assert errors == []
    cloud = options.view_as(GoogleCloudOptions)
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    assert (cloud.project, cloud.region) == ("wikisim-demo", "europe-west4")
    assert cloud.temp_location.startswith("gs://wikisim-data/")
    assert cloud.staging_location.startswith("gs://wikisim-data/")
    assert re.fullmatch(PipelineOptionsValidator.JOB_PATTERN, cloud.job_name)
    assert options.view_as(WorkerOptions).max_num_workers == submit.CloudConfig.max_num_workers
    setup_file = options.view_as(SetupOptions).setup_file
    assert (REPO / setup_file).is_file()  # the wrapper runs commands from the repository root


def test_container_mode_ships_the_image_instead_of_setup_py(capsys):
    image = "europe-west4-docker.pkg.dev/wikisim-demo/wikisim/wikisim:v1"
    [command] = printed_commands(capsys, ["pipeline", "--container", "--image", image])
    options, errors = beam_errors(command[3:])
    assert errors == []
    assert options.view_as(WorkerOptions).sdk_container_image == image
    assert options.view_as(SetupOptions).setup_file is None


def test_scb_dry_run_submits_eval_scb_to_dataflow(capsys):
    from eval import scb as eval_scb

    [command] = printed_commands(capsys, ["scb"])
    assert command[:3] == ["python", "-m", "eval.scb"]
    config, beam_args = eval_scb.parse_args(command[3:])  # eval.scb's own flags take the rest
    assert config.data == "gs://wikisim-data/wikisim/enwiki-latest/data"
    assert config.output == "gs://wikisim-data/wikisim/enwiki-latest/eval/scb"
    assert config.methods.model_dirs == ("triplets-sen=gs://wikisim-data/wikisim/enwiki-latest/models/triplets-sen",)
    assert "mean-vectors:gs://wikisim-data/vectors/glove.840B.300d.txt" in config.methods.encoders
    options, errors = beam_errors(beam_args)
    assert errors == []
    assert options.view_as(GoogleCloudOptions).job_name == "wikisim-scb-enwiki-latest"
    # Scoring encodes with TensorFlow, which setup.py's install_requires leaves out: the image runs it.
    assert options.view_as(WorkerOptions).sdk_container_image.endswith("/wikisim/wikisim:latest")
    assert options.view_as(SetupOptions).setup_file is None


@pytest.mark.parametrize(
    "flag, value, named",
    [
        ("--bucket", "Not_A_Bucket", "temp_location"),
        ("--project", "123456", "Project ID"),
        ("--max-num-workers", "0", "max_num_workers"),
    ],
)
def test_invalid_cloud_variables_stop_before_submission(capsys, flag, value, named):
    argv = ["pipeline", *CLOUD, flag, value, "--dry-run"]
    with pytest.raises(SystemExit) as stop:
        submit.main(argv)
    assert named in str(stop.value) and value in str(stop.value)
    assert capsys.readouterr().out == ""  # nothing printed as if it were runnable


@pytest.mark.parametrize(
    "accelerator, strategy", [("gpu", "one_device"), ("multi-gpu", "mirrored"), ("tpu", "tpu"),
                              ("jax-gpu", "data-parallel")]
)
def test_repository_vertex_specs_are_custom_job_specs(accelerator, strategy):
    raw = yaml.safe_load(submit.VERTEX_SPECS[accelerator].read_text())
    message = as_custom_job_spec(raw)  # unknown fields or accelerator names raise here
    [pool] = message.worker_pool_specs
    machine = pool.machine_spec
    assert message.base_output_directory.output_uri_prefix == "${MODEL_DIR}"
    assert machine.machine_type and pool.replica_count == 1
    assert pool.WhichOneof("task") == "container_spec" and pool.container_spec.image_uri
    assert list(pool.container_spec.command) == ["python", "-m", "model.train"]
    assert f"--distribution-strategy={strategy}" in pool.container_spec.args
    if accelerator == "tpu":
        assert machine.machine_type.startswith("ct5lp-") and machine.tpu_topology
    else:
        gpus = machine.accelerator_count
        assert machine.accelerator_type != AcceleratorType.ACCELERATOR_TYPE_UNSPECIFIED
        assert gpus == 1 if accelerator == "gpu" else gpus > 1


@pytest.mark.parametrize("accelerator", sorted(submit.VERTEX_SPECS))
def test_train_dry_run_writes_the_filled_spec_and_prints_gcloud(capsys, tmp_path, monkeypatch, accelerator):
    [command] = printed_commands(
        capsys, ["train", "--accelerator", accelerator, "--spec-dir", str(tmp_path), "--run", "enwiki-2026"]
    )
    assert command[:4] == ["gcloud", "ai", "custom-jobs", "create"]
    assert "--project=wikisim-demo" in command and "--region=europe-west4" in command
    config = Path(next(arg for arg in command if arg.startswith("--config=")).split("=", 1)[1])
    text = config.read_text()
    assert "${" not in text
    pool = as_custom_job_spec(yaml.safe_load(text)).worker_pool_specs[0]
    args = list(pool.container_spec.args)
    assert "--data=gs://wikisim-data/wikisim/enwiki-2026/data" in args
    assert pool.container_spec.image_uri.startswith("europe-west4-docker.pkg.dev/wikisim-demo/wikisim/")
    # The container runs `python -m model.train` unchanged: its own parser takes the args, and
    # the model dir from the AIP_MODEL_DIR Vertex AI sets from the spec's base output directory.
    from model.config import parse_args as train_args

    monkeypatch.setenv("AIP_MODEL_DIR", "gs://wikisim-data/wikisim/enwiki-2026/models/triplets-sen/model/")
    config = train_args(args)
    assert config.runtime.model_dir == "gs://wikisim-data/wikisim/enwiki-2026/models/triplets-sen"
    assert config.inputs.data == "gs://wikisim-data/wikisim/enwiki-2026/data"
    assert config.inputs.embeddings == "gs://wikisim-data/vectors/glove.840B.300d.txt"
    assert config.runtime.distribution_strategy == {"gpu": "one_device", "multi-gpu": "mirrored", "tpu": "tpu",
                                            "multi-worker": "multi_worker", "jax-gpu": "data-parallel"}[accelerator]
    # the recipe's flags for this machine, not make scale's 2-core ones: whole passes, capped by a budget
    assert (config.optimizer.steps, config.optimizer.epochs) == (None, 10) and config.runtime.budget_minutes


# accelerator -> (replicas per worker pool, image variant, strategy, trainer flags the spec adds)
SPEC_SHAPES = {
    "gpu": ([1], "wikisim-gpu", "one_device", {}),
    "multi-gpu": ([1], "wikisim-gpu", "mirrored", {}),
    "multi-worker": ([1, 3], "wikisim", "multi_worker", {}),
    "tpu": ([1], "wikisim-tpu", "tpu", {"static_shapes": True}),
    "jax-gpu": ([1], "wikisim-jax-gpu", "data-parallel", {"backend": "jax"}),
}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("accelerator", sorted(submit.VERTEX_SPECS))
def test_every_vertex_spec_renders_with_its_machines_recipe(capsys, tmp_path, monkeypatch, accelerator, recipe):
    from model.config import parse_args as train_args

    dataset = RECIPES[recipe].dataset
    [command] = printed_commands(capsys, ["train", "--accelerator", accelerator, "--recipe", recipe, "--dataset",
                                          dataset, "--spec-dir", str(tmp_path), "--run", "r1"])
    spec = yaml.safe_load(Path(next(a for a in command if a.startswith("--config=")).split("=", 1)[1]).read_text())
    message = as_custom_job_spec(spec)
    replicas, image, strategy, spec_flags = SPEC_SHAPES[accelerator]
    model_dir = f"gs://wikisim-data/wikisim/r1/models/{recipe}"                 # the recipe's own folder
    assert f"--display-name=wikisim-train-r1-{recipe}-{accelerator}" in command
    assert [pool.replica_count for pool in message.worker_pool_specs] == replicas
    assert message.base_output_directory.output_uri_prefix == model_dir      # -> AIP_MODEL_DIR etc.
    monkeypatch.setenv("AIP_MODEL_DIR", f"{model_dir}/model/")
    recipe_args = RECIPES[recipe].arguments(accelerator, models="gs://wikisim-data/wikisim/r1/models")
    assert recipe_args != RECIPES[recipe].arguments("cpu")                   # not make scale's 2-core recipe
    for pool in message.worker_pool_specs:
        assert pool.container_spec.image_uri == f"europe-west4-docker.pkg.dev/wikisim-demo/wikisim/{image}:latest"
        args = list(pool.container_spec.args)
        assert args[-len(recipe_args):] == recipe_args                      # this machine's flags of the recipe
        assert list(pool.container_spec.args) == list(message.worker_pool_specs[0].container_spec.args)
        config = train_args(args)
        flags = config.flags()
        assert (flags["model_dir"], flags["dataset"], flags["distribution_strategy"]) == (model_dir, dataset, strategy)
        recipe_flags = train_args(["--data", "d", "--model-dir", "m", *recipe_args]).flags()
        for name in ("shuffle_buffer", "epochs", "steps", "budget_minutes", "learning_rate_half_life",
                     "encoder", "batch_size", "evaluation_triplets", "teacher"):
            assert flags[name] == recipe_flags[name], name
        if RECIPES[recipe].teacher:                                           # the teacher recipe's folder of this run
            assert flags["teacher"] == f"gs://wikisim-data/wikisim/r1/models/{RECIPES[recipe].teacher}"
        assert flags["steps"] is None and flags["budget_minutes"]             # whole passes, capped
        for name, value in spec_flags.items():
            assert flags[name] == value


def test_no_two_recipes_share_an_output_folder_or_a_job_name(capsys, tmp_path):
    seen: dict[tuple, str] = {}
    for recipe in RECIPES:
        for accelerator in submit.VERTEX_SPECS:
            [command] = printed_commands(capsys, ["train", "--accelerator", accelerator, "--recipe", recipe,
                                                  "--dataset", RECIPES[recipe].dataset, "--spec-dir", str(tmp_path),
                                                  "--run", "r1"])
            spec = yaml.safe_load(Path(next(a for a in command if a.startswith("--config="))
                                       .split("=", 1)[1]).read_text())
            folder = spec["baseOutputDirectory"]["outputUriPrefix"]
            name = next(a for a in command if a.startswith("--display-name="))
            for key in (("folder", folder, accelerator), ("name", name)):
                assert seen.setdefault(key, recipe) == recipe, (key, recipe)
    assert len({key[1] for key in seen if key[0] == "folder"}) == len(RECIPES)


def test_infra_readme_states_what_every_spec_runs():
    from infra.recipe import recipes_table

    assert recipes_table() in (Path(submit.INFRA_DIR) / "README.md").read_text()


def test_a_recipe_of_another_dataset_is_refused(capsys):
    from core.cli import UsageError

    with pytest.raises(UsageError, match="--recipe for --dataset triplets-titles must be one of triplets-titles"):
        submit.main(["train", "--dataset", "triplets-titles", "--recipe", "minilm-sen", *CLOUD, "--dry-run"])


def valid_spec() -> dict:
    return {
        "workerPoolSpecs": [
            {
                "machineSpec": {"machineType": "g2-standard-8", "acceleratorType": "NVIDIA_L4", "acceleratorCount": 1},
                "replicaCount": 1,
                "containerSpec": {"imageUri": "image", "command": ["python"]},
            }
        ]
    }


def test_spec_checker_accepts_a_valid_spec():
    assert submit.custom_job_spec_errors(valid_spec()) == []


@pytest.mark.parametrize(
    "break_spec, expected",
    [
        (lambda s: s["workerPoolSpecs"][0]["machineSpec"].update(acceleratorType="NVIDIA_GTX_1080"), "Invalid enum"),
        (lambda s: s["workerPoolSpecs"][0]["containerSpec"].pop("imageUri"), "imageUri is required"),
        (lambda s: s["workerPoolSpecs"][0].pop("containerSpec"), "containerSpec or pythonPackageSpec"),
        (lambda s: s["workerPoolSpecs"][0]["machineSpec"].pop("acceleratorCount"), "go together"),
        (lambda s: s["workerPoolSpecs"][0].update(replicaCount=2), "replicaCount is 2"),
        (lambda s: s["workerPoolSpecs"][0].update(machineSpc={}), "no field named"),
        (
            lambda s: s["workerPoolSpecs"][0].update(machineSpec={"machineType": "ct5lp-hightpu-4t"}),
            "tpuTopology is required",
        ),
    ],
)
def test_spec_checker_names_what_vertex_would_reject(break_spec, expected):
    spec = valid_spec()
    break_spec(spec)
    errors = submit.custom_job_spec_errors(spec)
    assert any(expected in error for error in errors), errors


def test_flex_template_metadata_is_dataflow_template_metadata():
    metadata = submit.flex_metadata()
    message = json_format.ParseDict(metadata, TemplateMetadata.pb(TemplateMetadata()))
    assert message.name
    names = {parameter.name for parameter in message.parameters}
    from core.cli import config_parser
    from pipeline.run import PipelineConfig

    flags = {action.dest for action in config_parser(PipelineConfig, "", "")._actions if action.option_strings}
    assert names == flags - {"help"}                 # the template exposes every flag of the pipeline
    for parameter in message.parameters:
        assert parameter.label and parameter.help_text
        for regex in parameter.regexes:
            example = re.search(r"Example: (\S+)", parameter.help_text)
            if example:
                assert re.match(regex, example.group(1)), (parameter.name, regex)
    assert submit.flex_metadata_errors(metadata) == []
    # Each parameter reaches pipeline.run as --name=value: its parser must take them all.
    from pipeline.run import parse_args as pipeline_args

    values = {name: ("7" if name == "seed" else f"gs://wikisim-data/{name}")
              for name in ("input", "index", "output", "seed")}
    values.update({"page_shards": "4", "min_tokens": "6", "negatives": "adjacent,same_article", "overwrite": "True"})
    config, leftover = pipeline_args([f"--{name}={value}" for name, value in values.items()])
    assert leftover == []
    flat = {**vars(config), **vars(config.rules)}
    assert {name: str(flat[name]) for name in values} == values
    assert submit.flex_metadata_errors({"name": "x", "parameters": [{"name": "p"}]}) != []


def test_flex_dry_run_builds_from_the_metadata_and_runs_with_the_image(capsys):
    build, run = printed_commands(capsys, ["flex"])
    assert build[:4] == ["gcloud", "dataflow", "flex-template", "build"]
    metadata_file = next(arg for arg in build if arg.startswith("--metadata-file=")).split("=", 1)[1]
    assert json.loads(Path(metadata_file).read_text()) == submit.flex_metadata()
    image = next(arg for arg in build if arg.startswith("--image=")).split("=", 1)[1]
    assert run[:4] == ["gcloud", "dataflow", "flex-template", "run"]
    parameters = dict(arg.split("=", 2)[1:] for arg in run if arg.startswith("--parameters="))
    assert parameters["sdk_container_image"] == image
    assert parameters["output"] == "gs://wikisim-data/wikisim/enwiki-latest/data"
    template = build[4]
    assert f"--template-file-gcs-location={template}" in run


def test_dockerfile_follows_the_beam_custom_container_convention():
    dockerfile = (REPO / "infra" / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)
    # The SDK harness comes from the image of the Beam version the project installs.
    beam_copy = re.search(r"^COPY --from=apache/beam_python3\.11_sdk:(\S+) /opt/apache/beam /opt/apache/beam$",
                          dockerfile, re.M)
    assert beam_copy and beam_copy.group(1) == apache_beam.__version__
    assert dockerfile.rstrip().splitlines()[-1] == 'ENTRYPOINT ["/opt/apache/beam/boot"]'
    # The image runs every stage, so it holds the extras that encode and score (TensorFlow).
    assert '".[gcp,model,eval]"' in dockerfile
    # Every local COPY source exists, and the Flex Template entry file is one of them.
    sources = re.findall(r"^COPY (?!--from)(\S+) ", dockerfile, re.M)
    assert sources and all((REPO / source).exists() for source in sources)
    flex_file = re.search(r"^ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/template/(\S+)$", dockerfile, re.M).group(1)
    assert f"infra/{flex_file}" in sources


def test_cloud_build_builds_the_dockerfile_from_the_repository_root(capsys):
    recipe = yaml.safe_load(submit.CLOUD_BUILD.read_text())
    [step] = recipe["steps"]
    assert step["args"][:3] == ["build", "-f", "infra/Dockerfile"] and step["args"][-1] == "."
    assert recipe["images"] == ["${_IMAGE}"]
    [command] = printed_commands(capsys, ["image", "--variant", "gpu"])
    assert command[:4] == ["gcloud", "builds", "submit", "."]
    substitutions = next(arg for arg in command if arg.startswith("--substitutions="))
    assert "_EXTRA_PIP=tensorflow[and-cuda]" in substitutions
    assert "wikisim-gpu" in substitutions


def test_the_tpu_image_pins_one_tensorflow_line_that_setup_py_admits(capsys):
    from packaging.requirements import Requirement

    [command] = printed_commands(capsys, ["image", "--variant", "tpu"])
    substitutions = dict(pair.split("=", 1) for pair in
                         next(arg for arg in command if arg.startswith("--substitutions=")).split("=", 1)[1].split(","))
    assert "wikisim-tpu" in substitutions["_IMAGE"]
    pins = {Requirement(line).name: Requirement(line).specifier
            for line in (REPO / substitutions["_CONSTRAINTS"]).read_text().splitlines() if line and line[0] != "#"}
    tpu_version = Requirement(substitutions["_TPU_BUILD"]).specifier
    assert str(tpu_version) == str(pins["tensorflow"])             # the TPU build replaces the same version
    model_extra = {Requirement(r).name: Requirement(r).specifier
                   for r in re.findall(r'"([a-z-]+[<>=][^"]*)"', (REPO / "setup.py").read_text())}
    for name, pin in pins.items():                                 # pip can satisfy setup.py with the pins
        version = str(pin).removeprefix("==")
        assert version in model_extra[name], (name, version, model_extra[name])


# The local chain on gs:// paths: pipeline -> training -> SCB scoring, every path laid out as the
# wrapper lays out a cloud run, served by gcp-storage-emulator (the `gcs_emulator` fixture).
TINY_TRAINING = ["--epochs", "1", "--steps", "3", "--batch-size", "16", "--lstm-units", "8",
                 "--attention-size", "4", "--progress", "false", "--vocabulary", "train"]


@pytest.fixture(scope="module")
def chain_layout(gcs_emulator):
    root = gcs_emulator()  # gs://BUCKET/PREFIX: the prefix plays the run's name
    bucket, run = root.removeprefix("gs://").split("/", 1)
    return submit.gcs_layout(submit.CloudConfig(project="wikisim-demo", region="europe-west4", bucket=bucket, run=run))


@pytest.fixture(scope="module")
def pipeline_on_gcs(chain_layout):
    from pipeline import run as pipeline_run

    return pipeline_run.main(["--output", chain_layout.data, "--runner", "DirectRunner"])


def gcs_paths(pattern: str) -> list[str]:
    from apache_beam.io.filesystems import FileSystems

    return sorted(meta.path for meta in FileSystems.match([pattern])[0].metadata_list)


def test_chain_pipeline_writes_its_outputs_to_gcs(pipeline_on_gcs, chain_layout):
    from apache_beam.io.filesystems import FileSystems

    data = chain_layout.data
    assert data.startswith("gs://")
    for dataset in ("triplets-sen", "triplets-titles"):  # the default run's datasets
        for split in ("train", "validation", "test"):
            assert gcs_paths(f"{data}/{dataset}/{split}/part-*-of-*.tfrecord.gz"), (dataset, split)
    assert gcs_paths(f"{chain_layout.scb}/*.jsonl.gz") and gcs_paths(f"{data}/passages/*.jsonl.gz")
    with FileSystems.open(f"{data}/stats.json") as handle:
        stats = json.load(handle)
    assert stats["counters"] == pipeline_on_gcs["counters"]
    assert stats["reconciliation"]["balanced"]


def test_chain_training_reads_gcs_and_scb_scores_from_gcs(pipeline_on_gcs, chain_layout, tmp_path):
    from apache_beam.io.filesystems import FileSystems

    from eval import scb as eval_scb
    from model.train import main as train

    local_model_dir = tmp_path / "triplets-sen"  # see test_chain_model_dir_on_gcs for why not gs://
    summary = train(["--data", chain_layout.data, "--model-dir", str(local_model_dir), *TINY_TRAINING])
    assert summary["vocabulary_size"] > 0 and (local_model_dir / ENCODER / "saved_model.pb").is_file()

    result = eval_scb.main(["--data", chain_layout.data, "--output", chain_layout.eval_scb,
                            "--model-dir", f"triplets-sen={local_model_dir}", "--encoder", "tfidf",
                            "--runner", "DirectRunner"])
    for name in ("scb.json", "scb.md", "scb_ari.png"):
        assert FileSystems.exists(f"{chain_layout.eval_scb}/{name}"), name
    with FileSystems.open(f"{chain_layout.eval_scb}/scb.json") as handle:
        scored = json.load(handle)
    assert scored == json.loads(json.dumps(result))
    assert scored["articles"] == pipeline_on_gcs["counters"]["scb_articles"] > 0
    assert {row["method"] for row in scored["summary"]} == {"tfidf", "triplets-sen"}


def test_chain_model_dir_on_gcs(pipeline_on_gcs, chain_layout, monkeypatch):
    from model.encoding.encoder import SavedModelEncoder
    from model.train import main as train

    monkeypatch.setenv("GCS_RETRY_CONFIG_MAX_RETRIES", "0")  # TensorFlow's GCS client: fail without retrying
    train(["--data", chain_layout.data, "--model-dir", chain_layout.model_dir, *TINY_TRAINING])
    encoder = SavedModelEncoder(chain_layout.model_dir)
    assert encoder.encode(["The striker scored a late goal."]).shape == (1, encoder.dim)


def test_each_dataset_gets_its_own_training_spec_and_job(capsys, tmp_path):
    specs = {}
    for dataset in ("triplets-sen", "triplets-titles"):
        [command] = printed_commands(capsys, ["train", "--dataset", dataset, "--spec-dir", str(tmp_path)])
        config = Path(next(arg for arg in command if arg.startswith("--config=")).split("=", 1)[1])
        name = next(arg for arg in command if arg.startswith("--display-name="))
        specs[dataset] = (config, name, config.read_text())
    (sen_path, sen_name, sen_text), (titles_path, titles_name, titles_text) = specs.values()
    assert sen_path != titles_path and sen_name != titles_name
    assert sen_path.read_text() == sen_text                      # the second did not overwrite the first
    assert "--dataset=triplets-titles" in titles_text and "--dataset=triplets-titles" not in sen_text



@pytest.mark.slow   # a real pip install of the project
def test_submit_runs_from_any_folder_once_installed(tmp_path):
    """A real (non-editable) install of a copy of the project, run from an unrelated folder: the
    specs and templates it reads come with the package, and the spec it writes lands there."""
    import os
    import shutil
    import subprocess
    import sys

    source = tmp_path / "source"
    for folder in ("pipeline", "model", "eval", "infra"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "setup.py", source)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site), "HOME": str(tmp_path)}

    def submit_from_elsewhere(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-m", "infra.submit", *argv, *CLOUD, "--dry-run"], cwd=elsewhere,
                              capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "gs://wikisim-data/wikisim/enwiki-latest/data" in submit_from_elsewhere("layout")
    assert "flex-template build" in submit_from_elsewhere("flex")   # reads the packaged flex_template.json
    printed = submit_from_elsewhere("train")                         # fills the packaged Vertex AI spec
    [spec] = (elsewhere / "build" / "vertex").glob("*.yaml")
    assert f"--config={spec}" in printed and yaml.safe_load(spec.read_text())["workerPoolSpecs"]
    imported = subprocess.run([sys.executable, "-c", "import infra.submit; print(infra.submit.__file__)"],
                              cwd=elsewhere, capture_output=True, text=True, timeout=60, env=env).stdout
    assert imported.startswith(str(site))


def test_sizing_says_what_it_runs_and_its_dry_run_runs_nothing(tmp_path):
    """Its help says that it runs the pipeline twice; `--dry-run true` prints the runs and exits."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    helped = subprocess.run([sys.executable, "-m", "infra.sizing", "--help"], capture_output=True, text=True,
                            cwd=REPO, env=env, timeout=120)
    assert helped.returncode == 0 and "Runs the pipeline twice here" in helped.stdout
    done = subprocess.run([sys.executable, "-m", "infra.sizing", "--dry-run", "true", "--copies", "3"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "runs pipeline.run twice" in done.stdout and "repeated 3 times" in done.stdout
    assert "measured" not in done.stdout and os.listdir(tmp_path) == []     # no run, no temporary folder


@pytest.mark.slow   # the session's pipeline run
def test_the_scale_benchmarks_larger_dataset_lists_the_run_times_over_with_every_file_there(embedded_pipeline_output,
                                                                                           tmp_path):
    """`infra.scale_benchmark`'s N x run: the train split's shards and Parquet twins N times over
    (hard links), validation and test as they are; the trainer's size check passes on every split."""
    from core.published import Run
    from infra.scale_benchmark import repeated_run

    run = Run.open(str(embedded_pipeline_output))
    larger = Run.open(repeated_run(str(embedded_pipeline_output), "triplets-sen", 3, str(tmp_path / "3x")))
    for split in ("train", "validation", "test"):
        larger.check_sizes(f"triplets-sen/{split}")   # every file the manifest lists is there, of its size
    train, larger_train = run.output("triplets-sen/train"), larger.output("triplets-sen/train")
    assert larger_train.records == 3 * train.records
    assert len(larger_train.shards) == len(larger_train.parquet) == 3 * len(train.shards)
    assert run.output("triplets-sen/validation").parquet   # the twins the benchmark once left out
    assert larger.output("triplets-sen/validation") == run.output("triplets-sen/validation")
