"""The HTTP turn's lean path (issue 39, bench/README.md "The HTTP turn, third pass") answers as the
general one: the gate takes a free lock without a timer exactly when asyncio.Lock would take it at
once, the body the edge read is taken without a timer, a whole turn's events come as iterating
gives them, and the reply's JSON is Starlette's."""

from __future__ import annotations

import asyncio
import math

import pytest
from starlette.responses import JSONResponse

import chatrun
from chatrun.server import guard, session_gate, turn_run
from chatrun.server.guard import Refused, Replay, read_body
from chatrun.server.plumbing import QuickJSONResponse
from chatrun.server.session_gate import taken_at_once
from chatrun.testing.fake_openai import echo
from server_support import app_for_testclient, write_travel
from test_http_turn_route import AUTH, BODIES, CALLERS, EXTRAS, PATHS, QUERIES, answers


def _takes_at_once(lock: asyncio.Lock) -> bool:
    """Whether lock.acquire() returns without waiting (then the lock is released again)."""
    step = lock.acquire()
    try:
        step.send(None)
    except StopIteration:
        lock.release()
        return True
    step.close()  # it waited: not taken
    return False


def test_the_gate_skips_the_timer_exactly_when_acquire_would_not_wait() -> None:
    async def cases() -> list[tuple[bool, bool]]:
        seen = []
        lock = asyncio.Lock()
        seen.append((taken_at_once(lock), _takes_at_once(lock)))  # free
        await lock.acquire()
        seen.append((taken_at_once(lock), _takes_at_once(lock)))  # held
        waiter = asyncio.ensure_future(lock.acquire())
        await asyncio.sleep(0)
        lock.release()  # free, but the waiter woken before us takes it first
        seen.append((taken_at_once(lock), _takes_at_once(lock)))
        await waiter
        cancelled = asyncio.ensure_future(lock.acquire())
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        lock.release()
        seen.append((taken_at_once(lock), _takes_at_once(lock)))
        return seen

    seen = asyncio.run(cases())
    assert [mine for mine, _ in seen] == [acquire for _, acquire in seen]
    assert [acquire for _, acquire in seen] == [True, False, False, True]


def test_a_lock_whose_queue_the_gate_cannot_see_is_waited_for_under_the_timer() -> None:
    class OtherLock(asyncio.Lock):  # a Lock that keeps its waiters under another name
        def __init__(self) -> None:
            super().__init__()
            del self._waiters

    assert taken_at_once(asyncio.Lock())
    assert not taken_at_once(OtherLock())


def test_the_gate_still_refuses_a_session_that_stays_busy() -> None:
    from chatrun.server import wire
    from chatrun.store.aio import open_async_store
    from chatrun.store.lease import LeaseSettings

    async def scenario() -> str:
        gate = session_gate.SessionGate(open_async_store("memory://"), LeaseSettings(wait=0.05))
        lock = asyncio.Lock()
        async with gate.through(lock, "s1", session_gate.QUEUE):
            with pytest.raises(wire.RequestFailed) as refused:
                async with gate.through(lock, "s1", session_gate.QUEUE):
                    pass
        assert not lock.locked() and gate.active == gate.waiting == 0
        return refused.value.reason

    assert asyncio.run(scenario()) == wire.TOO_MANY_REQUESTS


@pytest.mark.parametrize("first", [
    {"type": "http.request", "body": b'{"userMessage": "hi"}', "more_body": False},
    {"type": "http.request", "body": b"x" * 11, "more_body": False},  # over the limit of 10
    {"type": "http.disconnect"},  # the client left before its body came
])
def test_a_body_the_edge_read_is_taken_without_a_timer_as_a_timed_read_takes_it(first, monkeypatch) -> None:
    async def never() -> dict:
        raise AssertionError("read past the edge's body")

    async def read(receive) -> tuple:
        try:
            body, left = await read_body(receive, 10 if first.get("body") == b"x" * 11 else 100, 30, lambda: "over")
        except Refused as exc:
            return ("refused", exc.status, exc.reason, exc.message)
        return (bytes(body), left)

    async def replayed() -> dict:  # the same message from a plain receive: read under the timer
        return dict(first)

    timed = asyncio.run(read(replayed))
    with monkeypatch.context() as patched:
        patched.setattr(guard.asyncio, "timeout", None)  # a timer used would fail
        taken = asyncio.run(read(Replay(dict(first), never)))
    assert taken == timed


