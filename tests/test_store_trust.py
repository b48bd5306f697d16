"""A store that cannot run code (issue 33, finding 1): with only a Redis client, an attacker
writes a "bot version" record (a bot.yaml whose tool has `handler: evil:run`, and evil.py,
hashed as chatrun hashes) and points a session at it. A `chatrun serve` replica (a real
process, on a real Redis) must never import evil.py: not on the owner's next message, not
through the timeout sweeper. Versions signed with the replicas' shared bundle key still load
on another replica; bundles over the size limit are refused at publish (finding 6)."""

from __future__ import annotations

import json
import queue
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

import chatrun
from chatrun.definition.versions import content_version
from chatrun.testing.fake_openai import FakeOpenAI, echo
from redis_support import Replica
from test_versions import shop_copy, shop_responder

pytestmark = pytest.mark.subprocess

BOT = """
name: notes
description: Takes notes.
model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
routes:
  main: {default: true, system: You take notes.}
"""


def forged_files(marker: Path) -> dict[str, str]:
    """The attacker's bot version: a tool whose handler is evil.py, which leaves a file when imported."""
    return {
        "bot.yaml": textwrap.dedent("""\
            name: notes
            model: {provider: openai, name: gpt-4o-mini, temperature: 0, max_retries: 0}
            routes:
              main: {default: true, system: You are the attacker's bot., tools: [pwn]}
            tools:
              pwn: {description: pwn, handler: "evil:run"}
            """),
        "evil.py": f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n\n"
                   "def run(ctx):\n    return 'pwned'\n",
    }


class Attacker:
    """Someone with a Redis client and nothing else: no bot folder, no token, no replica."""

    def __init__(self, redis_url: str):
        base, _, query = redis_url.partition("?prefix=")
        self.prefix = query
        self.client = redis.Redis.from_url(base, decode_responses=True)

    def publish(self, bot: str, files: dict[str, str]) -> str:
        version = content_version(files)  # the hash, computed as chatrun computes it
        record = {"bot": bot, "label": "9", "files": files, "published": time.time() + 3600,
                  "signature": "hmac-sha256:" + "0" * 64}  # a signature made up: no key to make a real one
        self.client.set(f"{self.prefix}rec:bot-version:{bot}:{version}", json.dumps(record))
        return version

    def point(self, session_id: str, version: str) -> None:
        """The session's snapshot now runs `version` (a new fencing version: replicas reload it)."""
        key = f"{self.prefix}s:{session_id}"
        snapshot = json.loads(self.client.hget(key, "snap"))
        snapshot["bot_version"] = version
        self.client.hset(key, mapping={"snap": json.dumps(snapshot), "v": "99.deadbeef"})

    def make_due(self, session_id: str) -> None:
        """The session is in the sweeper's due index, as if a pending item's timeout had come."""
        self.client.zadd(f"{self.prefix}due", {session_id: 0})


class Watched(Replica):
    """A replica whose output is read as it comes (the log lines a test waits for)."""

    def start(self, wait: bool = True) -> Watched:
        super().start(wait=False)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert self.proc is not None and self.proc.stdout is not None
        stdout = self.proc.stdout
        threading.Thread(target=lambda: [self.lines.put(line.decode(errors="replace")) for line in stdout],
                         daemon=True).start()
        if wait:
            self.wait_ready()
        return self

    def wait_for(self, done, timeout: float = 90) -> None:
        """Until `done(lines seen so far)` holds (a loaded machine may take long: the bound is generous)."""
        deadline = time.monotonic() + timeout
        while not done(self.seen):
            try:
                self.seen.append(self.lines.get(timeout=max(0.0, min(1.0, deadline - time.monotonic()))))
            except queue.Empty:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("waited in vain; the replica said:\n" + "".join(self.seen))


@pytest.fixture(scope="module")
def model():
    with FakeOpenAI(responder=echo) as server:
        yield server


def notes_bot(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "bot.yaml").write_text(BOT)
    return folder


def refused(session_id: str):
    return lambda lines: any("refused to load version" in line and f"session {session_id}" in line for line in lines)


def test_a_forged_version_in_redis_is_never_imported_on_a_message(redis_server, model, tmp_path):
    store = redis_server.url()
    marker = tmp_path / "imported-evil"
    replica = Watched(str(notes_bot(tmp_path)), store, model.base_url, "--log-level", "info").start()
    try:
        sid = "owner-session"
        assert httpx.post(f"{replica.url}/bots/notes/sessions", json={"id": sid}, timeout=60).status_code == 201
        first = httpx.post(f"{replica.url}/bots/notes/sessions/{sid}/messages", json={"userMessage": "hi"}, timeout=60)
        assert first.status_code == 200, first.text
        attacker = Attacker(store)
        forged = attacker.publish("notes", forged_files(marker))
        attacker.point(sid, forged)
        answer = httpx.post(f"{replica.url}/bots/notes/sessions/{sid}/messages",
                            json={"userMessage": "again"}, timeout=60)
        replica.wait_for(lambda lines: marker.exists() or refused(sid)(lines))
        assert not marker.exists(), "the replica imported the attacker's evil.py"
        # The session moved to the version the replica serves (on_change: restart_scope), as for
        # a lost version; the turn ran on the owner's bot, not on the attacker's.
        assert answer.status_code == 200, answer.text
        session = httpx.get(f"{replica.url}/bots/notes/sessions/{sid}", timeout=60).json()
        assert session["botVersion"] == chatrun.load_bot(tmp_path / "notes").config.content_version
        line = next(line for line in replica.seen if refused(sid)(replica.seen) and "refused to load" in line)
        assert f"version {forged} of bot notes" in line and "evil.py" in line
        assert "no bundle key" in line and "--bundle-key" in line
        assert any("no bundle key: this replica loads no bot version from the store" in x for x in replica.seen)
    finally:
        replica.kill()


