"""bots/orders end to end: the real openai client against the fake OpenAI server, the bot's
HTTP tools against a real orders API on loopback; then `--record` writes the API's real
answers into the transcript as mocks (secrets redacted), and the transcript replays offline."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import chatrun
from chatrun.messages import ToolResultMessage
from orders_api import OrdersApi

REPO = Path(__file__).resolve().parents[1]
ORDERS_BOT = REPO / "bots" / "orders"


@pytest.fixture
def api(monkeypatch):
    with OrdersApi(token="tok-123456789") as server:
        monkeypatch.setenv("ORDERS_API_URL", server.url)
        monkeypatch.setenv("ORDERS_API_TOKEN", "tok-123456789")
        yield server


def test_status_then_cancel_through_the_real_client_and_a_real_api(fake, api):
    fake.queue(
        {"tool_calls": [{"name": "get_order", "arguments": {"order_id": "C3003"}}]},
        {"text": "C3003 is being prepared."},
        {"tool_calls": [{"name": "cancel_order",
                         "arguments": {"orderId": "C3003", "notify": True, "body": {"reason": "too slow"}}}]},
        {"text": "Done: C3003 is cancelled."},
    )
    session = chatrun.load_bot(ORDERS_BOT).session()
    first = [e for e in session.chat("Where is C3003?") if e.type != "Stream"]
    assert [(e.type, e.data) for e in first] == [("Thinking", "Looked up order C3003"),
                                                 ("Message", "C3003 is being prepared.")]
    assert session.state["last_order"]["status"] == "processing"
    asked = [e for e in session.chat("Cancel it please") if e.type != "Stream"]
    # a cancellation waits for the customer's own yes (`confirm:`): nothing is sent before it
    assert [(e.type, e.data.get("ask") if e.type == "Pending" else None) for e in asked] == [
        ("Pending", "Cancel order C3003?"), ("Choices", None)]
    assert [r["method"] for r in api.requests] == ["GET"]
    session.chat("yes")
    assert [(r["method"], r["path"], r["body"]) for r in api.requests] == [
        ("GET", "/v1/orders/C3003", None),
        ("POST", "/v1/orders/C3003/cancel?notify=true", {"reason": "too slow"}),
    ]
    assert all(r["auth"] == "Bearer tok-123456789" for r in api.requests)
    results = [m.content for m in session.memory() if isinstance(m, ToolResultMessage)]
    assert results[-1] == "Order C3003 is cancelled; the refund takes 3-5 days."
    # cancel_order was made from the OpenAPI document: its arguments are the operation's
    cancel = next(t for t in fake.requests[2]["tools"] if t["function"]["name"] == "cancel_order")["function"]
    assert cancel["description"] == "Cancel an order that has not shipped yet"
    assert cancel["parameters"]["required"] == ["body", "orderId"]
    assert set(cancel["parameters"]["properties"]) == {"orderId", "notify", "body"}
    # the model saw the tool results, never the token
    assert "tok-123456789" not in str(fake.requests)
    # the second turn's context (the system message after the memory) carries the state the first set
    assert fake.requests[2]["messages"][-1] == {"role": "system",
                                                "content": "The last order discussed: C3003 (processing)."}


def test_record_keeps_real_api_answers_as_mocks_and_replays_offline(fake, api, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from chatrun.cli import main

    transcript = tmp_path / "rec.yaml"
    transcript.write_text(textwrap.dedent(f"""\
        bot: {ORDERS_BOT}
        turns:
          - user: Where is A1001?
          - user: And Z999?
        """))
    fake.queue(
        {"tool_calls": [{"name": "get_order", "arguments": {"order_id": "A1001"}}]},
        {"text": "Shipped."},
        {"tool_calls": [{"name": "get_order", "arguments": {"order_id": "Z999"}}]},
        {"text": "No such order."},
    )
    result = CliRunner().invoke(main, ["test", str(transcript), "--record", "--update"])
    assert result.exit_code == 0, result.output
    recorded = chatrun.load_transcript(transcript)
    assert [m["tool"] for t in recorded.turns for m in t.mocks] == ["get_order", "get_order"]
    first = recorded.turns[0].mocks[0]
    assert first["args"] == {"order_id": "A1001"} and first["result"]["json"]["status"] == "shipped"
    assert recorded.turns[1].mocks[0]["result"]["status"] == 404
    assert "tok-123456789" not in transcript.read_text()
    # offline: the API and the model gone, the transcript still passes
    api.__exit__()
    monkeypatch.setenv("ORDERS_API_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert chatrun.run_transcript(str(transcript)).passed


def test_an_http_tool_a_transcript_does_not_mock_fails_its_turn(tmp_path):
    transcript = tmp_path / "t.yaml"
    transcript.write_text(textwrap.dedent(f"""\
        bot: {ORDERS_BOT}
        turns:
          - user: Where is A1001?
            model:
              - tool_calls: [{{name: get_order, arguments: {{order_id: A1001}}}}]
            expect:
              error: {{contains: "tool get_order calls an HTTP API, and no mock of this transcript matches"}}
        """))
    result = chatrun.run_transcript(str(transcript))
    assert result.passed, result.report()
