"""Usage and cost: what the endpoint reports (through the real openai client against the fake
server), priced from `prices:`, kept per call and per turn in the history and per session in
the snapshot; counted and marked estimated when the endpoint reports nothing; budgets that
stop a turn before a model call would pass them."""

from __future__ import annotations

import pytest

import chatrun
from chat_support import COSTLY_BOT, usage

BOT = COSTLY_BOT


def test_reported_usage_is_priced_and_kept_per_call_turn_and_session(fake, write_bot):
    fake.queue(
        {"tool_calls": [{"name": "note", "arguments": {}}], "usage": usage(1000, 50, cached=400)},
        {"text": "Done.", "usage": usage(1200, 20, reasoning=8)},
        {"text": "Again.", "usage": usage(2000, 10)},
    )
    session = chatrun.load_bot(write_bot(BOT)).session()
    session.chat("take a note")
    entry = session.last_turn
    first, second = entry["usage"]["by_call"]
    assert first == {"route": "main", "model": "gpt-4o-mini", "input_tokens": 1000, "output_tokens": 50,
                     "cached_input_tokens": 400, "reasoning_tokens": 0,
                     "cost": pytest.approx((600 * 0.15 + 400 * 0.075 + 50 * 0.60) / 1e6), "estimated": False}
    assert second["reasoning_tokens"] == 8
    turn = entry["usage"]
    assert (turn["input_tokens"], turn["output_tokens"], turn["calls"]) == (2200, 70, 2)
    assert turn["cost"] == pytest.approx(first["cost"] + second["cost"])
    session.chat("again")
    total = session.usage
    assert (total["input_tokens"], total["output_tokens"], total["calls"], total["estimated"]) == (4200, 80, 3, False)
    assert session.snapshot()["usage"] == total  # in the store, so a resumed session keeps counting


def test_streamed_answers_report_usage_too(fake, write_bot):
    fake.queue({"chunks": ["Hel", "lo"], "usage": usage(300, 2)})
    session = chatrun.load_bot(write_bot(BOT)).session()
    session.chat("hi")
    assert fake.requests[0]["stream_options"] == {"include_usage": True}
    assert session.usage["input_tokens"] == 300 and not session.usage["estimated"]


def test_without_reported_usage_tokens_are_counted_and_marked_estimated(write_bot):
    path = write_bot(BOT.replace("provider: openai", "provider: scripted"))
    session = chatrun.load_bot(path).session(model=chatrun.ScriptedModel([{"text": "Hello there."}]))
    session.chat("hi")
    [call] = session.last_turn["usage"]["by_call"]
    assert call["estimated"] is True
    assert call["input_tokens"] > 0 and call["output_tokens"] > 0
    assert session.usage["estimated"] is True and session.usage["cost"] == pytest.approx(call["cost"])


def test_estimated_usage_tokenizes_each_message_once_and_counts_as_before(write_bot, monkeypatch):
    """A model that reports no usage is sent the whole conversation on every call: each message
    is tokenized once (its count kept with it), however often it is sent, and the estimate
    is the same exact count."""
    import tiktoken

    from chatrun.memory.tokens import tiktoken_counter

    encoded: list[str] = []
    encode = tiktoken.Encoding.encode_ordinary

    def counting(self, text):
        encoded.append(text)
        return encode(self, text)

    monkeypatch.setattr(tiktoken.Encoding, "encode_ordinary", counting)
    path = write_bot(BOT.replace("provider: openai", "provider: scripted"))
    model = chatrun.ScriptedModel()
    session = chatrun.load_bot(path).session(model=model)
    turns = 4  # within the default window, so the last call sent the whole memory
    for i in range(turns):
        model.add({"tool_calls": [{"name": "note", "arguments": {}}]}, {"text": f"Noted {i}."})
        session.chat(f"take note {i}")
    # Each turn adds 4 messages (user, tool call, tool result, answer) and sends its system
    # message; counting every sent message on every call would tokenize hundreds.
    assert len(encoded) <= 5 * turns
    enc = tiktoken.get_encoding(tiktoken_counter(model_name="gpt-4o-mini").encoding)  # type: ignore[attr-defined]
    last = session.last_turn["usage"]["by_call"][-1]
    sent = session.memory()[:-1]  # the last call was sent all but its own answer
    assert last["input_tokens"] == sum(len(encode(enc, m.text())) + 4 for m in sent)
    assert last["estimated"] is True


def test_a_turn_budget_stops_the_turn_before_the_call_that_would_pass_it(fake, write_bot):
    """1,450 tokens used by the first call; the second would send ~30 more: past 1,460."""
    path = write_bot(BOT + "limits: {max_turn_tokens: 1460}\n")
    fake.queue({"tool_calls": [{"name": "note", "arguments": {}}], "usage": usage(1400, 50)})
    session = chatrun.load_bot(path).session()
    events = session.chat("take a note")
    assert len(fake.requests) == 1  # the second call was never sent
    assert events[-1].type == "Error"
    assert "past limits.max_turn_tokens = 1460" in events[-1].meta["detail"]
    assert session.turn_count == 0  # rolled back ...
    assert session.usage["input_tokens"] == 1400  # ... but the call it made is counted


def test_a_session_cost_budget_holds_across_turns(fake, write_bot):
    path = write_bot(BOT + "limits: {max_session_cost: 0.00035}\n")
    fake.queue({"text": "one", "usage": usage(2000, 100)}, {"text": "two", "usage": usage(2000, 100)})
    session = chatrun.load_bot(path).session()
    # Budgets are checked before each call: the first call may spend past it (0.00036) ...
    assert session.chat("first")[-1].type != "Error"
    events = session.chat("second")  # ... and then no call is sent
    assert events[-1].type == "Error" and "limits.max_session_cost" in events[-1].meta["detail"]
    assert len(fake.requests) == 1


def test_usage_to_dict_copy_and_from_dict_agree_with_its_fields():
    # to_dict and copy are written out field by field (no dataclasses.fields() per turn): a new
    # field must reach both, and come back through from_dict.
    from dataclasses import fields

    from chatrun.engine.usage import Usage

    values = {f.name: i + 1 for i, f in enumerate(fields(Usage))} | {"cost": 0.25, "estimated": True}
    usage = Usage(**values)
    assert usage.to_dict() == values
    copied = usage.copy()
    assert copied == usage and copied is not usage
    assert Usage.from_dict(usage.to_dict()) == usage


def test_usage_add_sums_every_token_key_cost_calls_and_estimated():
    # Usage.add writes the token keys out by name: each of TOKEN_KEYS must be summed.
    from chatrun.engine.usage import TOKEN_KEYS, Usage

    for i, key in enumerate(TOKEN_KEYS):
        total, other = Usage(), Usage(calls=1)
        setattr(total, key, 10 + i)
        setattr(other, key, 5)
        total.add(other)
        assert getattr(total, key) == 15 + i and total.calls == 1
        assert all(getattr(total, k) == 0 for k in TOKEN_KEYS if k != key)
    total = Usage(cost=None)
    total.add(Usage(cost=0.5, estimated=True))
    total.add(Usage(cost=None))
    assert total.cost == 0.5 and total.estimated
