"""Declarative migrations: a stored session of an older version of a bot, moved to a newer one.

A bot's `migrations:` (docs/format.md, "Migrations") says what changed: routes renamed or
mapped, state paths renamed, dropped or given defaults, scopes on removed routes reset or
dropped, tool names mapped in memories. `migrate_snapshot` applies the ones whose `from:`
names the old version to a snapshot (as `Conversation.snapshot()` made it) and the
session's memories, and says what it did. It is pure: nothing is read or written but its
arguments, which it does not change; the caller (the server's version policy) stores the
result and deletes the memories it no longer lists.

The snapshot's scopes are read through `Scope` (engine/scopes.py) and its memory ids
spelled by store/record.py, as the conversation does; the keys `state`, `scopes` and `bot`
are the ones `Conversation.restore` reads.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chatrun.definition.config import BotConfig, KeyChanges, MigrationConfig
from chatrun.definition.migrations import applying, split_state_path
from chatrun.engine import once
from chatrun.engine.conversation import DONE_CALLS_KEY
from chatrun.engine.pending import PENDING_KEY
from chatrun.engine.scopes import Scope, init_declared
from chatrun.messages import AssistantMessage, Message, ToolCall, ToolResultMessage


@dataclass
class MigrationResult:
    """A migrated session: its snapshot, every live memory (by memory id; an input id missing
    here was dropped or renamed, so the store should delete it), and one note per change."""

    snapshot: dict[str, Any]
    memories: dict[str, list[Message]]
    notes: list[str] = field(default_factory=list)
    # Routes the session's scopes are still on that the new bot lacks and no migration
    # resolves: the caller's policy (restart_scope, a route) decides what happens to them.
    unmapped_routes: list[str] = field(default_factory=list)
    applied: list[int] = field(default_factory=list)  # indexes of new.migrations that applied


shown = once.shown_path  # a migration's state path with its root spelled out (`email` -> `state.email`)


def migrate_snapshot(snapshot: dict[str, Any], old: BotConfig | None, new: BotConfig,
                     memories: dict[str, list[Message]]) -> MigrationResult:
    """The session `snapshot` of bot `old`, with its `memories`, as a session of `new`. `old`
    None: a session whose version is not known (stored before versions were recorded), which
    goes through the migrations from the first one it shows signs of (`shown_chain`)."""
    chain = applying(new.migrations, old.version) if old is not None else shown_chain(new.migrations, snapshot,
                                                                                      memories)
    run = _Migration(copy.deepcopy(snapshot), {mid: list(ms) for mid, ms in memories.items()}, new)
    for migration in chain:
        run.apply(migration)
        run.result.applied.append(migration.index)
    run.finish()
    return run.result


def shown_chain(migrations: list[MigrationConfig], snapshot: dict[str, Any],
                memories: dict[str, list[Message]]) -> list[MigrationConfig]:
    """The migrations a session of an unknown version goes through: from the first one that is
    `from: "*"` or whose old side the session holds (a state key or scope field it renames or
    drops, a scope on a route it maps, resets or drops, a call of a tool it maps), on."""
    held = footprint(snapshot, memories)
    for i, m in enumerate(migrations):
        if m.from_version == "*" or _shows(m, held):
            return migrations[i:]
    return []


def _shows(m: MigrationConfig, held: Footprint) -> bool:
    if held.routes & {*m.routes, *m.scopes} or held.tools & set(m.tools):
        return True
    for path in [*m.state.rename, *m.state.drop]:
        root, keys = split_state_path(path)
        if keys[0] in (held.state if root == "state" else held.scope):
            return True
    return False


class _Migration:
    def __init__(self, snapshot: dict[str, Any], memories: dict[str, list[Message]], new: BotConfig):
        self.new = new
        self.scopes = [Scope.from_dict(d) for d in snapshot.get("scopes", [])]
        self.state: dict[str, Any] = snapshot.setdefault("state", {})
        self.result = MigrationResult(snapshot, memories)
        self.renamed_calls = False  # a migration renames tools, arguments or state paths (a call's identity)

    def note(self, text: str) -> None:
        self.result.notes.append(text)

    def apply(self, m: MigrationConfig) -> None:
        where = f"migration {m.index + 1} ({m.where})"
        for old_route, new_route in m.routes.items():
            self.rename_route(old_route, new_route, where)
        for route, what in m.scopes.items():
            self.end_scopes(route, what, where)
        for old_tool, new_tool in m.tools.items():
            self.rename_tool(old_tool, new_tool, where)
        for tool, changes in m.arguments.items():
            self.change_arguments(tool, changes, where)
        for source, target in m.state.rename.items():
            self.rename_path(source, target, where)
        for path in m.state.drop:
            self.drop_path(path, where)
        for path, value in m.state.default.items():
            self.default_path(path, value, where)
        self.renamed_calls = self.renamed_calls or bool(m.tools or m.arguments or m.state.rename)

    # -- routes and scopes -------------------------------------------------------------------

    def rename_route(self, old: str, new: str, where: str) -> None:
        self.rename_in_items("route", old, new)  # an open item's call was made on it: decided there
        for scope in self.scopes:
            if scope.route == old:
                scope.route = new
                self.note(f"{where}: scope {scope.id} moved from route `{old}` to `{new}`")
            if old in scope.memory_routes:
                old_id, new_id = scope.memory_id(old), scope.memory_id(new)
                scope.memory_routes = [new if r == old else r for r in scope.memory_routes]
                messages = self.result.memories.pop(old_id, None)
                if messages is not None and new_id not in self.result.memories:
                    self.result.memories[new_id] = messages
                self.note(f"{where}: memory {old_id} is now {new_id}")

    def end_scopes(self, route: str, what: str, where: str) -> None:
        for scope in list(self.scopes):
            if scope.route != route:
                continue
            if what == "drop" and scope is not self.scopes[0]:
                self.drop_scope(scope)
                self.note(f"{where}: scope {scope.id} on removed route `{route}` dropped")
            else:
                self.reset_scope(scope)
                self.note(f"{where}: scope {scope.id} on removed route `{route}` reset to `{scope.route}`")

    def drop_scope(self, scope: Scope) -> None:
        index = self.scopes.index(scope)
        self.forget_memories(scope)
        self.scopes.remove(scope)
        if scope.caller and index > 0:
            self.answer_call(self.scopes[index - 1], scope.caller, scope.route)

    def reset_scope(self, scope: Scope) -> None:
        self.forget_memories(scope)
        gone = scope.route
        if scope.caller and scope is not self.scopes[0]:
            self.answer_call(self.scopes[self.scopes.index(scope) - 1], scope.caller, gone)
            scope.caller = None
        scope.route = self.new.default_route
        scope.local, scope.shared = {}, {}

    def forget_memories(self, scope: Scope) -> None:
        for mid in scope.memory_ids():
            self.result.memories.pop(mid, None)
        scope.memory_routes = ()

    def answer_call(self, parent: Scope, caller: dict[str, str], route: str) -> None:
        """A dropped called scope's call gets a result, so the parent's memory holds no call
        without one (a model API refuses that)."""
        mid = parent.memory_id(parent.route)
        if mid in self.result.memories:
            text = f"{route} ended when the bot changed, without a result."
            self.result.memories[mid] = [*self.result.memories[mid],
                                         ToolResultMessage(caller["call_id"], caller["tool"], text)]

    # -- tools in memories -------------------------------------------------------------------

    def rename_in_items(self, key: str, old: str, new: str) -> None:
        """An open item's `route` or `tool` renamed with the bot's (else the move withdraws it)."""
        for item in self.result.snapshot.get(PENDING_KEY) or ():
            if item.get(key) == old:
                item[key] = new

    def rename_tool(self, old: str, new: str, where: str) -> None:
        self.rename_in_items("tool", old, new)
        changed = 0
        for mid, messages in self.result.memories.items():
            renamed = [_with_tool_renamed(m, old, new) for m in messages]
            changed += sum(1 for a, b in zip(messages, renamed, strict=True) if a is not b)
            self.result.memories[mid] = renamed
        for scope in self.scopes:
            if scope.caller and scope.caller.get("tool") == old:
                scope.caller = {**scope.caller, "tool": new}
                changed += 1
        if changed:
            self.note(f"{where}: tool `{old}` is now `{new}` in {changed} message(s)")

    def change_arguments(self, tool: str, changes: KeyChanges, where: str) -> None:
        """The arguments of `tool`'s calls in memories, renamed, dropped and defaulted as its new
        parameters want them (the model reads them as examples of how to call it), and of its
        open items' calls (an approved call runs with them: with the old names it failed)."""
        changed = 0
        for item in self.result.snapshot.get(PENDING_KEY) or ():
            if item.get("tool") == tool and isinstance(item.get("args"), dict):
                item["args"] = _mapped(item["args"], changes)
                item["edit"] = [n for n in (changes.rename.get(e, e) for e in item.get("edit") or ())
                                if n not in changes.drop]
                changed += 1
        for mid, messages in self.result.memories.items():
            out: list[Message] = []
            for message in messages:
                if isinstance(message, AssistantMessage) and any(c.name == tool for c in message.tool_calls):
                    calls = tuple(_with_arguments(c, changes) if c.name == tool else c for c in message.tool_calls)
                    changed += sum(1 for a, b in zip(message.tool_calls, calls, strict=True) if a is not b)
                    message = dataclasses.replace(message, tool_calls=calls)
                out.append(message)
            self.result.memories[mid] = out
        if changed:
            self.note(f"{where}: the arguments of {changed} call(s) of `{tool}` changed")

    # -- state paths -------------------------------------------------------------------------

    def containers(self, root: str) -> list[dict[str, Any]]:
        """Where a path of `root` lives: the conversation state, or every scope's local and shared."""
        if root == "state":
            return [self.state]
        return [d for s in self.scopes for d in (s.local, s.shared)]

    def root_of(self, root: str) -> dict[str, Any]:
        """Where a value moved into another root lands: the conversation state, or the root
        scope's shared state (seen by every scope)."""
        return self.state if root == "state" else self.scopes[0].shared

    def rename_path(self, source: str, target: str, where: str) -> None:
        (root, keys), (target_root, target_keys) = split_state_path(source), split_state_path(target)
        for container in self.containers(root):
            found, value = _pop(container, keys)
            if not found:
                continue
            destination = container if target_root == root else self.root_of(target_root)
            _put(destination, target_keys, value)
            self.note(f"{where}: {shown(source)} renamed to {shown(target)}")

    def drop_path(self, path: str, where: str) -> None:
        root, keys = split_state_path(path)
        for container in self.containers(root):
            if _pop(container, keys)[0]:
                self.note(f"{where}: {shown(path)} dropped")

    def default_path(self, path: str, value: Any, where: str) -> None:
        root, keys = split_state_path(path)
        targets = self.containers(root) if root == "state" else [s.local for s in self.scopes[-1:]]
        for container in targets:
            if _get(container, keys) is None and not (root == "scope" and _in_any_scope(self.scopes, keys)):
                _put(container, keys, copy.deepcopy(value))
                self.note(f"{where}: {shown(path)} set to its default {value!r}")

    # -- the end -----------------------------------------------------------------------------

    def finish(self) -> None:
        """What every migrated session gets: the new bot's name, the state keys and scope fields
        the new version declares (their YAML values, when absent), and the routes left unresolved."""
        snapshot = self.result.snapshot
        if snapshot.get("bot") not in (None, self.new.name):
            snapshot["bot"] = self.new.name
        if "bot_version" in snapshot:  # a session of the new version now (kept absent: as it was stored)
            snapshot["bot_version"] = self.new.content_version
        for key, value in self.new.state.items():
            if key not in self.state:
                self.state[key] = copy.deepcopy(value)
                self.note(f"state.{key}: new in this version, set to {value!r}")
        for scope in self.scopes:
            route = self.new.routes.get(scope.route)
            if route is None:
                if scope.route not in self.result.unmapped_routes:
                    self.result.unmapped_routes.append(scope.route)
                    self.note(f"route `{scope.route}` no longer exists and no migration maps it")
                continue
            init_declared(scope, route.scope.local, route.scope.shared)
        snapshot["scopes"] = [s.to_dict() for s in self.scopes]
        if self.renamed_calls and snapshot.get(DONE_CALLS_KEY):
            self.note(f"{len(snapshot[DONE_CALLS_KEY])} call(s) done once still recognised under their new tool, "
                      "arguments or paths")
        live = {mid for s in self.scopes for mid in s.memory_ids()}
        self.result.memories = {mid: ms for mid, ms in self.result.memories.items() if mid in live}


