"""A user message larger than the whole window (a pasted document): the window would evict it on its
own and send the model the system prompt without it, and the model would answer a message it never
read. The turn is refused instead: no model call, the user told in their locale that the message is
too long (nothing of it kept), the author's detail naming the route, the tokens and the memory's
maximum. Through a real session and the real `openai` client against the fake OpenAI server."""

from __future__ import annotations

import pytest

import chatrun
from chatrun.definition.page_texts import BUILTIN
from chatrun.memory.tokens import tiktoken_counter
from chatrun.messages import UserMessage

pytestmark = pytest.mark.needs_encodings

BOT = """
name: reader
model: {{provider: openai, name: gpt-4o, max_retries: 0, max_tokens: 500}}
routes:
  main:
    default: true
    system: Answer briefly.
    memory: {memory}
"""

DOCUMENT = "The tenant shall keep the premises in good repair. " * 300  # about 3,000 tokens


def _session(write_bot, memory: str):
    return chatrun.load_bot(write_bot(BOT.format(memory=memory))).session()


@pytest.mark.parametrize("memory", [
    "{type: token_window, max_tokens: 1000}",
    "{type: token_window, max_tokens: {context_size: 2000, reply_reserve: 500}}",
])
def test_a_message_larger_than_the_window_is_refused_and_never_sent_without_itself(fake, write_bot, memory):
    session = _session(write_bot, memory)
    fake.queue({"text": "Hello!"})
    session.chat("hello")
    kept = session.memory()
    events = session.chat(DOCUMENT)
    assert len(fake.requests) == 1  # the model is not asked to answer a message it would not read
    errors = [e for e in events if e.type == "Error"]
    assert [e.data for e in errors] == [BUILTIN["en"]["message_too_long"]]
    assert session.memory() == kept  # nothing of the refused turn is kept
    tokens = tiktoken_counter("o200k_base")(UserMessage(DOCUMENT))
    detail = session.history[-1]["error"]
    assert session.history[-1]["ok"] is False
    assert "route main" in detail and f"{tokens} tokens" in detail and "max_tokens" in detail
    fake.queue({"text": "Fine."})
    assert [e.data for e in session.chat("a short one") if e.type == "Message"] == ["Fine."]  # the session goes on
    assert fake.requests[-1]["messages"][-1] == {"role": "user", "content": "a short one"}


def test_a_message_that_fits_is_sent_whole_and_the_window_evicts_older_ones(fake, write_bot):
    session = _session(write_bot, "{type: token_window, max_tokens: 4000}")
    fake.queue({"text": "Hello!"}, {"text": "Read it."})
    session.chat("hello")
    session.chat(DOCUMENT)
    assert fake.requests[-1]["messages"][-1] == {"role": "user", "content": DOCUMENT}



CONFIRM_BOT = """
name: payer
model: {provider: openai, name: gpt-4o, max_retries: 0}
routes:
  main:
    default: true
    system: Send money when asked.
    memory: {type: token_window, max_tokens: 1000}
    tools: [send_money]
tools:
  send_money:
    description: Send money to someone
    parameters: {type: object, properties: {to: {type: string}}, required: [to]}
    confirm: "Send money to {{ args.to }}?"
    action: {reply: Sent.}
"""


def test_a_message_larger_than_the_window_answering_a_confirmation_is_refused_too(fake, write_bot):
    """Neither yes nor no, the user's message declines the call and the model reads it after the
    call's result: a document larger than the window would evict the call, its result and itself."""
    session = chatrun.load_bot(write_bot(CONFIRM_BOT)).session()
    fake.queue({"tool_calls": [{"name": "send_money", "arguments": {"to": "Ana"}}]})
    session.chat("Send Ana some money")
    assert [item.kind for item in session.pending] == ["approval"]
    kept = session.memory()
    events = session.chat(DOCUMENT)
    assert len(fake.requests) == 1
    assert [e.data for e in events if e.type == "Error"] == [BUILTIN["en"]["message_too_long"]]
    assert session.memory() == kept and [item.kind for item in session.pending] == ["approval"]
