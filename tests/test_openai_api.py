"""The OpenAI-compatible API (/v1) of `chatrun serve`, through the real `openai` SDK (sync, async,
streaming) against a real uvicorn server serving the travel bot, whose own model is the fake
OpenAI server. Conformance: responses and chunks are validated with the SDK's pydantic types."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

import chatrun
from chatrun.server import create_app
from chatrun.server.auth import Auth
from chatrun.server.openai_api import OpenAIOptions
from server_support import ThreadServer, call, write_travel

USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
BOOKED = "Your flight to Dublin on 2026-07-01 is booked."


def queue_booking(fake, chunks: bool = False) -> None:
    """Turn 1 (3 model calls): push into `flight`, set the destination, ask; turn 2 (2 calls):
    set the date, book (the tool's message, then pop back to main_menu)."""
    ask = {"chunks": ["When do ", "you leave?"]} if chunks else {"text": "When do you leave?"}
    fake.queue(*[r | {"usage": USAGE} for r in (
        call("book_flight"), call("set_destination", destination="Dublin"), ask,
        call("set_departure", date="2026-07-01"), call("book"),
    )])


@pytest.fixture
def travel(tmp_path):
    return chatrun.load_bot(write_travel(tmp_path / "bots"))


def serve(travel, tmp_path, **options):
    auth = options.pop("auth", None)
    app = create_app([travel], f"sqlite:///{tmp_path / 'chat.db'}", auth=auth,
                     openai=OpenAIOptions(session_headers=("X-OpenWebUI-Chat-Id",), **options))
    return ThreadServer(app)


@pytest.fixture
def server(fake, travel, tmp_path):
    with serve(travel, tmp_path) as s:
        yield s


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def info(completion) -> dict:
    """The `chatrun` field: session, turn, route, stack, how the session was found."""
    return completion.model_extra["chatrun"]


def say(client, messages, **extra):
    return client.chat.completions.create(model="travel", messages=messages, **extra)


# -- models ------------------------------------------------------------------------------


def test_models_lists_each_bot_and_its_routes(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["travel", "travel/main_menu", "travel/flight", "travel/lounge"]
    raw = httpx.get(str(client.base_url) + "models").json()
    for entry in raw["data"]:
        Model.model_validate(entry, strict=True)


# -- chat completions ------------------------------------------------------------------------


def test_a_whole_booking_through_chat_completions_pushes_and_pops_inside_chatrun(client, fake):
    queue_booking(fake)
    messages = [{"role": "system", "content": "ignored: the bot has its prompts"},
                {"role": "user", "content": "I want to fly to Dublin"}]
    first = say(client, messages)
    assert first.choices[0].message.content == "When do you leave?"
    assert first.choices[0].message.tool_calls is None  # chatrun's tools stay inside
    assert info(first) | {"session": "-"} == {"session": "-", "turn": 1, "route": "flight",
                                             "stack": ["main_menu", "flight"], "how": "new"}
    assert first.usage.model_dump(exclude_none=True) == {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "July 1st"}]
    second = say(client, messages)
    assert second.choices[0].message.content == BOOKED
    assert info(second)["session"] == info(first)["session"]
    assert info(second) | {"session": "-"} == {"session": "-", "turn": 2, "route": "main_menu",
                                              "stack": ["main_menu"], "how": "continued"}
    assert second.usage.total_tokens == 26
    # The flight route's prompt saw the reservation; the model never saw the client's system message.
    assert '"destination": "Dublin"' in fake.requests[2]["messages"][0]["content"]
    assert all("ignored" not in json.dumps(r["messages"]) for r in fake.requests)


def test_usage_is_counted_and_said_so_when_the_model_reports_none(client, fake, server):
    fake.queue({"text": "Hello there", "usage": None})
    reply = say(client, [{"role": "user", "content": "hi there you"}])
    assert info(reply)["usage_estimated"] is True
    # The engine counted the tokens of what was sent and answered: the turn's history says the same.
    turn = httpx.get(f"{server.url}/bots/travel/sessions/{info(reply)['session']}").json()["history"][-1]
    assert turn["usage"]["estimated"] is True
    assert reply.usage.prompt_tokens == turn["usage"]["input_tokens"] > 0
    assert reply.usage.completion_tokens == turn["usage"]["output_tokens"] > 0


def test_streaming_sends_openai_chunks_then_usage_then_done(client, fake, server):
    queue_booking(fake, chunks=True)
    stream = client.chat.completions.create(model="travel", messages=[{"role": "user", "content": "Dublin please"}],
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "When do you leave?"
    assert [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content] == \
        ["When do ", "you leave?"]  # as the model streamed them
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 39


def test_raw_chunks_conform_to_the_sdk_types_strictly(fake, server):
    fake.queue({"chunks": ["Hel", "lo"]})
    body = {"model": "travel", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        ChatCompletionChunk.model_validate(json.loads(line[6:]), strict=True)
    fake.queue({"text": "Hi"})
    plain = httpx.post(server.url + "/v1/chat/completions", json=body | {"stream": False}).json()
    assert ChatCompletion.model_validate(plain, strict=True).choices[0].message.content == "Hi"


def test_async_client_and_object_events_as_json(fake, tmp_path, write_bot):
    bot = chatrun.load_bot(write_bot("""
        name: quote
        model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
        routes:
          main:
            default: true
            system: Quote prices.
            tools: [quote]
        tools:
          quote:
            description: Quote a price
            parameters: {type: object, properties: {price: {type: number}}, required: [price]}
            action: {emit: {Object: {price: 120, currency: EUR}}, immediate: true}
    """))
    fake.queue(call("quote", price=120))

    async def ask() -> str:
        with ThreadServer(create_app([bot], "memory://")) as server:
            async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
                reply = await client.chat.completions.create(
                    model="quote", messages=[{"role": "user", "content": "price?"}],
                    response_format={"type": "json_object"})
                return reply.choices[0].message.content

    assert json.loads(asyncio.run(ask())) == {"price": 120, "currency": "EUR"}

    # Without response_format a chat client shows the object readably, and a program still gets
    # the data itself in the chatrun field.
    fake.queue(call("quote", price=120))

    async def ask_plainly() -> tuple[str, dict]:
        with ThreadServer(create_app([bot], "memory://")) as server:
            async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
                reply = await client.chat.completions.create(
                    model="quote", messages=[{"role": "user", "content": "price?"}])
                return reply.choices[0].message.content, reply.model_extra["chatrun"]

    text, field = asyncio.run(ask_plainly())
    assert text == "- **Price:** 120\n- **Currency:** EUR"
    assert field["objects"] == [{"price": 120, "currency": "EUR"}]


def test_readable_objects_nest_and_say_yes():
    from chatrun.server.openai_turn import readable

    assert readable({"flight": {"from": "ZRH", "to": "LIS"}, "paid": True, "seats": ["3A", "3B"], "note": None}) == (
        "- **Flight:**\n  - **From:** ZRH\n  - **To:** LIS\n- **Paid:** yes\n- **Seats:**\n  - 3A\n  - 3B\n"
        "- **Note:** —")
    assert readable("plain") == "plain"


def test_thinking_events_only_when_asked_for(client, fake):
    queue_booking(fake)
    reply = say(client, [{"role": "user", "content": "Dublin"}], extra_body={"chatrun": {"events": True}})
    assert [e["type"] for e in info(reply)["events"]] == ["RouteChanged", "Thinking"]
    assert info(reply)["events"][1]["data"] == "Destination set to Dublin"
    assert "Destination set" not in reply.choices[0].message.content


def test_keepalive_comments_on_a_slow_turn(fake, travel, tmp_path):
    fake.queue({"text": "slow answer", "delay": 0.6})
    with serve(travel, tmp_path, keepalive=0.15) as server:
        body = {"model": "travel", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=10) as response:
            lines = list(response.iter_lines())
    assert ": keep-alive" in lines
    deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in lines if line.startswith("data: {")]
    assert "".join(d.get("content") or "" for d in deltas) == "slow answer"
    assert lines.index(": keep-alive") < next(i for i, line in enumerate(lines) if "slow" in line)


# -- sessions: reconciliation ---------------------------------------------------------------------


def test_regenerating_the_last_answer_forks_from_the_turn_before(client, fake):
    queue_booking(fake)
    history = [{"role": "user", "content": "Dublin"}]
    first = say(client, history)
    history += [{"role": "assistant", "content": "When do you leave?"}, {"role": "user", "content": "July 1st"}]
    second = say(client, history)
    assert info(second)["how"] == "continued"
    # Regenerate: the same request again. The session has moved on, so it forks from turn 1.
    fake.queue(call("set_departure", date="2026-07-02"), call("book"))
    again = say(client, history)
    assert info(again)["how"] == "forked"
    assert info(again)["forked_from"] == info(first)["session"] != info(again)["session"]
    assert again.choices[0].message.content == "Your flight to Dublin on 2026-07-02 is booked."
    # The fork started in the flight scope with the reservation as it was after turn 1.
    assert '"destination": "Dublin"' in fake.requests[-2]["messages"][0]["content"]
    # The original session is untouched and can still be continued.
    history += [{"role": "assistant", "content": BOOKED}, {"role": "user", "content": "thanks"}]
    fake.queue({"text": "You're welcome"})
    assert info(say(client, history))["session"] == info(first)["session"]


def test_a_turn_recorded_with_its_state_inline_still_forks(client, fake, tmp_path):
    """Records written before a turn's state had a record of its own hold it inline."""
    import json
    import sqlite3

    fake.queue({"text": "A1"}, {"text": "A2"}, {"text": "A2 again"})
    h = [{"role": "user", "content": "one"}]
    s = info(say(client, h))["session"]
    h += [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "two"}]
    say(client, h)
    with sqlite3.connect(tmp_path / "chat.db") as db:  # turn 1's record, as the older chatrun wrote it
        state_key = f"openai:state:{s}:1"
        (state,) = db.execute("SELECT record FROM records WHERE key = ?", (state_key,)).fetchone()
        rows = db.execute("SELECT key, record FROM records WHERE session = ? AND key LIKE 'openai:prefix:%'", (s,))
        for key, text in list(rows):
            record = json.loads(text)
            if record["turn"] == 1:
                del record["state"]
                db.execute("UPDATE records SET record = ? WHERE key = ?", (json.dumps(record | json.loads(state)), key))
        db.execute("DELETE FROM records WHERE key = ?", (state_key,))
    again = say(client, h)  # regenerate turn 2: forks from turn 1's inline state
    assert info(again)["how"] == "forked" and info(again)["forked_from"] == s and info(again)["turn"] == 2
    sent = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] != "system"]
    assert sent == ["one", "A1", "two"]