def chain_from(old: BotConfig, new: BotConfig) -> tuple[MigrationConfig, ...]:
    """The migrations a session of `old` goes through to `new` (none: the same version)."""
    return () if old.content_version == new.content_version else tuple(applying(new.migrations, old.version))


def older_spellings(migrations: list[MigrationConfig], tagged: str, tool: str, args: dict[str, Any],
                    acted_on: dict[str, Any]) -> list[str]:
    """The identities (engine/once.py) a call of the newest version has as an older version
    spells it: the version tagged `tagged` (its tool, arguments and `requires` paths renamed back
    through the migrations from that version on); marked by a move as that version or an earlier
    one (once.dated), as each of those spells it; untagged (an entry recorded before entries said
    their version, of a session whose version is not known) or of a version no migration's `from:`
    names, as each version along the migrations spells it. Pure: nothing is read or written."""
    version, or_earlier = once.version_of(tagged)
    named = [i for i, m in enumerate(migrations) if version is not None and m.applies_to(version)][:1]
    if not named:  # untagged, or a version no migration names: any of them
        starts: Iterable[int] = range(len(migrations) + 1)
    else:
        starts = range(named[0] + 1) if or_earlier else named
    spelled = []
    for i in starts:
        old_tool, old_args = spelled_before(tuple(migrations[i:]), tool, args)
        spelled.append(once.identity(old_tool, old_args, _paths_before(migrations[i:], acted_on)))
    return spelled