def test_the_edge_reads_a_body_that_is_there_without_a_timer_and_times_one_that_waits(monkeypatch) -> None:
    """guard._within: a message there at once (a small body comes with its headers) needs no
    timer; one that waits is read under it as before: it arrives, or the request times out."""
    message = {"type": "http.request", "body": b"{}", "more_body": False}

    async def at_once() -> dict:
        return message

    async def scenario(late: float, timeout: float) -> tuple:
        arrived = asyncio.Event()
        asyncio.get_running_loop().call_later(late, arrived.set)

        async def waits() -> dict:
            await arrived.wait()
            return message

        try:
            body, left = await read_body(waits, 100, timeout, lambda: "over")
        except Refused as exc:
            return (exc.status, exc.reason)
        return (bytes(body), left)

    assert asyncio.run(scenario(0.01, 30)) == (b"{}", None)
    assert asyncio.run(scenario(30, 0.05)) == (408, "RequestTimeout")
    with monkeypatch.context() as patched:
        patched.setattr(guard.asyncio, "timeout", None)  # a timer used would fail
        assert asyncio.run(read_body(at_once, 100, 30, lambda: "over")) == (bytearray(b"{}"), None)


def test_a_request_cancelled_while_the_edge_waits_for_its_body_is_cancelled() -> None:
    async def scenario() -> bool:
        async def never() -> dict:
            await asyncio.Event().wait()
            return {}

        reading = asyncio.ensure_future(read_body(never, 100, 30, lambda: "over"))
        await asyncio.sleep(0.01)
        reading.cancel()
        try:
            await reading
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(scenario())


def test_the_edge_remembers_only_allowed_hosts_and_refuses_the_others_each_time() -> None:
    edge = guard.EdgeGuard(None, guard.EdgePolicy())  # type: ignore[arg-type]
    for _ in range(2):
        edge.check_host({"host": "127.0.0.1:8000"})
        edge.check_host({"host": "localhost"})
        with pytest.raises(Refused) as refused:
            edge.check_host({"host": "evil.example:8000"})
        assert refused.value.reason == "BadHost" and "evil.example:8000" in refused.value.message
    assert edge._allowed_hosts == {"127.0.0.1:8000", "localhost"}
    for port in range(100):  # bounded
        edge.check_host({"host": f"localhost:{port}"})
    assert len(edge._allowed_hosts) == guard.MAX_HOSTS_KEPT


def test_a_replay_gives_the_edges_message_then_the_clients() -> None:
    async def client() -> dict:
        return {"type": "http.disconnect"}

    async def scenario() -> list[dict]:
        replay = Replay({"type": "http.request", "body": b"{}", "more_body": False}, client)
        return [await replay(), await replay()]

    assert asyncio.run(scenario()) == [{"type": "http.request", "body": b"{}", "more_body": False},
                                       {"type": "http.disconnect"}]


