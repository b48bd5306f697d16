"""The table of tool kinds (chatrun.toolkinds): every stage reaches a kind through it, so a new
kind is its module and a line in the table (plus its key in the schema, and its docs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

import chatrun
from chatrun.definition import kinds as definition_kinds
from chatrun.definition.config import BotConfig, ToolConfig
from chatrun.definition.kinds import Checks
from chatrun.definition.loader import check_bot
from chatrun.definition.yamlpos import YamlDoc
from chatrun.errors import TurnFailed
from chatrun.toolkinds import KINDS, outside
from chatrun.toolkinds.base import CallContext, RuntimeDefaults, ToolKind
from chatrun.transcripts.mocks import TranscriptMocks


def test_the_table_lists_the_kinds_in_order_and_the_definition_stage_sees_the_same():
    assert list(KINDS) == ["handler", "http", "openapi", "mcp", "knowledge"]
    assert [kind.key for kind in definition_kinds.kinds()] == list(KINDS)


@dataclass
class Echo:
    prefix: str


class EchoRuntime(RuntimeDefaults):
    def __init__(self) -> None:
        self.calls = 0

    async def call(self, tool: ToolConfig, spec: Echo, args: dict[str, Any], ctx: CallContext) -> Any:
        self.calls += 1
        return f"{spec.prefix}{args.get('text', '')} on {ctx.route}"


class EchoKind(ToolKind[Echo]):
    """A kind as a new module would write it: nothing else in chatrun changes."""

    key: ClassVar[str] = "echo"

    def parse(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> Echo | None:
        section = raw.get("echo")
        return Echo(str(section.get("prefix", ""))) if isinstance(section, dict) else None

    def check(self, tool: ToolConfig, spec: Echo, checks: Checks) -> None:
        if not spec.prefix:
            checks.add("warning", f"tool `{tool.name}` echoes without a prefix", "tools", tool.name, "echo")

    def runtime(self, config: BotConfig) -> EchoRuntime:
        return EchoRuntime()

    def outside(self, spec: Echo) -> str | None:
        return "the echo service"


@pytest.fixture
def echo_kind(monkeypatch: pytest.MonkeyPatch) -> EchoKind:
    kind = EchoKind()
    monkeypatch.setitem(KINDS, kind.key, kind)
    monkeypatch.setitem(definition_kinds._TABLE, kind.key, kind)
    return kind


ECHO_BOT = """
    name: echoes
    model: {provider: scripted, name: m}
    routes:
      main: {default: true, system: Echo., tools: [say, quiet]}
    tools:
      say:
        description: Say it
        parameters: {type: object, properties: {text: {type: string}}}
        echo: {prefix: "heard: "}
      quiet: {description: Say nothing, echo: {}}
    """


def test_a_new_kind_in_the_table_is_parsed_checked_called_and_mocked(echo_kind, write_bot):
    config, diagnostics = check_bot(write_bot(ECHO_BOT))  # the schema does not know `echo:` yet
    assert config is not None
    assert config.tools["say"].kinds == {"echo": Echo("heard: ")}
    assert any(d.severity == "warning" and d.message == "tool `quiet` echoes without a prefix" for d in diagnostics)

    session = chatrun.Bot(config).session(model=chatrun.ScriptedModel([
        {"tool_calls": [{"name": "say", "arguments": {"text": "hi"}}]}, {"text": "done"}]))
    session.chat("go")
    assert [m.content for m in session.memory() if m.role == "tool"] == ["heard: hi on main"]

    assert outside(config.tools["say"]) == "the echo service"
    with pytest.raises(TurnFailed, match="tool say calls the echo service, and no mock of this transcript matches"):
        TranscriptMocks([]).lookup(config.tools["say"], {"text": "hi"})
