"""The SCB and passages contracts: what the pipeline writes is what every consumer's reader
(`from_json`) gives back, and a line that breaks the contract is refused naming the field."""
import json

import pytest

from core import records
from core.records import PassagesRecord, RecordError, ScbRecord
from pipeline.parse.wikitext import Paragraph
from pipeline.triplets.rules import Article, ArticleSection, KeptSentence
from pipeline.write import examples

GOOD_SCB = {"article_id": 1, "title": "T", "sections": ["a", "b"], "sentences": ["x", "y"],
            "labels": [0, 1], "openers": [True, False]}


def _article() -> Article:
    sections = tuple(
        ArticleSection(title=title,
                       paragraphs=tuple(Paragraph(f"{title} paragraph {i}.", (title, f"{title} sub")[:1 + i % 2])
                                        for i in range(2)),
                       sentences=tuple(KeptSentence(f"{title} sentence {i} é.", n_tokens=3, paragraph=i // 2,
                                                    opener=i % 2 == 0) for i in range(count)))
        for title, count in (("History", 3), ("Geography", 4)))
    return Article(article_id=12, title="Place", split="test", lead=("Place is a place.",), sections=sections)


def test_records_read_back_as_written():
    article = _article()
    scb, passages = examples.scb_record(article), examples.passages_record(article)
    assert ScbRecord.from_json(scb.to_json()) == scb
    assert PassagesRecord.from_json(passages.to_json()) == passages
    assert scb.labels == (0, 0, 0, 1, 1, 1, 1) and scb.openers[:3] == (True, False, True)
    assert [p.path for p in passages.sections[0].paragraphs] == [("History",), ("History", "History sub")]


def test_the_json_is_the_contract_format():
    line = json.loads(examples.scb_record(_article()).to_json())
    assert sorted(line) == ["article_id", "labels", "openers", "sections", "sentences", "title"]
    assert line["sections"] == ["History", "Geography"] and isinstance(line["openers"][0], bool)
    passages = json.loads(examples.passages_record(_article()).to_json())
    assert passages["sections"][1]["paragraphs"][1] == {"text": "Geography paragraph 1.",
                                                        "path": ["Geography", "Geography sub"]}


@pytest.mark.parametrize(("line", "message"), [
    ("{broken", "not JSON"),
    ("[1, 2]", "the record is a list"),
    (json.dumps({k: v for k, v in GOOD_SCB.items() if k != "openers"}), "missing field 'openers'"),
    (json.dumps({**GOOD_SCB, "article_id": "1"}), "field 'article_id' is a str"),
    (json.dumps({**GOOD_SCB, "openers": [1, 0]}), "'openers' holds a value that is not a bool"),
    (json.dumps({**GOOD_SCB, "labels": [0]}), "lengths differ"),
    (json.dumps({**GOOD_SCB, "labels": [0, 2]}), "labels must index sections"),
    (json.dumps({**GOOD_SCB, "labels": [1, 1]}), "fewer than 2 sections"),
])
def test_a_bad_scb_line_names_what_is_wrong(line, message):
    with pytest.raises(RecordError, match=message):
        ScbRecord.from_json(line)


def test_a_bad_passages_line_names_the_field():
    good = json.loads(examples.passages_record(_article()).to_json())
    bad_path = json.loads(json.dumps(good))
    bad_path["sections"][1]["paragraphs"][0]["path"] = "Geography"
    with pytest.raises(RecordError, match=r"'sections\[1\]\.paragraphs\[0\]\.path' is a str"):
        PassagesRecord.from_json(json.dumps(bad_path))
    with pytest.raises(RecordError, match="field 'split' is 'dev'"):
        PassagesRecord.from_json(json.dumps({**good, "split": "dev"}))
    with pytest.raises(RecordError, match=r"sections\[0\] is a str"):
        PassagesRecord.from_json(json.dumps({**good, "sections": ["History"]}))


def test_the_feature_spec_names_every_field_a_triplet_has_but_its_split():
    from pipeline.triplets.make import Triplet

    assert set(records.TRIPLET_FEATURES) == set(Triplet._fields) - {"split"}
    assert records.ROLES == Triplet._fields[:3]
