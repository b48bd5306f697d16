"""`chatrun serve` against hostile clients (issue 13), on loopback, bounded in count and time.

Starts the fake OpenAI server and `chatrun serve` (default options unless given) as processes,
then prints, for each attack, what the server's memory and other clients saw:

1. flood: one WebSocket sends up to 300,000 invalid frames and never reads its replies, while
   another client runs a turn every half second. Figures: server RSS before / peak / after,
   the frames the server took before it stopped reading, whether and when the flooder was
   dropped, the other client's slowest turn. Target: peak within +20 MiB.
2. drip: 200 connections dripping headers and 200 dripping a body, one byte a second.
   Figures: how many are still open after the header and body timeouts, and whether a new
   client is served meanwhile. Target: none left, new clients served.
3. big bodies: four 64 MiB POSTs in parallel. Figures: their status and the RSS growth.

    python bench/soak_hostile.py
    python bench/soak_hostile.py --frames 100000 --send-timeout 5 --drips 100
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(REPO / "bench"))

from bench_server import free_port, rss_mb, wait_port  # noqa: E402

BOT = """
name: soak
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
routes:
  main:
    default: true
    system: "You are a concise assistant."
"""


class Peak:
    """Samples a process's RSS every 0.1 s in a thread; `.peak` is the highest seen."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, rss_mb(pid), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, rss_mb(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def raw_ws(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET /_chat/routes HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    return sock


def masked(text: str) -> bytes:
    payload, mask = text.encode(), os.urandom(4)
    return bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def closed_by_server(sock: socket.socket, within: float = 0.0) -> bool:
    """Has the server closed or reset this connection? Reads (and drops) what it was sent, for
    up to `within` seconds: a closed connection shows its end only after its data."""
    deadline = time.monotonic() + within
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(1 << 20):
                return True
        except TimeoutError:
            return False
        except OSError:
            return True


async def turns_meanwhile(port: int, stop: threading.Event) -> list[float]:
    import websockets

    times = []
    async with websockets.connect(f"ws://127.0.0.1:{port}/_chat/routes") as ws:
        await ws.send(json.dumps({"type": "Connect", "chatId": "bystander"}))
        await ws.recv()
        while not stop.is_set():
            start = time.monotonic()
            await ws.send(json.dumps({"type": "ChatRouteMessage", "chatId": "bystander", "data": {"userMessage": "hi"}}))
            while json.loads(await asyncio.wait_for(ws.recv(), 60))["type"] not in ("Completed", "Failed"):
                pass
            times.append(time.monotonic() - start)
            await asyncio.sleep(0.5)
    return times


def flood(port: int, pid: int, frames: int, send_timeout: float) -> None:
    base = rss_mb(pid)
    peak = Peak(pid)
    stop = threading.Event()
    result: list[list[float]] = []
    bystander = threading.Thread(target=lambda: result.append(asyncio.run(turns_meanwhile(port, stop))))
    bystander.start()
    sock = raw_ws(port)
    sock.settimeout(2)
    frame = masked('{"type": "Nope", "chatId": "x"}')
    sent = 0
    try:
        for _ in range(frames):
            sock.sendall(frame)
            sent += 1
    except OSError:
        pass  # the server stopped reading (back-pressure) or dropped us
    # Read nothing for a while (reading would make it a client that reads), then see whether the
    # server has dropped it: its end comes after whatever was still in flight to it.
    time.sleep(send_timeout + 5)
    dropped = closed_by_server(sock, within=30)
    stop.set()
    bystander.join(120)
    sock.close()
    time.sleep(1)
    top = peak.stop()
    slowest = max(result[0]) if result and result[0] else float("nan")
    print(f"flood: sent {sent:,} of {frames:,} invalid frames without reading before the server stopped taking them")
    print(f"  server RSS {base:.0f} MiB before, peak {top:.0f} MiB (+{top - base:.1f} MiB), {rss_mb(pid):.0f} MiB after")
    print(f"  flooder dropped by the server within {send_timeout + 5:g} s of not reading: {'yes' if dropped else 'NO'}; "
          f"bystander: {len(result[0]) if result else 0} turns, slowest {slowest:.2f} s")


