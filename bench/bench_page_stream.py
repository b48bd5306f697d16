"""The end-user page's main-thread CPU for a streamed 17 KB reply (issue 35's page budget), this
checkout's page against an older checkout's, interleaved.

What is measured is what tests/test_browser_enduser.py's 17 KB test measures (its reply, its
trace, its sum of the main thread's tasks' thread time from Enter to the end of the turn), but
turn by turn with the page's static files (runner/chatrun/server/static: markdown.js, app.js,
app.css, ...) served from this checkout or from `--before`'s, alternating which goes first, a
fresh browser for each turn; the server and the fake model are this checkout's. `--detail` adds
the trace's own time by event name (median over the turns; more tracing, so larger totals).

    python bench/bench_page_stream.py --before /path/to/main-checkout --rounds 8 [--detail]

Needs Chromium for Playwright (as the browser tests do)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runner"))
sys.path.insert(0, str(ROOT / "tests"))

import chatrun  # noqa: E402
from browser_support import chromium, send  # noqa: E402
from chatrun.server import create_app  # noqa: E402
from chatrun.testing.fake_openai import FakeOpenAI  # noqa: E402
from server_support import ThreadServer  # noqa: E402
from test_browser_enduser import HOTELS, long_reply, main_thread_cpu_ms  # noqa: E402

STATIC = Path("runner/chatrun/server/static")
DETAIL = ["toplevel", "devtools.timeline", "blink"]


def self_times(trace: bytes) -> dict[str, float]:
    """Each event name's own thread time (ms) on the page's main thread: its time less its children's."""
    events = json.loads(trace)["traceEvents"]
    main = {(e["pid"], e["tid"]) for e in events
            if e.get("name") == "thread_name" and e["args"].get("name") == "CrRendererMain"}
    spans = sorted((e for e in events if (e["pid"], e["tid"]) in main and e.get("ph") == "X" and "tdur" in e),
                   key=lambda e: (e["ts"], -e.get("dur", 0)))
    own: dict[str, float] = defaultdict(float)
    stack: list[dict[str, Any]] = []
    for event in spans:
        while stack and stack[-1]["ts"] + stack[-1].get("dur", 0) <= event["ts"]:
            stack.pop()
        if stack:
            own[stack[-1]["name"]] -= event["tdur"] / 1000
        own[event["name"]] += event["tdur"] / 1000
        stack.append(event)
    return own


def turn(url: str, fake: FakeOpenAI, static: Path, detail: bool) -> tuple[float, dict[str, float], int]:
    """One streamed 17 KB turn on a fresh page whose static files come from `static`."""
    text = long_reply()
    chunks = [text[i:i + 12] for i in range(0, len(text), 12)]
    with chromium() as browser:
        page = browser.new_context(viewport={"width": 1280, "height": 860}).new_page()
        page.route("**/_chat/static/**", lambda route: route.fulfill(
            path=str(static / route.request.url.split("/_chat/static/")[1].split("?")[0])))
        page.goto(url + "/chat/hotels")
        page.wait_for_selector("body[data-ready=true]", timeout=10_000)
        fake.queue({"text": "Hello **there**, `code`."})  # the page's first reply: its code is warm
        send(page, "hi")
        fake.queue({"chunks": chunks, "chunk_delay": 0.005})
        page.evaluate("() => { window.turnEnded = new Promise((done) => "
                      "document.addEventListener('chatrun:turn-end', () => done(true), {once: true})); }")
        browser.start_tracing(page=page, categories=DETAIL if detail else ["toplevel"])
        page.fill("#input", "rooms?")
        page.press("#input", "Enter")
        page.evaluate("window.turnEnded.then(() => new Promise((done) => requestAnimationFrame(() => done(true))))")
        trace = browser.stop_tracing()
        redrawn = int(page.evaluate("ChatrunMarkdown.stats.redrawn"))
    return main_thread_cpu_ms(trace), self_times(trace) if detail else {}, redrawn


def report(name: str, costs: list[float], own: dict[str, list[float]]) -> None:
    ordered = sorted(costs)
    print(f"{name}: min {ordered[0]:.1f} ms, median {statistics.median(ordered):.1f}, max {ordered[-1]:.1f}"
          f"  {[round(c) for c in ordered]}")
    for event, values in sorted(own.items(), key=lambda kv: -statistics.median(kv[1]))[:14]:
        print(f"    {statistics.median(values):6.2f}  {event}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="an older checkout (its static files)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--detail", action="store_true", help="time by trace event name too")
    args = parser.parse_args()
    pages = {"before": args.before / STATIC, "this": ROOT / STATIC}
    costs: dict[str, list[float]] = defaultdict(list)
    own: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with tempfile.TemporaryDirectory() as tmp, FakeOpenAI() as fake:
        os.environ.update(OPENAI_BASE_URL=fake.base_url, OPENAI_API_KEY="bench-key")
        (Path(tmp) / "hotels.yaml").write_text(HOTELS)
        app = create_app([chatrun.load_bot(Path(tmp) / "hotels.yaml")], "memory://")
        with ThreadServer(app) as server:
            for round_ in range(args.rounds):
                for name in (["before", "this"] if round_ % 2 == 0 else ["this", "before"]):
                    cost, times, redrawn = turn(server.url, fake, pages[name], args.detail)
                    costs[name].append(cost)
                    for event, ms in times.items():
                        own[name][event].append(ms)
                    print(f"round {round_} {name}: {cost:.1f} ms, {redrawn} redraws, "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
    for name in pages:
        report(name, costs[name], own[name])


if __name__ == "__main__":
    main()