def test_editing_an_earlier_message_forks_from_the_common_prefix(client, fake):
    fake.queue({"text": "A1"}, {"text": "A2"}, {"text": "A3"}, {"text": "A2 edited"})
    h = [{"role": "user", "content": "one"}]
    s = info(say(client, h))["session"]
    h += [{"role": "assistant", "content": "A1"}, {"role": "user", "content": "two"}]
    say(client, h)
    h += [{"role": "assistant", "content": "A2"}, {"role": "user", "content": "three"}]
    assert info(say(client, h))["turn"] == 3
    edited = h[:2] + [{"role": "user", "content": "two, edited"}]
    fork = say(client, edited)
    assert info(fork)["how"] == "forked" and info(fork)["forked_from"] == s and info(fork)["turn"] == 2
    # The model saw the prefix (one, A1) and the edited message, not the later turns.
    sent = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] != "system"]
    assert sent == ["one", "A1", "two, edited"]


def test_two_chats_with_the_same_history_stay_apart_by_configured_header(client, fake):
    fake.responder = lambda body: {"text": "echo " + body["messages"][-1]["content"]}
    sessions = {}
    for chat in ("A", "B"):
        h = [{"role": "user", "content": "hi"}]
        first = say(client, h, extra_headers={"X-OpenWebUI-Chat-Id": chat})
        h += [{"role": "assistant", "content": "echo hi"}, {"role": "user", "content": "again"}]
        second = say(client, h, extra_headers={"X-OpenWebUI-Chat-Id": chat})
        assert info(second)["how"] == "continued" and info(second)["session"] == info(first)["session"]
        sessions[chat] = info(first)["session"]
    assert sessions["A"] != sessions["B"]
    # A header that is not configured is not trusted: the second client's identical history forks.
    h = [{"role": "user", "content": "hi"}]
    say(client, h, extra_headers={"X-Unconfigured-Chat-Id": "C"})
    say(client, h, extra_headers={"X-Unconfigured-Chat-Id": "D"})
    h += [{"role": "assistant", "content": "echo hi"}, {"role": "user", "content": "again"}]
    hows = [info(say(client, h, extra_headers={"X-Unconfigured-Chat-Id": c}))["how"] for c in "CD"]
    assert hows == ["continued", "forked"]


