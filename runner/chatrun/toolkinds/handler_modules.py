"""Python handlers of a bot (the `handler:` tool kind, handler.py): `module:function` specs
resolved from the bot's directory.

Used twice: the checks import a module in isolation (validating one bot must not change
what another imports), the engine resolves handlers through one HandlerResolver per bot.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from chatrun.errors import ChatrunError


def handler_file(root: Path, module_name: str) -> Path:
    """The file of a handler module `a.b` in a bot directory: a/b.py or a/b/__init__.py."""
    rel = Path(*module_name.split("."))
    for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise ChatrunError(f"no module `{module_name}` in {root} (looked for {rel.with_suffix('.py')})")


class HandlerResolver:
    """Imports `module:function` handlers from a bot's directory, once per module."""

    def __init__(self, root: str, bot_name: str):
        self.root = Path(root)
        self.bot_name = bot_name
        self._modules: dict[str, ModuleType] = {}

    def resolve(self, spec: str) -> Callable[..., Any]:
        module_name, _, func_name = spec.partition(":")
        if not module_name or not func_name:
            raise ChatrunError(f"handler {spec!r} must look like module:function")
        module = self._modules.get(module_name)
        if module is None:
            module = self._modules[module_name] = self._import(module_name)
        func: object = getattr(module, func_name, None)
        if not callable(func):
            raise ChatrunError(f"handler {spec!r}: {module_name} has no function {func_name!r}")
        return func

    def _import(self, module_name: str) -> ModuleType:
        candidate = handler_file(self.root, module_name)
        # A private module name per bot, so two bots' travel_tools never collide in sys.modules.
        unique = f"_chatrun_bot_{abs(hash(str(self.root)))}_{module_name.replace('.', '_')}"
        spec = importlib.util.spec_from_file_location(unique, candidate)
        if spec is None or spec.loader is None:
            raise ChatrunError(f"handler module {candidate} cannot be imported")
        module = importlib.util.module_from_spec(spec)
        sys.modules[unique] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[unique]
            raise ChatrunError(f"handler module {candidate} failed to import: {exc!r}") from exc
        return module



def import_isolated(root: Path, module_name: str) -> ModuleType | str:
    """Import a handler module from the bot directory the way the engine will (HandlerResolver),
    but leave sys.modules as it was: validating one bot must not change what another imports.
    Returns the module, or a string saying why it could not be imported."""
    try:
        candidate = handler_file(root, module_name)
    except ChatrunError as exc:
        return str(exc)
    unique = f"_chatrun_validate_{abs(hash(str(candidate)))}_{module_name.replace('.', '_')}"
    spec = importlib.util.spec_from_file_location(unique, candidate)
    if spec is None or spec.loader is None:
        return f"cannot import {candidate}"
    module = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.modules[unique] = module  # while it runs: dataclasses and pickling look it up there
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # any failure of the bot's code is a diagnostic
        return f"{candidate} failed to import: {type(exc).__name__}: {exc}"
    finally:
        sys.modules.pop(unique, None)
        for name in set(sys.modules) - before:  # modules it imported from the bot directory
            mod_file = getattr(sys.modules[name], "__file__", None) or ""
            if mod_file.startswith(str(root.resolve())):
                sys.modules.pop(name, None)
    vars(module)["__chatrun_shown__"] = str(candidate)  # the path as the user wrote the bot's, for messages
    return module
