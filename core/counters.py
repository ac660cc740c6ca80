"""The pipeline's counter names: a data contract like `records` (stats.json lists every counter,
`pipeline.run` reconciles them, `infra.sizing` and users read them). The counters that more than
one module names are defined here (those named after an outcome are built by the functions
below or from `READ_REASON_PREFIX`); the rules' own per-section and per-sentence counts
(`sentences_too_short`, ...) are named where `pipeline.triplets.rules` counts them, the only place.
`job_totals` reads the namespace back from a finished job (pipeline.run, eval.scb).
"""
from core.cli import DataLossError
from core.records import NegativeStrategy

NAMESPACE = "wikisim"   # the Beam metrics namespace of every counter below

# The read stage.
PAGES_READ = "pages_read"
INDEX_PAGES = "index_pages"                       # pages the multistream index lists
READ_PAGES_DEAD_LETTERED = "read_pages_dead_lettered"
READ_FRAGMENTS_DEAD_LETTERED = "read_fragments_dead_lettered"
READ_RANGES = "read_ranges"
READ_STREAMS_LOST = "read_streams_lost_unindexed"   # streams that stopped decoding, without an index
READ_REASON_PREFIX = "read_"                      # + a dead letter's reason
PAGE_IDS_REPEATED = "page_ids_repeated"            # ids listed or read more than once (`pipeline.read.dedupe`)

# Every page that was read ends in exactly one of these.
ARTICLES_USED = "articles_used"
ARTICLES_TOO_FEW_SECTIONS = "articles_too_few_sections"
PAGES_NON_ARTICLE = "pages_non_article"
PAGES_REDIRECT = "pages_redirect"
PARSE_ERRORS = "parse_errors"
PARAGRAPHS_TOO_LONG = "pages_paragraph_too_long"   # a paragraph longer than the sentence splitter takes
PAGES_DUPLICATE_ID = "pages_duplicate_id"   # a second page with an id already read (set aside as a dead letter)
PAGE_OUTCOMES = (ARTICLES_USED, ARTICLES_TOO_FEW_SECTIONS, PAGES_NON_ARTICLE, PAGES_REDIRECT, PARSE_ERRORS,
                 PARAGRAPHS_TOO_LONG, PAGES_DUPLICATE_ID)

# Triplets: every slot (positive pair x neighbouring section) gives a triplet or is counted unfilled.
TRIPLET_SLOTS = "triplet_slots"
NO_DONOR = "triplets_other_article_no_donor"

# Records written by the JSON-lines outputs.
SCB_ARTICLES = "scb_articles"
SCB_ARTICLES_NOT_ELIGIBLE = "scb_articles_not_eligible"
SCB_SENTENCES = "scb_sentences"
PASSAGES_ARTICLES = "passages_articles"
DEAD_LETTERS_WRITTEN = "dead_letters_written"


def no_opener_counter(rule: str) -> str:
    """Slots of negative rule `rule` left without a triplet because the chosen section has no opener."""
    return f"triplets_{rule}_no_opener_negative"


def unfilled_slots_counter(strategy: NegativeStrategy) -> str:
    """The counter of `strategy`'s slots that got no triplet (no opener, or for other_article no donor)."""
    return NO_DONOR if strategy == NegativeStrategy.OTHER_ARTICLE else no_opener_counter(strategy)


def split_counter(dataset: str, split: str) -> str:
    """Triplets written to one split of one dataset."""
    return f"{dataset}/{split}"


class CountersMissingError(DataLossError):
    """The runner did not report the job's counters: nothing can be reconciled or published."""


def reported_value(metric):
    """A Beam metric's committed value, or its attempted one where the runner commits none (the
    DirectRunner and Prism commit, a portable runner may report attempted values only); None
    where it reports neither."""
    return metric.committed if metric.committed is not None else metric.attempted


def job_totals(result) -> dict[str, int]:
    """Every counter of this namespace in a finished Beam job, by name, summed over the steps that
    increment it (`reported_value`). A counter reported with neither value is a
    CountersMissingError naming it, never a zero."""
    from apache_beam.metrics.metric import MetricsFilter

    totals: dict[str, int] = {}
    for metric in result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]:
        value = reported_value(metric)
        if value is None:
            raise CountersMissingError(f"the runner reported counter {metric.key.metric.name} of step "
                                       f"{metric.key.step} without a value (neither committed nor attempted)")
        totals[metric.key.metric.name] = totals.get(metric.key.metric.name, 0) + int(value)
    return totals