def test_unknown_history_starts_a_session_with_it_as_memory_and_explicit_header_wins(client, fake):
    fake.responder = lambda body: {"text": "ok"}
    h = [{"role": "user", "content": "my name is Ana"}, {"role": "assistant", "content": "Hello Ana"},
         {"role": "user", "content": "book me a flight"}]
    reply = say(client, h)
    assert info(reply)["how"] == "new"
    sent = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] != "system"]
    assert sent == ["my name is Ana", "Hello Ana", "book me a flight"]
    # X-Chatrun-Session names the session outright, whatever history the client sends.
    explicit = say(client, [{"role": "user", "content": "x"}], extra_headers={"X-Chatrun-Session": "mine"})
    assert info(explicit)["session"] == "mine" and info(explicit)["how"] == "new"
    later = say(client, [{"role": "user", "content": "y"}], extra_headers={"X-Chatrun-Session": "mine"})
    assert info(later) | {"how": "-"} == info(explicit) | {"how": "-", "turn": 2}


def test_a_deleted_session_is_neither_continued_nor_forked(client, fake, server):
    fake.responder = lambda body: {"text": "ok"}
    h = [{"role": "user", "content": "my secret"}]
    first = client.responses.create(model="travel", input="my secret")
    session = info(say(client, h))["session"]
    assert httpx.delete(f"{server.url}/bots/travel/sessions/{session}").status_code == 204
    h += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    again = say(client, h)
    assert info(again)["how"] == "new" and info(again)["session"] != session
    httpx.delete(f"{server.url}/bots/travel/sessions/{first.model_extra['chatrun']['session']}")
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="travel", input="more", previous_response_id=first.id)


def test_the_index_keeps_a_sessions_last_turns_and_deletes_them_with_it(client, fake, server, tmp_path,
                                                                        monkeypatch):
    import sqlite3

    from chatrun.server import openai_sessions

    monkeypatch.setattr(openai_sessions, "KEEP_TURNS", 2)
    monkeypatch.setattr(openai_sessions, "CHAIN", 1)  # states: 1 full, 2 a delta of 1, 3 full, 4 a delta of 3
    fake.responder = lambda body: {"text": "ok"}
    ids = [client.responses.create(model="travel", input="one").id]
    for text in ("two", "three", "four"):
        ids.append(client.responses.create(model="travel", input=text, previous_response_id=ids[-1]).id)
    with pytest.raises(openai.NotFoundError):  # turn 2 is past the last two: forgotten
        client.responses.create(model="travel", input="again", previous_response_id=ids[1])
    with pytest.raises(openai.NotFoundError):  # nor retrieved: its response went with it
        client.responses.retrieve(ids[1])
    assert client.responses.retrieve(ids[3]).output_text == "ok"
    forked = client.responses.create(model="travel", input="other", previous_response_id=ids[2])
    assert forked.model_extra["chatrun"]["how"] == "forked"
    session = forked.model_extra["chatrun"]["forked_from"]
    with sqlite3.connect(tmp_path / "chat.db") as db:
        def records_of(sid):
            return db.execute("SELECT count(*) FROM records WHERE session = ?", (sid,)).fetchone()[0]
        kept = records_of(session)
        assert 0 < kept <= 2 * 3 + 1  # two turns' keys (response id, prefix), their states, the list of turns
        states = {k for (k,) in db.execute("SELECT key FROM records WHERE session = ? AND key LIKE 'openai:state:%'",
                                            (session,))}
        # Turn 4's state is a delta of turn 3's; turns 1 and 2's states went with their turns.
        assert states == {f"openai:state:{session}:3", f"openai:state:{session}:4"}
        assert httpx.delete(f"{server.url}/bots/travel/sessions/{session}").status_code == 204
        assert records_of(session) == 0
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="travel", input="again", previous_response_id=ids[3])


