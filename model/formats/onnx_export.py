"""A transformer model dir's encoder as an ONNX folder for CPU workers: `model.export --format onnx`.

The folder holds the graph (`model.onnx`: int64 `input_ids` and `attention_mask` [n, t] ->
float32 `sentence_embedding` [n, d], the mean-pooled token states, unscaled, as the SavedModel
export gives them), the checkpoint's `vocab.txt` (what `model.net.wordpieces.WordPieces` tokenizes
with, as the SavedModel's in-graph tokenizer does), its `tokenizer.json` (the same pipeline for
Hugging Face `tokenizers` users) and `onnx.json` (the settings: dimension, wordpieces per sentence,
similarity, quantization), written last: a folder without it is no export.

The graph is written from the network's weights (`hf_bert_weights`, the names the
sentence-transformers export uses) with ONNX Runtime's fused transformer operators
(`com.microsoft` `EmbedLayerNormalization`, `Attention`, `SkipLayerNormalization`, `FastGelu`),
which its own optimizer would have to discover in a converted graph (tf2onnx's conversion of the
Keras network ran no faster than the SavedModel: docs/export.md). `FastGelu` is the tanh GELU
keras-hub's BERT uses (the Hugging Face checkpoint's config says exact `gelu`; the SavedModel, and
so this graph, follow keras-hub). `--quantize int8` quantizes the matrix products and attention
projections dynamically (`onnxruntime.quantization.quantize_dynamic`) with the settings for AVX2
without VNNI chosen by measurement (docs/export.md): uint8 activations, int8 weights per channel.
Dynamic activations scale by each run's range, so the encoder runs such a graph one sentence at a
time: a sentence's vector is then the same whatever its batch (`model.encoding.encoder.OnnxEncoder`).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

import numpy as np

from core.files import write_complete
from model.formats.hf import hf_bert_weights
from model.net.wordpieces import WordPieces
from model.similarity import Similarity

GRAPH_FILE = "model.onnx"
CONFIG_FILE = "onnx.json"   # written last: the folder's sign of completeness, and what the encoder reads first
VOCABULARY_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "wikisim-onnx"
INPUTS = ("input_ids", "attention_mask")
OUTPUT = "sentence_embedding"
QUANTIZATIONS = ("int8",)
OPSET = 17
CONTRIB = "com.microsoft"
# Dynamic int8 for AVX2 without VNNI, chosen by measurement (docs/export.md): int8 weights (ONNX
# Runtime's u8s8 kernels) ran 1.14-1.27x the uint8 weights' (optimum's AVX2 default) at the same
# cosines to the SavedModel; per-channel scales kept them (per tensor: median 0.982).
# The word embedding table (30,522 x 384 floats, 47 MB of MiniLM's 58 MB) is stored int8 with a
# scale per row and dequantized in the graph (`DequantizeLinear`, axis 0): 23 MB in all. ONNX
# Runtime's own embedding quantization (`QEmbedLayerNormalization`, one scale for the whole
# table) moved SICK sentences' embeddings to median cosine 0.992 of the float table's.
# "activations": quantized by each run's range, one scale per tensor, so a row of a batch depends on
# the rest: the encoder runs such a graph one sentence at a time (`OnnxEncoder`, issue 70 item 5).
INT8_SETTINGS: dict[str, Any] = {"weight_type": "QInt8", "per_channel": True, "reduce_range": False,
                 "op_types": ["MatMul", "Attention"], "word_embeddings": "int8 per row",
                 "activations": "dynamic"}


def export_entries() -> tuple[str, ...]:
    """What an ONNX export writes at `--output`: what `model.export` claims, and `--overwrite` deletes."""
    return (GRAPH_FILE, CONFIG_FILE, VOCABULARY_FILE, TOKENIZER_FILE)


class _Graph:
    """Nodes and initializers of the graph being written, with fresh names."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.initializers: list = []
        self.count = 0

    def constant(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: int = 1, domain: str = "", **attributes) -> list[str]:
        from onnx import helper

        self.count += 1
        names = [f"{op.lower()}_{self.count}_{index}" for index in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=f"{op}_{self.count}", domain=domain, **attributes))
        return names


def _word_table(graph: _Graph, table: np.ndarray, int8_rows: bool) -> str:
    """The word embedding table: float32, or int8 with a float32 scale per row (its largest
    magnitude / 127), dequantized in the graph."""
    if not int8_rows:
        return graph.constant("word_embeddings", table)
    scales = np.maximum(np.abs(table).max(axis=1), np.finfo(np.float32).tiny) / 127.0
    rows = np.clip(np.rint(table / scales[:, None]), -127, 127).astype(np.int8)
    return graph.node("DequantizeLinear", [graph.constant("word_embeddings_int8", rows),
                                           graph.constant("word_embeddings_scale", scales.astype(np.float32)),
                                           graph.constant("word_embeddings_zero", np.zeros(len(rows), np.int8))],
                      axis=0)[0]


