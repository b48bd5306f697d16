"""Which chatrun session an OpenAI-style request belongs to (docs/openai-api.md, "Sessions").

OpenAI clients send the whole conversation with every request and no session id. The rules,
first match wins:

1. An explicit session id (the X-Chatrun-Session header, or a Responses `conversation`):
   that session's next turn; a session that does not exist yet is created under that id.
2. A committed turn the request continues: the Responses `previous_response_id`, or for
   Chat Completions the conversation before the last user message, looked up in the index
   of committed turns within the request's namespace (bot, principal, and the `user` field
   or a trusted front-end chat-id header). When that session is still at that turn, the
   request is its next turn. So it is when every turn since was someone else's part of the
   same conversation, never the user's: a decision or an answer sent over HTTP or the
   WebSocket, an operator taking over, speaking, releasing, an item timing out (each a turn
   whose history input is a `decision`). When the session has moved on by a user's turn
   instead (the client regenerated an answer, edited an earlier message, or a second client
   shares the history), a new session forks from the state right after that turn, so no
   conversation ever overwrites another. Turns of a deleted session match nothing.
3. Nothing matches: a new session, whose earlier messages become its memory; for a first
   message sent again in a front end's chat (`Identity.in_chat`), a fork of the chat's start.

What those other parties' turns said to the user since the user's last exchange over /v1
(`Opened.caught_up`: the turns after the session's last /v1 turn and its last user turn,
with any of the four ways of naming the session) comes first in the next response.

Every committed turn is recorded in the store (`RecordStore`: durable with SQLite), so the
rules hold across restarts; a store without records keeps the index in the process. A turn's
keys (its prefix key, its response id) hold a small record naming the session and the turn;
the session as it was after the turn (snapshot and memories, read only to fork) is one
record of its own beside them, so a lookup or a clean-up reads no conversation. That state is
written as a delta of the state this process recorded for the same live session's turn before
(the snapshot, and each memory's messages dropped from its front and added: a turn's write does
not grow with the conversation), in full every CHAIN turns, after a restart and when a memory
was rewritten; a fork reads the chain back to a full state. Only the last KEEP_TURNS turns of a
session are kept (an older one matches nothing: rule 3) with the states their chains need, and
a session's records go when it is deleted. A Responses id's record also keeps the response object
its request answered (`RESPONSE`), which GET /v1/responses/{id} answers (`kept_response`) as long
as the id is kept. The list of those kept turns is read back only when
this process did not write it last for the same live session (`_Recorded.listed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import math
import operator
import secrets
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chatrun.engine import once
from chatrun.engine.conversation import DONE_CALLS_KEY
from chatrun.engine.waiting import not_decided_here
from chatrun.errors import SessionQuota
from chatrun.messages import AssistantMessage, Message, UserMessage, message_from_dict
from chatrun.server import wire
from chatrun.server.auth import Principal
from chatrun.server.session_writes import quota_refused
from chatrun.server.sessions import EXISTING, NEW, SessionRegistry
from chatrun.store.local import RecordOps
from chatrun.store.record import (
    PENDING_ITEMS_KEY,
    Commit,
    encode_messages,
    forked_snapshot,
    from_json,
    outcome_of,
    renamed_id,
    to_json,
)
from chatrun.store.versions import CREATE

if TYPE_CHECKING:
    from chatrun.engine.session import Session

log = logging.getLogger("chatrun.server.openai")

CONTINUED = "continued"  # the request is the next turn of a stored session
FORKED = "forked"  # a new session forked from an earlier turn of another
USER_NAMESPACE = "user:"  # a namespace from the `user` field; any other is a front end's chat id
NEW_SESSION = "new"  # nothing matched: a new session (earlier messages seeded into its memory)
REPLAYED = "replayed"  # a retry of a request whose turn committed: its answer again, nothing run

# How long a retry waits for the attempt it repeats (still running, perhaps on another replica)
# to commit or fail; an attempt whose process died is not waited for (server/liveness.py).
REPLAY_WAIT = 300.0
REPLAY_POLL = 0.1
LIVENESS_LOOK = 0.5  # seconds between two looks at whether the running attempt's process is alive

Exchange = list[tuple[str, str]]  # (role, text) pairs, role "user" or "assistant"
Kept = dict[str, dict[str, Any]]  # by key of the index: what its record keeps besides the turn's
RESPONSE = "response"  # a response id's record's member: the response object (TurnIndex.kept_response)
# Turns of a session that can be continued or forked from. Each record holds a snapshot and the
# memories, so keeping every turn would grow a session's index with the square of its length.
KEEP_TURNS = 32
# At most this many delta states in a row before a full one: what a fork reads back.
CHAIN = 8


@dataclass
class Identity:
    """What a request says about its conversation."""

    bot: str
    # The conversation before the turn's user message (read from the body only when needed when
    # the body resent a conversation this process read before: openai_resent.ResentExchange).
    earlier: Sequence[tuple[str, str]]
    explicit_id: str | None = None  # X-Chatrun-Session / Responses `conversation`
    namespace: str = ""  # the `user` field or a trusted front-end chat id
    previous: dict[str, Any] | None = None  # the record of previous_response_id
    route: str | None = None  # entry route for a new session (model "bot/route")
    version: str | None = None  # the Chatrun-Bot-Version a new session starts on (docs/versions.md)
    locale: str | None = None  # a new session's locale: `metadata.locale`, else Accept-Language (docs/i18n.md)
    # The running hash of `earlier` (per owner): hashed once, then only extended by the turn.
    _hashes: dict[str | None, Any] = field(default_factory=dict, repr=False, compare=False)

    def prefix_key(self, owner: str | None, more: Sequence[tuple[str, str]] = ()) -> str:
        """The index key of the earlier conversation followed by `more` (TurnIndex.prefix_key)."""
        return _key_after(self._running(owner), bool(self.earlier), more)

    def request_key(self, owner: str | None, rest: list[Any]) -> str:
        """The key of one request's outcome: the conversation's running hash (bot, owner,
        namespace, the earlier messages: hashed once for both keys) followed by `rest`, what
        else the request says about its turn. A NUL byte (never in JSON text) parts the two."""
        hashed = self._running(owner).copy()
        hashed.update(b"\0" + _JSON(rest).encode())
        digest: str = hashed.hexdigest()
        return "openai:request:" + digest

    @property
    def in_chat(self) -> bool:
        """Whether the namespace is a front end's chat id (a trusted header), not the `user` field:
        then a first message sent again in it is that chat's first answer regenerated."""
        return bool(self.namespace) and not self.namespace.startswith(USER_NAMESPACE)

    def start_key(self, owner: str | None) -> str:
        """The key of the chat's start: which session its first turn made (`TurnIndex.open`)."""
        hashed = self._running(owner).copy()
        hashed.update(b"\0start")
        digest: str = hashed.hexdigest()
        return "openai:start:" + digest

    def hashed_as(self, owner: str | None, running: Any) -> bool:
        """Take `running` as the running hash of `earlier` for `owner` (False for None)."""
        if running is None:
            return False
        self._hashes[owner] = running
        return True

    def running_after(self, owner: str | None, more: Sequence[tuple[str, str]]) -> Any:
        """The running hash of `earlier` followed by `more` (what _key_after hashes before "]]")."""
        return extended(self._running(owner), bool(self.earlier), more)

    def _running(self, owner: str | None) -> Any:
        running = self._hashes.get(owner)
        if running is None:
            running = self._hashes[owner] = _running_hash(self.bot, owner, self.namespace, self.earlier)
        return running


