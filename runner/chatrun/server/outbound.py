"""What one WebSocket connection still has to send: a bounded buffer and one writer task.

Nothing that serves a request ever awaits the client's socket: `put` only appends to the
buffer (a turn holding its session's lock never waits on a client), and one writer task per
connection sends the frames in order, each with a write timeout. A client that does not read
is given up on: when a send has not finished within `send_timeout` seconds, or when more than
`max_bytes` wait to be sent, the connection is closed (code 1008) and what it had not read
is dropped. Its turns still run to the end and are committed.

The receive loop calls `wait_for_room` before reading the next frame, so a client that sends
without reading (a flood of frames, each answered) stops being read once its replies pile up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from typing import Any

log = logging.getLogger("chatrun.server")

CLOSE_NOT_READING = 1008  # policy violation: the client does not read what it asked for


class Outbound:
    def __init__(self, websocket: Any, max_bytes: int, send_timeout: float):
        self.ws = websocket
        self.max_bytes = max_bytes
        self.send_timeout = send_timeout
        self.gone = asyncio.Event()  # set once the client is given up on (or left)
        self.reason: str | None = None
        self._frames: deque[tuple[str, int]] = deque()
        self._bytes = 0
        self._queued = asyncio.Event()
        self._room = asyncio.Event()  # buffer at most half full: the receive loop may read on
        self._room.set()
        self._writer = asyncio.ensure_future(self._write())

    def put(self, text: str) -> None:
        """Queue one frame (never waits). Over the bound, the client is given up on."""
        if self.gone.is_set():
            return
        try:
            data_size = len(text.encode())
        except UnicodeEncodeError:  # a lone surrogate slipped through: escape it, keep the socket
            text = json.dumps(json.loads(text), ensure_ascii=True)
            data_size = len(text)
        if self._bytes + data_size > self.max_bytes:
            self.give_up(f"client not reading: more than {self.max_bytes} bytes of replies wait to be sent")
            return
        self._frames.append((text, data_size))
        self._bytes += data_size
        self._queued.set()
        if self._bytes > self.max_bytes // 2:
            self._room.clear()

    async def wait_for_room(self) -> bool:
        """Wait until the buffer is at most half full; False when the client is given up on
        (it did not read for `send_timeout` seconds)."""
        if self._room.is_set():
            return not self.gone.is_set()
        try:
            await asyncio.wait_for(self._room.wait(), self.send_timeout)
        except TimeoutError:
            self.give_up(f"client not reading: its replies did not drain in {self.send_timeout:g} s")
        return not self.gone.is_set()

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
        self._room.set()
        self._queued.set()

    async def close(self) -> None:
        """End the writer; close the socket (bounded in time) when the client was given up on."""
        self._writer.cancel()
        with contextlib.suppress(BaseException):
            await self._writer
        if self.reason:
            with contextlib.suppress(Exception):
                # Bounded: a client that does not read may never make room for the close frame
                # either; the server protocol then aborts the connection when the handler ends.
                await asyncio.wait_for(self.ws.close(CLOSE_NOT_READING, self.reason[:120]), 1.0)

    async def _write(self) -> None:
        while not self.gone.is_set():
            await self._queued.wait()
            self._queued.clear()
            while self._frames and not self.gone.is_set():
                text, size = self._frames[0]
                try:
                    await asyncio.wait_for(self.ws.send_text(text), self.send_timeout)
                except TimeoutError:
                    self.give_up(f"client not reading: a send did not finish in {self.send_timeout:g} s")
                    return
                except Exception:  # the client left: its turns still complete and are stored
                    self.give_up(None)
                    return
                self._frames.popleft()
                self._bytes -= size
                if self._bytes <= self.max_bytes // 2:
                    self._room.set()
