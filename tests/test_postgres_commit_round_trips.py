"""How many round trips a PostgreSQL commit takes (store/postgres.py `commit_turn`), counted on
the wire by a loopback proxy between the store and the server: what its checks read under its
locks (with BEGIN) in one, its writes and COMMIT in another, and no empty query before them for a
pooled connection in use a moment ago (the pool's check asks the server only of a connection
that may be stale)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from chatrun.store.record import Commit
from chatrun.store.versions import CREATE


class FlightProxy:
    """A TCP proxy on a loopback port that counts round trips: each time the client sends after
    the server last spoke (or first), one more (while `counting`)."""

    def __init__(self, port: int):
        self.target, self.trips, self.counting = port, 0, False
        self._lock, self._last = threading.Lock(), {}
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            for sock in (client, server):  # forwarded as it comes: no delay of the proxy's own
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, server, "sent"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, "answered"), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, direction: str) -> None:
        with source, sink:
            while data := _received(source):
                with self._lock:
                    if direction == "sent" and self._last.get(source) != "sent" and self.counting:
                        self.trips += 1
                    self._last[source if direction == "sent" else sink] = direction
                try:
                    sink.sendall(data)
                except OSError:
                    return

    def close(self) -> None:
        self.listener.close()


def _received(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _commit(expected: str, turn: int) -> Commit:
    return Commit.encode("s", {"turn": turn}, {"s:main": []}, [{"turn": turn, "ok": True}], expected=expected,
                         outcome=(f"r{turn}", {"ok": True}))


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_commit_on_postgresql_is_two_round_trips(postgres_server):
    from chatrun.store.postgres import PostgresStore

    proxy = FlightProxy(postgres_server.port)
    url = postgres_server.url().replace(f":{postgres_server.port}/", f":{proxy.port}/")

    async def go() -> tuple[int, list[int]]:
        store = PostgresStore(url)
        try:
            lease = await store.acquire("s", 5.0)
            first = await store.commit_turn(_commit(CREATE, 1), lease)
            proxy.counting = True
            second = await store.commit_turn(_commit(first, 2), lease)
            proxy.counting = False
            record = await store.load_session("s")
            assert record is not None and record.version == second
            turns = [e["turn"] for e in await store.load_history("s")]
            await store.release(lease)
            return proxy.trips, turns
        finally:
            await store.close()
            proxy.close()

    trips, turns = asyncio.run(go())
    assert turns == [1, 2]
    assert trips == 2


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_connection_cut_by_a_restart_moments_after_its_use_is_replaced_not_handed_out(postgres_server,
                                                                                        monkeypatch):
    """The pool's check skips the empty query for a connection in use a moment ago, but not for
    one whose socket the restart closed: the next commit, at once, succeeds (never an error),
    however long the idle window is."""
    from chatrun.store import postgres
    from chatrun.store.postgres import PostgresStore

    monkeypatch.setattr(postgres, "STALE_CHECK_IDLE", 3600.0)  # only the socket can tell

    async def go() -> list[int]:
        store = PostgresStore(postgres_server.url())
        try:
            lease = await store.acquire("s", 5.0)
            first = await store.commit_turn(_commit(CREATE, 1), lease)
            postgres_server.restart()  # every pooled connection is cut
            await store.commit_turn(_commit(first, 2), lease)
            turns = [e["turn"] for e in await store.load_history("s")]
            await store.release(lease)
            return turns
        finally:
            await store.close()

    assert asyncio.run(go()) == [1, 2]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_refused_commit_in_its_pipeline_rolls_back_and_the_connection_serves_the_next(postgres_server, caplog):
    """A stale writer and a lost lease are refused from the pipelined reads (StaleVersion,
    LeaseLost: 409 to a client), their transaction rolled back by the connection's context before the
    pool takes it back (the pool warns of a connection given back inside a transaction: a refused
    commit is a normal outcome, not a warning), and the next commit, on the same pooled connection (the
    pool holds one), lands."""
    import logging

    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    from chatrun.store.postgres import PostgresStore
    from chatrun.store.versions import LeaseLost, StaleVersion

    async def go() -> list[int]:
        store = PostgresStore(postgres_server.url() + "?max_connections=1")
        try:
            lease = await store.acquire("s", 5.0)
            first = await store.commit_turn(_commit(CREATE, 1), lease)
            with pytest.raises(StaleVersion):
                await store.commit_turn(_commit(CREATE, 2), lease)
            other = await store.acquire("t", 5.0)
            await store.release(other)
            with pytest.raises(LeaseLost):
                await store.commit_turn(Commit.encode("t", {"turn": 1}, {}, [], expected=CREATE), other)
            await store.commit_turn(_commit(first, 2), lease)
            turns = [e["turn"] for e in await store.load_history("s")]
            await store.release(lease)
            return turns
        finally:
            await store.close()

    assert asyncio.run(go()) == [1, 2]
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")]
