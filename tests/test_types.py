"""The package type-checks clean: `python -m mypy runner/chatrun` at mypy's default
strictness, configured by pyproject.toml's [tool.mypy] (CI runs it through this test)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a cold mypy run takes about 20 s of CPU
def test_mypy_finds_no_errors_in_the_package() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]' brings it)")
    run = subprocess.run([sys.executable, "-m", "mypy", "runner/chatrun"], cwd=REPO,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"mypy runner/chatrun failed:\n{run.stdout}{run.stderr}"
    assert "Success: no issues found" in run.stdout