def test_the_kept_turns_stay_right_when_the_live_session_is_let_go_between_turns(fake, travel, tmp_path, monkeypatch):
    """The index keeps a live session's list of kept turns to write the next turn's without
    reading it back; a session loaded afresh (evicted, or after another replica's turn) reads
    the list from the store: either way only the last KEEP_TURNS turns match, their records kept."""
    import sqlite3

    from chatrun.server import openai_sessions

    monkeypatch.setattr(openai_sessions, "KEEP_TURNS", 2)
    fake.responder = lambda body: {"text": "ok"}
    app = create_app([travel], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, openai.OpenAI(base_url=server.url + "/v1", api_key="-", max_retries=0) as client:
        ids = [client.responses.create(model="travel", input="one").id]
        for n, text in enumerate(("two", "three", "four", "five", "six")):
            if n % 2:  # the registry lets the live session go: the next request loads it afresh
                cache = app.state.registry.cache
                for slot in list(cache._slots.values()):
                    cache.drop(slot)
            ids.append(client.responses.create(model="travel", input=text, previous_response_id=ids[-1]).id)
        for forgotten in ids[:-2]:
            with pytest.raises(openai.NotFoundError):
                client.responses.create(model="travel", input="again", previous_response_id=forgotten)
        with sqlite3.connect(tmp_path / "chat.db") as db:
            (sid, text), = db.execute("SELECT session, record FROM records WHERE key LIKE 'openai:turns:%'")
            assert [turn for turn, _ in json.loads(text)["turns"]] == [5, 6]
            prefix_or_response = db.execute("SELECT count(*) FROM records WHERE session = ? AND "
                                            "(key LIKE 'openai:prefix:%' OR key LIKE 'openai:response:%')", (sid,))
            assert prefix_or_response.fetchone()[0] == 2  # turns 5 and 6's response ids (continued: no prefix key)


def test_every_kept_turn_forks_with_its_conversation_whole_across_delta_states(client, fake, monkeypatch):
    """A turn's state is written as a delta of the turn before's (a full one every CHAIN turns):
    a fork of any kept turn gets the conversation exactly as it was right after that turn."""
    from chatrun.server import openai_sessions

    monkeypatch.setattr(openai_sessions, "CHAIN", 3)  # full states at turns 1, 5; deltas between
    fake.responder = lambda body: {"text": "A" + [m for m in body["messages"] if m["role"] == "user"][-1]["content"]}
    ids = [client.responses.create(model="travel", input="u1").id]
    for n in range(2, 8):
        ids.append(client.responses.create(model="travel", input=f"u{n}", previous_response_id=ids[-1]).id)
    for turn in range(1, 7):  # turn 7 is the session's last: a continuation, not a fork
        forked = client.responses.create(model="travel", input="fork", previous_response_id=ids[turn - 1])
        assert forked.model_extra["chatrun"]["how"] == "forked"
        sent = [m["content"] for m in fake.requests[-1]["messages"] if m["role"] != "system"]
        assert sent == [text for n in range(1, turn + 1) for text in (f"u{n}", f"Au{n}")] + ["fork"]


# -- responses -----------------------------------------------------------------------------------


def test_a_whole_booking_through_responses_with_previous_response_id(client, fake):
    queue_booking(fake)
    first = client.responses.create(model="travel", input="I want to fly to Dublin")
    assert first.output_text == "When do you leave?" and first.status == "completed"
    assert first.usage.total_tokens == 39
    second = client.responses.create(model="travel", input="July 1st", previous_response_id=first.id)
    assert second.output_text == BOOKED
    assert second.model_extra["chatrun"]["session"] == first.model_extra["chatrun"]["session"]
    assert second.model_extra["chatrun"]["stack"] == ["main_menu"]
    # Answering the first response again forks from it (the session has moved on).
    fake.queue(call("set_departure", date="2026-08-01"), call("book"))
    other = client.responses.create(model="travel", input="August 1st", previous_response_id=first.id)
    assert other.output_text == "Your flight to Dublin on 2026-08-01 is booked."
    assert other.model_extra["chatrun"]["how"] == "forked"


def test_raw_responses_conform_to_the_sdk_types_strictly(fake, server):
    fake.queue({"text": "Hi"}, {"chunks": ["Hel", "lo"]})
    body = {"model": "travel", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}]}
    plain = httpx.post(server.url + "/v1/responses", json=body).json()
    assert Response.model_validate(plain, strict=True).output_text == "Hi"
    with httpx.stream("POST", server.url + "/v1/responses", json=body | {"stream": True,
                      "previous_response_id": plain["id"]}) as response:
        data = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    adapter = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_python(d, strict=True) for d in data]
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == "Hello"


def test_async_streaming_responses_and_conversation_ids(server, fake):
    queue_booking(fake, chunks=True)

    async def book() -> tuple[list[str], str, str]:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
            deltas = []
            stream = await client.responses.create(model="travel", input="Dublin", conversation="trip-1", stream=True)
            async for event in stream:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
            second = await client.responses.create(model="travel", input="July 1st", conversation="trip-1")
            return deltas, second.output_text, second.model_extra["chatrun"]["session"]

    deltas, booked, session = asyncio.run(book())
    assert deltas == ["When do ", "you leave?"]
    assert booked == BOOKED and session == "trip-1"


def test_response_ids_survive_a_restart(fake, travel, tmp_path):
    queue_booking(fake)
    with serve(travel, tmp_path) as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
            first = client.responses.create(model="travel", input="Dublin")
    with serve(travel, tmp_path) as server:
        with openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
            second = client.responses.create(model="travel", input="July 1st", previous_response_id=first.id)
    assert second.output_text == BOOKED


def test_a_turn_is_committed_to_the_store_before_its_answer(client, fake, tmp_path):
    from chatrun.store.sqlite import SQLiteStore

    fake.queue({"text": "Hello!"})
    first = say(client, [{"role": "user", "content": "hi"}])
    session = info(first)["session"]
    # Read the file with a store of its own while the server still runs: the turn is there.
    with SQLiteStore(tmp_path / "chat.db") as store:
        history = store.load_history(session)
        assert [(e["turn"], e["ok"], e["input"]) for e in history] == [(1, True, "hi")]
        assert store.load_session(session)["committed"]["turn"] == 1


