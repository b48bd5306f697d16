"""The record of calls done once: what engine/call.py reads to answer a repeated call.

A call of a tool whose effect is `once` (definition/effects.py) that did something is
remembered in the conversation (`Conversation.done_calls`, the snapshot's `calls_done`): its
identity (the tool, the canonical JSON of its arguments, bound ones included, and the values at
its `requires` paths), the turn and what
the model read of it. An identical call later in the conversation — in the same answer, a later
model call, a later turn — is answered from this record and not run (docs/tools.md, "Side
effects"). The record keeps the last DONE_KEPT calls; it is part of the snapshot, so it is
committed and rolled back with the turn like the state.

Every commit encodes the snapshot, so the record is kept small and cheap to encode: one string
per call, `"<identity> <turn> <reply>"` (the identity is 32 hex digits, the reply what the model
read, cut to REPLY_KEPT characters). A record of dicts cost a steady turn about a fifth of its
CPU (bench/bench_guards.py); strings cost it about 1%.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from chatrun.engine.conversation import Conversation
from chatrun.engine.pending import APPROVAL, PendingItem

DONE_KEPT = 30  # the calls done once a conversation remembers, newest last
REPLY_KEPT = 300  # characters of what the model read of a done call, kept to read it again


class Identity(str):
    """A call's identity (32 hex digits), with the canonical JSON it hashes (`parts`): kept in
    the record beside it, so a migration that renames the tool, its arguments or a state path it
    `requires` can give the call done under the old version its new identity (engine/migrate.py)."""

    parts: str

    def __new__(cls, digest: str, parts: str) -> Identity:
        made = super().__new__(cls, digest)
        made.parts = parts
        return made


def identity(tool: str, args: dict[str, Any], acted_on: dict[str, Any] | None = None) -> Identity:
    """The identity of a call: the tool, its arguments (bound ones included) and what else it
    acts on (the values of the paths it `requires`), as canonical JSON (keys sorted, 30.0 the
    same as 30), hashed so the record stays small whatever they hold."""
    text = _CANONICAL_JSON.encode([tool, _canonical(args), _canonical(acted_on) if acted_on else {}])
    return Identity(hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:32], text)


_SEP = "\x1e"  # joins the record's entries for one search (ASCII's record separator: never kept in a reply)
_PARTS = "\x1f"  # ends an entry's reply, before the identity's parts (ASCII's unit separator: never kept either)
PARTS_KEPT = 2000  # characters of an identity's parts kept to migrate it; a longer one is not kept

# One encoder for every identity (json.dumps with options makes a new one per call).
_CANONICAL_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def done_before(c: Conversation, same: str) -> dict[str, Any] | None:
    """The newest record of a call with this identity ({turn, reply}), or None."""
    record = _SEP.join(c.done_calls)  # one search, not one per entry: this runs on every `once` call
    at = record.rfind(same)
    if at < 0:
        return None
    end = record.find(_SEP, at)
    _, turn, reply = record[at:end if end >= 0 else len(record)].split(" ", 2)
    return {"turn": int(turn), "reply": reply.partition(_PARTS)[0]}


def remember(c: Conversation, same: str, turn: int, reply: str) -> None:
    """A call done once joins the record (replaced, never changed in place: a checkpoint holds the old one)."""
    kept = (reply if len(reply) <= REPLY_KEPT else reply[:REPLY_KEPT - 1] + "…").replace(_SEP, " ").replace(_PARTS, " ")
    kept_calls = c.done_calls
    if same in _SEP.join(kept_calls):  # a call done again (a decision's, after its placeholder): replaced
        kept_calls = tuple(e for e in kept_calls if not e.startswith(same))
    c.done_calls = (*kept_calls, _entry(same, f"{turn} {kept}"))[-DONE_KEPT:]


def _entry(same: str, turn_and_reply: str) -> str:
    """One entry of the record: `<identity> <turn> <reply>`, then the identity's parts when it
    has them and they are not too long to keep."""
    parts = getattr(same, "parts", "")
    return f"{same} {turn_and_reply}" + (_PARTS + parts if parts and len(parts) <= PARTS_KEPT else "")


def parts_of(entry: str) -> tuple[str, list[Any]] | None:
    """An entry's identity and the parts it hashes ([tool, args, acted_on]); None for an entry
    without them (recorded before they were kept, or too long to keep)."""
    _, found, text = entry.partition(_PARTS)
    try:
        parts: Any = json.loads(text) if found else None
    except ValueError:
        return None
    ok = isinstance(parts, list) and len(parts) == 3 and isinstance(parts[1], dict) and isinstance(parts[2], dict)
    return (entry.split(" ", 1)[0], parts) if ok else None


def with_parts(entry: str, tool: str, args: dict[str, Any], acted_on: dict[str, Any]) -> str:
    """`entry` as the record of the same call under another identity: its tool, arguments or
    the paths it acts on renamed by a migration (its turn and reply kept)."""
    return _entry(identity(tool, args, acted_on), entry.partition(_PARTS)[0].split(" ", 1)[1])


def carried(forked: list[Any] | None, original: list[Any] | None) -> list[str]:
    """A fork's record of calls done (`forked`, as it was at the turn it forks from) with the calls
    its original conversation did since (`original`, as it is now): what a call did outside the
    conversation happened, whichever conversation is taken up again, so the same call in the fork
    is answered from the record, not run again (docs/openai-api.md, forks)."""
    kept = [e for e in forked or () if isinstance(e, str)]
    had = {e.split(" ", 1)[0] for e in kept}
    since = [e for e in original or () if isinstance(e, str) and e.split(" ", 1)[0] not in had]
    return (kept + since)[-DONE_KEPT:]


def waiting_with(c: Conversation, same: str, acted_on: dict[str, Any]) -> PendingItem | None:
    """An open approval or question of a call with this identity (what it acts on as it is now)."""
    for item in c.pending:
        if item.tool and item.args is not None and identity(item.tool, item.args, acted_on) == same:
            return item
    return None


# -- what the model reads ------------------------------------------------------------------------


def already_done(entry: dict[str, Any]) -> str:
    return (f"Already done earlier in this conversation (turn {entry.get('turn')}): {sentence(entry.get('reply'))} "
            "It was not run again; do not call it again for the same thing.")


def sentence(text: Any) -> str:
    """A tool's reply quoted before another sentence: ended with a full stop when it has no end of
    its own ("Paid 30" would run into "It was not run again")."""
    said = str(text).rstrip()
    return said if not said or said[-1] in ".!?…。！？" else said + "."


def still_waiting(item: PendingItem) -> str:
    what = "the approval" if item.kind == APPROVAL else "the answer"
    return (f"Still waiting for {what} of this same call ({item.id}): {sentence(item.ask)} It was not asked again; "
            "tell the user it is waiting, and do not call it again for the same thing.")
