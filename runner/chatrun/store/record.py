"""The stored session, typed: one record read from a store, one commit written to it.

The snapshot is the engine's (`Conversation.snapshot`): the stores keep it as JSON text and
never look inside it, except here, for the few fields a store or the server keys on: the
bot, the owner (`meta.owner`), the last committed turn (`committed`, the server's), the
memory ids its scopes hold, and its pending items (`pending`: approvals, questions and
takeovers waiting for a party; the stores index the earliest `due` time and which sessions
have any). This module is the one place that reads those keys, and the one
place that spells the id formats, so a new store touches `store/` only and needs no engine
code to know which memories a session has.

    record = SessionRecord.decode("s1", text, version)     # one json.loads per load
    commit = Commit.encode("s1", snapshot, memories, history)  # one json.dumps per value

(Not to be confused with `RecordStore`'s records: small JSON values by key, such as the
OpenAI API's index of turns.)
"""

from __future__ import annotations

import functools
import json
import operator
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict

from chatrun.errors import ChatrunError, SessionQuota
from chatrun.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    SystemMessage,
    ToolResultMessage,
    UserMessage,
)
from chatrun.store.versions import CREATE

JSONObject = dict[str, Any]  # a JSON object as json.loads returns it

# -- id formats: a scope is "<session>.<n>", a memory "<scope>#<route>" -----------------------

SCOPE_SEPARATOR = "."
MEMORY_SEPARATOR = "#"


def scope_id(session_id: str, number: int) -> str:
    """The id of a session's `number`th scope (numbered from 1 as they are opened)."""
    return f"{session_id}{SCOPE_SEPARATOR}{number}"


def memory_id(scope: str, route: str) -> str:
    """The id of the memory `route` keeps in the scope `scope`."""
    return f"{scope}{MEMORY_SEPARATOR}{route}"


def route_of_memory(memory: str) -> str:
    """The route of a memory id (what follows its last '#')."""
    return memory.rpartition(MEMORY_SEPARATOR)[2]


def renamed_id(scope_or_memory: str, old_session: str, new_session: str) -> str:
    """A scope or memory id of `old_session` as the same id of `new_session` (a fork); any
    other id unchanged."""
    prefix = old_session + SCOPE_SEPARATOR
    if scope_or_memory.startswith(prefix):
        return new_session + scope_or_memory[len(old_session):]
    return scope_or_memory


# -- the keys of a snapshot a store or the server reads -------------------------------------

OWNER_JSON_PATH = "$.meta.owner"  # the owner, for stores that query inside the JSON (SQLite)


class Committed(TypedDict):
    """The last committed turn, kept in the snapshot under "committed" by the server."""

    turn: int
    input: Any
    requestId: str | None  # noqa: N815 - the stored JSON's key
    at: Any


def turns_of(history: list[JSONObject]) -> list[JSONObject]:
    """The entries of a session's history that are turns tried: the ones with `turn`. A user's
    rating (`{"feedback"}`, Session.rate) and a notice (`{"notice"}`, Session.notice: a channel
    user told something with no turn) are entries of their own, and no reader takes them for turns."""
    return [entry for entry in history if "turn" in entry]


def route_of_turn(history: list[JSONObject], turn: int) -> str | None:
    """The route committed turn `turn` ran on: its history entry's `route` (where it ended, the
    route whose reply the user saw), or None when `history` does not hold it. A failed attempt
    at the same number is not the turn (it has `ok` false)."""
    for entry in reversed(history):
        if entry.get("turn") == turn and entry.get("ok") and isinstance(entry.get("route"), str):
            return str(entry["route"])
    return None


def rating_of_turn(history: list[JSONObject], turn: int) -> JSONObject | None:
    """The newest rating of turn `turn` in `history` (a `{"feedback"}` entry's data), or None."""
    for entry in reversed(history):
        found = entry.get("feedback")
        if isinstance(found, dict) and found.get("turn") == turn:
            return found
    return None


def committed_turn(entry: JSONObject, request_id: str | None) -> Committed:
    """What the snapshot records of a turn committed with history `entry`."""
    return {"turn": entry["turn"], "input": entry.get("input"), "requestId": request_id, "at": entry.get("at")}


# What a live session keeps of its last committed turn between requests: the four values in a
# tuple, not the dict (72 B against 184 B of every cached session; issue 39). A stored value of
# another shape (JSON has no tuples) is kept as it is.
PackedCommitted = tuple[int, Any, "str | None", Any]
_COMMITTED_KEYS = frozenset(Committed.__annotations__)


def pack_committed(committed: Committed | None) -> PackedCommitted | Committed | None:
    """`committed` as a live session keeps it."""
    if isinstance(committed, dict) and committed.keys() == _COMMITTED_KEYS:
        return (committed["turn"], committed["input"], committed["requestId"], committed["at"])
    return committed


def unpack_committed(packed: PackedCommitted | Committed | None) -> Committed | None:
    """The Committed dict `packed` holds (a new dict each time)."""
    if not isinstance(packed, tuple):
        return packed
    turn, given, request_id, at = packed
    return {"turn": turn, "input": given, "requestId": request_id, "at": at}


def with_committed(snapshot: JSONObject, committed: Committed | None) -> JSONObject:
    """The snapshot as stored: the engine's, plus the last committed turn (when there is one)."""
    return snapshot | {"committed": committed} if committed is not None else snapshot


def owner_meta(owner: str | None) -> JSONObject:
    """The `meta` a new session of `owner` starts with (no owner: auth is off)."""
    return {"owner": owner} if owner is not None else {}


def owner_in_meta(meta: JSONObject | None) -> str | None:
    """The owner a session's meta names (None: created with auth off)."""
    owner = (meta or {}).get("owner")
    return owner if isinstance(owner, str) else None


