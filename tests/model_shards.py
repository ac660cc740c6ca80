"""Writes small triplet shards in the pipeline's contract format for the model tests.

Sentences are built from real English words of a few topics: anchor and positive share a
topic, the negative comes from another, so a network can learn the split in a few steps.
"""
import random

import tensorflow as tf

from core.folders import write_manifest
from pipeline.write.order import order_record

TOPICS = {
    "football": "football goal player team match league coach stadium season scored referee striker".split(),
    "cooking": "recipe oven flour butter sugar bake kitchen dish sauce chef onion garlic".split(),
    "astronomy": "star planet orbit telescope galaxy moon comet solar gravity universe nebula asteroid".split(),
    "music": "guitar song album band singer concert melody piano rhythm chorus drummer lyrics".split(),
}
FILLER = "the a of and in was with for on his her their".split()


def _sentence(rng: random.Random, topic: str) -> str:
    words = rng.sample(TOPICS[topic], 5) + rng.sample(FILLER, 3)
    rng.shuffle(words)
    return " ".join(words).capitalize() + "."


def _example(rng: random.Random, article_id: int) -> bytes:
    topic, other = rng.sample(sorted(TOPICS), 2)
    feature = {
        "anchor": _sentence(rng, topic), "positive": _sentence(rng, topic), "negative": _sentence(rng, other),
        "title": f"Article {article_id}", "anchor_section": topic, "negative_section": other,
        "kind": "sen", "strategy": "adjacent",
    }
    features = {key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
                for key, value in feature.items()}
    sections = sorted(TOPICS)   # an article's sections: one per topic
    numbers = {"article_id": article_id, "negative_article_id": article_id,
               "anchor_section_index": sections.index(topic), "negative_section_index": sections.index(other),
               "anchor_paragraph": 0, "positive_paragraph": 1, "negative_paragraph": 0}
    features.update({key: tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
                     for key, value in numbers.items()})
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def write_triplet_shards(out: str, dataset: str = "triplets-sen", sizes=None, shards: int = 2, seed: int = 0,
                         extra_records: tuple[bytes, ...] = ()) -> str:
    """`<out>/<dataset>/<split>/part-NNNNN-of-MMMMM.tfrecord.gz` for each split; returns `out`.
    `extra_records` (e.g. corrupt ones) are appended to the first training shard."""
    rng = random.Random(seed)
    sizes = sizes or {"train": 256, "validation": 64, "test": 64}
    counts = {}
    for split, size in sizes.items():
        counts[f"{dataset}/{split}"] = size + (len(extra_records) if split == "train" else 0)
        tf.io.gfile.makedirs(f"{out}/{dataset}/{split}")
        for shard in range(shards):
            path = f"{out}/{dataset}/{split}/part-{shard:05d}-of-{shards:05d}.tfrecord.gz"
            with tf.io.TFRecordWriter(path, options="GZIP") as writer:
                for index in range(shard, size, shards):
                    writer.write(_example(rng, index))
                if split == "train" and shard == 0:
                    for record in extra_records:
                        writer.write(record)
    # Each record is its own random article: the shards are in a pseudo-random order, as the pipeline writes them.
    write_manifest(out, {**_manifest_counts(out), **counts}, dict.fromkeys(counts, order_record(seed)))
    return out


def written_train_triplets(out: str, sizes: dict, shards: int = 2) -> list[dict]:
    """The train split `write_triplet_shards` writes in `out`, as the trainer reads it (its triplets, in order)."""
    from model.training.arrays import split_triplets
    from model.training.shards import open_run

    return list(split_triplets(open_run(write_triplet_shards(out, sizes=sizes, shards=shards)), "triplets-sen",
                               "train"))


def _manifest_counts(out: str) -> dict:
    """The counts of a manifest already in `out` (a second dataset written beside the first)."""
    import json
    import os

    path = os.path.join(out, "manifest.json")
    if not os.path.exists(path):
        return {}
    return {folder: entry["records"] for folder, entry in json.load(open(path))["outputs"].items()}
