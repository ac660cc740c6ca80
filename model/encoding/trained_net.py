"""A model dir's Net rebuilt from the flags its run recorded, under whichever Keras backend this
process runs (TensorFlow, or JAX on an image without it), and `NetEncoder`, the encoder that runs
it: what `model.soup`, `model.export` and a `--teacher` use where no SavedModel can be loaded.

A transformer's Net reads wordpiece ids, which `model.net.wordpieces` makes without TensorFlow;
so a transformer's model dir encodes, is averaged and is exported (ONNX, sentence-transformers)
under JAX alone. The BiLSTM's word ids are tensorflow-text's (`model.net.text`): it needs
TensorFlow everywhere.
"""
from __future__ import annotations

import json
import os

import numpy as np

from core.cli import UsageError
from core.files import is_remote
from model import keras_backend_here, tensorflow_importable
from model.checkpoints import CHECKPOINTS
from model.config import TrainConfig
from model.encoding.encoder import ExportedEncoder, SavedModelEncoder
from model.net.wordpieces import wordpieces
from model.similarity import Similarity
from model.training.model_dir import ENCODER, INPUTS, VOCABULARY, ModelDir

WIDTH_STEP = 16   # ids are padded to a multiple of this: few shapes for JAX to compile


def recorded_config(model_dir: str) -> tuple[dict, TrainConfig]:
    """The flags a model dir's INPUTS records (`model.training.model_dir.ModelDir.recorded_flags`),
    and the TrainConfig they make; a UsageError naming the file for flags this version cannot
    run (an unknown flag, a bad value)."""
    flags = ModelDir(model_dir).recorded_flags()
    try:
        return flags, TrainConfig.from_flags(**{**flags, "model_dir": model_dir})
    except (TypeError, ValueError, KeyError) as error:
        why = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UsageError(f"{ModelDir(model_dir).file(INPUTS)}: its flags are not ones this version can rebuild the "
                         f"network from ({why})") from None


def network_of(train_config: TrainConfig):
    """(word ids, Net, compiled triplet model) of a recorded TrainConfig under the backend Keras
    runs here, built as the trainer builds them (its weights the untrained ones: the
    checkpoint's, for a transformer): what `rebuilt` loads a model dir's weights into, and what
    `model.soup` averages runs from. The word ids are those a SavedModel export tokenises with
    (TensorFlow's): None under another backend."""
    import keras

    # Keras at their top: imported here, once `rebuilt` or the caller has chosen its backend
    from model.net.network import build_models
    from model.training.vocabulary import embedding_matrix

    inputs, optimizer = train_config.inputs, train_config.optimizer
    word_ids, matrix = None, None
    if train_config.network.kind.reads_word_vectors:
        from model.net.text import WordIds  # TensorFlow's tokenizer, as every BiLSTM's

        with open(ModelDir(train_config.runtime.model_dir).file(VOCABULARY), encoding="utf-8") as handle:
            vocabulary = handle.read().splitlines()
        word_ids = WordIds(vocabulary, inputs.num_oov_buckets, inputs.max_tokens)
        matrix = embedding_matrix(vocabulary, word_ids, train_config)
    elif keras.backend.backend() == "tensorflow":
        from model.net.transformer import token_ids  # TensorFlow: this backend alone

        word_ids = token_ids(inputs.max_tokens, train_config.network.encoder, train_config.network.checkpoint)
    teacher_dim = output_dim(optimizer.teacher) if optimizer.teacher else None
    encoder, model = build_models(train_config, matrix, global_batch=optimizer.batch_size, teacher_dim=teacher_dim)
    return word_ids, encoder, model


def output_dim(path: str) -> int:
    """The size of the embeddings of the trained encoder at `path`, from what a transformer's
    model dir records (a distilled student's is its teacher's; else its checkpoint's hidden size),
    without building it; any other encoder is loaded to ask."""
    if not is_remote(path) and os.path.exists(ModelDir(path).file(INPUTS)):
        _, config = recorded_config(path)
        if config.optimizer.teacher:
            return output_dim(config.optimizer.teacher)
        if not config.network.kind.reads_word_vectors:
            folder = CHECKPOINTS[config.network.encoder].folder(config.network.checkpoint)
            with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
                return int(json.load(handle)["hidden_size"])
    return load_trained(path).dim