def owner_of(snapshot: JSONObject) -> str | None:
    return owner_in_meta(snapshot.get("meta"))


def memory_ids_of(snapshot: JSONObject) -> list[str]:
    """The memory ids a snapshot's scopes hold, in scope order."""
    return [
        memory_id(scope["id"], route)
        for scope in snapshot.get("scopes", [])
        for route in scope.get("memory_routes", [])
    ]


PENDING_ITEMS_KEY = "pending"  # the snapshot's open pending items (engine/pending.py: PendingItem.to_dict)
TAKEN_OVER_KEY = "taken_over"  # the snapshot's takeover: {"by", "since"} while an operator has it
RESOLVED_ITEMS_KEY = "pending_resolved"  # the snapshot's last resolved items: {id: outcome}


def resolved_items_of(snapshot: JSONObject) -> dict[str, str]:
    found = snapshot.get(RESOLVED_ITEMS_KEY)
    return dict(found) if isinstance(found, dict) else {}


def taken_over_of(snapshot: JSONObject) -> JSONObject | None:
    found = snapshot.get(TAKEN_OVER_KEY)
    return found if isinstance(found, dict) else None


def pending_items_of(snapshot: JSONObject) -> list[JSONObject]:
    """The snapshot's open pending items, oldest first (plain dicts; [] when none)."""
    items = snapshot.get(PENDING_ITEMS_KEY)
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def epoch_of(iso: str) -> float:
    """An ISO time (a pending item's `due`) as epoch seconds; a time without a zone is UTC."""
    from datetime import UTC, datetime

    moment = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def due_of(items: list[JSONObject]) -> str | None:
    """The earliest due time of `items` (ISO, as stored), or None when none has one. An item
    whose `due` cannot be read counts as due now: a timeout is never silently lost."""
    best: tuple[float, str] | None = None
    for item in items:
        due = item.get("due")
        if not isinstance(due, str):
            continue
        try:
            at = epoch_of(due)
        except ValueError:
            at = 0.0
        if best is None or at < best[0]:
            best = (at, due)
    return None if best is None else best[1]


# The snapshot's backoff after a failed timeout turn (engine/pending.py `retried`): {"after": epoch
# seconds, "wait": seconds}; no sweeper expires the session before `after` (server/sweeper.py).
RETRY_KEY = "sweep_retry"


def retry_of(snapshot: JSONObject) -> JSONObject | None:
    """The snapshot's sweep backoff (a timeout turn failed: try again no sooner than `after`), or None."""
    found = snapshot.get(RETRY_KEY)
    return found if isinstance(found, dict) and isinstance(found.get("after"), int | float) else None


def retried_due(snapshot: JSONObject) -> float | None:
    """When the session is next due for the sweeper (epoch seconds): its earliest due time
    (due_items), or its backoff's `after` if later; None when nothing is due."""
    due = due_epoch(due_items(snapshot))
    retry = retry_of(snapshot)
    return due if due is None or retry is None else max(due, float(retry["after"]))


FOLLOW_UP_KEY = "follow_up"  # the snapshot's armed follow-up: {"due", "route", "since"} (engine/follow_up.py)


def follow_up_of(snapshot: JSONObject) -> JSONObject | None:
    """The snapshot's armed follow-up (a route's `follow_up:` waiting for its time), or None."""
    found = snapshot.get(FOLLOW_UP_KEY)
    return found if isinstance(found, dict) else None


OUTCOME_KEY = "outcome"  # the snapshot's outcome: {"name", "turn", "route", "at"} once recorded, {"due", "since"} while armed


def outcome_of(snapshot: JSONObject) -> JSONObject | None:
    """The snapshot's outcome (engine/outcomes.py): recorded (has "name") or armed (has "due"), or None."""
    found = snapshot.get(OUTCOME_KEY)
    return found if isinstance(found, dict) else None


# What `chatrun report` reads of each stored session and history entry (chatrun/report/read.py),
# as JSON paths: SQLite reads them in SQL (json_extract), other stores' values in Python (json_path).
REPORT_SESSION_PATHS = ("$.bot", "$.bot_version", "$.state.locale", "$.meta.locale", "$.outcome.name",
                        "$.scopes[#-1].route", "$.usage.cost", "$.usage.input_tokens", "$.usage.output_tokens",
                        # a /v1 fork (forked_snapshot): counted with the conversation it is a branch of
                        "$.id", "$.meta.forked_from.keys", "$.meta.forked_from.session", "$.meta.forked_from.turn",
                        "$.meta.forked_from.usage.cost", "$.meta.forked_from.usage.input_tokens",
                        "$.meta.forked_from.usage.output_tokens",
                        "$.billed")  # the last attempt its usage counts (store/billing.py)
REPORT_HISTORY_PATHS = ("$.turn", "$.at", "$.ok", "$.seconds", "$.input.decision.kind", "$.feedback.turn",
                        "$.feedback.rating", "$.unfinished")


def json_path(value: Any, path: str) -> Any:
    """The value at a simple JSON path (`$.a.b`, `$.list[#-1].c`: keys, and the last item of a
    list) as SQLite's json_extract reads it; None where there is nothing."""
    for part in path[2:].split("."):
        key, _, index = part.partition("[")
        value = value.get(key) if isinstance(value, dict) else None
        if index:
            value = value[-1] if isinstance(value, list) and value and index == "#-1]" else None
    return value


