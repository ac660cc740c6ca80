"""The order a triplet split is written in: a fixed pseudo-random order, chosen once, at write time.

TFDS writes its Beam-built datasets so (`core/writer.py`, `core/hashing.py`): every example gets
a hash of its key, the split is written sorted by that hash, cut into shards of about equal
size, so that a reader streams it in a shuffled order with a small buffer. Here the unit is a
*chunk*: up to `CHUNK_TRIPLETS` triplets of one article, kept together (the trainer batches an
article's triplets side by side and encodes their shared sentences once). Its key is
`stable_hash("order", seed, dataset, split, article_id, chunk index)`: the order depends on the
seed and the data only, not on the runner, the number of workers or the order pages were read.

Shard `i` of `n` holds the chunks whose key falls in the i-th of `n` equal ranges of the 64-bit
key space, sorted by key: read in shard order, the split is sorted by key as a whole. The number
of shards comes from the split's size (`shard_count`).
"""
from __future__ import annotations

from core.splits import stable_hash

CHUNK_TRIPLETS = 16          # triplets of one article kept contiguous (the trainer's --article-chunk default)
TARGET_SHARD_BYTES = 384 << 20   # serialised records per shard: about 128 MB gzipped (TFRecords compress ~3x)
MIN_SHARDS = 16              # a split large enough gets at least this many (readers spread over files)
MIN_SHARD_BYTES = 1 << 20    # but no shard under 1 MiB of records: a small split gets fewer
KEY_SPACE = 1 << 64
ORDER_UNIT = "article_chunk"  # the manifest's name of the unit


def order_key(seed: int, dataset: str, split: str, article_id: int, chunk: int) -> int:
    """The 64-bit sort key of one chunk of an article's triplets."""
    return stable_hash("order", seed, dataset, split, article_id, chunk)


def chunks(records: list[bytes], size: int = CHUNK_TRIPLETS) -> list[list[bytes]]:
    """An article's records (of one split, in the order made) cut into chunks of up to `size`."""
    return [records[start:start + size] for start in range(0, len(records), size)]


def shard_count(record_bytes: int, n_chunks: int) -> int:
    """Shards for a split of `record_bytes` serialised bytes in `n_chunks` chunks: one per
    `TARGET_SHARD_BYTES`, at least `MIN_SHARDS` where each would still hold `MIN_SHARD_BYTES`,
    never more than there are chunks (no empty shard), at least one."""
    by_size = -(-record_bytes // TARGET_SHARD_BYTES)
    floor = min(MIN_SHARDS, record_bytes // MIN_SHARD_BYTES)
    return max(1, min(max(by_size, floor), n_chunks))


def shard_of(key: int, n_shards: int) -> int:
    """The shard of a key: the i-th of `n_shards` equal ranges of the key space."""
    return key * n_shards // KEY_SPACE


def shard_name(index: int, n_shards: int, suffix: str = ".tfrecord.gz") -> str:
    """`part-SSSSS-of-NNNNN.tfrecord.gz`, as Beam's sinks name shards."""
    return f"part-{index:05d}-of-{n_shards:05d}{suffix}"


def order_record(seed: int) -> dict:
    """What the manifest records of a triplet output's order."""
    return {"unit": ORDER_UNIT, "chunk_triplets": CHUNK_TRIPLETS, "seed": seed,
            "key": "stable_hash('order', seed, dataset, split, article_id, chunk)", "sorted_within_shards": True}
