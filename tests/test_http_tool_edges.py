"""An `http:` tool against an API that misbehaves, served for real on loopback: a body larger
than a result can be, a body trickled in past the tool's timeout, a `Retry-After` that is
neither seconds nor a date, and a secret in a URL that is not one; and an OpenAPI document as
real APIs write them (a schema that refers to itself, a path parameter named `order-id`)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler

import pytest

import chatrun
from chatrun.messages import ToolResultMessage
from chatrun.toolkinds.http import MAX_BODY_BYTES
from orders_api import LoopbackApi

SECRET = "s3cret-api-key-value"
ODD_SECRET = "k3y+with/slash=and space&more"  # a value a URL carries escaped


class UnrulyApi(LoopbackApi):
    """/huge: a JSON body over MAX_BODY_BYTES; /drip: a byte every 0.2 s; /soon: 503 with
    `Retry-After: soon`, then 200."""

    def __init__(self) -> None:
        super().__init__()
        self.done = threading.Event()  # the test ended: a trickling answer stops
        self.soon_left = 1
        self.busy_left = 1
        self.refunds: list[str | None] = []  # the Idempotency-Key of each refund done
        self.bodies: list[object] = []

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        self.requests.append(h.path)
        if h.command == "POST" and h.path.startswith("/refund"):
            self._refund(h)
        elif h.command == "POST":
            self.bodies.append(json.loads(h.rfile.read(int(h.headers["content-length"]))))
            self.reply(h, 201, {"planted": True})
        elif h.path.startswith("/echo"):  # an API that shows the URL it was asked (an error page's "not found: ...")
            self.reply(h, 404, {"not_found": h.path})
        elif h.path == "/huge":
            self._huge(h)
        elif h.path == "/drip":
            h.send_response(200)
            h.send_header("content-type", "text/plain")
            h.send_header("content-length", "40")
            h.end_headers()
            for _ in range(40):
                if self.done.wait(0.2):
                    return
                h.wfile.write(b"x")
                h.wfile.flush()
        elif h.path == "/soon" and self.soon_left:
            self.soon_left -= 1
            h.send_response(503)
            h.send_header("retry-after", "soon")
            h.send_header("content-length", "0")
            h.end_headers()
        else:
            self.reply(h, 200, {"ok": True})

    def _refund(self, h: BaseHTTPRequestHandler) -> None:
        """A refund is done at once; then /refund/slow answers after the test (a timeout),
        /refund/boom answers 500, /refund/busy refuses the first call with 429 (nothing done)."""
        h.rfile.read(int(h.headers["content-length"]))
        if h.path == "/refund/busy" and self.busy_left:
            self.busy_left -= 1
            self.reply(h, 429, {"error": "slow down"})
            return
        self.refunds.append(h.headers.get("idempotency-key"))
        if h.path == "/refund/slow":
            self.done.wait(10)
        self.reply(h, 500 if h.path == "/refund/boom" else 201, {"refunded": True})

    @staticmethod
    def _huge(h: BaseHTTPRequestHandler) -> None:
        chunk = b" " * 1_000_000
        count = MAX_BODY_BYTES // len(chunk) + 2
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(count * len(chunk) + 2))
        h.end_headers()
        h.wfile.write(b"[")
        for _ in range(count):
            h.wfile.write(chunk)
        h.wfile.write(b"]")


@pytest.fixture
def api(monkeypatch):
    with UnrulyApi() as server:
        monkeypatch.setenv("API_URL", server.url)
        monkeypatch.setenv("API_KEY", SECRET)
        monkeypatch.setenv("API_PASS", ODD_SECRET)
        yield server
        server.done.set()


BOT = """
name: unruly
model: {provider: scripted, name: gpt-4o-mini}
env:
  API_URL: {}
  API_KEY: {secret: true}
  API_PASS: {secret: true}
  STUCK_URL: {default: "http://127.0.0.1:9"}
routes:
  main: {default: true, system: s, tools: [huge, drip, soon, lookup, echo_query, echo_inline, search, search_page,
                                         refund, refund_boom, refund_busy, refund_keyed, refund_nowhere,
                                         refund_stuck]}
