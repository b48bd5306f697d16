"""Which stored bot versions a replica loads (server/bundles.py, issue 33 finding 1), in process
on a real SQLite store: signed with the shared key or refused; data-only bundles unsigned only
when allowed (and never one that starts a program); the size limit at publish and at load; the
key's own checks. The attack through real `chatrun serve` replicas on Redis is
tests/test_store_trust.py."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chatrun.definition.versions import bot_files, content_version
from chatrun.errors import ChatrunError
from chatrun.server import wire
from chatrun.server.bundles import BundlePolicy, read_key
from chatrun.server.versions import BotVersions, Version, VersionShelf, record_key, signed_part
from chatrun.store.aio import LocalAsyncStore

KEY = b"a-bundle-key-of-this-deployment-01"
NOTES = "name: notes\nmodel: {provider: openai, name: gpt-4o-mini}\nroutes:\n  main: {default: true, system: Notes.}\n"


def shelf_on(tmp_path: Path, policy: BundlePolicy, served: str = NOTES) -> tuple[VersionShelf, chatrun.SQLiteStore]:
    """A shelf serving one `notes` bot (its own folder) on a fresh SQLite store."""
    folder = tmp_path / "served"
    folder.mkdir(exist_ok=True)
    (folder / "bot.yaml").write_text(served)
    bot = chatrun.load_bot(folder)
    db = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    return VersionShelf({"notes": BotVersions("notes", [Version(bot, "1", 100)])}, LocalAsyncStore(db), policy), db


def put(db: chatrun.SQLiteStore, files: dict[str, str], key: bytes | None = None) -> str:
    """A bundle record as someone with the store (and `key`, if given) writes it; its version."""
    version = content_version(files)
    record = {"bot": "notes", "label": "2", "files": files, "published": 5.0}
    if key is not None:
        record["signature"] = BundlePolicy(key).sign(signed_part(record, "notes", version))
    db.put_record(record_key("notes", version), record)
    return version


def data_bundle(text: str = "v2") -> dict[str, str]:
    return {"bot.yaml": NOTES.replace("Notes.", text)}


def code_bundle(marker: Path) -> dict[str, str]:
    return {"bot.yaml": NOTES.replace("system: Notes.}", "system: Notes., tools: [t]}") +
            "tools:\n  t: {description: t, handler: 'evil:run'}\n",
            "evil.py": f"open({str(marker)!r}, 'w').write('x')\ndef run(ctx):\n    return 1\n"}


def load(shelf: VersionShelf, version: str) -> Version | None:
    return asyncio.run(shelf._load("notes", version, "s-1"))


def test_a_signed_bundle_loads_and_a_forged_or_unsigned_one_is_never_imported(tmp_path, caplog):
    shelf, db = shelf_on(tmp_path, BundlePolicy(KEY))
    marker = tmp_path / "imported"
    try:
        signed = put(db, code_bundle(marker), KEY)
        loaded = load(shelf, signed)
        assert loaded is not None and loaded.stored and marker.exists()  # the owner's code: imported
        marker.unlink()
        files = code_bundle(marker)
        files["evil.py"] += "# another\n"
        for key, why in ((None, "it is not signed"), (b"x" * 32, "its signature does not match")):
            forged = put(db, files, key)
            with caplog.at_level(logging.WARNING, "chatrun.versions"):
                assert load(shelf, forged) is None  # the session moves to the primary (restart_scope)
            assert not marker.exists()
            line = caplog.records[-1].getMessage()
            assert f"refused to load version {forged} of bot notes from the store (session s-1)" in line
            assert "it holds code (evil.py)" in line and why in line and "moves to the primary" in line
        assert not (shelf.cache() / "notes" / forged).exists()  # not even written out
    finally:
        shelf.close()
        db.close()


def test_without_a_key_nothing_is_loaded_and_data_bundles_only_when_allowed(tmp_path):
    shelf, db = shelf_on(tmp_path, BundlePolicy())
    try:
        data = put(db, data_bundle())
        assert load(shelf, data) is None
        assert "no bundle key" in (shelf.start_note() or "") and "--bundle-key FILE" in (shelf.start_note() or "")
        shelf.bundles = BundlePolicy(allow_unsigned_data=True)
        loaded = load(shelf, data)
        assert loaded is not None and loaded.bot.config.routes["main"].system == "v2"
        code = put(db, code_bundle(tmp_path / "imported"))  # allowing data does not allow code
        assert load(shelf, code) is None and not (tmp_path / "imported").exists()
        starts = data_bundle("v3")
        starts["bot.yaml"] += "mcp_servers: {notes: {command: [python, -c, 'open(\"x\", \"w\")']}}\n"
        assert load(shelf, put(db, starts)) is None  # no .py, but it would start a program: not data
    finally:
        shelf.close()
        db.close()


def test_a_pinned_session_of_a_refused_version_is_refused_naming_it(tmp_path):
    shelf, db = shelf_on(tmp_path, BundlePolicy(KEY), NOTES + "on_change: pin\n")
    try:
        version = put(db, data_bundle())
        with pytest.raises(wire.RequestFailed) as refused:
            load(shelf, version)
        assert refused.value.reason == wire.UNAVAILABLE
        message = str(refused.value)
        assert f"session s-1: bot notes version {version} is not loaded on this replica" in message
        assert "on_change is pin" in message and "CHATRUN_BUNDLE_KEY" in message
    finally:
        shelf.close()
        db.close()


def test_the_refusals_are_counted_by_reason(tmp_path):
    pytest.importorskip("prometheus_client")
    from chatrun.server.metrics import ServerMetrics

    shelf, db = shelf_on(tmp_path, BundlePolicy(KEY))
    try:
        class Registry:  # what the metrics read of a server's registry
            waiting = active = 0

            @staticmethod
            def live_count() -> int:
                return 0

        shelf.metrics = ServerMetrics(Registry())  # type: ignore[arg-type]
        load(shelf, put(db, data_bundle()))
        assert 'chatrun_bundles_refused_total{bot="notes",reason="unsigned"} 1.0' in shelf.metrics.render().decode()
    finally:
        shelf.close()
        db.close()


def test_publishing_signs_and_re_signs_an_unsigned_copy_keeping_its_time(tmp_path, caplog):
    shelf, db = shelf_on(tmp_path, BundlePolicy(KEY))
    try:
        version = shelf.bots["notes"].primary.content_version
        files = bot_files(tmp_path / "served")
        db.put_record(record_key("notes", version), {"bot": "notes", "label": "1", "files": files, "published": 7.0})
        with caplog.at_level(logging.WARNING, "chatrun.versions"):
            asyncio.run(shelf.publish())
        assert "was not signed with this replica's bundle key" in caplog.text
        stored = db.get_record(record_key("notes", version))
        assert stored["published"] == 7.0 and shelf.bots["notes"].primary.published == 7.0
        assert BundlePolicy(KEY).signed(signed_part(stored, "notes", version))
        assert not BundlePolicy(b"y" * 32).signed(signed_part(stored, "notes", version))
        assert not BundlePolicy(KEY).signed(signed_part(stored, "other", version))  # bound to its bot
    finally:
        shelf.close()
        db.close()


def test_bundles_over_the_size_limit_are_refused_at_publish_and_at_load(tmp_path):
    small = BundlePolicy(KEY, max_bytes=2000)
    shelf, db = shelf_on(tmp_path, small)
    try:
        (tmp_path / "served" / "catalogue.json").write_text("[" + ",".join(['"item"'] * 500) + "]")
        with pytest.raises(ChatrunError) as refused:
            shelf.check_bundles()
        assert "bot notes version 1: its files are 0.0 MB, over the bundle limit of 0.0 MB" in str(refused.value)
        assert "catalogue.json" in str(refused.value) and "--max-bundle-mb" in str(refused.value)
        big = data_bundle("x" * 3000)
        assert load(shelf, put(db, big, KEY)) is None  # signed, but too large to load
    finally:
        shelf.close()
        db.close()


def test_serve_refuses_a_short_key_and_an_oversized_bot_with_the_reason(tmp_path, monkeypatch):
    from chatrun.cli import main

    (tmp_path / "bot.yaml").write_text(NOTES)
    short = tmp_path / "short.key"
    short.write_text("abc\n")
    result = CliRunner().invoke(main, ["serve", str(tmp_path), "--store", "memory://", "--bundle-key", str(short)])
    assert result.exit_code == 1 and "the bundle key must be at least 16 bytes (it has 3)" in result.output
    monkeypatch.setenv("CHATRUN_BUNDLE_KEY", "short")
    with pytest.raises(ChatrunError, match=r"\$CHATRUN_BUNDLE_KEY: the bundle key must be at least 16 bytes"):
        read_key(None)
    monkeypatch.delenv("CHATRUN_BUNDLE_KEY")
    assert read_key(None) is None
    missing = CliRunner().invoke(main, ["serve", str(tmp_path), "--store", "memory://", "--bundle-key",
                                        str(tmp_path / "nope.key")])
    assert missing.exit_code == 1 and "nope.key: cannot read it" in missing.output
    (tmp_path / "catalogue.json").write_text("[" + ",".join(['"item"'] * 200_000) + "]")
    large = CliRunner().invoke(main, ["serve", str(tmp_path), "--store", "memory://", "--max-bundle-mb", "0.5"])
    assert large.exit_code == 1 and "over the bundle limit of 0.5 MB" in large.output


def test_diff_reads_a_stored_version_with_code_only_when_signed_with_the_key(tmp_path, monkeypatch):
    """`chatrun diff --store` loads the versions it names, and loading imports handler modules."""
    from chatrun.cli import main

    monkeypatch.delenv("CHATRUN_BUNDLE_KEY", raising=False)
    shelf, db = shelf_on(tmp_path, BundlePolicy(KEY))
    marker = tmp_path / "imported"
    forged = put(db, code_bundle(marker))
    db.close()
    shelf.close()
    store = f"sqlite:///{tmp_path / 's.db'}"
    refused = CliRunner().invoke(main, ["diff", str(tmp_path / "served"), forged, "--store", store, "--bot", "notes"])
    assert refused.exit_code == 2 and not marker.exists(), refused.output
    assert f"version {forged} of bot notes is not read: it holds code (evil.py)" in refused.output
    assert "chatrun diff --bundle-key FILE" in refused.output
    key = tmp_path / "bundle.key"
    key.write_bytes(KEY)
    db = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    files = code_bundle(marker)
    files["evil.py"] += "# the owner's\n"
    signed = put(db, files, KEY)
    db.close()
    read = CliRunner().invoke(main, ["diff", str(tmp_path / "served"), signed, "--store", store, "--bot", "notes",
                                     "--bundle-key", str(key)])
    assert read.exit_code == 0 and "tool t: added" in read.output, read.output
