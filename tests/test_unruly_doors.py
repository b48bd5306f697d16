"""The unruly model through the doors (issue 32's promise: every guarantee holds whatever the model
does): the real `openai` SDK over `/v1` and the HTTP API, the bot's model the fake OpenAI server
answering blank and empty answers. Whatever the model leaves out, the user gets a reply."""

from __future__ import annotations

import openai
import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.definition.page_texts import BUILTIN
from server_support import app_for_testclient

BOT = """
name: quiet
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
state: {count: 0, total: 0}
routes:
  main: {default: true, system: You help., tools: [bump, send, add]}
tools:
  add:
    description: Add an amount to the total
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    action: {set: {state.total: "{{ state.total + args.amount }}"}}
  send:
    description: Send money
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    confirm: "Send {{ args.amount }} EUR?"
    action: {reply: "Sent {{ args.amount }} EUR."}
  bump:
    description: Count one more
    action: {set: {state.count: "{{ state.count + 1 }}"}, reply: "Counted {{ state.count }}."}
"""
FALLBACK = BUILTIN["en"]["fallback"]
BUMP = {"name": "bump", "arguments": {}}


@pytest.fixture
def client(fake, write_bot, tmp_path):
    app = app_for_testclient([chatrun.load_bot(write_bot(BOT))], f"sqlite:///{tmp_path / 's.db'}")
    with TestClient(app) as c:
        yield c


def sdk(client) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=client, max_retries=0)


def v1_reply(client, stream: bool) -> str:
    messages = [{"role": "user", "content": "hi"}]
    if not stream:
        return sdk(client).chat.completions.create(model="quiet", messages=messages).choices[0].message.content or ""
    chunks = sdk(client).chat.completions.create(model="quiet", messages=messages, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("stream", [False, True])
def test_v1_sends_the_fallback_after_two_answers_that_streamed_only_blanks(client, fake, stream):
    fake.queue({"chunks": [" ", "\n"]}, {"text": "   "})
    assert v1_reply(client, stream).strip() == FALLBACK


@pytest.mark.parametrize("stream", [False, True])
def test_v1_blanks_beside_a_call_then_blanks_get_the_fallback(client, fake, stream):
    fake.queue({"text": " ", "tool_calls": [BUMP]}, {"text": "  "}, {"text": "\n"})
    assert v1_reply(client, stream).strip() == FALLBACK


def test_http_blanks_beside_a_call_are_no_message_and_the_user_gets_the_fallback(client, fake):
    fake.queue({"text": " \n", "tool_calls": [BUMP]}, {"text": "  "}, {"text": "\t"})
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "count"}).json()
    assert [e["data"] for e in body["events"] if e["type"] == "Message"] == [FALLBACK]
    assert body["ok"] and client.get("/bots/quiet/sessions/s1").json()["state"]["count"] == 1


def test_a_decision_answers_its_own_call_when_the_model_reuses_call_ids(client, fake):
    """A model server that numbers each answer's calls from call_0: the user's yes replaces the
    placeholder of the call it decides, not the result of an earlier call with the same id."""
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    fake.queue({"tool_calls": [{**BUMP, "id": "call_0"}]}, {"text": "Counted."},
               {"tool_calls": [{"name": "send", "arguments": {"amount": 5}, "id": "call_0"}]}, {"text": "Sent."})
    for text in ("count", "send 5", "yes"):
        body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": text}).json()
        assert body["ok"], body
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told == ["Counted 1.", "Sent 5 EUR."]


def test_two_calls_of_one_answer_with_one_id_each_get_their_result(client, fake):
    """A model server that gives every call of an answer the same id: each call still has its own
    result in the memory (the second was dropped as an orphan: the model never read it)."""
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    fake.queue({"tool_calls": [{**BUMP, "id": "call_0"}, {**BUMP, "id": "call_0"}]}, {"text": "Counted twice."})
    assert client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "two more"}).json()["ok"]
    assistant, *results = [m for m in fake.requests[-1]["messages"] if m["role"] in ("assistant", "tool")]
    ids = [call["id"] for call in assistant["tool_calls"]]
    assert [(m["tool_call_id"], m["content"]) for m in results] == list(zip(ids, ["Counted 1.", "Counted 2."], strict=True))
    assert len(set(ids)) == 2 and client.get("/bots/quiet/sessions/s1").json()["state"]["count"] == 2


