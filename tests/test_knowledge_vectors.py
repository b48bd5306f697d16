"""The vector index of knowledge embeddings (issue 37): a model's vectors held in memory as one
numpy matrix (the `knowledge` extra), ranked by one matrix-vector product, giving the ranking
the pure-Python cosine gives; read from the index file, so they survive a restart; read again
when a changed file replaced its vectors. Embedded through the real `openai` client against
chatrun.testing.fake_openai's /embeddings (a hashed bag of words)."""

from __future__ import annotations

import logging
import random
import sys
from pathlib import Path

import pytest

from chatrun.definition.config import KnowledgeSource, ModelConfig
from chatrun.knowledge import Library, vectors
from chatrun.knowledge.vectors import passage_digest
from chatrun.testing.fake_openai import FakeOpenAI

MODEL = "text-embedding-3-small"


def seeded_folder(folder: Path, seed: int, files: int = 8, sections: int = 8) -> list[str]:
    """Markdown files of sections of made-up words (the same on every run); the vocabulary."""
    rng = random.Random(seed)
    words = sorted({"".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(3)) + "x"
                    for _ in range(400)})
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(files):
        lines = [f"# Article {number}", ""]
        for section in range(sections):
            lines += [f"## Part {number} {section}", "", " ".join(rng.choices(words, k=25)) + ".", ""]
        (folder / f"article-{number}.md").write_text("\n".join(lines))
    return words


def libraries(root: Path, fake: FakeOpenAI, sources: dict[str, KnowledgeSource]) -> tuple[Library, Library]:
    """The same bot twice: ranking its vectors fast (numpy) and in pure Python."""
    model = ModelConfig(name="gpt-4o-mini", base_url=fake.base_url)
    fast, pure = Library(root, sources, model), Library(root, sources, model)
    pure.index.fast = False
    return fast, pure


def test_the_fast_ranking_is_the_pure_python_ranking_on_a_seeded_set(fake, tmp_path):
    fake.embedding_dimensions = 256
    words = seeded_folder(tmp_path / "docs", seed=37)
    seeded_folder(tmp_path / "notes", seed=38, files=3)
    sources = {name: KnowledgeSource(name, name, embeddings=MODEL) for name in ("docs", "notes")}
    fast, pure = libraries(tmp_path, fake, sources)
    assert fast.refresh().embedded == 88
    pure.refresh()
    rng = random.Random(7)
    for _ in range(8):
        query = vectors.unit([rng.gauss(0, 1) for _ in range(256)])
        for reading in (["docs", "notes"], ["notes"]):  # every source of the model, and a route reading one
            nearest = fast.index.nearest(MODEL, query, reading, 10)
            expected = pure.index.nearest(MODEL, query, reading, 10)
            assert [hit.ref for hit in nearest] == [hit.ref for hit in expected]
            assert [hit.score for hit in nearest] == pytest.approx([hit.score for hit in expected], abs=1e-5)
            assert {hit.source for hit in nearest} <= set(reading) and len(nearest) == 10
        question = " ".join(rng.sample(words, 4))
        assert fast.search(question, ["docs"], 5) == pure.search(question, ["docs"], 5)  # the fusion with BM25
    assert fast.index.vectors(MODEL).fast and not pure.index.vectors(MODEL).fast  # numpy ranked one, Python the other
    assert fast.index.vectors(MODEL).size == 88


def test_the_vectors_survive_a_restart_and_are_read_from_the_file_once(fake, tmp_path):
    fake.synonym("reimbursement", "refund")
    seeded_folder(tmp_path / "docs", seed=37, files=2)
    (tmp_path / "docs" / "returns.md").write_text("# Returns\n\n## Refund window\n\nA refund within 30 days.\n")
    sources = {"docs": KnowledgeSource("docs", "docs", embeddings=MODEL)}
    first, _ = libraries(tmp_path, fake, sources)
    assert first.refresh().embedded == 17
    fake.reset()
    again, _ = libraries(tmp_path, fake, sources)  # a new process's bot: nothing of the first in memory
    assert again.refresh().embedded == 0 and fake.embedding_requests == []
    hits = again.search("reimbursement", ["docs"], 1)
    assert [hit.ref for hit in hits] == ["returns.md#refund-window"]  # by meaning alone: BM25 finds no word of it
    table = again.index.vectors(MODEL)
    assert table.fast and table.size == 17
    again.search("anything else", ["docs"], 1)
    assert again.index.vectors(MODEL) is table  # unchanged: not read from the file again


