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
per call, `"<identity><tag> <turn> <reply>\x1f<parts>"` (the identity is 32 hex digits, the tag
`~<version>` names the bot's `version:` that spells it, the reply what the model read, cut to
REPLY_KEPT characters, the parts what the identity is made of, each value hashed: `made_of`, kept
by a bot with `version:` alone, the only one a migration can spell otherwise). A
record of dicts cost a steady turn about a fifth of its CPU (bench/bench_guards.py); strings cost
it about 1%.

A migration never rewrites the record. A call the newest version makes is looked for under its
identity as this version spells it (one search); only when none matches and the record holds
entries of other versions is it spelled as each of those spells it (engine/migrate.py
`older_spellings`: tool, arguments and `requires` paths renamed back) and looked for again; last,
each of those entries that keeps its parts is spelled forward as the migrations map the calls in
memories (`spelled_forward_is`: renamed, an argument dropped, a defaulted one added) and compared
with this call. Only forward is exact for a dropped argument: its value cannot be given back to the
new call, but leaving it out of the old one is what the migration says the old call now is. So an
entry of any age matches, and a `/v1` fork that carries entries its original recorded under the
new version, then moves itself, does not rename them a second time (tests/test_versions_once.py).

An entry recorded before entries said their version (the last release's: untagged) was spelled by
the version the session ran when it was recorded. The release that wrote it never rewrote the
record on a move, so that is the version the session left when this release first moves it, or
one before it (a move under the last release left older entries as they were): the move marks
such an entry `~<=<version>` (`dated`), and it is matched under the spelling of that version and
of the ones before it along the migrations, never of a later one (after a swap `{a: b, b: a}` the
other tool's call is not the call done). An untagged entry of a session whose version is not known
(moved from a lost version, or stored before versions) is matched under every version's spelling.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import quote, unquote

from chatrun.definition.migrations import split_state_path
from chatrun.engine.conversation import Conversation
from chatrun.engine.pending import APPROVAL, PendingItem

DONE_KEPT = 30  # the calls done once a conversation remembers, newest last
REPLY_KEPT = 300  # characters of what the model read of a done call, kept to read it again


def identity(tool: str, args: dict[str, Any], acted_on: dict[str, Any] | None = None) -> str:
    """The identity of a call: the tool, its arguments (bound ones included) and what else it
    acts on (the values of the paths it `requires`), as canonical JSON (keys sorted, 30.0 the
    same as 30), hashed so the record stays small whatever they hold."""
    text = _CANONICAL_JSON.encode([tool, _canonical(args), _canonical(acted_on) if acted_on else {}])
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:_DIGITS]


_SEP = "\x1e"  # joins the record's entries for one search (ASCII's record separator: never kept in a reply)
_PARTS = "\x1f"  # ends an entry's reply, before what its identity is made of (`made_of`; never kept in a reply)
_DIGITS = 32  # an identity's hex digits
_VALUE_DIGITS = 12  # a value's hex digits in what an identity is made of

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


def shown_path(path: str) -> str:
    """A `requires` path with its root spelled out (`email` -> `state.email`), as migrations name it."""
    root, keys = split_state_path(path)
    return ".".join([root, *keys])


def tag(version: str | None) -> str:
    """How an entry says which version of the bot spells its identity: `~<version>` (URL-escaped:
    no space) after the identity; '' for a bot without `version:`, and in an entry recorded before
    entries said it (spelled by the version the session ran then, or by any before it)."""
    return "~" + quote(version, safe="") if version else ""


_OR_EARLIER = "~<="  # the tag of an untagged entry marked by a move: that version, or one before it


def version_of(tagged: str) -> tuple[str | None, bool]:
    """The version a tag names (None: untagged), and whether an earlier one may have spelled the
    entry (an untagged entry marked by a move: `dated`)."""
    if tagged.startswith(_OR_EARLIER):
        return unquote(tagged[len(_OR_EARLIER):]), True
    return (unquote(tagged[1:]), False) if tagged else (None, False)


def dated(entries: tuple[str, ...], version: str | None) -> tuple[str, ...]:
    """The record of a session the move takes away from `version`, its untagged entries (recorded
    before entries said their version) marked as spelled by that version or one before it; the
    others as they are. Nothing to mark for a bot without `version:`."""
    if not version or all(e[_DIGITS:_DIGITS + 1] != " " for e in entries):
        return entries
    mark = _OR_EARLIER + quote(version, safe="")
    return tuple(f"{e[:_DIGITS]}{mark}{e[_DIGITS:]}" if e[_DIGITS:_DIGITS + 1] == " " else e for e in entries)


def done_before(c: Conversation, same: str, spelled_in: str = "",
                older: Callable[[str], Iterable[str]] | None = None,
                later: Callable[[str, str], bool] | None = None) -> dict[str, Any] | None:
    """The newest record of this call ({turn, reply}), or None. `same`: its identity as the
    version tagged `spelled_in` spells it; `older(tagged)`: its identities as an older version
    spells it (before a migration renamed its tool, arguments or `requires` paths), asked only for
    the tags of the entries of other versions when none of this version matches; without
    migrations every version spells it alike (`same`), an untagged entry's too. `later(tagged,
    parts)`: whether an entry of another version, spelled forward from its parts (`made_of`), is
    this call: asked last, for what `older` cannot give back (an argument a migration dropped)."""
    record = _SEP + _SEP.join(c.done_calls)  # one search, not one per entry: this runs on every `once` call
    at = record.rfind(f"{_SEP}{same}{spelled_in} ")
    if at < 0:  # entries of other versions (or untagged): the same call as each spelled it
        others = {e[_DIGITS:e.find(" ")] for e in c.done_calls} - {spelled_in}
        at = max((record.rfind(f"{_SEP}{i}{t} ") for t in others for i in (older(t) if older else (same,))),
                 default=-1)
    if at >= 0:
        end = record.find(_SEP, at + 1)
        return _read(record[at + 1:end if end >= 0 else len(record)])
    found = _spelled_forward(c.done_calls, spelled_in, later) if later is not None else None
    return _read(found) if found is not None else None


def _read(entry: str) -> dict[str, Any]:
    _, turn, reply = entry.split(" ", 2)
    return {"turn": int(turn), "reply": reply.partition(_PARTS)[0]}


def _spelled_forward(entries: tuple[str, ...], spelled_in: str, later: Callable[[str, str], bool]) -> str | None:
    """The newest entry of another version that keeps its parts and is, spelled forward, this call."""
    for entry in reversed(entries):
        head, _, rest = entry.partition(" ")
        parts = rest.partition(_PARTS)[2]
        if parts and head[_DIGITS:] != spelled_in and later(head[_DIGITS:], parts):
            return entry
    return None


def made_of(tool: str, args: dict[str, Any], acted_on: dict[str, Any] | None = None) -> str:
    """What a call's identity is made of, each value hashed (`tool|name=hash,...|path=hash,...`,
    names URL-escaped unless plain, `requires` paths with their root): kept after an entry's reply, so a later
    version spells the entry forward through its migrations (an argument dropped is left out, a
    defaulted one added: engine/migrate.py `spelled_forward_is`) and compares it with its own call's."""
    return parts_text(tool, {k: _hashed(v) for k, v in args.items()},
                      {shown_path(k): _hashed(v) for k, v in (acted_on or {}).items()})


def parts_text(tool: str, args: dict[str, str], paths: dict[str, str]) -> str:
    """`made_of`'s text from the tool and its hashed values, by argument name and by path."""
    named = ",".join([f"{_escaped(k)}={args[k]}" for k in sorted(args)])
    at = ",".join([f"{_escaped(k)}={paths[k]}" for k in sorted(paths)]) if paths else ""
    return f"{_escaped(tool)}|{named}|{at}"


def _escaped(name: str) -> str:
    """A name as `made_of` keeps it: as it is when plain (most are), else URL-escaped (no `|,=`)."""
    return name if name.isidentifier() and name.isascii() else quote(name, safe="")


def read_parts(text: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """`made_of`'s text as the tool and its hashed values, by argument name and by path."""
    tool, args, paths = (text.split("|") + ["", ""])[:3]
    return unquote(tool), _pairs(args), _pairs(paths)


def _pairs(text: str) -> dict[str, str]:
    return {unquote(k): v for k, _, v in (p.partition("=") for p in text.split(",") if p)}


def hashed_default(value: Any) -> str:
    """A value a migration gives an argument, hashed as `made_of` hashes a call's."""
    return _hashed(value)


def _hashed(value: Any) -> str:
    text = _CANONICAL_JSON.encode(_canonical(value))
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:_VALUE_DIGITS]


def remember(c: Conversation, same: str, turn: int, reply: str, spelled_in: str = "", parts: str = "") -> None:
    """A call done once joins the record, its identity tagged with the version that spells it,
    what it is made of (`made_of`) after its reply (replaced, never changed in place: a checkpoint
    holds the old one)."""
    kept = (reply if len(reply) <= REPLY_KEPT else reply[:REPLY_KEPT - 1] + "…").replace(_SEP, " ").replace(_PARTS, " ")
    key, kept_calls = f"{same}{spelled_in} ", c.done_calls
    if same in _SEP.join(kept_calls):  # a call done again (a decision's, after its placeholder): replaced
        kept_calls = tuple(e for e in kept_calls if not e.startswith(key))
    c.done_calls = (*kept_calls, f"{key}{turn} {kept}{_PARTS + parts if parts else ''}")[-DONE_KEPT:]


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