def test_replicas_on_redis_share_the_sessions_and_the_index_of_turns(fake, travel, redis_server):
    queue_booking(fake)
    url = redis_server.url()  # one key prefix shared by both replicas

    def replica():
        return ThreadServer(create_app([travel], url,
                                       openai=OpenAIOptions(session_headers=("X-OpenWebUI-Chat-Id",))))
    with replica() as one, replica() as two:
        with openai.OpenAI(base_url=one.url + "/v1", api_key="x", max_retries=0) as a:
            first = a.responses.create(model="travel", input="Dublin")
        with openai.OpenAI(base_url=two.url + "/v1", api_key="x", max_retries=0) as b:
            second = b.responses.create(model="travel", input="July 1st", previous_response_id=first.id)
            assert b.responses.retrieve(first.id).model_dump() == first.model_dump()  # made on the other replica
    assert second.output_text == BOOKED
    assert second.model_extra["chatrun"]["how"] == "continued"
    assert second.model_extra["chatrun"]["session"] == first.model_extra["chatrun"]["session"]


# -- errors and auth ------------------------------------------------------------------------------


def test_errors_have_openai_shape_so_the_sdk_raises_its_own_exceptions(client, fake):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert exc.value.code == "model_not_found" and "travel" in exc.value.message
    with pytest.raises(openai.BadRequestError, match="last message of messages must be the user's"):
        client.chat.completions.create(model="travel", messages=[{"role": "assistant", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="role 'tool' is not supported"):
        client.chat.completions.create(model="travel", messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}])
    with pytest.raises(openai.NotFoundError, match="previous_response_id"):
        client.responses.create(model="travel", input="hi", previous_response_id="resp_unknown")
    with pytest.raises(openai.NotFoundError, match="no response 'resp_123' for this caller") as never:
        client.responses.retrieve("resp_123")
    assert never.value.code == "response_not_found" and never.value.param == "id"
    with pytest.raises(openai.NotFoundError, match="not part of chatrun's OpenAI API"):
        client.responses.delete("resp_123")
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="travel", input="hi")
    assert unknown.value.body["code"] == "unknown_url"
    with pytest.raises(openai.BadRequestError, match=r"messages: \[\] should be non-empty") as empty:
        client.chat.completions.create(model="travel", messages=[])
    assert empty.value.code == "invalid_request"
    # Bodies are checked against the schema /openapi.json shows: a wrong shape is a 400 naming its place.
    wrong = httpx.post(f"{client.base_url}chat/completions", json={
        "model": "travel", "messages": [{"role": "user", "content": "hi"}], "response_format": "json"})
    assert wrong.status_code == 400
    assert wrong.json()["error"]["message"] == "response_format: 'json' is not of type 'object', 'null'"
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]\.content: 7 is not valid"):
        client.responses.create(model="travel", input=[{"role": "user", "content": 7}])
    fake.queue({"status": 500, "body": "upstream down"})
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="travel", messages=[{"role": "user", "content": "hi"}])
    assert failed.value.code == "turn_failed"


@pytest.mark.slow
def test_a_model_with_an_empty_route_is_no_served_model(client, fake):
    # "travel/" ran a turn of travel (the empty route read as none); GET /v1/models lists no such model.
    for model in ("travel/", "/travel", "travel//flight"):
        with pytest.raises(openai.NotFoundError) as exc:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        assert exc.value.code == "model_not_found" and repr(model) in exc.value.message
    assert fake.requests == []


@pytest.mark.slow
def test_an_idempotency_key_sent_again_with_another_request_is_a_422(client, fake):
    # It replayed the first request's answer: a key reused by mistake answered another question.
    fake.queue({"text": "Hello!"})
    key = {"Idempotency-Key": "order-4711"}
    first = say(client, [{"role": "user", "content": "hi"}], extra_headers=key)
    for messages in ([{"role": "user", "content": "book me to Oslo"}],
                     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"},
                      {"role": "user", "content": "hi"}]):
        for stream in (False, True):
            with pytest.raises(openai.UnprocessableEntityError) as reused:
                say(client, messages, extra_headers=key, stream=stream)
            assert reused.value.code == "idempotency_key_reused" and "'order-4711'" in reused.value.message
    again = say(client, [{"role": "user", "content": "hi"}], extra_headers=key)
    assert again.choices[0].message.content == first.choices[0].message.content == "Hello!"
    assert info(again)["how"] == "replayed" and len(fake.requests) == 1


@pytest.mark.slow
def test_a_malformed_session_id_is_refused_naming_where_it_came_from(client, fake):
    # The message read "the session id must be no '/'": not which of the request's fields it was.
    with pytest.raises(openai.BadRequestError, match=r"X-Chatrun-Session header.*no '/'"):
        say(client, [{"role": "user", "content": "hi"}], extra_headers={"X-Chatrun-Session": "a/b"})
    with pytest.raises(openai.BadRequestError, match=r"Responses conversation\) needs to be at most 128"):
        client.responses.create(model="travel", input="hi", conversation="x" * 129)
    assert fake.requests == []


