"""What a declarative HTTP tool costs over a bare httpx call to the same server (target: under 1 ms).

Three measurements against one local JSON server, on one event loop:
  bare     an httpx.AsyncClient GET with the same headers, the response parsed as JSON
  http     a chatrun turn whose (scripted) model calls an `http:` tool once, then answers
  action   the same turn with an action-only tool (no request): the turn's own cost
The added cost of the HTTP tool is  http - action - bare  (rendering the request, building
`result`, redaction, the action's templates). Medians of --calls each, interleaved.

    python bench/bench_http_tool.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

import httpx  # noqa: E402

import chatrun  # noqa: E402

ORDER = json.dumps({"id": "A1001", "status": "shipped", "eta": "2026-12-01",
                    "items": [{"name": "Tea", "qty": 2}]}).encode()

BOT = """
name: bench
model: {provider: scripted, name: m}
memory: {type: message_window, max_messages: 8}
env:
  API_URL: {}
  API_TOKEN: {secret: true}
state: {status: null}
routes:
  main: {default: true, system: "Orders. Last: {{ state.status }}", tools: [get_order, note]}
tools:
  get_order:
    description: Look an order up
    parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id]}
    http:
      url: "{{ env.API_URL }}/v1/orders/{{ args.order_id | urlsegment }}"
      headers: {Authorization: "Bearer {{ env.API_TOKEN }}"}
    action:
      set: {state.status: "{{ result.json.status }}"}
      reply: "{{ result.json.status }}"
  note:
    description: The same turn without a request
    parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id]}
    action:
      set: {state.status: "shipped"}
      reply: "shipped"
"""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stalls

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(ORDER)))
        self.end_headers()
        self.wfile.write(ORDER)


def turn_script(tool: str, calls: int) -> list[dict]:
    script: list[dict] = []
    for _ in range(calls):
        script += [{"tool_calls": [{"name": tool, "arguments": {"order_id": "A1001"}}]}, {"text": "ok"}]
    return script


async def measure(url: str, calls: int) -> dict[str, list[float]]:
    directory = Path(tempfile.mkdtemp())
    (directory / "bot.yaml").write_text(BOT)
    os.environ.update(API_URL=url, API_TOKEN="t0ken")
    bot = chatrun.load_bot(directory)
    http_session = bot.session(model=chatrun.ScriptedModel(turn_script("get_order", calls + 50)))
    action_session = bot.session(model=chatrun.ScriptedModel(turn_script("note", calls + 50)))
    times: dict[str, list[float]] = {"bare": [], "http": [], "action": []}
    async with httpx.AsyncClient() as client:

        async def bare() -> None:
            response = await client.get(f"{url}/v1/orders/A1001", headers={"Authorization": "Bearer t0ken"})
            response.json()

        async def http_turn() -> None:
            await http_session.achat("where is A1001?")

        async def action_turn() -> None:
            await action_session.achat("where is A1001?")

        runs = {"bare": bare, "http": http_turn, "action": action_turn}
        for _ in range(50):  # warm up connections, caches, templates
            for run in runs.values():
                await run()
        for _ in range(calls):
            for name, run in runs.items():
                start = time.perf_counter()
                await run()
                times[name].append(time.perf_counter() - start)
    await bot.tools.aclose()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    times = asyncio.run(measure(url, args.calls))
    server.shutdown()
    med = {name: statistics.median(values) * 1000 for name, values in times.items()}
    added = med["http"] - med["action"] - med["bare"]
    print(f"{args.calls} calls each, medians: bare httpx {med['bare']:.3f} ms, turn with an HTTP tool "
          f"{med['http']:.3f} ms, the same turn without the request {med['action']:.3f} ms")
    print(f"added by chatrun's HTTP tool: {added:.3f} ms per call (target < 1 ms: {'met' if added < 1 else 'MISSED'})")
    try:
        print(f"  machine load average: {open('/proc/loadavg').read().split()[0]}")
    except OSError:
        pass


if __name__ == "__main__":
    main()
