"""Graceful shutdown for `chatrun serve`: one SIGTERM drains, then exits within a bound.

On the first SIGTERM (or SIGINT) the server
  1. stops accepting connections (its listening sockets close; /health and /ready answer 503 to
     requests on open keep-alive connections, so a load balancer takes it out),
  2. refuses new requests on open connections with Failed(Unavailable) / HTTP 503,
  3. lets the turns in flight finish: they commit and their clients get `Completed`,
  4. once none is left, or after `drain_timeout` seconds, closes the remaining connections
     (uvicorn's shutdown, bounded by `close_timeout` seconds) and exits with status 0.
So one SIGTERM exits within drain_timeout + close_timeout (+ about a second); a second
SIGTERM/SIGINT exits at once (turns still running are then not committed: the store keeps
the session as before them, and their request ids were not recorded, so a retry runs them).
"""

from __future__ import annotations

import logging
import socket
import time
from types import FrameType
from typing import Any

import uvicorn

from chatrun.server.listen import ListenOptions, uvicorn_config
from chatrun.server.sessions import SessionRegistry

log = logging.getLogger("chatrun.server")

CLOSE_TIMEOUT = 5.0  # seconds uvicorn may take to close connections after the drain


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, registry: SessionRegistry, drain_timeout: float = 30.0):
        super().__init__(config)
        self.registry = registry
        self.drain_timeout = drain_timeout
        self.drain_started: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in the signal handler: set flags only; on_tick (in the loop) does the work.
        if self.drain_started is None:
            self.drain_started = time.monotonic()
            return
        self.force_exit = True  # a second signal: stop now
        self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started is not None and not self.should_exit:
            if not self.registry.draining:
                self.registry.draining = True
                for server in getattr(self, "servers", []):
                    server.close()  # no new connections; open ones keep going
                log.warning(
                    "draining: %d request(s) in progress; exiting when they end or in %g s",
                    self.registry.in_progress, self.drain_timeout,
                )
            waited = time.monotonic() - self.drain_started
            if self.registry.in_progress == 0 or waited >= self.drain_timeout:
                if self.registry.in_progress:
                    log.warning("drain timeout: %d request(s) still in progress", self.registry.in_progress)
                self.should_exit = True
        return await super().on_tick(counter)


def run(app: Any, host: str, port: int, log_level: str, drain_timeout: float,
        options: ListenOptions | None = None, sockets: list[socket.socket] | None = None) -> None:
    """uvicorn.run(app, ...) with chatrun's listening options (listen.py) and graceful draining
    (see the module's text)."""
    config = uvicorn_config(app, host, port, options or ListenOptions(), log_level=log_level,
                            timeout_graceful_shutdown=CLOSE_TIMEOUT)
    DrainingServer(config, app.state.registry, drain_timeout).run(sockets=sockets)
