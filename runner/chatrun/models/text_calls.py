"""Tool calls a model wrote as text: recovered, run as calls, never shown to the user.

Small and local models often write a call into their reply when the server in front of them
does not parse it (`model.tool_calls`, docs/models.md "Tool calls written as text"):

    <tool_call>{"name": "book", "arguments": {"seat": "12A"}}</tool_call>    (Hermes, Qwen)
    ```json
    {"name": "book", "arguments": {"seat": "12A"}}                          (a fenced block)
    ```
    {"name": "book", "parameters": {"seat": "12A"}}                         (bare, Llama 3 style)

`TextCalls` wraps any `ChatModel`, so every provider gets the same reading (the OpenAI-compatible
one, the scripted one of golden transcripts, a plugin's) and the engine never learns a wire
format: it receives ordinary `ToolCall`s, and the rest of the reply, if any, as the answer's text.
Where the modes differ (`model.tool_calls`):

- `native`: the reply is left alone.
- `auto` (the default): an answer with native calls is left alone. Otherwise `<tool_call>` blocks
  are calls (the tag says so; a name that is not offered, or JSON that does not parse, is a call
  the call path refuses, so the model reads why), and fenced or bare JSON objects shaped as a call
  (`name` and `arguments` or `parameters`, nothing else but `id` or `type`) are calls when they
  name an offered tool; any other JSON is the model's text.
- `text`: the endpoint never parses calls: every call-shaped part is a call whatever its name
  (the call path refuses an unknown one), also next to native calls.

A request that offers no tools is never read (summaries, tool-less routes stream as they come).

Streaming (`HeldBack`): text is passed on as it arrives, up to the first place where a call may
start (`<tool_call>`, a ```json fence, or `{"name"`-like JSON), and whitespace before it. From a
place that is a call's start the rest is held until the answer ends; then what is not a call is
released in one chunk. The streamed chunks always add up to the answer's final text, as the
non-streamed path gives it: both use `call_start` to decide where a call may begin.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from typing import Any, Literal

from chatrun.definition.config import ModelConfig
from chatrun.messages import ToolCall
from chatrun.models.base import (
    ChatModel,
    ChunkCallback,
    ModelRequest,
    ModelResponse,
    ModerationResult,
    begin_again,
)

MODES = ("native", "text", "auto")
DEFAULT_MODE = "auto"

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
FENCE = "```"
FENCE_LANGUAGES = ("", "json")  # ```json or a bare ``` (any case)
CALL_KEYS = frozenset({"name", "arguments", "parameters", "id", "type"})  # what a call object may hold
CANDIDATE = re.compile(r"[<`{]")
QUICK = re.compile(r"[<`{]|\n\s*$|^$")  # a chunk HeldBack must look at closely (else: shown at once)
NAME_IN_BROKEN_JSON = re.compile(r'"name"\s*:\s*"([^"\\]+)"')

Start = Literal["no", "maybe", "call"]

log = logging.getLogger("chatrun.models")


# -- where a call may start ---------------------------------------------------------------------------

def call_start(text: str, i: int) -> Start:
    """Whether a call written as text starts at `text[i]`: "call", "no", or "maybe" (the text
    ends before it is known). Looks only forward, so a "no" never turns into a "call" as more
    text arrives: what the stream released can hold no call."""
    first = text[i]
    if first == "<":
        rest = text[i:i + len(OPEN_TAG)]
        return "call" if rest == OPEN_TAG else "maybe" if OPEN_TAG.startswith(rest) and len(rest) < len(OPEN_TAG) \
            else "no"
    if first == "`":
        return _fence_start(text, i)
    if first == "{":
        return _object_start(text, i)
    return "no"


def _fence_start(text: str, i: int) -> Start:
    """```json (or ```) then whitespace then `{`."""
    head = text[i:i + 3]
    if head != FENCE:
        return "maybe" if FENCE.startswith(head) else "no"
    j = i + 3
    while j < len(text) and text[j].isalpha():
        j += 1
    language = text[i + 3:j].lower()
    if j == len(text):
        return "maybe" if any(known.startswith(language) for known in FENCE_LANGUAGES) else "no"
    if language not in FENCE_LANGUAGES:
        return "no"
    while j < len(text) and text[j].isspace():
        j += 1
    if j == len(text):
        return "maybe"
    return "call" if text[j] == "{" else "no"


def _object_start(text: str, i: int) -> Start:
    """`{` then whitespace then a key a call object has (`"name"`, `"arguments"`, ...)."""
    j = i + 1
    while j < len(text) and text[j].isspace():
        j += 1
    if j == len(text):
        return "maybe"
    if text[j] != '"':
        return "no"
    end = text.find('"', j + 1)
    if end < 0:
        key = text[j + 1:]
        return "maybe" if any(k.startswith(key) for k in CALL_KEYS) else "no"
    return "call" if text[j + 1:end] in CALL_KEYS else "no"


# -- reading a whole answer -------------------------------------------------------------------------

@dataclass
class Found:
    """Calls written in `text[start:end]`."""

    start: int
    end: int
    calls: list[ToolCall]


def read_calls(text: str, mode: str, offered: frozenset[str]) -> tuple[list[ToolCall], str | None]:
    """The calls written in `text` and the text without them (None when nothing is left); no
    calls: ([], text) unchanged."""
    found: list[Found] = []
    i = 0
    while (match := CANDIDATE.search(text, i)) is not None:
        i = match.start()
        part = _read_at(text, i, mode, offered) if call_start(text, i) == "call" else None
        if part is None:
            i += 1
            continue
        found.append(part)
        i = part.end
    if not found:
        return [], text
    return [call for part in found for call in part.calls], _rest(text, found)


def _read_at(text: str, i: int, mode: str, offered: frozenset[str]) -> Found | None:
    if text.startswith(OPEN_TAG, i):
        return _tag_block(text, i)
    if text[i] == "`":
        return _fenced_block(text, i, mode, offered)
    return _bare_object(text, i, mode, offered)


def _tag_block(text: str, i: int) -> Found:
    """A `<tool_call>` block (to `</tool_call>`, or to the end when the model stopped before
    it): always calls. Its JSON may be an object or a list of them, or broken: then a call the
    call path refuses (the name, if it can be read, and the whole block as the arguments)."""
    close = text.find(CLOSE_TAG, i + len(OPEN_TAG))
    end = len(text) if close < 0 else close + len(CLOSE_TAG)
    inner = text[i + len(OPEN_TAG):close if close >= 0 else len(text)].strip()
    if inner.startswith(FENCE):  # a fence inside the tag
        inner = inner.split("\n", 1)[1] if "\n" in inner else ""
        inner = inner.strip().removesuffix(FENCE).strip()
    try:
        value = json.loads(inner)
    except ValueError:
        value = None
    objects = value if isinstance(value, list) and value else [value]
    calls = []
    for obj in objects:
        call = _call_of(obj) if isinstance(obj, dict) else None
        if call is None:  # unreadable: the call path tells the model (an unknown tool, bad arguments)
            name = NAME_IN_BROKEN_JSON.search(inner)
            call = ToolCall("", name.group(1) if name else "", inner)
        calls.append(call)
    return Found(i, end, calls)


def _fenced_block(text: str, i: int, mode: str, offered: frozenset[str]) -> Found | None:
    """A fence holding one or more call objects and nothing else; else the model's text."""
    j = text.index("{", i)  # call_start found it
    calls = []
    decoder = json.JSONDecoder()
    while True:
        try:
            obj, j = decoder.raw_decode(text, j)
        except ValueError:
            return None
        call = _json_call(obj, mode, offered)
        if call is None:
            return None
        calls.append(call)
        while j < len(text) and text[j].isspace():
            j += 1
        if text.startswith(FENCE, j):
            return Found(i, j + len(FENCE), calls)
        if j >= len(text) or text[j] != "{":
            return None


