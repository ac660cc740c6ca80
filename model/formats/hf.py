"""A trained transformer encoder as a Hugging Face / sentence-transformers folder.

`model.train` writes it beside the ENCODER (as the model dir's SENTENCE_TRANSFORMERS) for every
transformer encoder, and `python -m model.export` from a model dir. The folder holds what both
libraries read:

- `config.json`, `model.safetensors` (the fine-tuned weights under Hugging Face's BERT or MPNet
  names) and the checkpoint's tokenizer files: `transformers.AutoModel`, and for BERT keras-hub's
  `BertBackbone.from_preset(DIR)`;
- `modules.json` (Transformer, then mean Pooling), `1_Pooling/config.json`,
  `sentence_bert_config.json` (`max_seq_length`: the Keras export's wordpieces per sentence, so the
  two truncate alike) and `config_sentence_transformers.json` (`similarity_fn_name`):
  `sentence_transformers.SentenceTransformer(DIR)`;
- `README.md`: the model card.

There is no Normalize module: the embeddings are the Keras export's, unscaled, so either can be
checked against the other; `similarity_fn_name` says how to compare them.

keras-hub reads Hugging Face BERT checkpoints (`keras_hub/src/utils/transformers/convert_bert.py`)
but writes none, so `hf_bert_weights` below is the inverse of that reader's mapping, written here;
a test reads the folder back with keras-hub's own loader and compares the embeddings.
"""
from __future__ import annotations

import json
import os

import numpy as np

from core.cli import UsageError
from core.files import JsonFileError, read_json_object, write_complete
from model.checkpoints import CHECKPOINTS
from model.similarity import REPORTED, Similarity
from model.training.model_dir import ENCODER, History

FORMATS = ("sentence-transformers",)   # what `model.export --format` writes
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def hf_bert_weights(backbone) -> dict[str, np.ndarray]:
    """The weights of a keras-hub `BertBackbone` under Hugging Face `BertModel`'s names and shapes
    (dense kernels transposed; attention kernels [hidden, heads, head_dim] flattened)."""
    def dense(kernel) -> np.ndarray:   # Keras [in, ..., out] -> torch Linear [out, in]
        value = np.asarray(kernel.numpy())
        return value.reshape(value.shape[0], -1).T if value.ndim == 3 else value.T

    def attention_output(kernel) -> np.ndarray:   # [heads, head_dim, hidden] -> [hidden, heads * head_dim]
        value = np.asarray(kernel.numpy())
        return value.reshape(-1, value.shape[-1]).T

    def flat(bias) -> np.ndarray:
        return np.asarray(bias.numpy()).reshape(-1)

    weights = {
        "embeddings.word_embeddings.weight": backbone.get_layer("token_embedding").embeddings,
        "embeddings.position_embeddings.weight": backbone.get_layer("position_embedding").position_embeddings,
        "embeddings.token_type_embeddings.weight": backbone.get_layer("segment_embedding").embeddings,
        "embeddings.LayerNorm.weight": backbone.get_layer("embeddings_layer_norm").gamma,
        "embeddings.LayerNorm.bias": backbone.get_layer("embeddings_layer_norm").beta,
    }
    arrays = {name: np.asarray(variable.numpy()) for name, variable in weights.items()}
    for index in range(backbone.num_layers):
        block = backbone.get_layer(f"transformer_layer_{index}")
        attention, prefix = block._self_attention_layer, f"encoder.layer.{index}"
        for part in ("query", "key", "value"):
            projection = getattr(attention, f"{part}_dense")
            arrays[f"{prefix}.attention.self.{part}.weight"] = dense(projection.kernel)
            arrays[f"{prefix}.attention.self.{part}.bias"] = flat(projection.bias)
        arrays[f"{prefix}.attention.output.dense.weight"] = attention_output(attention.output_dense.kernel)
        arrays[f"{prefix}.attention.output.dense.bias"] = flat(attention.output_dense.bias)
        arrays[f"{prefix}.attention.output.LayerNorm.weight"] = flat(block._self_attention_layer_norm.gamma)
        arrays[f"{prefix}.attention.output.LayerNorm.bias"] = flat(block._self_attention_layer_norm.beta)
        arrays[f"{prefix}.intermediate.dense.weight"] = dense(block._feedforward_intermediate_dense.kernel)
        arrays[f"{prefix}.intermediate.dense.bias"] = flat(block._feedforward_intermediate_dense.bias)
        arrays[f"{prefix}.output.dense.weight"] = dense(block._feedforward_output_dense.kernel)
        arrays[f"{prefix}.output.dense.bias"] = flat(block._feedforward_output_dense.bias)
        arrays[f"{prefix}.output.LayerNorm.weight"] = flat(block._feedforward_layer_norm.gamma)
        arrays[f"{prefix}.output.LayerNorm.bias"] = flat(block._feedforward_layer_norm.beta)
    pooler = backbone.get_layer("pooled_dense")
    arrays["pooler.dense.weight"] = dense(pooler.kernel)
    arrays["pooler.dense.bias"] = flat(pooler.bias)
    return {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in arrays.items()}


