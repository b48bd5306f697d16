"""`/v1` forks across replicas (issue 39's delta states): a turn's state for forks is written as a
delta of the state the same process recorded for the session's turn before, found by message
identity. Two `chatrun serve` replicas of bots/travel share a real Redis (and again a real
PostgreSQL); one conversation's turns alternate between them through the real `openai` client's
Responses API with `previous_response_id`: a second turn on the same replica is written as a delta
(its parent the turn before), a turn after a switch in full (the replica's cached session was
stale: reloaded, new messages), so chains start and stop on both replicas. A fork of every kept
turn, on either replica, must send the model the conversation exactly as it was right after that
turn (a delta applied wrongly fails it: checked by breaking `state_at`)."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from redis_support import Replica
from store_params import DISTRIBUTED, store_url

REPO = Path(__file__).resolve().parents[1]
TRAVEL = str(REPO / "bots" / "travel")
# The replica each turn goes to: runs of two on one replica (a delta there), then a switch.
TURNS = "AABAABBA"


@pytest.fixture(params=DISTRIBUTED)
def shared_store(request, tmp_path):
    """An empty store the replicas share: a real Redis, a real PostgreSQL."""
    return store_url(request, tmp_path)


def _echo_last_user(body: dict) -> dict:
    return {"text": "A" + [m for m in body["messages"] if m["role"] == "user"][-1]["content"]}


@pytest.mark.subprocess
def test_every_turn_forks_whole_when_its_turns_went_to_two_replicas(fake, shared_store):
    fake.responder = _echo_last_user
    replicas = {"A": Replica(TRAVEL, shared_store, fake.base_url).start()}
    try:
        replicas["B"] = Replica(TRAVEL, shared_store, fake.base_url).start()
        clients = {name: openai.OpenAI(base_url=f"{r.url}/v1", api_key="none", max_retries=0, timeout=60)
                   for name, r in replicas.items()}
        ids: list[str] = []
        for n, name in enumerate(TURNS, start=1):
            answer = clients[name].responses.create(
                model="travel", input=f"u{n}", **({"previous_response_id": ids[-1]} if ids else {}))
            assert answer.output_text == f"Au{n}"
            ids.append(answer.id)
        for turn in range(1, len(TURNS)):  # the last turn is the session's own: a continuation
            name = "B" if turn % 2 else "A"
            forked = clients[name].responses.create(model="travel", input="fork", previous_response_id=ids[turn - 1])
            assert forked.model_extra["chatrun"]["how"] == "forked"
            sent = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] != "system"]
            assert sent == [text for n in range(1, turn + 1) for text in (f"u{n}", f"Au{n}")] + ["fork"], turn
    finally:
        for replica in replicas.values():
            replica.kill()
