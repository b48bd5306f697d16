"""Issue 37, with real processes: what a turn remembers of its user survives exactly when the
turn committed. bots/concierge served by `chatrun serve` replicas on a real Redis (and again on
a real PostgreSQL), the fake OpenAI server in this process. Ana tells the concierge her name:
the model calls `note_preference` (its `remember:` runs), then the fake model holds its next
answer until the test has killed the replica with SIGKILL — after the effect, before the
commit. Nothing of that turn is kept, not the turn and not the fact. Ana says it again on
another replica, which kills itself with SIGKILL the instant its store's commit_turn returns
(a fault hook this test puts in the replica: a sitecustomize.py, no chatrun code), before
anything else it would do after a commit: a third replica reads the facts, because they were
written in the commit itself (before issue 37's fix they were saved after it, and were lost)."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from redis_support import Replica
from store_params import store_url

REPO = Path(__file__).resolve().parents[1]
CONCIERGE = str(REPO / "bots" / "concierge")
AUTH = """
tokens:
  tok-ana-0123456: {principal: ana}
"""
ANA = {"Authorization": "Bearer tok-ana-0123456"}


KILL_AFTER_COMMIT = textwrap.dedent("""
    # The fault hook (tests/test_user_memory_replicas.py): SIGKILL this replica the moment a
    # turn's commit has landed in the shared store, before anything else runs.
    import os
    import signal

    if os.environ.get("CHATRUN_TEST_KILL_AFTER_COMMIT"):
        from chatrun.store.postgres import PostgresStore
        from chatrun.store.redis import RedisStore

        def _killing(original):
            async def commit_turn(self, commit, lease):
                version = await original(self, commit, lease)
                if commit.turn is not None:
                    os.kill(os.getpid(), signal.SIGKILL)
                return version
            return commit_turn

        for _store in (RedisStore, PostgresStore):
            _store.commit_turn = _killing(_store.commit_turn)
""")


class KilledAfterCommit(Replica):
    """A replica that dies (SIGKILL) right after its first turn's commit."""

    def __init__(self, hook: Path, *args: Any):
        super().__init__(*args)
        self.hook = hook

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PYTHONPATH"] = f"{self.hook}:{env['PYTHONPATH']}"
        env["CHATRUN_TEST_KILL_AFTER_COMMIT"] = "1"
        return env


class HeldModel:
    """The fake model: asked anything, it calls note_preference; given the tool's result, it
    answers — unless `hold` is set: then it signals `arrived` and waits for `release` first."""

    def __init__(self) -> None:
        self.hold = True
        self.arrived = threading.Event()
        self.release = threading.Event()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        # (the bot's `context:` follows the memory: the tool's result is not the last message)
        if not any(m["role"] == "tool" for m in body["messages"]):
            return {"tool_calls": [{"name": "note_preference",
                                    "arguments": {"name": "Ana", "room": "a quiet room on a high floor"}}]}
        if self.hold:
            self.arrived.set()
            self.release.wait(120)  # until the replica that asked is dead
        return {"text": "Noted, Ana."}


@pytest.fixture(params=["redis", "postgres"])
def shared_store(request, tmp_path):
    """An empty store the replicas share: a real Redis, a real PostgreSQL."""
    return store_url(request, tmp_path)


def facts(replica: Replica) -> dict[str, Any]:
    listed = httpx.get(f"{replica.url}/bots/concierge/user-memory", headers=ANA, timeout=60)
    assert listed.status_code == 200, listed.text
    return {f["fact"]: f["value"] for f in listed.json()["facts"]}


def say(replica: Replica, session: str, text: str) -> httpx.Response:
    return httpx.post(f"{replica.url}/bots/concierge/sessions/{session}/messages", json={"userMessage": text},
                      headers=ANA, timeout=120)


def committed_turns(replica: Replica, session: str) -> list[int]:
    got = httpx.get(f"{replica.url}/bots/concierge/sessions/{session}", headers=ANA, timeout=60)
    assert got.status_code == 200, got.text
    return [e["turn"] for e in got.json()["history"] if e.get("ok")]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_fact_survives_kill_9_exactly_when_its_turn_committed(fake, shared_store, tmp_path):
    model = fake.responder = HeldModel()
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    replicas: list[Replica] = []

    def replica() -> Replica:
        replicas.append(Replica(CONCIERGE, shared_store, fake.base_url, "--auth", str(auth)).start())
        return replicas[-1]

    try:
        first = replica()
        created = httpx.post(f"{first.url}/bots/concierge/sessions", json={"id": "c1"}, headers=ANA, timeout=60)
        assert created.status_code == 201, created.text

        # The tool's `remember:` has run; the turn waits for the model ... and its replica dies.
        lost: list[BaseException] = []
        thread = threading.Thread(target=lambda: _expect_lost(lambda: say(first, "c1", "I'm Ana."), lost))
        thread.start()
        assert model.arrived.wait(60), "the turn never reached its second model call"
        first.kill()
        model.release.set()
        thread.join(60)
        assert lost, "the first replica answered before it was killed"

        second = replica()
        assert facts(second) == {}  # the turn did not commit: neither did its fact
        assert committed_turns(second, "c1") == []

        # Again, on a replica that dies the instant its commit has landed (once the dead one's
        # lease ran out): the turn is committed, and its facts with it.
        model.hold = False
        hook = tmp_path / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(KILL_AFTER_COMMIT)
        doomed = KilledAfterCommit(hook, CONCIERGE, shared_store, fake.base_url, "--auth", str(auth))
        replicas.append(doomed.start())
        lost.clear()
        _expect_lost(lambda: say(doomed, "c1", "I'm Ana."), lost)
        assert lost, "the replica answered: its fault hook did not kill it after the commit"
        assert doomed.proc is not None and doomed.proc.wait(60) == -9

        assert committed_turns(second, "c1") == [1]
        assert facts(second) == {"name": "Ana", "room": "a quiet room on a high floor"}
    finally:
        model.release.set()
        for r in replicas:
            r.kill()


def _expect_lost(request: Any, lost: list[BaseException]) -> None:
    """Send `request`; the connection is expected to break (its replica is killed meanwhile)."""
    try:
        request()
    except httpx.HTTPError as exc:
        lost.append(exc)
