"""`/save` records what happened (issue 25): the REPL's saved transcript keeps the real results
of the tools that reach outside the bot — an HTTP API (tests/orders_api.py, on loopback), an
OpenAPI operation on it, a stdio MCP server (bots/notes/notes_server.py) — as the turns'
`mocks:`, so `chatrun test` replays it offline, the API stopped, to the same events; and a real
failure (the API answered 500) replays as that failure, not as a missing mock."""

from __future__ import annotations

import re
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from orders_api import OrdersApi
from test_repl import run_repl

pytest.importorskip("mcp", reason="the mcp SDK is not installed (pip install 'chatrun[mcp]')")

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "bots" / "orders" / "orders.openapi.yaml"
NOTES_SERVER = REPO / "bots" / "notes" / "notes_server.py"

BOT = f"""
name: desk
model: {{provider: openai, name: gpt-4o-mini}}
env:
  ORDERS_API_URL: {{description: Base URL of the orders API}}
  ORDERS_API_TOKEN: {{secret: true, default: dev-token, description: Bearer token}}
mcp_servers:
  notes: {{command: [{sys.executable}, {NOTES_SERVER}]}}
routes:
  desk:
    default: true
    system: The order desk.
    tools: [get_order, cancel_order, remember]
tools:
  get_order:
    description: Look up an order
    parameters: {{type: object, properties: {{order_id: {{type: string}}}}, required: [order_id]}}
    http:
      url: "{{{{ env.ORDERS_API_URL }}}}/v1/orders/{{{{ args.order_id | urlsegment }}}}"
      headers: {{Authorization: "Bearer {{{{ env.ORDERS_API_TOKEN }}}}"}}
      retries: 1
    action:
      reply: "{{{{ result.json.id }}}} is {{{{ result.json.status }}}}"
  cancel_order:
    openapi:
      spec: orders.openapi.yaml
      operation: cancelOrder
      base_url: "{{{{ env.ORDERS_API_URL }}}}"
      headers: {{Authorization: "Bearer {{{{ env.ORDERS_API_TOKEN }}}}"}}
  remember:
    description: Save a note
    mcp: {{server: notes, tool: add_note}}
"""


class BrokenApi(OrdersApi):
    """The orders API having a bad day: every request answers 500."""

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        self.requests.append({"method": h.command, "path": h.path})
        self.reply(h, 500, {"error": "database on fire"})


