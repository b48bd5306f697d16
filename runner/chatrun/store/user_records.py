"""The records of a user a commit changes in its own atomic write: what its turns remembered
(store/user_memory.py, `Remembered`) and what they used of the user's budget
(store/user_budget.py, `Charge`). Every built-in store reads each one, applies `written` and
writes the result inside the commit's transaction, lock or fenced script (`Commit.user_writes`);
this module is the one place that says which record each write changes and how."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from chatrun.store import user_budget, user_memory
from chatrun.store.record import Charge, JSONObject, Remembered

if TYPE_CHECKING:
    from chatrun.store import RecordStore


def key_of(item: Remembered | Charge) -> str:
    """The record key `item` changes."""
    if isinstance(item, Charge):
        return user_budget.user_budget_key(item.bot, item.principal)
    return user_memory.remembered_key(item)


def written(record: JSONObject | None, item: Remembered | Charge, now: float) -> JSONObject | None:
    """The record after `item` (None: nothing left: delete it)."""
    if isinstance(item, Charge):
        return user_budget.charged(record, item.bot, item.principal, item.window, item.usage)
    return user_memory.written(record, item, now)


def write_through(records: RecordStore, items: Iterable[Remembered | Charge], now: float) -> None:
    """`items` through a RecordStore's own methods: inside a store's transaction or lock, or for a
    user's own store (which does not know them) right after its commit."""
    for item in items:
        key = key_of(item)
        record = written(records.get_record(key), item, now)
        if record is None:
            records.delete_record(key)
        else:
            records.put_record(key, record)
