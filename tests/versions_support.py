"""Bots with several versions (docs/versions.md) for the tests of serving them: the `versions/`
folders written, and a session started on version 1 alone, as a replica not yet upgraded
starts it, before an app serving every version opens it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from server_support import app_for_testclient


def write_versions(root: Path, texts: Mapping[str, str]) -> Path:
    """The bot folder `root` with `versions/LABEL/bot.yaml` holding each label's text; returns it."""
    for label, text in texts.items():
        (root / "versions" / label).mkdir(parents=True)
        (root / "versions" / label / "bot.yaml").write_text(text)
    return root


def started_on_version_1(root: Path, bot: str, store: str, text: str, session: str = "s") -> dict[str, Any]:
    """The reply (JSON) to `text`, the first message of `bot`'s `session`, created by an app
    serving only `root`'s version 1 on `store`."""
    with TestClient(app_for_testclient(str(root / "versions" / "1"), store)) as v1:
        assert v1.post(f"/bots/{bot}/sessions", json={"id": session}).status_code == 201
        return v1.post(f"/bots/{bot}/sessions/{session}/messages", json={"userMessage": text}).json()
