"""Local fakes of the messaging platforms' APIs for the channel tests (no tests here): real
HTTP servers on 127.0.0.1 in a thread, built from the payloads of each platform's public
documentation, recording every call and answering with the status a test sets."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class ApiCall:
    path: str
    body: dict[str, Any]
    status: int


class FakeTelegram:
    """The Bot API: POST /bot<token>/<method> with JSON; answers {"ok": true, "result": ...}
    (or `status` with Telegram's error shape). `calls` are the ones answered 200."""

    def __init__(self, token: str):
        self.token = token
        self.status = 200
        self.seen: list[ApiCall] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = fake.status if self.path.startswith(f"/bot{fake.token}/") else 401
                with fake._lock:
                    fake.seen.append(ApiCall(self.path, json.loads(raw or b"{}"), status))
                body = {"ok": True, "result": {"message_id": len(fake.seen)}} if status == 200 else \
                    {"ok": False, "error_code": status, "description": "Bad Gateway" if status >= 500 else "Unauthorized"}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeTelegram:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def calls(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            return [c.body for c in self.seen if c.status == 200 and c.path.endswith(f"/{method}")]


def telegram_message(update_id: int, text: str, user: int = 42, chat: int | None = None,
                     first_name: str = "Ana", language: str = "en") -> dict[str, Any]:
    """An Update with a text message, as the Bot API documents it."""
    sender = {"id": user, "is_bot": False, "first_name": first_name, "language_code": language}
    return {"update_id": update_id, "message": {
        "message_id": update_id * 10, "date": 1764950400, "text": text, "from": sender,
        "chat": {"id": chat if chat is not None else user, "type": "private", "first_name": first_name}}}


def telegram_press(update_id: int, data: str, user: int = 42, chat: int | None = None) -> dict[str, Any]:
    """An Update with a callback_query: an inline keyboard button pressed."""
    sender = {"id": user, "is_bot": False, "first_name": "Ana"}
    chat_id = chat if chat is not None else user
    return {"update_id": update_id, "callback_query": {
        "id": f"cbq-{update_id}", "from": sender, "chat_instance": "ci-1", "data": data,
        "message": {"message_id": 7, "date": 1764950400, "chat": {"id": chat_id, "type": "private"},
                    "text": "Book it?"}}}