def _bare_object(text: str, i: int, mode: str, offered: frozenset[str]) -> Found | None:
    try:
        obj, end = json.JSONDecoder().raw_decode(text, i)
    except ValueError:
        return None
    call = _json_call(obj, mode, offered)
    return None if call is None else Found(i, end, [call])


def _json_call(obj: Any, mode: str, offered: frozenset[str]) -> ToolCall | None:
    """A fenced or bare JSON value as a call: shaped as one, and under `auto` naming an offered
    tool (other JSON is an answer, e.g. a route asked for JSON)."""
    if not (isinstance(obj, dict) and set(obj) <= CALL_KEYS and ("arguments" in obj or "parameters" in obj)):
        return None
    call = _call_of(obj)
    if call is None or (mode == "auto" and call.name not in offered):
        return None
    return call


def _call_of(obj: dict[str, Any]) -> ToolCall | None:
    """{"name", "arguments" | "parameters"} as a call; the arguments as the model sent them (a
    JSON object, or a string holding one); None without a name."""
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    if arguments is None:
        arguments = {}
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall("", name.strip(), raw)


def _rest(text: str, found: list[Found]) -> str | None:
    """The text around the calls. Before the first call it is the text as the stream shows it
    (`trim_end`); after it (held back in a stream, so free to tidy) each piece is trimmed and on
    its own line."""
    first = trim_end(text[:found[0].start])
    if not first.strip():
        first = ""
    ends = [part.end for part in found]
    starts = [part.start for part in found[1:]] + [len(text)]
    later = "\n".join(piece for end, start in zip(ends, starts, strict=True) if (piece := text[end:start].strip()))
    joint = "\n" if first and later and not first[-1].isspace() else ""
    return first + joint + later or None


def trim_end(text: str) -> str:
    """`text` without its trailing whitespace from the first line break in it: a call on its own
    line leaves no empty line behind, and a stream holds only what this cuts, so it never shows
    what the final text lacks."""
    body = text.rstrip()
    tail = text[len(body):]
    line_break = tail.find("\n")
    return text if line_break < 0 else body + tail[:line_break]


