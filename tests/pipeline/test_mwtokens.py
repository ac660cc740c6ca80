"""The one private piece of mwparserfromhell the pipeline uses (its tokenizer) still behaves as the
library's own parse uses it: this test fails when an upgrade changes it."""
import itertools

import mwparserfromhell
import pytest
from mwparserfromhell.parser.builder import Builder

from pipeline.parse.mwtokens import same_tokenizer_as_the_library, tokenize
from pipeline.read.dumps import Page, decode_pages, embedded_dump_path


def _real_pages(count: int) -> list[str]:
    pages = (page for page in decode_pages(embedded_dump_path())
             if isinstance(page, Page) and page.namespace == 0 and not page.redirect)
    return [page.text for page in itertools.islice(pages, count)]


def test_it_is_the_tokenizer_the_library_parses_with():
    assert same_tokenizer_as_the_library()


@pytest.mark.slow   # seconds: the full tier (the fast tier stays under 3 minutes)
def test_its_tokens_build_the_tree_the_library_parses_on_real_pages():
    texts = _real_pages(12)
    assert len(texts) == 12
    for text in texts:
        ours = Builder().build(tokenize(text))
        library = mwparserfromhell.parse(text)
        assert str(ours) == str(library) == text
        assert [type(node) for node in ours.nodes] == [type(node) for node in library.nodes]
        assert len(ours.filter_templates()) == len(library.filter_templates()) > 0


@pytest.mark.slow   # seconds
def test_threads_of_one_process_tokenize_at_once_as_one_thread_does():
    """A portable runner's SDK harness (Flink, Prism, Dataflow) runs bundles in the threads of one
    process: one shared tokenizer gave wrong tokens, "C tokenizer exited with non-empty token stack",
    and on the 2019 file a segfault."""
    from concurrent.futures import ThreadPoolExecutor

    texts = _real_pages(60)
    alone = [repr(tokenize(text)) for text in texts]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            assert list(pool.map(lambda text: repr(tokenize(text)), texts)) == alone
