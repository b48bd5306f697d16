"""Start-up stays cheap (issue 26): a command imports what it needs when it runs.

`chatrun --help` lists the commands without importing them (cli/__init__.py keeps their
one-line summaries), and `import chatrun` loads nothing heavy until a public name is used
(chatrun/__init__.py's PEP 562 `__getattr__`). These tests pin *what* is imported, in a
fresh interpreter as a user's shell starts it; bench/bench_startup.py measures the time.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest

from chatrun.cli import COMMANDS, SUMMARIES, main

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("chatrun.engine", "chatrun.definition.loader", "chatrun.toolkinds", "jinja2", "httpx",
         "jsonschema", "yaml", "openai", "asyncio")


def imported_by(*args: str) -> set[str]:
    """The modules `python -m chatrun ARGS` imports, as `python -X importtime` lists them."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "chatrun", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


def loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.subprocess
def test_help_imports_no_command_and_no_engine():
    modules = imported_by("--help")
    assert "click" in modules  # the measurement sees imports at all
    assert loaded(modules, HEAVY) == []
    assert loaded(modules, tuple(target.split(":")[0] for target in COMMANDS.values())) == []


@pytest.mark.subprocess
def test_validate_loads_the_definition_stage_but_not_the_engine_or_http_clients():
    modules = imported_by("validate", "bots/travel")
    assert "chatrun.definition.loader" in modules
    # asyncio (with ssl) loads when a tool is first called: toolkinds/ imports it inside functions;
    # jsonschema only for a file or a tool schema the fast checks cannot vouch for
    assert loaded(modules, ("chatrun.engine", "chatrun.models", "chatrun.server", "httpx", "openai", "asyncio",
                            "jsonschema")) == []


@pytest.mark.subprocess
def test_the_tool_kinds_are_registered_when_the_definition_stage_first_asks(tmp_path):
    """Nothing imports chatrun.toolkinds eagerly any more; loading a bot straight through the
    definition stage (no engine, no public name) still knows every kind."""
    (tmp_path / "bot.yaml").write_text(textwrap.dedent("""\
        name: kinds
        model: {provider: scripted, name: m}
        routes:
          main: {default: true, system: hi, tools: [get_pet]}
        tools:
          get_pet:
            description: A pet
            http: {method: GET, url: "https://pets.example/{{ args.id }}"}
            parameters: {type: object, properties: {id: {type: string}}}
        """))
    script = textwrap.dedent(f"""\
        import sys
        import chatrun.definition.kinds
        assert "chatrun.toolkinds" not in sys.modules
        from chatrun.definition.loader import load_config
        config, _ = load_config({str(tmp_path / "bot.yaml")!r})
        print(config.tools["get_pet"].kind, "chatrun.toolkinds" in sys.modules, "httpx" in sys.modules)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["http", "True", "False"]


@pytest.mark.subprocess
def test_an_invalid_bot_still_gets_jsonschemas_diagnostics(tmp_path):
    """The other side of loading jsonschema lazily: a schema violation and a tool schema the fast
    check cannot vouch for both reach jsonschema, in a fresh process, with their lines."""
    (tmp_path / "bot.yaml").write_text(textwrap.dedent("""\
        name: lazy
        model: {provider: scripted, name: m}
        routes:
          main: {default: true, system: hi, tools: [t], temprature: 1}
        tools:
          t:
            description: T
            parameters: {type: object, properties: {x: {type: string, pattern: "("}}}
            action: {message: ok}
        """))
    done = subprocess.run([sys.executable, "-m", "chatrun", "validate", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{tmp_path / 'bot.yaml'}:4:" in done.stdout and "temprature" in done.stdout
    assert "is not a valid JSON Schema" in done.stdout and "chatrun bug" not in done.stdout + done.stderr


def test_each_summary_is_its_commands_own_first_sentence():
    """`chatrun --help` prints SUMMARIES; they must say what each command's docstring says."""
    ctx = click.Context(main)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None
        for limit in (45, 1000):
            assert click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit) == \
                command.get_short_help_str(limit), name
    assert set(SUMMARIES) == set(COMMANDS)
