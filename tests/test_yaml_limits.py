"""Pathological YAML gets a clear error at its line, fast: deep nesting, alias bombs, tabs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.subprocess


def validate(path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    return subprocess.run([sys.executable, "-m", "chatrun", "validate", str(path)], capture_output=True,
                          text=True, timeout=120, env=env)


def alias_bomb(levels: int = 9) -> str:
    """`a` holds 9 strings, `b` 9 copies of `a`, ... : 9^9 strings once expanded."""
    lines = ["name: bomb", "routes: {chat: {default: true, system: hi}}",
             "state:", '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"  {cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_fails_fast_with_a_clear_error_at_its_line(tmp_path):
    bot = tmp_path / "bomb.yaml"
    bot.write_text(alias_bomb())
    out = validate(bot)  # before the bound: > 30 s and 2.3 GB; the timeout above is 120 s
    assert out.returncode == 1, out.stdout + out.stderr
    assert "YAML aliases expand to too many values" in out.stdout
    line = next(x for x in out.stdout.splitlines() if "alias" in x)
    assert line.startswith(f"{bot}:4:")  # inside the anchored list the aliases multiply
    assert "chatrun bug" not in out.stdout + out.stderr


def test_aliases_that_repeat_a_little_are_fine(tmp_path):
    bot = tmp_path / "bot.yaml"
    bot.write_text("name: ok\nstate:\n  base: &base {a: 1, b: [1, 2, 3]}\n  copy: *base\n  more: *base\n"
                   "routes: {chat: {default: true, system: hi}}\n")
    out = validate(bot)
    assert out.returncode == 0, out.stdout


def test_500_levels_of_nesting_is_an_error_at_the_line_not_a_chatrun_bug(tmp_path):
    bot = tmp_path / "deep.yaml"
    nested = "".join("  " * (i + 1) + f"k{i}:\n" for i in range(500)) + "  " * 501 + "v: 1\n"
    bot.write_text("name: deep\nroutes: {chat: {default: true, system: hi}}\nstate:\n" + nested)
    out = validate(bot)
    assert out.returncode == 1
    assert "chatrun bug" not in out.stdout + out.stderr
    deep = [x for x in out.stdout.splitlines() if "nested more than 100 levels" in x]
    assert len(deep) == 1 and deep[0].startswith(f"{bot}:104:"), out.stdout


def test_a_tab_is_named_as_a_tab(tmp_path):
    bot = tmp_path / "tab.yaml"
    bot.write_text("name: tab\nroutes:\n\tchat: {default: true}\n")
    out = validate(bot)
    assert out.returncode == 1
    assert f"{bot}:3:1: error: YAML syntax error" in out.stdout
    assert "a tab character; YAML indents with spaces only" in out.stdout
