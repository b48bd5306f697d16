"""Shared test setup: offline tiktoken encodings, and small bot-writing helpers."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TIKTOKEN = REPO.parent / "shared" / "tiktoken"

# Tests never download: point tiktoken at the encodings shipped beside the repo.
if SHARED_TIKTOKEN.is_dir():
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED_TIKTOKEN))


@pytest.fixture
def fake(monkeypatch):
    """A local OpenAI-compatible server; the openai provider is pointed at it through the environment."""
    from chatrun.testing.fake_openai import FakeOpenAI

    with FakeOpenAI() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        yield server


@pytest.fixture
def write_bot(tmp_path):
    """Write a single-file bot from YAML text and return its path."""

    def write(text: str, name: str = "bot.yaml", extra: dict[str, str] | None = None) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        for rel, content in (extra or {}).items():
            (tmp_path / rel).write_text(textwrap.dedent(content))
        return path

    return write


def pytest_collection_modifyitems(items):
    """Every browser or subprocess test is slow too, so `-m "not slow"` leaves them out."""
    for item in items:
        if item.get_closest_marker("browser") or item.get_closest_marker("subprocess"):
            item.add_marker(pytest.mark.slow)