def due_items(snapshot: JSONObject) -> list[JSONObject]:
    """What of a session has a due time the sweeper acts on: its pending items, its armed
    follow-up and its armed outcome silence (all `{"due": ISO, ...}`), so one index says when a
    session next has work."""
    items = pending_items_of(snapshot)
    follow_up = follow_up_of(snapshot)
    outcome = outcome_of(snapshot)
    extra = [x for x in (follow_up, outcome) if x is not None and "due" in x]
    return [*items, *extra] if extra else items


def due_epoch(items: list[JSONObject]) -> float | None:
    """due_of as epoch seconds (what the stores' due indexes are ordered by)."""
    due = due_of(items)
    if due is None:
        return None
    try:
        return epoch_of(due)
    except ValueError:
        return 0.0


def forked_snapshot(snapshot: JSONObject, old: str, new: str, turn: int) -> JSONObject:
    """A copy of session `old`'s snapshot as the new session `new`, noting where it forked from:
    the session and turn, the first original's id (`keys`: its calls are keyed as that one's, and
    `chatrun report` counts the fork with it) and the usage it carries over (`usage`: billed in the
    original, not again in the fork's report row)."""
    forked: JSONObject = json.loads(json.dumps(snapshot))
    forked["id"] = new
    meta = forked.get("meta") or {}
    earlier = meta.get("forked_from")  # a fork of a fork: its calls are keyed as the first original's
    keys = earlier.get("keys", earlier["session"]) if isinstance(earlier, dict) else old
    usage = forked.get("usage")
    carried = {k: usage[k] for k in ("cost", "input_tokens", "output_tokens")
               if isinstance(usage, dict) and usage.get(k) is not None}
    forked["meta"] = dict(meta, forked_from={"session": old, "turn": turn, "keys": keys, "usage": carried})
    forked.pop(PENDING_ITEMS_KEY, None)  # a decision belongs to the conversation that asked for it
    forked.pop(TAKEN_OVER_KEY, None)
    forked.pop(RESOLVED_ITEMS_KEY, None)
    for scope in forked["scopes"]:
        scope["id"] = renamed_id(scope["id"], old, new)
    return forked


# -- JSON and messages, checked ---------------------------------------------------------------

_KINDS = (SystemMessage, UserMessage, AssistantMessage, ToolResultMessage, SummaryMessage)
_KIND_SET = frozenset(_KINDS)


# One encoder each (json.dumps with options makes a new one per call; a turn saves several values).
_STORED_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False)
_MESSAGES_JSON = json.JSONEncoder(ensure_ascii=False)


def to_json(what: str, value: Any) -> str:
    """`value` as JSON text, or ChatrunError saying what could not be saved and why."""
    try:
        return _stored_json(value)
    except (TypeError, ValueError) as exc:
        raise ChatrunError(f"cannot save {what}: it holds a value JSON cannot represent ({exc})") from None


try:
    from json.encoder import c_make_encoder  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - CPython has it
    c_make_encoder = None

_ENCODERS = threading.local()  # each thread's C encoder for to_json (its markers are its own)


def _stored_json(value: Any) -> str:
    """`_STORED_JSON.encode(value)`, the same text and errors, without what `encode` builds anew
    on every call (the markers, a closure and the C encoder: a commit encodes a snapshot and a
    history entry, ~0.02 M instructions a turn; issue 39): the C encoder made once per thread (the
    circular-reference markers it fills are the running encode's). Without the accelerator, `encode`."""
    if c_make_encoder is None:  # pragma: no cover
        return _STORED_JSON.encode(value)
    try:
        markers, chunks = _ENCODERS.made
    except AttributeError:
        markers = {}
        chunks = c_make_encoder(markers, _STORED_JSON.default, json.encoder.encode_basestring, None,
                                _STORED_JSON.key_separator, _STORED_JSON.item_separator, False, False, False)
        _ENCODERS.made = markers, chunks
    try:
        return "".join(chunks(value, 0))
    except BaseException:
        markers.clear()  # an encode that failed half-way leaves its containers marked
        raise


def swapped_texts(key: str, expected: JSONObject, record: JSONObject | None) -> tuple[str, str | None]:
    """A compare-and-swap's two texts (RecordSwaps.swap_record): the record the store must still
    hold, as the stores write it (a record read back encodes to the text it was read from), and
    the one to save instead (None: delete)."""
    return to_json(f"record {key}", expected), None if record is None else to_json(f"record {key}", record)


def from_json(text: str) -> JSONObject:
    """A JSON object a store saved (its own text: trusted to be an object)."""
    value: JSONObject = json.loads(text)
    return value


def known_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The fields of dataclass `cls` in a stored record. During a rolling deploy a newer chatrun's
    replica may have written fields this one does not know: they are left out, not a TypeError
    that would stop this replica's outbox worker, its GET /pending or a channel's recovery (as
    PendingItem.from_dict)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def check_messages(memory: str, messages: Any) -> list[Message]:
    """The messages as a list, or ChatrunError naming the memory and the bad item."""
    try:
        items = list(messages)
    except TypeError:
        raise ChatrunError(f"memory {memory}: expected a list of messages, got {type(messages).__name__}") from None
    if set(map(type, items)) <= _KIND_SET:  # the usual case, in one pass in C: a commit checks the whole window
        return items
    for i, m in enumerate(items):
        if not isinstance(m, _KINDS):
            raise ChatrunError(f"memory {memory}: item {i} is a {type(m).__name__}, not a chat message")
    return items


def messages_json(memory: str, messages: Any) -> str:
    return encode_messages(check_messages(memory, messages))


_TEXT_JSON = json.encoder.encode_basestring  # a str as a JSON string, as _MESSAGES_JSON writes it (not ASCII-only)


