"""The cheap deep copies a turn makes of its state and scopes (events.copy_plain, Scope.copy):
the same result as copy.deepcopy, nothing shared with the original."""

import copy
from datetime import date

from chatrun.engine.scopes import Scope
from chatrun.events import copy_plain


def test_copy_plain_is_a_deep_copy_that_shares_nothing_mutable():
    value = {"a": [1, 2.5, {"b": "x", "c": None, "d": True}], "e": {"f": []}, "g": (1, [2]), "h": date(2026, 1, 2)}
    copied = copy_plain(value)
    assert copied == copy.deepcopy(value)
    copied["a"][2]["b"] = "changed"
    copied["e"]["f"].append(1)
    copied["g"][1].append(3)  # a tuple (not plain JSON) is deep-copied too
    assert value == {"a": [1, 2.5, {"b": "x", "c": None, "d": True}], "e": {"f": []}, "g": (1, [2]),
                     "h": date(2026, 1, 2)}


def test_a_scope_copy_shares_nothing_with_its_scope():
    scope = Scope("s.1", "main", {"n": [1]}, {"m": {"k": "v"}}, ["main"], {"call_id": "c1", "tool": "t"})
    copied = scope.copy()
    assert copied == copy.deepcopy(scope)
    copied.local["n"].append(2)
    copied.shared["m"]["k"] = "w"
    copied.memory_routes = (*copied.memory_routes, "other")  # a tuple (shared by scopes alike): replaced, never changed in place
    assert copied.caller is not None
    copied.caller["tool"] = "u"
    assert scope == Scope("s.1", "main", {"n": [1]}, {"m": {"k": "v"}}, ["main"], {"call_id": "c1", "tool": "t"})