@dataclass(frozen=True)
class Claim:
    """An attempt's claim of its request's outcome key (`TurnIndex.claim`), as it is written: a
    take-over and a release replace exactly this record, never another attempt's."""

    key: str
    record: dict[str, Any]


@dataclass
class Opened:
    session: Session
    how: str
    forked_from: str | None = None
    seeded: int = 0  # earlier messages put into a new session's memory
    notes: list[str] = field(default_factory=list)
    # The history entries of the turns others took since the user's last exchange (decisions,
    # an operator's): what they said to the user comes first in this request's response.
    caught_up: list[dict[str, Any]] = field(default_factory=list)


def is_users_turn(entry: dict[str, Any]) -> bool:
    """Whether a history entry is a turn the user took (a message), not one another party took
    for the conversation (a decision, an answer, an operator's takeover, words or release, a
    timeout: their input is a `decision`)."""
    given = entry.get("input")
    return not (isinstance(given, dict) and "decision" in given)


def others_turns_since(history: list[dict[str, Any]], turn: int) -> list[dict[str, Any]] | None:
    """The committed turns after `turn` when all of them were others' (None when the user took
    one since: the conversation moved on without this client). Failed attempts changed nothing."""
    later = [entry for entry in history if entry.get("ok") and int(entry.get("turn") or 0) > turn]
    return None if any(is_users_turn(entry) for entry in later) else later


def trailing_others_turns(history: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """The committed turns after `turn` and after the user's last turn: what the user has not
    seen over /v1 (a user's turn on another channel showed them what came before it)."""
    caught_up: list[dict[str, Any]] = []
    for entry in history:
        if not entry.get("ok") or int(entry.get("turn") or 0) <= turn:
            continue
        caught_up = [] if is_users_turn(entry) else [*caught_up, entry]
    return caught_up


@dataclass
class _Recorded:
    """The state this process last recorded of a live session: the delta base of its next."""

    turn: int
    depth: int  # delta states since its chain's full state (0: it is full)
    memories: dict[str, tuple[Message, ...]]
    # The session's list of kept turns as this process wrote it with that state: while the live
    # session is the same object no one else has written it (another replica's turn, a deletion
    # make the registry load a new one), so the next turn's write need not read it back.
    listed: _Kept | None = None


_FIRST, _SECOND, _THIRD = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)


def _entry_text(entry: list[Any]) -> str:
    """to_json of an entry of the list of kept turns, the same text: a turn's [turn, [keys]] and a
    state's [turn, parent] written without the encoder (two a turn, ~0.03 M instructions; issue 39)."""
    if len(entry) == 2 and type(entry[0]) is int:
        turn, second = entry
        if second is None:
            return f"[{turn}, null]"
        if type(second) is int:
            return f"[{turn}, {second}]"
        if type(second) is list and all(type(key) is str for key in second):
            return f"[{turn}, [" + ", ".join(map(_TEXT_JSON, second)) + "]]"
    return to_json("an entry of the list of kept turns", entry)


@dataclass
class _Kept:
    """A session's list of kept turns, as stored ({"turns": [[turn, keys], ...], "states":
    [[turn, parent], ...]}), each entry kept as its JSON text (with its turn, and a state's
    parent): the list is written whole every turn, and encoding its ~65 entries cost ~0.3 M
    instructions of the store's thread (issue 39), so it is written from its entries' texts (the
    same text, `text()`), each encoded once. (A turn's keys are read back from its text when
    the turn is dropped: the texts alone take less memory than the entries did.)"""

    turns: list[tuple[int, str]]
    states: list[tuple[int, int | None, str]]
    # Whether the list is linear (_is_linear: the usual list, whose next turn _appended adds in
    # a few steps); known only of a list _kept_after made (False: not known).
    linear: bool = False

    @classmethod
    def read(cls, stored: dict[str, Any] | None) -> _Kept:
        stored = stored or {"turns": []}
        # Listed before states had parents: every state is full.
        states = stored.get("states", [[entry[0], None] for entry in stored["turns"]])
        return cls([(entry[0], _entry_text(entry)) for entry in stored["turns"]],
                   [(entry[0], entry[1], _entry_text(entry)) for entry in states])

    def record(self) -> dict[str, Any]:
        return {"turns": [json.loads(text) for _, text in self.turns],
                "states": [[turn, parent] for turn, parent, _ in self.states]}

    def text(self) -> str:
        """`to_json` of `record()`, byte for byte (the stores' encoder's separators)."""
        return ('{"turns": [' + ", ".join(map(_SECOND, self.turns)) + '], "states": ['
                + ", ".join(map(_THIRD, self.states)) + "]}")