def encode_messages(messages: list[Message]) -> str:
    """Checked messages as one JSON array: the text `_MESSAGES_JSON.encode([m.to_dict() ...])`
    makes, byte for byte. A commit writes a changed memory whole (its window, every turn); the
    encoder's walk of a new dict per message cost ~6,000 instructions a message, so a message of
    text alone (most of a window) is written from its text, in this one loop (a function call and
    two concatenations per message were a fifth of what was left: issue 39, at 70 messages). The
    test of tests/test_store_record.py compares the two for every kind of message."""
    parts: list[str] = []
    add = parts.append
    for m in messages:
        if type(m) is UserMessage and not m.attachments:
            add(f'{{"role": "user", "content": {_TEXT_JSON(m.content)}}}')
        elif type(m) is AssistantMessage and m.content is not None and not m.tool_calls:
            add(f'{{"role": "assistant", "content": {_TEXT_JSON(m.content)}}}')
        elif type(m) is SystemMessage:
            add(f'{{"role": "system", "content": {_TEXT_JSON(m.content)}}}')
        else:
            add(_MESSAGES_JSON.encode(m.to_dict()))  # the other kinds and shapes: their dict, as it is
    return "[" + ", ".join(parts) + "]"


_SEPARATOR = len(", ")
_MOST_DROPPED = 8  # how far into the old window a window's first kept message is looked for


def _content_size(messages: tuple[Message, ...] | list[Message]) -> int:
    """What `messages` add to a JSON array's length: their own text and a separator each."""
    return len(encode_messages(list(messages))) - len("[]") + _SEPARATOR if messages else 0


def window_size(old: tuple[Message, ...], old_size: int, new: list[Message]) -> int | None:
    """`len(encode_messages(new))`, from the old window's size, when `new` is `old` with a few
    messages evicted after its first `head` (0 or 1: a system message stays first) and others
    appended, the same objects (messages are immutable); else None. A commit writes its window
    whole every turn, and the server measured it by encoding it (some 2,600 instructions a
    message) only for the session cache's byte bound: this encodes the messages that came and
    went. tests/test_store_record.py holds it to the encoded length."""
    if not old or not new or old_size <= len(old):  # an unknown size (0) is not a window's
        return None
    content = old_size - len("[]") + _SEPARATOR  # every message's text, and a separator each
    for head in (0, 1):
        if head and new[0] is not old[0]:
            break
        for dropped in range(min(_MOST_DROPPED, len(old) - head) + 1):
            kept = len(old) - head - dropped
            if kept > len(new) - head or not all(map(operator.is_, old[head + dropped:], new[head:head + kept])):
                continue
            content += _content_size(new[head + kept:]) - _content_size(old[head:head + dropped])
            return content - _SEPARATOR + len("[]")
    return None



EMPTY_MEMORY_SIZE = len("[]")  # what an absent memory counts in a cache's byte bound


# -- the record ------------------------------------------------------------------------------


@dataclass
class SessionRecord:
    """One stored session as a store returns it: its snapshot (as stored, and decoded once),
    version, the fields read from it, and its memories with their JSON sizes (for a cache's
    byte bound)."""

    session_id: str
    version: str
    snapshot_json: str
    snapshot: JSONObject  # decoded from snapshot_json; whoever restores a session from it may keep it
    bot: str | None
    owner: str | None
    committed: Committed | None
    memory_ids: list[str]
    bot_version: str | None = None  # the content version of the bot the session runs on (None: older snapshots)
    pending: list[JSONObject] = field(default_factory=list)  # open pending items (snapshot "pending")
    taken_over: JSONObject | None = None  # {"by", "since"} while an operator has the conversation
    resolved: dict[str, str] = field(default_factory=dict)  # the last resolved items: id -> outcome
    memories: dict[str, list[Message]] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # memory id -> its JSON size in bytes

    @classmethod
    def decode(cls, session_id: str, snapshot_json: str, version: str) -> SessionRecord:
        """The record of a stored snapshot text (the one JSON pass of a load)."""
        return cls.of(session_id, from_json(snapshot_json), version, snapshot_json)

    @classmethod
    def of(cls, session_id: str, snapshot: JSONObject, version: str, snapshot_json: str) -> SessionRecord:
        bot, bot_version = snapshot.get("bot"), snapshot.get("bot_version")
        return cls(
            session_id=session_id,
            version=version,
            snapshot_json=snapshot_json,
            snapshot=snapshot,
            bot=bot if isinstance(bot, str) else None,
            owner=owner_of(snapshot),
            committed=snapshot.get("committed"),
            memory_ids=memory_ids_of(snapshot),
            bot_version=bot_version if isinstance(bot_version, str) else None,
            pending=pending_items_of(snapshot),
            taken_over=taken_over_of(snapshot),
            resolved=resolved_items_of(snapshot),
        )

    @property
    def due(self) -> str | None:
        """The earliest due time of its pending items and its follow-up (ISO), or None."""
        return due_of(due_items(self.snapshot))

    @property
    def pending_kinds(self) -> list[str]:
        """The kinds of its open pending items, oldest first ("approval", "question", "takeover")."""
        return [str(i.get("kind")) for i in self.pending]

    @property
    def size(self) -> int:
        """Roughly what the session costs in memory, in bytes (its JSON size)."""
        return len(self.snapshot_json) + sum(self.sizes.values())


@dataclass
class PendingSession:
    """A session with open pending items, as the operators' list shows it (`list_pending`)."""

    session_id: str
    bot: str | None
    owner: str | None
    items: list[JSONObject]
    taken_over: JSONObject | None = None
    last: JSONObject | None = None  # the last turn (WaitingEntry.last), when the store keeps it

    def to_dict(self) -> JSONObject:
        return {"session": self.session_id, "bot": self.bot, "owner": self.owner, "items": self.items,
                "taken_over": self.taken_over, "last": self.last}