def drip(port: int, count: int, wait: float) -> None:
    socks = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port))
        if i % 2:
            s.sendall(b"POST /bots/soak/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{")
        else:
            s.sendall(b"GET /health HTTP/1.1\r\n")
        socks.append(s)
    started = time.monotonic()
    served = []
    while time.monotonic() - started < wait:
        for s in socks:
            try:
                s.send(b" ")
            except OSError:
                pass
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                served.append(c.recv(12).endswith(b"200"))
        except OSError:
            served.append(False)
        time.sleep(1)
    still_open = sum(not closed_by_server(s, within=0.05) for s in socks)
    for s in socks:
        s.close()
    print(f"drip: {count} connections dripping headers/bodies a byte a second; after {wait:.0f} s "
          f"{still_open} still open; new clients served {sum(served)} of {len(served)} times meanwhile")


def big_bodies(port: int, pid: int, size_mib: int, parallel: int) -> None:
    base = rss_mb(pid)
    peak = Peak(pid)
    statuses: list[str] = []

    def post() -> None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"POST /bots/soak/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          + f"Content-Length: {size_mib << 20}\r\n\r\n".encode())
                chunk = b" " * (1 << 20)
                try:
                    for _ in range(size_mib):
                        s.sendall(chunk)
                except OSError:
                    pass  # refused and closed before the body was sent
                statuses.append(s.recv(12).decode(errors="replace")[9:12] or "closed")
        except OSError as exc:
            statuses.append(type(exc).__name__)

    threads = [threading.Thread(target=post) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    time.sleep(0.5)
    top = peak.stop()
    print(f"big bodies: {parallel} x {size_mib} MiB POSTs answered {sorted(statuses)}; "
          f"server RSS +{top - base:.1f} MiB at peak")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=300_000)
    parser.add_argument("--drips", type=int, default=400)
    parser.add_argument("--send-timeout", type=float, default=20.0, help="passed to chatrun serve")
    parser.add_argument("--header-timeout", type=float, default=10.0, help="passed to chatrun serve")
    parser.add_argument("--body-timeout", type=float, default=30.0, help="passed to chatrun serve")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bot = Path(tmp) / "soak.yaml"
        bot.write_text(BOT)
        fake_port, port = free_port(), free_port()
        env = dict(os.environ, OPENAI_API_KEY="soak", OPENAI_BASE_URL=f"http://127.0.0.1:{fake_port}/v1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "runner"), env.get("PYTHONPATH")]))
        env.pop("CHATRUN_AUTH_FILE", None)
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        fake = subprocess.Popen([sys.executable, "-m", "chatrun.testing.fake_openai", "--port", str(fake_port),
                                 "--echo", "--delay", "0.05"], env=env, **quiet)
        server = subprocess.Popen([sys.executable, "-m", "chatrun", "serve", str(bot), "--port", str(port),
                                   "--store", "memory://", "--log-level", "error",
                                   "--send-timeout", str(args.send_timeout), "--header-timeout", str(args.header_timeout),
                                   "--body-timeout", str(args.body_timeout)], env=env, **quiet)
        try:
            wait_port(fake_port, fake)
            wait_port(port, server)
            asyncio.run(warm(port))
            flood(port, server.pid, args.frames, args.send_timeout)
            drip(port, args.drips, max(args.header_timeout, args.body_timeout) + 5)
            big_bodies(port, server.pid, 64, 4)
        finally:
            for proc in (server, fake):
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()


async def warm(port: int) -> None:
    stop = threading.Event()
    stop.set()
    await turns_meanwhile(port, stop)


if __name__ == "__main__":
    main()
