"""The files of the conversation, as tools see them: the one rule that turns what a tool's
config or code names (an attachment, its reference, or its name) into one of the files the
conversation holds, for an `http:` tool's `multipart:` body and a handler's ToolContext.

Tools see the files of the current route's memory (what its model has seen), oldest first,
this turn's message's last; `current` marks those of this turn's message. A file is named by
its mapping (`{{ attachments[-1] }}`), its `ref` (the SHA-256 of its bytes), or its `name`
as the user sent it (the newest file of that name), so a model can be given a parameter for
the name of the file to send.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from chatrun.errors import ToolRefusal
from chatrun.messages import Attachment


def template_values(attachments: Sequence[Attachment], current: Sequence[Attachment]) -> list[dict[str, Any]]:
    """`attachments` in a tool's templates: {ref, media_type, name, size, current} each."""
    now = {a.ref for a in current}
    return [{**a.to_dict(), "current": a.ref in now} for a in attachments]


def find_attachment(value: Any, attachments: Sequence[Attachment], tool: str, what: str) -> Attachment:
    """The conversation's file that `value` names; ToolRefusal (the model reads why) when none does."""
    wanted = value.get("ref") if isinstance(value, dict) else value
    if isinstance(wanted, str) and wanted:
        for attachment in reversed(attachments):
            if wanted in (attachment.ref, attachment.name):
                return attachment
    names = ", ".join(a.name or a.media_type for a in attachments) or "none"
    named = f" {wanted!r}" if isinstance(wanted, str) and wanted else ""
    raise ToolRefusal(f"Error: {tool} needs a file for {what}, and the conversation has no file{named} "
                      f"(its files: {names}). Ask the user to attach it, or call it again naming one of them.")


def read_or_refuse(attachment: Attachment, read: Callable[[Attachment], bytes | None], tool: str) -> bytes:
    """The bytes of a file a tool sends on; ToolRefusal when there are none to send."""
    data = read(attachment)
    if data is None:
        why = "it was sent as a link, not as a file" if attachment.is_url else "its bytes are no longer kept"
        raise ToolRefusal(f"Error: {tool} cannot send {attachment.name or 'the file'}: {why}. "
                          "Ask the user to attach the file itself.")
    return data
