"""core.tfrecord frames records as TensorFlow reads them and refuses a damaged frame."""
import io

import pytest

from core.tfrecord import CorruptRecordError, frame, read_records

RECORDS = [b"", b"a", "sentence é".encode(), bytes(range(256)) * 40]


def test_tensorflow_reads_the_frames_back(tmp_path):
    import tensorflow as tf

    path = tmp_path / "records.tfrecord"
    path.write_bytes(b"".join(map(frame, RECORDS)))
    assert [r.numpy() for r in tf.data.TFRecordDataset(str(path))] == RECORDS


def test_frames_written_by_tensorflow_are_read_back(tmp_path):
    import tensorflow as tf

    path = tmp_path / "records.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in RECORDS:
            writer.write(record)
    assert list(read_records(io.BytesIO(path.read_bytes()), str(path))) == RECORDS
    assert path.read_bytes() == b"".join(map(frame, RECORDS))


@pytest.mark.parametrize(("damage", "message"), [
    (lambda data: data[:-3], "ends inside record 4"),
    (lambda data: data[:28] + bytes([data[28] ^ 1]) + data[29:], "record 2: data does not match"),
    (lambda data: data[:17] + bytes([data[17] ^ 1]) + data[18:], "record 2: damaged length"),
])
def test_a_damaged_frame_names_the_file_and_record(damage, message):
    data = damage(b"".join(map(frame, RECORDS)))
    with pytest.raises(CorruptRecordError, match=f"shard-7: {message}"):
        list(read_records(io.BytesIO(data), "shard-7"))