def pending_session(record: SessionRecord, bot: str | None = None, kind: str | None = None) -> PendingSession | None:
    """What `list_pending(bot, kind)` lists of a stored session: its items of `kind` (all when
    None) if it runs on `bot` (any when None) and has any; else None. The one filter rule of
    every store."""
    if bot is not None and record.bot != bot:
        return None
    items = [i for i in record.pending if kind is None or i.get("kind") == kind]
    listed = items or (record.taken_over is not None and kind in (None, "takeover"))
    return PendingSession(record.session_id, record.bot, record.owner, items, record.taken_over) if listed else None


# -- the operators' index and the tallies (flat costs, issue 33) -------------------------------
#
# GET /pending, the pending gauges, the per-principal quota and `chatrun versions list` read
# these, never every session: each store keeps them beside the sessions, updated by the commit
# that changes them and dropped with the session. The keys are made here, once for every store.

ITEM_TOKEN_KEY = "token"  # a pending item's secret (engine/pending.py TOKEN_KEY): never copied into the index
TALLY_OWNER = "owner"  # sessions per owner (--max-sessions-per-principal)
TALLY_VERSION = "version"  # sessions per bot version: name json [bot, content version]
TALLY_PENDING = "pending"  # open pending items per bot and kind: name json [bot, kind] (the gauges)
Tally = tuple[str, str]  # (family, name)


def waiting_key(bot: str | None = None, kind: str | None = None, role: str | None = None) -> str:
    """The index of the waiting sessions GET /pending?bot=&kind=&role= lists (None: any)."""
    return json.dumps([bot, kind, role], ensure_ascii=False)


def recent_key(bot: str | None = None, kind: str | None = None) -> str:
    """The index of the waiting sessions GET /pending?order=recent lists: newest activity first
    (the position is minus the time of the session's last turn)."""
    return "recent " + json.dumps([bot, kind], ensure_ascii=False)


def age_key(bot: str, kind: str) -> str:
    """The index of the open items of one bot and kind, by age (the oldest-item gauge)."""
    return "age " + json.dumps([bot, kind], ensure_ascii=False)


@functools.lru_cache(maxsize=256)  # every commit names its bot's version: the same few names again and again
def tally_name(*parts: str | None) -> str:
    return _MESSAGES_JSON.encode(list(parts))  # json.dumps(..., ensure_ascii=False), no new encoder per call


