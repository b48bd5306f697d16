"""Every example in README.md, CONTRIBUTING.md, bench/README.md and docs/*.md runs as printed.

Each fenced block is run by its language:
- `sh`: every command runs (bash, `chatrun` on PATH) and must exit 0;
- `console`: every `$ command` runs, and what it prints must be the lines that follow it;
- `python`: runs as a script (an OpenAI-compatible fake server answers any model call);
- `yaml`: parses; `json`: parses as one document, or line by line; `html`: each inline <script> parses, as a
  module when it says type="module" (node --check);
- a block without a language is prose (a synopsis, a diagram) and is not run.

A `<!-- doc-test: ... -->` comment on the line before a block says more:
- `skip: REASON` — it cannot run here (it installs packages, or needs a running server);
- `serve` — an sh block of `chatrun serve` commands, which serve until stopped: each runs with
  `--help` appended, so its bots and options are still checked (other lines are not run);
- `docker` — an sh block of docker commands (no Docker engine runs here: docs/deploy.md): `docker
  build` needs the Dockerfile; `docker run ... IMAGE ARGS` runs as the Dockerfile's ENTRYPOINT
  with ARGS and `--help` (its /bots/ are the page folder's bots/); `docker compose` may name only
  compose.yaml's services and profiles;
- `file NAME` — a yaml block is written to NAME (a path: its folders are made) in the folder
  later blocks of the page run in;
- `mcp config` — a json block is an MCP client's configuration: each of its `mcpServers` is
  started as configured, in the page's folder, through the MCP SDK's client, and every tool it
  lists must be documented on the page (as `NAME(...)`);
- `bot` — a yaml block is a whole bot: `chatrun validate` must find it valid;
- `transcript BOT` — a yaml block is a golden transcript of BOT (e.g. bots/travel), written
  into a copy of its transcripts/ folder; `chatrun test` must pass it;
- `output of COMMAND` — the block is exactly what COMMAND prints;
- `given: PYTHON` — a python block is a fragment; this code runs before it;
- `prints` — the block is exactly what the page's python block before it printed.

Every page runs in a fresh folder holding a link to the repository's bots/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bots" / "README.md",
         REPO / "CONTRIBUTING.md", REPO / "bench" / "README.md"]
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$")

pytestmark = pytest.mark.subprocess


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str  # what the doc-test comment says, or ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(before)
        found.append(Block(page, i + 1, opening.group(1), "\n".join(lines[i + 1:end]) + "\n",
                           marker.group(1) if marker else ""))
        i = end + 1
    return found


def shell_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO / "runner")
    env["NO_COLOR"] = "1"
    return env


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


def commands(text: str) -> list[str]:
    """Shell lines, with `\\` continuations joined and comments dropped."""
    joined = text.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# `docker run`'s options that take a value (the others, e.g. --rm, -d, take none).
DOCKER_RUN_VALUES = {"-p", "--publish", "-e", "--env", "-v", "--volume", "--name", "--network", "--env-file", "-u"}


def check_docker(block: Block, cwd: Path, env: dict[str, str]) -> None:
    import shlex

    import yaml

    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    profiles = {p for service in compose["services"].values() for p in service.get("profiles", [])}
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", (REPO / "Dockerfile").read_text(), re.M).group(1))
    for command in commands(block.text):
        words = shlex.split(command, comments=True)
        assert words[0] == "docker", f"{block.where}: `{command}` is not a docker command"
        if words[1] == "run":
            rest = words[2:]
            while rest[0].startswith("-"):
                rest = rest[2:] if rest[0] in DOCKER_RUN_VALUES else rest[1:]
            args = [re.sub(r"^/bots/", "bots/", arg) for arg in rest[1:]]
            missing = [arg for arg in args if arg.startswith("bots/") and not (cwd / arg / "bot.yaml").exists()]
            assert not missing, f"{block.where}: no bot at {missing}"  # --help alone would not look
            out = subprocess.run([*entry, *args, "--help"], cwd=cwd, env=env, capture_output=True, text=True,
                                 timeout=120)
            assert out.returncode == 0, f"{block.where}: `{command}` is refused:\n{out.stdout}{out.stderr}"
        elif words[1] == "compose":
            used = {words[i + 1] for i, w in enumerate(words) if w == "--profile"}
            assert used <= profiles, f"{block.where}: compose.yaml has no profile {used - profiles}"
            named = [w for i, w in enumerate(words[2:], 2) if not w.startswith("-") and words[i - 1] != "--profile"]
            unknown = [w for w in named[1:] if w not in compose["services"]]  # named[0]: up, ps, ...
            assert not unknown, f"{block.where}: compose.yaml has no service {unknown}"
        else:
            assert words[1] == "build" and (REPO / "Dockerfile").exists(), f"{block.where}: `{command}`"


def check_console(block: Block, cwd: Path, env: dict[str, str]) -> None:
    steps: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    for command, expected in steps:
        out = run(command, cwd, env)
        printed = (out.stdout + out.stderr).splitlines()
        assert printed == expected, f"{block.where}: `{command}` printed:\n" + "\n".join(printed)


def check_yaml(block: Block, cwd: Path, env: dict[str, str]) -> None:
    yaml.safe_load(block.text)  # a comment-only block (an editor's schema line) is fine too
    kind, _, arg = block.marker.partition(" ")
    if kind == "file":
        (cwd / arg).parent.mkdir(parents=True, exist_ok=True)
        (cwd / arg).write_text(block.text)
    elif kind == "bot":
        bot = cwd / "doc_bot" / "bot.yaml"
        bot.parent.mkdir(exist_ok=True)
        bot.write_text(block.text)
        out = run(f"chatrun validate {bot.parent}", cwd, env)
        assert out.returncode == 0 and "valid" in out.stdout, f"{block.where}:\n{out.stdout}{out.stderr}"
    elif kind == "transcript":
        bot = cwd / f"copy_of_{Path(arg).name}"
        if not bot.exists():
            shutil.copytree(REPO / arg, bot)
        path = bot / "transcripts" / f"doc_{block.line}.yaml"
        path.write_text(block.text)
        out = run(f"chatrun test {path}", cwd, env)
        assert out.returncode == 0, f"{block.where}:\n{out.stdout}{out.stderr}"


def check_html(block: Block, cwd: Path) -> bool:
    """False when node is missing (the caller skips once every other block was checked)."""
    node = shutil.which("node")
    if node is None:
        return False
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", block.text, re.S)
    for n, (attributes, code) in enumerate(scripts):
        if not code.strip():
            continue
        module = 'type="module"' in attributes
        path = cwd / f"script_{block.line}_{n}.{'mjs' if module else 'cjs'}"
        path.write_text(code)
        out = subprocess.run([node, "--check", str(path)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"{block.where}: the script does not parse:\n{out.stderr}"
    return True


def check_mcp_config(block: Block, cwd: Path, env: dict[str, str]) -> bool:
    """False when the MCP SDK is not installed (the caller skips once every other block was checked)."""
    try:
        from mcp import Client, StdioServerParameters
    except ImportError:
        return False
    import asyncio

    async def listed(server: dict) -> list[str]:
        params = StdioServerParameters(command=server["command"], args=server.get("args", []), cwd=str(cwd),
                                       env={**env, **server.get("env", {})})
        async with Client(params) as client:
            tools = await asyncio.wait_for(client.list_tools(), 120)
        return [tool.name for tool in tools.tools]

    page = block.page.read_text()
    for name, server in json.loads(block.text)["mcpServers"].items():
        names = asyncio.run(listed(server))
        assert names, f"{block.where}: MCP server {name} lists no tools"
        undocumented = [tool for tool in names if f"`{tool}(" not in page]
        assert not undocumented, f"{block.where}: MCP server {name}'s tools {undocumented} are not on the page"
    return True


def check_python(block: Block, cwd: Path, env: dict[str, str], fake_url: str) -> str:
    given = block.marker.removeprefix("given:").strip() if block.marker.startswith("given:") else ""
    code = f"{given}\n{block.text}" if given else block.text
    # tests/ too: a `given:` line may start a server the example talks to (tests/doc_servers.py).
    env = {**env, "OPENAI_BASE_URL": fake_url, "OPENAI_API_KEY": "doc-test",
           "PYTHONPATH": f"{env['PYTHONPATH']}{os.pathsep}{REPO / 'tests'}"}
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, f"{block.where}:\n{out.stdout}{out.stderr}"
    return out.stdout


def check(block: Block, cwd: Path, env: dict[str, str], fake_url: str, printed: list[str]) -> bool:
    """Run the block; False when it could not be checked on this machine (no node). `printed`
    holds what the page's last python block printed (for a `prints` block)."""
    if block.marker == "prints":
        assert printed, f"{block.where}: a `prints` block needs a python block before it"
        assert printed[-1].strip() == block.text.strip(), f"{block.where}: the python block prints:\n{printed[-1]}"
    elif block.marker.startswith("output of "):
        command = block.marker.removeprefix("output of ").strip("` ")
        out = run(command, cwd, env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == block.text.strip(), f"{block.where}: `{command}` prints:\n{out.stdout}"
    elif block.marker == "docker":
        check_docker(block, cwd, env)
    elif block.marker == "serve":
        for command in commands(block.text):
            if command.startswith("chatrun serve"):
                out = run(command + " --help", cwd, env)
                assert out.returncode == 0, f"{block.where}: `{command}` is refused:\n{out.stdout}{out.stderr}"
    elif block.lang == "sh":
        for command in commands(block.text):
            out = run(command, cwd, env)
            assert out.returncode == 0, f"{block.where}: `{command}` failed:\n{out.stdout}{out.stderr}"
            assert "Traceback" not in out.stdout + out.stderr, f"{block.where}: `{command}`"
    elif block.lang == "console":
        check_console(block, cwd, env)
    elif block.lang == "python":
        printed.append(check_python(block, cwd, env, fake_url))
    elif block.lang == "yaml":
        check_yaml(block, cwd, env)
    elif block.marker == "mcp config":
        return check_mcp_config(block, cwd, env)
    elif block.lang == "json":  # one JSON document (a settings file), or one per line (frames)
        try:
            json.loads(block.text)
        except json.JSONDecodeError:
            for line in block.text.splitlines():
                if line.strip():
                    json.loads(line)
    elif block.lang == "html":
        return check_html(block, cwd)
    return True


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_example_of_the_page_runs_as_printed(page, tmp_path, fake):
    from chatrun.testing.fake_openai import echo

    fake.responder = echo
    (tmp_path / "bots").symlink_to(REPO / "bots")
    env = shell_env()
    skipped, unchecked, printed = [], [], []
    for block in blocks(page):
        if block.marker.startswith("skip"):
            skipped.append(block.where)
        elif not check(block, tmp_path, env, fake.base_url, printed):
            unchecked.append(block.where)
    assert len(skipped) <= 3, f"skip markers are for what truly cannot run here: {skipped}"
    if unchecked:
        pytest.skip(f"node or the MCP SDK is not installed: {', '.join(unchecked)} was not checked")


def test_markers_are_recognised():
    """A misspelt marker would silently run a block the wrong way (or not at all)."""
    kinds = ("skip", "serve", "docker", "file ", "bot", "transcript ", "output of ", "given:", "mcp config", "prints")
    for page in PAGES:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if "doc-test" in line:
                marker = MARKER.match(line)
                assert marker and marker.group(1).startswith(kinds), f"{page.name}:{n}: {line}"


@pytest.mark.parametrize("command", ["", "validate", "graph", "repl", "test", "serve", "upgrade", "diff"])
def test_help_examples_name_files_that_exist_and_the_quick_ones_run(command, tmp_path):
    env = shell_env()
    out = run(f"chatrun {command} --help", REPO, env)
    assert out.returncode == 0, out.stderr
    examples = out.stdout.split("Examples:", 1)[1].splitlines() if "Examples:" in out.stdout else []
    examples = [line.strip() for line in examples if line.strip().startswith(("chatrun ", "printf "))]
    assert examples, out.stdout
    for example in examples:
        for word in example.split():
            if word.startswith("bots/"):
                assert list(REPO.glob(word.rstrip("/"))), f"`chatrun {command} --help` names {word}, which does not exist"
        quick = example.startswith(("chatrun validate", "chatrun graph")) and not any(c in example for c in "|>")
        if quick:
            ran = run(example, REPO, env)
            assert ran.returncode == 0, f"{example}:\n{ran.stdout}{ran.stderr}"
