"""What changed between two versions of a bot, and which changes break live sessions.

`diff_bots(old, new)` compares two loaded configs and returns one `Change` per difference a
live session can meet: routes, top-level state keys, scope fields, tools, their parameters
and `requires:`, the format version. A change is *breaking* when a session that started on
the old version can fail or silently misread on the new one (it sits on a removed route,
reads a removed state key, holds calls of a removed tool or of old parameters, lacks newly
required state). A breaking change a migration of the new version handles says which one
(`migrated`); `chatrun diff` fails CI only on breaking changes no migration handles.

Each change names what it touches in a stored session (`Touch`: old route names, state
keys, tool names), so `chatrun diff --store` can count the sessions each change affects
(engine/migrate.py's `footprint` says what a session holds).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from chatrun.definition.config import BotConfig, MigrationConfig, ToolConfig
from chatrun.definition.migrations import applying, declared_state, split_state_path


@dataclass(frozen=True)
class Touch:
    """What of a stored session a change concerns (any one of them is enough)."""

    routes: frozenset[str] = frozenset()  # sessions with a scope on one of these routes
    state: frozenset[str] = frozenset()  # ... holding one of these top-level state keys
    scope: frozenset[str] = frozenset()  # ... holding one of these scope fields
    tools: frozenset[str] = frozenset()  # ... whose memories hold calls of one of these tools
    every: bool = False  # every session of the bot


@dataclass
class Change:
    kind: str  # "route" | "state" | "scope" | "tool" | "parameter" | "requires" | "format"
    name: str  # the route, key, tool or `tool.parameter`
    what: str  # "removed", "added", "renamed to X", "changed: ..."
    breaking: bool
    why: str = ""  # for a breaking change: what a live session meets
    migrated: str | None = None  # the migration that handles it ("migration 1 (file:line)")
    touch: Touch = field(default_factory=Touch)
    sessions: int | None = None  # with --store: stored sessions on the OLD version it touches
    unversioned: int | None = None  # with --store: stored sessions with no version recorded it touches

    @property
    def label(self) -> str:
        """The change's subject in words: "route checkout", "state.email", "tool pay requires state.x"."""
        if self.kind in ("state", "scope"):
            return self.name
        if self.kind == "requires":
            tool, _, path = self.name.partition(": ")
            return f"tool {tool} requires {path}"
        return f"{self.kind} {self.name}"

    @property
    def unhandled(self) -> bool:
        return self.breaking and self.migrated is None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("touch")
        return out


def diff_bots(old: BotConfig, new: BotConfig) -> list[Change]:
    migrations = applying(new.migrations, old.version)
    changes = _routes(old, new, migrations) + _state(old, new, migrations) + _tools(old, new, migrations)
    if old.format_version != new.format_version:
        changes.append(Change("format", "format", f"changed: {old.format_version} -> {new.format_version}", False,
                              touch=Touch(every=True)))
    return changes


def _label(m: MigrationConfig) -> str:
    return f"migration {m.index + 1} at {m.where}"


def _handled(migrations: list[MigrationConfig], section: str, name: str) -> tuple[str | None, str | None]:
    """(the migration that handles `name` in `section`, what it does) or (None, None)."""
    for m in migrations:
        if section == "routes" and name in m.routes:
            return _label(m), f"renamed to {m.routes[name]}"
        if section == "routes" and name in m.scopes:
            return _label(m), f"removed (its scopes {'dropped' if m.scopes[name] == 'drop' else 'reset'})"
        if section == "tools" and name in m.tools:
            return _label(m), f"renamed to {m.tools[name]}"
        if section == "state":
            for source, target in m.state.rename.items():
                if _same(source, name):
                    return _label(m), f"renamed to {target}"
            if any(_same(p, name) for p in m.state.drop):
                return _label(m), "removed (dropped)"
            if any(_same(p, name) for p in m.state.default):
                return _label(m), "defaulted"
    return None, None


def _same(path: str, name: str) -> bool:
    """A migration path and a change's `root.key` name the same top-level key."""
    root, keys = split_state_path(path)
    return f"{root}.{keys[0]}" == name


def _routes(old: BotConfig, new: BotConfig, migrations: list[MigrationConfig]) -> list[Change]:
    out: list[Change] = []
    for name in old.routes:
        if name in new.routes:
            continue
        migrated, what = _handled(migrations, "routes", name)
        out.append(Change("route", name, what or "removed", True,
                          "sessions on it cannot continue there", migrated, Touch(routes=frozenset({name}))))
    for name in new.routes:
        if name not in old.routes and not any(name in m.routes.values() for m in migrations):
            out.append(Change("route", name, "added", False))
    return out


