"""Clients receive only their audience's events, and the end of a conversation is first-class.

One survey bot emits, in one turn, an event for the user (`Rated`), one for operators
(`Handoff`) and one for the backend (`Detractor`). Every user-facing client — the WebSocket in
both dialects, the HTTP reply and SSE, /v1 through the real openai client — gets the user's
event only; the inspector and the history show all three, each with its audience. Transcripts
expect the user's events under `events:` and the others under `operators_events:` and
`backend_events:`. The web page is tested in tests/test_browser_audiences.py.
"""

from __future__ import annotations

import functools
import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import openai
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

import chatrun
from chatrun import events as ev
from chatrun.cli import test as cli_test_module
from chatrun.server import create_app
from chatrun.server.auth import Auth
from chatrun.transcripts import run_transcript
from server_support import ThreadServer, app_for_testclient, call, until_done

SURVEY = """
name: survey
description: Asks for a score.
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
events:
  Detractor: {audience: backend, description: a score of 6 or less}
  Handoff: {audience: operators, description: someone should call the customer back}
routes:
  main:
    default: true
    system: Ask the customer for a score from 0 to 10.
    tools: [rate, bye]
tools:
  rate:
    description: Record the customer's score
    parameters: {type: object, properties: {score: {type: integer}}, required: [score]}
    action:
      emit:
        Rated: "{{ args.score }}"
        Detractor: "{{ {'score': args.score} }}"
        Handoff: "score {{ args.score }}: call the customer back"
      message: Thanks for your score!
      immediate: true
  bye:
    description: End the chat
    action: {end: true, message: Goodbye!}
"""

USER_EVENTS = [{"type": "Rated", "data": 2}, {"type": "Message", "data": "Thanks for your score!"}]


