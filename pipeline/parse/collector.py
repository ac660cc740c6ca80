"""Python's cyclic garbage collector, paused while one page's allocation-heavy work runs.

The tokenizer of `wikitext.parse_wikitext` makes a tracked object per token, up to hundreds of
thousands per page, all alive until the page is rendered, and spaCy's pipeline (`sentences`)
makes Docs, Spans and sentences by the thousand per page. Each collection their allocation
triggers walks the objects still alive again: on the 16x excerpt, one worker, that took 1.3x
the parse itself and a third of the sentence splitting (docs/results.md, issue 64). Neither
makes the reference cycles the collector is for, so reference counting frees what they leave;
any cycle is collected once the collector runs again.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off inside the block and, after it, as it was before (also on an
    error). Threads share the switch: a thread that ends its block while another is inside
    turns the collector back on early, which costs that one time, never correctness."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
