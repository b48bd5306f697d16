"""README.md, "Memories": memory is what the model sees, history is what was said. A window that
evicts messages from the memory takes nothing from the history: every turn, its input and its
events stay, in the session and in its store, for a session resumed from the store too."""

from __future__ import annotations

import chatrun
from chatrun.messages import UserMessage

BOT = """
name: kept
format: 3
model: {provider: scripted}
memory: {type: message_window, max_messages: 3}
routes:
  main: {default: true, system: You listen.}
"""

SAID = [f"message {n}" for n in range(1, 7)]


def test_a_window_evicts_from_the_memory_and_never_from_the_history(write_bot, tmp_path):
    bot = chatrun.load_bot(write_bot(BOT))
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    session = bot.session(model=chatrun.ScriptedModel([f"reply {n}" for n in range(1, 7)]), store=store)
    for text in SAID:
        session.chat(text)
    assert [m.content for m in session.memory() if isinstance(m, UserMessage)] == ["message 6"]  # evicted
    for history in (session.history, bot.session(store=store, session_id=session.id).history):
        assert [(entry["turn"], entry["input"]) for entry in history] == list(enumerate(SAID, 1))
        assert [[e["data"] for e in entry["events"]] for entry in history] == [[f"reply {n}"] for n in range(1, 7)]
    store.close()
