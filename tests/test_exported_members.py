"""The public API is what `chatrun` exports: everything in `__all__` exists, and every public
name of the package is in `__all__` (after httpx's test_exported_members.py)."""

from types import ModuleType

import chatrun
import chatrun.errors


def test_all_lists_exactly_the_public_members():
    for name in chatrun.__all__:
        getattr(chatrun, name)  # a public name is imported on first use (chatrun._LAZY says from where)
    public = {
        name for name, value in vars(chatrun).items()
        # Submodules show up as attributes once imported; "@py_..." are pytest's assertion rewriting.
        if not name.startswith(("_", "@")) and not isinstance(value, ModuleType)
    }
    assert sorted(chatrun.__all__, key=str.casefold) == sorted(public | {"__version__", "events"}, key=str.casefold)
    assert set(chatrun.__all__) == set(chatrun._LAZY) | {"__version__"}


def test_exported_names_exist():
    assert [name for name in chatrun.__all__ if not hasattr(chatrun, name)] == []


def test_every_error_is_exported_and_is_a_chatrun_error():
    defined = {
        name for name, value in vars(chatrun.errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and value.__module__ == "chatrun.errors"
    }
    assert defined <= set(chatrun.__all__)
    assert all(issubclass(getattr(chatrun.errors, name), chatrun.ChatrunError) for name in defined)
