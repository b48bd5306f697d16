"""One turn of a held session, run once: its events, then its commit.

A request id (a string requestId on the WebSocket, Idempotency-Key over HTTP) is recorded
with the turn it committed (the store's outcome); a retry of it replays the recorded events
instead of running again. The client's Completed comes after the commit: Completed means
committed. Each turn is reported (logged and counted) by a TurnReport.

This is where a turn's events leave the engine toward every client of the server: only the
user's events go on (audience.for_clients); the others are in the history, with their audience.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from chatrun.errors import SessionError
from chatrun.events import PENDING, RESOLVED, Event
from chatrun.server import user_budgets, wire
from chatrun.server.audience import for_clients
from chatrun.server.session_cache import Hold
from chatrun.server.session_writes import SessionWrites
from chatrun.server.turnlog import CONFLICT, ERROR, REFUSED, TurnReport
from chatrun.store.aio import AsyncStore
from chatrun.store.buffer import TurnBuffer
from chatrun.store.record import Commit

if TYPE_CHECKING:
    from chatrun.engine.session import Session

log = logging.getLogger("chatrun.server")

MAX_REQUEST_ID = 200  # characters of an idempotency key (each session keeps its last 1,000)


def request_asks(message: Any) -> str:
    """The hash of what a request asks (a message's text and data, a decision and its fields),
    kept with its outcome: an Idempotency-Key sent again with another request is refused
    (KEY_REUSED) instead of replaying the answer to the first."""
    shown: Any = message
    if dataclasses.is_dataclass(message) and not isinstance(message, type):  # a decision (Approve, Answer, ...)
        shown = {type(message).__name__: dataclasses.asdict(message)}
    text = json.dumps(shown, sort_keys=True, ensure_ascii=False, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def check_request_id(request_id: str | None) -> None:
    if request_id is not None and not 0 < len(request_id) <= MAX_REQUEST_ID:
        raise wire.RequestFailed(
            wire.BAD_REQUEST,
            f"a request id (string requestId, Idempotency-Key) has 1 to {MAX_REQUEST_ID} characters, "
            f"not {len(request_id)}",
        )


class TurnRun:
    """One turn's events (async iteration). `replayed`: a retry of a committed request,
    whose recorded events are sent again and nothing runs; `turn`: the turn's number; `entry`:
    its history entry once iterated (ok, usage, ...; the recorded one for a replay)."""

    def __init__(self, session: Session, message: Any, request_id: str | None, hold: Callable[[], Hold],
                 store: AsyncStore, writes: SessionWrites, report: Callable[[], TurnReport], whole: bool = False,
                 asks: str | None = None):
        """hold: the session's hold (looked up when the turn starts); report: a new TurnReport;
        whole: the events are used only once the turn has ended (a JSON reply), so the turn runs
        in the caller's task (Session.achat), without a task and a queue of its own (issue 39);
        asks: what the request asks (request_asks), kept with its outcome and compared with a
        replayed one's (the HTTP API's Idempotency-Key; None: not kept, not compared)."""
        self._session, self._message, self.request_id, self._whole = session, message, request_id, whole
        self._asks = asks
        self._hold_of, self._store, self._writes, self._report = hold, store, writes, report
        self.replayed = False
        self.turn = 0
        self.entry: dict[str, Any] = {}
        self._recorded: dict[str, Any] | None = None
        self._looked_up = request_id is None
        self._written: Commit | None = None  # the commit written when the turn ended

    def reopened(self) -> list[Event]:
        """The user's Pending events a stopped turn announced again (engine/session.py,
        `_reopened`: each item it resolved waits again once it is rolled back), from its record,
        for a client still connected to read before its Stopped; [] for any other turn."""
        events = self.entry.get("events") if self.entry.get("error") == "cancelled" else None
        if not isinstance(events, list):
            return []
        resolved: set[Any] = set()
        out = []
        for item in events:
            data = item.get("data") if isinstance(item, dict) else None
            if not isinstance(data, dict):
                continue
            if item["type"] == RESOLVED:
                resolved.add(data.get("id"))
            elif item["type"] == PENDING and data.get("id") in resolved:
                event = Event.from_dict(item)
                if for_clients(event):
                    out.append(event)
        return out

    def committed_snapshot(self) -> str | None:
        """The session's snapshot as the commit at the turn's end encoded it (the engine's,
        without the committed turn: to_json's text), for a caller that records the session
        right after the turn (the /v1 index); None when nothing was committed or it is not known."""
        written = self._written
        if written is None or written.turn != self.turn or self.turn != self._session.turn_count:
            return None
        return written.engine_snapshot_json()

    async def is_replay(self) -> bool:
        """Whether this request id already committed a turn (then iterating replays it). Checks
        that apply to new turns only (the scope the client names) are skipped for a replay."""
        if not self._looked_up:
            self._recorded = await self._store.get_outcome(self._session.id, self.request_id or "")
            self._looked_up = True
        asked = (self._recorded or {}).get("asks")
        if self._asks is not None and asked is not None and asked != self._asks:
            # Not a retry: another request under a committed one's key (an outcome kept before
            # chatrun kept what it asked has no `asks`, and is replayed as before).
            raise wire.RequestFailed(wire.KEY_REUSED, f"the idempotency key {self.request_id!r} (Idempotency-Key, "
                                     "string requestId) was used for another request to this session; send a new "
                                     "key for a new request")
        return self._recorded is not None

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        if self._whole:  # nobody reads the events before the turn ends: the whole turn, then them
            for event in await self.events():
                yield event
            return
        hold = self._hold_of()
        report = self._report()
        try:
            if await self.is_replay():
                for event in self._replay(report):
                    if for_clients(event):
                        yield event
                return
            async for event in self._run(hold, report):
                if for_clients(event):  # the one filter every client's events pass
                    yield event
        except BaseException as exc:
            _reraise(report, exc)
        finally:
            report.finish()

    async def events(self) -> list[Event]:
        """The turn's events at once, once it has ended (`whole`: a JSON reply): what iterating
        gives, in the caller's coroutine, without the two async generators (~0.02 M
        instructions of a served turn: bench/README.md, "The HTTP turn, third pass")."""
        hold = self._hold_of()
        report = self._report()
        try:
            if await self.is_replay():
                return [event for event in self._replay(report) if for_clients(event)]
            return [event for event in await self._run_whole(hold, report) if for_clients(event)]
        except BaseException as exc:
            _reraise(report, exc)
        finally:
            report.finish()

    def _replay(self, report: TurnReport) -> Iterator[Event]:
        recorded = self._recorded or {}
        self.replayed, self.turn, self.entry = True, recorded.get("turn", 0), recorded
        report.replayed(recorded)
        for item in recorded.get("events", []):
            yield Event.from_dict(item)

    async def _run(self, hold: Hold, report: TurnReport) -> AsyncIterator[Event]:
        session, buffer, number = self._begin(hold)
        if session.bot.config.limits.has_user_budget:  # one read of the store, only on such bots
            await user_budgets.read_spent(self._store, session)
        try:
            with report.observing():
                async for event in session.stream(self._message):
                    report.saw(event)
                    yield event
        except asyncio.CancelledError:  # stopped: the engine rolled the turn back; its record is kept
            await self._keep_stopped(session, hold, number, report)
            raise
        finally:
            buffer.request_id = None
        await self._ran(hold, report)

    async def _run_whole(self, hold: Hold, report: TurnReport) -> list[Event]:
        """`_run` of a whole turn (Session.achat), as a coroutine: its events once it has ended."""
        session, buffer, number = self._begin(hold)
        if session.bot.config.limits.has_user_budget:
            await user_budgets.read_spent(self._store, session)
        try:
            with report.observing():
                events = await session.achat(self._message)
                for event in events:
                    report.saw(event)
        except asyncio.CancelledError:  # stopped: the engine rolled the turn back; its record is kept
            await self._keep_stopped(session, hold, number, report)
            raise
        finally:
            buffer.request_id = None
        await self._ran(hold, report)
        return events

    async def notice(self, text: str, why: str) -> None:
        """Answer the request with a notice instead of its turn (Session.notice: a channel's
        message refused before any turn ran), committed with the request id as its outcome, in
        the one commit: a retry finds it (`is_replay`), replays it and tells nothing again,
        whenever the process died. RequestFailed when the commit cannot land."""
        hold = self._hold_of()
        session, buffer, _ = self._begin(hold)
        try:
            session.notice(text, why)
        finally:
            buffer.request_id = None
        self._written = await self._writes.commit(hold.slot, session.id, hold.lease)

    def _begin(self, hold: Hold) -> tuple[Session, TurnBuffer, int]:
        """The session, its buffer (marked with this turn's request id until the turn ends) and
        the number the turn will have."""
        buffer = hold.slot.buffer
        assert buffer is not None
        buffer.request_id, buffer.request_asks = self.request_id, self._asks
        return self._session, buffer, self._session.turn_count + 1

    async def _ran(self, hold: Hold, report: TurnReport) -> None:
        """The turn ran: reported, then committed."""
        report.ran()
        self.turn, self.entry = self._session.turn_count, self._session.last_turn or {}
        if self._session.user_spent is not None:  # its model calls count for its user, failed or not
            user_budgets.charge(hold.slot.buffer, self._session, self.entry)
        self._written = await self._writes.commit(hold.slot, self._session.id, hold.lease)
        if self._written is not None:
            report.committed(self._session.unfinished_counted)

    async def _keep_stopped(self, session: Session, hold: Hold, number: int, report: TurnReport) -> None:
        """Write a stopped turn's record (ok false, error "cancelled", what it showed and what its
        tools did) so the history says what happened; the session is as before the turn. A turn
        stopped before it started has no record. A failure here is logged: the stop stands."""
        try:
            entry = session.last_turn or {}
        except SessionError:  # stopped before it started: no record, and none to read back
            return
        if entry.get("turn") != number or entry.get("ok") is not False:
            return
        self.turn, self.entry = number, entry
        if session.user_spent is not None:
            user_budgets.charge(hold.slot.buffer, session, entry)
        try:
            written = await self._writes.commit(hold.slot, session.id, hold.lease)
        except Exception as exc:  # a conflict, a store down: the live copy was dropped, the store is the truth
            log.warning("the record of stopped turn %s of session %s was not saved: %s", number, session.id, exc)
            return
        if written is not None:
            report.committed(session.unfinished_counted)


def _reraise(report: TurnReport, exc: BaseException) -> NoReturn:
    """Raise a turn's failure (`_failed`): `exc` itself, or what it becomes, without its context."""
    failed = _failed(report, exc)
    if failed is exc:
        raise exc
    raise failed from None


def _failed(report: TurnReport, exc: BaseException) -> BaseException:
    """A turn's failure, its outcome noted in its report: the exception to raise (a refused
    decision becomes the request's failure; any other, `exc` itself)."""
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # cancelled, or stopped reading
        report.stopped()
    elif isinstance(exc, SessionError):  # e.g. a conversation an `end` action ended
        report.outcome = REFUSED
    elif isinstance(exc, wire.RequestFailed):
        report.outcome = CONFLICT if exc.reason == wire.CONFLICT else ERROR
    elif isinstance(exc, wire.DECISION_ERRORS):  # refused before the turn ran: nothing to commit
        report.outcome = REFUSED
        return wire.decision_failed(exc)
    return exc
