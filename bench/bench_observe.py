"""What measuring a turn costs: the engine's observer hooks with Prometheus metrics behind them
(chatrun serve's /metrics) against the same turn unobserved, and the time to render /metrics.

Each turn: a scripted model calls one action tool, then answers (two model calls, one tool
call: the hooks run 2 x model_call, 2 x model_usage, 1 x tool_call). Medians of --turns,
interleaved so both sides see the same machine.

    python bench/bench_observe.py [--turns 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

import chatrun  # noqa: E402
from chatrun.engine import observe  # noqa: E402

BOT = """
name: bench
model: {provider: scripted, name: m}
memory: {type: message_window, max_messages: 8}
routes:
  main: {default: true, system: Hi., tools: [note]}
tools:
  note:
    description: note
    parameters: {type: object, properties: {text: {type: string}}}
    action: {reply: noted}
"""

SCRIPT = [{"tool_calls": [{"name": "note", "arguments": {"text": "x"}}],
           "usage": {"prompt_tokens": 120, "completion_tokens": 8}},
          {"text": "ok", "usage": {"prompt_tokens": 130, "completion_tokens": 2}}]


async def run(turns: int, observer: object) -> tuple[list[float], list[float]]:
    path = Path(tempfile.mkdtemp()) / "bot.yaml"
    path.write_text(BOT)
    bot = chatrun.load_bot(path)
    plain, observed = [], []
    for _ in range(turns):
        for sink, who in ((observed, observer), (plain, None)):
            session = bot.session(model=chatrun.ScriptedModel(list(SCRIPT)))
            started = time.perf_counter()
            with observe.observing(who):
                await session.achat("note it")
            sink.append(time.perf_counter() - started)
    return plain, observed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=3000)
    args = parser.parse_args()
    from chatrun.server import create_app

    path = Path(tempfile.mkdtemp()) / "bot.yaml"
    path.write_text(BOT)
    metrics = create_app([path], "memory://").state.metrics
    if metrics is None:
        sys.exit("prometheus-client is not installed: pip install 'chatrun[metrics]'")
    plain, observed = asyncio.run(run(args.turns, metrics.turn_observer("bench")))
    p, o = statistics.median(plain) * 1e6, statistics.median(observed) * 1e6
    print(f"turns: {args.turns} each side (2 model calls, 1 tool call per turn)")
    print(f"unobserved turn     median {p:8.1f} us")
    print(f"observed turn       median {o:8.1f} us   (+{o - p:.1f} us, {100 * (o - p) / p:+.1f}%)")
    renders = []
    for _ in range(200):
        started = time.perf_counter()
        body = metrics.render()
        renders.append(time.perf_counter() - started)
    print(f"/metrics render     median {statistics.median(renders) * 1e3:8.2f} ms ({len(body)} bytes)")


if __name__ == "__main__":
    main()