def hf_weights(backbone) -> dict[str, np.ndarray]:
    """The backbone's weights under Hugging Face's names: BERT's (`hf_bert_weights`) or MPNet's
    (`model.net.mpnet.hf_mpnet_weights`)."""
    from model.net.mpnet import MPNetBackbone, hf_mpnet_weights  # Keras: loaded once its backend is chosen

    return hf_mpnet_weights(backbone) if isinstance(backbone, MPNetBackbone) else hf_bert_weights(backbone)


def backbone_of(encoder):
    """The keras-hub backbone inside the trainer's transformer sentence encoder."""
    import keras_hub

    for layer in encoder.layers:
        if isinstance(layer, keras_hub.models.Backbone):
            return layer
    raise ValueError(f"{encoder.name} holds no keras-hub backbone: only transformer encoders export to "
                     "sentence-transformers")


PROJECTION = "2_Dense"   # a distilled student's projection to its teacher's size (sentence-transformers' Dense)


def sentence_transformers_files(dim: int, max_tokens: int, similarity: str,
                                projected_to: int | None = None) -> dict[str, dict | list]:
    """The sentence-transformers configuration files of a mean-pooled transformer of `dim`
    dimensions, by path; with `projected_to`, followed by a linear Dense layer to that size (a
    student distilled from a larger teacher: `model.net.network.build_models`)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    dense = {}
    if projected_to:
        modules.append({"idx": 2, "name": "2", "path": PROJECTION, "type": "sentence_transformers.models.Dense"})
        dense = {f"{PROJECTION}/config.json": {"in_features": dim, "out_features": projected_to, "bias": True,
                                               "activation_function": "torch.nn.modules.linear.Identity"}}
    return {
        "modules.json": modules,
        **dense,
        "1_Pooling/config.json": {
            "word_embedding_dimension": dim, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True,
            "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False},
        "sentence_bert_config.json": {"max_seq_length": max_tokens, "do_lower_case": False},
        "config_sentence_transformers.json": {"similarity_fn_name": Similarity(similarity).fn_name,
                                              "prompts": {}, "default_prompt_name": None},
    }


def export_entries() -> tuple[str, ...]:
    """The top-level entries `write_sentence_transformers` writes: what `model.export` claims
    its `--output` for, and all `--overwrite` deletes there."""
    return (*TOKENIZER_FILES, "config.json", "model.safetensors", "README.md",
            *sorted({path.split("/")[0] for path in sentence_transformers_files(1, 1, Similarity.COSINE, 2)}))


def write_sentence_transformers(encoder, checkpoint: str, output: str, *, max_tokens: int, similarity: str,
                                card: str) -> str:
    """Writes the folder's files into the existing folder `output`, each whole (a temporary file,
    then a rename: `core.files.write_complete`, mode 0644) and `modules.json`, what
    sentence-transformers reads first, last: a killed export is never a loadable half.
    `checkpoint`: the pre-trained checkpoint's folder, whose `config.json` (with the backbone's
    layer count) and tokenizer files the fine-tuned model keeps. Returns `output`."""
    from safetensors.numpy import save

    backbone = backbone_of(encoder)
    files: dict[str, bytes] = {}
    for name in TOKENIZER_FILES:
        with open(os.path.join(checkpoint, name), "rb") as handle:
            files[name] = handle.read()
    config = read_json_object(os.path.join(checkpoint, "config.json"))
    config["num_hidden_layers"] = backbone.num_layers   # fewer than the checkpoint's for a layer-reduced student
    files["config.json"] = json.dumps(config, indent=2).encode()
    files["model.safetensors"] = save(hf_weights(backbone), metadata={"format": "pt"})
    files["README.md"] = card.encode("utf-8")
    projection = next((layer for layer in encoder.layers if layer.name == "projection"), None)
    if projection is not None:   # torch's Linear: weight [out, in]
        files[f"{PROJECTION}/model.safetensors"] = save(
            {"linear.weight": np.ascontiguousarray(np.asarray(projection.kernel).T, np.float32),
             "linear.bias": np.asarray(projection.bias, np.float32)}, metadata={"format": "pt"})
    settings = sentence_transformers_files(int(backbone.hidden_dim), max_tokens, similarity,
                                           int(encoder.output_shape[-1]) if projection is not None else None)
    files.update({path: json.dumps(value, indent=2).encode() for path, value in settings.items()})
    for folder in {os.path.dirname(path) for path in files} - {""}:
        os.makedirs(os.path.join(output, folder), exist_ok=True)
    for path in sorted(files, key=lambda path: path == "modules.json"):
        write_complete(os.path.join(output, path), files[path])
    return output


def report_scores(report: str | None, method: str) -> list[str]:
    """Lines of the model card for `method`'s rows in an eval report folder (`eval.all`'s
    triplets.json and scb.json), with their 95 % intervals; a file that is not such a report
    is a JsonFileError naming it, and a report without `method`'s rows a UsageError naming the
    methods it has: a card never silently lacks the scores it was asked for."""
    if not report:
        return []
    lines: list[str] = []
    methods: set[str] = set()
    triplets_path, scb_path = os.path.join(report, "triplets.json"), os.path.join(report, "scb.json")
    try:
        if os.path.exists(triplets_path):
            triplets = read_json_object(triplets_path, {"methods": list})
            lines += _triplet_lines(triplets, method)
            methods |= {entry["method"] for entry in triplets["methods"]}
        if os.path.exists(scb_path):
            scb = read_json_object(scb_path, {"summary": list})
            lines += _scb_lines(scb, method)
            methods |= {entry["method"] for entry in scb["summary"]}
    except JsonFileError:
        raise
    except (KeyError, TypeError, ValueError) as error:
        raise JsonFileError(f"--report {report}: its triplets.json or scb.json lacks a field an eval.all report "
                            f"holds ({type(error).__name__}: {error})") from None
    if not lines:
        raise UsageError(f"--report {report} holds no scores of {method!r} (the --model-dir's folder name, which "
                         f"eval.all gives its rows); its triplets.json and scb.json score "
                         f"{', '.join(map(repr, sorted(methods))) or 'no method'}: pass the report that scored "
                         "this model dir")
    return lines


def _triplet_lines(result: dict, method: str) -> list[str]:
    lines = []
    for entry in result["methods"]:
        if entry["method"] == method:
            for distance in REPORTED:
                low, high = entry[f"interval_{distance}"]["low"], entry[f"interval_{distance}"]["high"]
                lines.append(f"- triplet accuracy ({distance}), {result['dataset']} {result['split']}, "
                             f"n = {result['triplets']}: {entry[f'accuracy_{distance}']:.3f} "
                             f"(95 % interval {low:.3f}-{high:.3f})")
    return lines


def _scb_lines(result: dict, method: str) -> list[str]:
    lines = []
    for entry in result["summary"]:
        if entry["method"] == method and entry["variant"] == "all":
            interval = entry["ARI_interval"]
            lines.append(f"- SCB {entry['algorithm']} ARI, all sentences, n = {entry['articles']} articles: "
                         f"{entry['ARI']:.3f} (95 % interval {interval['low']:.3f}-{interval['high']:.3f})")
    return lines


# The card's metadata (Hugging Face's model card YAML): the base checkpoint and its licence, by --encoder.
BASE_MODELS = {name: (checkpoint.hub_id, checkpoint.license) for name, checkpoint in CHECKPOINTS.items()}
CARD_DATASETS = ("wikimedia/wikipedia",)   # the Hub's name of the Wikipedia dumps the triplets come from
CARD_TAGS = ("sentence-transformers", "feature-extraction", "sentence-similarity", "wikipedia-sections",
             "triplet-loss")


def _front_matter(encoder: str) -> str:
    base, license_name = BASE_MODELS.get(encoder, (None, None))
    lines = ["---", "library_name: sentence-transformers", "pipeline_tag: sentence-similarity",
             *([f"base_model: {base}", f"license: {license_name}"] if base else []), "language:", "- en",
             "datasets:", *(f"- {name}" for name in CARD_DATASETS), "tags:", *(f"- {tag}" for tag in CARD_TAGS),
             "---"]
    return "\n".join(lines)


def _trained_on(history: History | None, flags: dict) -> str:
    """What the card says the run was trained on: the dataset's splits and the dump, by the run's
    own record (`core.published.Run.provenance`), never a local path; only what is recorded."""
    counts = {split: history.expected_records(split) if history else None for split in ("train", "validation", "test")}
    splits = ", ".join(f"{count:,} {split}" for split, count in counts.items() if isinstance(count, int))
    source = (history.trained_on if history else None) or {}
    dump = source.get("dump")
    if dump:
        dated = f", {source['dump_date']}" if source.get("dump_date") else ""
        kept = (f"; {source['articles']:,} articles kept of {source['pages']:,} pages"
                if isinstance(source.get("articles"), int) and isinstance(source.get("pages"), int) else "")
        dump = f" built by wikisim's pipeline from the Wikipedia dump `{dump}`{dated}{kept}"
    seen = history.learning_curve[-1].get("triplets_seen") if history and history.learning_curve else None
    return (f"`{flags.get('dataset')}` triplets" + (f" ({splits})" if splits else "") + (dump or "") +
            (f"; {seen:,} training triplets seen" if isinstance(seen, int) else "") +
            (f", seed {flags['seed']}" if flags.get("seed") is not None else ""))


def _recipe(history: History | None, flags: dict, similarity: str) -> str:
    """The recipe's numbers the run recorded, each only where it did (the flags' where there is
    no history: an untrained export)."""
    batch = history.global_batch_size if history else flags.get("batch_size")
    learning_rate = (history.learning_rate if history else None) or flags.get("learning_rate")
    epochs_run, soup = (history.epochs_run, history.soup) if history else (None, None)
    parts = [f"batch {batch}" if batch else None,
             f"peak learning rate {learning_rate:g}" if learning_rate else None,
             f"distance {similarity}",
             f"frozen layers {flags['frozen_layers']}" if flags.get("frozen_layers") is not None else None,
             f"epochs run {epochs_run}" if epochs_run is not None else None,
             f"a soup of {len(soup['runs'])} runs" if soup else None]
    return ", ".join(part for part in parts if part)


def _own_score(history: History | None, flags: dict, similarity: str) -> list[str]:
    accuracy = history.test_triplet_accuracy if history else None
    if history is None or accuracy is None or accuracy != accuracy:   # not measured (or NaN)
        return ["- No score was measured with this model dir; `python -m model.export --report` adds eval.all's, "
                "with 95 % intervals."]
    sample = history.evaluation_triplets
    n = sample if isinstance(sample, int) else history.expected_records("test")
    size = f", n = {n:,} triplets" if isinstance(n, int) else ""
    return [f"- triplet accuracy ({similarity}), {flags.get('dataset')} test split{size}: {accuracy:.3f} "
            "(model.train's own score; `python -m model.export --report` adds eval.all's, with 95 % intervals)"]


def model_card(history: History | None, flags: dict, name: str, similarity: str, max_tokens: int,
               report_lines: list[str], dim: int) -> str:
    """The README.md of the export, as a Hugging Face user would publish it: YAML metadata (the
    base checkpoint, its licence, the language and data), what it was trained on (by the run's
    own record, not a local path), its scores only where measured, each with its split and n, and
    how to load it. `flags`: the run's (its history's `config`; the recorded flags of a model dir
    without one). No field reads None or nan, whichever trainer wrote the model dir."""
    encoder: str = flags["encoder"]   # every transformer run records it
    base = BASE_MODELS.get(encoder, (encoder, None))[0]
    scores = report_lines or _own_score(history, flags, similarity)
    return f"""{_front_matter(encoder)}