def spelled_forward_is(migrations: list[MigrationConfig], tagged: str, parts: str, call: str) -> bool:
    """Whether a call recorded by the version tagged `tagged`, made of `parts` (once.made_of),
    spelled forward through the migrations from that version on, is the newest version's `call`
    (made of `call`): its tool, arguments and `requires` paths carried as the migrations carry the
    calls in memories (`_mapped`: an argument renamed, dropped, given its default when absent). An
    argument given a default matches the new call's left out, as `spelled_before` spells it back.
    A version no migration's `from:` names spells it as the newest does. Pure."""
    tool, args, paths, defaulted = _forward(applying(migrations, once.version_of(tagged)[0]), *once.read_parts(parts))
    new_tool, new_args, new_paths = once.read_parts(call)
    filled = {**{k: v for k, v in args.items() if k in defaulted}, **new_args}
    return (tool, args, paths) == (new_tool, filled, new_paths)


def _forward(chain: list[MigrationConfig], tool: str, args: dict[str, str],
             paths: dict[str, str]) -> tuple[str, dict[str, str], dict[str, str], set[str]]:
    """A call's parts carried through the migrations `chain`, and the arguments given a default."""
    defaulted: set[str] = set()
    for m in chain:
        tool = m.tools.get(tool, tool)
        changes = m.arguments.get(tool)
        if changes is not None:
            renamed = {changes.rename.get(k, k): v for k, v in args.items()}
            args = {k: v for k, v in renamed.items() if k not in changes.drop}
            defaulted = {changes.rename.get(k, k) for k in defaulted} - set(changes.drop)
            added = {k: once.hashed_default(v) for k, v in changes.default.items() if k not in args}
            args, defaulted = {**args, **added}, defaulted | set(added)
        renames = {shown(source): shown(target) for source, target in m.state.rename.items()}
        dropped = {shown(path) for path in m.state.drop}
        paths = {_renamed_path(k, renames): v for k, v in paths.items() if k not in dropped}
    return tool, args, paths, defaulted


