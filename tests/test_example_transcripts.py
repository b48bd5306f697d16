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
    assert silent_turns(result) == [], "these turns end with nothing for the user (issue 32)"


# What gives the user something: a reply, something to choose or answer, an error, the end.
SAYS = {"Message", "Object", "Choices", "Pending", "Error", "ConversationEnded"}


def silent_turns(result) -> list[str]:
    """The turns of a run transcript that end without anything for the user (its observed
    events). Not silent: a turn during a takeover (the operator answers; the user's message
    went to them), an operator's takeover or release (its Resolved event is the user's news),
    and an `expire:` with nothing due (no turn ran)."""
    silent = []
    for played in result.turns:
        obs, turn = played.observed, played.turn
        if obs is None or obs.error is not None:
            continue
        types = {next(iter(event)) for event in obs.events}
        handed = any("UserMessage" in event for event in obs.operators_events) or any(
            event.get("Resolved", {}).get("kind") == "takeover" for event in obs.events)
        nothing_due = turn.decision is not None and "expire" in turn.decision and not obs.events
        if not types & SAYS and not handed and not nothing_due:
            silent.append(f"turn {turn.index} (line {turn.line}): {sorted(types) or 'no events'}")
    return silent


def test_a_turn_that_ends_silently_is_found(monkeypatch, tmp_path):
    """The check above can fail: a tool that moves the conversation without a message, called
    by a model that says nothing, leaves the user without a reply."""
    (tmp_path / "bot.yaml").write_text(
        "name: quiet\nformat: 3\nroutes:\n  a: {default: true, system: Hi., tools: [go]}\n  b: {system: B.}\n"
        "tools:\n  go: {description: Go to b, action: {route: b}}\n")
    (tmp_path / "t.yaml").write_text(
        "bot: .\nturns:\n  - user: go\n    model: [{tool_calls: [{name: go}]}]\n    expect: {route: b}\n")
    result = run_transcript(str(tmp_path / "t.yaml"))
    assert result.passed, result.report()
    assert silent_turns(result) == ["turn 1 (line 3): ['RouteChanged']"]
