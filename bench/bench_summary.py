"""What a 300-turn conversation costs under each memory policy, against sending the full
history, and what the model can still recall at its end.

Reported over the whole run, summarizing calls included: input and output tokens of every
call, money at gpt-4o-mini's list prices ($0.15 input, $0.60 output per million tokens), and
the last turn's prompt (the old headline, a turn with no summarizing call, so flattering).
Targets: `summary` sends >= 60% fewer prompt tokens than the full history at turn 300, with
the last 10 turns always verbatim.

A scripted model answers (user messages of ~25 tokens, replies of ~60, summaries of ~150 plus
the fact codes it keeps); tokens are counted with tiktoken (o200k_base) as the memories count them.

Recall probe: every user message carries a fact code (F17 in turn 17). At the end we check
which codes the last prompt still contains, i.e. what a model could answer about. The scripted
summarizer keeps the codes of what it folds, the newest 40 (about 150 tokens): a perfect but
bounded summarizer, so its figure is an upper bound on what a real model's summary keeps.

    python bench/bench_summary.py [--turns 300]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

import chatrun  # noqa: E402
from chatrun.memory.tokens import tiktoken_counter  # noqa: E402
from chatrun.messages import AssistantMessage, SummaryMessage  # noqa: E402

POLICIES = {
    "full history": "{type: message_window, max_messages: 100000}",
    "message_window 20": "{type: message_window, max_messages: 20}",
    "token_window 2000": "{type: token_window, max_tokens: 2000}",
    "summary 2000, keep 20": "{type: summary, max_tokens: 2000, keep_messages: 20}",
}
USER = "Here is the next detail of my trip plan, number {i} (fact F{i}): I would like a window seat and a vegetarian meal please."
REPLY = ("Noted, detail {i}. I have recorded your preference and will keep it with the booking. Is there anything "
         "else about flights, hotels, transfers or insurance you want me to take care of before we confirm it all?")
SUMMARY = ("The traveller is planning a long trip and keeps adding details one by one: window seats, vegetarian "
           "meals, and questions about flights, hotels, transfers and insurance. Everything so far has been "
           "recorded; nothing is confirmed yet. ") * 3


KEPT_FACTS = 40  # the fact codes a summary holds (about 150 tokens)
PRICE_IN, PRICE_OUT = 0.15, 0.60  # gpt-4o-mini, dollars per million tokens
FACT = re.compile(r"\bF(\d+)\b")


class Answers:
    """Answers every call: a summarizing call gets the summary, the others the turn's reply."""

    def __init__(self) -> None:
        self.requests: list = []
        self.turn = 0

    async def complete(self, request, on_chunk=None):  # the ChatModel protocol
        self.requests.append(request)
        if request.route.endswith("(summary)"):
            facts = sorted({int(f) for m in request.messages for f in FACT.findall(m.text())})[-KEPT_FACTS:]
            text = SUMMARY + "Facts: " + " ".join(f"F{f}" for f in facts)
        else:
            text = REPLY.format(i=self.turn)
        return chatrun.ModelResponse(text=text)


@dataclass
class Run:
    last_prompt: int = 0  # the last turn's prompt tokens
    input: int = 0  # every call's input tokens, summarizing calls included
    output: int = 0
    summary_calls: int = 0
    recalled: int = 0  # facts the last prompt still holds

    @property
    def tokens(self) -> int:
        return self.input + self.output

    @property
    def dollars(self) -> float:
        return (self.input * PRICE_IN + self.output * PRICE_OUT) / 1e6


def run(policy: str, turns: int) -> Run:
    directory = Path(tempfile.mkdtemp())
    (directory / "bot.yaml").write_text(f"name: b\nmodel: {{provider: scripted, name: gpt-4o-mini}}\n"
                                        f"memory: {policy}\nroutes:\n  main: {{default: true, system: You plan trips.}}\n")
    model = Answers()
    session = chatrun.load_bot(directory).session(model=model)
    count = tiktoken_counter(model_name="gpt-4o-mini")
    result = Run()
    for i in range(turns):
        model.turn = i
        before = len(model.requests)
        session.chat(USER.format(i=i))
        calls = model.requests[before:]
        turn_calls = [r for r in calls if not r.route.endswith("(summary)")]
        result.last_prompt = sum(count(m) for r in turn_calls for m in r.messages)
        result.summary_calls += len(calls) - len(turn_calls)
        result.input += sum(count(m) for r in calls for m in r.messages)
        verbatim = [m for m in session.memory() if not isinstance(m, SummaryMessage)]
        if "summary" in policy and i >= 9:
            assert verbatim[-20].content == USER.format(i=i - 9), "the last 10 turns stay verbatim"
    result.output = sum(count(AssistantMessage(SUMMARY if r.route.endswith("(summary)") else REPLY))
                        for r in model.requests)  # about: the replies' numbers differ by a token or so
    last = [r for r in model.requests if not r.route.endswith("(summary)")][-1]
    result.recalled = len({int(f) for m in last.messages for f in FACT.findall(m.text())})
    shutil.rmtree(directory, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300)
    args = parser.parse_args()
    results = {name: run(policy, args.turns) for name, policy in POLICIES.items()}
    full = results["full history"]
    print(f"{args.turns} turns, totals over the whole run (summarizing calls included); "
          f"money at ${PRICE_IN}/${PRICE_OUT} per million input/output tokens; "
          f"recall = facts of the {args.turns} turns the last prompt still holds")
    print(f"  {'policy':24}{'last prompt':>12}{'input':>12}{'output':>10}{'summary calls':>15}"
          f"{'total vs full':>15}{'money vs full':>15}{'recall':>9}")
    for name, r in results.items():
        print(f"  {name:24}{r.last_prompt:>12,}{r.input:>12,}{r.output:>10,}{r.summary_calls:>15}"
              f"{1 - r.tokens / full.tokens:>14.1%} {1 - r.dollars / full.dollars:>14.1%}"
              f"{r.recalled / args.turns:>9.0%}")
    summary = results["summary 2000, keep 20"]
    at_end = 1 - summary.last_prompt / full.last_prompt
    print(f"summary vs full history: {at_end:.1%} fewer prompt tokens at turn {args.turns} (a turn without a "
          f"summarizing call; target >= 60%: {'met' if at_end >= 0.6 else 'MISSED'}), "
          f"{1 - summary.tokens / full.tokens:.1%} fewer tokens and {1 - summary.dollars / full.dollars:.1%} less "
          f"money over the whole run; recalls {summary.recalled} of {args.turns} facts (upper bound, see above) "
          f"against {results['message_window 20'].recalled} for a plain 20-message window; last 10 turns verbatim")


if __name__ == "__main__":
    main()