def _state(old: BotConfig, new: BotConfig, migrations: list[MigrationConfig]) -> list[Change]:
    out: list[Change] = []
    before, after = declared_state(old), declared_state(new)
    for root in ("state", "scope"):
        kind = "state" if root == "state" else "scope"
        for key in sorted(before[root] - after[root]):
            name = f"{root}.{key}"
            migrated, what = _handled(migrations, "state", name)
            if migrated is None and root == "scope":
                migrated, what = _gone_with_routes(old, new, migrations, key)
            touch = Touch(state=frozenset({key})) if root == "state" else Touch(scope=frozenset({key}))
            out.append(Change(kind, name, what or "removed", True,
                              "sessions hold it, and templates reading the new key see nothing", migrated, touch))
        for key in sorted(after[root] - before[root]):
            name = f"{root}.{key}"
            migrated, _ = _handled(migrations, "state", name)
            if migrated is None and any(_renamed_into(m, name) for m in migrations):
                continue  # the other side of a rename, listed there
            out.append(Change(kind, name, "added", False, migrated=migrated))
    return out


def _gone_with_routes(old: BotConfig, new: BotConfig, migrations: list[MigrationConfig],
                      key: str) -> tuple[str | None, str | None]:
    """A scope field only removed routes declared, whose scopes a migration drops or resets: it
    goes with them."""
    declaring = [r for r in old.routes.values() if key in r.scope.local or key in r.scope.shared]
    handled = [_handled(migrations, "routes", r.name) for r in declaring if r.name not in new.routes]
    if declaring and len(handled) == len(declaring) and all(label for label, _ in handled):
        return handled[0][0], f"removed with route `{declaring[0].name}`"
    return None, None


def _renamed_into(m: MigrationConfig, name: str) -> bool:
    return any(_same(target, name) for target in m.state.rename.values())


def _tools(old: BotConfig, new: BotConfig, migrations: list[MigrationConfig]) -> list[Change]:
    out: list[Change] = []
    for name, tool in old.tools.items():
        migrated, what = _handled(migrations, "tools", name)
        now = new.tools.get(name) or new.tools.get(_renamed_tool(migrations, name) or "")
        if now is None:  # its calls in memories stay as history; a new call is refused to the model, not failed
            out.append(Change("tool", name, what or "removed", False, touch=Touch(tools=frozenset({name}))))
            continue
        if now.name != name:
            out.append(Change("tool", name, what or f"renamed to {now.name}", True,
                              "memories hold its calls under the old name", migrated, Touch(tools=frozenset({name}))))
        out += _parameters(tool, now, migrations) + _requires(tool, now, migrations)
    renamed_to = {m.tools[t] for m in migrations for t in m.tools}
    for name in new.tools:
        if name not in old.tools and name not in renamed_to:
            out.append(Change("tool", name, "added", False))
    return out


def _renamed_tool(migrations: list[MigrationConfig], name: str) -> str | None:
    return next((m.tools[name] for m in migrations if name in m.tools), None)


def _parameters(old: ToolConfig, new: ToolConfig, migrations: list[MigrationConfig]) -> list[Change]:
    """Parameters removed, retyped or newly required break the calls in memories (the model
    copies them); an optional new one does not. A migration's `arguments:` for the tool that
    names the parameter handles it."""
    out = _parameter_changes(old, new)
    for change in out:
        parameter = change.name.partition(".")[2]
        for m in migrations:
            changes = m.arguments.get(new.name)
            if changes and parameter in {*changes.rename, *changes.rename.values(), *changes.drop, *changes.default}:
                change.migrated = _label(m)
                break
    return out


def _parameter_changes(old: ToolConfig, new: ToolConfig) -> list[Change]:
    out: list[Change] = []
    before, after = _props(old), _props(new)
    required_before, required_after = set(old.parameters.get("required") or []), set(new.parameters.get("required") or [])
    touch = Touch(tools=frozenset({old.name}))
    for p in sorted(set(before) | set(after)):
        name = f"{new.name}.{p}"
        if p not in after:
            out.append(Change("parameter", name, "removed", True, "calls in memories send it", touch=touch))
        elif p not in before:
            required = p in required_after
            out.append(Change("parameter", name, "added (required)" if required else "added", required,
                              "calls in memories lack it" if required else "", touch=touch if required else Touch()))
        elif before[p].get("type") != after[p].get("type"):
            out.append(Change("parameter", name, f"changed: type {before[p].get('type')} -> {after[p].get('type')}",
                              True, "calls in memories send the old type", touch=touch))
        elif p in required_after and p not in required_before:
            out.append(Change("parameter", name, "now required", True, "calls in memories may lack it", touch=touch))
    return out


def _props(tool: ToolConfig) -> dict[str, dict[str, Any]]:
    props = tool.parameters.get("properties") or {}
    return {str(k): (v if isinstance(v, dict) else {}) for k, v in props.items() if str(k) not in tool.bind}


def _requires(old: ToolConfig, new: ToolConfig, migrations: list[MigrationConfig]) -> list[Change]:
    out: list[Change] = []
    for path in new.requires:
        if path in old.requires:
            continue
        root, keys = split_state_path(path)
        key = f"{root}.{keys[0]}"
        migrated, _ = _handled(migrations, "state", key)
        if migrated is None:
            migrated = next((_label(m) for m in migrations if _renamed_into(m, key)), None)
        touch = Touch(every=True)
        out.append(Change("requires", f"{new.name}: {path}", "now required", True,
                          f"sessions that lack {path} cannot call {new.name}", migrated, touch))
    return out