class TurnIndex:
    """Committed turns by conversation prefix and by response id, kept in the store."""

    def __init__(self, registry: SessionRegistry):
        self.registry = registry
        # Weak: a session the registry lets go (evicted, reloaded after another replica's turn)
        # takes its entry with it, and its next state is written in full.
        self._recorded: weakref.WeakKeyDictionary[Session, _Recorded] = weakref.WeakKeyDictionary()
        # The server's store keeps the records (asynchronously: SQLite in its worker thread,
        # Redis shared by replicas); a store of the user's without RecordStore keeps them in
        # this process only.
        self.records = registry.store
        # A store that keeps a record's JSON text at once is given the session's own snapshot, not
        # a copy: the request holds the session until the record is written.
        self._snapshot_uncopied = getattr(registry.store, "records_as_text", False) is True
        if getattr(registry.store, "records", True) is None:
            log.warning("the store %s keeps no records: the OpenAI API's session index lives in this process only",
                        registry.store.url)

    # -- keys ------------------------------------------------------------------------------

    @staticmethod
    def prefix_key(bot: str, owner: str | None, namespace: str, exchange: Exchange) -> str:
        """The key of a conversation: the SHA-256 of the JSON text [bot, owner, namespace, exchange]."""
        return _key_after(_running_hash(bot, owner, namespace, []), False, exchange)

    @staticmethod
    def request_key(bot: str, owner: str | None, what: list[Any]) -> str:
        """The key of one request's outcome: `what` is an Idempotency-Key, or everything the
        request says about its turn (namespace, session, route, conversation, input)."""
        text = json.dumps([bot, owner or "", what], ensure_ascii=False, separators=(",", ":"))
        return "openai:request:" + hashlib.sha256(text.encode()).hexdigest()

    @staticmethod
    def response_key(response_id: str) -> str:
        return "openai:response:" + response_id

    @staticmethod
    def turns_key(session_id: str) -> str:
        return "openai:turns:" + session_id

    @staticmethod
    def state_key(session_id: str, turn: int) -> str:
        """The key of the session's state right after `turn` (one session's only: never shared)."""
        return f"openai:state:{session_id}:{turn}"

    async def response(self, response_id: str, who: Principal | None) -> dict[str, Any] | None:
        """The record of a response id, if it exists and belongs to the caller."""
        record = await self.records.get_record(self.response_key(response_id))
        if record is None or record.get("owner") != _owner(who) or not await self._alive(record):
            return None
        return record

    async def kept_response(self, response_id: str, who: Principal | None) -> dict[str, Any] | None:
        """The response object a Responses request answered (GET /v1/responses/{id}), kept with
        its id's record while the index keeps the turn (KEEP_TURNS, until the session is
        deleted), and only for the caller that made it; None otherwise, or for a response
        recorded before chatrun kept them."""
        record = await self.response(response_id, who)
        kept = None if record is None else record.get(RESPONSE)
        return kept if isinstance(kept, dict) else None

    async def _alive(self, record: dict[str, Any]) -> bool:
        # A deleted session is gone for good: its recorded turns neither continue nor fork.
        return await self.registry.store.version(record["session"]) is not None

    # -- opening the session of a request ----------------------------------------------------

    @asynccontextmanager
    async def open(self, ident: Identity, who: Principal | None, claim: Claim | None = None,
                   attempt: str | None = None) -> AsyncIterator[Opened]:
        """The request's session, locked for its turn (see the module's rules). `claim`: the
        key of the request's outcome, marked as running (so that its retries, on any replica,
        wait for its outcome) in the same store call as the look-up of its conversation.
        `attempt`: that key (also of a retry): a new session an earlier attempt of the same
        request made and left without a turn is the one this attempt runs in (remember_failed; or
        the one its key names, `_made_id`: its replica died before the commit)."""
        registry = self.registry
        if ident.explicit_id is not None:
            problem = wire.chat_id_problem(ident.explicit_id)
            if problem:
                raise wire.RequestFailed(wire.BAD_REQUEST, "the session id (the X-Chatrun-Session header, or the "
                                         f"Responses conversation) needs to be {problem}")
            wire.refuse_reserved_id(ident.explicit_id)  # before the look-up: no word of whether it exists
            if (await self._look_up(claim, None, ident.explicit_id))[1]:
                async with registry.session(ident.bot, ident.explicit_id, who, EXISTING) as session:
                    yield Opened(session, CONTINUED, caught_up=await self._unseen(session))
                return
            async with self._new(ident, who, ident.explicit_id) as opened:
                yield opened
            return
        record = ident.previous
        key = ident.prefix_key(_owner(who)) if record is None and ident.earlier else None
        found, alive = await self._look_up(claim, key, None if record is None else record["session"])
        record = record or found
        if record is not None and record.get("bot") == ident.bot and alive:
            async with registry.session(ident.bot, record["session"], who, EXISTING) as session:
                if session.turn_count == record["turn"]:
                    yield Opened(session, CONTINUED)
                    return
                # Moved on: by others' turns only (a decision, an operator), still this conversation.
                since = others_turns_since(await registry.history(session), record["turn"])
                if since is not None:
                    yield Opened(session, CONTINUED, caught_up=since)
                    return
            fork_id = await self._fork(record)
            if fork_id is not None:
                await self._left(ident, who, record["session"])
                async with registry.session(ident.bot, fork_id, who, EXISTING) as session:
                    yield Opened(session, FORKED, forked_from=record["session"])
                return
        async with self._first_turn(ident, who, attempt) as opened:
            yield opened

    @asynccontextmanager
    async def _first_turn(self, ident: Identity, who: Principal | None, attempt: str | None) -> AsyncIterator[Opened]:
        """The session of a request that continues nothing: the one an earlier attempt of it made
        and left without a turn (it failed, or its replica died), else a new one — under the id
        its attempt key makes (`_made_id`), unless that session is taken: the same first message
        sent again by its user, or at the same moment (a double submit), is a conversation of its own."""
        made, taken = _made_id(attempt), False
        for earlier in (await self._failed_attempts_session(attempt), made):
            if earlier is not None and await self.records.version(earlier) is not None:
                async with self.registry.session(ident.bot, earlier, who, EXISTING) as session:
                    if not session.turn_count:  # nothing committed: the turn an earlier attempt did not finish
                        yield Opened(session, NEW_SESSION)
                        return
                taken = taken or earlier == made
        started = await self._chat_started(ident, who)
        async with contextlib.AsyncExitStack() as stack:
            opened = None
            if made is not None and not taken:
                try:
                    opened = await stack.enter_async_context(self._new(ident, who, made, started))
                except wire.RequestFailed as exc:
                    if exc.reason != wire.SESSION_EXISTS:
                        raise
            if opened is None:
                opened = await stack.enter_async_context(self._new(ident, who, secrets.token_hex(8), started))
            yield opened

    async def _chat_started(self, ident: Identity, who: Principal | None) -> dict[str, Any] | None:
        """For a first message in a front end's chat (`Identity.in_chat`) that already made a
        session (its first answer is being regenerated, or the message edited): where that chat
        started, which the new session forks from (`_new`); else None."""
        if ident.earlier or ident.previous is not None or not ident.in_chat:
            return None
        started = await self.records.get_record(ident.start_key(_owner(who)))
        if started is None or started.get("bot") != ident.bot or not await self._alive(started):
            return None
        return started

    @staticmethod
    def failed_key(attempt: str) -> str:
        return attempt + ":failed"

    async def remember_failed(self, attempt: str, opened: Opened) -> None:
        """A failed attempt of a request that made a new session (its first turn rolled back):
        the request's next attempt runs its turn in that session again, not in another new one,
        so the calls it makes again carry the same idempotency keys (the session's id is part of
        them) and a service that dedupes by them acts once (docs/tools.md, idempotency keys)."""
        session = opened.session
        if opened.how == NEW_SESSION and not session.turn_count:
            await self.records.put_record(self.failed_key(attempt), {"session": session.id}, session.id)

    async def _failed_attempts_session(self, attempt: str | None) -> str | None:
        if attempt is None:
            return None
        record = await self.records.get_record(self.failed_key(attempt))
        session_id = record.get("session") if record is not None else None
        if not isinstance(session_id, str) or await self.records.version(session_id) is None:
            return None  # none, or deleted since
        return session_id

    @asynccontextmanager
    async def _new(self, ident: Identity, who: Principal | None, session_id: str,
                   started: dict[str, Any] | None = None) -> AsyncIterator[Opened]:
        """A session this request creates; deleted again when the request ran no turn on it (refused
        before it, as a file its route does not take): a request that did nothing leaves nothing.
        `started`: the start of the chat this first message was sent in before (`_chat_started`):
        the session forks from it, its calls keyed as that chat's (`Conversation.keyed_as`); else
        a first message in a chat records the chat's start."""
        registry = self.registry
        async with registry.session(ident.bot, session_id, who, NEW, route=ident.route,
                                    version=ident.version, locale=ident.locale) as session:
            if started is not None:
                original = await registry.store.load_session(started["session"])
                held = registry.shelf.bots[ident.bot].find(original.bot_version) \
                    if original is not None and original.bot_version else None  # its version, if held here
                session.take_up({"session": started["session"], "turn": 0, "keys": started["keys"]},
                                original.snapshot.get(DONE_CALLS_KEY) if original is not None else None,
                                of=held.bot if held is not None else None)
            elif ident.in_chat and not ident.earlier and ident.previous is None:
                await self.records.put_record(ident.start_key(_owner(who)), {
                    "bot": ident.bot, "session": session_id, "keys": session_id}, session_id)
            try:
                if started is not None:
                    yield Opened(session, FORKED, forked_from=started["session"])
                    if session.turn_count:  # the fork stays (one that ran no turn is discarded below)
                        await self._left(ident, who, started["session"])
                else:
                    yield Opened(session, NEW_SESSION, seeded=_seed(session, ident.earlier))
            finally:
                try:
                    await asyncio.shield(registry.discard_unused(session))
                except Exception as exc:  # the request's own outcome stands; the session stays
                    log.warning("session %s ran no turn and was not deleted: %s", session_id, exc)

    async def _left(self, ident: Identity, who: Principal | None, original: str) -> None:
        """The session a fork was just made from, its user gone on in the fork: its armed silence
        dropped, so that branch is not recorded `abandoned` beside the fork (docs/report.md,
        "Forks"). A failure is logged; the request goes on."""
        try:
            stored = await self.registry.store.load_session(original)
            if stored is not None and "due" in (outcome_of(stored.snapshot) or {}):  # most: nothing armed
                await self.registry.left_for_fork(ident.bot, original, who)
        except Exception as exc:  # the fork stands; that branch may be recorded abandoned later
            log.warning("session %s was forked from, but its silence stays armed: %s", original, exc)

    async def _look_up(self, claim: Claim | None, key: str | None,
                       session_id: str | None) -> tuple[dict[str, Any] | None, bool]:
        """In one call of a local store's thread: the request's claim (when `claim`), the
        record under `key` (when given), and whether the session it names (else `session_id`)
        exists: a deleted session's recorded turns neither continue nor fork."""
        work = functools.partial(_look_up, claim, key, session_id)
        in_one_call = getattr(self.records, "in_one_call", None)
        return await (in_one_call(work) if in_one_call is not None else work(self.records))

    async def _unseen(self, session: Session) -> list[dict[str, Any]]:
        """Others' turns since the session's last /v1 turn (all since the user's last turn when
        /v1 never took one), for a request naming the session by its id."""
        listed = await self.records.get_record(self.turns_key(session.id))
        last = max((entry[0] for entry in (listed or {}).get("turns", [])), default=0)
        if session.turn_count <= last:
            return []  # nothing since: no history to read
        return trailing_others_turns(await self.registry.history(session), last)

    # -- exactly once: a retried request replays the turn its first attempt committed ---------

    async def claim(self, key: str) -> Claim:
        """A new claim of the outcome's `key` for this attempt: the attempt that holds it runs, in
        this process (server/liveness.py), whose lease on a shared store is taken before the first
        claim names it (at once after). Its `id` tells it from another attempt's claim."""
        liveness = self.registry.liveness
        await liveness.start()
        return Claim(key, {"running": True, "at": time.time(), "by": liveness.incarnation,
                           "id": secrets.token_hex(8)})

    async def claim_or_outcome(self, claim: Claim) -> dict[str, Any] | None:
        """For a request that may have run already (an Idempotency-Key, a retry): its committed
        outcome to replay, or None when this attempt holds `claim` and runs the turn. The claim
        is one atomic put-if-absent, so of two first attempts at the same instant (on any
        replicas) one runs and the other waits for its outcome. A claim whose attempt's process
        is dead (`_abandoned`) is taken over at once, by one compare-and-swap: of two retries
        taking over the same one, one runs and the other waits for its outcome. One still running
        after REPLAY_WAIT is a Conflict (send the request again later: the SDKs do), never run twice."""
        key = claim.key
        deadline = time.monotonic() + REPLAY_WAIT
        while True:
            recorded = await self._outcome(key, deadline)
            if recorded is not None:
                return recorded
            if await self.records.claim_record(key, claim.record) or await self._take_over(claim):
                return None
            if time.monotonic() > deadline:
                raise wire.RequestFailed(wire.CONFLICT, f"an earlier attempt of this request is still running "
                                         f"(waited {REPLAY_WAIT:g} s for it); send the request again later")

    async def _abandoned(self, claim: dict[str, Any]) -> bool:
        """Whether a running claim's attempt is dead: its process is (server/liveness.py); for a
        claim that names no process (an older chatrun's), when it is older than REPLAY_WAIT."""
        alive = await self.registry.liveness.alive(claim)
        if alive is None:
            return time.time() - float(claim.get("at", 0)) > REPLAY_WAIT
        return not alive

    async def _take_over(self, claim: Claim) -> bool:
        """Replace an abandoned claim by `claim`, only if it is still the very claim judged dead
        (RecordSwaps.swap_record): True when this attempt now holds the key."""
        record = await self.records.get_record(claim.key)
        if record is None or not record.get("running") or not await self._abandoned(record):
            return False
        return await self.records.swap_record(claim.key, record, claim.record)

    async def release(self, claim: Claim) -> None:
        """The attempt committed nothing (it failed, or was refused): a retry runs afresh. Only
        the attempt's own claim is dropped, never the claim of one that took over since."""
        await self.records.swap_record(claim.key, claim.record, None)

    async def _outcome(self, key: str, deadline: float) -> dict[str, Any] | None:
        """The committed outcome of an earlier attempt of this request, waiting while one runs
        (until `deadline`, monotonic); None when there is none (never tried, failed, or abandoned:
        its process died). Whether the running one is alive is looked at every LIVENESS_LOOK."""
        look = 0.0
        while True:
            record = await self.records.get_record(key)
            if record is None or not record.get("running"):
                return record
            now = time.monotonic()
            if now > deadline:
                return None
            if now >= look:
                if await self._abandoned(record):
                    return None
                look = now + LIVENESS_LOOK
            await asyncio.sleep(REPLAY_POLL)

    # -- after a committed turn ---------------------------------------------------------------

    async def remember(self, session: Session, who: Principal | None, keys: list[str],
                       outcome: tuple[str, dict[str, Any]] | None = None, snapshot_json: str | None = None,
                       more: Kept | None = None) -> None:
        """Record the session as it is now (right after a committed turn) under `keys`, and the
        request's `outcome` (its key, what it answered), in one call of a local store's
        thread (LocalAsyncStore.in_one_call), else one call a record. `snapshot_json`: the
        session's snapshot as the turn's commit encoded it (TurnRun.committed_snapshot), put in
        the state's record as it is instead of encoding the snapshot again. `more`: what some
        keys' records keep besides (a response id's: the response object, `kept_response`)."""
        turn = session.turn_count
        memories = {mid: tuple(messages) for mid, messages in session.memories().items()}
        last = self._recorded.get(session)
        state, recorded = self._state_after(session, turn, memories, snapshot_json)
        record = {"bot": session.bot.name, "owner": _owner(who), "session": session.id, "turn": turn,
                  "state": self.state_key(session.id, turn), "at": time.time()}
        listed = last.listed if last is not None and last.turn < turn else None
        work = functools.partial(_remember, session.id, turn, state, record, keys, outcome, listed,
                                 snapshot_json=snapshot_json, more=more)
        in_one_call = getattr(self.records, "in_one_call", None)
        recorded.listed = await (in_one_call(work) if in_one_call is not None else work(self.records))
        self._recorded[session] = recorded  # written: the next state may be a delta of this one

    async def remember_stopped(self, session: Session, who: Principal | None, turn: int, keys: Kept) -> None:
        """A stopped turn's `keys` (a closed Responses stream's id, with what its record keeps
        besides: the response object) name the session at `turn`, where the turn began: rolled
        back, it committed nothing, so continuing it (previous_response_id) goes on from there, as
        if the stopped message had not been sent (docs/openai-api.md, Stop). Deleted with the
        session; not among its kept turns."""
        record = {"bot": session.bot.name, "owner": _owner(who), "session": session.id, "turn": turn,
                  "state": self.state_key(session.id, turn), "at": time.time(), "stopped": True}
        for key, besides in keys.items():
            await self.records.put_record(key, record | besides, session.id)

    def _state_after(self, session: Session, turn: int, memories: dict[str, tuple[Message, ...]],
                     snapshot_json: str | None = None) -> tuple[dict[str, Any], _Recorded]:
        """The state record of the session right after `turn`: a delta of the state recorded
        last for this live session (`parent`: its turn), or in full (see the module's text). Its
        memories are their changes (`Change`), made JSON by _state_text or _state_record. Its
        snapshot is None when a store that keeps records as text is given `snapshot_json` (the
        commit's text of it, which _state_text writes): the snapshot's dicts were made for
        nothing there (~0.025 M instructions a turn; issue 39)."""
        last = self._recorded.get(session)
        if not self._snapshot_uncopied:
            snapshot: dict[str, Any] | None = session.snapshot()
        else:
            snapshot = session.snapshot_to_encode() if snapshot_json is None else None
        if last is None or last.turn >= turn or last.depth >= CHAIN:
            full: dict[str, Change] = {mid: (None, messages) for mid, messages in memories.items()}
            return {"snapshot": snapshot, "memories": full}, _Recorded(turn, 0, memories)
        deltas = {mid: _memory_change(last.memories.get(mid), messages) for mid, messages in memories.items()}
        return {"snapshot": snapshot, "parent": last.turn, "memories": deltas}, _Recorded(turn, last.depth + 1, memories)

    async def state_at(self, session_id: str, key: str) -> dict[str, Any] | None:
        """A recorded state in full ({"snapshot", "memories"}), its deltas applied to the full
        state their chain starts from; None when a state of the chain is gone."""
        chain: list[dict[str, Any]] = []
        state = await self.records.get_record(key)
        while state is not None and "parent" in state:
            chain.append(state)
            state = await self.records.get_record(self.state_key(session_id, int(state["parent"])))
        if state is None:
            return None
        memories: dict[str, list[Any]] = state["memories"]
        for delta in reversed(chain):
            memories = {mid: kept if isinstance(kept, list) else memories[mid][kept["drop"]:] + kept["add"]
                        for mid, kept in delta["memories"].items()}
        return {"snapshot": (chain[0] if chain else state)["snapshot"], "memories": memories}

    async def _fork(self, record: dict[str, Any]) -> str | None:
        """A new session in the store: the recorded one as it was right after the recorded turn
        (None when that state is gone). It is its owner's session, so --max-sessions-per-principal
        counts it as it counts a create: checked and counted by the store with its write
        (TooManyRequests at the limit, however many replicas fork at once)."""
        # A record written before the state had a record of its own holds it inline.
        state = record if "snapshot" in record else await self.state_at(record["session"], record["state"])
        if state is None:
            return None
        old, new = record["session"], secrets.token_hex(8)
        memories: dict[str, list[Message]] = {
            renamed_id(mid, old, new): [message_from_dict(d) for d in messages]
            for mid, messages in state["memories"].items()
        }
        for item in state["snapshot"].get(PENDING_ITEMS_KEY) or ():  # not forked: the model reads so
            not_decided_here(memories, item)
        snapshot = forked_snapshot(state["snapshot"], old, new, record["turn"])
        now = await self.registry.store.load_session(old)  # what its original did since: done, in the fork too
        if now is not None and now.snapshot.get(DONE_CALLS_KEY):
            snapshot[DONE_CALLS_KEY] = once.carried(snapshot.get(DONE_CALLS_KEY), now.snapshot[DONE_CALLS_KEY])
        # A new session (versions.CREATE: refused if the id exists), written like any commit; the
        # store checks and counts it against its owner's limit in the same step (Commit.quota).
        written: dict[str, list[Message] | None] = dict(memories)
        commit = Commit.encode(new, snapshot, written, [], expected=CREATE)
        commit.quota = self.registry.opener.max_sessions_per_principal
        try:
            await self.registry.store.commit_turn(commit, None)
        except SessionQuota as exc:
            raise quota_refused(exc) from None
        return new