@pytest.mark.slow
def test_a_response_is_retrieved_as_it_was_answered_by_its_caller_alone(fake, travel, tmp_path):
    """GET /v1/responses/{id} was not served (the SDK's responses.retrieve got a 404): now each
    response the index keeps is answered as its request was, and only to the caller that made it."""
    queue_booking(fake, chunks=True)
    fake.queue({"text": "Anything else?", "usage": USAGE})
    auth = Auth.from_mapping({"tokens": {"s3cret-ana": "ana", "s3cret-bob": "bob"}})
    with serve(travel, tmp_path, auth=auth) as server:
        url = server.url + "/v1"
        with openai.OpenAI(base_url=url, api_key="s3cret-ana", max_retries=0) as ana, \
                openai.OpenAI(base_url=url, api_key="s3cret-bob", max_retries=0) as bob:
            events = list(ana.responses.create(model="travel", input="Dublin", stream=True))
            streamed = events[-1].response  # response.completed
            second = ana.responses.create(model="travel", input="July 1st", previous_response_id=streamed.id)
            third = ana.responses.create(model="travel", input="thanks", previous_response_id=second.id,
                                         extra_body={"chatrun": {"events": True}})
            for answered in (streamed, second, third):
                kept = ana.responses.retrieve(answered.id)
                assert kept.model_dump() == answered.model_dump()
            assert second.output_text == BOOKED and kept.output_text == "Anything else?"
            assert (ana.responses.retrieve(second.id).previous_response_id, kept.previous_response_id) == \
                (streamed.id, second.id)
            assert streamed.status == "completed" and streamed.output_text == "When do you leave?"
            assert kept.usage.total_tokens == 13 and kept.model_extra["chatrun"]["turn"] == 3
            raw = httpx.get(f"{url}/responses/{second.id}", headers={"Authorization": "Bearer s3cret-ana"}).json()
            Response.model_validate(raw, strict=True)
            # Someone else's response is no response to bob: 404 naming `id`, the reply never shown.
            with pytest.raises(openai.NotFoundError) as refused:
                bob.responses.retrieve(second.id)
            assert refused.value.code == "response_not_found" and refused.value.param == "id"
            assert BOOKED not in refused.value.response.text
            with openai.OpenAI(base_url=url, api_key="wrong", max_retries=0) as nobody:
                with pytest.raises(openai.AuthenticationError):
                    nobody.responses.retrieve(second.id)
            with pytest.raises(openai.BadRequestError) as streaming:
                ana.responses.retrieve(second.id, stream=True)
            assert streaming.value.param == "stream"
            # A deleted conversation's responses are gone with it.
            session = second.model_extra["chatrun"]["session"]
            assert httpx.delete(f"{server.url}/bots/travel/sessions/{session}",
                                headers={"Authorization": "Bearer s3cret-ana"}).status_code == 204
            with pytest.raises(openai.NotFoundError, match="for this caller"):
                ana.responses.retrieve(second.id)


@pytest.mark.slow
def test_a_body_the_schema_refuses_names_the_field_at_fault_in_param(client, server):
    """`param` was null: a client learnt where its body was wrong only by reading the message."""
    h = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    refused = {
        "messages[2].content": lambda: say(client, [*h, {"role": "user", "content": 7}]),
        "messages[1].role": lambda: say(client, [h[0], {"content": "no role"}, h[0]]),
        "n": lambda: say(client, [h[0]], n=2),
        "response_format.type": lambda: say(client, [h[0]], response_format={"type": "xml"}),
        "model": lambda: client.chat.completions.create(messages=[h[0]], model=openai.NOT_GIVEN),
        "input[1]": lambda: client.responses.create(model="travel", input=["hi", 5]),
        "previous_response_id": lambda: client.responses.create(model="travel", input="hi", previous_response_id=""),
        "conversation.id": lambda: client.responses.create(model="travel", input="hi", extra_body={"conversation": {}}),
    }
    for param, send in refused.items():
        with pytest.raises(openai.BadRequestError) as exc:
            send()
        assert exc.value.param == param, exc.value.body
        assert exc.value.body["param"] == param and exc.value.code == "invalid_request"
    # So do the refusals the handlers make of what the schema lets through.
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}}
    handled = {
        "messages[0].role": (openai.BadRequestError, lambda: say(client, [{"role": "tool", "content": "x"}, h[0]])),
        "messages": (openai.BadRequestError, lambda: say(client, h)),
        "messages[0].content[1].input_audio.format": (
            openai.BadRequestError, lambda: say(client, [{"role": "user", "content": [{"type": "text", "text": "hi"}, audio]}])),
        "messages[0].content[0].type": (
            openai.BadRequestError, lambda: say(client, [{"role": "user", "content": [{"type": "video"}]}])),
        "input[0].type": (openai.BadRequestError, lambda: client.responses.create(
            model="travel", input=[{"type": "function_call", "role": "user", "content": "x"}])),
        "model": (openai.NotFoundError, lambda: client.chat.completions.create(model="nope", messages=[h[0]])),
        "previous_response_id": (openai.NotFoundError, lambda: client.responses.create(
            model="travel", input="hi", previous_response_id="resp_unknown")),
    }
    for param, (error, send) in handled.items():
        with pytest.raises(error) as exc:
            send()
        assert exc.value.param == param, exc.value.body
    # Streamed, the same 400 before any event.
    with httpx.stream("POST", server.url + "/v1/chat/completions",
                      json={"model": "travel", "messages": [*h, {"role": "user", "content": 7}], "stream": True}) as answer:
        answer.read()
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "messages[2].content"


@pytest.mark.slow
def test_every_method_the_v1_api_does_not_serve_is_answered_in_openai_shape(client):
    # OPTIONS got the HTTP API's {"error": "MethodNotAllowed", ...}, no OpenAI error object.
    base = str(client.base_url).rstrip("/")
    for method in ("GET", "PUT", "DELETE", "OPTIONS"):
        answer = httpx.request(method, f"{base}/chat/completions")
        assert answer.status_code == 404, (method, answer.text)
        assert answer.json()["error"]["code"] == "unknown_url", (method, answer.text)


def test_failed_turn_while_streaming_raises_in_the_sdk(client, fake):
    fake.queue({"status": 500, "body": "upstream down"})
    stream = client.chat.completions.create(model="travel", messages=[{"role": "user", "content": "hi"}], stream=True)
    with pytest.raises(openai.APIError, match="the assistant cannot answer right now"):
        list(stream)