@pytest.mark.parametrize(("raw", "why"), [
    ('{"amount": NaN}', "NaN is not a JSON number"),
    ('{"amount": -Infinity}', "-Infinity is not a JSON number"),
    ('{"amount": 1e999}', "1e999 is too large a number"),
    ('{"amount": ' + "9" * 5000 + "}", "a number has more than 4300 digits"),
])
def test_arguments_json_cannot_hold_are_refused_to_the_model_and_the_turn_goes_on(client, fake, raw, why):
    """Python's JSON reader takes NaN, Infinity, 1e999 (inf) and fails on a number of more than
    4,300 digits: the turn failed when it saved the state (or with a traceback). They are invalid
    arguments the model reads about, like any JSON it got wrong."""
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    fake.queue({"tool_calls": [{"name": "send", "arguments": raw}]}, {"text": "Which amount?"})
    body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "send it"}).json()
    assert body["ok"] and [e["data"] for e in body["events"] if e["type"] == "Message"] == ["Which amount?"]
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told == [f"Error: the arguments of send are not valid JSON ({why}). Call it again with a JSON object "
                    "matching its parameters."]


def test_a_value_json_cannot_hold_fails_the_turn_naming_the_tool_and_path(client, fake):
    """Two amounts JSON holds (1.7e308, 1.6e308) make a total it does not (inf): the turn failed
    only when it saved, naming no tool ("its snapshot: it holds a value JSON cannot represent"),
    after the model had been asked again. It fails where the value is set, saying where."""
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    fake.queue({"tool_calls": [{"name": "add", "arguments": {"amount": 1.7e308}},
                               {"name": "add", "arguments": {"amount": 1.6e308}}]}, {"text": "Added."})
    body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "add them"}).json()
    assert not body["ok"] and [e["type"] for e in body["events"]] == ["Error"]
    detail = body["events"][0]["meta"]["detail"]
    assert detail.startswith("tool add (") and "state.total would be inf, which JSON cannot hold" in detail, detail
    assert fake.pending == 1 and client.get("/bots/quiet/sessions/s1").json()["state"]["total"] == 0


REFUSAL = "I can't help with that."


@pytest.mark.parametrize("stream", [False, True])
def test_v1_a_refusal_is_the_reply(client, fake, stream):
    """OpenAI's `message.refusal` (content null): the model declined, and that is its answer. It was
    taken for an empty answer: nudged, then the fallback text."""
    fake.queue({"refusal": REFUSAL})
    assert v1_reply(client, stream) == REFUSAL
    assert len(fake.requests) == 1


def test_http_a_refusal_is_the_reply_and_the_memory_keeps_it(client, fake):
    fake.queue({"refusal": REFUSAL}, {"text": "Fine."})
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    for text in ("do something bad", "ok"):
        body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": text}).json()
        assert body["ok"], body
    assert [(m["role"], m["content"]) for m in fake.requests[-1]["messages"][-3:]] == [
        ("user", "do something bad"), ("assistant", REFUSAL), ("user", "ok")]


def test_http_a_cut_off_reply_is_told_to_the_author(client, fake, caplog):
    """`finish_reason: length`: the reply stopped at max_tokens. It is shown as it is, and the author
    reads it was cut (a Console event, the `chatrun` logger), as other author-facing notes."""
    fake.queue({"text": "The three steps are: first", "finish_reason": "length"})
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    with caplog.at_level("WARNING", logger="chatrun"):
        body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "steps?"}).json()
    assert [e["data"] for e in body["events"] if e["type"] == "Message"] == ["The three steps are: first"]
    consoles = [e["data"] for e in body["events"] if e["type"] == "Console"]
    assert any("cut off at its length limit (model.max_tokens" in c for c in consoles), consoles
    assert any("cut off at its length limit" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("raw", ['{"amount": 12', '{"amount": 12}'])
def test_http_a_call_cut_off_at_max_tokens_is_not_run(client, fake, raw):
    """A tool call whose answer stopped at max_tokens: its arguments may be truncated (a lenient
    server closes the JSON it cut: `{"amount": 12}` of 125). It is not run; the model reads why."""
    fake.queue({"tool_calls": [BUMP, {"name": "add", "arguments": raw}], "finish_reason": "length"},
               {"text": "Counted."})
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "add 125"}).json()
    assert body["ok"] and client.get("/bots/quiet/sessions/s1").json()["state"] == {"count": 1, "total": 0}
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told[0] == "Counted 1." and told[1].startswith("Not run: your answer was cut off at the length limit")