def _made_id(attempt: str | None) -> str | None:
    """The id of the new session a request with an `attempt` key makes: made from the key, so
    that a retry after an attempt whose replica died before its commit (the session made, no turn
    committed) runs in that session, and its calls carry the same idempotency keys (docs/tools.md)."""
    return None if attempt is None else hashlib.blake2b(attempt.encode(), digest_size=8).hexdigest()


async def _look_up(claim: Claim | None, key: str | None, session_id: str | None,
                   records: RecordOps) -> tuple[dict[str, Any] | None, bool]:
    """TurnIndex._look_up's reads (and the claim). Awaits nothing but `records` (in_one_call)."""
    if claim is not None:
        if not await _put_text(records, claim.key, _flat_text(claim.record), None):
            await records.put_record(claim.key, claim.record)
    record = None if key is None else await records.get_record(key)
    if record is not None:
        session_id = record.get("session")
    return record, session_id is not None and await records.version(session_id) is not None


async def _remember(session_id: str, turn: int, state: dict[str, Any], record: dict[str, Any], keys: list[str],
                    outcome: tuple[str, dict[str, Any]] | None, listed: _Kept | None,
                    records: RecordOps, *, snapshot_json: str | None = None, more: Kept | None = None) -> _Kept:
    """TurnIndex.remember's writes: the state (with its snapshot's JSON text when known), the
    keys (each with what `more` says its record keeps besides), the request's outcome, and the
    session's last KEEP_TURNS turns kept (see KEEP_TURNS)
    with the states their chains start from (each state's parent, listed under "states"); that
    list is `listed` when the caller knows it, else read. Returns the list written. Awaits
    nothing but `records` (in_one_call)."""
    if not await _put_text(records, record["state"], _state_text(state, snapshot_json), session_id):
        await records.put_record(record["state"], _state_record(state, snapshot_json), session_id)
    if outcome is not None:  # what a committed attempt answered, for its retries (deleted with the session)
        await records.put_record(outcome[0], outcome[1], session_id)
    text = _flat_text(record) if keys else ""
    for key in keys:
        if more and key in more:
            await records.put_record(key, record | more[key], session_id)
        elif not await _put_text(records, key, text, session_id):
            await records.put_record(key, record, session_id)
    kept = listed if listed is not None else _Kept.read(await records.get_record(TurnIndex.turns_key(session_id)))
    written, dropped, unneeded = _kept_after(kept, turn, keys, state.get("parent"))
    for text in dropped:
        for key in json.loads(text)[1]:
            old = await records.get_record(key)
            if old is not None and old.get("session") == session_id:  # not since saved for another
                await records.delete_record(key)
    for old_turn in unneeded:
        await records.delete_record(TurnIndex.state_key(session_id, old_turn))
    await _put_kept(records, TurnIndex.turns_key(session_id), written, session_id)
    return written


