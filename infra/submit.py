"""Submits wikisim's stages to Google Cloud, filled from a few variables (project, region, bucket).

    python -m infra.submit {layout,pipeline,scb,train,image,flex} --project P --region R --bucket B [--dry-run]

Each sub-command prints the exact commands it runs, shell-quoted and runnable as printed from any
folder (the files they name are absolute paths into the installed package; only `image`, which
builds the checkout, runs in the repository root); `--dry-run` prints them (and writes the filled
Vertex AI spec) without submitting.
Before anything is printed the Dataflow options pass Beam's own `PipelineOptionsValidator` with the
DataflowRunner, and the Vertex AI spec parses into the Vertex client's `CustomJobSpec` message, so
a malformed project, bucket, job name or accelerator fails here, naming the flag, not in the cloud.
"""
from __future__ import annotations

import json
import re
import shlex
import string
import subprocess
import sys
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from core.cli import UsageError, build_config, config_parser, dataflow_option_errors, flag, flag_fields, run_cli
from core.records import PAPER_DATASET, TRIPLET_DATASETS
from infra.recipe import RECIPES
from model.training.model_dir import ModelDir
from pipeline.run import PipelineConfig

INFRA_DIR = Path(__file__).resolve().parent
REPO_ROOT = INFRA_DIR.parent
VERTEX_SPECS = {
    "gpu": INFRA_DIR / "vertex" / "gpu.yaml",
    "multi-gpu": INFRA_DIR / "vertex" / "multi_gpu.yaml",
    "multi-worker": INFRA_DIR / "vertex" / "multi_worker.yaml",
    "tpu": INFRA_DIR / "vertex" / "tpu.yaml",
    "jax-gpu": INFRA_DIR / "vertex" / "jax_gpu.yaml",
}
# The image each Vertex AI spec runs (image_uri's variant).
SPEC_VARIANTS = {"gpu": "gpu", "multi-gpu": "gpu", "multi-worker": "cpu", "tpu": "tpu", "jax-gpu": "jax-gpu"}
ACCELERATORS = tuple(VERTEX_SPECS)
STAGES = ("layout", "pipeline", "scb", "train", "image", "flex")
FLEX_METADATA = INFRA_DIR / "flex_template.json"
CLOUD_BUILD = INFRA_DIR / "cloudbuild.yaml"
GPU_EXTRA_PIP = "tensorflow[and-cuda]"
JAX_GPU_EXTRA_PIP = "jax[cuda12] tokenizers>=0.20 tensorboardX>=2.6"   # the JAX backend on GPUs (setup.py's jax extra)
TPU_BUILD = "tensorflow-tpu==2.20.0"   # the newest TPU build of TensorFlow on PyPI
TPU_CONSTRAINTS = INFRA_DIR / "tpu-constraints.txt"
TPU_MACHINE_PREFIXES = ("cloud-tpu", "ct5lp-", "ct6e-")


