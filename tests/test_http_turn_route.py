"""The HTTP turn's route reads its own parameters (server/http.py SendMessageRoute): every request
is answered exactly as FastAPI's parameter solving answered it, and the OpenAPI text is the same."""

from __future__ import annotations

import itertools
import json

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

import chatrun
from chatrun.server import http
from chatrun.testing.fake_openai import echo
from server_support import app_for_testclient, write_travel

AUTH = """
tokens:
  ana-token-123: {principal: ana, roles: [staff]}
  bob-token-456: {principal: bob}
"""
CALLERS = [{}, {"Authorization": "Bearer wrong-token"}, {"Authorization": "Bearer ana-token-123"},
           {"X-API-Key": "bob-token-456"}, {"Authorization": "Bearer cw1.not-a-widget-token"}]
QUERIES = ["", "stream=true", "stream=TRUE", "stream=Off", "stream=maybe", "stream=", "stream", "stream=1&stream=no",
           "stream=yes&stream=x", "ifBusy=reject", "ifBusy=later", "stream=x&ifBusy=later", "token=ana-token-123",
           "token=ana-token-123&stream=y"]
EXTRAS = [{}, {"Idempotency-Key": "k1"}, {"Idempotency-Key": "k" * 201}, {"Accept": "text/event-stream"}]
PATHS = ["/bots/travel/sessions/mine/messages", "/bots/travel/sessions/nobody/messages", "/bots/nope/sessions/mine/messages"]
BODIES = [b'{"userMessage": "hi"}', b"{oops", b'{"userMessage": 7}']


def served(tmp_path, fake, monkeypatch, solved_by_fastapi: bool):
    """An app with auth on, the session `mine` of ana's; the turn's route as it is, or as
    FastAPI's own solving of send_message's signature serves it."""
    auth = tmp_path / "auth.yaml"
    auth.write_text(AUTH)
    bots = tmp_path / ("fastapi" if solved_by_fastapi else "direct")
    with monkeypatch.context() as patched:
        if solved_by_fastapi:  # the route's handler is made when the route is
            patched.setattr(http.SendMessageRoute, "__init__", APIRoute.__init__)
            patched.setattr(http.SendMessageRoute, "get_route_handler", APIRoute.get_route_handler)
        return app_for_testclient([chatrun.load_bot(write_travel(bots))], "memory://", auth=str(auth))


def answers(app, requests, counted: list[str] | None = None) -> list[tuple]:
    """Each request's answer; `counted` gets the turns the server counted (its chatrun_turns lines)."""
    out = []
    with TestClient(app) as client:
        assert client.post("/bots/travel/sessions", json={"id": "mine"},
                           headers={"Authorization": "Bearer ana-token-123"}).status_code == 201
        for path, query, headers, body in requests:
            r = client.post(f"{path}?{query}", content=body, headers={"content-type": "application/json", **headers})
            kind = r.headers.get("content-type", "")
            seen = r.json() if kind.startswith("application/json") else r.text
            out.append((r.status_code, kind, r.headers.get("www-authenticate"), r.headers.get("idempotent-replayed"), seen))
        if counted is not None:
            metrics = client.get("/metrics", headers={"Authorization": "Bearer ana-token-123"}).text
            counted += sorted(line for line in metrics.splitlines() if line.startswith("chatrun_turns_total"))
    return out


def test_the_turn_route_answers_every_request_as_fastapis_parameter_solving_did(tmp_path, fake, monkeypatch):
    fake.responder = echo
    requests = [(PATHS[0], q, {**c, **e}, BODIES[0]) for c, q, e in itertools.product(CALLERS, QUERIES, EXTRAS)]
    # the order of refusals: caller, query, then the bot, the session and the body (the endpoint's)
    requests += [(p, q, c, b) for p, q, c, b in itertools.product(PATHS, ["", "stream=maybe"], CALLERS[:3], BODIES)]
    direct = served(tmp_path, fake, monkeypatch, solved_by_fastapi=False)
    assert [(r.app.__qualname__, r.get_route_handler()) for r in direct.routes if getattr(r, "name", "") == "send_message"] \
        == [("served_directly.<locals>.app", http.send_message_direct)]  # not FastAPI's wrapping
    mine = answers(direct, requests)
    theirs = answers(served(tmp_path, fake, monkeypatch, solved_by_fastapi=True), requests)
    for request, got, expected in zip(requests, mine, theirs, strict=True):
        assert got == expected, request
    statuses = {status for status, *_ in mine}
    assert statuses == {200, 400, 401, 404}  # the matrix reaches each outcome
    assert sum(1 for *_, replayed, _seen in mine if replayed == "true") > 0  # and replays