def write_survey(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "bot.yaml"
    path.write_text(textwrap.dedent(SURVEY))
    return path


@pytest.fixture
def survey(tmp_path):
    return chatrun.load_bot(write_survey(tmp_path / "survey"))


def plain(frames: list[dict]) -> list[dict]:
    """The events of WebSocket frames as {type, data}, Stream chunks and Completed left out."""
    return [{"type": f["type"], "data": f["data"]} for f in frames if f["type"] not in ("Stream", "Completed")]


def types_of(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


# -- the WebSocket, both dialects --------------------------------------------------------------


def test_both_websocket_dialects_get_only_the_users_event(survey, fake):
    fake.queue(call("rate", score=2), call("rate", score=2))
    app = app_for_testclient([survey], "memory://")
    with TestClient(app) as client, client.websocket_connect("/_chat/routes") as ws:
        for chat, extended in (("quarkus", False), ("extended", True)):
            ws.send_json({"type": "Connect", "chatId": chat, **({"extensions": True} if extended else {})})
            until_done(ws)
            ws.send_json({"type": "ChatRouteMessage", "chatId": chat, "data": {"userMessage": "2"}})
            frames = until_done(ws)
            assert frames[-1]["type"] == "Completed"
            assert plain(frames) == USER_EVENTS, chat
        # The history has all three, each with its audience (the inspector, auth off: the author's).
        entry = client.get("/bots/survey/sessions/extended/inspect").json()["last_turn"]
        assert [(e["type"], e.get("audience", "user")) for e in entry["events"]] == [
            ("Rated", "user"), ("Detractor", "backend"), ("Handoff", "operators"), ("Message", "user")]


# -- HTTP: the JSON reply, SSE, a replay, the session resource ------------------------------------


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


def test_the_http_reply_sse_and_a_replay_get_only_the_users_event(survey, fake):
    fake.queue(call("rate", score=2), call("rate", score=2))
    app = app_for_testclient([survey], "memory://")
    with TestClient(app) as client:
        client.post("/bots/survey/sessions", json={"id": "h1"})
        reply = client.post("/bots/survey/sessions/h1/messages", json={"userMessage": "2"},
                            headers={"Idempotency-Key": "k1"}).json()
        assert [{"type": e["type"], "data": e["data"]} for e in reply["events"]] == USER_EVENTS
        again = client.post("/bots/survey/sessions/h1/messages", json={"userMessage": "2"},
                            headers={"Idempotency-Key": "k1"}).json()
        assert again["replayed"] is True and again["events"] == reply["events"]
        streamed = client.post("/bots/survey/sessions/h1/messages?stream=true", json={"userMessage": "2"})
        events = sse_events(streamed.text)
        assert types_of(events) == ["Rated", "Message", "Completed"]
        # The session resource is what the user's page replays: the user's events only.
        history = client.get("/bots/survey/sessions/h1").json()["history"]
        assert [types_of(entry["events"]) for entry in history] == [["Rated", "Message"], ["Rated", "Message"]]


AUTH = {"tokens": {"customer-token": {"principal": "cara"},
                   "operator-token": {"principal": "otto", "roles": ["operators"]}}}


def test_the_session_resource_and_inspector_show_other_audiences_only_to_operators(survey, fake):
    fake.queue(call("rate", score=2), call("rate", score=2))
    app = app_for_testclient([survey], "memory://", auth=Auth.from_mapping(AUTH))
    with TestClient(app) as client:
        seen = {}
        for token in ("customer-token", "operator-token"):
            headers = {"Authorization": f"Bearer {token}"}
            client.post("/bots/survey/sessions", json={"id": token}, headers=headers)
            turn = client.post(f"/bots/survey/sessions/{token}/messages", json={"userMessage": "2"}, headers=headers)
            assert types_of(turn.json()["events"]) == ["Rated", "Message"]  # a chat, even an operator's
            resource = client.get(f"/bots/survey/sessions/{token}", headers=headers).json()
            inspected = client.get(f"/bots/survey/sessions/{token}/inspect", headers=headers).json()
            seen[token] = (types_of(resource["history"][0]["events"]), types_of(inspected["last_turn"]["events"]))
    assert seen["customer-token"] == (["Rated", "Message"], ["Rated", "Message"])
    assert seen["operator-token"] == (["Rated", "Handoff", "Message"], ["Rated", "Detractor", "Handoff", "Message"])


# -- /v1 through the real openai client ----------------------------------------------------------


@pytest.fixture
def v1(survey, fake, tmp_path):
    app = create_app([survey], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, openai.OpenAI(base_url=server.url + "/v1", api_key="unused",
                                                     max_retries=0) as client:
        yield client


def test_v1_replies_with_the_users_events_only(v1, fake):
    fake.queue(call("rate", score=2))
    reply = v1.chat.completions.create(model="survey", messages=[{"role": "user", "content": "2"}],
                                       extra_body={"chatrun": {"events": True}})
    # Rated is a custom type: listed in chatrun.events; the others reach no client.
    assert reply.choices[0].message.content == "Thanks for your score!"
    assert types_of(reply.model_extra["chatrun"]["events"]) == ["Rated"]


def test_v1_says_a_conversation_ended_and_refuses_later_messages(v1, fake):
    fake.queue(call("bye"))
    first = v1.chat.completions.create(model="survey", messages=[{"role": "user", "content": "bye"}],
                                       extra_headers={"X-Chatrun-Session": "v1-ended"})
    assert first.choices[0].message.content == "Goodbye!"
    assert first.model_extra["chatrun"]["ended"] == {"route": "main", "tool": "bye"}
    later = [{"role": "user", "content": "bye"}, {"role": "assistant", "content": "Goodbye!"},
             {"role": "user", "content": "wait, one more thing"}]
    for stream in (False, True):  # the same error, before any stream starts
        with pytest.raises(openai.ConflictError) as refused:
            v1.chat.completions.create(model="survey", messages=later, stream=stream)
        assert refused.value.code == "conversation_ended"
        assert "this conversation has ended (tool bye ended it on route main)" in refused.value.message
    with pytest.raises(openai.ConflictError):  # by its session id too, and in the Responses API
        v1.responses.create(model="survey", input="hello?", extra_body={"conversation": "v1-ended"})
    assert len(fake.requests) == 1  # nothing ran for the refused messages


# -- transcripts -----------------------------------------------------------------------------------


def transcript(tmp_path: Path, expect: str) -> Path:
    write_survey(tmp_path / "survey")
    path = tmp_path / "transcripts" / "t.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("bot: ../survey\nturns:\n  - user: '2'\n    model: [{tool_calls: [{name: rate, arguments: {score: 2}}]}]\n"
                    + textwrap.indent(textwrap.dedent(expect).strip("\n"), "    ") + "\n")
    return path


def test_a_transcript_expects_the_users_events_and_each_other_audiences_apart(tmp_path):
    path = transcript(tmp_path, """
        expect:
          events: [{Rated: 2}, {Message: Thanks for your score!}]
          operators_events: [{Handoff: {contains: call the customer back}}]
          backend_events: [{Detractor: {score: 2}}]
        """)
    assert run_transcript(str(path)).passed, run_transcript(str(path)).report()


def test_a_missing_backend_event_fails_the_transcript_and_names_the_key(tmp_path):
    path = transcript(tmp_path, """
        expect:
          backend_events: [{Detractor: {score: 3}}]
        """)
    report = run_transcript(str(path)).report()
    assert "backend_events differs" in report and "score: 3" in report
    # And `events` is what the user got: a backend event expected there is not found.
    path = transcript(tmp_path, """
        expect:
          events: [{Rated: 2}, {Detractor: {score: 2}}, {Message: Thanks for your score!}]
        """)
    assert "events: expected 3 events, got 2" in run_transcript(str(path)).report()


def test_update_writes_the_other_audiences_events_when_a_turn_sends_some(tmp_path):
    path = transcript(tmp_path, "")
    result = CliRunner().invoke(cli_test_module.test, [str(path), "--update"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    text = path.read_text()
    assert "      operators_events:\n        - Handoff: 'score 2: call the customer back'\n" in text
    assert "      backend_events:\n        - Detractor:\n            score: 2\n" in text
    assert run_transcript(str(path)).passed


# -- the REPL (the author's view) --------------------------------------------------------------------


def test_the_repl_shows_the_other_audiences_marked(survey, capsys):
    from chatrun.cli.repl import Repl

    repl = SimpleNamespace(streamed="", interactive=False, choices=[], session=SimpleNamespace(bot=survey))
    show = functools.partial(Repl.show, repl)
    repl.show_backend = functools.partial(Repl.show_backend, repl)
    show(ev.Event("Detractor", {"score": 2}, 1, audience=ev.BACKEND))
    show(ev.Event("Handoff", "call back", 1, audience=ev.OPERATORS))
    show(ev.Event(ev.ENDED, {"route": "main", "tool": "bye"}, 1))
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith('[backend] Detractor {"score": 2} (for no sink;')
    assert out[1] == "[operators] Handoff call back"
    assert out[2] == "■ the conversation has ended (tool bye on route main); /reset starts a new one"
