"""What guardrails cost a turn (issue 37; goal: ≤ 1 ms for pattern guards).

The cardcare example bot's guardrails (bots/cardcare: PII on four stages, two deny patterns, a
length limit, a route's pattern) judge what one turn passes through them: the user's message,
a tool's result, the model's reply, and the turn's history entry as storage keeps it. Prints
the CPU time per turn (min and median of several rounds), with and without a card number in
the texts.

    python bench/bench_guardrails.py [--turns 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

from chatrun.definition.loader import load_config  # noqa: E402
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


if __name__ == "__main__":
    main()
