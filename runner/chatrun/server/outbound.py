"""What one WebSocket connection still has to send: a bounded buffer and one writer task.

Nothing that serves a request ever awaits the client's socket: `put` only appends to the
buffer (a turn holding its session's lock never waits on a client), and one writer task per
connection sends the frames in order. A client that does not read is given up on: when a send
has not finished in `send_timeout` seconds (one watchdog timer looks at the send in progress,
not a timer per frame), when what it was sent has not all gone out for `send_timeout` seconds (the
buffer has not been empty once in that time: a client that reads drains it at once, one whose
kernel only trickles data in never does), or when more than `max_bytes` wait to be sent, the connection is dropped (no close frame) and what it had not
read is discarded. Its turns still run to the end and are committed.

The receive loop calls `wait_for_room` before reading the next frame, so a client that sends
without reading (a flood of frames, each answered) stops being read once its replies pile up
past half the buffer, until they drain to a quarter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from typing import Any

log = logging.getLogger("chatrun.server")

WATCH_SLACK = 0.001  # seconds: the loop may run a timer this early (its clock's resolution)


class Outbound:
    def __init__(self, websocket: Any, max_bytes: int, send_timeout: float):
        self.ws = websocket
        self.max_bytes = max_bytes
        self.send_timeout = send_timeout
        self.gone = asyncio.Event()  # set once the client is given up on (or left)
        self.reason: str | None = None
        self._frames: deque[tuple[str, int]] = deque()
        self._bytes = 0
        self._backlog_since: float | None = None  # when the buffer last stopped being empty
        self._queued = asyncio.Event()
        # The receive loop may read on: set once the buffer drains to a quarter, cleared when it
        # is over half full. The gap matters: a client whose kernel only trickles data in (a
        # full receive window) drains a frame now and then but never a quarter of the buffer.
        self._room = asyncio.Event()
        self._room.set()
        # The send in progress: when it began (the loop's clock), and the one timer that looks
        # at it (see _watch): no timer per frame.
        self._sending_since: float | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._writer = asyncio.ensure_future(self._write())

    def put(self, text: str) -> None:
        """Queue one frame (never waits). Over the bound, the client is given up on."""
        if self.gone.is_set():
            return
        try:
            # An ASCII frame (most are) is as long in bytes as in
            # characters; str.isascii reads a flag, where encode copies the frame.
            data_size = len(text) if text.isascii() else len(text.encode())
        except UnicodeEncodeError:  # a lone surrogate slipped through: escape it, keep the socket
            text = json.dumps(json.loads(text), ensure_ascii=True)
            data_size = len(text)
        if self._bytes + data_size > self.max_bytes:
            self.give_up(f"client not reading: more than {self.max_bytes} bytes of replies wait to be sent")
            return
        if self._stale():
            return
        if not self._frames:
            self._backlog_since = time.monotonic()
        self._frames.append((text, data_size))
        self._bytes += data_size
        self._queued.set()
        if self._bytes > self.max_bytes // 2:
            self._room.clear()

    async def wait_for_room(self) -> bool:
        """Wait until the buffer has room (see _room); False when the client is given up on
        (its replies did not drain within `send_timeout` seconds)."""
        if self._room.is_set() or self._stale():
            return not self.gone.is_set()
        left = self._backlog_since + self.send_timeout - time.monotonic() if self._backlog_since else 0
        try:
            await asyncio.wait_for(self._room.wait(), max(0.0, left))
        except TimeoutError:
            self._stale()
        return not self.gone.is_set()

    def _stale(self) -> bool:
        """Give up (and say so) when replies have been waiting for more than send_timeout."""
        since = self._backlog_since
        if self._frames and since is not None and time.monotonic() - since > self.send_timeout:
            self.give_up(f"client not reading: its replies have not all gone out for {self.send_timeout:g} s")
        return self.gone.is_set()

    def give_up(self, reason: str | None) -> None:
        """Stop sending: drop what is queued and mark the connection gone. `reason` None means
        the client left on its own."""
        if self.gone.is_set():
            return
        self.reason = reason
        if reason:
            log.warning("closing a WebSocket connection: %s", reason)
        self.gone.set()
        self._stop_watching()
        self._frames.clear()
        self._bytes = 0
        self._backlog_since = None
        self._room.set()
        self._queued.set()

    async def close(self) -> None:
        """End the writer. A client given up on gets no close frame (it would not read it, and
        a closing handshake would wait for its answer): its connection is dropped when the
        handler ends (listen.AbortingWebSocketProtocol aborts one whose buffer is full)."""
        self._writer.cancel()
        self._stop_watching()
        with contextlib.suppress(BaseException):
            await self._writer

    async def _write(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.gone.is_set():
            await self._queued.wait()
            self._queued.clear()
            while self._frames and not self.gone.is_set():
                text, size = self._frames[0]
                # Not a timeout per frame (asyncio.timeout arms and cancels a timer: ~15 µs, a few
                # times a turn): the watchdog looks at the send in progress (_watch).
                self._sending_since = loop.time()
                if self._watchdog is None:
                    self._watchdog = loop.call_at(self._sending_since + self.send_timeout, self._watch)
                try:
                    await self.ws.send_text(text)
                except Exception:  # the client left: its turns still complete and are stored
                    self.give_up(None)
                    return
                finally:
                    self._sending_since = None
                self._frames.popleft()
                self._bytes -= size
                if not self._frames:
                    self._backlog_since = None
                elif self._stale():
                    return
                if self._bytes <= self.max_bytes // 4:
                    self._room.set()

    def _watch(self) -> None:
        """The watchdog's look at the send in progress: one that has taken send_timeout seconds
        gives the client up (and stops the writer); one under it, begun since the watchdog was
        armed, arms it again for its own deadline; no send in progress, no watchdog until the next."""
        self._watchdog = None
        since = self._sending_since
        if since is None or self.gone.is_set():
            return
        loop = asyncio.get_running_loop()
        if since + self.send_timeout <= loop.time() + WATCH_SLACK:
            self.give_up(f"client not reading: a send did not finish in {self.send_timeout:g} s")
            self._writer.cancel()
        else:
            self._watchdog = loop.call_at(since + self.send_timeout, self._watch)

    def _stop_watching(self) -> None:
        if self._watchdog is not None:  # its handle would keep this connection alive until it fires
            self._watchdog.cancel()
            self._watchdog = None