tools:
  refund:
    description: d
    timeout: 0.5
    http: {method: POST, url: "{{ env.API_URL }}/refund/slow", json: {order: A1}, idempotency_key: false}
  refund_boom:
    description: d
    http: {method: POST, url: "{{ env.API_URL }}/refund/boom", json: {order: A1}, idempotency_key: false}
  refund_busy:
    description: d
    http: {method: POST, url: "{{ env.API_URL }}/refund/busy", json: {order: A1}, idempotency_key: false}
  refund_keyed:
    description: d
    timeout: 0.5
    http: {method: POST, url: "{{ env.API_URL }}/refund/slow", json: {order: A1}, retries: 1}
  refund_stuck:
    description: d
    timeout: 0.5
    http: {method: POST, url: "{{ env.STUCK_URL }}/refund", json: {order: A1}, idempotency_key: false, retries: 1}
  refund_nowhere:
    description: d
    http: {method: POST, url: "http://127.0.0.1:9/refund", json: {order: A1}, idempotency_key: false, retries: 1}
  huge: {description: d, http: {url: "{{ env.API_URL }}/huge", retries: 0}}
  drip: {description: d, timeout: 0.5, http: {url: "{{ env.API_URL }}/drip", retries: 0}}
  soon: {description: d, http: {url: "{{ env.API_URL }}/soon", retries: 1}}
  echo_query:
    description: d
    http: {url: "{{ env.API_URL }}/echo/{{ env.API_PASS | urlsegment }}", query: {pass: "{{ env.API_PASS }}"}, accept: [404]}
  echo_inline:
    description: d
    http: {url: "{{ env.API_URL }}/echo?pass={{ env.API_PASS }}", accept: [404]}
  search:
    description: d
    parameters: {type: object, properties: {q: {type: string}}}
    http: {url: "{{ env.API_URL }}/echo/search?q={{ args.q }}&n=2", accept: [404]}
  search_page:
    description: d
    parameters: {type: object, properties: {q: {type: string}}}
    http: {url: "{{ env.API_URL }}/echo/search?q={{ args.q }}&n=2", query: {page: "3", n: "5"}, accept: [404]}
  lookup:
    description: d
    parameters: {type: object, properties: {base: {type: string}}}
    http: {url: "{{ args.base }}/find?key={{ env.API_KEY }}"}
"""


def run(write_bot, name: str, **arguments: object) -> tuple[chatrun.Session, list[chatrun.Event]]:
    model = chatrun.ScriptedModel([{"tool_calls": [{"name": name, "arguments": arguments}]}, {"text": "ok"}])
    session = chatrun.load_bot(write_bot(BOT)).session(model=model)
    return session, [e for e in session.chat("go") if e.type != "Stream"]


def tool_result(session: chatrun.Session) -> str:
    [reply] = [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]
    return reply


def test_a_body_larger_than_a_result_can_be_is_not_read_and_the_model_reads_it_was_done(api, write_bot):
    # A 2xx says the API did it: were the model told "failed", a POST's effect would be asked again.
    session, events = run(write_bot, "huge")
    assert tool_result(session).startswith("Error: huge's GET http://"), tool_result(session)
    assert "succeeded (HTTP 200), but its answer is larger than 10 MB" in tool_result(session)
    assert "do not call huge again" in tool_result(session)
    assert [e.type for e in events] == ["Message"]
    assert api.requests == ["/huge"]  # the same API would send the same body again: not retried


def test_a_body_trickled_in_past_the_timeout_is_a_timeout(api, write_bot):
    session, _ = run(write_bot, "drip")
    assert tool_result(session).startswith("Error: drip failed: no answer within 0.5 s"), tool_result(session)


def test_an_unreadable_retry_after_is_retried_with_the_usual_backoff(api, write_bot):
    session, events = run(write_bot, "soon")
    assert [e.type for e in events] == ["Message"]
    assert '"ok": true' in tool_result(session) and api.requests == ["/soon", "/soon"]


def test_a_secret_in_a_url_that_is_not_http_is_redacted_from_the_turns_error(api, write_bot):
    _, events = run(write_bot, "lookup", base="ftp://files")
    assert events[-1].type == "Error"
    detail = events[-1].meta["detail"]
    assert "not an http(s) URL" in detail and "key=[redacted]" in detail and SECRET not in detail


@pytest.mark.parametrize("tool, sent", [("search", "/echo/search?q=tea&n=2"),
                                        ("search_page", "/echo/search?q=tea&n=5&page=3")])
def test_a_query_written_into_the_url_is_sent_with_the_query_mapping(api, write_bot, tool, sent):
    """`url: ".../search?q={{ args.q }}"` (docs/tools.md writes one): httpx replaced the URL's
    query with the `query:` mapping's, or with none when it had no values, so `q` never arrived."""
    run(write_bot, tool, q="tea")
    assert api.requests == [sent]  # `query:` wins a name both give


@pytest.mark.parametrize("tool", ["echo_query", "echo_inline"])
def test_a_secret_the_api_echoes_as_the_url_carried_it_is_redacted(api, write_bot, tool):
    """The URL escapes a secret (`+` as `%2B`, a space as `+` or `%20`): an API that shows the
    URL it was asked shows it so, and that form is redacted too."""
    session, _ = run(write_bot, tool)
    result = json.loads(tool_result(session))
    assert result["status"] == 404 and "[redacted]" in result["json"]["not_found"]
    stored = json.dumps(session.history) + tool_result(session)
    for form in ("k3y", "with%2Fslash", "and+space", "and%20space"):
        assert form not in stored, (form, result["json"]["not_found"])


