"""The Quarkus Chat Scopes JavaScript client, byte for byte, against `chatrun serve`.

A page served by the real server on loopback (the same uvicorn app `chatrun serve` runs, plus
two test routes: the page and the unmodified Quarkus `chatscopes.js`) drives chatrun the way a
Quarkus app page does, in Debian's Chromium through playwright. Chromium blocks a WebSocket to
127.0.0.1 from a page served through request interception, hence a real HTTP server.

The Quarkus chat-scopes tests that have a declarative counterpart are ported here through that
client (RouteTest, WebsocketTest, WipeTest, ChatScopeTest, CurrentChatScopeTest,
ChatScopeMemoryTest): their Java routes become the YAML routes of PORTS below, answered by the
fake OpenAI server where the Java routes return a value.

The client is found at <repo>/../shared/reference/quarkus-chatscopes/chatscopes.js (set
CHATRUN_QUARKUS_CHATSCOPES to another path, e.g. when the repo is a worktree elsewhere)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import textwrap
from pathlib import Path

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chromium
from chatrun.definition.page_texts import BUILTIN
from chatrun.server import create_app
from server_support import REPO, ThreadServer, call

QUARKUS_JS = Path(os.environ.get("CHATRUN_QUARKUS_CHATSCOPES")
                  or REPO.parent / "shared" / "reference" / "quarkus-chatscopes" / "chatscopes.js")
# The sha256 the reference README gives for the Quarkus file at commit bf6b338.
QUARKUS_SHA256 = "1a719889f805e6bf33a9b4cd64f176382ace54dc1604b0dee5320877128b3d4b"

if not QUARKUS_JS.is_file():  # one line for the whole module, not one per test
    pytest.skip(f"the Quarkus chatscopes.js is not at {QUARKUS_JS} (set CHATRUN_QUARKUS_CHATSCOPES)",
                allow_module_level=True)
pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

PORTS = """
name: ports
description: The routes of the Quarkus chat-scopes tests, declared.
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0, stream: false}
memory: {type: message_window, max_messages: 50}
routes:
  test:
    default: true
    description: WebsocketTest's `test` route (the model answers Received + the message)
    user: "{{ user_message if user_message is not none else 'null' }}"
  multi:
    description: WebsocketTest's `multi` route, RouteTest's `multi-executor`, a streaming route
    model: {stream: true}
    stream_to_quarkus: true
  string:
    description: a route returning String whose model streams (for chatrun's other clients)
    model: {stream: true}
  top:
    description: RouteTest's SimpleRoute `top` (pushes sub, says "top")
    tools: [push_sub, push_sub_and_run]
  sub:
    description: RouteTest's SimpleRoute `sub` (pops, says "sub")
    tools: [pop_sub]
  customer-event:
    description: RouteTest's `customer-event` (a custom event type, then a Message)
    tools: [customer]
  chat:
    description: WipeTest's `chat` route
    tools: [schedule_wipe, schedule_wipe_only, abort_wipe, parent_schedule_wipe_and_push]
  child-chat-once:
    description: WipeTest's child route
  booking:
    description: a route whose tool has an outside effect (a failed turn after it ran)
    tools: [book]
  quiet:
    description: RouteTest's null result (a route with nothing to say ends its loop quietly)
    tools: [say_nothing]
  inherited:
    description: ChatScopeTest (a @ChatScoped counter is shared with nested scopes)
    scope: {shared: {counter: 0}}
    tools: [increment, push_inherited_child]
  inherited-child:
    tools: [increment, pop_child]
  nested:
    description: ChatScopeTest's nested case (the counter lives in the child scope)
    tools: [push_nested_child]
  nested-child:
    scope: {shared: {nested_counter: 0}}
    tools: [increment_nested, pop_child]
  per-chat:
    description: CurrentChatScopeTest (a @PerChatScoped counter is per scope, not inherited)
    scope: {local: {counter: 0}}
    tools: [increment, push_per_chat_child]
  per-chat-child:
    scope: {local: {counter: 0}}
    tools: [increment, pop_child]
tools:
  push_sub: {description: go to sub, action: {push: sub, message: top, immediate: true}}
  push_sub_and_run: {description: go to sub and run it, action: {push: sub, message: top, execute: true}}
  pop_sub: {description: back to top, action: {pop: true, message: sub, immediate: true}}
  customer:
    description: send the customer
    action:
      emit: {customer: {name: John Doe, email: john.doe@example.com}}
      message: customer-event
      immediate: true
  schedule_wipe:
    description: wipe at the end of the turn
    action: {wipe: schedule, message: wipeScheduled, immediate: true}
  schedule_wipe_only:
    description: wipe at the end of the turn, quietly
    action: {wipe: schedule, immediate: true}
  abort_wipe:
    description: cancel the wipe
    action: {wipe: abort, message: abort-wipe, immediate: true}
  parent_schedule_wipe_and_push:
    description: wipe this scope at the end of the turn and push the child
    action: {wipe: schedule, push: child-chat-once, message: parent-wipe-scheduled, immediate: true}
  increment:
    description: add one
    action: {set: {scope.counter: "{{ scope.counter + 1 }}"}, message: "{{ scope.counter }}", immediate: true}
  increment_nested:
    description: add one
    action:
      set: {scope.nested_counter: "{{ scope.nested_counter + 1 }}"}
      message: "{{ scope.nested_counter }}"
      immediate: true
  push_inherited_child: {description: push, action: {push: inherited-child, message: "{{ scope.counter }}", immediate: true}}
  push_nested_child: {description: push, action: {push: nested-child, immediate: true}}
  push_per_chat_child: {description: push, action: {push: per-chat-child, immediate: true}}
  pop_child: {description: pop, action: {pop: true, message: popped, immediate: true}}
  say_nothing: {description: end quietly, action: {immediate: true}}
  book:
    description: book it (a handler with an outside effect)
    handler: ports_tools:book
    effect: once
"""

PORTS_TOOLS = """
def book(ctx):
    return "booked"
"""

# The page a Quarkus app would serve: the client script, and nothing of chatrun's.
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Quarkus client</title>
<script src="/quarkus/chatscopes.js"></script></head>
<body><script>
  const endpoint = location.origin.replace("http", "ws") + "/_chat/routes";
  // Collects what a session's handlers receive, the way the Quarkus tests' handlers do.
  async function quarkusSession(route, {defaultHandler = true, stream = false} = {}) {
    const client = new ChatScopesClient();
    await client.open(endpoint);
    const seen = [];
    let builder = client.builder().messageHandler((m) => seen.push(["Message", m]));
    if (stream) builder = builder.streamHandler((c) => seen.push(["Stream", c]));
    if (defaultHandler) builder = builder.defaultHandler((type, data) => seen.push([type, data]));
    const session = route === undefined ? await builder.connect() : await builder.connect(route);
    return {client, session, seen};
  }
  async function turn(s, message) {  // one chat(): what arrived for it, and how the promise ended
    s.seen.length = 0;
    try {
      const value = await s.session.chat(message);
      return {ok: true, value: value === undefined ? null : value, seen: s.seen.slice()};
    } catch (err) {
      return {ok: false, error: err.message, isError: err instanceof Error, seen: s.seen.slice()};
    }
  }
  document.body.dataset.ready = "true";
</script></body></html>
"""


@pytest.fixture
def quarkus(fake, tmp_path):
    bot_file = tmp_path / "ports.yaml"
    bot_file.write_text(textwrap.dedent(PORTS))
    (tmp_path / "ports_tools.py").write_text(PORTS_TOOLS)
    db = tmp_path / "chat.db"
    app = create_app([chatrun.load_bot(bot_file)], f"sqlite:///{db}")
    from fastapi.responses import FileResponse, HTMLResponse

    app.add_api_route("/quarkus/", lambda: HTMLResponse(PAGE), include_in_schema=False)
    app.add_api_route("/quarkus/chatscopes.js", lambda: FileResponse(QUARKUS_JS, media_type="text/javascript"),
                      include_in_schema=False)
    with ThreadServer(app) as server, chromium() as browser:
        tab = browser.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(server.url + "/quarkus/")
        tab.wait_for_selector("body[data-ready=true]", state="attached", timeout=10_000)
        tab.db = db
        tab.base_url = server.url
        yield tab
        assert not errors, f"uncaught errors on the Quarkus page: {errors}"


def memories(db: Path) -> dict[str, int]:
    """memory id -> number of messages, as the store holds them (a wiped memory may stay as an
    empty row: it is left out, as Quarkus' store drops it)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT memory_id, messages FROM memories").fetchall()
    return {mid: len(json.loads(messages)) for mid, messages in rows if json.loads(messages)}


def test_the_client_is_the_quarkus_file_unmodified():
    assert hashlib.sha256(QUARKUS_JS.read_bytes()).hexdigest() == QUARKUS_SHA256


# -- WebsocketTest ---------------------------------------------------------------------------


def test_websocket_test_web_socket(quarkus, fake):
    """WebsocketTest.testWebSocket: three chats on route `test`, the last with no message."""
    fake.responder = lambda body: {"text": "Received: " + body["messages"][-1]["content"]}
    result = quarkus.evaluate("""async () => {
        const s = await quarkusSession("test");
        return [await turn(s, "Bonjour!"), await turn(s, "Guten Tag!"), await turn(s), s.session.id,
                s.session.currentScope];
    }""")
    bonjour, guten_tag, empty, chat_id, scope = result
    assert bonjour == {"ok": True, "value": None, "seen": [["Message", "Received: Bonjour!"]]}
    assert guten_tag["seen"] == [["Message", "Received: Guten Tag!"]]
    assert empty["seen"] == [["Message", "Received: null"]]
    assert scope == chat_id + ".1"
    # session.close() of the Java client is a Disconnect: the chat is gone, and no frame answers it
    # (a Completed would reach the page's defaultHandler; a Failed would log "Failed: ...").
    gone = quarkus.evaluate("""async (chatId) => {
        const s = await quarkusSession("test");
        const frames = [];
        const onMessage = s.client.onMessage.bind(s.client);  // every frame passes through it
        s.client.onMessage = (event) => { frames.push(JSON.parse(event.data)); onMessage(event); };
        s.client.send({type: "Disconnect", chatId: s.session.id});
        s.client.send({type: "Disconnect", chatId: "never-connected"});
        const after = await turn(s, "still here");  // the connection serves on
        return {frames, after, id: s.session.id};
    }""", chat_id)
    assert [f["type"] for f in gone["frames"]] == ["Failed"], gone  # the chat turn of the disconnected chat
    assert gone["frames"][0]["data"] == "SessionNotActive"
    import httpx

    assert httpx.get(f"{quarkus.base_url}/bots/ports/sessions/{gone['id']}").status_code == 404


def test_websocket_test_multi(quarkus, fake):
    """WebsocketTest.testMulti: a streaming route sends Stream chunks and no Message."""
    fake.queue({"chunks": ["0", "1", "2", "3", "4"]})
    result = quarkus.evaluate("""async () => {
        const s = await quarkusSession("multi", {stream: true});
        return await turn(s, "Hello, world!");
    }""")
    assert result["ok"] is True
    assert result["seen"] == [["Stream", c] for c in "01234"]


def test_a_streaming_model_reaches_a_page_with_only_a_message_handler(quarkus, fake):
    """A page ported from a Quarkus app registers only a messageHandler: a route whose model
    streams, without `stream_to_quarkus`, answers it with one Message, as a String route does.
    (Stream frames would reach no handler, and the client would throw on the second one; the
    fixture fails the test on any page error.)"""
    fake.queue({"chunks": ["Hel", "lo, ", "world"]}, {"chunks": ["again"]})
    result = quarkus.evaluate("""async () => {
        const s = await quarkusSession("string", {defaultHandler: false});
        return [await turn(s, "Hello"), await turn(s, "More")];
    }""")
    assert result == [{"ok": True, "value": None, "seen": [["Message", "Hello, world"]]},
                      {"ok": True, "value": None, "seen": [["Message", "again"]]}]
    assert all(r["stream"] is True for r in fake.requests)


def test_websocket_test_client_close(quarkus, fake):
    """WebsocketTest.testClientClose: the client closes mid-turn; nothing breaks, the turn is kept."""
    fake.queue({"text": "Received: Bonjour!", "delay": 0.3})
    chat_id = quarkus.evaluate("""async () => {
        const s = await quarkusSession("test");
        s.session.chat("Bonjour!");
        s.client.websocket.close();
        return s.session.id;
    }""")
    import httpx

    for _ in range(100):
        history = httpx.get(f"{quarkus.base_url}/bots/ports/sessions/{chat_id}").json()["history"]
        if history:
            break
        quarkus.wait_for_timeout(50)
    assert history[-1]["ok"] is True  # a session survives a closed socket (chatrun keeps it)


# -- RouteTest -------------------------------------------------------------------------------


def test_route_test_simple_each_turn_sends_only_message_events(quarkus, fake):
    """RouteTest.testSimple: top pushes sub and says "top", sub pops and says "sub": the client
    sees only Message events (no RouteChanged), and the promise resolves on each turn."""
    fake.queue(call("push_sub"), call("pop_sub"), call("push_sub"))
    turns = quarkus.evaluate("""async () => {
        const s = await quarkusSession("top");
        const root = s.session.currentScope;
        const out = [];
        for (const text of ["Hi", "yo", "Hi"]) out.push([await turn(s, text), s.session.currentScope]);
        return {root, out};
    }""")
    (first, child), (second, back), (third, child_again) = turns["out"]
    assert first["seen"] == [["Message", "top"]] and first["ok"]
    assert second["seen"] == [["Message", "sub"]] and back == turns["root"] != child
    assert third["seen"] == [["Message", "top"]] and child_again != turns["root"]


def test_route_test_simple_without_a_default_handler_raises_nothing(quarkus, fake):
    """The Quarkus sample page registers no defaultHandler; its client breaks on the second frame
    of a type it has no handler for. chatrun sends it none (the fixture checks for page errors)."""
    fake.queue(call("push_sub"), call("pop_sub"), call("push_sub"), call("pop_sub"))
    turns = quarkus.evaluate("""async () => {
        const s = await quarkusSession("top", {defaultHandler: false});
        const out = [];
        for (const text of ["Hi", "yo", "Hi", "yo"]) out.push(await turn(s, text));
        return out;
    }""")
    assert [t["seen"] for t in turns] == [[["Message", m]] for m in ("top", "sub", "top", "sub")]


def test_route_test_route_not_found(quarkus):
    """RouteTest.testRouteNotFound: connect() rejects with Quarkus' reason."""
    result = quarkus.evaluate("""async () => {
        try { await quarkusSession("bad route"); return "connected"; }
        catch (err) { return {message: err.message, isError: err instanceof Error}; }
    }""")
    assert result == {"message": "Route not found", "isError": True}


def test_route_test_chat_on_the_default_route(quarkus, fake):
    """RouteTest.testChat: connect() without a route starts on the default route."""
    fake.responder = lambda body: {"text": "defaultChat:" + body["messages"][-1]["content"]}
    result = quarkus.evaluate("""async () => {
        const s = await quarkusSession();
        return await turn(s, "Hello, world!");
    }""")
    assert result["seen"] == [["Message", "defaultChat:Hello, world!"]]


def test_route_test_exception_rejects_the_promise_and_changes_nothing(quarkus, fake):
    """RouteTest.testException: a route that fails ends the request with Failed("ServerError"),
    so chat() rejects; no Error frame reaches the Quarkus client; the turn was rolled back."""
    fake.queue(call("push_sub_and_run"), {"status": 400, "body": {"error": {"message": "test exception"}}})
    result = quarkus.evaluate("""async () => {
        const s = await quarkusSession("top");
        const root = s.session.currentScope;
        const failed = await turn(s, "dummy");
        return {root, failed, scope: s.session.currentScope, id: s.session.id};
    }""")
    assert result["failed"] == {"ok": False, "error": "ServerError", "isError": True, "seen": [["Message", "top"]]}
    assert result["scope"] == result["root"]
    import httpx

    session = httpx.get(f"{quarkus.base_url}/bots/ports/sessions/{result['id']}").json()
    assert session["stack"] == ["top"] and session["turn"] == 0


def test_a_failure_after_a_tool_ran_is_the_quarkus_failed_alone_and_the_history_says_what_ran(quarkus, fake):
    """The Quarkus client reads a Failed frame's `data` only (the reason: `new Error(reason)`),
    so a turn that failed after its booking ran reaches it as Failed("ServerError") and nothing
    else (docs/protocol.md, "A failed turn in the Quarkus dialect"); the text that says the
    booking ran, and `ran`, are in the session's history for a page that reads it."""
    fake.queue(call("book"), {"status": 400, "body": {"error": {"message": "the model is down"}}})
    result = quarkus.evaluate("""async () => {
        const s = await quarkusSession("booking");
        return {failed: await turn(s, "book it"), id: s.session.id};
    }""")
    assert result["failed"] == {"ok": False, "error": "ServerError", "isError": True, "seen": []}
    import httpx

    [attempt] = httpx.get(f"{quarkus.base_url}/bots/ports/sessions/{result['id']}").json()["history"]
    assert attempt["ok"] is False and attempt["ran"] == ["book"]
    assert [e["data"] for e in attempt["events"] if e["type"] == "Error"] == [
        BUILTIN["en"]["failed_after_effect"].format(tools="book")]


def test_route_test_null_result_sends_nothing(quarkus, fake):
    """RouteTest.testNullResult: a route with nothing to say sends no event, and completes. (A
    model's empty answer is no longer that: it is asked again, then the fallback is said; a route
    that means to say nothing ends its loop with a quiet `immediate` action.)"""
    fake.queue(call("say_nothing"))
    result = quarkus.evaluate("""async () => {
        const s = await quarkusSession("quiet");
        return await turn(s, "Hello, world!");
    }""")
    assert result == {"ok": True, "value": None, "seen": []}


def test_route_test_event_type(quarkus, fake):
    """RouteTest.testEventType (customer-event): a custom event type, then the Message."""
    fake.queue(call("customer"))
    result = quarkus.evaluate("""async () => {
        const s = await quarkusSession("customer-event");
        return await turn(s, "Hello, world!");
    }""")
    assert result["seen"] == [
        ["customer", {"name": "John Doe", "email": "john.doe@example.com"}],
        ["Message", "customer-event"],
    ]


def test_route_test_multi_executor(quarkus, fake):
    """RouteTest.testMultiExecutor: the stream handler gets 0..4."""
    fake.queue({"chunks": list("01234"), "chunk_delay": 0.01})
    result = quarkus.evaluate("""async () => {
        const s = await quarkusSession("multi", {stream: true});
        const t = await turn(s, "Hello, world!");
        return t.seen.map((e) => e[1]).join("");
    }""")
    assert result == "01234"


# -- WipeTest --------------------------------------------------------------------------------


def test_wipe_test_wipe(quarkus, fake):
    """WipeTest.testWipe: memory grows by 2 a turn; a scheduled wipe empties it when the turn
    ends; a wipe scheduled then aborted in the same turn does not."""
    session = quarkus.evaluate_handle("quarkusSession('chat')")

    def chat(answer, expected_message=None) -> None:
        fake.queue(*answer)
        result = quarkus.evaluate("async (s) => await turn(s, 'Hello')", session)
        assert result["ok"], result
        if expected_message is not None:
            assert result["seen"] == [["Message", expected_message]]

    chat([{"text": "Hello"}])
    scope = quarkus.evaluate("(s) => s.session.currentScope", session)
    memory = f"{scope}#chat"
    assert memories(quarkus.db) == {memory: 2}
    chat([{"text": "Hello"}])
    assert memories(quarkus.db) == {memory: 4}
    chat([call("schedule_wipe")], "wipeScheduled")
    assert memories(quarkus.db) == {}  # wiped when the turn ended
    chat([{"text": "Hello"}])
    assert memories(quarkus.db) == {memory: 2}
    # abort-wipe: scheduled and aborted in one turn: nothing is wiped (2 + user, the assistant's
    # two calls and their two results).
    chat([{"tool_calls": [{"name": "schedule_wipe_only", "arguments": {}}, {"name": "abort_wipe", "arguments": {}}]}],
         "abort-wipe")
    assert memories(quarkus.db) == {memory: 6}
    chat([{"text": "Hello"}])
    assert memories(quarkus.db) == {memory: 8}


def test_wipe_test_parent_wipe_clears_parent_but_not_child(quarkus, fake):
    """WipeTest.testParentWipeClearsParentButNotChild."""
    session = quarkus.evaluate_handle("quarkusSession('chat')")

    def chat(*answers) -> dict:
        fake.queue(*answers)
        return quarkus.evaluate("async (s) => await turn(s, 'Hello')", session)

    chat({"text": "Hello"})
    root = quarkus.evaluate("(s) => s.session.currentScope", session)
    chat({"text": "Hello"})
    assert memories(quarkus.db) == {f"{root}#chat": 4}
    assert chat(call("parent_schedule_wipe_and_push"))["seen"] == [["Message", "parent-wipe-scheduled"]]
    child = quarkus.evaluate("(s) => s.session.currentScope", session)
    assert child != root
    assert memories(quarkus.db) == {}  # the parent's memory was wiped when the turn ended
    chat({"text": "child-messages"})
    assert memories(quarkus.db) == {f"{child}#child-chat-once": 2}


# -- ChatScopeTest, CurrentChatScopeTest, ChatScopeMemoryTest -------------------------------


def counters(quarkus, fake, route: str, calls: list[str]) -> list[str]:
    """Run one turn per tool call on `route`; the Message each turn sends (the counter)."""
    fake.queue(*(call(name) for name in calls))
    return quarkus.evaluate("""async ([route, n]) => {
        const s = await quarkusSession(route);
        const out = [];
        for (let i = 0; i < n; i++) {
            const t = await turn(s, "go");
            out.push(t.seen.map((e) => e[0] + ":" + e[1]).join(","));
        }
        return out;
    }""", [route, len(calls)])


def test_chat_scope_test_scoped_counter_bean_inherited(quarkus, fake):
    """ChatScopeTest.testScopedCounterBeanInherited: `scope.shared` is seen and written by
    nested scopes; after the pop the parent sees the child's increments."""
    seen = counters(quarkus, fake, "inherited",
                    ["increment", "push_inherited_child", "increment", "increment", "pop_child", "increment"])
    assert seen == ["Message:1", "Message:1", "Message:2", "Message:3", "Message:popped", "Message:4"]


def test_chat_scope_test_scoped_counter_bean_nested(quarkus, fake):
    """ChatScopeTest.testScopedCounterBeaNested: state that lives in the child scope starts
    afresh on every push and dies with the pop. (Quarkus creates a bean in the scope that first
    uses it; declared state lives where it is declared, so the Java test's parent-side half
    has no declarative counterpart.)"""
    seen = counters(quarkus, fake, "nested", [
        "push_nested_child", "increment_nested", "increment_nested", "pop_child",
        "push_nested_child", "increment_nested",
    ])
    assert seen == ["", "Message:1", "Message:2", "Message:popped", "", "Message:1"]


def test_current_chat_scope_test_scoped_counter_bean_inherited(quarkus, fake):
    """CurrentChatScopeTest: `scope.local` is per scope: the child starts at 0, and after the
    pop the parent still has its own 1."""
    seen = counters(quarkus, fake, "per-chat",
                    ["increment", "push_per_chat_child", "increment", "increment", "pop_child", "increment"])
    assert seen == ["Message:1", "", "Message:1", "Message:2", "Message:popped", "Message:2"]


def test_chat_scope_memory_test_default_memory_id(quarkus, fake):
    """ChatScopeMemoryTest.testDefaultMemoryId: one memory, its id starts with the scope id, and
    ending the chat (Disconnect, Quarkus' ChatScope.end()) deletes it."""
    fake.queue({"text": "Hello"})
    session = quarkus.evaluate_handle("quarkusSession('test')")
    quarkus.evaluate("async (s) => await turn(s, 'Hello')", session)
    scope = quarkus.evaluate("(s) => s.session.currentScope", session)
    [memory_id] = memories(quarkus.db)
    assert memory_id.startswith(scope)
    quarkus.evaluate("(s) => s.client.send({type: 'Disconnect', chatId: s.session.id})", session)
    for _ in range(100):
        if not memories(quarkus.db):
            break
        quarkus.wait_for_timeout(50)
    assert memories(quarkus.db) == {}
