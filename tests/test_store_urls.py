"""SQLite store URLs as SQLAlchemy reads them (three slashes relative, four absolute), no
folder created behind the user's back, and the resolved file named at start-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chatrun.errors import ChatrunError
from chatrun.store import open_store

REPO = Path(__file__).resolve().parents[1]


def test_three_slashes_is_relative_four_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    open_store("sqlite:///here/rel.db").close()
    assert (tmp_path / "here" / "rel.db").exists()
    absolute = tmp_path / "abs.db"
    open_store(f"sqlite:///{absolute}").close()  # f-string: sqlite:// + / + /tmp/... = four slashes
    assert absolute.exists()


def test_a_missing_folder_is_an_error_naming_it_not_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ChatrunError) as failed:
        open_store("sqlite:///proc/nope.db")
    message = str(failed.value)
    assert f"the folder {tmp_path / 'proc'} does not exist" in message
    assert "sqlite:////abs/path.db absolute" in message
    assert not (tmp_path / "proc").exists()


@pytest.mark.subprocess
def test_the_repl_says_where_the_store_file_is(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(REPO / "runner")
    out = subprocess.run([sys.executable, "-m", "chatrun", "repl", str(REPO / "bots" / "hello"), "--play-model",
                          "--store", "sqlite:///chat.db"], input="/quit\n", capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"store: SQLite file {tmp_path / 'chat.db'}" in out.stdout + out.stderr
    missing = subprocess.run([sys.executable, "-m", "chatrun", "repl", str(REPO / "bots" / "hello"),
                              "--store", "sqlite:///tmp/x.db"], input="", capture_output=True, text=True,
                             cwd=tmp_path, env=env, timeout=60)
    assert missing.returncode == 1
    assert f"the folder {tmp_path / 'tmp'} does not exist" in missing.stderr
    assert not (tmp_path / "tmp").exists()
