"""`chatrun record --from-session` on a session whose messages attached files: the files are
written beside the transcript (`<name>.files/`) and attached again (`attach:`), so the replay
sends what the user sent and does what the session did (before, turn 1 failed: the replay's
blob area has no such upload). The session runs in-process on a real SQLite store and its
blob folder; the command reads them as it reads a server's."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import chatrun
from chatrun.cli import main
from chatrun.models.scripted import ScriptedModel
from chatrun.store.blobs import FolderBlobs
from chatrun.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parents[1]
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


def claims_session(tmp_path: Path, files: list[tuple[bytes, str, str]], *, second: bytes | None = None) -> str:
    """bots/claims, a session on sqlite:///chat.db whose first message attaches `files` (and
    whose second, if given, attaches `second` again as dent.png)."""
    shutil.copytree(REPO / "bots" / "claims", tmp_path / "bots" / "claims",
                    ignore=shutil.ignore_patterns("__pycache__", "transcripts"))
    bot = chatrun.load_bot(tmp_path / "bots" / "claims")
    store = SQLiteStore(tmp_path / "chat.db")
    answers = [{"text": "I see a dented corner. Your order number?"}, {"text": "And this one too."}]
    session = bot.session(store=store, model=ScriptedModel(answers), session_id="c1",
                          blobs=FolderBlobs(tmp_path / "chat.db.blobs"))
    refs = [session.attach(data, media_type, name).to_dict() for data, media_type, name in files]
    session.chat({"userMessage": "My parcel arrived like this", "attachments": refs})
    if second is not None:
        session.chat({"userMessage": "Another photo", "attachments": [session.attach(second, "image/png", "dent.png")
                                                                      .to_dict()]})
    store.close()
    return "c1"


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def record(path: str) -> object:
    return CliRunner().invoke(main, ["record", "--from-session", "c1", "--store", "sqlite:///chat.db",
                                     "--bot", "bots/claims", "-o", path])


def test_the_attached_files_are_written_beside_the_transcript_and_the_replay_sends_them(here):
    claims_session(here, [(PNG, "image/png", "dent.png"), (PDF, "application/pdf", "../invoice.pdf")], second=PNG + b"\0")
    result = record("bots/claims/transcripts/c1.yaml")
    assert result.exit_code == 0, result.output
    assert "2 turns recorded; the replay does what the session did" in result.output
    folder = here / "bots" / "claims" / "transcripts"
    doc = yaml.safe_load((folder / "c1.yaml").read_text())
    first, second = doc["turns"]
    assert first["data"] == {"userMessage": "My parcel arrived like this"}
    assert first["attach"] == [{"file": "c1.files/dent.png", "media_type": "image/png", "name": "dent.png"},
                               {"file": "c1.files/invoice.pdf", "media_type": "application/pdf",
                                "name": "../invoice.pdf"}]  # the name as sent; the file stays in c1.files/
    # Other bytes under a name already taken get the start of their ref in front.
    assert second["attach"][0]["file"].startswith("c1.files/") and second["attach"][0]["file"].endswith("-dent.png")
    assert (folder / "c1.files" / "dent.png").read_bytes() == PNG
    assert (folder / "c1.files" / "invoice.pdf").read_bytes() == PDF
    assert (folder / second["attach"][0]["file"]).read_bytes() == PNG + b"\0"
    tested = CliRunner().invoke(main, ["test", str(folder / "c1.yaml")])
    assert tested.exit_code == 0 and "1 passed, 0 failed" in tested.output, tested.output


def test_a_file_gone_from_the_blob_area_is_one_line_naming_the_turn(here):
    claims_session(here, [(PNG, "image/png", "dent.png")])
    shutil.rmtree(here / "chat.db.blobs")
    result = record("c1.yaml")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "session c1, turn 1: the attached file 'dent.png' is no longer in the store's blob area" in result.output
    assert not (here / "c1.yaml").exists()


def test_recording_over_a_file_that_is_not_a_transcript_is_refused_and_writes_nothing(here):
    claims_session(here, [(PNG, "image/png", "dent.png")])
    bot = here / "bots" / "claims" / "bot.yaml"
    before = bot.read_bytes()
    result = record("bots/claims/bot.yaml")  # one slip of the hand: the bot itself
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "bots/claims/bot.yaml holds no transcript (no `turns:`)" in result.output
    assert bot.read_bytes() == before
    assert not (here / "bots" / "claims" / "bot.files").exists()  # nor the files beside it
    assert record("bots/claims/transcripts/c1.yaml").exit_code == 0  # a new file is written
    assert record("bots/claims/transcripts/c1.yaml").exit_code == 0  # and a transcript replaced
