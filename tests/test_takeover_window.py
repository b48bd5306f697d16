"""What was said during a takeover and a route's memory window: a huge paste, or a talk longer
than the window, added line by line on release was evicted by the window without a word (the
user's paste too), and the model then answered from a memory that lacked it. The memory gets a
digest that fits and says what it left out and cut; the author a Console note. Through a real
session and the real `openai` client against the fake OpenAI server."""

from __future__ import annotations

import pytest

import chatrun
from chatrun import OperatorSay, Release, TakeOver

pytestmark = pytest.mark.needs_encodings

BOT = """
name: desk
model: {{provider: openai, name: gpt-4o, max_retries: 0, max_tokens: 200}}
tools:
  human:
    description: Hand over to a person
    action:
      operator: {{text: Connecting you with a colleague., remember: {remember}}}
routes:
  main:
    default: true
    system: Answer briefly.
    tools: [human]
    memory: {memory}
"""

DOCUMENT = "The tenant shall keep the premises in good repair. " * 300  # about 3,000 tokens
ALICE = {"name": "alice", "roles": []}
OLGA = {"name": "olga", "roles": ["operators"]}


def as_(session, principal):
    session.principal = principal
    session.roles = set(principal["roles"])
    return session


def handed_over(fake, write_bot, memory: str, remember: str = "messages"):
    session = as_(chatrun.load_bot(write_bot(BOT.format(memory=memory, remember=remember))).session(), ALICE)
    fake.queue({"tool_calls": [{"name": "human", "arguments": {}}]})
    session.chat("I want a human")
    as_(session, OLGA).chat(TakeOver())
    return session


def console(events) -> list[str]:
    return [e.data for e in events if e.type == "Console"]


def test_a_paste_larger_than_the_window_reaches_the_model_as_a_digest_that_says_it_was_cut(fake, write_bot):
    session = handed_over(fake, write_bot, "{type: token_window, max_tokens: 1000}")
    as_(session, ALICE).chat(DOCUMENT)
    as_(session, OLGA).chat(OperatorSay("I read your lease: the repairs are yours."))
    events = session.chat(Release())
    [note] = console(events)
    assert note.startswith("route main: what the operator and the user said (2 line(s)) does not fit the "
                           "route's memory; kept a digest of its last 2 line(s), each cut to 300 characters")
    fake.queue({"text": "Anything else?"})
    as_(session, ALICE).chat("So I pay for the roof?")
    sent = fake.requests[-1]["messages"]
    assert sent[-1] == {"role": "user", "content": "So I pay for the roof?"}
    [digest] = [m["content"] for m in sent if "An operator talked with the user" in str(m["content"])]
    assert "1 message(s) from the user, 1 from the operator" in digest
    assert "user: The tenant shall keep the premises" in digest and "…" in digest  # cut, and says so
    assert "operator olga: I read your lease: the repairs are yours." in digest
    assert DOCUMENT.strip() not in str(sent)


def test_a_talk_longer_than_a_message_window_keeps_its_last_user_line_in_a_digest(fake, write_bot):
    session = handed_over(fake, write_bot, "{type: message_window, max_messages: 4}")
    for n in range(3):
        as_(session, ALICE).chat(f"question {n}")
        as_(session, OLGA).chat(OperatorSay(f"answer {n}"))
    as_(session, ALICE).chat("last question")
    events = as_(session, OLGA).chat(Release())
    assert "(7 line(s)) does not fit the route's memory; kept a digest of its last 7 line(s)" in console(events)[0]
    fake.queue({"text": "Fine."})
    as_(session, ALICE).chat("hello again")
    digest = fake.requests[-1]["messages"][-2]["content"]
    assert digest.startswith("(An operator talked with the user while I was away: 4 message(s) from the user")
    assert "user: question 0" in digest and digest.endswith("user: last question)")


def test_a_talk_that_fits_is_kept_line_by_line_with_no_note(fake, write_bot):
    session = handed_over(fake, write_bot, "{type: token_window, max_tokens: 4000}")
    as_(session, ALICE).chat("my order is late")
    as_(session, OLGA).chat(OperatorSay("It ships today."))
    assert console(session.chat(Release())) == []
    fake.queue({"text": "Glad to help."})
    as_(session, ALICE).chat("thanks")
    assert fake.requests[-1]["messages"][-3:] == [
        {"role": "user", "content": "my order is late"},
        {"role": "assistant", "content": "[operator olga] It ships today."},
        {"role": "user", "content": "thanks"}]


def test_a_summary_digest_larger_than_the_window_is_cut_to_one_that_fits(fake, write_bot):
    """`remember: summary` on a window memory is the digest of the last 20 lines: 20 long lines
    of 300 characters each did not fit 1,000 tokens and were evicted whole."""
    session = handed_over(fake, write_bot, "{type: token_window, max_tokens: 1000}", remember="summary")
    for n in range(10):
        as_(session, ALICE).chat(f"{n} " + DOCUMENT[:400])
        as_(session, OLGA).chat(OperatorSay(f"{n} " + DOCUMENT[:400]))
    events = session.chat(Release())
    assert "(20 line(s)) does not fit the route's memory; kept a digest of its last 5 line(s)" in console(events)[0]
    fake.queue({"text": "Fine."})
    as_(session, ALICE).chat("hello again")
    digest = fake.requests[-1]["messages"][-2]["content"]
    assert "10 message(s) from the user, 10 from the operator; the first 15 left out" in digest
    assert digest.endswith("…)") and "operator olga: 9 The tenant" in digest
