"""`chatrun record --from-session`: turns run through a real `chatrun serve` (SQLite or Redis,
the real openai client against the fake OpenAI server, bots/orders' HTTP tools against a real
orders API), then the stored session becomes a transcript whose API answers are mocks, which
`chatrun test` replays offline to exactly what happened."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from orders_api import OrdersApi
from server_support import free_port
from test_serve_cli import wait_for_line

REPO = Path(__file__).resolve().parents[1]
TOKEN = "tok-123456789"


def chatrun_env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ORDERS_"))}
    env["PYTHONPATH"] = str(REPO / "runner")
    return env | more


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"{}")


def chatrun(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chatrun", *args], cwd=cwd, env=chatrun_env(**env),
                          capture_output=True, text=True, timeout=300)


def served_session(tmp_path: Path, fake, store: str) -> list[dict]:
    """Four turns of bots/orders through `chatrun serve --store STORE` (the third, "yes", answers
    cancel_order's `confirm:`); the replies."""
    fake.queue(
        {"tool_calls": [{"name": "get_order", "arguments": {"order_id": "C3003"}}]},
        {"text": "C3003 is being prepared."},
        {"tool_calls": [{"name": "cancel_order",
                         "arguments": {"orderId": "C3003", "notify": True, "body": {"reason": "too slow"}}}]},
        {"text": "Done: C3003 is cancelled."},
        {"tool_calls": [{"name": "get_order", "arguments": {"order_id": "Z999"}}]},
        {"text": "There is no order Z999."},
    )
    port = free_port()
    with OrdersApi(token=TOKEN) as api:
        env = chatrun_env(OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="test-key", ORDERS_API_URL=api.url,
                          ORDERS_API_TOKEN=TOKEN)
        proc = subprocess.Popen([sys.executable, "-m", "chatrun", "serve", "bots/orders", "--port", str(port),
                                 "--store", store], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            wait_for_line(proc, "serving")
            base = f"http://127.0.0.1:{port}/bots/orders/sessions"
            post(base, {"id": "s1"})
            replies = [post(f"{base}/s1/messages", {"userMessage": text})
                       for text in ("Where is C3003?", "Cancel it please, it takes too long", "yes", "And Z999?")]
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        assert len(api.requests) == 3
    return replies


@pytest.fixture
def orders(tmp_path):
    shutil.copytree(REPO / "bots" / "orders", tmp_path / "bots" / "orders",
                    ignore=shutil.ignore_patterns("__pycache__", "transcripts"))
    return tmp_path


def record_and_replay(tmp_path: Path, store: str) -> tuple[Path, str]:
    out = tmp_path / "bots" / "orders" / "transcripts" / "s1.yaml"
    made = chatrun(["record", "--from-session", "s1", "--store", store, "-o", str(out.relative_to(tmp_path))],
                   tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "4 turns recorded; the replay does what the session did" in made.stdout
    # Offline: no API, no model. The transcript alone replays the session.
    tested = chatrun(["test", str(out.relative_to(tmp_path))], tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    return out, tested.stdout


@pytest.mark.slow
def test_a_sqlite_session_served_for_real_becomes_a_transcript_that_replays_it(orders, fake):
    replies = served_session(orders, fake, "sqlite:///chat.db")
    assert all(r["ok"] for r in replies)
    out, _ = record_and_replay(orders, "sqlite:///chat.db")
    text = out.read_text()
    assert TOKEN not in text
    doc = yaml.safe_load(text)
    assert doc["bot"] == ".."
    first, second, confirmed, third = doc["turns"]
    assert first["user"] == "Where is C3003?"
    assert first["model"][0] == {"tool_calls": [{"name": "get_order", "arguments": {"order_id": "C3003"}}]}
    [mock] = first["mocks"]  # the API's real answer
    assert mock["tool"] == "get_order" and mock["args"] == {"order_id": "C3003"}
    assert mock["result"]["json"]["status"] == "processing"
    assert third["mocks"][0]["result"]["status"] == 404
    # cancel_order's `confirm:` asks first; the call runs (and is mocked) on the user's "yes",
    # written so that it reads back as text, not as YAML 1.1's boolean
    assert second["expect"]["events"][0]["Pending"]["ask"] == "Cancel order C3003?"
    assert "created" not in second["expect"]["events"][0]["Pending"]  # the runtime's own fields differ on a replay
    assert confirmed["user"] == "yes" and "user: 'yes'" in text
    assert confirmed["mocks"][0]["tool"] == "cancel_order"
    assert confirmed["expect"]["calls"] == [{"tool": "cancel_order", "args": {
        "orderId": "C3003", "notify": True, "body": {"reason": "too slow"}},
        "reply": "Order C3003 is cancelled; the refund takes 3-5 days."}]
    assert first["expect"]["events"] == [{e["type"]: e["data"]} for e in replies[0]["events"]]

    # The expectations are what happened, not what a replay gives: a mock that answers otherwise fails.
    out.write_text(text.replace("status: processing", "status: shipped"))
    tested = chatrun(["test", str(out.relative_to(orders))], orders)
    assert tested.returncode == 1 and "turn 1 (bots/orders/transcripts/s1.yaml:" in tested.stdout, tested.stdout
    assert "calls differs" in tested.stdout and "+  reply: 'Order C3003: shipped." in tested.stdout, tested.stdout


@pytest.mark.slow
def test_a_redis_session_records_the_same_way(orders, fake, redis_server):
    store = redis_server.url()
    served_session(orders, fake, store)
    out, _ = record_and_replay(orders, store)
    assert [t["user"] for t in yaml.safe_load(out.read_text())["turns"]] == [
        "Where is C3003?", "Cancel it please, it takes too long", "yes", "And Z999?"]


@pytest.mark.slow
def test_an_unknown_session_or_bot_is_one_line_and_exit_1(orders, tmp_path):
    from chatrun.store.sqlite import SQLiteStore

    SQLiteStore(orders / "chat.db").close()  # a store without the session
    made = chatrun(["record", "--from-session", "nope", "--store", "sqlite:///chat.db", "-o", "x.yaml"], orders)
    assert made.returncode == 1 and made.stderr.strip() == "error: sqlite:///chat.db has no session 'nope'"
    assert "Traceback" not in made.stderr and not (orders / "x.yaml").exists()


def test_reading_a_sqlite_store_that_is_not_there_says_so_and_creates_nothing(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from chatrun.cli import main
    from chatrun.store.sqlite import SQLiteStore

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    missing = tmp_path / "none.db"
    made = runner.invoke(main, ["record", "--from-session", "s1", "--store", f"sqlite:///{missing}", "-o", "out.yaml"])
    assert (made.exit_code, made.output) == (1, f"error: no store at {missing}\n")
    made = runner.invoke(main, ["record", "--from-session", "s1", "--store", "sqlite:///none.db", "-o", "out.yaml"])
    assert (made.exit_code, made.output) == (1, f"error: no store at none.db ({missing})\n")  # relative: shown resolved
    bakery = str(REPO / "bots" / "bakery")
    diffed = runner.invoke(main, ["diff", bakery, bakery, "--store", f"sqlite:///{missing}"])
    assert diffed.exit_code == 2 and f"error: no store at {missing}\n" in diffed.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no empty store, no -wal, no transcript
    SQLiteStore(missing).close()  # a store that is there, without the session: the old message
    made = runner.invoke(main, ["record", "--from-session", "s1", "--store", "sqlite:///none.db", "-o", "out.yaml"])
    assert (made.exit_code, made.output) == (1, "error: sqlite:///none.db has no session 's1'\n")


def test_every_command_that_reads_a_store_refuses_one_that_is_not_there_and_creates_nothing(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from chatrun.cli import main

    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "none.db"
    url = f"sqlite:///{missing}"
    for args in (["versions", "list", "--store", url], ["versions", "prune", "--store", url, "--bot", "shop", "--keep", "1"],
                 ["diff", "1", "2", "--store", url, "--bot", "shop"]):
        result = CliRunner().invoke(main, args)
        assert (result.exit_code, result.output) == (2, f"{url}: error: no store at {missing}\n"), args
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_redis_nobody_answers_at_or_a_url_parameter_redis_does_not_take_is_one_line_naming_the_url(tmp_path):
    from click.testing import CliRunner

    from chatrun.cli import main
    from redis_support import free_port

    down = f"redis://127.0.0.1:{free_port()}/0"
    misspelt = down + "?connect_timeout=1"
    for url, message in ((down, f"store {down}: cannot reach Redis: "),
                         (misspelt, f"store {misspelt}: unknown URL parameter `connect_timeout`; did you mean "
                                    "`socket_connect_timeout`?")):
        for args in (["record", "--from-session", "s1", "--store", url, "-o", str(tmp_path / "out.yaml")],
                     ["versions", "list", "--store", url], ["diff", "1", "2", "--store", url, "--bot", "shop"]):
            result = CliRunner().invoke(main, args)
            assert result.exit_code in (1, 2) and message in result.output, (args, result.output)
            assert "unexpected" not in result.output and result.output.count("\n") == 1, result.output