@pytest.mark.parametrize("content", [
    {"events": [{"type": "Message", "data": "Grüße, 東京 ✈ \"quoted\" \\ \n\t"}], "ok": True, "turn": 3,
     "usage": {"cost": 1.5e-05, "calls": 1, "by_call": [{"model": "m", "cost": None}]}},
    {"data": "\ud800"},  # a lone surrogate: neither can encode it
    {"cost": math.nan},  # neither writes NaN
])
def test_the_turn_reply_renders_as_starlettes_json_response(content) -> None:
    """QuickJSONResponse (an HTTP turn's reply, a /v1 answer) renders what JSONResponse renders."""
    def rendered(kind: type[JSONResponse]) -> tuple:
        try:
            response = kind(content, headers={"Idempotent-Replayed": "true"})
        except Exception as exc:  # noqa: BLE001 - the same failure is the point
            return (type(exc),)
        return (response.body, response.headers.items(), response.media_type)

    assert rendered(QuickJSONResponse) == rendered(JSONResponse)


def test_a_whole_turns_events_are_what_iterating_the_turn_gives(tmp_path, fake, monkeypatch) -> None:
    """Every request of test_http_turn_route's matrix (callers, queries, keys and replays, paths,
    bodies), answered with TurnRun.events (the whole turn in the request's task; iterating a whole
    turn is it too) and with a streamed turn's iteration, and the turns they report (the
    chatrun_turns counters)."""
    fake.responder = echo
    requests = [(PATHS[0], q, {**c, **e}, BODIES[0]) for c, q, e in zip(CALLERS * 3, QUERIES, EXTRAS * 4, strict=False)]
    requests += [(p, "", c, b) for p in PATHS for c in CALLERS[:3] for b in BODIES]
    requests += [(PATHS[0], "", {"Authorization": "Bearer ana-token-123", "Idempotency-Key": "same"}, BODIES[0])] * 2

    async def iterated(self: turn_run.TurnRun) -> list:  # the streamed turn's iteration (its task and queue)
        self._whole = False
        return [event async for event in self]

    def served(name: str) -> tuple[list, list]:
        auth = tmp_path / "auth.yaml"
        auth.write_text(AUTH)
        app = app_for_testclient([chatrun.load_bot(write_travel(tmp_path / name))], "memory://", auth=str(auth))
        turns: list[str] = []
        return answers(app, requests, turns), turns

    mine = served("events")
    with monkeypatch.context() as patched:
        patched.setattr(turn_run.TurnRun, "events", iterated)
        theirs = served("iterated")
    assert mine == theirs
    assert any(replayed == "true" for *_, replayed, _ in mine[0]) and mine[1]


def test_a_hold_leaves_nothing_held_whether_its_block_ends_well_or_not(tmp_path) -> None:
    """SessionRegistry.session's one object (Holding) undoes what it did, in every ending: an
    unknown session, a block that raises (SessionError becomes SessionNotActive), a block that
    ends well; the session's lock is free and nothing waits or is active afterwards."""
    from chatrun.errors import SessionError
    from chatrun.server import wire
    from chatrun.server.sessions import EXISTING, NEW, SessionRegistry

    bot = chatrun.load_bot(write_travel(tmp_path))

    async def scenario() -> list:
        registry = SessionRegistry({"travel": bot}, chatrun.InMemoryStore())
        seen = []
        async with registry.session("travel", "s1", None, NEW) as session:
            seen.append((session.id, registry.gate.active, registry.cache._slots[("travel", "s1")].locked()))
        with pytest.raises(wire.RequestFailed) as unknown:
            async with registry.session("travel", "nobody", None, EXISTING):
                pass
        seen.append(unknown.value.reason)
        with pytest.raises(wire.RequestFailed) as ended:
            async with registry.session("travel", "s1", None, EXISTING):
                raise SessionError("ended")
        seen.append(ended.value.reason)
        slot = registry.cache._slots[("travel", "s1")]
        seen.append((registry.gate.active, registry.gate.waiting, slot.users, slot.locked(), slot._lock,
                     ("travel", "nobody") in registry.cache._slots, registry._holds))
        return seen

    assert asyncio.run(scenario()) == [("s1", 1, True), wire.SESSION_NOT_ACTIVE, wire.SESSION_NOT_ACTIVE,
                                       (0, 0, 0, False, None, False, {})]
