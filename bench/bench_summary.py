"""Prompt tokens of a 300-turn conversation under each memory policy, against sending the full
history (target: `summary` sends >= 60% fewer prompt tokens than the full history at turn 300,
with the last 10 turns always verbatim).

A scripted model answers (user messages of ~25 tokens, replies of ~60, summaries of ~150);
tokens are counted with tiktoken (o200k_base) as the memories count them, summarizing calls
included for `summary`.

    python bench/bench_summary.py [--turns 300]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

import chatrun  # noqa: E402
from chatrun.memory.tokens import tiktoken_counter  # noqa: E402
from chatrun.messages import SummaryMessage  # noqa: E402

POLICIES = {
    "full history": "{type: message_window, max_messages: 100000}",
    "message_window 20": "{type: message_window, max_messages: 20}",
    "token_window 2000": "{type: token_window, max_tokens: 2000}",
    "summary 2000, keep 20": "{type: summary, max_tokens: 2000, keep_messages: 20}",
}
USER = "Here is the next detail of my trip plan, number {i}: I would like a window seat and a vegetarian meal please."
REPLY = ("Noted, detail {i}. I have recorded your preference and will keep it with the booking. Is there anything "
         "else about flights, hotels, transfers or insurance you want me to take care of before we confirm it all?")
SUMMARY = ("The traveller is planning a long trip and keeps adding details one by one: window seats, vegetarian "
           "meals, and questions about flights, hotels, transfers and insurance. Everything so far has been "
           "recorded; nothing is confirmed yet. ") * 3


class Answers:
    """Answers every call: a summarizing call gets the summary, the others the turn's reply."""

    def __init__(self) -> None:
        self.requests: list = []
        self.turn = 0

    async def complete(self, request, on_chunk=None):  # the ChatModel protocol
        self.requests.append(request)
        text = SUMMARY if request.route.endswith("(summary)") else REPLY.format(i=self.turn)
        return chatrun.ModelResponse(text=text)


def run(policy: str, turns: int) -> list[int]:
    directory = Path(tempfile.mkdtemp())
    (directory / "bot.yaml").write_text(f"name: b\nmodel: {{provider: scripted, name: gpt-4o-mini}}\n"
                                        f"memory: {policy}\nroutes:\n  main: {{default: true, system: You plan trips.}}\n")
    model = Answers()
    session = chatrun.load_bot(directory).session(model=model)
    count = tiktoken_counter(model_name="gpt-4o-mini")
    per_turn = []
    for i in range(turns):
        model.turn = i
        before = len(model.requests)
        session.chat(USER.format(i=i))
        per_turn.append(sum(count(m) for r in model.requests[before:] for m in r.messages))
        verbatim = [m for m in session.memory() if not isinstance(m, SummaryMessage)]
        if "summary" in policy and i >= 9:
            assert verbatim[-20].content == USER.format(i=i - 9), "the last 10 turns stay verbatim"
    return per_turn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    args = parser.parse_args()
    results = {name: run(policy, args.turns) for name, policy in POLICIES.items()}
    full = results["full history"]
    print(f"{args.turns} turns; prompt tokens at the last turn and in total:")
    for name, per_turn in results.items():
        at_end = 1 - per_turn[-1] / full[-1]
        total = 1 - sum(per_turn) / sum(full)
        print(f"  {name:24} last turn {per_turn[-1]:7,}  total {sum(per_turn):11,}  "
              f"({at_end:5.1%} fewer at the last turn, {total:5.1%} fewer in total)")
    reduction = 1 - results["summary 2000, keep 20"][-1] / full[-1]
    print(f"summary vs full history at turn {args.turns}: {reduction:.1%} fewer prompt tokens "
          f"(target >= 60%: {'met' if reduction >= 0.6 else 'MISSED'}), last 10 turns verbatim")


if __name__ == "__main__":
    main()