@dataclass(frozen=True)
class CloudConfig:
    """The variables every submission is filled from; the CLI flags mirror these fields."""
    project: str = flag(help="Google Cloud project id")
    region: str = flag(help="e.g. us-central1")
    bucket: str = flag(help="bucket name, without gs://")
    run: str = flag("enwiki-latest", help="this run's folder: gs://BUCKET/wikisim/RUN/")
    dump: str | None = flag(None, help="dump path; none = gs://BUCKET/dumps/enwiki-latest-pages-articles-"
                                       "multistream.xml.bz2")
    index: str | None = flag(None, help="multistream index; none = the pipeline looks for it beside the dump")
    image: str | None = flag(None, help="container image; none = REGION-docker.pkg.dev/PROJECT/wikisim/"
                                        "wikisim[-gpu|-tpu]:latest")
    container: bool = flag(False, help="pipeline workers run the image instead of installing setup.py "
                                       "(other Dataflow stages always run it: they need TensorFlow)")
    machine_type: str = flag("n2-standard-4", help="Dataflow worker machine type")
    max_num_workers: int = flag(32, help="Dataflow autoscaling ceiling")
    accelerator: str = flag("gpu", help="Vertex AI spec: gpu, multi-gpu, multi-worker (CPU machines), tpu, or "
                                        "jax-gpu (every GPU of one machine under Keras' JAX backend)")
    recipe: str | None = flag(None, help=f"training recipe appended to the spec's args (infra/recipe.py: "
                                         f"{', '.join(RECIPES)}); none = the one named after --dataset")
    variant: str = flag("cpu", help="image to build: cpu (Dataflow, Flex Template), gpu, tpu or jax-gpu (Vertex)")
    dataset: str = flag(PAPER_DATASET, help=f"triplet dataset model.train reads: one of {', '.join(TRIPLET_DATASETS)}")
    embeddings: str | None = flag(None, help="GloVe text file; none = gs://BUCKET/vectors/glove.840B.300d.txt")
    spec_dir: str = flag("build/vertex",
                         help="where the filled Vertex AI spec is written (relative: to the current folder)")

    def __post_init__(self):
        for name, allowed in (("accelerator", ACCELERATORS), ("variant", ("cpu", "gpu", "tpu", "jax-gpu")),
                              ("dataset", TRIPLET_DATASETS)):
            if getattr(self, name) not in allowed:
                raise UsageError(f"--{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        recipe = self.recipe_name
        if recipe not in RECIPES or RECIPES[recipe].dataset != self.dataset:
            fitting = [name for name, entry in RECIPES.items() if entry.dataset == self.dataset]
            raise UsageError(f"--recipe for --dataset {self.dataset} must be one of {', '.join(fitting)}, "
                             f"got {recipe!r}")

    @property
    def recipe_name(self) -> str:
        """The training recipe (infra/recipe.py): --recipe, or the one named after --dataset."""
        return self.recipe or self.dataset


@dataclass(frozen=True)
class GcsLayout:
    """Where each stage reads and writes in the bucket (see infra/README.md)."""
    dump: str
    index: str | None
    vectors: str
    data: str
    scb: str
    model_dir: str
    encoder: str
    eval_scb: str
    temp: str
    staging: str
    template: str


def gcs_layout(cfg: CloudConfig) -> GcsLayout:
    """The bucket layout of one run: inputs under dumps/ and vectors/, outputs under wikisim/RUN/."""
    bucket = f"gs://{cfg.bucket}"
    run_root = f"{bucket}/wikisim/{cfg.run}"
    data = f"{run_root}/data"
    model_dir = f"{run_root}/models/{cfg.recipe_name}"   # one folder per recipe: minilm-sen is not triplets-sen
    return GcsLayout(
        dump=cfg.dump or f"{bucket}/dumps/enwiki-latest-pages-articles-multistream.xml.bz2",
        index=cfg.index,
        vectors=cfg.embeddings or f"{bucket}/vectors/glove.840B.300d.txt",
        data=data,
        scb=f"{data}/scb",
        model_dir=model_dir,
        encoder=ModelDir(model_dir).encoder,
        eval_scb=f"{run_root}/eval/scb",
        temp=f"{bucket}/wikisim/dataflow/temp",
        staging=f"{bucket}/wikisim/dataflow/staging",
        template=f"{bucket}/wikisim/templates/pipeline.json",
    )


def image_uri(cfg: CloudConfig, variant: str) -> str:
    """The container image for a variant (cpu, gpu, tpu): --image, or one in Artifact Registry."""
    if cfg.image:
        return cfg.image
    name = "wikisim" if variant == "cpu" else f"wikisim-{variant}"
    return f"{cfg.region}-docker.pkg.dev/{cfg.project}/wikisim/{name}:latest"


def job_name(*parts: str) -> str:
    """A Dataflow / Vertex job name from parts: lower case, [-a-z0-9], starting with a letter."""
    name = re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")
    return name if name[:1].isalpha() else f"wikisim-{name}"


def dataflow_options(cfg: CloudConfig, stage: str) -> list[str]:
    """Beam options that submit one stage to Dataflow. Workers install what they run: the pipeline's
    get the code from setup.py (no TensorFlow) unless `--container`; every other stage encodes
    sentences with TensorFlow, which only the project's image holds."""
    layout = gcs_layout(cfg)
    options = [
        "--runner=DataflowRunner",
        f"--project={cfg.project}",
        f"--region={cfg.region}",
        f"--job_name={job_name('wikisim', stage, cfg.run)}",
        f"--temp_location={layout.temp}",
        f"--staging_location={layout.staging}",
        f"--machine_type={cfg.machine_type}",
        f"--max_num_workers={cfg.max_num_workers}",
    ]
    if cfg.container or stage != "pipeline":
        options.append(f"--sdk_container_image={image_uri(cfg, 'cpu')}")
    else:
        options.append(f"--setup_file={REPO_ROOT / 'setup.py'}")
    return options


def custom_job_spec_errors(spec: dict) -> list[str]:
    """Why Vertex AI would reject a CustomJobSpec: its schema, via the Vertex client's own message
    (field names, types, accelerator enum values), then the fields Vertex AI requires."""
    from google.cloud.aiplatform_v1.types import AcceleratorType, CustomJobSpec
    from google.protobuf import json_format

    try:
        message = json_format.ParseDict(spec, CustomJobSpec.pb(CustomJobSpec()))
    except json_format.ParseError as err:
        return [f"not a Vertex AI CustomJobSpec: {err}"]
    pools = message.worker_pool_specs
    if not pools:
        return ["workerPoolSpecs is empty: Vertex AI needs at least one worker pool"]
    errors = []
    for i, pool in enumerate(pools):
        where = f"workerPoolSpecs[{i}]"
        machine = pool.machine_spec
        if not machine.machine_type:
            errors.append(f"{where}.machineSpec.machineType is required")
        if pool.replica_count < 1 or (i == 0 and pool.replica_count != 1):
            errors.append(f"{where}.replicaCount is {pool.replica_count}: the first pool needs 1, others >= 1")
        task = pool.WhichOneof("task")
        if task is None:
            errors.append(f"{where} needs containerSpec or pythonPackageSpec")
        elif task == "container_spec" and not pool.container_spec.image_uri:
            errors.append(f"{where}.containerSpec.imageUri is required")
        elif task == "python_package_spec":
            package = pool.python_package_spec
            if not (package.executor_image_uri and package.package_uris and package.python_module):
                errors.append(f"{where}.pythonPackageSpec needs executorImageUri, packageUris and pythonModule")
        has_type = machine.accelerator_type != AcceleratorType.ACCELERATOR_TYPE_UNSPECIFIED
        if has_type != (machine.accelerator_count > 0):
            errors.append(f"{where}.machineSpec: acceleratorType and acceleratorCount go together")
        if machine.machine_type.startswith(TPU_MACHINE_PREFIXES):
            if len(pools) != 1 or pool.replica_count != 1:
                errors.append(f"{where}: a TPU VM job has one worker pool with one replica")
            if machine.machine_type != "cloud-tpu" and not machine.tpu_topology:
                errors.append(f"{where}.machineSpec.tpuTopology is required for {machine.machine_type}")
    return errors


def flex_metadata_errors(metadata: dict) -> list[str]:
    """Why `gcloud dataflow flex-template build --metadata-file` would reject the metadata:
    its schema via the Dataflow client's TemplateMetadata message, then the required fields."""
    from google.cloud.dataflow_v1beta3.types import TemplateMetadata
    from google.protobuf import json_format

    try:
        message = json_format.ParseDict(metadata, TemplateMetadata.pb(TemplateMetadata()))
    except json_format.ParseError as err:
        return [f"not Flex Template metadata: {err}"]
    errors = [] if message.name else ["name is required"]
    for i, parameter in enumerate(message.parameters):
        for field in ("name", "label", "help_text"):
            if not getattr(parameter, field):
                errors.append(f"parameters[{i}].{field} is required")
        for regex in parameter.regexes:
            try:
                re.compile(regex)
            except re.error as err:
                errors.append(f"parameters[{i}] ({parameter.name}) regex {regex!r}: {err}")
    return errors


def fill_placeholders(node, values: dict[str, str], where: str = "spec"):
    """Replaces ${NAME} in every string of a parsed YAML document; an unknown name is an error."""
    if isinstance(node, dict):
        return {key: fill_placeholders(value, values, f"{where}.{key}") for key, value in node.items()}
    if isinstance(node, list):
        return [fill_placeholders(value, values, f"{where}[{i}]") for i, value in enumerate(node)]
    if isinstance(node, str):
        try:
            return string.Template(node).substitute(values)
        except KeyError as err:
            raise ValueError(f"{where}: no value for placeholder {err}") from None
    return node


def vertex_spec(cfg: CloudConfig) -> dict:
    """The filled Vertex AI CustomJobSpec for --accelerator, raising ValueError if Vertex would reject it:
    the spec's placeholders filled, the recipe's flags (`infra.recipe`) appended to every pool's args."""
    if cfg.accelerator not in VERTEX_SPECS:
        raise ValueError(f"--accelerator {cfg.accelerator!r}: choose one of {sorted(VERTEX_SPECS)}")
    path = VERTEX_SPECS[cfg.accelerator]
    layout = gcs_layout(cfg)
    values = {
        "IMAGE": image_uri(cfg, SPEC_VARIANTS[cfg.accelerator]),
        "DATA": layout.data,
        "MODEL_DIR": layout.model_dir,
        "DATASET": cfg.dataset,
        "EMBEDDINGS": layout.vectors,
    }
    spec = fill_placeholders(yaml.safe_load(path.read_text()), values, path.name)
    for pool in spec["workerPoolSpecs"]:
        pool["containerSpec"]["args"] = [*pool["containerSpec"]["args"],
                                         *RECIPES[cfg.recipe_name].arguments(cfg.accelerator,
                                                                             models=layout.model_dir.rsplit("/", 1)[0])]
    errors = custom_job_spec_errors(spec)
    if errors:
        raise ValueError(f"{path.relative_to(REPO_ROOT)} filled for this run: " + "; ".join(errors))
    return spec


def checked_dataflow_options(cfg: CloudConfig, stage: str) -> list[str]:
    options = dataflow_options(cfg, stage)
    errors = dataflow_option_errors(options)
    if errors:
        raise ValueError(
            "Beam rejects the Dataflow options built from --project/--region/--bucket/--run/"
            "--machine-type/--max-num-workers: " + "; ".join(errors)
        )
    return options


def pipeline_commands(cfg: CloudConfig) -> list[list[str]]:
    """`python -m pipeline.run` on Dataflow: the dump in, triplets, SCB, passages and stats out."""
    layout = gcs_layout(cfg)
    command = ["python", "-m", "pipeline.run", "--input", layout.dump]
    if layout.index:
        command += ["--index", layout.index]
    command += ["--output", layout.data]
    return [command + checked_dataflow_options(cfg, "pipeline")]


def scb_commands(cfg: CloudConfig) -> list[list[str]]:
    """`python -m eval.scb` on Dataflow over the run's SCB: the trained encoder beside the baselines.

    mean-vectors reads the run's GloVe file from the bucket: the embedded GloVe 6B 50d is a demo
    extra that Dataflow workers (installed from setup.py) do not have.
    """
    layout = gcs_layout(cfg)
    command = [
        "python", "-m", "eval.scb",
        "--data", layout.data,
        "--output", layout.eval_scb,
        "--model-dir", f"{cfg.recipe_name}={layout.model_dir}",
        "--encoder", f"mean-vectors:{layout.vectors}",
        "--encoder", "tfidf",
    ]
    return [command + checked_dataflow_options(cfg, "scb")]


def train_commands(cfg: CloudConfig) -> tuple[list[list[str]], dict[Path, str]]:
    """`gcloud ai custom-jobs create` with the filled spec (returned as a file to write); one spec
    and job name per run, dataset and accelerator, so training titles never overwrites sen's."""
    spec = vertex_spec(cfg)
    spec_path = Path(cfg.spec_dir).resolve() / f"{job_name(cfg.run, cfg.recipe_name, cfg.accelerator)}.yaml"
    command = [
        "gcloud", "ai", "custom-jobs", "create",
        f"--project={cfg.project}",
        f"--region={cfg.region}",
        f"--display-name={job_name('wikisim', 'train', cfg.run, cfg.recipe_name, cfg.accelerator)}",
        f"--config={spec_path}",
    ]
    return [command], {spec_path: yaml.safe_dump(spec, sort_keys=False)}


def image_commands(cfg: CloudConfig) -> list[list[str]]:
    """Cloud Build of infra/Dockerfile: `cpu` for Dataflow workers and the Flex Template, `gpu` and
    `tpu` for Vertex (the TPU image on TensorFlow's 2.20 line, `TPU_CONSTRAINTS`)."""
    extra_pip, constraints, tpu_build = {
        "cpu": ("", "", ""),
        "gpu": (GPU_EXTRA_PIP, "", ""),
        "jax-gpu": (JAX_GPU_EXTRA_PIP, "", ""),
        "tpu": (TPU_BUILD, TPU_CONSTRAINTS.relative_to(REPO_ROOT).as_posix(), TPU_BUILD),
    }[cfg.variant]
    return [[
        "gcloud", "builds", "submit", ".",
        f"--project={cfg.project}",
        f"--config={CLOUD_BUILD.relative_to(REPO_ROOT)}",
        f"--substitutions=_IMAGE={image_uri(cfg, cfg.variant)},_EXTRA_PIP={extra_pip},"
        f"_CONSTRAINTS={constraints},_TPU_BUILD={tpu_build}",
    ]]


def flex_metadata() -> dict:
    """The Flex Template metadata: `flex_template.json` (name, description and the hand-labelled
    Cloud Storage parameters) plus an optional parameter for every other flag of `pipeline.run`,
    its help text taken from `PipelineConfig`, so the template exposes all of the pipeline's flags.
    Dataflow passes each as `--name=value`, which the pipeline's parser takes (underscore spelling)."""
    metadata = json.loads(FLEX_METADATA.read_text())
    named = {parameter["name"] for parameter in metadata["parameters"]}
    for field in flag_fields(PipelineConfig):
        if field.name not in named:
            metadata["parameters"].append({
                "name": field.name, "label": field.name.replace("_", " ").capitalize(),
                "helpText": f"{field.metadata['help']} (default: {field.default})", "isOptional": True})
    return metadata


def flex_commands(cfg: CloudConfig) -> list[list[str]]:
    """Builds the Flex Template spec from the cpu image and launches the pipeline from it; the
    metadata (`flex_metadata`) is written to a temp file for `gcloud`."""
    metadata = flex_metadata()
    errors = flex_metadata_errors(metadata)
    if errors:
        raise ValueError(f"{FLEX_METADATA.relative_to(REPO_ROOT)}: " + "; ".join(errors))
    metadata_file = Path(tempfile.gettempdir()) / "wikisim-flex-template.json"
    metadata_file.write_text(json.dumps(metadata, indent=2))
    checked_dataflow_options(cfg, "pipeline")  # the same project/region/bucket checks as a direct run
    layout = gcs_layout(cfg)
    image = image_uri(cfg, "cpu")
    build = [
        "gcloud", "dataflow", "flex-template", "build", layout.template,
        f"--project={cfg.project}",
        f"--image={image}",
        "--sdk-language=PYTHON",
        f"--metadata-file={metadata_file}",
    ]
    parameters = {"input": layout.dump, "output": layout.data}
    if layout.index:
        parameters["index"] = layout.index
    parameters["sdk_container_image"] = image
    run = [
        "gcloud", "dataflow", "flex-template", "run", job_name("wikisim", "pipeline", cfg.run),
        f"--project={cfg.project}",
        f"--region={cfg.region}",
        f"--template-file-gcs-location={layout.template}",
        f"--temp-location={layout.temp}",
        f"--staging-location={layout.staging}",
        f"--worker-machine-type={cfg.machine_type}",
        f"--max-workers={cfg.max_num_workers}",
        *(f"--parameters={name}={value}" for name, value in parameters.items()),
    ]
    return [build, run]


def layout_lines(cfg: CloudConfig) -> list[str]:
    layout = gcs_layout(cfg)
    unset = {"index": "(beside the dump)"}
    return [f"{f.name:10} {getattr(layout, f.name) or unset[f.name]}" for f in fields(layout)]


def execute(commands: list[list[str]], dry_run: bool) -> None:
    """Prints each command as a shell line; runs it unless dry_run (`python` is this interpreter)."""
    for command in commands:
        print(shlex.join(command), flush=True)
        if dry_run:
            continue
        argv = [sys.executable, *command[1:]] if command[0] == "python" else command
        try:
            subprocess.run(argv, check=True, cwd=REPO_ROOT)
        except FileNotFoundError:
            raise SystemExit(f"{command[0]} is not on PATH: install it, or use --dry-run to print only") from None
        except subprocess.CalledProcessError as err:
            raise SystemExit(f"{command[0]} exited with status {err.returncode}") from None


def parse_args(argv: list[str] | None) -> tuple[str, CloudConfig, bool]:
    """(stage, config, dry run): the config's flags plus the stage and `--dry-run`."""
    parser = config_parser(CloudConfig, "python -m infra.submit", __doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=STAGES, help="what to submit (layout only prints the bucket layout)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands without submitting")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return args.stage, build_config(CloudConfig, vars(args)), args.dry_run


def main(argv: list[str] | None = None) -> None:
    stage, cfg, dry_run = parse_args(argv)
    try:
        if stage == "layout":
            print("\n".join(layout_lines(cfg)))
            return
        files: dict[Path, str] = {}
        if stage == "pipeline":
            commands = pipeline_commands(cfg)
        elif stage == "scb":
            commands = scb_commands(cfg)
        elif stage == "train":
            commands, files = train_commands(cfg)
        elif stage == "image":
            commands = image_commands(cfg)
        else:
            commands = flex_commands(cfg)
    except ValueError as err:
        raise SystemExit(f"infra.submit {stage}: {err}") from None
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"# wrote {path}", flush=True)
    execute(commands, dry_run)


if __name__ == "__main__":
    sys.exit(run_cli(main))
