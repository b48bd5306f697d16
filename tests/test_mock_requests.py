"""A mock's `request:` (issue 25): for `http:` and `openapi:` tools, the request the tool would
send is built (templates rendered, bound arguments applied, nothing sent) and matched with the
transcripts' matchers, so a transcript asserts what the bot sent; a mismatch fails the turn
naming the mock's line and what differed. The bots are bots/orders and bots/helpdesk."""

from __future__ import annotations

from pathlib import Path

import pytest

import chatrun
from chatrun.transcripts.run import run_transcript

REPO = Path(__file__).resolve().parents[1]


def transcript(tmp_path: Path, bot: str, text: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(f"bot: {REPO / 'bots' / bot}\n" + text)
    return path


GET_ORDER = """
turns:
  - user: Where is A1001?
    model:
      - tool_calls: [{{name: get_order, arguments: {{order_id: A1001}}}}]
      - text: Shipped.
    mocks:
      - tool: get_order
        request: {request}
        result: {{status: 200, ok: true, json: {{id: A1001, status: shipped, items: []}}}}
    expect:
      events: [{{Thinking: Looked up order A1001}}, {{Message: Shipped.}}]
"""

CANCEL = """
turns:
  - user: Cancel C3003, it is too slow.
    model:
      - tool_calls: [{{name: cancel_order, arguments: {{orderId: C3003, notify: true, body: {{reason: too slow}}}}}}]
  - user: "yes"   # cancel_order's `confirm:`: the request goes out on the customer's own yes
    model:
      - text: Cancelled.
    mocks:
      - tool: cancel_order
        request: {request}
        result: {{status: 200, ok: true, json: {{id: C3003, status: cancelled}}}}
    expect:
      events: [{{Resolved: {{id: p1, kind: approval, outcome: approved, by: null, args: {{orderId: C3003, notify: true, body: {{reason: too slow}}}}}}}}, {{Message: Cancelled.}}]
"""


def test_an_http_tools_request_matches_method_url_and_headers(tmp_path, monkeypatch):
    monkeypatch.setenv("ORDERS_API_URL", "http://orders.test:8080")
    monkeypatch.setenv("ORDERS_API_TOKEN", "s3cret-token")
    path = transcript(tmp_path, "orders", GET_ORDER.format(request="""
          method: get
          url: http://orders.test:8080/v1/orders/A1001
          headers: {authorization: "Bearer [redacted]", Accept: {regex: json}}
          json: null"""))
    result = run_transcript(str(path))
    assert result.passed, result.report()


def test_an_openapi_tools_request_matches_its_query_and_json_body(tmp_path):
    path = transcript(tmp_path, "orders", CANCEL.format(request="""
          method: POST
          url: {regex: "/v1/orders/C3003/cancel[?]notify=true$"}
          query: {notify: true}
          json: {reason: {contains: slow}}"""))
    result = run_transcript(str(path))
    assert result.passed, result.report()


def test_a_request_that_differs_fails_the_turn_naming_the_mocks_line_and_each_difference(tmp_path):
    path = transcript(tmp_path, "orders", CANCEL.format(request="""
          method: PUT
          query: {notify: false}
          json: {reason: changed my mind}
          headers: {X-Tenant: acme}"""))
    result = run_transcript(str(path))
    assert not result.passed
    error = result.turns[1].observed.error
    assert error is not None and error.startswith(f"{path}:11: the request cancel_order would send is not the "
                                                  "one this mock expects: ")
    assert 'method: expected "PUT", it would send "POST"' in error
    assert 'query: expected {"notify": "false"}, it would send {"notify": "true"}' in error
    assert 'json: expected {"reason": "changed my mind"}, it would send {"reason": "too slow"}' in error
    assert 'header X-Tenant: expected "acme", it would not send it' in error
    assert "Cancelled." not in str(result.turns[1].observed.events)  # the mock's result was not used


def test_a_transcript_level_mock_is_named_by_its_own_line(tmp_path):
    path = transcript(tmp_path, "orders", """
mocks:
  - tool: get_order
    request: {url: {regex: "/A9999$"}}
    result: {status: 200, ok: true, json: {id: A1001, status: shipped, items: []}}
turns:
  - user: Where is A1001?
    model:
      - tool_calls: [{name: get_order, arguments: {order_id: A1001}}]
      - text: Shipped.
""")
    result = run_transcript(str(path))
    error = result.turns[0].observed.error or ""
    assert error.startswith(f"{path}:4: the request get_order would send") and "url: expected" in error


def test_the_request_carries_the_bound_argument_not_the_models(tmp_path):
    path = transcript(tmp_path, "helpdesk", """
principal: {name: ana, email: ana@example.com}
roles: []
turns:
  - user: Show me bob's tickets
    model:
      - tool_calls: [{name: my_tickets, arguments: {reporter: bob@example.com}}]
      - text: Only yours.
    mocks:
      - tool: my_tickets
        request: {method: GET, query: {reporter: ana@example.com}, url: {regex: "^http://127.0.0.1:8090/tickets[?]"}}
        result: {status: 200, ok: true, json: {tickets: []}}
""")
    result = run_transcript(str(path))
    assert result.turns[0].observed.error is None, result.report()


def test_request_on_a_tool_that_sends_no_http_request_is_refused_by_name(tmp_path):
    path = transcript(tmp_path, "notes", """
turns:
  - user: Remember to call the shop
    model:
      - tool_calls: [{name: remember, arguments: {title: shop, text: call the shop}}]
      - text: Saved.
    mocks:
      - tool: remember
        request: {method: POST}
        result: {saved: shop, count: 1}
""")
    result = run_transcript(str(path))
    assert result.turns[0].observed.error == (
        f"{path}:9: this mock of remember has `request:`, but remember sends no HTTP request of its own "
        "(only `http:` and `openapi:` tools do); remove `request:`")


def test_the_schema_refuses_an_unknown_part_of_a_request_at_its_line(tmp_path):
    path = transcript(tmp_path, "orders", GET_ORDER.format(request="{verb: GET}"))
    with pytest.raises(chatrun.BotError) as failure:
        chatrun.load_transcript(str(path))
    assert f"{path}:10" in str(failure.value) and "verb" in str(failure.value)


TWICE = """
mocks:
  - tool: get_order
    args: {order_id: A1001}
    result: {status: 200, ok: true, json: {id: A1001, status: shipped, items: []}}
turns:
  - user: Where is A1001? And now?
    model:
      - tool_calls: [{name: get_order, arguments: {order_id: A1001}}]
      - tool_calls: [{name: get_order, arguments: {order_id: A1001}}]
      - tool_calls: [{name: get_order, arguments: {order_id: A1001}}]
      - text: Delivered.
    mocks:
"""


def tool_texts(result) -> list[str]:
    return [text for m in result.turns[-1].observed.memory for role, text in m.items() if role == "tool"]


def test_mocks_of_the_same_call_answer_it_in_turn_the_last_repeating(tmp_path):
    path = transcript(tmp_path, "orders", TWICE + """
      - tool: get_order
        args: {order_id: A1001}
        result: {status: 200, ok: true, json: {id: A1001, status: processing, items: []}}
      - tool: get_order
        args: {order_id: A1001}
        result: {status: 200, ok: true, json: {id: A1001, status: delivered, items: []}}
""")
    result = run_transcript(str(path))
    assert [t.split(".")[0] for t in tool_texts(result)] == [
        "Order A1001: processing", "Order A1001: delivered", "Order A1001: delivered"]


def test_a_turns_mock_still_overrides_the_transcripts_for_every_call(tmp_path):
    path = transcript(tmp_path, "orders", TWICE + """
      - tool: get_order
        args: {order_id: A1001}
        result: {status: 200, ok: true, json: {id: A1001, status: processing, items: []}}
      - tool: get_order
        result: {status: 404, ok: false, json: {error: no such order}}
""")
    result = run_transcript(str(path))
    assert [t.split(".")[0] for t in tool_texts(result)] == ["Order A1001: processing"] * 3


FORM_BOT = """\
name: subscribe
model: {provider: openai, name: gpt-4o-mini}
routes:
  main:
    default: true
    system: Subscribe people to the newsletter.
    tools: [subscribe]
tools:
  subscribe:
    description: Subscribe an email address
    parameters:
      type: object
      properties: {email: {type: string}, weekly: {type: boolean}}
      required: [email]
    http:
      method: POST
      url: http://news.test/subscribe
      form: {email: "{{ args.email }}", frequency: "{{ 'weekly' if args.weekly else 'daily' }}", source: chat}
"""

SUBSCRIBE = """
turns:
  - user: Sign up ana@example.com, weekly
    model:
      - tool_calls: [{{name: subscribe, arguments: {{email: ana@example.com, weekly: true}}}}]
      - text: Done.
    mocks:
      - tool: subscribe
        request: {request}
        result: {{status: 201, ok: true, json: {{subscribed: true}}}}
"""


def form_transcript(tmp_path: Path, request: str) -> Path:
    (tmp_path / "bot.yaml").write_text(FORM_BOT)
    path = tmp_path / "t.yaml"
    path.write_text("bot: bot.yaml\n" + SUBSCRIBE.format(request=request))
    return path


def test_a_form_body_is_matched_as_its_fields_as_text(tmp_path):
    path = form_transcript(tmp_path, """
          method: POST
          form: {email: ana@example.com, frequency: weekly, source: {regex: ^ch}}
          json: null
          headers: {content-type: {contains: x-www-form-urlencoded}}""")
    result = run_transcript(str(path))
    assert result.passed, result.report()


def test_a_form_field_that_differs_fails_the_turn_naming_it(tmp_path):
    path = form_transcript(tmp_path, "{form: {email: ana@example.com, frequency: daily, source: chat}}")
    result = run_transcript(str(path))
    error = result.turns[0].observed.error or ""
    assert error.startswith(f"{path}:9: the request subscribe would send is not the one this mock expects: "), error
    assert "form: expected" in error and '"frequency": "daily"' in error and '"frequency": "weekly"' in error
