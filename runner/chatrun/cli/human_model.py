"""A model played by a person: the REPL asks the author what the model answers.

With no credentials configured, `chatrun repl` uses this so every flow of a bot can
be walked on a fresh machine: answer each model call with plain text (or `/say TEXT`) or
`/call TOOL {"arg": ...}`. Other slash commands at the `model>` prompt go to the REPL
(`command`: the read-only ones run, /quit leaves, the rest wait for the turn's end).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from chatrun.errors import ModelError
from chatrun.messages import (
    AssistantMessage,
    ContextMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
)
from chatrun.models.base import ChunkCallback, ModelRequest, ModelResponse

ReadLine = Callable[[str], Awaitable[str | None]]
Write = Callable[[str], None]
# A slash command other than /say and /call, typed at the `model>` prompt: the REPL runs it,
# and says "quit" when the author asked to leave.
Command = Callable[[str], str | None]

HELP = ("answer as the model: type its text (or /say TEXT), or /call TOOL {json arguments}; /help; "
        "Ctrl-C cancels the turn")


class QuitWhileAnswering(ModelError):
    """/quit at the `model>` prompt: the turn ends unanswered (rolled back, as any failed turn)
    and the REPL leaves."""


class HumanModel:
    def __init__(self, read_line: ReadLine, write: Write, command: Command | None = None):
        self.read_line = read_line
        self.write = write
        self.command = command
        self.calls = 0
        self.responses: list[ModelResponse] = []  # what was answered, for /save
        self.last_route: str | None = None
        self.last_system: str | None = None
        self.last_context: str | None = None
        self.shown: set[str] = set()  # ids of the tool results already shown
        self.offered: list[str] = []  # the tools of the call waiting for an answer (Tab completes them)

    async def complete(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> ModelResponse:
        tools = [t["function"]["name"] for t in request.tools]
        for _ in range(3):  # let the REPL print the events queued so far (a route change) first
            await asyncio.sleep(0)
        self.show_what_the_model_sees(request.messages, request.route)
        self.write(f"[model on route {request.route}; tools: {', '.join(tools) or 'none'}; {HELP}]")
        self.offered = tools
        try:
            while True:
                line = await self.read_line("model> ")
                if line is None:
                    raise ModelError("input ended while the model's answer was awaited")
                response = self.parse(line.strip(), tools)
                if response is not None:
                    self.responses.append(response)
                    return response
        finally:
            self.offered = []

    def show_what_the_model_sees(self, messages: list[Message], route: str) -> None:
        """Before each call (and after a turn): the results of the tools just called (refusals
        included), the route if it changed, the system prompt and the context if they changed."""
        context = messages[-1].content if messages and isinstance(messages[-1], ContextMessage) else ""
        messages = messages[:-1] if context else messages  # the context follows the memory's last message
        for result in trailing_tool_results(messages):
            if result.tool_call_id not in self.shown:
                self.shown.add(result.tool_call_id)
                self.write(f"[tool {result.name} → {result.content}]")
        if self.last_route is not None and route != self.last_route:
            self.write(f"[route: {self.last_route} → {route}]")
        self.last_route = route
        system = messages[0].content if messages and isinstance(messages[0], SystemMessage) else ""
        if system != self.last_system:
            self.write(f"[system prompt{' now' if self.last_system is not None else ''}: {system or '(none)'}]")
            self.last_system = system
        if context != (self.last_context or ""):
            self.write(f"[context{' now' if self.last_context is not None else ''}: {context or '(none)'}]")
            self.last_context = context

    def parse(self, line: str, tools: list[str]) -> ModelResponse | None:
        command, _, rest = line.partition(" ")
        if not line:
            self.write(f"[{HELP}]")
            return None
        if not line.startswith("/"):  # plain text is the model's answer, as /say would give it
            return ModelResponse(text=line)
        if command == "/say" and rest.strip():
            return ModelResponse(text=rest.strip())
        if command == "/call" and rest.strip():
            name, _, raw = rest.strip().partition(" ")
            raw = raw.strip() or "{}"
            try:
                json.loads(raw)
            except json.JSONDecodeError as exc:
                self.write(f"[not JSON: {exc.msg}; e.g. /call {name} {{\"key\": \"value\"}}]")
                return None
            if name not in tools:
                self.write(f"[note: {name} is not offered on this route; the engine will tell the model so]")
            self.calls += 1
            return ModelResponse(tool_calls=[ToolCall(f"human_{self.calls}", name, raw)])
        if command not in ("/say", "/call") and self.command is not None:
            if self.command(line) == "quit":
                raise QuitWhileAnswering("you left while the model's answer was awaited; the turn was not kept")
            return None
        self.write(f"[{HELP}]")
        return None


def trailing_tool_results(messages: list[Message]) -> list[ToolResultMessage]:
    """The tool results after the model's last tool calls: what it learns from them."""
    results: list[ToolResultMessage] = []
    for message in reversed(messages):
        if isinstance(message, ToolResultMessage):
            results.append(message)
        elif isinstance(message, AssistantMessage) and message.tool_calls:
            break
        else:
            return []
    return results[::-1]
