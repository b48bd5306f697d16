"""Chat scopes and the state paths tools read and write.

A session holds a stack of scopes, root first (Quarkus `ChatScope.push/pop`). Each
scope has a current route, `local` state (seen only by this scope, like
`@PerChatScoped`) and `shared` state (seen and written by the scopes nested in it,
like `@ChatScoped`). Conversation `state` is seen by every scope; `turn` state
lives for one turn (`@InvocationScoped`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from chatrun.errors import ChatrunError
from chatrun.events import copy_plain
from chatrun.store.record import memory_id

ROOTS = ("state", "scope", "turn")


@dataclass(slots=True)  # every open scope of every cached session: no __dict__
class Scope:
    id: str
    route: str
    local: dict[str, Any] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    memory_routes: list[str] = field(default_factory=list)  # routes that have a memory in this scope
    caller: dict[str, str] | None = None  # a called scope: {"call_id", "tool"} of the call waiting for it

    def memory_id(self, route: str) -> str:
        return memory_id(self.id, route)

    def memory_ids(self) -> list[str]:
        return [self.memory_id(r) for r in self.memory_routes]

    def copy(self) -> Scope:
        """A deep copy (copy.deepcopy's result, cheaper: a turn's checkpoint copies every scope)."""
        return Scope(self.id, self.route, copy_plain(self.local), copy_plain(self.shared), list(self.memory_routes),
                     dict(self.caller) if self.caller is not None else None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "route": self.route,
            "local": self.local,
            "shared": self.shared,
            "memory_routes": self.memory_routes,
            **({"caller": self.caller} if self.caller else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scope:
        return cls(d["id"], d["route"], d.get("local", {}), d.get("shared", {}), list(d.get("memory_routes", [])),
                   d.get("caller"))


def merged_scope(scopes: list[Scope]) -> dict[str, Any]:
    """A merged copy of what the current (last) scope sees: ancestors' shared, then its own
    shared, then its local. (ScopeView is the live, writable view of the same.)"""
    merged: dict[str, Any] = {}
    for s in scopes:
        merged.update(s.shared)
    merged.update(scopes[-1].local)
    return merged


class ScopeView(MutableMapping[str, Any]):
    """The current scope's state as one writable mapping (what handlers get as `ctx.scope`).

    A key is read from and written to where it lives: the current scope's local state,
    else the nearest scope (current first) whose shared state holds it; a new key goes
    to the current scope's local state.
    """

    def __init__(self, scopes: list[Scope]):
        self._scopes = scopes

    def _owner(self, key: str) -> dict[str, Any] | None:
        current = self._scopes[-1]
        if key in current.local:
            return current.local
        for s in reversed(self._scopes):
            if key in s.shared:
                return s.shared
        return None

    def __getitem__(self, key: str) -> Any:
        owner = self._owner(key)
        if owner is None:
            raise KeyError(key)
        return owner[key]

    def __setitem__(self, key: str, value: Any) -> None:
        owner = self._owner(key)
        (owner if owner is not None else self._scopes[-1].local)[key] = value

    def __delitem__(self, key: str) -> None:
        owner = self._owner(key)
        if owner is None:
            raise KeyError(key)
        del owner[key]

    def __iter__(self) -> Iterator[str]:
        return iter(merged_scope(self._scopes))

    def __len__(self) -> int:
        return len(merged_scope(self._scopes))

    def __repr__(self) -> str:
        return f"ScopeView({merged_scope(self._scopes)!r})"


_MISSING = object()


def get_path(roots: dict[str, Any], path: str) -> Any:
    """The value at a dotted path like `scope.reservation.destination`, or None when absent."""
    parts = path.split(".")
    value: Any = roots.get(parts[0], _MISSING)
    for part in parts[1:]:
        if isinstance(value, (dict, MutableMapping)) and part in value:
            value = value[part]
        else:
            return None
    return None if value is _MISSING else value


def set_path(roots: dict[str, Any], path: str, value: Any) -> None:
    """Assign at a dotted path, creating intermediate mappings. Raises ChatrunError naming the path
    when it crosses a value that is not a mapping."""
    parts = path.split(".")
    if parts[0] not in ROOTS or len(parts) < 2:
        raise ChatrunError(f"cannot set {path!r}: paths start with state., scope. or turn.")
    target: Any = roots[parts[0]]
    for i, part in enumerate(parts[1:-1], start=1):
        nxt = target.get(part) if isinstance(target, (dict, MutableMapping)) else None
        if nxt is None:
            nxt = {}
            target[part] = nxt
        elif not isinstance(nxt, (dict, MutableMapping)):
            where = ".".join(parts[: i + 1])
            raise ChatrunError(f"cannot set {path!r}: {where} holds {type(nxt).__name__}, not a mapping")
        target = nxt
    target[parts[-1]] = value


def init_declared(scope: Scope, local: dict[str, Any], shared: dict[str, Any]) -> None:
    """Give a scope the state its route declares, keeping values it already has."""
    for key, value in local.items():
        scope.local.setdefault(key, copy.deepcopy(value))
    for key, value in shared.items():
        scope.shared.setdefault(key, copy.deepcopy(value))
