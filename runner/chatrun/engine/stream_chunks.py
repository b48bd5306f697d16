"""A streamed reply's chunks, sent on as Stream events at most every STREAM_EVERY seconds.

Providers stream a reply in word-sized chunks, often hundreds a second. Each Stream event is a
frame on every door (WebSocket, SSE, `/v1`, AG-UI, a channel's message update) and work on every
client: a 17 KB reply was 1,436 frames, and the page spent more on receiving them than on
showing the reply. Chunks that come within STREAM_EVERY of the last event are joined and sent
together, when that time is up (or when the model's answer ends): the first chunk goes at once,
so the time to the first word is unchanged; a reader sees at most STREAM_EVERY of delay.

A route that streams to Quarkus-dialect clients (`stream_to_quarkus`: Quarkus' Multi<String>) sends
each chunk as it comes: a Multi's items are values of their own on that wire, one frame each.

A client may ask for fewer Stream events (each frame costs it CPU to receive): a turn frame's
`streamEvery` (chatrun dialect, docs/protocol.md) sets STREAM_EVERY_NOW for that turn (the server's
WebSocket sets it as PLAYING): milliseconds, or "reader" (READER), the pace of chatrun's page, which
draws each event it receives: four a second while a reply comes at a pace one reads, fewer as it
comes faster. The page's redraw cadence is this rule's, kept here alone: it receives no event it
would not draw.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from chatrun import events as ev


@dataclass(frozen=True)
class Pace:
    """How often a turn's Stream events go: at most every `every` seconds, and less often while the
    reply comes fast: `slower` holds (characters a second above which, seconds between events),
    slowest last."""

    every: float
    slower: tuple[tuple[float, float], ...] = ()

    def next_wait(self, chars: int, seconds: float) -> float:
        """The seconds from the last event to the next, when `chars` characters came in the
        `seconds` since (measured over `every` at least: a burst is no pace)."""
        rate = chars / max(seconds, self.every)
        wait = self.every
        for above, slower in self.slower:
            if rate > above:
                wait = slower
        return wait


# A reply on a page a person reads (streamEvery "reader": chatrun's page, which draws each event):
# four events a second at the pace one reads; every 500 ms over 800 characters a second (some 30
# times reading speed: each redraw costs the browser a frame or two whatever it adds: style, layout,
# paint of a chat that scrolls); every 2 s over 1,600 (some 20 new lines a second: more than a screen
# between two events, so no one reads it as it comes; the page shows it progress). The page's
# 17 KB reply (tests/test_browser_enduser.py) at 2,300 characters a second: 5-6 events, each drawn.
READER = Pace(0.25, ((800.0, 0.5), (1600.0, 2.0)))
STREAM_EVERY = 0.05  # seconds: at most 20 Stream events a second per reply
STREAM_EVERY_LIMITS = (0.05, 1.0)  # seconds a client may ask for (a turn frame's streamEvery)
# This turn's pace when its client asked for one (seconds between events, or a Pace), else None:
# STREAM_EVERY (the engine's turn task inherits it).
STREAM_EVERY_NOW: ContextVar[Pace | float | None] = ContextVar("stream_every", default=None)


class StreamBatcher:
    """`send` is what the model calls with each chunk; `close()` sends what is held (after the
    model's answer, before the turn's next event)."""

    def __init__(self, emit: Callable[..., Any], multi: bool) -> None:
        self._emit, self._multi = emit, multi
        asked = STREAM_EVERY_NOW.get()
        self._pace = asked if isinstance(asked, Pace) else Pace(asked or STREAM_EVERY)
        self._held: list[str] = []
        self._held_chars = 0
        self._lead = ""  # the answer's leading blanks, held until a chunk that is not blank
        self._last = -math.inf  # when the last event went (time.monotonic())
        self._timer: asyncio.TimerHandle | None = None

    async def send(self, chunk: str) -> None:
        if not chunk:
            return
        if not self._held_chars and self._last == -math.inf and not chunk.strip():
            # Blanks that begin an answer wait for its first word: an answer of blanks alone is no
            # reply (engine/turn.py), and no door should show it as one.
            self._lead += chunk
            return
        chunk, self._lead = self._lead + chunk, ""
        self._held.append(chunk)
        self._held_chars += len(chunk)
        if self._multi:
            self._flush()
        elif self._timer is None:
            self._due()

    def close(self) -> None:
        self._flush()

    def _due(self) -> None:
        """Send what is held if its time has come, else come back then. The time is the pace's for
        the characters held over the time since the last event: a fast reply's second event waits
        its 2 s too (not 250 ms, then 2 s), and one that slows down is sent sooner."""
        self._timer = None
        since = time.monotonic() - self._last
        wait = self._pace.next_wait(self._held_chars, since) - since
        if wait <= 0:
            self._flush()
        else:
            self._timer = asyncio.get_running_loop().call_later(wait, self._due)

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            text = "".join(self._held)
            self._held.clear()
            self._held_chars = 0
            self._last = time.monotonic()
            self._emit(ev.STREAM, text, multi=self._multi)