@dataclass
class WaitingEntry:
    """What a store keeps of one waiting session for the operators' list: enough to show it
    (no snapshot read), and its position in each index it is in (`positions`: index key ->
    epoch seconds, the creation of its oldest item that the index selects; a takeover with no
    item counts from its start)."""

    session_id: str
    bot: str | None
    owner: str | None
    items: list[JSONObject]
    taken_over: JSONObject | None
    positions: dict[str, float]
    last: JSONObject | None = None  # the last turn: {"at": epoch, "from": "user"|"operator"|"decision", "text"}

    def to_json(self) -> str:
        return to_json(f"session {self.session_id}: its waiting entry", self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> WaitingEntry:
        return cls(**known_fields(cls, from_json(text)))

    def shown(self, kind: str | None = None) -> PendingSession:
        """As list_pending shows it: its items of `kind` (all when None)."""
        items = [i for i in self.items if kind is None or i.get("kind") == kind]
        return PendingSession(self.session_id, self.bot, self.owner, items, self.taken_over, self.last)


def waiting_entry(session_id: str, snapshot: JSONObject) -> WaitingEntry | None:
    """The session's entry in the operators' index, or None when nothing of it waits."""
    items, taken = pending_items_of(snapshot), taken_over_of(snapshot)
    if not items and taken is None:
        return None
    bot = snapshot.get("bot") if isinstance(snapshot.get("bot"), str) else None
    positions: dict[str, float] = {}

    def place(key: str, at: float) -> None:
        positions[key] = min(at, positions.get(key, at))

    for item in items:
        kind, at = str(item.get("kind")), _created_epoch(item)
        for b in (None, bot):
            for k in (None, kind):
                for role in (None, *[str(r) for r in item.get("by") or ()]):
                    place(waiting_key(b, k, role), at)
        if bot is not None:
            place(age_key(bot, kind), at)
    if taken is not None:  # listed without a role or age filter, at the takeover's start
        since = _epoch_or_zero(taken.get("since"))
        for b in (None, bot):
            for k in (None, "takeover"):
                positions.setdefault(waiting_key(b, k), since)
    last = last_turn_of(snapshot)
    if last is not None:  # the inbox's order: newest activity first, by bot and kind
        kinds = {str(i.get("kind")) for i in items} | ({"takeover"} if taken is not None else set())
        for b in (None, bot):
            for k in (None, *sorted(kinds)):
                positions[recent_key(b, k)] = -float(last["at"])
    shown = [{k: v for k, v in i.items() if k != ITEM_TOKEN_KEY} for i in items]  # a backend's secret stays in the snapshot
    return WaitingEntry(session_id, bot, owner_of(snapshot), shown, taken, positions, last)


LAST_TEXT = 200  # characters of the last message the inbox shows


def last_turn_of(snapshot: JSONObject) -> JSONObject | None:
    """The session's last committed turn as the operators' inbox shows it: when, from whom, what
    (a user's message, an operator's, or the kind of a decision); None before the first. An
    operator's message also says `by` whom: the name of the operator holding the conversation
    (only its holder may speak in it: engine/waiting.py, `_check_holder`), null when no one
    signed in holds it (a server without --auth)."""
    committed = snapshot.get("committed")
    if not isinstance(committed, dict) or not isinstance(committed.get("at"), int | float):
        return None
    given = committed.get("input")
    decision = given.get("decision") if isinstance(given, dict) else None
    if isinstance(decision, dict):
        spoken = decision.get("kind") == "operator_say"
        sender, text = ("operator", decision.get("text")) if spoken else ("decision", decision.get("kind"))
    else:
        sender, text = "user", given.get("userMessage") if isinstance(given, dict) else given
    text = text if isinstance(text, str) else ""
    last: JSONObject = {"at": float(committed["at"]), "from": sender, "text": text[:LAST_TEXT]}
    if sender == "operator":
        last["by"] = _holder_name(taken_over_of(snapshot))
    return last


def _holder_name(taken: JSONObject | None) -> str | None:
    holder = (taken or {}).get("by")
    name = holder.get("name") if isinstance(holder, dict) else None
    return name if isinstance(name, str) and name else None


def tallies_of(snapshot: JSONObject) -> list[tuple[str, str, int]]:
    """What the session counts for in the stores' tallies: (family, name, how many)."""
    out: list[tuple[str, str, int]] = []
    owner, bot, version = owner_of(snapshot), snapshot.get("bot"), snapshot.get("bot_version")
    if owner is not None:
        out.append((TALLY_OWNER, owner, 1))
    if isinstance(bot, str) and isinstance(version, str):
        out.append((TALLY_VERSION, tally_name(bot, version), 1))
    kinds: dict[str, int] = {}
    for item in pending_items_of(snapshot):
        kinds[str(item.get("kind"))] = kinds.get(str(item.get("kind")), 0) + 1
    out += [(TALLY_PENDING, tally_name(bot if isinstance(bot, str) else None, k), n) for k, n in sorted(kinds.items())]
    return out


def tallies_json(tallies: list[tuple[str, str, int]]) -> str:
    """A session's tallies as the stores keep them beside it (compared as text: most commits
    change none, and then the tallies are not touched)."""
    return json.dumps([list(t) for t in tallies], ensure_ascii=False)


def tallies_from_json(text: str | None) -> list[tuple[str, str, int]]:
    return [(str(f), str(n), int(c)) for f, n, c in json.loads(text or "[]")]


def _created_epoch(item: JSONObject) -> float:
    return _epoch_or_zero(item.get("created"))


def _epoch_or_zero(iso: Any) -> float:
    try:
        return epoch_of(iso) if isinstance(iso, str) else 0.0
    except ValueError:
        return 0.0


CURSOR_PATTERN = r"^-?[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?:.+$"  # what the HTTP API documents a cursor as


def encode_cursor(position: float, session_id: str) -> str:
    """A paging cursor: after this (position, session) in an index, as "POSITION:SESSION". Every
    text of CURSOR_PATTERN's shape is a place in the index (an invented one pages from there), so a
    well-formed cursor is never refused."""
    return f"{float(position)!r}:{session_id}"


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The (position, session) of a cursor; ValueError when it is not of encode_cursor's shape."""
    position, colon, session_id = cursor.partition(":")
    try:
        value = float(position)
    except ValueError:
        raise ValueError("not a cursor this server gave out (POSITION:SESSION)") from None
    if not colon or not session_id or value != value or value in (float("inf"), float("-inf")):
        raise ValueError("not a cursor this server gave out (POSITION:SESSION)")
    return value, session_id


# -- the commit ------------------------------------------------------------------------------


@dataclass
class Commit:
    """What one request wrote to a session, checked and encoded once, ready for any store:
    the snapshot (JSON text), each changed memory (None: deleted) as messages and as JSON
    text, the history entries to append (JSON text), and, for the server's fenced write, the
    version it must land on (`expected`: None unchecked, versions.CREATE a new session) and
    the outcome to record for exactly-once retries (request id, its history entry as JSON).

    `owner` is read from the snapshot for stores that index sessions by owner; `turn` and
    `committed` tell the server which turn this is and what the snapshot says was committed."""

    session_id: str
    snapshot_json: str
    owner: str | None = None
    memories: dict[str, list[Message] | None] = field(default_factory=dict)
    # Their JSON, made when a store first asks (`memories_json`): the in-memory store keeps the
    # messages themselves and never does (a steady turn's whole window, encoded for nothing).
    encoded_memories: dict[str, str | None] | None = field(default=None, repr=False)
    # The JSON size of changed memories measured without their text (record.window_size).
    sizes: dict[str, int] = field(default_factory=dict, repr=False)
    history_json: list[str] = field(default_factory=list)
    expected: str | None = None
    outcome: tuple[str, str] | None = None
    turn: int | None = None
    committed: Committed | None = None
    outbox: list[OutboxEntry] = field(default_factory=list)  # backend events to deliver, from the history
    due: float | None = None  # the earliest due time of its pending items and follow-up, epoch s (the due index)
    pending_count: int = 0  # pending items the snapshot holds, + 1 for a takeover (the operators' index)
    waiting: WaitingEntry | None = None  # its entry in the operators' index (None: nothing waits)
    tallies: list[tuple[str, str, int]] = field(default_factory=list)  # what it counts for (tallies_of)
    bot: str | None = None  # the snapshot's bot (stores index idle sessions by bot: retention)
    # What its turns remembered of their user (`remember:`, the summary): written by the store in
    # this commit's own atomic write (store/user_memory.py), never after it.
    remembered: list[Remembered] = field(default_factory=list)
    # What its turns used, added to their user's budget window (`limits.max_user_*`): written in
    # this commit's own atomic write like `remembered` (store/user_budget.py). The server adds it.
    charges: list[Charge] = field(default_factory=list)
    # Where the engine's snapshot ends in snapshot_json when the committed turn was appended to
    # it (encode's `committed`): `engine_snapshot_json()`. -1: not known.
    engine_end: int = field(default=-1, repr=False)
    # A new session's (expected versions.CREATE): the most sessions its owner may have, this one
    # not counted yet (--max-sessions-per-principal; 0: no limit). The store checks the owner's
    # tally and counts the session in one atomic step with its write (`check_quota`).
    quota: int = 0

    def user_writes(self) -> Sequence[Remembered | Charge]:
        """The user records this commit changes in its own atomic write (store/user_records.py)."""
        return [*self.remembered, *self.charges] if self.charges else self.remembered

    @property
    def quota_owner(self) -> str | None:
        """The owner whose tally this commit must find under `quota`, or None: no check."""
        return self.owner if self.quota > 0 and self.expected == CREATE and self.owner is not None else None

    def check_quota(self, owned: int) -> None:
        """SessionQuota when this new session's owner has `owned` >= `quota` sessions already:
        called by each store inside the atomic step that writes the commit."""
        if self.quota_owner is not None and owned >= self.quota:
            raise SessionQuota(self.quota_owner, owned, self.quota)

    @classmethod
    def encode(
        cls,
        session_id: str,
        snapshot: JSONObject,
        memories: dict[str, list[Message] | None],
        history: list[JSONObject],
        expected: str | None = None,
        outcome: tuple[str, JSONObject] | None = None,
        committed: Committed | None = None,
    ) -> Commit:
        """SessionStore.commit_turn's arguments, checked and encoded: a value JSON cannot hold
        or an item that is not a message raises ChatrunError here, before any store is touched.
        `committed`: stored in the snapshot as with_committed does (the same text)."""
        snapshot_json, engine_end = _snapshot_text(session_id, snapshot, committed)
        if committed is not None:
            snapshot = with_committed(snapshot, committed)
        mems = {mid: None if m is None else check_messages(mid, m) for mid, m in memories.items()}
        items = pending_items_of(snapshot)
        waiting = len(items) + (taken_over_of(snapshot) is not None)  # a takeover waits for its release
        bot = snapshot.get("bot")
        return cls(
            session_id=session_id,
            snapshot_json=snapshot_json,
            engine_end=engine_end,
            owner=owner_of(snapshot),
            memories=mems,
            history_json=[to_json(f"session {session_id}: history entry {i}", _as_stored(e))
                          for i, e in enumerate(history)],
            expected=expected,
            outcome=None if outcome is None else (outcome[0], to_json(f"session {session_id}: outcome", outcome[1])),
            outbox=outbox_of(session_id, history),
            due=retried_due(snapshot),
            pending_count=waiting,
            waiting=waiting_entry(session_id, snapshot) if waiting else None,
            tallies=tallies_of(snapshot),
            bot=bot if isinstance(bot, str) else None,
            remembered=remembered_of(session_id, history),
        )

    def engine_snapshot_json(self) -> str | None:
        """The engine's snapshot as JSON text (the stored one without the committed turn), the
        same text as to_json of it; None when not known. The /v1 index's state record of the
        turn holds it: encoding it a second time cost ~0.06 M instructions a turn (issue 39)."""
        if self.engine_end < 0:
            return None
        text = self.snapshot_json
        return text if self.engine_end == len(text) - 1 else text[:self.engine_end] + "}"

    @property
    def memories_json(self) -> dict[str, str | None]:
        """Each changed memory as JSON text (None: deleted). Encoding checked messages cannot
        fail (they hold text), so making it late keeps the commit all or nothing."""
        if self.encoded_memories is None:
            self.encoded_memories = {mid: None if m is None else encode_messages(m) for mid, m in self.memories.items()}
        return self.encoded_memories

    def memory_size(self, memory_id: str) -> int | None:
        """The JSON size of a changed memory if its text was made already, else None."""
        text = None if self.encoded_memories is None else self.encoded_memories.get(memory_id)
        return self.sizes.get(memory_id) if text is None else len(text)

    def merge(self, later: Commit) -> None:
        """Fold a later commit of the same request into this one: its snapshot wins, memories
        are replaced, history entries append, and a later turn's outcome (or a notice's) replaces an earlier one."""
        self.snapshot_json, self.owner, self.committed = later.snapshot_json, later.owner, later.committed
        self.engine_end = later.engine_end
        self.due, self.pending_count, self.bot = later.due, later.pending_count, later.bot
        self.waiting, self.tallies = later.waiting, later.tallies
        mine, theirs = self.encoded_memories, later.encoded_memories
        self.memories.update(later.memories)
        for mid in later.memories:  # a size measured for an earlier commit's messages is not theirs
            self.sizes.pop(mid, None)
        self.sizes.update(later.sizes)
        self.encoded_memories = None if mine is None or theirs is None else {**mine, **theirs}
        self.history_json.extend(later.history_json)
        self.outbox.extend(later.outbox)
        self.remembered.extend(later.remembered)
        self.charges.extend(later.charges)
        if later.turn is not None:
            self.turn, self.outcome = later.turn, later.outcome
        elif later.outcome is not None:  # a request answered without a turn (a notice)
            self.outcome = later.outcome


def _snapshot_text(session_id: str, snapshot: JSONObject, committed: Committed | None) -> tuple[str, int]:
    """(to_json of with_committed(snapshot, committed), where the engine's snapshot ends in it
    or -1): the snapshot encoded once, the committed turn appended as the last member, as
    `snapshot | {"committed": ...}` places it (the same text)."""
    what = f"session {session_id}: its snapshot"
    if type(snapshot) is not dict or (committed is not None and (not snapshot or "committed" in snapshot)):
        return to_json(what, with_committed(snapshot, committed)), -1
    text = to_json(what, snapshot)
    if committed is None:
        return text, len(text) - 1
    return text[:-1] + ', "committed": ' + to_json(what, committed) + "}", len(text) - 1


# -- the outbox ------------------------------------------------------------------------------

OUTBOX_KEY = "outbox"  # a committed turn's history entry lists its deliveries under this key
PENDING = "pending"  # waiting for its next attempt (or being tried under a claim)
DEAD = "dead"  # out of attempts or too old: kept as a dead letter until retried


@dataclass
class OutboxEntry:
    """One delivery of one backend event to one sink, stored with the turn that emitted it.

    `body` is what the sink receives (the event, its turn, session, bot, the idempotency key
    `id` and `created`); the rest is the delivery's bookkeeping: tries so far, when the next
    is due, the last error, and the claim of the worker trying it now (a token and until when)."""

    id: str
    session_id: str
    sink: str
    body: JSONObject
    created: float
    attempts: int = 0
    next_at: float = 0.0
    state: str = PENDING
    error: str | None = None
    claim: str | None = None
    claimed_until: float = 0.0

    def to_json(self) -> str:
        return to_json(f"outbox entry {self.id}", self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> OutboxEntry:
        return cls(**known_fields(cls, from_json(text)))

    @property
    def due(self) -> float:
        """When a worker may claim it next (a claim held by a dead worker ends too)."""
        return max(self.next_at, self.claimed_until)

    @property
    def route(self) -> str:
        """Which replicas may claim it: those serving its bot's sink (route_of)."""
        return route_of(str(self.body.get("bot")), self.sink)

    def shown(self) -> JSONObject:
        """What `GET /outbox` lists of it (no claim token)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("claim",)}


def route_of(bot: str, sink: str) -> str:
    """An outbox route: "<bot>/<sink>" (a bot's name has no "/"). A worker claims only the
    entries of the routes it serves, so a replica that does not know a bot or a sink (another
    bot's replica, an older version during a rolling deploy) leaves them to one that does."""
    return f"{bot}/{sink}"


def _as_stored(entry: JSONObject) -> JSONObject:
    """A history entry as stored: its deliveries go to the outbox, not into the history (whose
    readers include the session's own user; the backend events themselves stay in `events`),
    and what it remembered of its user goes to the user's memory only (erasing that memory
    leaves no copy of it in a session's history)."""
    if OUTBOX_KEY not in entry and REMEMBERED_KEY not in entry:
        return entry
    return {k: v for k, v in entry.items() if k not in (OUTBOX_KEY, REMEMBERED_KEY)}


# -- what a turn remembered of its user --------------------------------------------------------

REMEMBERED_KEY = "remembered"  # a committed turn's entry carries its user-memory write under this key


@dataclass
class Remembered:
    """What one turn remembered of its signed-in user (`remember:` facts, the summary at the
    conversation's end): FACT -> value (None: forgotten), for `bot` and `principal`, facts
    older than `keep` seconds dropped as it is written. Committed with the turn: every store
    writes it in the commit's own atomic write (store/user_memory.py says why)."""

    bot: str
    principal: str
    facts: JSONObject
    keep: float | None = None

    def to_dict(self) -> JSONObject:
        return {"bot": self.bot, "principal": self.principal, "facts": self.facts, "keep": self.keep}


@dataclass
class Charge:
    """What one turn used (its entry's `usage`: input/output tokens, cost), added to what
    `principal` spent of `bot`'s user budget in the window that began at `window` (epoch s).
    Committed with the turn, in the same atomic write as `Remembered` (store/user_budget.py)."""

    bot: str
    principal: str
    window: float
    usage: JSONObject


def remembered_of(session_id: str, history: list[JSONObject]) -> list[Remembered]:
    """The user-memory writes of the committed turns among `history` (engine/session.py puts
    them under "remembered" in a successful turn's entry only)."""
    out: list[Remembered] = []
    for entry in history:
        found = entry.get(REMEMBERED_KEY)
        if not found or not entry.get("ok"):
            continue
        to_json(f"session {session_id}: what turn {entry.get('turn')} remembered", found)  # fails the turn, not the store
        out.append(Remembered(str(found["bot"]), str(found["principal"]), dict(found["facts"]), found.get("keep")))
    return out


def outbox_of(session_id: str, history: list[JSONObject]) -> list[OutboxEntry]:
    """The deliveries the committed turns among `history` queued (Session puts them under
    "outbox" in a successful turn's entry; a failed turn's entry has at most its channel reply,
    telling the user it failed (engine/session.py's _replies), and its `Usage` event, marked
    `billed`). The stored history
    entry leaves them out (_as_stored)."""
    out: list[OutboxEntry] = []
    for entry in history:
        for item in entry.get(OUTBOX_KEY) or ():
            # A failed turn queues its user's reply and its Usage only (its calls were billed);
            # a rating is committed as it is written.
            if not entry.get("ok") and not item.get("reply") and not item.get("billed") and "feedback" not in entry:
                continue
            body = item["body"]
            out.append(OutboxEntry(body["id"], session_id, item["sink"], body, body["created"],
                                   next_at=body["created"]))
    return out


def unclaimed(entry: OutboxEntry) -> OutboxEntry:
    """The entry as saved after an attempt: its claim let go."""
    return OutboxEntry(**{**entry.__dict__, "claim": None, "claimed_until": 0.0})


def requeued(entry: OutboxEntry, now: float) -> OutboxEntry:
    """A dead letter retried by hand: pending, due now, no tries counted, its age counted from now."""
    return OutboxEntry(**{**entry.__dict__, "state": PENDING, "attempts": 0, "next_at": now, "created": now,
                          "claim": None, "claimed_until": 0.0})
