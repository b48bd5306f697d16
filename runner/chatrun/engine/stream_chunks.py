"""A streamed reply's chunks, sent on as Stream events at most every STREAM_EVERY seconds.

Providers stream a reply in word-sized chunks, often hundreds a second. Each Stream event is a
frame on every door (WebSocket, SSE, `/v1`, AG-UI, a channel's message update) and work on every
client: a 17 KB reply was 1,436 frames, and the page spent more on receiving them than on
showing the reply. Chunks that come within STREAM_EVERY of the last event are joined and sent
together, when that time is up (or when the model's answer ends): the first chunk goes at once,
so the time to the first word is unchanged; a reader sees at most STREAM_EVERY of delay.

A route that streams to Quarkus-dialect clients (`stream_to_quarkus`: Quarkus' Multi<String>) sends
each chunk as it comes: a Multi's items are values of their own on that wire, one frame each.

A client may ask for fewer Stream events (the page redraws a reply at most four times a second, and
each frame costs it CPU to receive): a turn frame's `streamEvery` (chatrun dialect, milliseconds,
docs/protocol.md) sets STREAM_EVERY_NOW for that turn; the server's WebSocket sets it as PLAYING.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from chatrun import events as ev

STREAM_EVERY = 0.05  # seconds: at most 20 Stream events a second per reply
STREAM_EVERY_LIMITS = (0.05, 1.0)  # seconds a client may ask for (a turn frame's streamEvery)
# This turn's interval in seconds when its client asked for one, else None: STREAM_EVERY (the
# engine's turn task inherits it).
STREAM_EVERY_NOW: ContextVar[float | None] = ContextVar("stream_every", default=None)


class StreamBatcher:
    """`send` is what the model calls with each chunk; `close()` sends what is held (after the
    model's answer, before the turn's next event)."""

    def __init__(self, emit: Callable[..., Any], multi: bool) -> None:
        self._emit, self._multi = emit, multi
        self._every = STREAM_EVERY_NOW.get() or STREAM_EVERY
        self._held: list[str] = []
        self._last = -self._every  # when the last event went (time.monotonic())
        self._timer: asyncio.TimerHandle | None = None

    async def send(self, chunk: str) -> None:
        if not chunk:
            return
        self._held.append(chunk)
        wait = self._every - (time.monotonic() - self._last)
        if wait <= 0 or self._multi:
            self._flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(wait, self._flush)

    def close(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            text = "".join(self._held)
            self._held.clear()
            self._last = time.monotonic()
            self._emit(ev.STREAM, text, multi=self._multi)