def test_the_turn_routes_openapi_text_is_fastapis_for_its_signature(tmp_path, fake, monkeypatch):
    direct = served(tmp_path, fake, monkeypatch, solved_by_fastapi=False).openapi()
    solved = served(tmp_path, fake, monkeypatch, solved_by_fastapi=True).openapi()
    assert json.dumps(direct, sort_keys=True) == json.dumps(solved, sort_keys=True)
    names = [p["name"] for p in direct["paths"]["/bots/{bot}/sessions/{session_id}/messages"]["post"]["parameters"]]
    assert names == ["bot", "session_id", "stream", "ifBusy", "Idempotency-Key"]


@pytest.mark.parametrize("value", ["1", "on", "T", "True", "y", "YES"])
def test_a_query_boolean_takes_pydantics_words_in_any_case(value):
    assert http._query_bool({"stream": value}, "stream") is True
    assert http._query_bool({"stream": {"1": "0", "on": "off", "t": "f", "true": "false", "y": "n",
                                        "yes": "no"}[value.lower()]}, "stream") is False


@pytest.mark.parametrize("raw", [
    [], [(b"accept", b"text/event-stream")], [(b"idempotency-key", b"k1"), (b"idempotency-key", b"k2")],
    [(b"host", b"x"), (b"content-length", b"12"), (b"x-api-key", b"t")], [(b"authorization", b"Bearer \xe9")],
    [(b"accept-encoding", b"gzip"), (b"accept", b"")],
])
@pytest.mark.parametrize("query", [b"", b"token=t", b"stream=1"])
def test_headers_read_from_the_scope_are_starlettes(raw, query):
    # plumbing.header and carries_token read the scope's list without starlette's Headers: the same answers.
    from starlette.datastructures import Headers
    from starlette.requests import Request

    from chatrun.server.auth import TOKEN_HEADERS, TOKEN_QUERY
    from chatrun.server.plumbing import carries_token, header

    request = Request({"type": "http", "headers": list(raw), "query_string": query})
    headers = Headers(scope={"headers": list(raw)})
    for name in ("accept", "idempotency-key", "content-length", "authorization", "x-api-key", "host"):
        assert header(request, name.encode()) == headers.get(name)
    assert carries_token(request) == (any(h in headers for h in TOKEN_HEADERS)
                                      or bool(query) and TOKEN_QUERY in request.query_params)


def test_the_apps_state_reads_what_was_written_however_it_was_written():
    # plumbing.ServerState keeps each value as a plain attribute beside starlette's dict: every way
    # State writes or deletes keeps the two the same, so a read never sees an older value.
    from chatrun.server.plumbing import ServerState

    state = ServerState()
    state.auth = "a"
    state["auth"] = "b"
    assert state.auth == state["auth"] == state._state["auth"] == "b"
    state.limits = 1
    assert state["limits"] == 1 and state.limits == 1
    del state["limits"]
    with pytest.raises(AttributeError):
        state.limits  # noqa: B018
    assert getattr(state, "limits", None) is None and "limits" not in state._state
    state.edge = 2
    del state.edge
    assert getattr(state, "edge", None) is None and "edge" not in state._state
    state["edge"] = 3
    assert state.edge == 3


def test_the_served_app_keeps_its_values_as_attributes(tmp_path, fake, monkeypatch):
    app = served(tmp_path, fake, monkeypatch, solved_by_fastapi=False)
    assert {"registry", "auth", "limits", "edge"} <= set(vars(app.state)) and vars(app.state)["edge"] is app.state.edge