def _kept_after(kept: _Kept, turn: int, keys: list[str], parent: int | None) -> tuple[_Kept, list[str], list[int]]:
    """The list of kept turns once `turn` (its `keys`, its state's `parent`) is added: (the list,
    the entry texts of the turns it dropped, the turns whose states no kept turn's chain needs)."""
    if kept.linear and turn > kept.turns[-1][0] and turn > kept.states[-1][0] \
            and (parent is None or parent == kept.states[-1][0]):
        return _appended(kept, turn, keys, parent)
    return _kept_rebuilt(kept, turn, keys, parent)


def _kept_rebuilt(kept: _Kept, turn: int, keys: list[str], parent: int | None) -> tuple[_Kept, list[str], list[int]]:
    """_kept_after's answer for any list: every kept turn's chain looked at. In C-level passes
    where it can (the list is ~65 entries; issue 39)."""
    turns = [*_without(kept.turns, turn), (turn, _entry_text([turn, keys]))]
    states = [*_without(kept.states, turn), (turn, parent, _entry_text([turn, parent]))]
    live = turns[-KEEP_TURNS:]
    needed = _chains_of(list(map(_FIRST, live)), dict(zip(map(_FIRST, states), map(_SECOND, states), strict=True)))
    unneeded = sorted(set(map(_FIRST, states)).difference(needed))
    if unneeded:
        states = [entry for entry in states if entry[0] in needed]
    return _Kept(live, states, _is_linear(live, states)), list(map(_SECOND, turns[:-KEEP_TURNS])), unneeded


