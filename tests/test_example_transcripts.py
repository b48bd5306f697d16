"""Every golden transcript of the example bots (and of the test fixtures) passes, run
through the runner API, so they are covered without the pytest11 entry point installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatrun.transcripts import run_transcript

REPO = Path(__file__).resolve().parents[1]
TRANSCRIPTS = sorted([*REPO.glob("bots/*/transcripts/*.yaml"), *REPO.glob("bots/*/versions/*/transcripts/*.yaml"),
                      *REPO.glob("tests/fixtures/transcripts/*/transcripts/*.yaml")])


def test_every_example_bot_has_transcripts():
    bots = {p.parent.name for p in REPO.glob("bots/*/bot.yaml")}
    covered = {p.parents[1].name for p in REPO.glob("bots/*/transcripts/*.yaml")}
    assert bots - covered == set()  # a new example bot comes with its transcripts
    assert covered >= {"airline", "bakery", "bank", "claims", "handover", "hello", "helpdesk", "notes", "onboarding",
                       "orders", "refunds", "shop", "support", "travel"}


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[str(p.relative_to(REPO)) for p in TRANSCRIPTS])
def test_transcript(path, monkeypatch):
    monkeypatch.chdir(REPO)  # reports name files relative to the repository
    result = run_transcript(str(path.relative_to(REPO)))
    assert result.passed, result.report()
