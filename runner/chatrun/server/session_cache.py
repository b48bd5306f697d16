"""The live sessions of this process: a slot per (bot, session id), bounded by count, bytes
(their estimated memory, `live_size`) and idle time (SessionSettings.cache_size, cache_bytes,
cache_idle).

A slot holds the live Session, its TurnBuffer, the stored version it matches and the last
committed turn; `users` counts the requests holding or waiting for it, which are never
evicted. A dropped slot keeps its lock (requests queued on it stay ordered) but no session:
the next request loads the session from the store again.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chatrun.store.buffer import TurnBuffer
from chatrun.store.lease import Lease
from chatrun.store.record import Committed, PackedCommitted, pack_committed, unpack_committed

if TYPE_CHECKING:
    from chatrun.engine.session import Session

SlotKey = tuple[str, str]  # (bot name, session id)


@dataclass(slots=True)  # one per cached session: no __dict__
class Slot:
    # Made when a request uses the slot, dropped when none does (SessionCache.use): an idle
    # slot keeps no lock (about 100 B; issue 26).
    _lock: asyncio.Lock | None = None
    session: Session | None = None
    buffer: TurnBuffer | None = None
    version: str | None = None  # the stored version the live session matches
    _committed: PackedCommitted | Committed | None = None  # the last committed turn (see `committed`), packed
    users: int = 0
    size: int = 0  # bytes counted for this slot in the cache's total
    used: float = field(default_factory=time.monotonic)

    @property
    def committed(self) -> Committed | None:
        """The last committed turn: number, input, requestId, at."""
        return unpack_committed(self._committed)

    @committed.setter
    def committed(self, committed: Committed | None) -> None:
        packed = pack_committed(committed)
        # Mostly the buffer's own (it committed that turn): one tuple for both, not two.
        kept = self.buffer._committed if self.buffer is not None else None
        self._committed = kept if kept is not None and kept == packed else packed

    @property
    def lock(self) -> asyncio.Lock:
        """The lock a request runs the session's turns under."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def locked(self) -> bool:
        return self._lock is not None and self._lock.locked()


@dataclass
class Hold:
    """A slot held by one request, with the lease it holds the session by."""

    slot: Slot
    lease: Lease


# What a live session adds to the server's RSS, measured (bench/bench_memory_bound.py: a real
# `chatrun serve` driven with small, big-state and full-memory sessions; issue 33). A live
# session holds each message's text once (its Message object, the window's entry) and its
# snapshot decoded (state, scopes: the lean TurnBuffer keeps no second copy as text): about
# their JSON size, plus a Python object or dict slot for every JSON value, plus what the
# allocator cannot give back between them, plus the session's fixed parts. Refitted once closed
# WebSockets stopped lingering as garbage (server/listen.py; they had added ~20 MB to every
# server, which the old constants, 4096 / 200 / 100 and one factor of 1.9 for all text, had
# absorbed): at --cache-mb 32 a small session (7 messages, 35 values, 0.9 KB of text) took
# ~4.9 KB, a big-state one (66 KB of state) ~91 KB: 1.3x its state's text, a full-memory one
# (40 messages of 8 KB) ~680 KB: 2.0x its messages' text, the allocator keeping what each
# turn's ~330 KB request leaves between the messages it holds. A decoded value (a key and its
# int, a dict slot) is ~100 B (tests/test_memory_bound.py), and even a new session's snapshot
# has some 30 (its scopes, routes, state), so the per-value count carries most of a small
# session's fixed cost.
LIVE_SESSION_BYTES = 256  # the Session, its scopes, memories, buffer and slot, beyond their values
MESSAGE_BYTES = 50  # a message object and its window entry, whatever its text
VALUE_BYTES = 100  # a decoded JSON value of the snapshot, whatever its text
STATE_TEXT_FACTOR = 1.3  # RSS per byte of the snapshot's text (decoded: strings, numbers)
MEMORY_TEXT_FACTOR = 2.0  # RSS per byte of the memories' text, at the level a full cache settles at


def live_size(buffer: TurnBuffer) -> int:
    """The estimated RSS of the live session `buffer` serves (its memories and snapshot)."""
    return int(LIVE_SESSION_BYTES + MESSAGE_BYTES * buffer.message_count + VALUE_BYTES * buffer.snapshot_values
               + STATE_TEXT_FACTOR * buffer.snapshot_size + MEMORY_TEXT_FACTOR * buffer.memory_size)