def spelled_before(moved_by: tuple[MigrationConfig, ...], tool: str, args: dict[str, Any]) -> tuple[str, Any]:
    """A call of the new version as the version the migrations `moved_by` left spells it: its tool
    and its arguments renamed back, the ones a migration defaulted left out when they hold the
    default (an argument a migration dropped cannot be given back). What its idempotency key is made
    of in the turn that moves the session: that turn may be the retry of one the old version ran."""
    spelled = dict(args)
    for m in reversed(moved_by):
        changes = m.arguments.get(tool)
        if changes is not None:
            for name, value in changes.default.items():
                if spelled.get(name) == value:
                    spelled.pop(name)
            for old, new in changes.rename.items():
                if new in spelled:
                    spelled[old] = spelled.pop(new)
        tool = next((old for old, new in m.tools.items() if new == tool), tool)
    return tool, spelled


def _paths_before(moved_by: list[MigrationConfig], acted_on: dict[str, Any]) -> dict[str, Any]:
    """The values a call acts on (by the path its tool's `requires` spells) under the paths the
    version before the migrations `moved_by` had: each path a `state.rename` moved renamed back,
    spelled as the new one is (with its root, or without)."""
    out = {}
    for path, value in acted_on.items():
        full = shown(path)
        for m in reversed(moved_by):
            full = _renamed_path(full, {shown(target): shown(source) for source, target in m.state.rename.items()})
        out[full if path.startswith(split_state_path(path)[0] + ".") else full.partition(".")[2]] = value
    return out


