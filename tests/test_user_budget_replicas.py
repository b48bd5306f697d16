"""A user's budget counts exactly the turns the store holds, with real processes: `chatrun
serve` replicas of a bot with `limits.max_user_tokens` on one store (a real SQLite file, a real
Redis), the fake OpenAI server in this process. A fault hook this test puts in the replica (a
sitecustomize.py, no chatrun code) kills it with SIGKILL at its store's commit_turn of a turn:
*before* the commit (the turn's model call made and answered) or *after* it (the commit landed,
nothing else done). The turn's usage is in the commit itself (record.Charge), so the first
counts nothing, as the session has no turn, and the second counts it, as the session has it.
Before the charge went in the commit it was added just before it: the first counted too."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from chatrun.store.aio import open_existing_store
from chatrun.store.user_budget import user_budget_key
from redis_support import Replica
from store_params import REDIS, store_url

BOT = """\
name: shop
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
limits: {max_user_tokens: 1000, user_window: 1d}
routes:
  main:
    default: true
    system: You sell shoes.
"""
AUTH = "tokens:\n  tok-ana-0123456: {principal: ana}\n"
ANA = {"Authorization": "Bearer tok-ana-0123456"}
SMALL = {"text": "Hello.", "usage": {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}}

KILL_AT_COMMIT = textwrap.dedent("""
    # The fault hook (tests/test_user_budget_replicas.py): SIGKILL this replica at a turn's
    # commit, before it is written (CHATRUN_TEST_KILL=before) or the moment it landed (after).
    import os
    import signal

    _when = os.environ.get("CHATRUN_TEST_KILL")
    if _when:
        from chatrun.store.local import LocalAsyncStore
        from chatrun.store.redis import RedisStore

        def _killing(original):
            async def commit_turn(self, commit, lease):
                if commit.turn is not None and _when == "before":
                    os.kill(os.getpid(), signal.SIGKILL)
                version = await original(self, commit, lease)
                if commit.turn is not None:
                    os.kill(os.getpid(), signal.SIGKILL)
                return version
            return commit_turn

        for _store in (LocalAsyncStore, RedisStore):
            _store.commit_turn = _killing(_store.commit_turn)
""")


class Killed(Replica):
    """A replica that dies (SIGKILL) at its first turn's commit, before or after it."""

    def __init__(self, hook: Path, when: str, *args: Any):
        super().__init__(*args)
        self.hook, self.when = hook, when

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PYTHONPATH"] = f"{self.hook}:{env['PYTHONPATH']}"
        env["CHATRUN_TEST_KILL"] = self.when
        return env


@pytest.fixture(params=["sqlite", REDIS])
def shared_store(request, tmp_path):
    return store_url(request, tmp_path)


def _killed_in_a_turn(replica: Killed, session: str) -> None:
    made = httpx.post(f"{replica.url}/bots/shop/sessions", json={"id": session}, headers=ANA, timeout=60)
    assert made.status_code == 201, made.text
    with pytest.raises(httpx.HTTPError):  # the replica dies while it answers
        httpx.post(f"{replica.url}/bots/shop/sessions/{session}/messages", json={"userMessage": "shoes?"},
                   headers=ANA, timeout=120)
    assert replica.proc is not None and replica.proc.wait(60) == -9


async def _stored(url: str) -> tuple[dict | None, dict[str, list]]:
    """The budget record of ana, and each session's stored history."""
    store = await open_existing_store(url)
    try:
        history = {sid: await store.load_history(sid) for sid in ("before", "after")}
        return await store.get_record(user_budget_key("shop", "ana")), history
    finally:
        await store.close()


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_budget_counts_a_turn_exactly_when_its_commit_landed(fake, shared_store, tmp_path):
    (tmp_path / "shop.yaml").write_text(BOT)
    (tmp_path / "auth.yaml").write_text(AUTH)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_AT_COMMIT)
    args = (str(tmp_path / "shop.yaml"), shared_store, fake.base_url, "--auth", str(tmp_path / "auth.yaml"))
    for when in ("before", "after"):
        replica = Killed(hook, when, *args)
        try:
            fake.queue(SMALL)
            _killed_in_a_turn(replica.start(), when)
        finally:
            replica.kill()
    record, history = asyncio.run(_stored(shared_store))
    assert [e["turn"] for e in history["before"]] == []  # killed before its commit: no turn ...
    assert [e["turn"] for e in history["after"]] == [1]  # ... and after it: the turn is stored
    assert record is not None and (record["tokens"], record["principal"]) == (25, "ana")  # that turn only
