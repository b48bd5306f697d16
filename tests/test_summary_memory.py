"""The `summary` memory policy and `clear_tool_results`: the oldest messages folded into a
running summary by a model call after the reply (extended, never rewritten), tool calls never
split from their results, the system message untouched; a failed summary fails nothing."""

from __future__ import annotations

import chatrun
from chatrun.memory import MessageWindowMemory, SummaryMemory
from chatrun.messages import (
    AssistantMessage,
    SummaryMessage,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)


def words(message) -> int:
    return len(message.text().split())


def test_fold_plan_keeps_the_newest_messages_and_a_call_with_its_results():
    memory = SummaryMemory("m", max_tokens=12, keep_messages=2, counter=words)
    memory.add(SystemMessage("be brief"))
    memory.add(UserMessage("one two three"))
    memory.add(AssistantMessage("four five six"))
    assert memory.fold_plan() is None  # 8 words: under the trigger
    memory.add(UserMessage("look it up"))
    call = AssistantMessage(None, (ToolCall("c1", "lookup", "{}"),))
    memory.add(call)
    memory.add(ToolResultMessage("c1", "lookup", "found it"))
    # keep_messages=2 would keep [tool result, ...]: the call stays with its result instead
    folded = memory.fold_plan()
    assert folded == [UserMessage("one two three"), AssistantMessage("four five six"), UserMessage("look it up")]
    memory.apply_summary("the user counted to six", folded)
    assert memory.messages() == [SystemMessage("be brief"), SummaryMessage("the user counted to six"), call,
                                 ToolResultMessage("c1", "lookup", "found it")]
    assert memory.summary == SummaryMessage("the user counted to six")


def test_clear_tool_results_keeps_the_newest_and_the_pairing():
    memory = MessageWindowMemory("m", max_messages=50)
    memory.clear_tool_results = 1
    for i in range(3):
        memory.add(AssistantMessage(None, (ToolCall(f"c{i}", "search", "{}"),)))
        memory.add(ToolResultMessage(f"c{i}", "search", f"a long result number {i}"))
    results = [m for m in memory.messages() if isinstance(m, ToolResultMessage)]
    assert [r.tool_call_id for r in results] == ["c0", "c1", "c2"]  # still paired
    assert [r.content for r in results] == ["[cleared: the result of search is no longer shown]"] * 2 + [
        "a long result number 2"]


BOT = """
name: long
model: {provider: scripted, name: gpt-4o-mini}
memory: {type: summary, max_tokens: 60, keep_messages: 2, summary_model: {name: cheap-model}}
routes:
  main: {default: true, system: You chat.}
"""


def test_the_summary_is_made_after_the_reply_and_extended_on_the_next_fold(write_bot):
    long = " ".join(["word"] * 20)
    model = chatrun.ScriptedModel([
        {"text": "first answer " + long},
        {"text": "second answer " + long},
        {"text": "S1: the user said hello twice."},  # the summarizing call, after the reply
        {"text": "third answer " + long},
        {"text": "S2: extended."},
    ])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model)
    session.chat("hello")
    events = session.chat("hello again")
    assert [e.data for e in events if e.type == "Message"] == ["second answer " + long]
    summary_call = model.requests[2]
    assert summary_call.route == "main (summary)" and summary_call.config.name == "cheap-model"
    assert summary_call.tools == []
    assert "Summary so far" not in summary_call.messages[1].content  # the first fold: nothing to extend
    assert session.memory()[:2] == [SystemMessage("You chat."), SummaryMessage("S1: the user said hello twice.")]
    assert session.memory()[2:] == [UserMessage("hello again"), AssistantMessage("second answer " + long)]
    assert session.last_turn["summaries"] == [{"memory": f"{session.scope_id}#main", "folded": 2}]
    assert [c["route"] for c in session.last_turn["usage"]["by_call"]] == ["main", "main (summary)"]
    session.chat("and again")
    second_fold = model.requests[4].messages[1].content
    assert second_fold.startswith("Summary so far:\nS1: the user said hello twice.")  # extended, not redone
    assert "first answer" not in second_fold  # what was folded before is not sent again
    assert session.memory()[1] == SummaryMessage("S2: extended.")
    # the next model call sees the summary as a user message under a heading
    sent = [m.to_openai() for m in session.memory()]
    assert sent[1] == {"role": "user", "content": "Summary of the earlier conversation:\nS2: extended."}


def test_a_failed_summary_fails_nothing_and_the_next_turn_retries(write_bot):
    long = " ".join(["word"] * 30)
    model = chatrun.ScriptedModel([
        {"text": "first " + long}, {"text": "second " + long},
        {"error": "the summarizer is down"},
        {"text": "third " + long}, {"text": "S: finally."},
    ])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model)
    session.chat("one")
    events = session.chat("two")
    assert all(e.type != "Error" for e in events) and session.last_turn["ok"]
    [failure] = session.last_turn["summaries"]
    assert "the summarizer is down" in failure["failed"]
    assert not any(isinstance(m, SummaryMessage) for m in session.memory())  # left unsummarized
    session.chat("three")
    assert session.memory()[1] == SummaryMessage("S: finally.")


def test_a_stored_summary_survives_a_restart(write_bot, tmp_path):
    path = write_bot(BOT)
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    long = " ".join(["word"] * 30)
    first = chatrun.load_bot(path).session(store=store, model=chatrun.ScriptedModel(
        [{"text": "a " + long}, {"text": "b " + long}, {"text": "S: kept."}]))
    first.chat("one")
    first.chat("two")
    again = chatrun.load_bot(path).session(store=chatrun.SQLiteStore(str(tmp_path / "s.db")), session_id=first.id)
    assert again.memory()[1] == SummaryMessage("S: kept.")