def _is_linear(turns: list[tuple[int, str]], states: list[tuple[int, int | None, str]]) -> bool:
    """Whether a list _kept_rebuilt made (its states all needed by its turns' chains) is the
    usual one: the turns and the states in ascending order, every turn's state kept, the first
    state full and each other full or a delta of the one before it. Then each turn's chain is
    the states from the last full one up to it."""
    numbers, parents, listed = list(map(_FIRST, states)), list(map(_SECOND, states)), list(map(_FIRST, turns))
    return (bool(states) and bool(turns) and parents[0] is None
            and all(map(operator.lt, numbers, numbers[1:])) and all(map(operator.lt, listed, listed[1:]))
            and all(up is None or (type(up) is int and up == before) for up, before in zip(parents[1:], numbers[:-1], strict=True))
            and set(listed) <= set(numbers))


def _appended(kept: _Kept, turn: int, keys: list[str], parent: int | None) -> tuple[_Kept, list[str], list[int]]:
    """_kept_rebuilt's answer for a linear list (_is_linear) and a turn after all of it whose
    state is full or a delta of its last: the turn added at the end, the turns past KEEP_TURNS
    dropped from the front, and with them the states before the chain of the oldest turn kept
    (the others are its chain's, or a later turn's or its chain's, as before). The list stays
    linear. A few steps whatever the list's length, where looking at every chain cost ~0.15 M
    instructions a late turn (issue 39); tests/test_openai_states.py compares the two."""
    turn_text, state_text = _entry_text([turn, keys]), _entry_text([turn, parent])
    turns, states = [*kept.turns, (turn, turn_text)], [*kept.states, (turn, parent, state_text)]
    live, dropped = turns[-KEEP_TURNS:], turns[:-KEEP_TURNS]
    oldest, start = live[0][0], 0
    for at, (number, up, _) in enumerate(states):  # up to the oldest turn kept: its chain's full state
        if number > oldest:
            break
        if up is None:
            start = at
    gone = states[:start]
    return _Kept(live, states[start:], True), list(map(_SECOND, dropped)), list(map(_FIRST, gone))


