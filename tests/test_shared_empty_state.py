"""Idle sessions share one read-only empty mapping for the state they have not written (their
conversation state, meta, and each scope's local and shared state; engine/scopes.py UNWRITTEN,
issue 39). Through the server's registry, a real bot whose handler writes: what one session
writes never shows in another, nor in the shared empty, nor in another session's stored snapshot."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import chatrun
from chatrun import Bot
from chatrun.engine.scopes import UNWRITTEN
from chatrun.server.sessions import NEW, SessionRegistry, SessionSettings
from chatrun.store import open_store
from chatrun.testing.fake_openai import FakeOpenAI

BOT = """
name: shared
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main:
    default: true
    system: "You take notes."
    tools: [note]
tools:
  note:
    description: Take a note
    handler: notes:write
"""

HANDLER = '''
def write(ctx):
    ctx.state["noted"] = "by a"
    ctx.scope["draft"] = ["by a"]
    return "noted"
'''


def _answer(body: dict) -> dict:
    """Call `note` when asked to; answer in text otherwise (and after the tool's result)."""
    last = body["messages"][-1]
    if last["role"] == "user" and "note" in str(last["content"]):
        return {"tool_calls": [{"name": "note", "arguments": {}}]}
    return {"text": "Done."}


async def _turn(registry: SessionRegistry, session_id: str, text: str) -> None:
    async with registry.session("shared", session_id, None) as session:
        async for _ in registry.turn(session, text):
            pass


async def _scenario(registry: SessionRegistry) -> dict:
    for sid in ("a", "b"):
        async with registry.session("shared", sid, None, NEW):
            pass
        await _turn(registry, sid, "hello")
    seen: dict = {}
    # Both idle in the cache: they share the one empty mapping (else this test proves nothing).
    idle = [registry.cache._slots["shared", sid].session for sid in ("a", "b")]
    seen["shared before"] = [[x is UNWRITTEN for x in (s._c._state, s._c._meta, s.scopes[-1]._local, s.scopes[-1]._shared)]
                             for s in idle if s is not None]
    await _turn(registry, "a", "note this")  # the handler writes state and scope state
    async with registry.session("shared", "a", None) as a:
        a.ask_locale("fr")  # meta
        a.state["direct"] = 1  # the Python API writes state too
        a.scopes[-1].shared["kept"] = True
    await _turn(registry, "a", "hello again")  # a's writes are committed with this turn
    async with registry.session("shared", "a", None) as a, registry.session("shared", "b", None) as b:
        seen["a"] = (a.state, a.meta, a.scopes[-1].local, a.scopes[-1].shared)
        seen["b"] = (b.state, b.meta, b.scopes[-1].local, b.scopes[-1].shared)
    seen["stored b"] = (await registry.store.load_session("b")).snapshot
    return seen


@pytest.fixture
def bot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bot]:
    """The note-taking bot on the fake model (the environment restored after the test)."""
    (tmp_path / "bot.yaml").write_text(BOT)
    (tmp_path / "notes.py").write_text(HANDLER)
    with FakeOpenAI() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        fake.responder = _answer
        yield chatrun.load_bot(tmp_path)


def test_a_write_to_one_session_never_shows_in_another(bot: Bot, tmp_path: Path) -> None:
    registry = SessionRegistry({bot.name: bot}, open_store(f"sqlite:///{tmp_path / 's.db'}"),
                               settings=SessionSettings(cache_size=100))
    seen = asyncio.run(_scenario(registry))
    assert seen["shared before"] == [[True] * 4] * 2
    assert seen["a"] == ({"noted": "by a", "direct": 1}, {"locale": "fr"}, {"draft": ["by a"]}, {"kept": True})
    assert seen["b"] == ({}, {}, {}, {})
    stored = seen["stored b"]
    assert (stored["state"], stored["meta"], stored["scopes"][-1]["local"], stored["scopes"][-1]["shared"]) == ({}, {}, {}, {})
    assert UNWRITTEN == {} and type(UNWRITTEN).__name__ == "_Unwritten"


def test_the_shared_empty_refuses_writes() -> None:
    """A path that skipped the properties fails loudly instead of writing into every session."""
    for write in (lambda: UNWRITTEN.__setitem__("k", 1), lambda: UNWRITTEN.update(k=1),
                  lambda: UNWRITTEN.setdefault("k", 1)):
        try:
            write()
        except TypeError as error:
            assert "read-only" in str(error)
        else:
            raise AssertionError("the shared empty took a write")
    assert UNWRITTEN == {}


def test_sessions_of_the_python_api_share_nothing_they_write(bot: Bot) -> None:
    """The same through `bot.session()` and `chat()` (the REPL's and the transcripts' path)."""
    a, b = bot.session(), bot.session()
    a.chat("hello"), b.chat("hello")
    assert a.scopes[-1]._local is b.scopes[-1]._local is UNWRITTEN  # shared while idle
    a.chat("note this")
    a.meta["channel"] = "test"
    assert (a.state, a.meta, a.scopes[-1].local) == ({"noted": "by a"}, {"channel": "test"}, {"draft": ["by a"]})
    assert (b.state, b.meta, b.scopes[-1].local, b.scopes[-1].shared) == ({}, {}, {}, {})
    assert b.snapshot()["state"] == {} and UNWRITTEN == {}