def rebuilt(model_dir: str, weights: str):
    """(recorded flags, TrainConfig as rebuilt here, word ids, Net, triplet model with `weights`
    loaded): a model dir's network rebuilt from what its INPUTS records, whichever backend
    trained it (Keras weights files are the same under every backend), in float32."""
    keras_backend_here()   # where Keras has not loaded yet: TensorFlow's where it is installed, else JAX's
    import keras

    flags, train_config = recorded_config(model_dir)
    train_config = train_config.with_flags(backend=keras.backend.backend(), distribution_strategy="auto",
                                           precision="float32")   # float32 weights, computed in float32
    word_ids, encoder, model = network_of(train_config)
    model.optimizer.build(model.trainable_variables)   # the checkpoint holds its state too
    model.load_weights(weights)
    return flags, train_config, word_ids, encoder, model


class NetEncoder(ExportedEncoder):
    """Encodes with a transformer model dir's Net in Keras (any backend), from its best
    checkpoint or `weights`: `model.train --teacher` and the eval jobs' `saved:` where the model
    dir has no SavedModel `encoder/` or TensorFlow is not installed (a JAX run on an accelerator
    image). The same embeddings as the model dir's exports, up to float32 rounding."""

    def __init__(self, model_dir: str, name: str | None = None, batch_size: int = 128, weights: str | None = None):
        flags, config = recorded_config(model_dir)
        if config.network.kind.reads_word_vectors:
            raise UsageError(f"{model_dir}: a {config.network.encoder} model dir encodes through its SavedModel "
                             f"{ENCODER}/, which needs TensorFlow")
        weights = weights or ModelDir(model_dir).best_weights
        if not os.path.exists(weights):
            raise UsageError(f"{model_dir}: no trained weights ({weights})")
        _, config, _, self._net, _ = rebuilt(model_dir, weights)
        self.name = name or os.path.basename(model_dir.rstrip("/"))
        self.batch_size = batch_size
        self.dim = int(self._net.output_shape[-1])
        self.similarity_function = Similarity.named(config.resolved("distance"))
        self.similarity_fn_name = self.similarity_function.fn_name
        self.max_seq_length = config.inputs.max_tokens
        self._ids = wordpieces(config.inputs.max_tokens, config.network.encoder, config.network.checkpoint)

    def _embed(self, sentences: list[str], batch_size: int, show_progress_bar: bool) -> np.ndarray:
        """float32 [n, d] in batches of similar length, each of `batch_size` rows (padding rows at
        the end) and a multiple of WIDTH_STEP ids wide: few shapes to compile under JAX."""
        from tqdm import tqdm

        embeddings = np.empty((len(sentences), self.dim), np.float32)
        if not sentences:
            return embeddings
        ids = self._ids(sentences)
        lengths = (ids != 0).sum(axis=1)
        order = np.argsort(lengths, kind="stable")
        for start in tqdm(range(0, len(sentences), batch_size), desc="Batches", unit="batch",
                          disable=not show_progress_bar):
            rows = order[start:start + batch_size]
            width = min(ids.shape[1], -(-int(lengths[rows].max()) // WIDTH_STEP) * WIDTH_STEP)
            batch = np.zeros((batch_size, width), np.int32)
            batch[:len(rows)] = ids[rows, :width]
            embeddings[rows] = np.asarray(self._net.predict_on_batch(batch), np.float32)[:len(rows)]
        return embeddings


def has_saved_model(path: str) -> bool:
    """Whether `path` holds a SavedModel encoder (the folder itself, or a model dir's ENCODER)."""
    return any(os.path.exists(os.path.join(folder, "saved_model.pb")) for folder in (path, os.path.join(path, ENCODER)))


def runs_as_net(path: str) -> bool:
    """Whether the trained encoder at `path` runs as its Net in Keras (`NetEncoder`) rather than
    as its SavedModel: a local model dir with its INPUTS and trained weights, where the SavedModel
    is missing or this process cannot import TensorFlow (an accelerator image; `model.train
    --backend jax`, which keeps it out)."""
    model_dir = ModelDir(path)
    return (not is_remote(path) and os.path.exists(model_dir.file(INPUTS)) and os.path.exists(model_dir.best_weights)
            and not (has_saved_model(path) and tensorflow_importable()))


def load_trained(path: str, name: str | None = None, threads: int | None = None) -> ExportedEncoder:
    """The trained encoder at `path` (a model dir, or a SavedModel folder, local or remote): its
    Net where `runs_as_net`, else its SavedModel (`threads`: TensorFlow's); a UsageError naming a
    local path that holds neither."""
    if runs_as_net(path):
        return NetEncoder(path, name=name)
    if not is_remote(path) and not has_saved_model(path):
        raise UsageError(f"{path}: no trained encoder there (no SavedModel, nor a model dir with trained weights)")
    return SavedModelEncoder(path, name=name, threads=threads)
