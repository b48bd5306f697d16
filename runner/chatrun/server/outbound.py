"""What one WebSocket connection still has to send: a bounded buffer and one writer task.

Nothing that serves a request ever awaits the client's socket: `put` only appends to the
buffer (a turn holding its session's lock never waits on a client), and one writer task per
connection sends the frames in order, each with a write timeout. A client that does not read
is given up on: when what it was sent has not all gone out for `send_timeout` seconds (the
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
        with contextlib.suppress(BaseException):
            await self._writer

    async def _write(self) -> None:
        while not self.gone.is_set():
            await self._queued.wait()
            self._queued.clear()
            while self._frames and not self.gone.is_set():
                text, size = self._frames[0]
                try:
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the send in a task
                    # of its own, one per frame (a few per turn); a timeout is only a timer.
                    async with asyncio.timeout(self.send_timeout):
                        await self.ws.send_text(text)
                except TimeoutError:
                    self.give_up(f"client not reading: a send did not finish in {self.send_timeout:g} s")
                    return
                except Exception:  # the client left: its turns still complete and are stored
                    self.give_up(None)
                    return
                self._frames.popleft()
                self._bytes -= size
                if not self._frames:
                    self._backlog_since = None
                elif self._stale():
                    return
                if self._bytes <= self.max_bytes // 4:
                    self._room.set()
