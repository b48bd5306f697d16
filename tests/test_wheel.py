"""The first hour from a package index (issue 39), end to end: the wheel is built from this
checkout, installed into a fresh virtualenv, and in an empty folder (no checkout anywhere on the
path) a newcomer gets from nothing to a passing `chatrun test` of an example bot by running only
what the CLI prints. The fresh virtualenv sees the test virtualenv's packages (chatrun's
dependencies) through a .pth line, so nothing is downloaded; chatrun itself comes from the wheel."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    out = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{' '.join(args)}:\n{out.stdout}{out.stderr}"
    assert "Traceback" not in out.stdout + out.stderr
    return out.stdout


def fresh_venv(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A virtualenv holding only the built wheel, the test virtualenv's packages behind it."""
    pytest.importorskip("hatchling", reason="the `test` extra installs hatchling, which builds the wheel offline")
    built = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(built),
         str(REPO)], tmp_path, dict(os.environ))
    wheel = next(built.glob("chatrun-*.whl"))
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, dict(os.environ))
    python = venv / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    tmp_path, dict(os.environ)).strip())
    # After the fresh site-packages: the dependencies. A line of a .pth only adds a folder to the path
    # (the test virtualenv's own .pth files, an editable chatrun's among them, are not read).
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         str(wheel)], tmp_path, dict(os.environ))
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV") and not key.startswith("OPENAI_")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["NO_COLOR"] = "1"
    return venv, env


def test_from_the_wheel_alone_a_newcomer_gets_an_example_bot_passing_its_transcripts(tmp_path):
    venv, env = fresh_venv(tmp_path)
    home = tmp_path / "empty"
    home.mkdir()
    where = run(["python", "-c", "import chatrun; print(chatrun.__file__)"], home, env)
    assert Path(where.strip()).is_relative_to(venv), where  # the wheel's chatrun, not the checkout's

    # What the README says first, on a machine with no checkout: the error says how to get the bot.
    missing = subprocess.run(["chatrun", "repl", "bots/hello"], cwd=home, env=env, capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr, missing.stderr
    hint = re.search(r"`(chatrun init --example hello bots/hello)`", missing.stderr)
    assert hint, missing.stderr
    run(hint.group(1).split(), home, env)
    hello = len(list((home / "bots" / "hello" / "transcripts").glob("*.yaml")))
    assert run(["chatrun", "test", "bots/hello"], home, env).splitlines()[-1] == f"{hello} passed, 0 failed"

    # `chatrun examples` lists the bots and prints the command that copies one; init prints what to run next.
    listed = run(["chatrun", "examples"], home, env)
    assert re.search(r"^travel\s+Books flights", listed, re.M), listed
    copy = re.search(r"chatrun init --example (\w+) \[DIR\]", listed)
    assert copy, listed
    made = run(["chatrun", "init", "--example", copy.group(1)], home, env)
    nxt = re.search(r"^next: (.+)$", made, re.M)
    assert nxt, made
    for command in nxt.group(1).split(" && "):
        if command.split()[:2] != ["chatrun", "repl"]:  # the REPL waits for a person
            printed = run(command.split(), home, env)
    count = len(list((home / copy.group(1) / "transcripts").glob("*.yaml")))
    assert count and printed.splitlines()[-1] == f"{count} passed, 0 failed", printed
    assert not list(home.rglob("*site-packages*"))
    modeline = (home / copy.group(1) / "bot.yaml").read_text().splitlines()[0]
    assert modeline == "# yaml-language-server: $schema=.chatrun/schemas/bot.schema.json"