def test_http_blanks_after_a_reply_in_the_same_turn_are_no_message(client, fake):
    """A reply, a call, then an answer of blanks: the user had a reply, so the blanks stand as the
    answer, but they were sent as a blank Message too."""
    fake.queue({"text": "Counting.", "tool_calls": [BUMP]}, {"text": " \n "})
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "count"}).json()
    assert body["ok"] and [e["data"] for e in body["events"] if e["type"] == "Message"] == ["Counting."]


@pytest.mark.parametrize("stream", [False, True])
def test_v1_blanks_after_a_reply_add_nothing_to_it(client, fake, stream):
    fake.queue({"text": "Counting.", "tool_calls": [BUMP]}, {"text": "   "})
    assert v1_reply(client, stream) == "Counting."


PAY_BOT = """
name: payer
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
state: {paid: 0}
routes:
  main: {default: true, system: You pay., tools: [pay]}
tools:
  pay:
    effect: once
    description: Pay an amount
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    action: {set: {state.paid: "{{ state.paid + args.amount }}"}, reply: "Paid {{ args.amount }}"}
"""


@pytest.fixture
def payer(fake, write_bot, tmp_path):
    app = app_for_testclient([chatrun.load_bot(write_bot(PAY_BOT))], f"sqlite:///{tmp_path / 'p.db'}")
    with TestClient(app) as c:
        assert c.post("/bots/payer/sessions", json={"id": "s1"}).status_code == 201
        yield c


def test_http_an_identical_call_reads_the_earlier_reply_as_a_sentence(payer, fake):
    """"Already done …: Paid 30 It was not run again": the earlier reply ran into the next sentence."""
    pay = {"name": "pay", "arguments": {"amount": 30}}
    fake.queue({"tool_calls": [pay, pay]}, {"text": "Paid."})
    assert payer.post("/bots/payer/sessions/s1/messages", json={"userMessage": "pay 30"}).json()["ok"]
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told == ["Paid 30", "Already done earlier in this conversation (turn 1): Paid 30. It was not run again; "
                               "do not call it again for the same thing."]


@pytest.mark.parametrize(("raw", "kind"), [("null", "null"), ('"30"', "a string"), ("[30]", "a list"),
                                           ("30", "a number"), ("true", "a boolean")])
def test_http_arguments_not_an_object_are_named_in_json_words(payer, fake, raw, kind):
    """The model wrote JSON: the refusal said Python's names (`not NoneType`, `not str`)."""
    fake.queue({"tool_calls": [{"name": "pay", "arguments": raw}]}, {"text": "How much?"})
    assert payer.post("/bots/payer/sessions/s1/messages", json={"userMessage": "pay"}).json()["ok"]
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told == [f"Error: the arguments of pay must be a JSON object, not {kind}."]


def test_http_a_decision_turn_that_fails_leaves_its_item_pending_and_says_so(client, fake):
    """The user's yes resolves the approval, then the model fails: the turn is rolled back and the
    item waits again, but the client had read only `Resolved` (then the Error). The item is
    announced again before the Error: the last the client reads of p1 is that it waits."""
    assert client.post("/bots/quiet/sessions", json={"id": "s1"}).status_code == 201
    fake.queue({"tool_calls": [{"name": "send", "arguments": {"amount": 5}}]}, {"status": 500})
    assert client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "send 5"}).json()["ok"]
    body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "yes"}).json()
    assert not body["ok"] and [e["type"] for e in body["events"]] == ["Resolved", "Pending", "Error"]
    assert body["events"][1]["data"]["id"] == "p1" and body["events"][1]["data"]["tool"] == "send"
    assert [p["id"] for p in client.get("/bots/quiet/sessions/s1").json()["pending"]] == ["p1"]
    fake.queue({"text": "Sent."})
    body = client.post("/bots/quiet/sessions/s1/messages", json={"userMessage": "yes"}).json()
    assert body["ok"] and [e["type"] for e in body["events"]][:2] == ["Resolved", "Message"]


LONG_WAIT = PAY_BOT.replace("    effect: once\n", "    effect: once\n    approval: {by: [user], timeout: TIMEOUT}\n")