def _embeddings(graph: _Graph, weights: dict[str, np.ndarray], epsilon: float,
                int8_rows: bool = False) -> tuple[str, str]:
    """(token states [n, t, h], the mask's lengths [n]): words + positions + segment 0, normalized.
    Segment 0 is every token's, so its row is added to the position table once, here."""
    ids = graph.node("Cast", ["input_ids"], to=6)[0]   # int32, as the fused operator takes
    mask = graph.node("Cast", ["attention_mask"], to=6)[0]
    positions = weights["embeddings.position_embeddings.weight"] + weights["embeddings.token_type_embeddings.weight"][0]
    states, lengths = graph.node("EmbedLayerNormalization", [
        ids, "", _word_table(graph, weights["embeddings.word_embeddings.weight"], int8_rows),
        graph.constant("position_embeddings", positions), "",
        graph.constant("embeddings_gamma", weights["embeddings.LayerNorm.weight"]),
        graph.constant("embeddings_beta", weights["embeddings.LayerNorm.bias"]), mask],
        outputs=2, domain=CONTRIB, epsilon=epsilon)
    return states, lengths


def _layer(graph: _Graph, weights: dict[str, np.ndarray], index: int, states: str, lengths: str, heads: int,
           epsilon: float) -> str:
    """One transformer layer (post-norm, as BERT): attention, its projection added to the input and
    normalized, then the feed-forward block likewise. Weights are Hugging Face's [out, in]."""
    prefix = f"encoder.layer.{index}"

    def weight(name: str) -> np.ndarray:
        return weights[f"{prefix}.{name}"]

    qkv = np.concatenate([weight(f"attention.self.{part}.weight").T for part in ("query", "key", "value")], axis=1)
    qkv_bias = np.concatenate([weight(f"attention.self.{part}.bias") for part in ("query", "key", "value")])
    attended = graph.node("Attention", [states, graph.constant(f"l{index}_qkv", qkv),
                                        graph.constant(f"l{index}_qkv_bias", qkv_bias), lengths],
                          domain=CONTRIB, num_heads=heads)[0]
    projected = graph.node("MatMul", [attended, graph.constant(f"l{index}_attention_output",
                                                              weight("attention.output.dense.weight").T)])[0]
    states = graph.node("SkipLayerNormalization", [
        projected, states, graph.constant(f"l{index}_attention_gamma", weight("attention.output.LayerNorm.weight")),
        graph.constant(f"l{index}_attention_beta", weight("attention.output.LayerNorm.bias")),
        graph.constant(f"l{index}_attention_output_bias", weight("attention.output.dense.bias"))],
        domain=CONTRIB, epsilon=epsilon)[0]
    hidden = graph.node("MatMul", [states, graph.constant(f"l{index}_intermediate",
                                                          weight("intermediate.dense.weight").T)])[0]
    hidden = graph.node("FastGelu", [hidden, graph.constant(f"l{index}_intermediate_bias",
                                                            weight("intermediate.dense.bias"))], domain=CONTRIB)[0]
    output = graph.node("MatMul", [hidden, graph.constant(f"l{index}_output", weight("output.dense.weight").T)])[0]
    return graph.node("SkipLayerNormalization", [
        output, states, graph.constant(f"l{index}_output_gamma", weight("output.LayerNorm.weight")),
        graph.constant(f"l{index}_output_beta", weight("output.LayerNorm.bias")),
        graph.constant(f"l{index}_output_bias", weight("output.dense.bias"))], domain=CONTRIB, epsilon=epsilon)[0]


def _mean_pooled(graph: _Graph, states: str, projection: tuple[np.ndarray, np.ndarray] | None) -> None:
    """`sentence_embedding`: the token states averaged over the mask (Keras' masked average
    pooling), then a distilled student's projection (kernel [in, out], bias), where it has one."""
    mask = graph.node("Unsqueeze", [graph.node("Cast", ["attention_mask"], to=1)[0],
                                    graph.constant("last_axis", np.array([-1], np.int64))])[0]
    axis = graph.constant("token_axis", np.array([1], np.int64))
    total = graph.node("ReduceSum", [graph.node("Mul", [states, mask])[0], axis], keepdims=0)[0]
    count = graph.node("ReduceSum", [mask, axis], keepdims=0)[0]
    from onnx import helper

    if projection is None:
        graph.nodes.append(helper.make_node("Div", [total, count], [OUTPUT], name="mean_pooling"))
        return
    pooled = graph.node("Div", [total, count])[0]
    projected = graph.node("MatMul", [pooled, graph.constant("projection_kernel", projection[0])])[0]
    graph.nodes.append(helper.make_node("Add", [projected, graph.constant("projection_bias", projection[1])], [OUTPUT],
                                        name="projection"))