# {name}: thematic sentence similarity learned from Wikipedia sections

[{base}](https://huggingface.co/{base}) fine-tuned as a triplet network (Ein Dor et al., ACL 2018):
two sentences of one Wikipedia section should be closer than a sentence of another section.

- Trained on: {_trained_on(history, flags)}.
- Recipe: {_recipe(history, flags, similarity)}.
- Embeddings: {dim} floats, mean pooling over at most {max_tokens}
  wordpieces; compare them by **{Similarity(similarity).fn_name}** similarity.

## Scores

{chr(10).join(scores)}

## Intended use and limits

Grouping and retrieving sentences by topic, as sections of an encyclopedia group them. It was
trained on English Wikipedia prose only; it is not a paraphrase or entailment model, and
sentences longer than {max_tokens} wordpieces are truncated.

## Loading

```python
from sentence_transformers import SentenceTransformer

folder = "{name}"   # this folder's path, or its id on the Hub once uploaded ("your-name/{name}")
model = SentenceTransformer(folder)
embeddings = model.encode(["A sentence.", "Another one."])
```

keras-hub: `keras_hub.models.BertBackbone.from_preset(folder)` (mean-pool its
`sequence_output` over the padding mask). Its `BertTokenizer` does not strip accents as this
checkpoint's tokenizer does, so on accented text ("Café", "Zürich") its embeddings differ from
the ones above; tokenise with `tokenizers` (`tokenizer.json`) instead. TF Serving: serve the
model dir's `{ENCODER}/` SavedModel, which takes raw strings (`model.encoding.encoder.load_encoder` in this
project).
"""
