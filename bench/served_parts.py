"""CPU of each part of a served turn, by the clock of the thread that runs it: where chatrun's
served HTTP turn spends what floor_eb does not (issue 39).

bench_openai_api.py's servers (floor_eb, and `chatrun serve` on memory://) and its client, with
each named part wrapped in both servers (`--parts` for chatrun's, `--floor-parts` for floor_eb's;
`module:Qualified.name`, a function, method or coroutine) so that its calls add up the CPU their
thread spends inside them (`time.thread_time_ns`, user and kernel; a coroutine's awaits
included: one request runs at a time, so what runs meanwhile is its). The wrappers are installed
by a `sitecustomize` put on the servers' PYTHONPATH; each costs ~1 µs a call. Printed: each
server's CPU a turn (/proc, user and system) and each part's µs a call and calls a turn.

    python bench/served_parts.py
    python bench/served_parts.py --parts chatrun.engine.session:Session.achat,chatrun.engine.turn:Turn.run

Always wrapped, in both: uvicorn's `RequestResponseCycle.run_asgi` (the request, whole),
`RequestResponseCycle.send` (the response's writes), anyio's `SocketStream.send` (the model
request's writes) and openai's `AsyncAPIClient.request` (the model call: the same code in both).
What it showed (bench/README.md, "The served HTTP turn by the thread's clock").
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runner"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_openai_api as api  # noqa: E402
from bench_server import free_port, spawn, wait_port  # noqa: E402

COMMON = ("uvicorn.protocols.http.httptools_impl:RequestResponseCycle.run_asgi",
          "uvicorn.protocols.http.httptools_impl:RequestResponseCycle.send",
          "anyio._backends._asyncio:SocketStream.send",
          "openai._base_client:AsyncAPIClient.request")
CHATRUN_PARTS = ("chatrun.server.http:send_message_direct", "chatrun.engine.session:Session.achat",
                 "chatrun.engine.turn:Turn.run", "chatrun.models.openai_model:create_completion",
                 "chatrun.server.sessions:Holding.__aenter__", "chatrun.server.session_writes:SessionWrites.commit")

# Installed in each server (a sitecustomize on its PYTHONPATH): the wrappers, and signals to
# start counting (SIGUSR2, after the warm-up) and to write the sums (SIGUSR1) to OUT.PID.
SITE = r'''
import functools, importlib, inspect, os, signal, sys, time
_sums = {}
def _add(name, spent):
    entry = _sums.setdefault(name, [0, 0]); entry[0] += spent; entry[1] += 1
def _wrap(spec):
    module, path = spec.split(":"); *owners, attr = path.split(".")
    owner = importlib.import_module(module)
    for name in owners: owner = getattr(owner, name)
    raw = inspect.getattr_static(owner, attr) if isinstance(owner, type) else getattr(owner, attr)
    fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def timed(*a, **k):
            start = time.thread_time_ns()
            try: return await fn(*a, **k)
            finally: _add(spec, time.thread_time_ns() - start)
    else:
        @functools.wraps(fn)
        def timed(*a, **k):
            start = time.thread_time_ns()
            try: return fn(*a, **k)
            finally: _add(spec, time.thread_time_ns() - start)
    setattr(owner, attr, type(raw)(timed) if isinstance(raw, (staticmethod, classmethod)) else timed)
def _write(*_):
    with open(os.environ["SERVED_PARTS_OUT"] + f".{os.getpid()}", "w") as out:
        for name, (spent, calls) in _sums.items():
            out.write(f"{name}\t{spent}\t{calls}\n")
signal.signal(signal.SIGUSR1, _write)
signal.signal(signal.SIGUSR2, lambda *_: _sums.clear())
_command = open("/proc/self/cmdline").read()
_key = "SERVED_PARTS" if "chatrun" in _command and "serve" in _command else "SERVED_FLOOR_PARTS" if "serve-floor" in _command else None
for _spec in filter(None, os.environ.get(_key, "").split(",") if _key else ()):
    try: _wrap(_spec)
    except Exception as exc: print(f"served_parts: cannot wrap {_spec}: {exc}", file=sys.stderr)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(CHATRUN_PARTS), help="chatrun's parts, comma-separated")
    parser.add_argument("--floor-parts", default="", help="floor_eb's parts, comma-separated")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--conversations", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "sitecustomize.py").write_text(SITE)
        out = str(Path(tmp) / "parts")
        fake_port = free_port()
        fake = spawn(["-m", "chatrun.testing.fake_openai", "--port", str(fake_port), "--echo"],
                     dict(os.environ, PYTHONPATH=str(ROOT / "runner")))
        try:
            wait_port(fake_port, fake)
            env = dict(os.environ, OPENAI_BASE_URL=f"http://127.0.0.1:{fake_port}/v1", OPENAI_API_KEY="bench",
                       PYTHONPATH=os.pathsep.join([str(ROOT / "runner"), tmp]), SERVED_PARTS_OUT=out,
                       SERVED_PARTS=",".join([*COMMON, args.parts]),
                       SERVED_FLOOR_PARTS=",".join([*COMMON, args.floor_parts]))
            env.pop("CHATRUN_AUTH_FILE", None)
            servers = api.start_servers(Path(tmp), env, None, ("http",), ("memory",))
            try:
                _measure(servers, args.rounds, args.conversations, out)
            finally:
                for _, proc in servers.values():
                    proc.terminate()
                    proc.wait(10)
        finally:
            fake.terminate()
            fake.wait(10)


def _measure(servers: dict, rounds: int, conversations: int, out: str) -> None:
    kinds = ("floor_eb", "http")
    for kind in kinds:  # warm up, then count from zero
        api.measure(kind, servers[kind][0], servers[kind][1].pid, conversations, 40, -1)
        servers[kind][1].send_signal(signal.SIGUSR2)
    spent = {kind: [0.0, 0.0] for kind in kinds}
    for r in range(rounds):
        for kind in kinds:
            pid = servers[kind][1].pid
            user, system = _ticks(pid)
            api.measure(kind, servers[kind][0], pid, conversations, 40, r)
            after = _ticks(pid)
            spent[kind][0] += after[0] - user
            spent[kind][1] += after[1] - system
    turns = rounds * conversations * 40
    print(f"{rounds} rounds x {conversations} conversations x 40 turns, interleaved; load average "
          f"{open('/proc/loadavg').read().split()[0]}")
    for kind in kinds:
        pid = servers[kind][1].pid
        servers[kind][1].send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        user, system = (ms * 1000 / turns for ms in spent[kind])
        print(f"{kind}: CPU {user + system:.3f} ms a turn (user {user:.3f}, system {system:.3f})")
        for line in sorted(Path(f"{out}.{pid}").read_text().splitlines(), key=lambda s: -int(s.split("\t")[1])):
            name, ns, calls = line.split("\t")
            print(f"  {int(ns) / int(calls) / 1000:8.1f} µs a call  {int(calls) / turns:5.2f} a turn  {name}")


def _ticks(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