def test_same_tokens_and_ownership_as_the_rest_of_the_server(fake, travel, tmp_path):
    auth = Auth.from_mapping({"tokens": {"s3cret-ana": "ana", "s3cret-bob": "bob"}})
    fake.responder = lambda body: {"text": "ok"}
    with serve(travel, tmp_path, auth=auth) as server:
        url = server.url + "/v1"
        with openai.OpenAI(base_url=url, api_key="wrong-token", max_retries=0) as anon:
            with pytest.raises(openai.AuthenticationError):
                anon.models.list()
            # The turn's route (served without FastAPI's handler: ChatCompletionsRoute) refuses alike.
            with pytest.raises(openai.AuthenticationError) as refused:
                anon.chat.completions.create(model="travel", messages=[{"role": "user", "content": "hi"}])
            assert refused.value.code == "invalid_api_key" and refused.value.response.headers["www-authenticate"] == "Bearer"
        with openai.OpenAI(base_url=url, api_key="s3cret-ana", max_retries=0) as ana, \
                openai.OpenAI(base_url=url, api_key="s3cret-bob", max_retries=0) as bob:
            mine = ana.responses.create(model="travel", input="hi", conversation="ana-trip")
            with pytest.raises(openai.NotFoundError):  # bob cannot continue ana's response
                bob.responses.create(model="travel", input="hi", previous_response_id=mine.id)
            with pytest.raises(openai.NotFoundError):  # nor her session by name (404: no existence oracle)
                bob.responses.create(model="travel", input="hi", conversation="ana-trip")
            with pytest.raises(openai.NotFoundError):  # streaming too: before any event
                bob.chat.completions.create(model="travel", messages=[{"role": "user", "content": "hi"}],
                                            stream=True, extra_headers={"X-Chatrun-Session": "ana-trip"})
            # The same history from bob never reaches ana's session.
            h = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                 {"role": "user", "content": "more"}]
            bobs = bob.chat.completions.create(model="travel", messages=h)
            assert bobs.model_extra["chatrun"]["how"] == "new"
            with pytest.raises(openai.PermissionDeniedError):  # the lounge needs the staff role
                bob.chat.completions.create(model="travel/lounge", messages=[{"role": "user", "content": "hi"}])


# -- a front end's background tasks ------------------------------------------------------------------

# Open WebUI's default title prompt (v0.6), as it sends it: one user message quoting the chat.
TITLE_TASK = """### Task:
Generate a concise, 3-5 word title with an emoji summarizing the chat history.
### Guidelines:
- The title should clearly represent the main theme or subject of the conversation.
### Output:
JSON format: { "title": "your concise title here" }
### Chat History:
<chat_history>
USER: I want to fly to Dublin next July with my sister
ASSISTANT: When do you leave?
</chat_history>"""
FOLLOW_UP_TASK = """### Task:
Suggest 3-5 relevant follow-up questions or prompts that the user might naturally ask next.
### Output:
JSON format: { "follow_ups": ["Question 1?", "Question 2?", "Question 3?"] }
### Chat History:
<chat_history>
USER: hi
</chat_history>"""


def test_open_webui_tasks_are_answered_without_running_the_bot(client, fake, server):
    title = say(client, [{"role": "user", "content": TITLE_TASK}])
    assert json.loads(title.choices[0].message.content) == {"title": "I want to fly to …"}
    assert info(title) == {"front_end_task": True}
    chunks = list(say(client, [{"role": "user", "content": FOLLOW_UP_TASK}], stream=True))
    TypeAdapter(list[ChatCompletionChunk]).validate_python([c.model_dump() for c in chunks])
    assert json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)) == {"follow_ups": []}
    assert fake.requests == []  # no model was called


def test_open_webui_tasks_can_be_run_as_turns_or_refused(fake, travel, tmp_path):
    with serve(travel, tmp_path, front_end_tasks="refuse") as s, \
            openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0) as c:
        with pytest.raises(openai.BadRequestError) as refused:
            say(c, [{"role": "user", "content": TITLE_TASK}])
    assert refused.value.code == "front_end_task" and fake.requests == []
    fake.queue({"text": '{"title": "Flight to Dublin"}'})
    with serve(travel, tmp_path, front_end_tasks="run") as s, \
            openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0) as c:
        ran = say(c, [{"role": "user", "content": TITLE_TASK}])
    assert ran.choices[0].message.content == '{"title": "Flight to Dublin"}' and info(ran)["how"] == "new"


QUOTE_THEN_TEXT = """
    name: quote
    model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
    routes:
      main:
        default: true
        system: Quote prices.
        tools: [quote]
    tools:
      quote:
        description: Quote a price
        parameters: {type: object, properties: {price: {type: number}}, required: [price]}
        action: {emit: {Object: "{{ {'price': args.price, 'currency': 'EUR', 'refundable': false} }}"}}
"""
QUOTED = "- **Price:** 120\n- **Currency:** EUR\n- **Refundable:** no"