@dataclass(frozen=True)
class CacheLimits:
    size: int = 10_000  # live sessions kept at most
    bytes: int = 256 * 2**20  # their estimated memory (live_size) at most
    idle: float = 900.0  # seconds a live session stays cached unused


class SessionCache:
    def __init__(self, limits: CacheLimits):
        self.limits = limits
        self._slots: OrderedDict[SlotKey, Slot] = OrderedDict()
        self._bytes = 0

    @asynccontextmanager
    async def use(self, key: SlotKey) -> AsyncIterator[Slot]:
        """The slot of `key` (made if missing), counted as used until the block ends; then the
        cache forgets an empty slot and evicts what is over its bounds."""
        slot = self.enter(key)
        try:
            yield slot
        finally:
            self.leave(key, slot)

    def enter(self, key: SlotKey) -> Slot:
        """`use`'s entry (for a holder that is not a context manager: sessions.py's Holding);
        `leave` ends it."""
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = Slot()
        slot.users += 1
        return slot

    def leave(self, key: SlotKey, slot: Slot) -> None:
        """The end of a use `enter` began."""
        slot.users -= 1
        slot.used = time.monotonic()
        if slot.users == 0 and not slot.locked():  # no one holds it or waits for it
            slot._lock = None
        self.account(slot)
        if slot.session is None and slot.users == 0 and self._slots.get(key) is slot:
            del self._slots[key]
        self.evict()

    def touch(self, key: SlotKey) -> None:
        """Mark the slot most recently used (evicted last)."""
        self._slots.move_to_end(key)

    def drop(self, slot: Slot) -> None:
        """Forget the slot's live session: the store is the truth, the next request reloads."""
        slot.session = slot.buffer = slot.version = slot.committed = None
        self.account(slot)

    def account(self, slot: Slot) -> None:
        """Count the slot's current size in the cache's total."""
        buffer = slot.buffer
        size = live_size(buffer) if slot.session is not None and buffer is not None else 0
        self._bytes += size - slot.size
        slot.size = size

    def evict(self) -> None:
        """Drop least recently used idle sessions while over the count or byte bound, and every
        session unused for longer than the idle bound (they stay in the store)."""
        limits, now, slots = self.limits, time.monotonic(), self._slots
        # The walk below stops at the first slot within every bound: when the least recently
        # used one is (the common case, after every request), stop before copying the keys.
        oldest = next(iter(slots.values()), None)
        if oldest is None or (len(slots) <= limits.size and self._bytes <= limits.bytes
                              and now - oldest.used <= limits.idle):
            return
        dropped = False
        for key in list(slots):
            slot = self._slots[key]
            over = (
                len(self._slots) > limits.size
                or self._bytes > limits.bytes
                or now - slot.used > limits.idle
            )
            if not over:
                break
            if slot.users == 0 and not slot.locked():
                self.drop(slot)
                del self._slots[key]
                dropped = True
        if dropped:
            release_freed_memory()

    async def sweep_forever(self) -> None:
        """Evict idle sessions even when no request comes."""
        while True:
            await asyncio.sleep(max(0.05, min(30.0, self.limits.idle / 4)))
            self.evict()

    def live_count(self) -> int:
        return sum(1 for s in self._slots.values() if s.session is not None)

    def byte_count(self) -> int:
        return self._bytes

    def bots_in_use(self) -> set[int]:
        return {id(slot.session.bot) for slot in self._slots.values() if slot.session is not None}


# -- giving freed memory back ------------------------------------------------------------------
# A session's messages are larger than Python's small-object arenas, so they live in the C
# allocator's heap; what an evicted session frees there stays in the process (glibc gives back
# only the heap's top), and a full cache's RSS settled at about 1.4x --cache-mb (bench/
# bench_memory_bound.py). malloc_trim returns the free pages within the heap too: at most once
# in TRIM_EVERY seconds, after an eviction.
TRIM_EVERY = 2.0


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        # The process's own symbols (libc among them): no ctypes.util.find_library, which runs
        # `ldconfig -p` in a subprocess at every start.
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
        return trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): the allocator keeps what it keeps
        return None


_MALLOC_TRIM = _find_malloc_trim()
_last_trim = 0.0


def release_freed_memory() -> None:
    """Give the memory evicted sessions freed back to the system (glibc's malloc_trim), at most
    once in TRIM_EVERY seconds."""
    global _last_trim
    now = time.monotonic()
    if _MALLOC_TRIM is None or now - _last_trim < TRIM_EVERY:
        return
    _last_trim = now
    _MALLOC_TRIM(0)