def test_a_changed_file_replaces_its_vectors(fake, tmp_path):
    fake.synonym("reimbursement", "refund")
    fake.synonym("swap", "exchange")
    seeded_folder(tmp_path / "docs", seed=37, files=2)
    returns = tmp_path / "docs" / "returns.md"
    returns.write_text("# Returns\n\n## Policy\n\nA refund within 30 days.\n")
    sources = {"docs": KnowledgeSource("docs", "docs", embeddings=MODEL)}
    library, _ = libraries(tmp_path, fake, sources)
    assert [hit.ref for hit in library.search("reimbursement", ["docs"], 1)] == ["returns.md#policy"]
    before = library.index.vectors(MODEL)
    fake.reset()
    returns.write_text("# Returns\n\n## Policy\n\nAn exchange within 30 days.\n")
    done = library.refresh()
    assert (done.changed, done.embedded) == (1, 1)
    assert [text for body in fake.embedding_requests for text in body["input"]] == [
        "Returns › Policy\nAn exchange within 30 days."]  # the changed passage only
    assert [hit.ref for hit in library.search("swap", ["docs"], 1)] == ["returns.md#policy"]
    after = library.index.vectors(MODEL)
    assert after is not before and after.size == before.size == 17  # read again: one vector replaced, none added
    with library.index.connect() as db:  # in the file: the new passage's vector, and not the old one's
        digests = {row[0] for row in db.execute("SELECT digest FROM vectors")}
    db.close()
    assert len(digests) == 17
    assert passage_digest("Returns › Policy", "An exchange within 30 days.") in digests
    assert passage_digest("Returns › Policy", "A refund within 30 days.") not in digests


def test_without_numpy_the_pure_python_ranking_answers_with_one_log_line(fake, tmp_path, monkeypatch, caplog):
    fake.synonym("reimbursement", "refund")
    seeded_folder(tmp_path / "docs", seed=37, files=2)
    (tmp_path / "docs" / "returns.md").write_text("# Returns\n\n## Refund window\n\nA refund within 30 days.\n")
    sources = {"docs": KnowledgeSource("docs", "docs", embeddings=MODEL)}
    monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` fails, as where it is not installed
    monkeypatch.setattr(vectors, "_said", set())
    library, _ = libraries(tmp_path, fake, sources)
    with caplog.at_level(logging.WARNING, logger="chatrun.knowledge"):
        assert [hit.ref for hit in library.search("reimbursement", ["docs"], 1)] == ["returns.md#refund-window"]
        (tmp_path / "docs" / "returns.md").write_text("# Returns\n\n## Refund window\n\nA refund in 30 days.\n")
        library.refresh()  # the vectors are read again
        assert [hit.ref for hit in library.search("reimbursement", ["docs"], 1)] == ["returns.md#refund-window"]
    assert not library.index.vectors(MODEL).fast
    said = [r.getMessage() for r in caplog.records if "pure Python" in r.getMessage()]
    assert len(said) == 1 and "pip install 'chatrun[knowledge]'" in said[0]


def test_a_query_of_other_dimensions_than_the_passages_ranks_with_bm25_and_says_so_once(fake, tmp_path, monkeypatch,
                                                                                       caplog):
    seeded_folder(tmp_path / "docs", seed=37, files=1)
    sources = {"docs": KnowledgeSource("docs", "docs", embeddings=MODEL)}
    monkeypatch.setattr(vectors, "_said", set())
    library, _ = libraries(tmp_path, fake, sources)
    library.refresh()
    fake.embedding_dimensions = 32  # the endpoint's model changed under the same name
    with caplog.at_level(logging.WARNING, logger="chatrun.knowledge"):
        bm25 = library.index.search("part", ["docs"], 3)
        assert [hit.ref for hit in library.search("part", ["docs"], 3)] == [hit.ref for hit in bm25]
        library.search("article", ["docs"], 3)
    said = [r.getMessage() for r in caplog.records if "dimensions" in r.getMessage()]
    assert len(said) == 1 and "in 32 dimensions, its passages in 64" in said[0] and "chatrun index" in said[0]
