"""A store's password is never shown: store/urls.py's shown_url is the one rule, and every door
that names a store — each CLI command's error line (report, versions, purge, diff, record,
index, serve), a store's own errors and `url` (the server's startup line and logs read it), a
recorded transcript's header — shows the URL through it. The stores are unreachable on purpose
(port 1 of the loopback, or a scheme chatrun does not know): each error names the store."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from chatrun.cli import main
from chatrun.errors import ChatrunError
from chatrun.store import open_store
from chatrun.store.urls import shown_url
from chatrun.transcripts.from_session import write_transcript

SECRET = "s3cret-pw"
BOT = str(Path(__file__).resolve().parents[1] / "bots" / "travel")
PG = f"postgresql://app:{SECRET}@127.0.0.1:1/chat"
PG_QUERY = f"postgresql://app@127.0.0.1:1/chat?sslmode=disable&password={SECRET}"
REDIS = f"redis://:{SECRET}@127.0.0.1:1/0"
UNKNOWN = f"mysql://app:{SECRET}@db/chat"


@pytest.mark.parametrize(("url", "shown"), [
    (f"postgresql://app:{SECRET}@db:5432/chat", "postgresql://app:***@db:5432/chat"),
    (f"redis://:{SECRET}@cache:6379/0", "redis://:***@cache:6379/0"),
    (f"rediss://user:{SECRET}@cache/0?max_connections=5", "rediss://user:***@cache/0?max_connections=5"),
    ("postgresql://app:p@ss@db/chat", "postgresql://app:***@db/chat"),  # an unescaped @ in the password
    ("postgresql://app:s%40c@db/chat", "postgresql://app:***@db/chat"),  # an escaped one
    (PG_QUERY, "postgresql://app@127.0.0.1:1/chat?sslmode=disable&password=***"),  # libpq's ?password=
    (f"sqlite:///x.db?blobs=redis://:{SECRET}@h/1", "sqlite:///x.db?blobs=redis://:***@h/1"),  # a URL in a URL
    (f"redis://u:{SECRET}@[::1/0", "redis://***@[::1/0"),  # unreadable: the whole user part goes
    ("sqlite:///data/chat.db", "sqlite:///data/chat.db"),  # nothing to hide: as given
    ("postgresql://app@db/chat", "postgresql://app@db/chat"),
    ("memory://", "memory://"),
])
def test_shown_url_hides_every_password_and_leaves_the_rest_as_given(url, shown):
    assert shown_url(url) == shown


@pytest.mark.parametrize("args", [
    ["report", "--store", PG],
    ["report", "--store", UNKNOWN],
    ["report", "--store", REDIS],
    ["versions", "list", "--store", PG_QUERY],
    ["versions", "prune", "--store", PG, "--bot", "travel", "--keep", "v1"],
    ["purge", BOT, "--store", PG_QUERY],
    ["diff", BOT, BOT, "--store", PG],
    ["diff", BOT, BOT, "--store", UNKNOWN],
    ["record", "--from-session", "s1", "--store", PG, "-o", "never.yaml"],
    ["index", BOT, "--store", REDIS],
    ["serve", BOT, "--port", "0", "--store", PG_QUERY],
], ids=lambda args: " ".join(a for a in args[:2] if not a.startswith(("/", "-"))))
def test_no_command_shows_a_store_password(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code != 0, result.output
    shown = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "***" in shown, shown  # the store is named, without its password
    assert SECRET not in shown, shown


def test_a_store_error_and_a_recorded_header_show_no_password(tmp_path):
    with pytest.raises(ChatrunError) as caught:
        open_store(UNKNOWN)
    assert SECRET not in str(caught.value) and "mysql://app:***@db/chat" in str(caught.value)
    with pytest.raises(ChatrunError) as caught:
        open_store(PG)  # a shared store is opened asynchronously: the refusal names it
    assert SECRET not in str(caught.value) and "***" in str(caught.value)
    path = tmp_path / "t.yaml"
    write_transcript({"bot": "../travel", "turns": []}, path, "s1", PG_QUERY)
    header = path.read_text().splitlines()[1]
    assert SECRET not in header and "password=***" in header


@pytest.mark.parametrize("url", [PG, PG_QUERY, REDIS])
def test_a_shared_stores_url_the_startup_line_and_logs_read_shows_no_password(url):
    from chatrun.cli._output import describe_store
    from chatrun.store.aio import open_async_store

    store = open_async_store(url)  # not connected yet: the URL is all that is read
    assert SECRET not in store.url and "***" in describe_store(store)
