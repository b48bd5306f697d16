"""Knowledge embeddings (issue 37): a source's `embeddings:` model embeds its passages through the
bot's endpoint (the real `openai` client against chatrun.testing.fake_openai), a search fuses
BM25 with cosine by reciprocal rank, only new or changed passages are embedded again, and an
endpoint without embeddings leaves BM25 answering, with one log line and no failed turn."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chat_support import kinds
from chatrun.cli import main
from chatrun.definition.loader import load_config
from chatrun.knowledge import Library, knowledge_state
from chatrun.testing.fake_openai import FakeOpenAI

BOT = """
name: docs
model: {provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false}
knowledge:
  guides: {path: guides, embeddings: text-embedding-3-small}
routes:
  main:
    default: true
    system: Answer from the guides.
    knowledge: {sources: [guides], retrieve: auto, top_k: 1}
"""

GUIDES = {
    "returns.md": "# Returns\n\n## Refund window\n\nReturn any item within 30 days for a full refund.\n",
    "shipping.md": "# Shipping\n\n## Costs\n\nExpress delivery costs 9.90 euros.\n\n## Countries\n\nWe ship to the EU.\n",
    "account.md": "# Account\n\n## Password\n\nReset your password from the sign-in page.\n",
}
QUESTION = "Can I get a reimbursement?"  # no word of it is in the refund passage


def write_bot(root: Path, bot: str = BOT) -> Path:
    (root / "bot.yaml").write_text(textwrap.dedent(bot))
    for name, text in GUIDES.items():
        (root / "guides").mkdir(exist_ok=True)
        (root / "guides" / name).write_text(text)
    return root


def embedded_inputs(fake: FakeOpenAI) -> list[str]:
    return [text for body in fake.embedding_requests for text in body["input"]]


def test_hybrid_search_finds_by_meaning_the_passage_bm25_cannot(fake, tmp_path):
    fake.synonym("reimbursement", "refund")
    root = write_bot(tmp_path)
    config, _ = load_config(root)
    assert Library(root, config.knowledge).search(QUESTION, ["guides"], 3) == []  # BM25 alone: no word matches
    fake.queue({"text": "Yes, within 30 days [returns.md#refund-window]."})
    events = chatrun.load_bot(root / "bot.yaml").session().chat(QUESTION)
    assert ("Console", "route main: retrieved returns.md#refund-window") in kinds(events)
    assert fake.embedding_requests[0]["model"] == "text-embedding-3-small"
    assert embedded_inputs(fake)[-1] == QUESTION  # the query, after the 4 passages
    assert "Returns › Refund window\nReturn any item within 30 days" in "".join(embedded_inputs(fake))
    assert fake.requests[0]["model"] == "gpt-4o-mini"


def test_a_word_bm25_finds_still_ranks_first_in_the_fusion(fake, tmp_path):
    root = write_bot(tmp_path)
    config, _ = load_config(root)
    hits = Library(root, config.knowledge, config.model).search("express delivery costs", ["guides"], 3)
    assert hits[0].ref == "shipping.md#costs" and len(hits) == 3


def test_only_new_or_changed_passages_are_embedded_again(fake, tmp_path):
    root = write_bot(tmp_path)
    result = CliRunner().invoke(main, ["index", str(root), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "3 read, 0 removed, 4 embedded; 4 passages" in result.output
    assert len(embedded_inputs(fake)) == 4
    fake.reset()
    assert "0 read, 0 removed, 0 embedded" in CliRunner().invoke(main, ["index", str(root), "-q"]).output
    assert fake.embedding_requests == []  # nothing changed: no request at all
    (root / "guides" / "shipping.md").write_text(GUIDES["shipping.md"].replace("9.90", "12.50"))
    assert "1 read, 0 removed, 1 embedded" in CliRunner().invoke(main, ["index", str(root), "-q"]).output
    assert embedded_inputs(fake) == ["Shipping › Costs\nExpress delivery costs 12.50 euros."]  # not `Countries`


def test_an_endpoint_without_embeddings_answers_from_bm25_with_one_log_line(tmp_path, monkeypatch, caplog):
    root = write_bot(tmp_path)
    with FakeOpenAI(embeddings=False) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        fake.queue({"text": "30 days [returns.md#refund-window]."}, {"text": "9.90 euros [shipping.md#costs]."})
        bot = chatrun.load_bot(root / "bot.yaml")
        session = bot.session()
        with caplog.at_level(logging.WARNING, logger="chatrun.knowledge"):
            first = session.chat("How long is the refund window?")
            second = session.chat("What does express delivery cost?")
        assert ("Console", "route main: retrieved returns.md#refund-window") in kinds(first)
        assert ("Message", "30 days [returns.md#refund-window].") in kinds(first)
        assert ("Console", "route main: retrieved shipping.md#costs") in kinds(second)
        warnings = [r.getMessage() for r in caplog.records if "no embeddings" in r.getMessage()]
        assert len(warnings) == 1 and "HTTP 404" in warnings[0] and "BM25 alone" in warnings[0]
        assert [r.path for r in fake.log].count("/embeddings") == 1  # not asked again with each search
        state = knowledge_state(bot.config)  # what /health says of the bot's knowledge
        assert state is not None and state.startswith("embeddings unavailable (model ") and "HTTP 404" in state
        assert state.endswith("BM25 alone")


def test_chatrun_index_says_when_there_are_no_embeddings_and_still_succeeds(tmp_path, monkeypatch):
    root = write_bot(tmp_path)
    with FakeOpenAI(embeddings=False) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        result = CliRunner().invoke(main, ["index", str(root), "-q"])
    assert result.exit_code == 0
    assert "no embeddings (model text-embedding-3-small: HTTP 404" in result.output
    assert "searches use BM25 alone" in result.output and "0 embedded; 4 passages" in result.output


def test_validate_warns_that_a_scripted_model_has_no_embeddings(tmp_path):
    root = write_bot(tmp_path, BOT.replace("provider: openai", "provider: scripted"))
    _, warnings = load_config(root)
    line = next(i for i, text in enumerate(BOT.splitlines(), start=1) if "embeddings:" in text)
    found = [(w.line, w.col, w.severity, w.message) for w in warnings if w.path == "knowledge.guides.embeddings"]
    assert found == [(line, 26, "warning", "knowledge source `guides`: `embeddings: text-embedding-3-small` needs an "
                      "OpenAI-compatible endpoint, and the bot's model is `scripted`; its searches use BM25 alone (set "
                      "the bot's `model:` to an openai provider, or remove `embeddings:`)")]


@pytest.mark.parametrize("text", ["", "x"])
def test_the_fake_answers_embeddings_as_unit_vectors(fake, text):
    import openai

    client = openai.OpenAI(base_url=fake.base_url, api_key="k")
    if not text:
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="m", input=[])
        return
    vector = client.embeddings.create(model="m", input=[text]).data[0].embedding
    assert abs(sum(x * x for x in vector) - 1.0) < 1e-9


def test_a_replayed_transcript_ranks_with_bm25_and_reaches_no_endpoint(fake, tmp_path):
    root = write_bot(tmp_path)
    (root / "transcripts").mkdir()
    (root / "transcripts" / "refund.yaml").write_text(textwrap.dedent("""\
        bot: ..
        turns:
          - user: How long is the refund window?
            model:
              - text: "30 days [returns.md#refund-window]."
            expect:
              events:
                - Console: "route main: retrieved returns.md#refund-window"
                - Message: "30 days [returns.md#refund-window]."
                - Sources: {sources: [{title: Returns › Refund window, ref: returns.md#refund-window, source: guides}]}
        """))
    result = CliRunner().invoke(main, ["test", str(root)])
    assert result.exit_code == 0, result.output
    assert fake.log == []  # neither the model nor /embeddings: a replay reaches nothing outside the bot


def test_a_file_changed_around_unchanged_passages_keeps_them_found_by_meaning(fake, tmp_path):
    fake.synonym("reimbursement", "refund")
    root = write_bot(tmp_path)
    config, _ = load_config(root)
    library = Library(root, config.knowledge, config.model)
    assert [h.ref for h in library.search(QUESTION, ["guides"], 1)] == ["returns.md#refund-window"]
    (root / "guides" / "returns.md").write_text(GUIDES["returns.md"] + "\n")  # new bytes, the same passage
    library.refresh()
    assert [h.ref for h in library.search(QUESTION, ["guides"], 1)] == ["returns.md#refund-window"]
    assert len(embedded_inputs(fake)) == 4 + 2  # the passages once, and the query twice: nothing embedded again
