"""What guardrails cost a turn (issue 37; goal: ≤ 1 ms for pattern guards).

The cardcare example bot's guardrails (bots/cardcare: PII on four stages, two deny patterns, a
length limit, a route's pattern) judge what one turn passes through them: the user's message,
a tool's result, the model's reply, and the turn's history entry as storage keeps it. Prints
the CPU time per turn (min and median of several rounds), with and without a card number in
the texts. Then the whole-text kinds: a `languages:` guard on the input and the reply (CPU per
turn, py3langid, after its one-off model load), and a `moderation:` guard's round trip to
`/moderations` through the real `openai` client (wall time per call, against the local fake
endpoint: a floor, a provider adds its own latency; a turn moderating input and output pays two).

    python bench/bench_guardrails.py [--turns 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

from chatrun.definition.config import GuardrailConfig, ModelConfig  # noqa: E402
from chatrun.definition.loader import load_config  # noqa: E402
from chatrun.engine import language_id  # noqa: E402
from chatrun.engine.guardrails import judge, map_strings, stage_guards, storage_redactor  # noqa: E402

BOT = Path(__file__).resolve().parents[1] / "bots" / "cardcare"
USER = "Hello, I lost my card yesterday in Zurich, can you block it please? It is the blue one."
TOOL = "Card ending 0002: active since 2024-03-01; limit 5000 CHF; last use 2026-12-01 at a shop."
REPLY = ("I am sorry to hear that. I have blocked your card ending 0002. A new card will reach you "
         "within five working days; you can keep using Apple Pay until then. Anything else?")
CARD = " My card is 4111 1111 1111 1111."


def one_turn(guards: tuple, card: str) -> None:
    judge(guards, "input", USER + card)
    judge(guards, "tool_result", TOOL)
    judge(guards, "output", REPLY + card)
    entry = {"input": USER + card, "events": [{"type": "Message", "data": REPLY}],
             "calls": [{"tool": "card_status", "reply": TOOL}], "model": [{"text": REPLY}]}
    map_strings(entry, storage_redactor(stage_guards(guards, "storage")))


def per_turn(guards: tuple, card: str, turns: int, rounds: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(turns):
            one_turn(guards, card)
        times.append((time.process_time() - started) / turns * 1000)
    return min(times), statistics.median(times)


def language_turns(turns: int, rounds: int) -> tuple[float, float]:
    """CPU per turn of a `languages: [en]` guard on the input and the reply."""
    guards = (GuardrailConfig("english", "language", ("input", "output"), "block", languages=("en",)),)
    started = time.perf_counter()
    language_id.refused(USER, ("en",))  # the model loads once per process
    print(f"languages: py3langid's model loads in {(time.perf_counter() - started) * 1000:.0f} ms (once per process)")
    times = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(turns):
            judge(guards, "input", USER)
            judge(guards, "output", REPLY)
        times.append((time.process_time() - started) / turns * 1000)
    return min(times), statistics.median(times)


def moderation_calls(calls: int) -> tuple[float, float]:
    """Wall time of one `/moderations` call through the real openai client, to the local fake."""
    import asyncio

    from chatrun.models.openai_model import OpenAIModel
    from chatrun.testing.fake_openai import FakeOpenAI

    async def run(base_url: str) -> list[float]:
        model, config, times = OpenAIModel(api_key="bench"), ModelConfig(base_url=base_url), []
        await model.moderate(config, "omni-moderation-latest", USER)  # the connection is made once
        for _ in range(calls):
            started = time.perf_counter()
            await model.moderate(config, "omni-moderation-latest", USER)
            times.append((time.perf_counter() - started) * 1000)
        await model.aclose()
        return times

    with FakeOpenAI() as fake:
        times = asyncio.run(run(fake.base_url))
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    config, _ = load_config(BOT)
    guards = config.route_guardrails("desk")
    one_turn(guards, CARD)  # compile the patterns once, as a server does
    for label, card in (("clean texts", ""), ("a card number in input and output", CARD)):
        low, mid = per_turn(guards, card, args.turns, args.rounds)
        print(f"{len(guards)} guardrails, {label}: {low:.3f} ms per turn (median {mid:.3f}); goal ≤ 1 ms")
    low, mid = language_turns(max(args.turns // 10, 10), args.rounds)
    print(f"a languages guard on input and output: {low:.3f} ms of CPU per turn (median {mid:.3f})")
    low, mid = moderation_calls(max(args.turns // 20, 10))
    print(f"a moderation call to a local endpoint: {low:.2f} ms per call (median {mid:.2f}); "
          "one per moderated stage, one per window of a streamed reply")


if __name__ == "__main__":
    main()
