"""A live conversation moved to another version of its bot (docs/versions.md).

Which version a session runs is the client's choice (the server's version policy,
chatrun.server.versions; `--reload`); how it arrives is the new version's `on_change:`:

    migrate         the new version's `migrations:` (chatrun.engine.migrate) rewrite its
                    snapshot and memories, then any scope still on a route the new version
                    lacks restarts as below
    restart_scope   a scope on a route the new version lacks ends (with the scopes above it);
                    the conversation goes on in a new scope on the default route
    <route>         the same, on that route
    pin             when a client moves a pinned session all the same (the REPL's --reload,
                    an old version no replica and no store has), as restart_scope

A session stored before versions were recorded (no `bot_version` in its snapshot, chatrun
0.2 and older) is taken to be of the oldest version that could have produced it
(`produced_by`: the server picks it among the versions it holds). When the bot it is opened
with could not have, its version is unknown: under `migrate` the migrations apply from the
first one the session shows signs of (chatrun.engine.migrate.shown_chain), and on every
move the new version's undeclared state gets its defaults.

Whatever the policy, the conversation can run its next turn afterwards: no turn fails
because the bot changed. Each move says what it did (`notes`), for the history.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chatrun.definition.versions import MIGRATE, POLICIES
from chatrun.engine import once
from chatrun.engine.pending import QUESTION, TAKEOVER, WITHDRAWN
from chatrun.messages import SummaryMessage
from chatrun.store.record import MEMORY_SEPARATOR

if TYPE_CHECKING:
    from chatrun.definition.config import BotConfig
    from chatrun.engine.conversation import Conversation
    from chatrun.engine.pending import PendingItem
    from chatrun.messages import Message

log = logging.getLogger("chatrun.versions")


@dataclass
class Moved:
    """What a move did: from which content version to which, and one note per change."""

    old: str | None
    new: str
    notes: list[str] = field(default_factory=list)
    lost: str | None = None  # the recorded version no one had (then `old` is it, and not known)

    @property
    def known(self) -> bool:
        """Whether the move started from a bot it was given (else from an unknown or lost version)."""
        return self.old is not None and self.lost is None

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.old, "to": self.new, "notes": self.notes}


def produced_by(config: BotConfig, snapshot: dict[str, Any]) -> bool:
    """Whether a session stored without a version could be one of `config`'s: its scopes are on
    routes the bot defines, and its state holds every key the bot's `state:` declares (a session
    starts with all of them, and nothing removes a key but a migration)."""
    routes = {scope.get("route") for scope in snapshot.get("scopes") or []}
    state = snapshot.get("state") or {}
    return routes <= set(config.routes) and set(config.state) <= set(state)


def move(conversation: Conversation, old: BotConfig | None, new: BotConfig, lost: str | None = None) -> Moved:
    """Move `conversation` (restored under `old`; None: not known, as for a session stored
    before versions were recorded that `new` did not produce, or `lost`: the recorded version
    of a session no replica and no store has a copy of) onto `new`, by `new.on_change`.
    Changes the conversation in place; nothing is stored until its next turn commits."""
    moved = Moved(old.content_version if old is not None else lost, new.content_version, lost=lost)
    conversation.moved_by = ()  # set by the migrations, if any apply
    if old is not None:  # the last release's untagged calls done once: spelled by `old` or before it
        conversation.done_calls = once.dated(conversation.done_calls, old.version)
    if new.on_change == MIGRATE:
        _migrate(conversation, old, new, moved)
    conversation.config = new
    for path in _fill_defaults(conversation.state, new.state, "state"):
        moved.notes.append(f"{path} added with the new version's default")
    gone = conversation.gone_routes()
    if gone:
        target = new.on_change if new.on_change not in POLICIES else new.default_route
        note = (f"The bot was updated and the route {gone[0]!r} this conversation was on no longer exists; "
                f"the conversation continues on {target!r}.")
        conversation.restart_gone(target, note)
        moved.notes.append(f"route {gone[0]!r} is gone: restarted on {target!r}")
    elif lost is not None:  # the model is told, as for a lost route: the bot it spoke as changed
        shown = f"{new.version} ({new.content_version})" if new.version else new.content_version
        conversation.memory_for(conversation.scope, conversation.scope.route).add(SummaryMessage(
            f"The bot was updated and the version {lost} this conversation ran on is no longer available; "
            f"the conversation continues on version {shown}."))
        moved.notes.append(f"version {lost} is no longer available: moved by on_change {new.on_change!r}")
    _withdraw_stranded(conversation, moved)
    return moved


def _withdraw_stranded(conversation: Conversation, moved: Moved) -> None:
    """Open items the move stranded — their scope ended, their route or tool is gone (a migration
    renames them with the bot's), a question's tool no longer asks — are withdrawn:
    a decision could not run them (it failed with an internal KeyError at every try and the item
    waited forever); now it is told NotPending (409) with the outcome `withdrawn`. A takeover is
    the session's, not a scope's: it stays."""
    scopes = {s.id for s in conversation.scopes}
    stranded = {i.id: why for i in conversation.pending if (why := _stranded(i, scopes, conversation.config))}
    if not stranded:
        return
    pending = conversation.pending
    conversation.pending = tuple(i for i in pending if i.id not in stranded)
    conversation.resolved = {**conversation.resolved, **dict.fromkeys(stranded, WITHDRAWN)}
    moved.notes.extend(f"{i.kind} {i.id} ({i.tool or i.route}) withdrawn: {stranded[i.id]}"
                       for i in pending if i.id in stranded)


def _stranded(item: PendingItem, scopes: set[str], config: BotConfig) -> str | None:
    """Why the new version cannot resolve an open item (None: it can)."""
    if item.kind == TAKEOVER:
        return None
    if item.scope_id not in scopes:
        return "its scope ended"
    if item.route not in config.routes:
        return "its route is gone"
    tool = config.tools.get(item.tool) if item.tool is not None else None
    if item.tool is not None and tool is None:
        return "its tool is gone"
    if tool is not None and item.kind == QUESTION and tool.action.ask is None:
        return "its tool no longer asks"  # an answer would have nowhere to go
    return None


def _fill_defaults(state: dict[str, Any], declared: dict[str, Any], at: str) -> list[str]:
    """The keys the new version's `state:` declares that the session lacks, set to their
    defaults (a template reading them must not fail); what is there is kept. The paths set."""
    added = []
    for key, default in declared.items():
        if key not in state:
            state[key] = copy.deepcopy(default)
            added.append(f"{at}.{key}")
        elif isinstance(default, dict) and isinstance(state[key], dict):
            added.extend(_fill_defaults(state[key], default, f"{at}.{key}"))
    return added


def _migrate(conversation: Conversation, old: BotConfig | None, new: BotConfig, moved: Moved) -> None:
    """The new version's migrations applied to the conversation (its config is still `old`'s,
    or, for an unknown `old`, already `new`'s)."""
    from chatrun.engine.migrate import migrate_snapshot

    memories = conversation.live_memories()
    result = migrate_snapshot(conversation.snapshot(), old, new, memories)
    conversation.config = new
    moved_by = tuple(new.migrations[i] for i in result.applied)
    conversation.restore(result.snapshot)
    conversation.forget_cached_memories()
    for memory_id, messages in result.memories.items():
        _set_memory(conversation, memory_id, messages)
    conversation.moved_by = moved_by  # after restore: the turn that commits the move keys its calls by it
    moved.notes.extend(result.notes)


def _set_memory(conversation: Conversation, memory_id: str, messages: list[Message]) -> None:
    scope_id, _, route = memory_id.rpartition(MEMORY_SEPARATOR)
    scope = next((s for s in conversation.scopes if s.id == scope_id), None)
    if scope is None or route not in conversation.config.routes:
        return  # a scope or route the migration left behind: the restart below ends it
    conversation.memory_for(scope, route).set(messages)
