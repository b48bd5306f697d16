"""JSON APIs served for real on loopback for the HTTP-tool tests: `LoopbackApi` (the server),
and `OrdersApi`, the API of bots/orders (its README gives the shape)."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ORDERS = {
    "A1001": {"id": "A1001", "status": "shipped", "eta": "2026-12-01",
              "items": [{"name": "Tea", "qty": 2}, {"name": "Mug", "qty": 1}]},
    "C3003": {"id": "C3003", "status": "processing", "eta": None, "items": [{"name": "Kettle", "qty": 1}]},
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up before its reply was written (the timeout tests do so on
        purpose) is no error of the API: say nothing. Anything else is printed as before."""
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class LoopbackApi:
    """A JSON API on a free loopback port, served from a thread: subclasses answer in `handle`."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real API server
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                api.handle(self)

            def do_POST(self) -> None:
                api.handle(self)

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LoopbackApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    @staticmethod
    def reply(h: BaseHTTPRequestHandler, status: int, data: object) -> None:
        raw = json.dumps(data).encode()
        h.send_response(status)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(raw)))
        h.end_headers()
        h.wfile.write(raw)


class OrdersApi(LoopbackApi):
    def __init__(self, token: str = "dev-token") -> None:
        super().__init__()
        self.token = token
        self.orders = json.loads(json.dumps(ORDERS))

    def __enter__(self) -> OrdersApi:
        super().__enter__()
        return self

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("content-length") or 0)
        body = json.loads(h.rfile.read(length) or b"null") if length else None
        self.requests.append({"method": h.command, "path": h.path, "auth": h.headers.get("authorization"),
                              "body": body})
        if h.headers.get("authorization") != f"Bearer {self.token}":
            return self.reply(h, 401, {"error": "bad token"})
        parts = h.path.split("?", 1)[0].strip("/").split("/")
        if parts[:2] != ["v1", "orders"] or len(parts) < 3:
            return self.reply(h, 404, {"error": "not found"})
        order = self.orders.get(parts[2])
        if order is None:
            return self.reply(h, 404, {"error": "no such order"})
        if h.command == "GET" and len(parts) == 3:
            return self.reply(h, 200, order)
        if h.command == "POST" and parts[3:] == ["cancel"]:
            if order["status"] != "processing":
                return self.reply(h, 409, {"error": f"already {order['status']}"})
            order["status"] = "cancelled"
            return self.reply(h, 200, {"id": order["id"], "status": "cancelled"})
        return self.reply(h, 405, {"error": "method not allowed"})
