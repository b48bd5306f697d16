"""Chat messages: what a memory holds and what the model is sent.

Four kinds, as in LangChain4j: system, user, assistant (optionally with tool calls)
and tool result; and a fifth, the running summary a `summary` memory keeps. Messages are immutable, so memories can share them and cache
their token counts by identity. `to_dict`/`message_from_dict` round-trip losslessly
through JSON; `to_openai` gives the Chat Completions wire form.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Reads an attachment's bytes by its reference (None: gone, or the reference is a URL).
BlobReader = Callable[[str], bytes | None]


# The kinds of content a model endpoint may accept (a model's `accepts:`); text always goes.
CONTENT_KINDS = ("text", "image", "file", "audio")
# What an endpoint that says nothing is sent: images and PDFs (what OpenAI's vision models take).
DEFAULT_ACCEPTS = frozenset({"text", "image", "file"})
# The audio Chat Completions' `input_audio` carries, by media type: its `format`.
AUDIO_FORMATS = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}


def content_kind(media_type: str) -> str | None:
    """image/* is an image, application/pdf a file, WAV and MP3 audio; other types none."""
    if media_type.startswith("image/"):
        return "image"
    if media_type == "application/pdf":
        return "file"
    return "audio" if media_type in AUDIO_FORMATS else None


def accepted_kinds(accepts: Any) -> frozenset[str]:
    """A model's `accepts:` (a list of CONTENT_KINDS, or None: the default) as a set."""
    return DEFAULT_ACCEPTS if accepts is None else frozenset(accepts) | {"text"}


@dataclass(frozen=True)
class Attachment:
    """A file the user sent, kept by reference: `ref` names it in the session's blob area
    (chatrun.store.blobs: the SHA-256 of its bytes) or is the http(s) URL it was sent as.
    Memories and snapshots hold this, never the bytes."""

    ref: str
    media_type: str
    name: str = ""
    size: int = 0
    # What the model spends on it depends on these, read from its bytes where the engine holds
    # them (memory/files.py): a PDF's pages, an audio file's seconds. 0: not known.
    pages: int = field(default=0, compare=False)
    seconds: float = field(default=0.0, compare=False)

    def to_dict(self) -> dict:
        """The reference a client sends and reads back (`{ref, media_type, name, size}`)."""
        return {"ref": self.ref, "media_type": self.media_type, "name": self.name, "size": self.size}

    def stored(self) -> dict:
        """`to_dict()` with what was measured of the file, as a memory keeps it (its token counts
        then stay the same once the session is loaded again)."""
        measured = {"pages": self.pages} if self.pages else {}
        return self.to_dict() | measured | ({"seconds": self.seconds} if self.seconds else {})

    @classmethod
    def from_dict(cls, d: dict) -> Attachment:
        return cls(str(d["ref"]), str(d["media_type"]), str(d.get("name", "")), int(d.get("size", 0)),
                   int(d.get("pages", 0)), float(d.get("seconds", 0.0)))

    @property
    def is_url(self) -> bool:
        return self.ref.startswith(("http://", "https://"))

    def description(self) -> str:
        """What a model that cannot be sent this file reads instead."""
        size = f", {self.size} bytes" if self.size else ""
        return f"[attached: {self.name or 'a file'} ({self.media_type}{size})]"

    @property
    def kind(self) -> str | None:
        """The content kind a model endpoint may accept this file as (CONTENT_KINDS), or None:
        a kind no Chat Completions part carries (sent as a description)."""
        return content_kind(self.media_type)

    def content_part(self, read: BlobReader | None, accepts: frozenset[str] = DEFAULT_ACCEPTS) -> dict:
        """The Chat Completions content part for this file, if the endpoint `accepts` its kind:
        an image as `image_url` (a data URL, or the URL it came as), a PDF as `file`, WAV or MP3
        audio as `input_audio`. Anything else (a kind not accepted, a file whose bytes are gone,
        a URL that is no image) is a text description."""
        kind = self.kind
        if kind is None or kind not in accepts:
            return self._described()
        if self.is_url:
            return {"type": "image_url", "image_url": {"url": self.ref}} if kind == "image" else self._described()
        data = read(self.ref) if read is not None else None
        if data is None:
            return self._described()
        encoded = base64.b64encode(data).decode()
        if kind == "audio":
            return {"type": "input_audio", "input_audio": {"data": encoded, "format": AUDIO_FORMATS[self.media_type]}}
        url = f"data:{self.media_type};base64,{encoded}"
        if kind == "image":
            return {"type": "image_url", "image_url": {"url": url}}
        return {"type": "file", "file": {"filename": self.name or "file.pdf", "file_data": url}}

    def _described(self) -> dict:
        return {"type": "text", "text": self.description()}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool the model asked to run. `arguments` is the raw JSON text the model sent."""

    id: str
    name: str
    arguments: str = "{}"

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True, slots=True)  # an idle session's memory holds many: no __dict__ (issue 39)
class Message:
    role: str = field(init=False, default="")
    # The message's token count, once counted: (encoding name, tokens); memory/tokens.py
    # remember_count. Not compared, not shown: a cache, not part of the message.
    _token_count: tuple[str, int] | None = field(init=False, default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        raise NotImplementedError

    def to_openai(self) -> dict:
        raise NotImplementedError

    def to_openai_with(self, read: BlobReader | None, accepts: frozenset[str] = DEFAULT_ACCEPTS) -> dict:
        """The wire form, with the bytes of attachments read through `read`, sent as parts
        where the endpoint `accepts` their kind (Attachment.content_part)."""
        return self.to_openai()

    def text(self) -> str:
        """The text a token counter measures."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class SystemMessage(Message):
    content: str
    role: str = field(init=False, default="system")

    def to_dict(self) -> dict:
        return {"role": "system", "content": self.content}

    def to_openai(self) -> dict:
        return {"role": "system", "content": self.content}

    def text(self) -> str:
        return self.content


@dataclass(frozen=True, init=False, eq=False, slots=True)
class UserMessage(Message):
    """The user's text, and the files sent with it (by reference). Slots, no __dict__, and a
    message without files points at the one shared empty tuple: an idle session's memory holds
    many of them (tests/test_idle_session_memory.py, bench/bench_idle.py)."""

    content: str
    role: str = field(init=False, default="user")
    attachments: tuple[Attachment, ...] = field(default=(), repr=False)

    def __init__(self, content: str, attachments: tuple[Attachment, ...] = ()):
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "role", "user")
        object.__setattr__(self, "attachments", tuple(attachments) if attachments else ())

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, UserMessage) and (self.content, self.attachments) == (other.content, other.attachments))

    def __hash__(self) -> int:
        return hash((self.content, self.attachments))

    def to_dict(self) -> dict:
        # store/record.py `encode_messages` writes this dict's JSON straight from the text when there
        # is nothing but text (a commit writes the whole window): a new key goes there too.
        out: dict[str, Any] = {"role": "user", "content": self.content}
        if self.attachments:
            out["attachments"] = [a.stored() for a in self.attachments]
        return out

    def to_openai(self) -> dict:
        return self.to_openai_with(None)

    def to_openai_with(self, read: BlobReader | None, accepts: frozenset[str] = DEFAULT_ACCEPTS) -> dict:
        if not self.attachments:
            return {"role": "user", "content": self.content}
        parts = [{"type": "text", "text": self.content}] if self.content else []
        return {"role": "user", "content": parts + [a.content_part(read, accepts) for a in self.attachments]}

    def text(self) -> str:
        return "\n".join([self.content, *(a.description() for a in self.attachments)])


@dataclass(frozen=True, slots=True)
class AssistantMessage(Message):
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    role: str = field(init=False, default="assistant")

    def to_dict(self) -> dict:
        # Written straight from the text when there are no calls (store/record.py `encode_messages`).
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        return out

    def to_openai(self) -> dict:
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return out

    def text(self) -> str:
        parts = [self.content or ""]
        parts += [f"{c.name}({c.arguments})" for c in self.tool_calls]
        return "\n".join(parts)


@dataclass(frozen=True, slots=True)
class ToolResultMessage(Message):
    tool_call_id: str
    name: str
    content: str
    role: str = field(init=False, default="tool")

    def to_dict(self) -> dict:
        return {"role": "tool", "tool_call_id": self.tool_call_id, "name": self.name, "content": self.content}

    def to_openai(self) -> dict:
        return {"role": "tool", "tool_call_id": self.tool_call_id, "content": self.content}

    def text(self) -> str:
        return self.content


SUMMARY_HEADING = "Summary of the earlier conversation:"


@dataclass(frozen=True, slots=True)
class SummaryMessage(Message):
    """What a `summary` memory keeps of the messages it folded: a running summary, right after
    the system message. The model is sent it as a user message under a heading (every
    OpenAI-compatible server accepts that where a second system message may be refused)."""

    content: str
    role: str = field(init=False, default="summary")

    def to_dict(self) -> dict:
        return {"role": "summary", "content": self.content}

    def to_openai(self) -> dict:
        return {"role": "user", "content": f"{SUMMARY_HEADING}\n{self.content}"}

    def text(self) -> str:
        return f"{SUMMARY_HEADING}\n{self.content}"


@dataclass(frozen=True, slots=True)
class ContextMessage(Message):
    """A route's `context:` as one model call was sent it (docs/models.md, "Stable prompts"): what
    changes every turn, after the memory, so the system prompt and the memory before it stay a
    prefix the provider's cache can keep. Rendered for each call; never kept in a memory or the
    history. Sent as a system message (`role: context` only in chatrun's own records)."""

    content: str
    role: str = field(init=False, default="context")

    def to_dict(self) -> dict:
        return {"role": "context", "content": self.content}

    def to_openai(self) -> dict:
        return {"role": "system", "content": self.content}

    def text(self) -> str:
        return self.content


def message_from_dict(d: dict) -> Message:
    """Inverse of `Message.to_dict`."""
    role = d.get("role")
    if role == "system":
        return SystemMessage(d["content"])
    if role == "user":
        return UserMessage(d["content"], tuple(Attachment.from_dict(a) for a in d.get("attachments") or ()))
    if role == "assistant":
        calls = tuple(ToolCall(c["id"], c["name"], c.get("arguments", "{}")) for c in d.get("tool_calls") or ())
        return AssistantMessage(d.get("content"), calls)
    if role == "tool":
        return ToolResultMessage(d["tool_call_id"], d.get("name", ""), d["content"])
    if role == "summary":
        return SummaryMessage(d["content"])
    if role == "context":
        return ContextMessage(d["content"])
    raise ValueError(f"unknown message role {role!r}")


def messages_to_json(messages: list[Message]) -> str:
    return json.dumps([m.to_dict() for m in messages], ensure_ascii=False)


def messages_from_json(text: str) -> list[Message]:
    return [message_from_dict(d) for d in json.loads(text)]


def lone_surrogate_at(value: Any, path: str = "") -> str | None:
    """The path of the first text in `value` (keys included) holding a lone UTF-16 surrogate,
    or None. Such text is valid JSON (`"\\ud800"`) but no UTF-8 socket, file or database can
    carry it, so it is refused where it comes in: from a client (server/wire.py), from a model
    (engine/tools.py: the JSON of tool arguments and structured answers)."""
    todo = [(value, path)]
    while todo:
        item, where = todo.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return where
        elif isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str) and not _encodable(key):
                    return f"{where}.{key!a}".lstrip(".")
                todo.append((inner, f"{where}.{key}".lstrip(".")))
        elif isinstance(item, list):
            todo.extend((inner, f"{where}[{i}]") for i, inner in enumerate(item))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