def test_a_forged_version_in_redis_is_never_imported_by_the_sweeper(redis_server, model, tmp_path):
    """No client at all: the attacker puts the session in the due index; the replica's sweeper
    opens it. The replica has a bundle key here: a made-up signature does not pass either."""
    store = redis_server.url()
    marker = tmp_path / "imported-evil"
    key = tmp_path / "bundle.key"
    key.write_text("k" * 32)
    replica = Watched(str(notes_bot(tmp_path)), store, model.base_url, "--log-level", "info",
                      "--bundle-key", str(key), "--sweep-interval", "0.5").start()
    try:
        sid = "swept-session"
        assert httpx.post(f"{replica.url}/bots/notes/sessions", json={"id": sid}, timeout=60).status_code == 201
        attacker = Attacker(store)
        attacker.point(sid, attacker.publish("notes", forged_files(marker)))
        attacker.make_due(sid)
        replica.wait_for(lambda lines: marker.exists() or refused(sid)(lines))
        assert not marker.exists(), "the sweeper imported the attacker's evil.py"
        assert any("signature does not match this replica's bundle key" in line for line in replica.seen)
    finally:
        replica.kill()


def test_a_signed_version_loads_on_another_replica_and_a_wrong_key_refuses_it(redis_server, tmp_path):
    """Replica `new` serves shop versions 1 and 2 and publishes both, signed; `old` (version 1
    only, the same key) runs a version-2 session from the store's copy; `stranger` (another key)
    refuses it: under `pin` its turn is refused, naming the session, and nothing of it runs."""
    root = shop_copy(tmp_path, on_change="pin")
    v2 = chatrun.load_bot(root / "versions" / "2").config.content_version
    key, other = tmp_path / "bundle.key", tmp_path / "other.key"
    key.write_text("same-key-on-every-replica-0123456789\n")
    other.write_text("a-key-of-another-deployment-98765\n")
    store = redis_server.url()
    with FakeOpenAI(responder=shop_responder) as fake:
        new = Watched(str(root), store, fake.base_url, "--bundle-key", str(key)).start()
        old = Watched(str(root / "versions" / "1"), store, fake.base_url, "--bundle-key", str(key)).start()
        stranger = Watched(str(root / "versions" / "1"), store, fake.base_url, "--bundle-key", str(other)).start()
        try:
            assert httpx.post(f"{new.url}/bots/shop/sessions", json={"id": "s2"}, timeout=60).json()["botVersion"] == v2
            ok = httpx.post(f"{old.url}/bots/shop/sessions/s2/messages", json={"userMessage": "add tea"}, timeout=60)
            assert ok.status_code == 200, ok.text
            assert httpx.get(f"{old.url}/bots/shop/sessions/s2", timeout=60).json()["botVersion"] == v2
            no = httpx.post(f"{stranger.url}/bots/shop/sessions/s2/messages", json={"userMessage": "hi"}, timeout=60)
            assert no.status_code == 503 and no.json()["error"] == "Unavailable"
            message = no.json()["message"]
            assert "session s2" in message and f"version {v2}" in message and "pin" in message
            assert "signature does not match" in message and "--bundle-key" in message
            history = httpx.get(f"{new.url}/bots/shop/sessions/s2", timeout=60).json()["history"]
            assert len(history) == 1  # the stranger ran nothing
        finally:
            for replica in (new, old, stranger):
                replica.kill()


def test_a_bundle_over_the_size_limit_is_refused_at_publish(redis_server, model, tmp_path):
    folder = notes_bot(tmp_path)
    (folder / "catalogue.json").write_text(json.dumps({"items": ["x" * 1000] * 6000}))  # ~6 MB
    replica = Replica(str(folder), redis_server.url(), model.base_url).start(wait=False)
    assert replica.proc is not None and replica.proc.wait(90) == 1
    output = replica.output()
    assert "bot notes version" in output and "over the bundle limit of 5.0 MB" in output, output
    assert "catalogue.json" in output and "--max-bundle-mb" in output
    raised = Replica(str(folder), redis_server.url(), model.base_url, "--max-bundle-mb", "8").start()
    raised.kill()
