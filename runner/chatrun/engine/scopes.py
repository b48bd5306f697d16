"""Chat scopes and the state paths tools read and write.

A session holds a stack of scopes, root first (Quarkus `ChatScope.push/pop`). Each
scope has a current route, `local` state (seen only by this scope, like
`@PerChatScoped`) and `shared` state (seen and written by the scopes nested in it,
like `@ChatScoped`). Conversation `state` is seen by every scope; `turn` state
lives for one turn (`@InvocationScoped`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any, overload

from chatrun.errors import ChatrunError
from chatrun.events import copy_plain
from chatrun.store.record import memory_id

ROOTS = ("state", "scope", "turn")


class _Unwritten(dict[str, Any]):
    """The one empty mapping every idle session shares for state it has not written (its
    conversation state, meta, each scope's local and shared state): 64 B a dict, four a session
    (issue 39). Never handed to a writer: the `Scope` and `Conversation` properties hand out a fresh
    dict in its place, and `compact()` puts it back when a turn is done. It refuses every write,
    so a path that skipped the properties fails loudly instead of writing into every session."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise TypeError("the shared empty state of idle sessions is read-only (take the session's own dict)")

    __setitem__ = __delitem__ = setdefault = update = pop = popitem = clear = __ior__ = _refuse

    # Copies are itself, as a frozen value's are; deepcopy keeps one copy of an object it meets
    # twice, so a fresh {} here would be one dict for every place it stood.
    def __copy__(self) -> _Unwritten:
        return self

    def __deepcopy__(self, memo: object) -> _Unwritten:
        return self

    def __reduce__(self) -> Any:
        return dict, ()


UNWRITTEN: dict[str, Any] = _Unwritten()


def own(mapping: dict[str, Any]) -> dict[str, Any]:
    """`mapping`, or a fresh dict in place of the shared UNWRITTEN."""
    return {} if mapping is UNWRITTEN else mapping


def compact(mapping: dict[str, Any]) -> dict[str, Any]:
    """The shared UNWRITTEN in place of an empty dict (an idle session keeps none of its own)."""
    return mapping if mapping else UNWRITTEN


class OwnOnRead:
    """A dict attribute kept in the slot `_NAME`, the shared UNWRITTEN while nothing is in it: its
    first reader (every writer reads it first) gets a dict of its own in the slot's place."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_" + name

    @overload
    def __get__(self, holder: None, owner: type) -> OwnOnRead: ...

    @overload
    def __get__(self, holder: object, owner: type | None = None) -> dict[str, Any]: ...

    def __get__(self, holder: object | None, owner: type | None = None) -> dict[str, Any] | OwnOnRead:
        if holder is None:
            return self
        value: dict[str, Any] = getattr(holder, self.slot)
        if value is UNWRITTEN:
            value = {}
            setattr(holder, self.slot, value)
        return value

    def __set__(self, holder: object, value: dict[str, Any]) -> None:
        setattr(holder, self.slot, value)


class Scope:
    """One scope of a session's stack: its id, route, state and the routes with a memory in it."""

    # Every open scope of every cached session: no __dict__. `local` and `shared` are properties:
    # an idle scope shares UNWRITTEN for each, and the first reader gets a dict of its own.
    __slots__ = ("id", "route", "_local", "_shared", "_memory_routes", "caller")

    def __init__(self, id: str, route: str, local: dict[str, Any] | None = None, shared: dict[str, Any] | None = None,
                 memory_routes: Iterable[str] = (), caller: dict[str, str] | None = None):
        self.id = id
        self.route = route
        self._local = UNWRITTEN if local is None else local
        self._shared = UNWRITTEN if shared is None else shared
        self.memory_routes = memory_routes
        self.caller = caller  # a called scope: {"call_id", "tool"} of the call waiting for it

    local = OwnOnRead()  # the scope's own state (seen by it only)
    shared = OwnOnRead()  # the state the scope shares with the scopes nested in it

    @property
    def memory_routes(self) -> tuple[str, ...]:
        """The routes that have a memory in this scope, in order (a tuple: replaced, never changed in place)."""
        return self._memory_routes

    @memory_routes.setter
    def memory_routes(self, routes: Iterable[str]) -> None:
        self._memory_routes = _shared_routes(tuple(routes))

    def compact(self) -> None:
        """Share UNWRITTEN for empty state again (a turn is done: no one holds these dicts)."""
        self._local, self._shared = compact(self._local), compact(self._shared)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Scope):
            return NotImplemented
        return (self.id, self.route, self._local, self._shared, self.memory_routes, self.caller) == (
            other.id, other.route, other._local, other._shared, other.memory_routes, other.caller)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it was

    def __repr__(self) -> str:
        return (f"Scope(id={self.id!r}, route={self.route!r}, local={dict(self._local)!r}, "
                f"shared={dict(self._shared)!r}, memory_routes={self.memory_routes!r}, caller={self.caller!r})")

    def memory_id(self, route: str) -> str:
        return memory_id(self.id, route)

    def memory_ids(self) -> list[str]:
        return [self.memory_id(r) for r in self.memory_routes]

    def copy(self) -> Scope:
        """A deep copy (copy.deepcopy's result, cheaper: a turn's checkpoint copies every scope)."""
        return Scope(self.id, self.route, _copy_state(self._local), _copy_state(self._shared), self.memory_routes,
                     dict(self.caller) if self.caller is not None else None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "route": self.route,
            "local": self._local or {},  # a fresh one for UNWRITTEN: a reader of the snapshot may write it
            "shared": self._shared or {},
            "memory_routes": list(self.memory_routes),
            **({"caller": self.caller} if self.caller else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scope:
        return cls(d["id"], d["route"], d.get("local") or UNWRITTEN, d.get("shared") or UNWRITTEN,
                   d.get("memory_routes", ()), d.get("caller"))


# One tuple of routes for every scope with the same routes (most have one: their own route's
# memory): a list of its own was 80 B of every idle scope (issue 39). Bounded: past the bound a
# scope keeps a tuple of its own.
_ROUTES: dict[tuple[str, ...], tuple[str, ...]] = {}
_ROUTES_KEPT = 4096


def _shared_routes(routes: tuple[str, ...]) -> tuple[str, ...]:
    kept = _ROUTES.get(routes)
    if kept is not None:
        return kept
    if len(_ROUTES) < _ROUTES_KEPT:
        _ROUTES[routes] = routes
    return routes


def _copy_state(state: dict[str, Any]) -> dict[str, Any]:
    return copy_plain(state) if state else UNWRITTEN


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
