"""The transformer's tokenizer without TensorFlow: sentences -> int32 wordpiece ids [n, t], 0 = [PAD].

The same ids as `model.net.transformer.BertIds`, the SavedModel export's in-graph tokenizer (a test
checks every sentence of the embedded excerpt), from Hugging Face `tokenizers` (Rust) built on the
checkpoint's `vocab.txt` with that tokenizer's steps, not the checkpoint's own `BertNormalizer`:

- normalize as `model.net.transformer.normalize`: tabs, newlines and Unicode spaces (Zs) become
  spaces, control and format characters and U+FFFD are dropped, NFD, combining marks dropped, lower
  case;
- split as tensorflow-text's `BasicTokenizer`: on ASCII whitespace (so U+2028 stays inside a word,
  where the checkpoint's tokenizer would split), each punctuation character (ASCII's and Unicode's
  P*) and each CJK ideograph a word of its own;
- wordpieces, longest match first, `##` continuations, a word that cannot be split [UNK];
  tensorflow-text makes a word of more than 100 *bytes* [UNK] where `tokenizers` counts characters,
  so the few non-ASCII words of 101+ bytes but at most 100 characters are redone here;
- at most `max_tokens` ids with [CLS] first and [SEP] last, padded with 0 to the longest sentence.

The ONNX encoder (`model.encoding.encoder.OnnxEncoder`) and the trainer's input
(`model.training.arrays`) tokenize with it; it imports neither TensorFlow nor Keras.
"""
from __future__ import annotations

import os

import numpy as np

from model.checkpoints import CHECKPOINTS, Checkpoint, read_vocabulary

MAX_WORD_BYTES = 100   # tensorflow-text's `max_bytes_per_word`
# tensorflow-text's BasicTokenizer delimiters kept as words: ASCII punctuation, Unicode P*, CJK ideographs.
KEPT_DELIMITERS = ("[!-/]|[:-@]|[\\[-`]|[{-~]|\\p{P}|[\\x{4E00}-\\x{9FFF}]|[\\x{3400}-\\x{4DBF}]|"
                   "[\\x{20000}-\\x{2A6DF}]|[\\x{2A700}-\\x{2B73F}]|[\\x{2B740}-\\x{2B81F}]|"
                   "[\\x{2B820}-\\x{2CEAF}]|[\\x{F900}-\\x{FAFF}]|[\\x{2F800}-\\x{2FA1F}]")


def bert_tokenizer(vocabulary: list[str], max_tokens: int, checkpoint: Checkpoint):
    """A `tokenizers.Tokenizer` doing what `BertIds` does (the module docstring), truncating to
    `max_tokens` ids with the checkpoint's [CLS] and [SEP], padding with id 0 to the longest of a
    batch (`vocabulary` numbered padding first)."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    ids = {token: index for index, token in enumerate(vocabulary)}
    pad, unk, cls, sep = checkpoint.pad, checkpoint.unk, checkpoint.cls, checkpoint.sep
    tokenizer = Tokenizer(WordPiece(ids, unk_token=unk, continuing_subword_prefix="##",
                                    max_input_chars_per_word=MAX_WORD_BYTES))
    tokenizer.normalizer = normalizers.Sequence([
        normalizers.Replace(Regex("[\\t\\n\\r\\p{Zs}]"), " "),
        normalizers.Replace(Regex("[\\p{Cc}\\p{Cf}\\x{FFFD}]"), ""),
        normalizers.NFD(), normalizers.Replace(Regex("\\p{Mn}"), ""), normalizers.Lowercase()])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("[\\t\\n\\f\\r ]+"), behavior="removed"),
        pre_tokenizers.Split(Regex(KEPT_DELIMITERS), behavior="isolated")])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", special_tokens=[(cls, ids[cls]), (sep, ids[sep])])
    tokenizer.enable_truncation(max_tokens)
    tokenizer.enable_padding(pad_id=ids[pad], pad_token=pad)
    return tokenizer


class WordPieces:
    """Sentences -> int32 ids [n, t] with [CLS] first and [SEP] last (at most `max_tokens` in all),
    0 = padding: `model.net.transformer.BertIds`' ids, in NumPy. `checkpoint`: whose special tokens
    (`model.checkpoints`); its vocabulary is numbered padding first."""

    def __init__(self, vocabulary_path: str, max_tokens: int = 64, checkpoint: Checkpoint = CHECKPOINTS["minilm"]):
        self.vocabulary = read_vocabulary(vocabulary_path, checkpoint)
        if max_tokens < 3:
            raise ValueError(f"max_tokens must be >= 3 ([CLS], a wordpiece, [SEP]), got {max_tokens}")
        self.max_tokens = max_tokens
        self.tokenizer = bert_tokenizer(self.vocabulary, max_tokens, checkpoint)
        self._unk, self._cls, self._sep = (self.vocabulary.index(token)
                                           for token in (checkpoint.unk, checkpoint.cls, checkpoint.sep))

    def __call__(self, sentences: list[str]) -> np.ndarray:
        if not sentences:
            return np.zeros((0, 2), np.int32)
        rows = [encoding.ids for encoding in self.tokenizer.encode_batch(list(sentences))]
        redone = [index for index, sentence in enumerate(sentences) if self._has_long_word(sentence)]
        for index in redone:
            rows[index] = self._byte_limited(sentences[index], len(rows[index]))
        ids = np.array(rows, np.int32)
        return ids[:, : (ids != 0).sum(axis=1).max()] if redone else ids

    def _has_long_word(self, sentence: str) -> bool:
        """Whether the sentence may hold a word of more than `MAX_WORD_BYTES` bytes, which `tokenizers`
        would not make [UNK] (it counts characters): an ASCII one cannot (a byte a character). The
        check is on the normalized sentence split on ASCII whitespace, as the pre-tokenizer first
        splits it (its words are parts of those pieces; the only other ASCII space, \\v, is a control
        character the normalizer drops), so a sentence is redone only where a piece is that long:
        checking the raw sentence's length redid 7 % of the 2019 data's sentences, this about none."""
        if sentence.isascii() or len(sentence.encode("utf-8")) <= MAX_WORD_BYTES:
            return False
        normalized = self.tokenizer.normalizer.normalize_str(sentence).encode("utf-8")
        return max(map(len, normalized.split()), default=0) > MAX_WORD_BYTES

    def _byte_limited(self, sentence: str, width: int) -> list[int]:
        """The ids of a sentence tokenized word by word, a word of more than `MAX_WORD_BYTES` bytes
        [UNK] (tensorflow-text's limit), padded to `width`."""
        normalized = self.tokenizer.normalizer.normalize_str(sentence)
        pieces: list[int] = []
        for word, _ in self.tokenizer.pre_tokenizer.pre_tokenize_str(normalized):
            if len(word.encode("utf-8")) > MAX_WORD_BYTES:
                pieces.append(self._unk)
            else:
                pieces.extend(token.id for token in self.tokenizer.model.tokenize(word))
        ids = [self._cls, *pieces[: self.max_tokens - 2], self._sep]
        return ids + [0] * (width - len(ids))


def wordpieces(max_tokens: int = 64, name: str = "minilm", folder: str | None = None) -> WordPieces:
    """The checkpoint's tokenizer (`folder`: `--checkpoint`, else the installed one):
    `model.net.transformer.token_ids`, in NumPy."""
    checkpoint = CHECKPOINTS[name]
    return WordPieces(os.path.join(checkpoint.folder(folder), "vocab.txt"), max_tokens, checkpoint)
