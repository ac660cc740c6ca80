"""mwparserfromhell's tokenizer, the one piece of it that is not public API, kept here alone.

`pipeline.parse.wikitext` renders prose from the token stream rather than from the node tree that
`mwparserfromhell.parse` builds out of it, at a third of the cost (docs/pipeline.md). The
library exposes only the whole parse; the tokenizer is its internal first step (the C extension
`mwparserfromhell.parser._tokenizer`, or the pure-Python `tokenizer` module where the extension
is not built), called as `Parser.parse` calls it. tests/pipeline/test_mwtokens.py fails when
that changes: the tokens must build, with the library's public `Builder`, the same tree as
`mwparserfromhell.parse`. setup.py pins mwparserfromhell's minor version.
"""
from __future__ import annotations

import threading

import mwparserfromhell.parser

try:
    from mwparserfromhell.parser._tokenizer import CTokenizer as _Tokenizer
    C_TOKENIZER = True
except ImportError:  # pragma: no cover - a wheel without the extension
    from mwparserfromhell.parser.tokenizer import Tokenizer as _Tokenizer
    C_TOKENIZER = False

# The tokenizer keeps its state on the instance and is not thread-safe (the C one crashes the process:
# a segfault on the 2019 file when two bundles of a Flink job ran in the threads of one SDK harness,
# as Beam's portable runners and Dataflow's workers run them): one per thread.
_PER_THREAD = threading.local()


def tokenize(wikitext: str) -> list:
    """The tokens (`mwparserfromhell.parser.tokens`) of a page's wikitext, as `mwparserfromhell.parse`
    makes them (top-level context, style tags parsed). Raises what the tokenizer raises
    (`mwparserfromhell.parser.ParserError`) on text it cannot tokenize."""
    tokenizer = getattr(_PER_THREAD, "tokenizer", None)
    if tokenizer is None:
        tokenizer = _PER_THREAD.tokenizer = _Tokenizer()
    return tokenizer.tokenize(wikitext, 0, False)


def same_tokenizer_as_the_library() -> bool:
    """Whether this is the tokenizer `mwparserfromhell.parse` uses (C when the extension is built)."""
    return C_TOKENIZER == bool(mwparserfromhell.parser.use_c)