def test_through_the_real_openai_client_the_summary_leads_the_next_request(fake, write_bot):
    long = " ".join(["word"] * 30)
    fake.queue({"text": "a " + long}, {"text": "b " + long}, {"text": "S: the user said one and two."},
               {"text": "c"})
    path = write_bot(BOT.replace("provider: scripted", "provider: openai"))
    session = chatrun.load_bot(path).session()
    for text in ("one", "two", "three"):
        session.chat(text)
    summarizing = fake.requests[2]
    assert summarizing["model"] == "cheap-model" and "tools" not in summarizing
    assert summarizing["messages"][1]["content"].startswith("Messages to add to it:\nuser: one")
    third = fake.requests[3]["messages"]
    assert third[0] == {"role": "system", "content": "You chat."}
    assert third[1] == {"role": "user", "content": "Summary of the earlier conversation:\nS: the user said one and two."}
    assert [m["content"] for m in third[2:]] == ["two", "b " + long, "three"]


def test_a_summary_longer_than_what_it_replaces_is_refused_and_the_memory_kept(write_bot):
    """A summarizing call that answers garbage (the conversation repeated, a runaway answer) would
    grow the memory it was asked to shrink, and every later turn would fold again: it is a failed
    summary, and the messages stay as they were."""
    long = " ".join(["word"] * 30)
    runaway = "S: " + " ".join(["blah"] * 400)
    model = chatrun.ScriptedModel([
        {"text": "first " + long}, {"text": "second " + long}, {"text": runaway},
        {"text": "third " + long}, {"text": "S: short."},
    ])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model)
    session.chat("one")
    before = session.memory()
    session.chat("two")
    assert session.last_turn["ok"]
    [failure] = session.last_turn["summaries"]
    assert "no shorter than" in failure["failed"]
    assert not any(isinstance(m, SummaryMessage) for m in session.memory())
    assert session.memory()[: len(before)] == before  # kept as it was, then the turn's messages
    session.chat("three")
    assert session.memory()[1] == SummaryMessage("S: short.")


def test_a_running_summary_is_stored_redacted_by_a_storage_guard(write_bot, tmp_path):
    """The summary a `summary` memory keeps of what it folded is written by a model: a card number
    it repeats was kept in the store as it was, while every other message was redacted."""
    from leak_support import card_leaked
    guarded = BOT.replace("routes:", "guardrails:\n  - {name: cards, pii: [card], stages: [storage], "
                                     "outcome: redact}\nroutes:")
    long = " ".join(["word"] * 20)
    model = chatrun.ScriptedModel([
        {"text": "first answer " + long},
        {"text": "second answer " + long},
        {"text": "S1: the user's card is 4111 1111 1111 1111."},
        {"text": "third answer"},
    ])
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    session = chatrun.load_bot(write_bot(guarded)).session(store=store, model=model)
    session.chat("hello")
    session.chat("hello again")
    session.chat("and?")
    assert SummaryMessage("S1: the user's card is [card].") in model.requests[3].messages  # read back from the store
    store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    assert b"S1: the user's card is [card]." in stored and not card_leaked(stored)


def test_a_summary_cut_off_at_its_length_limit_is_refused_and_the_memory_kept(fake, write_bot):
    """A summarizing call that stops at its `max_tokens` (`finish_reason: length`) answered the start
    of a summary: taking it would replace the folded messages by a note that lost their end, the
    newest of them. It is a failed summary, named as such; the messages stay, the next turn retries."""
    long = " ".join(["word"] * 30)
    fake.queue({"text": "a " + long}, {"text": "b " + long},
               {"text": "S: the user said one", "finish_reason": "length"},
               {"text": "c " + long}, {"text": "S: the user said one, two and three."})
    path = write_bot(BOT.replace("provider: scripted", "provider: openai"))
    session = chatrun.load_bot(path).session()
    session.chat("one")
    before = session.memory()
    session.chat("two")
    assert session.last_turn["ok"]
    [failure] = session.last_turn["summaries"]
    assert "cut off" in failure["failed"] and "max_tokens" in failure["failed"]
    assert not any(isinstance(m, SummaryMessage) for m in session.memory())
    assert session.memory()[: len(before)] == before
    session.chat("three")
    assert session.memory()[1] == SummaryMessage("S: the user said one, two and three.")


def test_a_summarizer_that_stalls_times_out_as_a_failed_summary_and_the_turn_commits(fake, write_bot):
    """A summarizing call that answers too late (10 s) holds the turn (and the session's next message) no
    longer than the summary model's `timeout:`: then it is a failed summary, the turn commits."""
    long = " ".join(["word"] * 30)
    fake.queue({"text": "a " + long}, {"text": "b " + long}, {"delay": 10, "text": "S: too late."},
               {"text": "c"}, {"text": "S: one and two."})
    bot = BOT.replace("provider: scripted", "provider: openai").replace(
        "summary_model: {name: cheap-model}", "summary_model: {name: cheap-model, timeout: 0.5, max_retries: 0}")
    session = chatrun.load_bot(write_bot(bot)).session()
    session.chat("one")
    events = session.chat("two")
    assert [e.data for e in events if e.type == "Message"] == ["b " + long] and session.last_turn["ok"]
    [failure] = session.last_turn["summaries"]
    assert "timed out after 0.5 s (model.timeout)" in failure["failed"]
    session.chat("three")
    assert session.memory()[1] == SummaryMessage("S: one and two.")
