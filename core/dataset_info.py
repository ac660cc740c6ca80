"""What TFDS reads of a triplet dataset: `RUN/<dataset>/dataset_info.json` and `features.json`,
so that `tfds.builder_from_directory("RUN/triplets-sen").as_dataset(split="train")` yields the
split's triplets, as many as the run's manifest lists.

TFDS reads the Parquet twins of the shards (`core.parquet`: `fileFormat` "parquet", the
serialised Example in the column TFDS reads), not the gzip TFRecords: its TFRecord reader opens
files with no compression (`TfRecordFileAdapter.make_tf_data`), and an uncompressed copy would
be 8x the gzip files. Each split's `filepathTemplate` names the files where the run writes
them (`train/part-00000-of-00009.parquet`), and its `shardLengths` are the manifest's
per-shard counts. The features are the triplet features, as TFDS's `Text` (decoded to
`tf.string`) and int64 `Scalar`.

Both files are TFDS's documented JSON forms (the `DatasetInfo` proto as proto-JSON, a
`FeatureConnector`'s `to_json`), written here without TFDS: the pipeline never imports
TensorFlow. A test reads a run back with real TFDS. They are written when the run publishes,
just before its manifest, which lists them (`files`); until then the run's lock lists them.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING

from core.records import TRIPLET_DATASETS, TRIPLET_FEATURES, FeatureType
from core.splits import SPLITS

if TYPE_CHECKING:
    from core.published import Output

DATASET_INFO = "dataset_info.json"   # tensorflow_datasets.core.constants.DATASET_INFO_FILENAME
FEATURES = "features.json"           # tensorflow_datasets.core.constants.FEATURES_FILENAME
# The TFDS version of the datasets' layout: bump its major when TRIPLET_FEATURES change.
VERSION = "1.0.0"
# Where a split's Parquet twins lie, relative to the dataset folder (TFDS's naming template).
FILEPATH_TEMPLATE = "{SPLIT}/part-{SHARD_X_OF_Y}.parquet"
CITATION = """@inproceedings{ein-dor-etal-2018-learning,
  title = {Learning Thematic Similarity Metric from Article Sections Using Triplet Networks},
  author = {Ein Dor, Liat and Mass, Yosi and Halfon, Alon and Venezian, Elad and Shnayderman, Ilya and
            Aharonov, Ranit and Slonim, Noam},
  booktitle = {Proceedings of the 56th Annual Meeting of the Association for Computational Linguistics},
  year = {2018}
}"""


def info_files(folders: Iterable[str]) -> list[str]:
    """The TFDS files (relative to the run folder) of the triplet datasets among `folders`."""
    datasets = sorted({folder.split("/")[0] for folder in folders if folder.split("/")[0] in TRIPLET_DATASETS})
    return [f"{dataset}/{name}" for dataset in datasets for name in (DATASET_INFO, FEATURES)]


def features_json() -> dict:
    """`features.json`: a FeaturesDict of the triplet features (Text for bytes, int64 Scalar)."""
    text = {"pythonClassName": "tensorflow_datasets.core.features.text_feature.Text", "text": {}}
    scalar = {"pythonClassName": "tensorflow_datasets.core.features.scalar.Scalar",
              "tensor": {"shape": {}, "dtype": "int64", "encoding": "none"}}
    return {"pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
            "featuresDict": {"features": {name: text if kind is FeatureType.BYTES else scalar
                                          for name, kind in TRIPLET_FEATURES.items()}}}


def dataset_info_json(dataset: str, splits: dict[str, Output]) -> dict:
    """`dataset_info.json` (the DatasetInfo proto as proto-JSON: 64-bit integers as strings) of
    `dataset`, from its splits' outputs in the manifest (their Parquet twins)."""
    return {
        "name": dataset.replace("-", "_"),   # TFDS names are snake_case
        "version": VERSION,
        "description": f"Wikipedia triplets (anchor, positive, negative) of wikisim's {dataset} dataset, "
                       "after Ein Dor et al. (ACL 2018): the anchor and the positive are of one article "
                       "section, the negative of another. Derived from Wikipedia text (CC BY-SA).",
        "citation": CITATION,
        "fileFormat": "parquet",
        "splits": [{"name": split, "filepathTemplate": FILEPATH_TEMPLATE,
                    "shardLengths": [str(shard.records) for shard in output.parquet],
                    "numBytes": str(sum(shard.size or 0 for shard in output.parquet))}
                   for split, output in splits.items()],
    }


def dataset_infos(outputs: dict[str, Output]) -> dict[str, bytes]:
    """{path relative to the run folder: content} of each triplet dataset's TFDS files among
    `outputs` (folder -> Output, as the manifest lists them)."""
    contents = {}
    for path in info_files(outputs):
        dataset, name = path.split("/")
        splits = {split: outputs[f"{dataset}/{split}"] for split in SPLITS if f"{dataset}/{split}" in outputs}
        content = dataset_info_json(dataset, splits) if name == DATASET_INFO else features_json()
        contents[path] = json.dumps(content, indent=2).encode("utf-8")
    return contents
