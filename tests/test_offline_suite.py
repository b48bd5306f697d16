"""The README's test command on a machine without tiktoken's encoding files: the tests that
need exact token counts are skipped, with one line saying why and how to provide them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.subprocess


def test_without_encodings_the_exact_count_tests_skip_with_one_clear_line(tmp_path):
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty"),
           # No download either, even on a machine with a network: nothing listens on port 9.
           "HTTPS_PROXY": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    (tmp_path / "empty").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "tests/test_tokens.py", "tests/test_memory.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    lines = [line for line in out.stdout.splitlines() if "encoding files are not available" in line]
    assert len(lines) == 1, out.stdout[-3000:]
    assert lines[0].startswith("7 skipped: tiktoken's encoding files are not available")
    assert "TIKTOKEN_CACHE_DIR" in lines[0]
    assert "Traceback" not in out.stdout and "ConnectionError" not in out.stdout
    assert not os.listdir(tmp_path / "empty")


@pytest.mark.needs_encodings
def test_with_encodings_nothing_is_skipped():
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "tests/test_tokens.py"],
        cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    assert "skipped" not in out.stdout.splitlines()[-1], out.stdout[-1000:]