def bert_graph(weights: dict[str, np.ndarray], *, layers: int, heads: int, epsilon: float, name: str,
               projection: tuple[np.ndarray, np.ndarray] | None = None, int8_embeddings: bool = False):
    """The ONNX model of a mean-pooled BERT from its Hugging Face-named float32 weights (and the
    Dense projection after pooling of a distilled student, where it has one); `int8_embeddings`:
    the word table stored int8 per row (`_word_table`)."""
    from onnx import TensorProto, helper

    graph = _Graph()
    states, lengths = _embeddings(graph, weights, epsilon, int8_embeddings)
    for index in range(layers):
        states = _layer(graph, weights, index, states, lengths, heads, epsilon)
    _mean_pooled(graph, states, projection)
    dim = projection[0].shape[1] if projection is not None else weights["embeddings.LayerNorm.weight"].shape[0]
    inputs = [helper.make_tensor_value_info(name_, TensorProto.INT64, ["batch", "tokens"]) for name_ in INPUTS]
    outputs = [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", dim])]
    model = helper.make_model(helper.make_graph(graph.nodes, name, inputs, outputs, graph.initializers),
                              opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(CONTRIB, 1)],
                              producer_name="wikisim")
    model.ir_version = 8
    return model


# What `quantize_dynamic` logs (on the root logger) for every graph its `quant_pre_process` has not
# rewritten. That pre-processing is shape inference and ONNX Runtime's optimizer, which would have
# to rediscover the fused operators this graph is written with: nothing to tell the user.
PRE_PROCESSING_ADVICE = "pre-processing before quantization"   # in each of its wordings


def _not_pre_processing_advice(record: logging.LogRecord) -> bool:
    return PRE_PROCESSING_ADVICE not in record.getMessage()


def quantized_int8(model) -> bytes:
    """The graph with its matrix products quantized to int8 dynamically (`INT8_SETTINGS`), as bytes."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="onnx-int8-") as folder:
        source, target = os.path.join(folder, "fp32.onnx"), os.path.join(folder, "int8.onnx")
        onnx.save(model, source)
        logging.getLogger().addFilter(_not_pre_processing_advice)
        try:   # DefaultTensorType: ONNX's shape inference does not type the contrib operators' outputs (float32).
            quantize_dynamic(source, target, weight_type=getattr(QuantType, INT8_SETTINGS["weight_type"]),
                             per_channel=INT8_SETTINGS["per_channel"], reduce_range=INT8_SETTINGS["reduce_range"],
                             op_types_to_quantize=INT8_SETTINGS["op_types"], extra_options={"DefaultTensorType": 1})
        finally:
            logging.getLogger().removeFilter(_not_pre_processing_advice)
        with open(target, "rb") as handle:
            return handle.read()


def settings(*, dim: int, max_tokens: int, similarity: str, quantize: str | None, source: str) -> dict:
    """`onnx.json`: what the encoder needs beside the graph, and what was exported from where."""
    return {"format": FORMAT, "version": 1, "graph": GRAPH_FILE, "inputs": list(INPUTS), "output": OUTPUT,
            "embedding_dim": dim, "max_seq_length": max_tokens,
            "similarity_fn_name": Similarity(similarity).fn_name, "vocabulary": VOCABULARY_FILE,
            "quantization": {"type": quantize, **INT8_SETTINGS} if quantize else None,
            "opset": OPSET, "source": source}


def write_onnx_folder(backbone, vocabulary_path: str, output: str, *, max_tokens: int, similarity: str,
                      quantize: str | None, source: str, projection=None) -> str:
    """Writes the folder's files into the existing folder `output`, each whole (`write_complete`,
    0644), `onnx.json` last. `backbone`: the network's keras-hub BertBackbone, weights loaded;
    `projection`: a distilled student's Dense layer after pooling, or None."""
    norm = backbone.get_layer("embeddings_layer_norm")
    dense = None if projection is None else (np.asarray(projection.kernel.numpy(), np.float32),
                                              np.asarray(projection.bias.numpy(), np.float32))
    model = bert_graph(hf_bert_weights(backbone), layers=backbone.num_layers, heads=backbone.num_heads,
                       epsilon=float(norm.epsilon), name=source, projection=dense, int8_embeddings=bool(quantize))
    dim = int(model.graph.output[0].type.tensor_type.shape.dim[1].dim_value)
    graph = quantized_int8(model) if quantize else model.SerializeToString()
    with open(vocabulary_path, "rb") as handle:
        vocabulary = handle.read()
    files = {GRAPH_FILE: graph, VOCABULARY_FILE: vocabulary,
             TOKENIZER_FILE: WordPieces(vocabulary_path, max_tokens).tokenizer.to_str().encode(),
             CONFIG_FILE: json.dumps(settings(dim=dim, max_tokens=max_tokens,
                                              similarity=similarity, quantize=quantize, source=source),
                                     indent=2).encode()}
    for name in sorted(files, key=lambda name: name == CONFIG_FILE):
        write_complete(os.path.join(output, name), files[name])
    return output