def chatrun_test(path: Path, api_url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chatrun", "test", str(path)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**_env(), "ORDERS_API_URL": api_url})


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")} | {"PYTHONPATH": str(REPO / "runner")}


def save_session(tmp_path: Path, api_url: str, lines: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "bot").mkdir()
    (tmp_path / "bot" / "bot.yaml").write_text(BOT)
    (tmp_path / "bot" / "orders.openapi.yaml").write_text(SPEC.read_text())
    saved = tmp_path / "saved.yaml"
    out = run_repl([str(tmp_path / "bot"), "--play-model"], "\n".join([*lines, f"/save {saved}"]) + "\n",
                   env_extra={"ORDERS_API_URL": api_url})
    assert out.returncode == 0, out.stderr
    turns = sum(1 for line in lines if not line.startswith("/"))
    assert f"saved {turns} turn{'' if turns == 1 else 's'} to" in out.stdout, out.stdout
    return out, saved


def live_tool_results(repl_out: str) -> list[str]:
    """What the tools gave in the live session, as the REPL showed it (`[tool NAME → TEXT]`)."""
    return re.findall(r"^\[tool \w+ → (.*)\]$", repl_out, re.M)


def replayed_tool_results(saved: Path, monkeypatch: pytest.MonkeyPatch, api_url: str) -> list[str]:
    """Replay the saved transcript in process (the API stopped) and give what the tools gave there."""
    from chatrun.transcripts.run import run_transcript

    monkeypatch.setenv("ORDERS_API_URL", api_url)
    result = run_transcript(str(saved))
    assert result.passed, result.report()
    return [text for message in result.turns[-1].observed.memory for role, text in message.items() if role == "tool"]


@pytest.mark.subprocess  # chatrun repl, chatrun test, a stdio MCP server
def test_a_saved_session_keeps_real_http_openapi_and_mcp_results_and_replays_offline(tmp_path, monkeypatch):
    with OrdersApi() as api:
        out, saved = save_session(tmp_path, api.url, [
            "where is A1001?", '/call get_order {"order_id": "A1001"}', "/say It has shipped.",
            "cancel C3003", '/call cancel_order {"orderId": "C3003", "body": {"reason": "too slow"}}', "/say Cancelled.",
            "note: call the shop", '/call remember {"title": "shop", "text": "call the shop"}', "/say Noted.",
        ])
        url = api.url
    assert [r["method"] for r in api.requests] == ["GET", "POST"]
    assert "A1001 is shipped" in out.stdout
    doc = yaml.safe_load(saved.read_text())
    mocks = [turn.get("mocks") for turn in doc["turns"]]
    assert mocks[0][0]["tool"] == "get_order" and mocks[0][0]["args"] == {"order_id": "A1001"}
    assert mocks[0][0]["result"]["json"]["status"] == "shipped"
    assert mocks[1][0]["tool"] == "cancel_order" and mocks[1][0]["result"]["json"] == {"id": "C3003",
                                                                                       "status": "cancelled"}
    assert mocks[2][0]["tool"] == "remember" and mocks[2][0]["result"]  # what the MCP server answered
    assert "no mock" not in saved.read_text()
    # The API is stopped now (and the notes server is not started): the replay passes offline.
    replay = chatrun_test(saved, url)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "passed" in replay.stdout
    live = live_tool_results(out.stdout)
    assert len(live) == 3 and live[0] == "A1001 is shipped" and '"count": 1' in live[2]
    assert replayed_tool_results(saved, monkeypatch, url) == live


@pytest.mark.subprocess  # chatrun repl, chatrun test
def test_a_real_failure_is_saved_as_that_failure_and_replays_as_it(tmp_path, monkeypatch):
    with BrokenApi() as api:
        out, saved = save_session(tmp_path, api.url, [
            "where is A1001?", '/call get_order {"order_id": "A1001"}', "/say The shop is down.",
        ])
        url = api.url
    assert len(api.requests) == 2  # the call and its retry: the failure was real
    doc = yaml.safe_load(saved.read_text())
    [mock] = doc["turns"][0]["mocks"]
    assert mock["tool"] == "get_order" and "HTTP 500" in mock["error"] and "no mock" not in mock["error"]
    replay = chatrun_test(saved, url)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    [live] = live_tool_results(out.stdout)
    assert live.startswith("Error: get_order failed: HTTP 500")
    assert replayed_tool_results(saved, monkeypatch, url) == [live]


@pytest.mark.subprocess  # a stdio MCP server
def test_record_keeps_an_mcp_servers_real_results_as_mocks_and_replays_offline(fake, tmp_path):
    from click.testing import CliRunner

    import chatrun
    from chatrun.cli import main

    transcript = tmp_path / "rec.yaml"
    transcript.write_text(f"bot: {REPO / 'bots' / 'notes'}\nturns:\n  - user: Remember to call the shop\n")
    fake.queue({"tool_calls": [{"name": "remember", "arguments": {"title": "shop", "text": "call the shop"}}]},
               {"text": "Saved."})
    result = CliRunner().invoke(main, ["test", str(transcript), "--record", "--update"])
    assert result.exit_code == 0, result.output
    [mock] = chatrun.load_transcript(str(transcript)).turns[0].mocks
    assert mock == {"tool": "remember", "args": {"title": "shop", "text": "call the shop"},
                    "result": {"saved": "shop", "count": 1}}
    replay = chatrun.run_transcript(str(transcript))  # no server started: the mock answers
    assert replay.passed, replay.report()
    assert {"Thinking": "Saved note shop"} in replay.turns[0].observed.events


@pytest.mark.subprocess  # chatrun repl
def test_a_call_made_twice_with_two_real_answers_replays_both(tmp_path, monkeypatch):
    with OrdersApi() as api:
        out, saved = save_session(tmp_path, api.url, [
            "cancel C3003 and show it", '/call get_order {"order_id": "C3003"}',
            '/call cancel_order {"orderId": "C3003", "body": {"reason": "late"}}',
            '/call get_order {"order_id": "C3003"}', "/say Cancelled.",
        ])
        url = api.url
    live = live_tool_results(out.stdout)
    assert live[0] == "C3003 is processing" and live[2] == "C3003 is cancelled"
    assert replayed_tool_results(saved, monkeypatch, url) == live
