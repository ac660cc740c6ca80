"""Deterministic article -> split assignment (train 80 %, validation 10 %, test 10 %).

Python's `hash()` is salted per process, so every deterministic draw in the pipeline goes
through `stable_hash`: SHA-256 over the repr of its keys, identical on every worker and run.
"""
from __future__ import annotations

import hashlib

SPLITS = ("train", "validation", "test")


def stable_hash(*keys) -> int:
    """A 64-bit integer determined only by `keys` (ints and strings)."""
    digest = hashlib.sha256(repr(keys).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big")


def split_of(article_id: int, seed: int) -> str:
    bucket = stable_hash("split", seed, article_id) % 100
    if bucket < 80:
        return "train"
    if bucket < 90:
        return "validation"
    return "test"
