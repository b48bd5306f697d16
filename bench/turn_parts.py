"""Instructions of one part of a late turn (callgrind), for an attribution that does not move
with the machine's load: where a served turn's instructions go (bench/README.md, "Where the HTTP
turn's instructions go").

The in-process harness of `bench_openai_api.py --instructions` (the ASGI app called directly, 4
conversations of 40 turns, the fake model in its own process), instrumented only for turns 31-40:
a tiny C library (compiled here with the system's valgrind/callgrind.h) issues callgrind's client
requests through ctypes. With PART (`module:Qualified.name`, a function, method, coroutine or
property), collection is on only while the main thread is inside it (awaits included: one request
runs at a time, so what runs meanwhile is its); other threads are always collected (the store's
thread: measure it alone with a PART that never runs). Prints M instructions per late turn.

    python bench/turn_parts.py http                                   # the whole turn
    python bench/turn_parts.py http chatrun.engine.session:Session.achat
    python bench/turn_parts.py floor_eb openai.resources.chat.completions:AsyncCompletions.create
    python bench/turn_parts.py chat --runner /tmp/before/runner      # an older checkout's
    python bench/turn_parts.py chat --store memory://                # on memory://, as count_served.sh serves it
    python bench/turn_parts.py ws chatrun.server.ws:Connection.dispatch   # a WebSocket turn (bench_server.py's)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_openai_api import COUNTED  # noqa: E402
from bench_server import free_port, spawn, wait_port  # noqa: E402

CONTROL = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
void cg_dump(void) { CALLGRIND_DUMP_STATS_AT("late"); CALLGRIND_STOP_INSTRUMENTATION; }
"""

# Put before COUNTED's main(): wraps PART so that the main thread collects only inside it; starts
# instrumenting at turn 31 (COUNTED's gc.freeze marks turn 2; the hook below counts turns).
HOOK = r"""
import asyncio as _a, ctypes as _c, functools as _f, importlib as _i, threading as _t
_cg = _c.CDLL(sys.argv[5]); _part = sys.argv[6] if len(sys.argv) > 6 else ""
_main, _depth, _armed = _t.get_ident(), [0], [False]
def _edge(step):
    if _t.get_ident() != _main: return
    _depth[0] += step
    if _armed[0] and _depth[0] == (1 if step > 0 else 0): _cg.cg_toggle()
def _wrapped(raw):
    @_f.wraps(raw)
    def w(*a, **k):
        _edge(1)
        try: res = raw(*a, **k)
        except BaseException: _edge(-1); raise
        if not _a.iscoroutine(res): _edge(-1); return res
        async def rest():
            try: return await res
            finally: _edge(-1)
        return rest()
    return w
if _part:
    _mod, _path = _part.split(":"); *_owners, _name = _path.split(".")
    _owner = _i.import_module(_mod)
    for _o in _owners: _owner = getattr(_owner, _o)
    _f0 = vars(_owner).get(_name, getattr(_owner, _name)) if isinstance(_owner, type) else getattr(_owner, _name)
    if isinstance(_f0, property): setattr(_owner, _name, property(_wrapped(_f0.fget), _f0.fset, _f0.fdel))
    elif isinstance(_f0, staticmethod): setattr(_owner, _name, staticmethod(_wrapped(_f0.__func__)))
    elif isinstance(_f0, classmethod): setattr(_owner, _name, classmethod(_wrapped(_f0.__func__)))
    else: setattr(_owner, _name, _wrapped(_f0))
_turns, _call0, _frame0 = [0], call, turn_frame
def _turn_begins():
    _turns[0] += 1
    if _turns[0] == 30 * 4 + 1:
        _cg.cg_start()
        _armed[0] = bool(_part)
        if _part and _depth[0] == 0: _cg.cg_toggle()  # collect only inside PART (on now if the turn starts in it)
    elif _turns[0] == 40 * 4 + 1:  # the WebSocket client's closing turn: the late turns end as it arrives
        _armed[0] = False; _cg.cg_dump()
async def call(app, path, data):
    if path.endswith(("/messages", "/completions")):
        _turn_begins()
    return await _call0(app, path, data)
def turn_frame():
    _turn_begins()
    _frame0()
"""


def control_library(tmp: Path) -> Path:
    if not Path("/usr/include/valgrind/callgrind.h").exists() or not shutil.which("gcc"):
        raise SystemExit("turn_parts.py needs valgrind (with valgrind/callgrind.h) and gcc")
    source, library = tmp / "cgctl.c", tmp / "cgctl.so"
    source.write_text(CONTROL)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def instrumented(script: str, anchor: str, replacement: str) -> str:
    """COUNTED with `anchor` replaced; an anchor it no longer has is an error, not a silent
    measure of the whole turn."""
    if anchor not in script:
        raise SystemExit(f"bench_openai_api.COUNTED no longer has {anchor.strip()!r}: update turn_parts.py")
    return script.replace(anchor, replacement, 1)


def part_instructions(kind: str, part: str, runner: Path, env: dict[str, str], tmp: Path,
                      keep: Path | None = None) -> float:
    script = instrumented(COUNTED, "async def main(tmp):", HOOK + "\nasync def main(tmp):")
    script = instrumented(script, "    asyncio.run(main(tmp))", "    asyncio.run(main(tmp))\n_cg.cg_dump()")
    setarch = ["setarch", "-R"] if shutil.which("setarch") else []
    out = subprocess.run([*setarch, "valgrind", "--tool=callgrind", "--instr-atstart=no",
                          f"--callgrind-out-file={tmp}/out.%p", sys.executable, "-c", script, str(runner),
                          str(ROOT / "bench"), kind, "40", str(control_library(tmp)), part],
                         capture_output=True, text=True, env=env, check=True)
    collected = int(next(x for x in out.stderr.splitlines() if "Collected" in x).split()[-1])
    if keep is not None:  # the callgrind outputs, for callgrind_annotate
        keep.mkdir(parents=True, exist_ok=True)
        for dump in tmp.glob("out.*"):
            shutil.copy(dump, keep / f"{kind}.{dump.name}")
    return collected / 40 / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["floor_eb", "http", "chat", "ws_floor_eb", "ws"])
    parser.add_argument("parts", nargs="*", help="module:Qualified.name (none: the whole turn)")
    parser.add_argument("--runner", type=Path, default=ROOT / "runner", help="the runner/ of the checkout to measure")
    parser.add_argument("--store", default="", help="chatrun's store for http and chat (default: SQLite in a temporary folder; memory:// as the served count serves it)")
    parser.add_argument("--keep", type=Path, help="copy callgrind's outputs into this folder (callgrind_annotate)")
    args = parser.parse_args()
    fake_port = free_port()
    fake = spawn(["-m", "chatrun.testing.fake_openai", "--port", str(fake_port), "--echo"],
                 dict(os.environ, PYTHONPATH=str(ROOT / "runner")))
    try:
        wait_port(fake_port, fake)
        env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{fake_port}/v1", OPENAI_API_KEY="bench",
                   PYTHONHASHSEED="0")
        env.pop("PYTHONPATH", None)
        if args.store:
            env["COUNTED_STORE"] = args.store
        env.pop("CHATRUN_AUTH_FILE", None)
        for part in args.parts or [""]:
            with tempfile.TemporaryDirectory() as tmp:
                count = part_instructions(args.kind, part, args.runner, env, Path(tmp), args.keep)
            print(f"{count:8.3f} M  {args.kind} {part or '(the whole late turn)'}", flush=True)
    finally:
        fake.terminate()
        fake.wait(10)


if __name__ == "__main__":
    main()
