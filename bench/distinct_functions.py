"""How many distinct Python functions a late turn runs, and how many calls it makes, per kind
(bench/README.md, "How many distinct functions a turn runs"): the in-process harness of
`bench_openai_api.py` (4 conversations of 40 turns, the fake model in its own process), with a
profile hook counting the calls of each code object in turns 31-40.

    python bench/distinct_functions.py                 # floor_eb, http, chat on memory://
    python bench/distinct_functions.py http --files    # and the files with the most distinct functions
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_openai_api import COUNTED  # noqa: E402
from bench_server import free_port, spawn, wait_port  # noqa: E402

TURNS = 40
LATE = 30 * 4 + 1  # the first request of turn 31 (4 conversations)
HOOK = r"""
import collections as _col, json as _json, threading as _t
_calls = _col.Counter(); _turns = [0]
def _prof(frame, event, arg):
    if event == "call": _calls[frame.f_code] += 1
_call0 = call
async def call(app, path, data):
    if path.endswith(("/messages", "/completions")):
        _turns[0] += 1
        if _turns[0] == LATE: sys.setprofile(_prof); _t.setprofile(_prof)
    return await _call0(app, path, data)
def _report():
    sys.setprofile(None)
    rows = [(c.co_filename, c.co_qualname, n) for c, n in _calls.items()]
    _json.dump(rows, open(os.environ["DISTINCT_OUT"], "w"))
""".replace("LATE", str(LATE))


def counted(kind: str, fake_url: str, out: Path) -> list[tuple[str, str, int]]:
    script = COUNTED.replace("async def main(tmp):", HOOK + "\nasync def main(tmp):", 1)
    script = script.replace("    asyncio.run(main(tmp))", "    asyncio.run(main(tmp))\n_report()", 1)
    env = dict(os.environ, OPENAI_BASE_URL=fake_url, OPENAI_API_KEY="bench", PYTHONHASHSEED="0",
               DISTINCT_OUT=str(out), COUNTED_STORE="memory://")
    env.pop("PYTHONPATH", None)
    subprocess.run([sys.executable, "-c", script, str(ROOT / "runner"), str(ROOT / "bench"), kind, str(TURNS)],
                   env=env, check=True)
    return [tuple(row) for row in json.loads(out.read_text())]


def show(kind: str, rows: list[tuple[str, str, int]], files: bool) -> None:
    own = [r for r in rows if "/chatrun/" in r[0] and "/bench/" not in r[0]]
    late = TURNS  # late turns counted: 10 turns of 4 conversations
    print(f"{kind:9} distinct functions {len(rows):5} (chatrun's {len(own):4})  calls a turn "
          f"{sum(r[2] for r in rows) / late:7.0f} (chatrun's {sum(r[2] for r in own) / late:5.0f})  "
          f"files {len({r[0] for r in rows})}")
    if files:
        by_file = collections.Counter(r[0] for r in own)
        for name, count in by_file.most_common(12):
            print(f"    {count:4}  {name.split('/runner/')[-1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kinds", nargs="*", default=["floor_eb", "http", "chat"])
    parser.add_argument("--files", action="store_true", help="chatrun's files with the most distinct functions")
    args = parser.parse_args()
    port = free_port()
    fake = spawn(["-m", "chatrun.testing.fake_openai", "--port", str(port), "--echo"],
                 dict(os.environ, PYTHONPATH=str(ROOT / "runner")))
    try:
        wait_port(port, fake)
        with tempfile.TemporaryDirectory() as tmp:
            for kind in args.kinds:
                show(kind, counted(kind, f"http://127.0.0.1:{port}/v1", Path(tmp) / f"{kind}.json"), args.files)
    finally:
        fake.terminate()
        fake.wait(10)


if __name__ == "__main__":
    main()
