"""Start-up and validation time as a user feels it (issue 26): CPU time of whole processes.

Rows: `chatrun --help`, `chatrun validate bots/travel`, and `load_config` of a generated
5,000-route bot (bench_validate.py's generator). Each is a fresh `python` process; its CPU
time (user + system, from the kernel's accounting of the child) is what counts, so a busy
machine slows the wall clock but barely the figures. The floors run in the same rounds:
`python -c "import click"` (the least a click command line can cost) and `python -c pass`.

With `--before DIR/runner` (another checkout's code, e.g. made by
`git archive main runner schemas | tar -x -C DIR`) every row also runs that code, the two
interleaved round by round, so both see the same machine.

    python bench/bench_startup.py [--rounds 5] [--routes 5000] [--big-rounds 3] [--before DIR/runner]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "runner"
sys.path.insert(0, str(REPO / "bench"))

GOALS = {"chatrun --help": 0.15, "chatrun validate bots/travel": 0.25}
BIG_GOAL_S = 1.0

# Times load_config in the child (its import is not counted: the row is validation itself).
BIG = """
import sys, time
from chatrun.cli._gc import collector_paused
from chatrun.definition.loader import load_config
start = time.process_time()
with collector_paused():
    config, _ = load_config(sys.argv[1])
print(time.process_time() - start, len(config.routes))
"""


def child_cpu(args: list[str], runner: Path) -> float:
    """CPU seconds (user + system) of one `python ARGS` run with `runner` first on the path: the
    growth of this process's reaped children's usage (children run one at a time)."""
    env = {**os.environ, "PYTHONPATH": str(runner)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{args} with {runner} failed: {(done.stdout + done.stderr)[-800:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def big_cpu(path: Path, runner: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(runner)}
    done = subprocess.run([sys.executable, "-c", BIG, str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    return float(done.stdout.split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--routes", type=int, default=5000)
    parser.add_argument("--big-rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="the runner/ directory of the code to compare with")
    args = parser.parse_args()
    versions = {"after": RUNNER} | ({"before": args.before.resolve()} if args.before else {})
    rows: dict[str, dict[str, list[float]]] = {}
    commands = {"chatrun --help": ["-m", "chatrun", "--help"],
                "chatrun validate bots/travel": ["-m", "chatrun", "validate", "bots/travel"]}
    floors = {'floor: python -c "import click"': ["-c", "import click"], "floor: python -c pass": ["-c", "pass"]}
    for _ in range(args.rounds):
        for name, argv in commands.items():
            for version, runner in versions.items():
                rows.setdefault(name, {}).setdefault(version, []).append(child_cpu(argv, runner))
        for name, argv in floors.items():
            rows.setdefault(name, {}).setdefault("-", []).append(child_cpu(argv, RUNNER))
    if args.routes:
        from bench_validate import generate

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bot.yaml"
            path.write_text(generate(args.routes))
            name = f"validate a {args.routes:,}-route bot (load_config)"
            for _ in range(args.big_rounds):
                for version, runner in versions.items():
                    rows.setdefault(name, {}).setdefault(version, []).append(big_cpu(path, runner))
    report(rows, args.rounds, args.big_rounds)


def report(rows: dict[str, dict[str, list[float]]], rounds: int, big_rounds: int) -> None:
    print(f"CPU time per process, min / median of {rounds} interleaved rounds ({big_rounds} for the big bot)")
    print(f"{'row':48} {'version':7} {'min':>9} {'median':>9}   goal")
    for name, versions in rows.items():
        goal = GOALS.get(name, BIG_GOAL_S if "route bot" in name else None)
        for version, times in versions.items():
            verdict = ""
            if goal is not None and version == "after":
                verdict = f"<= {goal * 1000:.0f} ms: {'OK' if statistics.median(times) <= goal else 'MISSED'}"
            print(f"{name:48} {version:7} {_ms(min(times)):>9} {_ms(statistics.median(times)):>9}   {verdict}")
    try:
        print(f"machine load average at the end: {open('/proc/loadavg').read().split()[0]}")
    except OSError:
        pass


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


if __name__ == "__main__":
    main()