@pytest.mark.slow
def test_an_object_then_reply_text_keeps_the_text_the_reply_and_the_data_in_chatrun(fake, tmp_path, write_bot):
    bot = chatrun.load_bot(write_bot(QUOTE_THEN_TEXT))
    question = [{"role": "user", "content": "price?"}]
    with ThreadServer(create_app([bot], "memory://")) as server, \
            openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
        fake.queue(call("quote", price=120), {"text": "That is our best price."})
        reply = client.chat.completions.create(model="quote", messages=question)
        content = reply.choices[0].message.content
        # The object as a person reads it, then the model's reply, whole and last; no JSON.
        assert content == QUOTED + "\n\n" + "That is our best price."
        assert "{" not in content
        assert reply.model_extra["chatrun"]["objects"] == [{"price": 120, "currency": "EUR", "refundable": False}]

        # Streamed: the same text in the deltas, the objects in the last chunk (finish_reason stop).
        fake.queue(call("quote", price=95), {"chunks": ["Best ", "price."]})
        chunks = list(client.chat.completions.create(model="quote", messages=question, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == QUOTED.replace("120", "95") + "\n\nBest price."
        last = [c for c in chunks if c.choices][-1]
        assert last.choices[0].finish_reason == "stop"
        assert last.model_extra["chatrun"]["objects"] == [{"price": 95, "currency": "EUR", "refundable": False}]
        assert all("chatrun" not in (c.model_extra or {}) for c in chunks if c.choices and c is not last)

        # A program that asks for JSON gets the object as the reply, not the text.
        fake.queue(call("quote", price=80), {"text": "Cheap."})
        as_json = client.chat.completions.create(model="quote", messages=question,
                                                 response_format={"type": "json_object"})
        assert json.loads(as_json.choices[0].message.content) == {"price": 80, "currency": "EUR", "refundable": False}


def test_citations_span_each_ref_in_the_whole_reply_and_a_source_without_a_link_is_no_url_citation():
    from chatrun import events as ev
    from chatrun.server.openai_api import _chat_annotations, _response_annotations
    from chatrun.server.openai_turn import Reply

    reply = Reply()
    for event in (ev.Event(ev.MESSAGE, "Hello."), ev.Event(ev.STREAM, "See [a.md#x] "), ev.Event(ev.STREAM, "and [b.md]."),
                  ev.Event(ev.MESSAGE, "See [a.md#x] and [b.md]."),
                  ev.Event(ev.SOURCES, {"sources": [{"title": "A", "ref": "a.md#x", "source": "s", "url": "https://a/x"},
                                                    {"title": "B", "ref": "b.md", "source": "t"}]})):
        reply.feed(event)
    completion = ChatCompletion.model_validate({  # OpenAI's own type reads them
        "id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": reply.text, "annotations": _chat_annotations(reply)}}],
    })
    [chat] = completion.choices[0].message.annotations or []
    assert reply.text[chat.url_citation.start_index:chat.url_citation.end_index] == "[a.md#x]"
    assert (chat.url_citation.title, chat.url_citation.url) == ("A", "https://a/x")
    assert _response_annotations(reply) == [{"type": "url_citation", "url": "https://a/x", "title": "A",
                                             "start_index": 12, "end_index": 20}]
    assert [s["ref"] for s in reply.sources] == ["a.md#x", "b.md"]  # both in `chatrun.sources`


def test_a_user_message_over_the_limit_is_413_naming_its_field(fake, travel, tmp_path):
    """The 413 of a message over `max_message_chars` names the field (before: `param: null`, and
    the message spoke of a `userMessage` no /v1 request has): the last user message's
    `messages[N].content` (N counts every message, a system one too; a conversation resent after a
    turn too), `input` for a string input, `input[N].content` for a list."""
    from chatrun.server.wire import ServerLimits

    fake.responder = lambda body: {"text": "Hello."}
    app = create_app([travel], f"sqlite:///{tmp_path / 'chat.db'}", limits=ServerLimits(max_message_chars=40))
    long = "x" * 41
    with ThreadServer(app) as server, openai.OpenAI(base_url=server.url + "/v1", api_key="unused",
                                                    max_retries=0) as client:
        first = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello."},
                 {"role": "user", "content": "and?"}]
        answer = client.chat.completions.create(model="travel", messages=first).choices[0].message.content
        refused = [
            (lambda: client.chat.completions.create(model="travel", messages=[
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": long}]), "messages[1].content"),
            (lambda: client.chat.completions.create(  # the resent conversation, read from its known prefix
                model="travel", messages=[*first, {"role": "assistant", "content": answer},
                                          {"role": "user", "content": long}]), "messages[4].content"),
            (lambda: client.responses.create(model="travel", input=long), "input"),
            (lambda: client.responses.create(model="travel", input=[{"role": "user", "content": "hi"},
                                                                    {"role": "user", "content": long}]),
             "input[1].content"),
        ]
        for send, field in refused:
            with pytest.raises(openai.APIStatusError) as caught:
                send()
            assert caught.value.status_code == 413
            error = caught.value.body
            assert (error["code"], error["param"]) == ("too_large", field), error
            assert error["message"] == f"{field} of 41 characters is over the limit of 40 (--max-message-chars): send a shorter one"


@pytest.mark.slow
def test_an_earlier_user_message_over_the_limit_is_413_too_and_reaches_no_model(fake, travel, tmp_path):
    """`max_message_chars` holds for every user message of a list, not the last one only: the
    earlier ones of a conversation chatrun does not know are put into the new session's memory,
    so a client put a message of any length before a short last one and the model read it (a
    door around the limit every other door keeps). An earlier assistant message is not the
    user's: it passes. The field is named as for the last message."""
    from chatrun.server.wire import ServerLimits

    fake.responder = lambda body: {"text": "Hello."}
    app = create_app([travel], f"sqlite:///{tmp_path / 'chat.db'}", limits=ServerLimits(max_message_chars=40))
    long = "x" * 41
    with ThreadServer(app) as server, openai.OpenAI(base_url=server.url + "/v1", api_key="unused",
                                                    max_retries=0) as client:
        first = [{"role": "user", "content": "hi"}]
        answer = client.chat.completions.create(model="travel", messages=first).choices[0].message.content
        asked = len(fake.requests)
        refused = [
            (lambda: client.chat.completions.create(model="travel", messages=[
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": long},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "and?"}]),
             "messages[1].content"),
            (lambda: client.chat.completions.create(  # the resent conversation, read from its known prefix
                model="travel", messages=[*first, {"role": "assistant", "content": answer},
                                          {"role": "user", "content": long}, {"role": "assistant", "content": "Hm."},
                                          {"role": "user", "content": "and?"}]), "messages[2].content"),
            (lambda: client.responses.create(model="travel", input=[{"role": "user", "content": long},
                                                                    {"role": "user", "content": "and?"}]),
             "input[0].content"),
        ]
        for send, field in refused:
            with pytest.raises(openai.APIStatusError) as caught:
                send()
            assert caught.value.status_code == 413
            error = caught.value.body
            assert (error["code"], error["param"]) == ("too_large", field), error
            assert error["message"] == f"{field} of 41 characters is over the limit of 40 (--max-message-chars): send a shorter one"
        assert len(fake.requests) == asked  # no model read it
        said = client.chat.completions.create(model="travel", messages=[
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": long}, {"role": "user", "content": "ok"}])
        assert said.choices[0].message.content == "Hello."
        assert long in [m.get("content") for m in fake.requests[-1]["messages"]]