def read_response(response: ModelResponse, mode: str, offered: frozenset[str]) -> ModelResponse:
    """The answer with the calls its text holds (as `mode` reads them) moved to its calls."""
    if mode == "native" or not offered or not response.text or (mode == "auto" and response.tool_calls):
        return response
    calls, rest = read_calls(response.text, mode, offered)
    if not calls:
        return response
    return replace(response, text=rest, tool_calls=[*response.tool_calls, *calls])


# -- streaming --------------------------------------------------------------------------------------

def releasable(pending: str, started: bool) -> tuple[int, bool]:
    """How much of `pending` (text not yet shown) can be shown now: up to the first place a call
    may start, less the whitespace `trim_end` cuts (and whitespace alone before anything was
    shown: a reply may open with a call); and whether a call starts there (then the rest is held
    to the end)."""
    stop, is_call = len(pending), False
    for match in CANDIDATE.finditer(pending):
        start = call_start(pending, match.start())
        if start != "no":
            stop, is_call = match.start(), start == "call"
            break
    shown = trim_end(pending[:stop])
    return (len(shown) if started or shown.strip() else 0), is_call


class HeldBack:
    """An `on_chunk` that holds back what may be a call (module doc, "Streaming")."""

    def __init__(self, on_chunk: ChunkCallback):
        self.on_chunk = on_chunk
        self.pending = ""
        self.shown: list[str] = []
        self.holding = False  # a call started: everything else waits for the end
        self.reached = False  # whether what was passed on reached the user (models/base.py ChunkCallback)
        self.held_back = False  # whether `on_chunk` held something back: it sends the final text itself

    async def send(self, chunk: str) -> bool:
        """A chunk of the answer, passed on or held. Whether the answer has begun to reach the user:
        what `on_chunk` said of what was passed on, and (to be safe) yes while anything is held here,
        which a second attempt's chunks would follow."""
        await self.take(chunk)
        return self.reached or bool(self.pending)

    __call__ = send  # a ChunkCallback, which passes `begin_again` on

    def begin_again(self) -> None:
        """A retry of an answer none of which reached the user (models/base.py begin_again)."""
        self.shown, self.pending, self.holding = [], "", False
        begin_again(self.on_chunk)

    async def take(self, chunk: str) -> None:
        if not self.pending and not self.holding and QUICK.search(chunk) is None and (self.shown or not chunk.isspace()):
            # Most chunks: nothing that may start a call, no line break held, and (the first) not
            # whitespace alone, which may open a call: shown at once, as `releasable` would.
            await self.show(chunk)
            return
        self.pending += chunk
        if self.holding or not chunk:
            return
        cut, self.holding = releasable(self.pending, bool(self.shown))
        if cut:
            await self.show(self.pending[:cut])
            self.pending = self.pending[cut:]

    async def finish(self, text: str | None) -> None:
        """The answer ended, its final text is `text`: show what of it was not shown yet."""
        if self.held_back:  # an output guardrail's hold judges the final text whole (a retry's too)
            return
        shown = "".join(self.shown)
        final = text or ""
        if not final.startswith(shown):  # cannot happen (module doc); never repeat or garble a chunk
            log.warning("a streamed answer's shown text is not the start of its final text; not streaming the rest")
            return
        if len(final) > len(shown):
            await self.show(final[len(shown):])

    async def show(self, text: str) -> None:
        self.shown.append(text)
        said = await self.on_chunk(text)  # ChunkCallback: False, held back
        self.reached, self.held_back = self.reached or said is not False, self.held_back or said is False


# -- the wrapper ------------------------------------------------------------------------------------

def offered_names(request: ModelRequest) -> frozenset[str]:
    return frozenset(str((spec.get("function") or {}).get("name") or "") for spec in request.tools) - {""}


class TextCalls:
    """A ChatModel reading the calls its model writes as text (the request's `model.tool_calls`)."""

    __slots__ = ("model",)

    def __init__(self, model: ChatModel):
        self.model = model

    def for_request(self, request: ModelRequest) -> ChatModel:
        """The model to ask `request` of: this reader where the answer may hold calls written as text,
        else the model itself (a request offering no tools, or with native calls: one layer fewer)."""
        return self if request.tools and request.config.tool_calls != "native" else self.model

    async def complete(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> ModelResponse:
        mode = request.config.tool_calls
        if self.for_request(request) is self.model:
            return await self.model.complete(request, on_chunk)
        held = HeldBack(on_chunk) if on_chunk is not None else None
        response = await self.model.complete(request, held)
        if response.text and CANDIDATE.search(response.text) is not None:  # else nothing in it may be a call
            response = read_response(response, mode, offered_names(request))
        if held is not None:
            await held.finish(response.text)
        return response

    async def moderate(self, config: ModelConfig, model: str, text: str) -> ModerationResult | None:
        """The wrapped model's `/moderations` (None: it has none)."""
        from chatrun.models.pool import moderate_with

        return await moderate_with(self.model, config, model, text)
