"""What `chatrun validate` says about a bot's format version and its `migrations:`.

Alone, a bot is checked for its `format:` (missing, or the previous version whose meaning
differs) and for migrations that name routes, tools or state paths this version lacks (a
rename's target, a default) or still declares (a drop). Against the old
version it migrates from (`chatrun validate NEW --against OLD`), every name a migration
takes from the old side must exist there, and every route the new version removed must be
mapped, reset or dropped by a migration that applies, else sessions on it depend on the
runtime's `on_change` policy (docs/versions.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from chatrun.definition.config import (
    CURRENT_FORMAT,
    SUPPORTED_FORMATS,
    BotConfig,
    Location,
    MigrationConfig,
)
from chatrun.definition.sources import suggest
from chatrun.errors import Diagnostic

STATE_ROOTS = ("state", "scope")  # where a migration's state path may point

# What each format version changed, for the warning a bot of the version before gets.
FORMAT_CHANGES = {
    2: "a `set` (or `output.set`) template that renders to none assigns nothing (format 1: it assigns None)",
    3: "one way to say each thing: a question's answer is kept with `set: {state.X: '{{ result }}'}` (not "
       "`ask.into`), an approval asks `ask: {text, tell}` (not `ask: TEXT` and `tell: TEXT`), a message is "
       "`message:` (not `emit: {Message: ...}`), and an action's keys are written in the order they apply",
}


def _diag(where: Location, severity: str, message: str, path: str) -> Diagnostic:
    return Diagnostic(where.file, where.line, where.col, severity, message, path)


def format_diagnostics(config: BotConfig, format_at: Location | None) -> list[Diagnostic]:
    """A bot of the previous format: a warning at its `format:` saying what differs. A bot
    without `format:` whose meaning depends on the version (it has a `set` template): a warning
    at the first such template."""
    changes = "; ".join(FORMAT_CHANGES[v] for v in sorted(FORMAT_CHANGES) if v > (config.format or 1))
    if config.format is None:
        where = first_set_template(config)
        if where is None:
            return []  # nothing in it means something else in another format
        return [_diag(where, "warning",
                      f"the bot declares no `format:`, so it is read as format {CURRENT_FORMAT}, where {changes}; "
                      f"declare the format it was written for (`chatrun upgrade` adds `format: {CURRENT_FORMAT}`)",
                      "format")]
    if config.format < CURRENT_FORMAT and config.format in SUPPORTED_FORMATS:
        return [_diag(format_at or config.where, "warning",
                      f"format {config.format} is an earlier version and keeps its meaning: {changes}. "
                      f"`chatrun upgrade` rewrites the bot to format {CURRENT_FORMAT}", "format")]
    return []


def set_templates(config: BotConfig) -> list[tuple[Location, str]]:
    """Every `set` whose value is a template (what format 2 changed the meaning of): where it is
    (its action, or the route's `output:`) and what it is ("`set state.x` of tool `t`")."""
    return list(dict.fromkeys(_set_templates(config)))


def _set_templates(config: BotConfig) -> Iterator[tuple[Location, str]]:
    for tool in config.tools.values():
        for _, action in tool.action.variants():
            where = action.where if action.where.line else tool.where
            for target, value in action.set.items():
                if isinstance(value, str):
                    yield where, f"`set {target}` of tool `{tool.name}`"
    for route in config.routes.values():
        if route.output is not None:
            for target, value in route.output.set.items():
                if isinstance(value, str):
                    yield route.output.where, f"`output.set {target}` of route `{route.name}`"


def first_set_template(config: BotConfig) -> Location | None:
    first = next(_set_templates(config), None)  # the first is all a warning needs: no walk of a big bot
    return first[0] if first else None


def migration_diagnostics(config: BotConfig) -> list[Diagnostic]:
    """A migration's targets exist in this version; `scopes:` names routes this version removed."""
    out: list[Diagnostic] = []
    for i, m in enumerate(config.migrations):
        at = f"migrations[{m.index}]"
        # In a chain (1 -> 2 -> 3) a name may be an intermediate version's that a later link renames.
        later_routes = {r for n in config.migrations[i + 1:] for r in (*n.routes, *n.scopes)}
        later_tools = {t for n in config.migrations[i + 1:] for t in n.tools}
        for old, new in m.routes.items():
            if new not in config.routes and new not in later_routes:
                out.append(_diag(m.place("routes", old), "error", f"migration maps route `{old}` to `{new}`, "
                                 f"which this version does not define{suggest(new, config.routes)}", f"{at}.routes.{old}"))
        for old, new in m.tools.items():
            if new not in config.tools and new not in later_tools:
                out.append(_diag(m.place("tools", old), "error", f"migration maps tool `{old}` to `{new}`, "
                                 f"which this version does not define{suggest(new, config.tools)}", f"{at}.tools.{old}"))
        for tool, changes in m.arguments.items():
            if tool in later_tools:
                continue  # an intermediate version's tool: its parameters are not this version's
            if tool not in config.tools:
                out.append(_diag(m.place("arguments", tool), "error", f"migration changes the arguments of tool "
                                 f"`{tool}`, which this version does not define{suggest(tool, config.tools)}",
                                 f"{at}.arguments.{tool}"))
                continue
            params = config.tools[tool].parameters.get("properties") or {}
            for name in [*changes.rename.values(), *changes.default]:
                if name not in params:
                    out.append(_diag(m.place("arguments", tool), "error", f"migration gives tool `{tool}` the "
                                     f"argument `{name}`, which is not one of its parameters{suggest(name, params)}",
                                     f"{at}.arguments.{tool}"))
        for route in m.scopes:
            if route in config.routes:
                out.append(_diag(m.place("scopes", route), "error", f"`scopes: {{{route}: ...}}` is for removed routes, "
                                 f"but this version still defines `{route}`", f"{at}.scopes.{route}"))
        out += _new_side(m, config, config.migrations[i + 1:])
    return out


def _new_side(m: MigrationConfig, config: BotConfig, later: list[MigrationConfig]) -> list[Diagnostic]:
    """The state paths a migration writes (rename targets, `default:`) are declared by this
    version's `state:` or a route's `scope:`, and the ones it drops are not (they would come
    back with their defaults). A path a later link of the chain renames or drops is an
    intermediate version's: not checked."""
    out: list[Diagnostic] = []
    at = f"migrations[{m.index}]"
    declared = {"state": config.state, "scope": declared_scope(config)}
    passed_on = {_spelled(p) for n in later for p in (*n.state.rename, *n.state.drop)}
    written = [("rename", key, target, "moves a value to") for key, target in m.state.rename.items()]
    written += [("default", key, key, "gives a default to") for key in m.state.default]
    for part, key, path, verb in written:
        missing = None if _spelled(path) in passed_on else _undeclared_path(declared, path)
        if missing is not None:
            out.append(_diag(m.place("state", part, key), "error", f"migration {verb} `{_spelled(path)}`, which "
                             f"this version does not declare{missing}", f"{at}.state.{part}.{key}"))
    for i, path in enumerate(m.state.drop):
        if _spelled(path) not in passed_on and _undeclared_path(declared, path) is None:
            out.append(_diag(m.place("state", "drop", i), "warning", f"migration drops `{_spelled(path)}`, which this "
                             "version still declares: a migrated session gets it back with its default; to keep "
                             "it, remove the drop", f"{at}.state.drop.{i}"))
    return out


def _spelled(path: str) -> str:
    root, keys = split_state_path(path)
    return ".".join([root, *keys])


def _undeclared_path(declared: dict[str, dict[str, Any]], path: str) -> str | None:
    """None when `path` is declared (as deep as the declaration goes: below a value that is not
    a mapping anything may be), else where it stops being declared, with a did-you-mean."""
    root, keys = split_state_path(path)
    level: Any = declared[root]
    for depth, key in enumerate(keys):
        if not isinstance(level, dict):
            return None
        if key not in level:
            where = ".".join([root, *keys[:depth]])
            return f" (`{where}` has no `{key}`{suggest(key, level)})" if depth else suggest(key, level)
        level = level[key]
    return None


def declared_scope(config: BotConfig) -> dict[str, Any]:
    """Every route's `scope:` fields merged (local and shared), as the checks read them."""
    merged: dict[str, Any] = {}
    for route in config.routes.values():
        merged.update(route.scope.local)
        merged.update(route.scope.shared)
    return merged


def against_diagnostics(old: BotConfig, new: BotConfig) -> list[Diagnostic]:
    """NEW's migrations checked against OLD: the names they take from the old side exist there,
    and every route NEW removed is resolved by a migration that applies to OLD's version."""
    out: list[Diagnostic] = []
    chain = applying(new.migrations, old.version)
    for m in chain:
        if m.applies_to(old.version):  # a later link of the chain names an intermediate version's names
            out += _old_side(m, old)
    resolved = {route for m in chain for route in (*m.routes, *m.scopes)}
    for name, route in old.routes.items():
        if name not in new.routes and name not in resolved:
            out.append(_diag(route.where, "warning",
                             f"route `{name}` is removed in {new.path or new.name} and no migration maps, resets or drops "
                             f"it: sessions on it continue only by the bot's `on_change` policy; add "
                             f"`routes: {{{name}: ROUTE}}` or `scopes: {{{name}: reset}}` to a migration",
                             f"routes.{name}"))
    return out


def _old_side(m: MigrationConfig, old: BotConfig) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    at, source = f"migrations[{m.index}]", old.path or old.name
    for section, names, known in (("routes", m.routes, old.routes), ("scopes", m.scopes, old.routes),
                                  ("tools", m.tools, old.tools)):
        noun = "tool" if section == "tools" else "route"
        for name in names:
            if name not in known:
                out.append(_diag(m.place(section, name), "error", f"migration names {noun} `{name}`, which the old "
                                 f"version ({source}) does not define{suggest(name, known)}", f"{at}.{section}.{name}"))
    declared = declared_state(old)
    paths = [("rename", key, path) for key, path in ((k, k) for k in m.state.rename)]
    paths += [("drop", str(i), path) for i, path in enumerate(m.state.drop)]
    for part, key, path in paths:
        if not _declared(declared, path):
            out.append(_diag(m.place("state", part, key), "error", f"migration {'renames' if part == 'rename' else 'drops'} "
                             f"`{path}`, which the old version ({source}) does not declare", f"{at}.state.{part}.{key}"))
    return out


def declared_state(config: BotConfig) -> dict[str, set[str]]:
    """The top-level keys a bot declares: {"state": ..., "scope": ...} (scope: every route's)."""
    scope = {k for r in config.routes.values() for k in (*r.scope.local, *r.scope.shared)}
    return {"state": set(config.state), "scope": scope}


def applying(migrations: list[MigrationConfig], old_version: str | None) -> list[MigrationConfig]:
    """The migrations a session of `old_version` goes through: the first whose `from:` names it
    (or is `*`), and every one after it — a list kept oldest first chains versions (1 -> 2 -> 3)."""
    for i, m in enumerate(migrations):
        if m.applies_to(old_version):
            return migrations[i:]
    return []


def split_state_path(path: str) -> tuple[str, list[str]]:
    """A migration's state path as (root, keys): `state.a.b`, `a.b` (state) or `scope.k`."""
    parts = path.split(".")
    if parts[0] in STATE_ROOTS and len(parts) > 1:
        return parts[0], parts[1:]
    return "state", parts


def _declared(declared: dict[str, set[str]], path: str) -> bool:
    root, keys = split_state_path(path)
    return keys[0] in declared[root]
