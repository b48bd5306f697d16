"""What an idle cached session of `chatrun serve` keeps in memory (issue 26): allocations are
counted with tracemalloc (sizes, not time: the same on any machine), per session of 3 turns."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import chatrun
from chatrun.server.sessions import NEW, SessionRegistry, SessionSettings
from chatrun.store import open_store
from chatrun.testing.fake_openai import FakeOpenAI

BOT = """
name: idle
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
memory: {type: message_window, max_messages: 20}
routes:
  main:
    default: true
    system: "You are a concise assistant."
"""

SESSIONS = 200


async def _chat(registry: SessionRegistry, session_id: str) -> None:
    async with registry.session("idle", session_id, None, NEW):
        pass
    for t in range(3):
        async with registry.session("idle", session_id, None) as session:
            async for _ in registry.turn(session, f"turn {t}"):
                pass


async def _bytes_per_idle_session(registry: SessionRegistry, fake: FakeOpenAI) -> float:
    for i in range(10):  # warm up: imports, the model client's connections, the store's caches
        await _chat(registry, f"warm-{i}")
    fake._log.clear(), fake._requests.clear()  # the fake model runs in this process: not counted
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(SESSIONS):
            await _chat(registry, f"s{i}")
        fake._log.clear(), fake._requests.clear()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert registry.live_count() == SESSIONS + 10  # all cached: nothing was evicted
    return grown / SESSIONS


def measure(folder: str) -> float:
    """Bytes per idle session, measured in this process (a fresh one: see the test)."""
    import os

    with FakeOpenAI() as fake:
        os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"] = fake.base_url, "test-key"
        fake.responder = lambda body: {"text": "Sure, happy to help with that."}
        path = Path(folder) / "idle.yaml"
        path.write_text(BOT)
        bot = chatrun.load_bot(path)
        registry = SessionRegistry({bot.name: bot}, open_store(f"sqlite:///{Path(folder) / 's.db'}"),
                                   settings=SessionSettings(cache_size=10**6, cache_bytes=2**40))
        return asyncio.run(_bytes_per_idle_session(registry, fake))


@pytest.mark.subprocess
def test_an_idle_cached_session_keeps_little(tmp_path):
    """The session, its scope, memory (six messages), buffer (the snapshot's JSON) and cache
    slot, as tracemalloc counts them in a fresh interpreter: about 3.2 KiB (3,271 B); 3.8 KiB
    (3,911 B) while its empty state, meta and scope state were four dicts of its own, its memories
    one-key dicts (the conversation's and the buffer's), a memory's system message a (message,
    count) pair and a scope's memory routes a list of its own (issue 39); 3.7 KiB (3,824 B); 4.4 KiB
    (4,459 B) while the memory windows kept a (message, count) pair per message, the buffer a
    second dict of sizes, the slot the last committed turn as a dict and the session a model
    wrapper around its pooled model (issue 39); 5.0 KiB (5,134 B); 5.3 KiB
    (5,474 B) while the session, conversation, memory windows and buffer had a __dict__, the
    session an empty handler dict and list and the cache slot an idle lock; 5.5 KiB (5,606 B) while every
    session kept an empty pending list and resolved dict, 5.6 KiB while its usage, scopes, slot
    and model handle had a __dict__, 6.8 KiB while it kept its last history entry."""
    # In a fresh interpreter: in a test worker, what earlier tests left in process-wide caches
    # (filled or not yet) moves the count by hundreds of bytes, or more.
    out = subprocess.run([sys.executable, __file__, str(tmp_path)], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    per_session = float(out.strip().splitlines()[-1])
    assert per_session < 3.5 * 1024, f"an idle session keeps {per_session:.0f} B"


if __name__ == "__main__":
    print(measure(sys.argv[1]))
