"""Helpers shared by the server tests (no tests here): the travel bot, a wire-checking
WebSocket reader, and a real uvicorn server in a thread."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from chat_support import call  # noqa: F401  (the server tests' scripted answers, re-exported)

REPO = Path(__file__).resolve().parents[1]
WIRE_SCHEMA = json.loads((REPO / "schemas" / "wire.schema.json").read_text())
_validator = jsonschema.Draft202012Validator(WIRE_SCHEMA)

TRAVEL = """
name: travel
description: Books flights.
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
memory: {type: message_window, max_messages: 20}
state:
  traveller_name: null
routes:
  main_menu:
    default: true
    description: Top-level menu
    system: "You are a travel agent. Help {{ state.traveller_name or 'the user' }}."
    tools: [book_flight, vip_lounge, remember_name]
  flight:
    description: Flight booking wizard
    system: "Reservation so far: {{ scope.reservation | tojson }}"
    scope:
      local: {reservation: {departure: null, destination: null}}
    tools: [set_destination, set_departure, book, cancel]
  lounge:
    description: Staff-only lounge
    roles: [staff]
    system: "Lounge."
    tools: [cancel]
tools:
  book_flight:
    description: Book a flight
    action: {clear_memory: true, push: flight, execute: true, immediate: true}
  vip_lounge:
    description: Enter the lounge
    action: {push: lounge}
  remember_name:
    description: Remember the traveller's name
    parameters: {type: object, properties: {name: {type: string}}, required: [name]}
    action: {set: {state.traveller_name: "{{ args.name }}"}, reply: "Noted"}
  set_destination:
    description: Specify the destination
    parameters: {type: object, properties: {destination: {type: string}}, required: [destination]}
    action:
      set: {scope.reservation.destination: "{{ args.destination }}"}
      emit: {Thinking: "Destination set to {{ args.destination }}"}
  set_departure:
    description: Specify the departure date
    parameters: {type: object, properties: {date: {type: string}}, required: [date]}
    action:
      set: {scope.reservation.departure: "{{ args.date }}"}
      emit: {Thinking: "Departure set to {{ args.date }}"}
  book:
    description: Book the reservation
    requires: [scope.reservation.departure, scope.reservation.destination]
    action:
      pop: true
      message: "Your flight to {{ scope.reservation.destination }} on {{ scope.reservation.departure }} is booked."
      result: "Flight booked"
  cancel:
    description: Abandon
    action: {pop: true}
"""


def write_travel(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "travel.yaml"
    path.write_text(textwrap.dedent(TRAVEL))
    return path


def check_frame(frame: dict) -> dict:
    """Fail the test when a server frame does not match schemas/wire.schema.json."""
    errors = sorted(_validator.iter_errors(frame), key=str)
    assert not errors, f"frame {frame} breaks the wire schema: {errors[0].message}"
    return frame


def until_done(ws: Any) -> list[dict]:
    """Frames of one request up to and including its Completed/Failed (Starlette test socket)."""
    frames = []
    while True:
        frame = check_frame(ws.receive_json())
        frames.append(frame)
        if frame["type"] in ("Completed", "Failed"):
            return frames


async def async_until_done(ws: Any, timeout: float = 10) -> list[dict]:
    """The same for a `websockets` client connection."""
    frames = []
    while True:
        frame = check_frame(json.loads(await asyncio.wait_for(ws.recv(), timeout)))
        frames.append(frame)
        if frame["type"] in ("Completed", "Failed"):
            return frames


def types(frames: list[dict]) -> list[str]:
    """Frame types with runs of Stream chunks folded into one."""
    out: list[str] = []
    for f in frames:
        if f["type"] == "Stream" and out and out[-1] == "Stream":
            continue
        out.append(f["type"])
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    """A real uvicorn server on 127.0.0.1 in a background thread."""

    def __init__(self, app: Any, port: int | None = None, listen: Any = None, log_level: str = "warning"):
        """listen: chatrun.server.listen.ListenOptions to run as `chatrun serve` does."""
        import uvicorn

        self.port = port or free_port()
        if listen is not None:
            from chatrun.server.listen import uvicorn_config

            self.config = uvicorn_config(app, "127.0.0.1", self.port, listen, log_level=log_level, lifespan="off")
        else:
            self.config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level=log_level, lifespan="off")
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def app_for_testclient(*args: Any, **kwargs: Any) -> Any:
    """create_app for Starlette's TestClient, whose requests say `Host: testserver`."""
    from chatrun.server import create_app
    from chatrun.server.guard import LOOPBACK_HOSTS, EdgePolicy

    kwargs.setdefault("edge", EdgePolicy(allowed_hosts=(*LOOPBACK_HOSTS, "testserver")))
    return create_app(*args, **kwargs)


def wait_until(condition, timeout: float = 120, what: str = "condition"):
    """The condition's first true value, polled every 0.05 s; an AssertionError naming `what`
    after `timeout` seconds (a bound for a loaded machine, not a measure of speed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := condition()):
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def start_serve(bot: str, store: str, port: int, fake: Any) -> subprocess.Popen:
    """A real `chatrun serve` of `bot` on `store` at `port`, answered by the fake OpenAI server
    `fake`, once its /health answers (a subprocess a test may kill -9 and start again)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "runner"), env.get("PYTHONPATH")]))
    env["OPENAI_BASE_URL"] = fake.base_url
    env["OPENAI_API_KEY"] = "test-key"
    env.pop("CHATRUN_AUTH_FILE", None)
    cmd = [sys.executable, "-m", "chatrun", "serve", bot, "--port", str(port), "--store", store,
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60  # a loaded 2-core machine starts Python slowly
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"chatrun serve exited: {proc.stdout.read().decode() if proc.stdout else ''}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("chatrun serve did not start in 60 s")
