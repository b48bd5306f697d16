"""What issue 32's call guards cost a steady turn: CPU per turn, interleaved against older code.

A steady turn of a conversation whose route's window holds 40 messages, with the scripted model
(which answers at once), in process: a plain turn (one model call) and a tool turn (a call of a
state-writing tool, whose effect is `once` by default, then the answer). The same turns run on
this checkout and on another checkout's code (`--before DIR/runner`, e.g. made by
`git worktree add /tmp/before <commit>`), each round in fresh child processes, alternating
which goes first; each child reports the median CPU time (process_time) of its turns. Printed:
min and median over the rounds, and after/before. Goal (issue 32): the guards cost <= 2% of a
steady turn's CPU.

On a shared machine CPU time is noisy (other work evicts caches); `--instructions` also counts
the instructions of one turn under valgrind's callgrind (PYTHONHASHSEED=0: the same count on
every run, whatever else the machine does; the cyclic GC frozen and off during the counted
turns, address randomization off): the count of 60 turns less that of 10, over 50.

    python bench/bench_guards.py --before /tmp/before/runner [--rounds 7] [--turns 400] [--instructions]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "runner"
# Without address randomization the same run counts the same instructions (within ~0.5%).
SETARCH = ["setarch", "-R"] if shutil.which("setarch") else []

CHILD = r"""
import json, os, statistics, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import chatrun
from chatrun.models.scripted import ScriptedModel
BOT = '''
name: bench
model: {provider: scripted, name: gpt-4o-mini}
memory: {type: message_window, max_messages: 40}
state: {user: Ana, total: 0}
routes:
  main:
    default: true
    system: "You help {{ state.user }}. Total so far: {{ state.total }}"
    tools: [add]
tools:
  add:
    description: Add an amount to the total
    parameters: {type: object, properties: {n: {type: integer}}, required: [n]}
    action: {set: {state.total: "{{ state.total + args.n }}"}}
'''
turns = int(sys.argv[2])
only = sys.argv[3] if len(sys.argv) > 3 else None  # "plain" or "tool": only these turns (instruction counts)
with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "bot.yaml"
    path.write_text(BOT)
    bot = chatrun.load_bot(path)
    model = ScriptedModel()
    session = bot.session(model=model)
    for _ in range(30):  # fill the window
        model.add({"text": "an answer of a few words"})
        session.chat("a question of a few words")
    plain, tool = [], []
    for i in range(40 if only else 0):  # a steady conversation: the window full of both kinds
        model.add({"text": "an answer of a few words"})
        session.chat("a question of a few words")
        model.add({"tool_calls": [{"name": "add", "arguments": {"n": i}}]}, {"text": "added"})
        session.chat("please add")
    if only:  # counting instructions: a collection's cost depends on where it falls, so none in the count
        import gc
        gc.collect()
        gc.freeze()
        gc.disable()
    for i in range(turns):
        if only != "tool":
            model.add({"text": "an answer of a few words"})
            start = time.process_time()
            session.chat("a question of a few words")
            plain.append(time.process_time() - start)
        if only != "plain":
            model.add({"tool_calls": [{"name": "add", "arguments": {"n": i}}]}, {"text": "added"})
            start = time.process_time()
            session.chat("please add")
            tool.append(time.process_time() - start)
if not only:
    print(json.dumps({"plain": statistics.median(plain), "tool": statistics.median(tool)}))
"""


def child(runner: Path, turns: int) -> dict[str, float]:
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": os.environ.get("TIKTOKEN_CACHE_DIR",
                                                             str(REPO.parent / "shared" / "tiktoken"))}
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-c", CHILD, str(runner), str(turns)], capture_output=True,
                         text=True, env=env, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def instructions(runner: Path, kind: str) -> int:
    """Instructions of one `kind` turn: callgrind's count for 60 turns less that for 10, over 50."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "TIKTOKEN_CACHE_DIR": os.environ.get(
        "TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))}
    env.pop("PYTHONPATH", None)
    counts = []
    for turns in (10, 60):
        out = subprocess.run([*SETARCH, "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                              "-c", CHILD, str(runner), str(turns), kind], capture_output=True, text=True, env=env,
                             check=True)
        line = next(x for x in out.stderr.splitlines() if "Collected" in x)
        counts.append(int(line.split()[-1]))
    return (counts[1] - counts[0]) // 50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the runner/ directory of the older code")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--instructions", action="store_true", help="also count instructions (needs valgrind)")
    args = parser.parse_args()
    versions = {"after": RUNNER, "before": args.before.resolve()}
    rows: dict[str, dict[str, list[float]]] = {v: {"plain": [], "tool": []} for v in versions}
    for r in range(args.rounds):
        order = list(versions) if r % 2 == 0 else list(reversed(versions))
        for name in order:
            for kind, value in child(versions[name], args.turns).items():
                rows[name][kind].append(value)
    print(f"steady turn CPU, 40-message window, scripted model; {args.rounds} rounds x {args.turns} turns, "
          "interleaved; per round the median turn")
    print(f"{'turn':>6} {'before min/median':>20} {'after min/median':>20} {'after/before (median)':>22}")
    for kind in ("plain", "tool"):
        b, a = rows["before"][kind], rows["after"][kind]
        ratio = statistics.median(a) / statistics.median(b)
        print(f"{kind:>6} {_ms(min(b))} / {_ms(statistics.median(b))} {_ms(min(a))} / {_ms(statistics.median(a))}"
              f" {ratio:>18.3f}x   goal <= 1.02x")
    if args.instructions:
        print("instructions per turn (callgrind, PYTHONHASHSEED=0)")
        for kind in ("plain", "tool"):
            b, a = instructions(versions["before"], kind), instructions(versions["after"], kind)
            print(f"{kind:>6} before {b:>10,} after {a:>10,}  after/before {a / b:.3f}x   goal <= 1.02x")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.3f} ms"


if __name__ == "__main__":
    main()
