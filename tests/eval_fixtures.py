"""Small SCB files in the data contract's format, written by the eval tests themselves."""
import gzip
import json
from collections import Counter
from pathlib import Path

from core.folders import write_manifest

# Three sections per article, each about one clearly different theme, so every reasonable
# method separates them; the first sentence of each paragraph is an opener.
THEMES = {
    "Football": [
        "The football team won the championship after scoring two late goals.",
        "Their goalkeeper saved a penalty kick in the final match of the season.",
        "Fans in the stadium cheered as the striker scored another goal.",
        "The coach praised the players for their defence during the league match.",
    ],
    "Cooking": [
        "The chef cooked the soup with onions, garlic and fresh tomatoes.",
        "Bake the bread in a hot oven until the crust turns golden brown.",
        "She added butter, sugar and flour to the cake recipe.",
        "The kitchen smelled of roasted chicken, pepper and baked potatoes.",
    ],
    "Astronomy": [
        "The telescope observed a distant galaxy full of bright stars.",
        "Astronomers measured the orbit of the planet around its star.",
        "The comet passed close to the sun and its tail glowed in the night sky.",
        "Light from the nebula took millions of years to reach the earth.",
    ],
    "Music": [
        "The orchestra played a symphony with violins, cellos and flutes.",
        "The pianist practised the sonata for hours before the concert.",
        "The choir sang the melody while the drummer kept the rhythm.",
        "Her new album features guitar songs and a slow piano ballad.",
    ],
}


def scb_article(article_id: int, section_titles: list[str]) -> dict:
    sentences, labels, openers = [], [], []
    for label, section in enumerate(section_titles):
        for position, sentence in enumerate(THEMES[section]):
            sentences.append(sentence)
            labels.append(label)
            openers.append(position % 2 == 0)
    return {"article_id": article_id, "title": f"Article {article_id}", "sections": section_titles,
            "sentences": sentences, "labels": labels, "openers": openers}


def write_scb(data_dir: Path, extra_lines: tuple[str, ...] = ()) -> list[dict]:
    """Writes `<data_dir>/scb/part-00000-of-00001.jsonl.gz` (three articles + `extra_lines`)."""
    articles = [
        scb_article(11, ["Football", "Cooking", "Astronomy"]),
        scb_article(12, ["Music", "Football", "Cooking", "Astronomy"]),
        scb_article(13, ["Astronomy", "Music"]),
    ]
    (data_dir / "scb").mkdir(parents=True, exist_ok=True)
    with gzip.open(data_dir / "scb" / "part-00000-of-00001.jsonl.gz", "wt", encoding="utf-8") as handle:
        for article in articles:
            handle.write(json.dumps(article) + "\n")
        for line in extra_lines:
            handle.write(line + "\n")
    write_manifest(str(data_dir), {"scb": len(articles) + len(extra_lines)})
    return articles


def count_scb_opens(monkeypatch) -> Counter:
    """Counts each open of an SCB shard (`scb/part-*`) by Beam's local filesystem, which still does
    the reading; the driver's checks and reads and the DirectRunner's run in this process."""
    from apache_beam.io.localfilesystem import LocalFileSystem

    opens: Counter = Counter()
    real_open = LocalFileSystem.open

    def counting_open(self, path, *args, **kwargs):
        if "/scb/part-" in path:
            opens[path] += 1
        return real_open(self, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "open", counting_open)
    return opens
