"""A steady in-process turn: one library session, turn after turn, against the bare SDK floors.

CPU time of this process per turn (the fake OpenAI model answers from its own process, no
delay) once the conversation is steady: the route's window (20 messages) is full, the model
client, the templates and the caches are warm. Contenders, interleaved round by round, each on
its own event loop that stays up for the whole run:

- floor: one AsyncOpenAI client sending the system prompt, the last 20 messages and the user's
  message as the SDK's `messages=` (which the SDK re-walks against its TypedDicts);
- floor_eb: the same passed the way chatrun does (`extra_body`): the real minimum;
- chatrun: `await session.achat(text)` on a bot with the same prompt and window, on the
  `openai` provider.

The table shows the min and the median over rounds of the per-round mean CPU per turn, and the
median's ratio to floor_eb's from the same run. Goal (issue 39): chatrun <= 1.3x floor_eb.
`--runner DIR` measures another checkout's code (e.g. `git archive <commit> runner | tar -x -C DIR/..`).

Figures (issue 39; 2-core machine shared with other agents, load average 4-5; 5 rounds x 150
turns, two runs each, median x floor_eb): before (main at 7aabd1b) 1.48 and 1.57; after 1.36 and
1.42 (floor_eb 1.4-1.7 ms, chatrun 2.0-2.3 ms median; goal <= 1.3x not met).
Engine turn cost (2026-12-06, load average 7.2-7.9, 7 rounds x 200 turns, after and before run
alternately, twice): before (main at e062a16) chatrun min/median 1.556/2.347 and 2.485/2.746 ms,
1.38x and 1.38x floor_eb (1.341/1.697, 1.777/1.995); after 1.345/1.962 and 1.871/2.234 ms, 1.08x
and 1.26x floor_eb (1.083/1.810, 1.220/1.777): goal <= 1.3x met in both runs (in five of six
runs over the session's three sets at load 4-8; an earlier step measured 1.40 once).

    python bench/bench_steady.py                  # 7 rounds of 200 turns
    python bench/bench_steady.py --rounds 9 --turns 300 --runner /tmp/before/runner
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))

SYSTEM = "You are a concise assistant."
WINDOW = 20
TEXT = "Tell me something about the weather in Lisbon."
ANSWER = "Sure, happy to help with that."
BOT = f"""
name: bench
model: {{provider: openai, name: gpt-4o-mini, max_retries: 0, timeout: 120, stream: false}}
memory: {{type: message_window, max_messages: {WINDOW}}}
routes:
  main:
    default: true
    system: "{SYSTEM}"
"""

Turn = Callable[[], Awaitable[None]]


def floor_turn(extra_body: bool) -> Turn:
    import openai

    from chatrun.models.openai_model import shared_ssl_context

    client = openai.AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="bench", max_retries=0,
                                http_client=openai.DefaultAsyncHttpxClient(verify=shared_ssl_context()))
    window: list[dict[str, str]] = []

    async def turn() -> None:
        window.append({"role": "user", "content": TEXT})
        messages = [{"role": "system", "content": SYSTEM}, *window[-WINDOW:]]
        if extra_body:
            answer = await client.chat.completions.create(model="gpt-4o-mini", messages=[],
                                                          extra_body={"messages": messages})
        else:
            answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)  # type: ignore[arg-type]
        window.append({"role": "assistant", "content": answer.choices[0].message.content or ""})
        del window[:-WINDOW]

    return turn


def chatrun_turn(bot_path: Path) -> Turn:
    import chatrun

    session = chatrun.load_bot(bot_path).session()

    async def turn() -> None:
        events = await session.achat(TEXT)
        assert any(e.type == "Message" for e in events), events

    return turn


async def measure(turn: Turn, turns: int) -> float:
    """Mean CPU seconds of this process per turn."""
    start = time.process_time()
    for _ in range(turns):
        await turn()
    return (time.process_time() - start) / turns


async def run(bot_path: Path, rounds: int, turns: int) -> dict[str, list[float]]:
    contenders = {"floor": floor_turn(False), "floor_eb": floor_turn(True), "chatrun": chatrun_turn(bot_path)}
    for turn in contenders.values():  # steady: the window full, everything warm
        for _ in range(WINDOW):
            await turn()
    results: dict[str, list[float]] = {name: [] for name in contenders}
    for number in range(rounds):
        order = list(contenders.items())
        for name, turn in order if number % 2 == 0 else reversed(order):
            results[name].append(await measure(turn, turns))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--turns", type=int, default=200, help="turns per contender per round")
    parser.add_argument("--runner", type=Path, default=REPO / "runner", help="the checkout's runner/ to measure")
    args = parser.parse_args()
    from bench_server import free_port, wait_port  # (it puts this checkout's runner/ first)

    sys.path.insert(0, str(args.runner.resolve()))

    port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "chatrun.testing.fake_openai", "--port", str(port), "--text", ANSWER],
                            env=dict(os.environ, PYTHONPATH=str(REPO / "runner")), stdout=subprocess.DEVNULL)
    try:
        wait_port(port, fake)
        os.environ.update(OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1", OPENAI_API_KEY="bench")
        with tempfile.TemporaryDirectory() as tmp:
            bot_path = Path(tmp) / "bot.yaml"
            bot_path.write_text(BOT)
            results = asyncio.run(run(bot_path, args.rounds, args.turns))
    finally:
        fake.terminate()
        fake.wait(10)
    floor_eb = statistics.median(results["floor_eb"])
    import chatrun
    print(f"steady in-process turn ({WINDOW}-message window): CPU ms per turn, {args.rounds} rounds x {args.turns} "
          f"turns, interleaved; chatrun from {Path(chatrun.__file__).parent}; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'contender':<10}{'min':>9}{'median':>9}{'x floor_eb':>12}")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:<10}{min(values) * 1000:>9.3f}{median * 1000:>9.3f}{median / floor_eb:>12.2f}")
    print("goal: chatrun <= 1.3x floor_eb")


if __name__ == "__main__":
    main()
