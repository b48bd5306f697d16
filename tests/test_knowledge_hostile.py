"""Knowledge against hostile inputs (hunt, wave 2): refs a real model writes (a file name with a
space, several passages in one pair of brackets), files that link out of the source's folder,
`include:` patterns that reach outside it, a file removed while a refresh runs, and a model
calling `search_knowledge` with garbage arguments. Each through the real parts: the `openai`
client against chatrun.testing.fake_openai, the SQLite index, the CLI."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chat_support import kinds
from chatrun.cli import main
from chatrun.definition.loader import load_config
from chatrun.errors import BotError
from chatrun.knowledge import Library
from chatrun.testing.fake_openai import FakeOpenAI

BOT = """
name: hostile
format: 3
model: {{provider: openai, name: gpt-4o-mini, base_url: "{base_url}", max_retries: 0}}
fallback: I do not know that one.
knowledge:
  help: {{path: help{include}}}
routes:
  main:
    default: true
    system: Answer from the help, citing each passage.
    knowledge: {{sources: [help], cite: required}}
"""

REFUNDS = "# Refund policy\n\n## Refund window\n\nReturn any item within 30 days for a full refund.\n"
SHIPPING = "# Shipping\n\n## Costs\n\nExpress delivery costs 9.90 euros.\n"


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeOpenAI() as server:
        yield server


def make_bot(root: Path, fake: FakeOpenAI, files: dict[str, str], include: str = "") -> Path:
    bot = root / "bot"
    (bot / "help").mkdir(parents=True)
    (bot / "bot.yaml").write_text(textwrap.dedent(BOT.format(base_url=fake.base_url, include=include)))
    for rel, text in files.items():
        (bot / "help" / rel).parent.mkdir(parents=True, exist_ok=True)
        (bot / "help" / rel).write_text(text)
    return bot


def sources_of(events) -> list[str]:
    return [s["ref"] for kind, data in kinds(events) if kind == "Sources" for s in data["sources"]]


def messages(events) -> list[str]:
    return [data for kind, data in kinds(events) if kind == "Message"]


# -- citations as a model writes them ------------------------------------------------------------

def test_a_ref_with_a_space_and_refs_sharing_brackets_are_citations(tmp_path, fake):
    """A file named `refund policy.md` has the ref `refund policy.md#refund-window`: a reply citing
    it exactly was refused by `cite: required` (a ref could hold no space). A model citing two
    passages in one pair of brackets (`[a#x, b#y]`, a common way of writing) was refused too."""
    bot = make_bot(tmp_path, fake, {"refund policy.md": REFUNDS, "shipping.md": SHIPPING})
    session = chatrun.load_bot(bot / "bot.yaml").session()
    fake.queue({"text": "Within 30 days [refund policy.md#refund-window]."})
    events = session.chat("How long do I have for a refund?")
    assert messages(events) == ["Within 30 days [refund policy.md#refund-window]."]
    assert sources_of(events) == ["refund policy.md#refund-window"]

    fake.queue({"text": "30 days, and express costs 9.90 [refund policy.md#refund-window, shipping.md#costs; "
                        "made-up.md#x]."})
    events = session.chat("And express shipping?")
    assert sources_of(events) == ["refund policy.md#refund-window", "shipping.md#costs"]
    assert len(fake.requests) == 2  # neither reply was asked again


def test_brackets_that_name_no_passage_are_still_no_citation(tmp_path, fake):
    bot = make_bot(tmp_path, fake, {"shipping.md": SHIPPING})
    fake.queue({"text": "It costs [some amount, I think]."}, {"text": "Still [no idea]\n[really]."})
    events = chatrun.load_bot(bot / "bot.yaml").session().chat("Cost?")
    assert messages(events) == ["I do not know that one."] and sources_of(events) == []
