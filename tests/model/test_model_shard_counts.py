"""A damaged shard is counted alike by the trainer's reader (`TripletInput.count_records`, whose
counts the run's warning prints) and by `Run.verify` (whose error ends the run): the error said
"0 of 11,987 records" where the warning said 5,887 were read, since Beam's GZIP reader gave none
of a shard's records when its deflate data broke off after them."""
import gzip
import re
import shutil
import zlib

import pytest
from model_shards import write_triplet_shards

from core.published import ShardError, count_shard_records
from model.config import TrainConfig
from model.net.wordpieces import wordpieces
from model.training.arrays import TripletInput, shard_records
from model.training.shards import open_run

DATASET = "triplets-sen"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_triplet_shards(str(tmp_path_factory.mktemp("shards")))


def _damage(content: bytes) -> bytes:
    """256 bytes of the compressed stream zeroed, at the shard's size (`Run.check_sizes` lets it by)."""
    damaged = bytearray(content)
    middle = len(content) * 3 // 10
    damaged[middle:middle + 256] = bytes(256)
    return bytes(damaged)


def _cut(content: bytes) -> bytes:
    return content[:len(content) // 2]


@pytest.mark.parametrize("spoil", [_damage, _cut])
def test_a_damaged_shard_counts_the_records_the_trainer_reads(shards, tmp_path, spoil):
    data = tmp_path / "run"
    shutil.copytree(shards, data)
    shard = sorted((data / DATASET / "train").glob("*.tfrecord.gz"))[0]
    shard.write_bytes(spoil(shard.read_bytes()))
    with pytest.raises((zlib.error, EOFError, OSError)), gzip.open(shard) as handle:
        handle.read()
    read = sum(1 for _ in shard_records(str(shard)))
    counted, broken = count_shard_records(str(shard))
    assert 0 < read == counted and broken


def test_the_error_names_the_records_the_warning_says_were_read(shards, tmp_path):
    data = tmp_path / "run"
    shutil.copytree(shards, data)
    shard = sorted((data / DATASET / "train").glob("*.tfrecord.gz"))[0]
    shard.write_bytes(_damage(shard.read_bytes()))
    config = TrainConfig.from_flags(data=str(data), model_dir="unused", encoder="minilm", backend="jax",
                                    max_tokens=16, batch_size=8)
    run = open_run(str(data))
    count = TripletInput(config, run, wordpieces(16)).count_records("train")   # the warning's numbers
    assert 0 < count["read"] < count["expected"]
    with pytest.raises(ShardError) as refused:
        run.verify(f"{DATASET}/train", config.inputs.max_lost_fraction)
    numbers = re.search(r": ([\d,]+) of the ([\d,]+) records the manifest lists", str(refused.value))
    assert numbers, refused.value
    assert [int(number.replace(",", "")) for number in numbers.groups()] == [count["read"], count["expected"]]