def _renamed_path(path: str, renames: dict[str, str]) -> str:
    """A path (`state.a.b`) with a renamed path it is, or is under, replaced."""
    for source, target in renames.items():
        if path == source or path.startswith(source + "."):
            return target + path[len(source):]
    return path


def _with_tool_renamed(message: Message, old: str, new: str) -> Message:
    if isinstance(message, ToolResultMessage) and message.name == old:
        return dataclasses.replace(message, name=new)
    if isinstance(message, AssistantMessage) and any(c.name == old for c in message.tool_calls):
        calls = tuple(dataclasses.replace(c, name=new) if c.name == old else c for c in message.tool_calls)
        return dataclasses.replace(message, tool_calls=calls)
    return message


def _with_arguments(call: ToolCall, changes: KeyChanges) -> ToolCall:
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        return call  # malformed as the model sent it: kept as it was
    if not isinstance(arguments, dict):
        return call
    text = json.dumps(_mapped(arguments, changes), ensure_ascii=False)
    return call if text == call.arguments else dataclasses.replace(call, arguments=text)


def _mapped(arguments: dict[str, Any], changes: KeyChanges) -> dict[str, Any]:
    """A call's arguments renamed, dropped and defaulted by `changes` (changed in place)."""
    for old, new in changes.rename.items():
        if old in arguments:
            arguments[new] = arguments.pop(old)
    for name in changes.drop:
        arguments.pop(name, None)
    for name, value in changes.default.items():
        arguments.setdefault(name, copy.deepcopy(value))
    return arguments


def _get(container: dict[str, Any], keys: list[str]) -> Any:
    value: Any = container
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _pop(container: dict[str, Any], keys: list[str]) -> tuple[bool, Any]:
    parent = _get(container, keys[:-1]) if len(keys) > 1 else container
    if isinstance(parent, dict) and keys[-1] in parent:
        return True, parent.pop(keys[-1])
    return False, None


def _put(container: dict[str, Any], keys: list[str], value: Any) -> None:
    target = container
    for key in keys[:-1]:
        nxt = target.get(key)
        if not isinstance(nxt, dict):
            nxt = target[key] = {}
        target = nxt
    target[keys[-1]] = value


def _in_any_scope(scopes: list[Scope], keys: list[str]) -> bool:
    return any(_get(d, keys) is not None for s in scopes for d in (s.local, s.shared))


@dataclass(frozen=True)
class Footprint:
    """What a stored session holds that a change of its bot can touch (chatrun diff --store)."""

    bot: str | None
    routes: frozenset[str]  # the routes of its scopes
    state: frozenset[str]  # its top-level state keys
    scope: frozenset[str]  # the fields of its scopes
    tools: frozenset[str]  # the tools called in its memories


def footprint(snapshot: dict[str, Any], memories: dict[str, list[Message]]) -> Footprint:
    scopes = [Scope.from_dict(d) for d in snapshot.get("scopes", [])]
    tools = {c.name for ms in memories.values() for m in ms if isinstance(m, AssistantMessage) for c in m.tool_calls}
    tools |= {m.name for ms in memories.values() for m in ms if isinstance(m, ToolResultMessage)}
    return Footprint(snapshot.get("bot"), frozenset(s.route for s in scopes), frozenset(snapshot.get("state") or {}),
                     frozenset(k for s in scopes for k in (*s.local, *s.shared)), frozenset(tools))