TREES_DOC = """
openapi: 3.0.3
info: {title: Trees, version: "1"}
paths:
  /trees/{tree-id}:
    post:
      operationId: plant
      parameters: [{name: tree-id, in: path, required: true, schema: {type: string}}]
      requestBody:
        required: true
        content: {application/json: {schema: {$ref: "#/components/schemas/Node"}}}
      responses: {"201": {description: planted}}
components:
  schemas:
    Node:
      type: object
      required: [name]
      properties:
        name: {type: string}
        children: {type: array, items: {$ref: "#/components/schemas/Node"}}
"""

TREES_BOT = """
name: trees
model: {provider: scripted, name: gpt-4o-mini}
env: {API_URL: {}}
routes:
  main: {default: true, system: s, tools: [plant]}
tools:
  plant: {openapi: {spec: trees.yaml, operation: plant, base_url: "{{ env.API_URL }}"}}
"""


def test_an_openapi_schema_that_refers_to_itself_and_a_hyphenated_path_parameter_make_a_tool(api, write_bot):
    """A tree (a schema whose items are itself) loaded in a RecursionError, and `{tree-id}` made a
    template reading `args.tree - id`: now the schema goes into `$defs` once, and the argument is read
    by its name. The model's nested body reaches the API; one with a wrong type inside is refused."""
    tree = {"name": "oak", "children": [{"name": "branch", "children": [{"name": "twig"}]}]}
    model = chatrun.ScriptedModel([
        {"tool_calls": [{"name": "plant", "arguments": {"tree-id": "a/b", "body": {"name": "x", "children": [{}]}}}]},
        {"tool_calls": [{"name": "plant", "arguments": {"tree-id": "a/b", "body": tree}}]}, {"text": "ok"}])
    bot = chatrun.load_bot(write_bot(TREES_BOT, extra={"trees.yaml": TREES_DOC}))
    assert bot.config.tools["plant"].parameters["$defs"]["components.schemas.Node"]["properties"]["children"] == {
        "type": "array", "items": {"$ref": "#/$defs/components.schemas.Node"}}
    session = bot.session(model=model)
    assert [e.type for e in session.chat("plant") if e.type != "Stream"] == ["Message"]
    refused, planted = [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]
    assert "body.children.0: 'name' is a required property" in refused  # a child without its name: not sent
    assert '"planted": true' in planted
    assert api.requests == ["/trees/a%2Fb"] and api.bodies == [tree]


@pytest.mark.parametrize(("tool", "problem"), [("refund", "no answer within 0.5 s"), ("refund_boom", "HTTP 500 Internal Server Error")])
def test_a_post_without_a_key_that_may_have_been_done_is_done_once_and_the_model_reads_the_outcome_is_unknown(
        api, write_bot, tool, problem):
    session, events = run(write_bot, tool)
    assert len(api.refunds) == 1  # was 3: the refund done, then twice more on the retries
    reply = tool_result(session)
    assert reply.startswith(f"Error: {tool}'s outcome is unknown: {problem} from POST "), reply
    assert f"Do not call {tool} again" in reply and [e.type for e in events] == ["Message"]


def test_a_post_without_a_key_refused_before_the_work_is_retried(api, write_bot):
    session, _ = run(write_bot, "refund_busy")
    assert api.requests == ["/refund/busy", "/refund/busy"] and len(api.refunds) == 1
    assert '"refunded": true' in tool_result(session)


def test_a_post_without_a_key_that_could_not_connect_is_retried(api, write_bot):
    session, _ = run(write_bot, "refund_nowhere")
    assert tool_result(session).startswith("Error: refund_nowhere failed: cannot connect (ConnectError) from POST "
                                           "http://127.0.0.1:9/refund after 2 attempts"), tool_result(session)


def test_a_post_with_a_key_is_retried_after_a_timeout_with_the_same_key(api, write_bot):
    session, _ = run(write_bot, "refund_keyed")
    assert len(api.refunds) == 2 and api.refunds[0] == api.refunds[1] is not None  # the API dedupes by it
    assert tool_result(session).startswith("Error: refund_keyed failed: no answer within 0.5 s")


def test_a_post_without_a_key_whose_connection_is_never_made_in_time_is_retried(api, write_bot, monkeypatch):
    """A server whose listen queue is full never completes the connection (Linux drops the SYN):
    the connect times out before the tool's whole time does, so the request surely was not sent."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    waiting = [socket.socket() for _ in range(3)]  # fill the queue: further connections hang
    try:
        for sock in waiting:
            sock.setblocking(False)
            sock.connect_ex(listener.getsockname())
        monkeypatch.setenv("STUCK_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
        session, _ = run(write_bot, "refund_stuck")
    finally:
        for sock in (*waiting, listener):
            sock.close()
    assert tool_result(session).startswith("Error: refund_stuck failed: cannot connect (ConnectTimeout) from POST "), \
        tool_result(session)
