"""Sessions whose bot version is not known (stored before versions were recorded, as chatrun
0.2 wrote them: no `bot_version` in the snapshot) or is lost (no replica and no store has a
copy), and the private folder stored versions are written to (issue 23). Real apps on a real
SQLite file, the fake OpenAI server, bots/shop."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.definition.versions import bot_files, content_version
from chatrun.server.bundles import BundlePolicy
from chatrun.server.versions import VersionShelf, record_key, signed_part
from chatrun.store.aio import LocalAsyncStore
from server_support import app_for_testclient as create_app
from server_support import until_done
from test_versions import (
    BUNDLE_KEY,
    messages,
    resource,
    say,
    shop_copy,
    shop_responder,
    start_v1_sessions,
)

SIGNING = BundlePolicy(BUNDLE_KEY.encode())


def signed(bot: str, version: str, record: dict) -> dict:
    """A bundle record as a replica with the shared key publishes it."""
    return {**record, "signature": SIGNING.sign(signed_part(record, bot, version))}


def rewrite_versions(db_path: Path, bot_version: str | None) -> None:
    """Every stored session's snapshot with `bot_version` replaced (None: without it, exactly
    as chatrun 0.2 stored it)."""
    db = chatrun.SQLiteStore(str(db_path))
    for sid in db.list_sessions():
        snapshot = dict(db.load_session(sid))
        snapshot.pop("bot_version")
        if bot_version is not None:
            snapshot["bot_version"] = bot_version
        db.commit_turn(sid, snapshot, {}, [])
    db.close()


def hashes(root: Path) -> tuple[str, str]:
    return tuple(chatrun.load_bot(root / "versions" / v).config.content_version for v in ("1", "2"))  # type: ignore[return-value]


# -- sessions stored before versions were recorded ------------------------------------------------


@pytest.mark.parametrize("served", ["both", "2"])
def test_a_session_stored_before_versions_is_migrated_as_its_migration_says(fake, tmp_path, served):
    """Served with both versions, the session is taken to be of version 1 (the oldest that could
    have produced it) and goes through `from: "1"`; served with version 2 only, the migration
    applies because the session holds what it renames (`email`) or maps (`checkout`)."""
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="migrate")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    where = start_v1_sessions(store, root, 3)
    rewrite_versions(tmp_path / "sessions.db", None)
    _, v2_hash = hashes(root)
    with TestClient(create_app(str(root if served == "both" else root / "versions" / "2"), store)) as server:
        for i, (sid, was) in enumerate(where.items()):
            say(server, sid, "hello again")  # no turn fails
            session = resource(server, sid)
            assert session["botVersion"] == v2_hash
            state = session["state"]
            assert state["contact"] == {"email": f"a{i}@example.com"} and "email" not in state
            assert state["currency"] == "GBP"  # the migration's default, not version 2's `state:` (EUR)
            assert session["route"] == {"gift_wrap": "browse", "checkout": "payment", "browse": "browse"}[was]
            (moved,) = [h["moved"] for h in session["history"] if h.get("moved")]
            assert moved["to"] == v2_hash and any("renamed to state.contact.email" in n for n in moved["notes"])


def test_a_pinned_session_stored_before_versions_finishes_on_the_version_that_produced_it(fake, tmp_path):
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="pin")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    where = start_v1_sessions(store, root, 3)
    rewrite_versions(tmp_path / "sessions.db", None)
    v1_hash, _ = hashes(root)
    with TestClient(create_app(str(root), store)) as server:
        for i, (sid, was) in enumerate(where.items()):
            say(server, sid, "hello again")
            session = resource(server, sid)
            assert session["botVersion"] == v1_hash and session["route"] == was  # recorded from now on
            assert session["state"]["email"] == f"a{i}@example.com" and "contact" not in session["state"]


def test_an_unrecorded_session_the_bot_produced_is_not_moved(fake, tmp_path):
    """A session of version 2 from before versions stays as it is: no migration, no move."""
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="migrate")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    with TestClient(create_app(str(root / "versions" / "2"), store)) as server:
        messages(server.post("/bots/shop/sessions", json={"id": "v2"}))
        say(server, "v2", "mail me at b@example.com")
    rewrite_versions(tmp_path / "sessions.db", None)
    with TestClient(create_app(str(root), store)) as server:
        say(server, "v2", "hello")
        session = resource(server, "v2")
        assert session["state"] == {"contact": {"email": "b@example.com"}, "cart": [], "currency": "EUR"}
        assert not [h for h in session["history"] if h.get("moved")]


# -- a version no one has ------------------------------------------------------------------------


def test_a_session_of_a_version_no_one_has_moves_by_its_policy_with_a_note(fake, tmp_path):
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="migrate")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    where = start_v1_sessions(store, root, 3)
    rewrite_versions(tmp_path / "sessions.db", "0123456789ab")  # a version stored nowhere (a pruned store)
    _, v2_hash = hashes(root)
    with TestClient(create_app(str(root), store)) as server:
        for i, (sid, was) in enumerate(where.items()):
            fake.requests.clear()
            say(server, sid, "hello again")  # not a 503 forever: no copy will ever arrive
            session = resource(server, sid)
            assert session["botVersion"] == v2_hash
            assert session["state"]["contact"] == {"email": f"a{i}@example.com"}  # migrated: it shows `email`
            sent = json.dumps(fake.requests[-1]["messages"])
            if was == "gift_wrap":  # a dropped scope: back on browse, whose memory has the note
                assert session["route"] == "browse"
            assert "version 0123456789ab this conversation ran on is no longer available" in sent
            (moved,) = [h["moved"] for h in session["history"] if h.get("moved")]
            assert moved["from"] == "0123456789ab" and moved["to"] == v2_hash


def publish_unloadable(db_path: Path, root: Path) -> str:
    """A copy of a version in the store that does not load on this replica (a later format):
    what a newer replica publishes during a rolling deploy. Returns its content version."""
    files = bot_files(root / "versions" / "2")
    files["bot.yaml"] = files["bot.yaml"].replace("format: 3", "format: 99")
    version = content_version(files)
    db = chatrun.SQLiteStore(str(db_path))
    db.put_record(record_key("shop", version), signed("shop", version, {"bot": "shop", "label": "3", "files": files,
                                                                        "published": 1.0}))
    db.close()
    return version


def test_a_version_in_the_store_that_does_not_load_here_is_a_retryable_503(fake, tmp_path, monkeypatch):
    fake.responder = shop_responder
    monkeypatch.setenv("CHATRUN_BUNDLE_KEY", BUNDLE_KEY)
    root = shop_copy(tmp_path, on_change="migrate")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    start_v1_sessions(store, root, 1)
    newer = publish_unloadable(tmp_path / "sessions.db", root)
    rewrite_versions(tmp_path / "sessions.db", newer)
    with TestClient(create_app(str(root), store)) as old:
        refused = old.post("/bots/shop/sessions/s0/messages", json={"userMessage": "hi"})
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"] == "Unavailable" and newer in refused.json()["message"]
        assert "does not load here" in refused.json()["message"]
        with old.websocket_connect("/_chat/routes") as ws:  # the WebSocket says the same
            ws.send_json({"type": "Connect", "chatId": "s0", "resume": True, "extensions": True})
            frames = until_done(ws)
            assert frames[-1] == {"chatId": "s0", "type": "Failed", "data": "Unavailable"}
            assert any(newer in str(f.get("data")) for f in frames if f["type"] == "Error")
    db = chatrun.SQLiteStore(str(tmp_path / "sessions.db"))
    assert db.load_session("s0")["bot_version"] == newer  # nothing of the turn ran
    db.close()


# -- where stored versions are written -----------------------------------------------------------


def test_stored_versions_are_written_to_a_private_folder_of_the_process(tmp_path):
    root = shop_copy(tmp_path)
    db = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    files = bot_files(root / "versions" / "2")
    version = content_version(files)
    db.put_record(record_key("shop", version), signed("shop", version, {"bot": "shop", "label": "2", "files": files,
                                                                        "published": 1.0}))
    first, second = VersionShelf({}, LocalAsyncStore(db), SIGNING), VersionShelf({}, LocalAsyncStore(db), SIGNING)
    try:
        folder = first.cache()
        assert folder != second.cache()  # one per process (and per server): not a shared, guessable path
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and folder.stat().st_uid == os.getuid()
        loaded = asyncio.run(first._load("shop", version))
        assert loaded is not None and loaded.bot.config.content_version == version
        assert Path(loaded.bot.config.root).is_relative_to(folder)
    finally:
        first.close()
        second.close()
        db.close()
    assert not folder.exists()  # removed when the server stops


# -- retiring versions: chatrun versions list / prune ---------------------------------------------


def test_prune_removes_the_versions_no_session_runs_and_refuses_the_others(fake, tmp_path):
    from click.testing import CliRunner

    from chatrun.cli import main

    def cli(*args):
        return CliRunner().invoke(main, ["versions", *args, "--store", store])

    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="pin")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    start_v1_sessions(store, root, 2)  # two sessions on version 1
    with TestClient(create_app(str(root), store)):
        pass  # version 2 is published too
    v1_hash, v2_hash = hashes(root)
    listed = cli("list")
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines() == [f"shop 1 ({v1_hash}): 2 sessions", f"shop 2 ({v2_hash}): 0 sessions"]

    refused = cli("prune", "--bot", "shop", "--keep", "2")
    assert refused.exit_code == 1
    assert refused.output.splitlines() == [f"refused  shop 1 ({v1_hash}): 2 sessions still run it",
                                           f"kept     shop 2 ({v2_hash})"]
    on_v2 = root / "versions" / "2" / "bot.yaml"  # promote with `migrate`: the sessions move to 2
    on_v2.write_text(on_v2.read_text().replace("on_change: pin", "on_change: migrate"))
    with TestClient(create_app(str(root), store)) as server:
        for sid in ("s0", "s1"):
            say(server, sid, "hello again")
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version  # the edit made a new version
    dry = cli("prune", "--bot", "shop", "--keep", v2_hash, "--dry-run")
    assert dry.exit_code == 0 and f"would remove shop 1 ({v1_hash})" in dry.output
    assert f"shop 1 ({v1_hash}): 0 sessions" in cli("list").output  # still there
    pruned = cli("prune", "--bot", "shop", "--keep", v2_hash)
    assert pruned.exit_code == 0, pruned.output
    assert f"removed  shop 1 ({v1_hash})" in pruned.output and f"kept     shop 2 ({v2_hash})" in pruned.output
    assert [line.split(" (")[0] for line in cli("list").output.splitlines()] == ["shop 2"]
    listed = json.loads(cli("list", "--json").output)["versions"]
    assert [(v["label"], v["content_version"], v["sessions"]) for v in listed] == [("2", v2_hash, 2)]
    unknown = cli("prune", "--bot", "shop", "--keep", "9")
    assert unknown.exit_code == 2 and f"bot shop keeps no such version (it keeps: 2 ({v2_hash}))" in unknown.output


def test_a_store_that_keeps_no_records_answers_503_as_a_copy_may_be_in_another_replica():
    """A user's own SessionStore without records keeps the published copies in each process:
    a version missing here may be served by another replica, so it is not taken as lost."""
    from chatrun.server import wire

    class SessionsOnly:  # a SessionStore and nothing more (no RecordStore methods)
        def load_session(self, session_id):
            return None

    shelf = VersionShelf({}, LocalAsyncStore(SessionsOnly()))  # type: ignore[arg-type]
    with pytest.raises(wire.RequestFailed) as refused:
        asyncio.run(shelf._load("shop", "0123456789ab"))
    assert refused.value.reason == wire.UNAVAILABLE and "keeps no copies" in str(refused.value)