def _without(entries: list[Any], turn: int) -> list[Any]:
    """`entries` without `turn`'s (a turn recorded again replaces its entry); the list itself when it has none."""
    return [entry for entry in entries if entry[0] != turn] if turn in map(_FIRST, entries) else entries


async def _put_kept(records: RecordOps, key: str, kept: _Kept, session_id: str) -> None:
    """The list written from its entries' texts when the store takes a record's text, else as a record."""
    if not await _put_text(records, key, kept.text(), session_id):
        await records.put_record(key, kept.record(), session_id)


async def _put_text(records: RecordOps, key: str, text: str, session_id: str | None) -> bool:
    """put_record of a record given as its JSON text, when the store takes one (else False: put_record)."""
    put_text = getattr(records, "put_record_text", None)
    return put_text is not None and bool(await put_text(key, text, session_id))


def _flat_text(record: dict[str, Any]) -> str:
    """to_json of a record of strings, integers, finite floats, booleans and nulls (a turn's key's
    record, a claim), the same text, written member by member (the encoder's setup and walk were
    most of the ~0.04 M instructions these two cost a turn; issue 39); any other, to_json's."""
    members = []
    for name, value in record.items():
        kind = type(value)
        if kind is str:
            text = _TEXT_JSON(value)
        elif value is None or kind is bool:
            text = "null" if value is None else "true" if value else "false"
        elif kind is int or (kind is float and math.isfinite(value)):
            text = repr(value)
        else:
            return to_json("a record of the index", record)
        members.append(_TEXT_JSON(name) + ": " + text)
    return "{" + ", ".join(members) + "}"


def _state_text(state: dict[str, Any], snapshot_json: str | None) -> str:
    """to_json(_state_record(state)), the same text, with `snapshot_json` as its snapshot's text
    (None: encoded here) and its memories' messages written as a commit writes them
    (record.encode_messages: a full state's window through the encoder cost ~0.07 M instructions
    a turn; issue 39). A state's members are "snapshot", a delta's "parent", "memories", in that
    order (_state_after)."""
    if snapshot_json is None:
        snapshot_json = to_json("the snapshot of a state of the session", state["snapshot"])
    parent = f', "parent": {int(state["parent"])}' if "parent" in state else ""
    memories = ", ".join([_TEXT_JSON(mid) + ": " + _change_text(change) for mid, change in state["memories"].items()])
    return '{"snapshot": ' + snapshot_json + parent + ', "memories": {' + memories + "}}"


