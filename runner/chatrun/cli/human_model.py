"""A model played by a person: the REPL asks the author what the model answers.

With no credentials configured, `chatrun repl` uses this so every flow of a bot can
be walked on a fresh machine: answer each model call with `/say TEXT` or
`/call TOOL {"arg": ...}`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from chatrun.errors import ModelError
from chatrun.messages import ToolCall
from chatrun.models.base import ChunkCallback, ModelRequest, ModelResponse

ReadLine = Callable[[str], Awaitable[str | None]]
Write = Callable[[str], None]

HELP = "answer as the model: /say TEXT  or  /call TOOL {json arguments}"


class HumanModel:
    def __init__(self, read_line: ReadLine, write: Write):
        self.read_line = read_line
        self.write = write
        self.calls = 0
        self.responses: list[ModelResponse] = []  # what was answered, for /save

    async def complete(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> ModelResponse:
        tools = [t["function"]["name"] for t in request.tools]
        self.write(f"[model on route {request.route}; tools: {', '.join(tools) or 'none'}; {HELP}]")
        while True:
            line = await self.read_line("model> ")
            if line is None:
                raise ModelError("input ended while the model's answer was awaited")
            response = self.parse(line.strip(), tools)
            if response is not None:
                self.responses.append(response)
                return response

    def parse(self, line: str, tools: list[str]) -> ModelResponse | None:
        command, _, rest = line.partition(" ")
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
        self.write(f"[{HELP}]")
        return None
