"""A webhook receiver for the outbox tests (no tests here): a real local HTTP server in a
thread that records every delivery, answers with the status the test sets (or holds the
request), and checks signatures with the algorithm docs/deploy.md documents."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SECRET = "whsec-test-0123456789"


@dataclass
class Delivery:
    headers: dict[str, str]
    raw: bytes
    status: int  # what the receiver answered

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.raw)

    def signed_with(self, secret: str) -> bool:
        """docs/deploy.md's check: HMAC-SHA256 over "<timestamp>.<raw body>", hex, after "v1="."""
        timestamp = self.headers["chatrun-timestamp"]
        expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + self.raw, hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.headers["chatrun-signature"], f"v1={expected}")


class Receiver:
    """POST / records a Delivery and answers `status` (after `hold` seconds, if set)."""

    def __init__(self, status: int = 200, port: int = 0):
        self.status = status
        self.hold = 0.0
        self.arrivals = 0  # requests that arrived (answered or still held)
        self.deliveries: list[Delivery] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = receiver.status
                with receiver._lock:
                    receiver.arrivals += 1
                if receiver.hold:
                    time.sleep(receiver.hold)
                with receiver._lock:
                    receiver.deliveries.append(Delivery({k.lower(): v for k, v in self.headers.items()}, raw, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def seen(self) -> list[Delivery]:
        with self._lock:
            return list(self.deliveries)

    def accepted(self) -> list[Delivery]:
        return [d for d in self.seen() if 200 <= d.status < 300]

    def wait_for(self, condition: Any, timeout: float = 60, what: str = "deliveries") -> list[Delivery]:
        """Wait (generously: a loaded machine) until condition(deliveries) holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = self.seen()
            if condition(seen):
                return seen
            time.sleep(0.05)
        raise AssertionError(f"{what}: not within {timeout} s; seen {[(d.status, d.body) for d in self.seen()]}")


RETRY = "attempts: 50, backoff: 0.2, max_backoff: 2"


def survey_bot(model: str, retry: str = RETRY, timeout: float = 20) -> str:
    """A bot whose `score` tool emits a backend Detractor (to the `crm` webhook) and a user Thanks."""
    return f"""\
name: survey
model: {{{model}}}
env:
  HOOK_URL: {{}}
  HOOK_SECRET: {{secret: true}}
events:
  Detractor: {{audience: backend}}
sinks:
  crm:
    webhook: {{url: "{{{{ env.HOOK_URL }}}}/hooks/chatrun", secret: HOOK_SECRET, timeout: {timeout}}}
    retry: {{{retry}}}
routes:
  main: {{default: true, system: Ask for a score., tools: [score]}}
tools:
  score:
    parameters: {{type: object, properties: {{n: {{type: integer}}}}, required: [n]}}
    action: {{emit: {{Detractor: "{{{{ args.n }}}}", Thanks: "{{{{ args.n }}}}"}}, reply: noted}}
"""


def survey_responder(body: dict[str, Any]) -> dict[str, Any]:
    """The fake model: "N" calls score(n=N) then thanks; "fail N" calls it, then the model fails
    (HTTP 500, no retries): the turn rolls back after its Detractor was emitted."""
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    n = int(user.split()[-1])
    if body["messages"][-1]["role"] == "tool":
        return {"status": 500, "body": "down"} if user.startswith("fail") else {"text": "Thanks."}
    return {"tool_calls": [{"name": "score", "arguments": {"n": n}}]}


OPENAI_MODEL = "provider: openai, name: gpt-4o-mini, max_retries: 0, stream: false"