def _state_record(state: dict[str, Any], snapshot_json: str | None = None) -> dict[str, Any]:
    """The state's record as stored: its memories' changes as JSON values, and its snapshot
    decoded from `snapshot_json` when _state_after left it to that text (a store that keeps
    records as text but takes none given as text)."""
    snapshot = state["snapshot"]
    if snapshot is None and snapshot_json is not None:
        snapshot = from_json(snapshot_json)
    return state | {"snapshot": snapshot,
                    "memories": {mid: _change_record(change) for mid, change in state["memories"].items()}}


def _chains_of(turns: list[int], parents: dict[int, int | None]) -> set[int]:
    """The states that `turns`' states need: theirs and their parents' back to a full one. A
    state's parent is an earlier turn (_state_after), so the states are looked at latest first,
    once each: a needed one makes its parent needed before the parent is looked at."""
    needed = set(turns)
    for turn in sorted(parents, reverse=True):
        up = parents[turn]
        if up is not None and turn in needed:
            if up >= turn:  # not a list this module wrote: each chain walked
                return _walked_chains(turns, parents)
            needed.add(up)
    return needed


def _walked_chains(turns: list[int], parents: dict[int, int | None]) -> set[int]:
    """_chains_of of any parents: each turn's chain walked back to a full state (or a loop's start)."""
    needed: set[int] = set()
    for turn in turns:
        at: int | None = turn
        while at is not None and at not in needed:
            needed.add(at)
            at = parents.get(at)
    return needed


# A memory in a state: (None, its messages) in full, or (n, messages) for the state before's
# without its first n messages, followed by these (_memory_change).
Change = tuple[int | None, tuple[Message, ...]]


def _memory_delta(before: tuple[Message, ...] | None, now: tuple[Message, ...]) -> Any:
    """A memory as it is `now`, after `before`, as stored: {"drop": n, "add": [...]} when it is
    `before` without its first n messages followed by new ones (a window that grew or slid),
    else its messages in full (a new memory, or one whose earlier messages were rewritten: a summary)."""
    return _change_record(_memory_change(before, now))


def _memory_change(before: tuple[Message, ...] | None, now: tuple[Message, ...]) -> Change:
    """_memory_delta's change, its messages not yet made JSON."""
    if before is None:
        return None, now
    kept = drop = 0
    if before:  # where before's last message is now: messages are immutable, found by identity
        last = before[-1]
        kept = next((i + 1 for i in range(len(now) - 1, -1, -1) if now[i] is last), 0)
        drop = len(before) - kept
        if not kept or drop < 0 or not all(map(operator.is_, now[:kept], before[drop:])):
            return None, now
    return drop, now[kept:]


def _change_record(change: Change) -> Any:
    drop, messages = change
    listed = [m.to_dict() for m in messages]
    return listed if drop is None else {"drop": drop, "add": listed}


def _change_text(change: Change) -> str:
    """to_json(_change_record(change)), the same text (encode_messages: the commit's writing)."""
    drop, messages = change
    listed = encode_messages(list(messages))
    return listed if drop is None else f'{{"drop": {drop}, "add": {listed}}}'


def _running_hash(bot: str, owner: str | None, namespace: str, exchange: Sequence[tuple[str, str]]) -> Any:
    """A SHA-256 of the prefix key's JSON text without its closing "]]", so a longer
    conversation's key extends it instead of hashing the whole conversation again."""
    text = _JSON([bot, owner or "", namespace])[:-1] + ",[" + _pairs_json(exchange)  # _JSON([..., exchange])[:-2]
    return hashlib.sha256(text.encode())


def extended(running: Any, nonempty: bool, more: Sequence[tuple[str, str]]) -> Any:
    """A copy of `running` (the running hash of a conversation, `nonempty` if it has pairs) with
    the pairs `more` hashed after them: the one way a key's hash grows."""
    hashed = running.copy()
    if more:
        hashed.update(("," if nonempty else "").encode() + _pairs_json(more).encode())
    return hashed


def _key_after(running: Any, nonempty: bool, more: Sequence[tuple[str, str]]) -> str:
    """The prefix key of the conversation `running` hashed followed by `more`."""
    hashed = extended(running, nonempty, more)
    hashed.update(b"]]")
    digest: str = hashed.hexdigest()
    return "openai:prefix:" + digest


def _JSON(value: Any) -> str:  # noqa: N802 - the one spelling of the key's JSON text
    """json.dumps(value, ensure_ascii=False, separators=(",", ":")), the same text, its encoder made
    once (json.dumps given options builds one every call: every request's key; issue 39). What it
    encodes is read from a JSON body or made here: no circular reference to look for."""
    return _KEY_JSON(value)


_KEY_JSON = wire.encoder_made_once(json.JSONEncoder(ensure_ascii=False, separators=(",", ":")))


_TEXT_JSON = json.encoder.encode_basestring  # a str as _JSON writes it (not ASCII-only): the encoder's own function
_PAIR_OPENERS = {"user": '["user",', "assistant": '["assistant",'}  # what _JSON writes before a pair's text
_ROLE, _TEXT = operator.itemgetter(0), operator.itemgetter(1)


def _pairs_json(pairs: Sequence[tuple[str, str]]) -> str:
    """`_JSON(list(pairs))[1:-1]`, the same text, in C-level passes over the pairs: every request
    hashes the conversation it resends, and the encoder's walk of its pairs cost ~0.25 M
    instructions at 40 turns (issue 39). A pair of another role than the user's or the
    assistant's (none is: conversation_of) takes the encoder."""
    try:
        openers = list(map(_PAIR_OPENERS.__getitem__, map(_ROLE, pairs)))
        texts = list(map(_TEXT_JSON, map(_TEXT, pairs)))
    except (KeyError, TypeError, IndexError):
        return _JSON(list(pairs))[1:-1]
    return "],".join(map(operator.add, openers, texts)) + "]" if texts else ""


def _seed(session: Session, earlier: Sequence[tuple[str, str]]) -> int:
    """Put a new session's earlier conversation into its current route's memory."""
    if not earlier:
        return 0
    return session.seed_memory([UserMessage(text) if role == "user" else AssistantMessage(text) for role, text in earlier])


def _owner(who: Principal | None) -> str | None:
    return who.name if who is not None else None