def test_validate_refuses_an_approval_timeout_no_clock_reaches(write_bot):
    """`timeout: 99999999d` passed `chatrun validate`; the turn that asked for approval then failed
    with "internal error: OverflowError" (now + the timeout is past the year 9999)."""
    from click.testing import CliRunner

    from chatrun.cli import main
    path = write_bot(LONG_WAIT.replace("TIMEOUT", "99999999d"))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code != 0, result.output
    assert "tool `pay`: `approval.timeout: 99999999d` is longer than any clock reaches" in result.output
    assert CliRunner().invoke(main, ["validate", str(write_bot(LONG_WAIT.replace("TIMEOUT", "3650d")))]).exit_code == 0


def test_a_timeout_past_the_clocks_end_never_comes_due_and_the_turn_goes_on(write_bot, fake):
    """A timeout validation takes (400 days) on a session whose clock is near the year 9999: the
    approval is asked (never due), not an internal error."""
    from datetime import UTC, datetime
    session = chatrun.load_bot(write_bot(LONG_WAIT.replace("TIMEOUT", "400d"))).session()
    session.clock = chatrun.FixedClock(datetime(9999, 6, 1, tzinfo=UTC))
    fake.queue({"tool_calls": [{"name": "pay", "arguments": {"amount": 30}}]})
    events = session.chat("pay 30")
    assert [e.type for e in events if e.type in ("Pending", "Error")] == ["Pending"], events
    assert [(p.id, p.due) for p in session.pending] == [("p1", None)]


def test_v1_a_fork_of_a_turn_that_asked_for_consent_tells_the_model_nothing_waits_there(client, fake):
    """The user's yes sent the money; the front end then regenerates the answer to that yes (the
    same history resent), which forks from right after the question. The question's item is not
    forked (a decision belongs to the conversation that asked), but the fork's memory still read
    "Waiting for the user's confirmation", then the user's "yes": a model answers "Sent." with
    nothing sent in that conversation (or asks its own way). The model reads that nothing waits."""
    ai = sdk(client)
    send = {"tool_calls": [{"name": "send", "arguments": {"amount": 5}}]}
    fake.queue(send)
    messages = [{"role": "user", "content": "send 5"}]
    asked = ai.chat.completions.create(model="quiet", messages=messages).choices[0].message.content
    messages += [{"role": "assistant", "content": asked}, {"role": "user", "content": "yes"}]
    fake.queue({"text": "Sent."})
    assert ai.chat.completions.create(model="quiet", messages=messages).choices[0].message.content == "Sent."
    fake.queue({"text": "Shall I send it again?"})
    regenerated = ai.chat.completions.create(model="quiet", messages=messages)
    assert regenerated.model_extra["chatrun"]["how"] == "forked"
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told == ["Not decided: the conversation was taken up again from before this call was decided, "
                    "so send did not run here and nothing waits for it. If it is still wanted, call it again."]
    assert fake.requests[-1]["messages"][-1] == {"role": "user", "content": "yes"}


DEPOSIT_BOT = """
name: deposit
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main: {default: true, system: You take deposits., tools: [pay_deposit]}
tools:
  pay_deposit:
    effect: once
    description: Pay the deposit (the user is asked to confirm)
    parameters: {type: object, properties: {amount: {type: number}}, required: [amount]}
    confirm: "Pay a deposit of {{ args.amount }} EUR?"
    action: {reply: "Paid {{ args.amount }} EUR."}
"""


@pytest.mark.parametrize("decision", ["yes", "Approve"])
def test_a_once_call_the_user_approved_is_done_and_its_repeat_asks_nothing(write_bot, fake, decision):
    """A `once` tool whose action only replies counted as having done nothing, so it was not
    remembered: after the user's yes the model's identical call (consenting itself) asked the
    user the same question again. The approval is what it did: the repeat is answered."""
    from chatrun.testing.unruly import Unruly  # noqa: F401 - the fake answers the same items

    session = chatrun.load_bot(write_bot(DEPOSIT_BOT)).session()
    fake.queue({"unruly": "self_confirm", "call": {"name": "pay_deposit", "arguments": {"amount": 50}}})
    session.chat("pay the deposit")
    fake.queue({"unruly": ["repeat_call", "self_confirm"]}, {"text": "Your deposit is paid."})
    events = session.chat("yes" if decision == "yes" else chatrun.Approve("p1"))
    assert [e.type for e in events if e.type in ("Pending", "Resolved")] == ["Resolved"], events
    assert session.pending == [] and fake.pending == 0
    told = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] == "tool"]
    assert told[0].startswith("Paid 50 EUR.")
    assert told[1].startswith("Already done earlier in this conversation (turn 2): Paid 50 EUR."), told
