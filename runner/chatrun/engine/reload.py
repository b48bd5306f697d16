"""Loading a bot again when its files change (`chatrun serve --reload`, `chatrun repl --reload`).

    reloader = BotReloader("bots/travel")
    async for outcome in reloader.watch():      # one per batch of edits
        if outcome.bot: ...                     # valid: hand it to the sessions (Session.use_bot)
        else: print(outcome.diagnostics)        # invalid: the old bot keeps running

What is watched: the bot's directory, recursively, for YAML files (bot.yaml and the files
its `include:` names) and Python files (handler modules), leaving out `transcripts/`,
caches and hidden folders, whose edits never change the bot; and the folders of included
files that live outside it. Watching folders rather than a list of files means a file an
edited `include:` starts naming is seen too (outside the bot's directory: from the next
start).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatrun.definition.loader import check_bot
from chatrun.engine.bot import Bot
from chatrun.errors import Diagnostic

WATCHED_SUFFIXES = (".yaml", ".yml", ".py", ".j2", ".jinja")
IGNORED_FOLDERS = {"transcripts", "__pycache__", "node_modules"}


@dataclass
class Reload:
    """What one reload gave: a new bot, or the diagnostics that kept the old one running."""

    bot: Bot | None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    at: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.bot is not None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "at": self.at, "changed": self.changed,
                "diagnostics": [d.to_dict() for d in self.diagnostics]}


class BotReloader:
    """Watches one bot's files and loads the bot again when they change."""

    def __init__(self, path: str | Path, bot: Bot | None = None):
        self.path = Path(path)
        self.root = self.path if self.path.is_dir() else self.path.parent
        self.bot = bot  # the bot running now

    def roots(self) -> list[Path]:
        """The folders to watch: the bot's, and those of its files that live elsewhere."""
        roots = [self.root.resolve()]
        if self.bot is not None:
            config = self.bot.config
            files = [r.where.file for r in config.routes.values()] + [t.where.file for t in config.tools.values()]
            for file in files:
                folder = Path(file).resolve().parent if file else None
                if folder is not None and not any(folder.is_relative_to(r) for r in roots):
                    roots.append(folder)
        return roots

    def relevant(self, changed: str | Path) -> bool:
        """Whether an edit of this file can change the bot."""
        path = Path(changed)
        resolved = path.resolve()
        for root in self.roots():
            if resolved.is_relative_to(root):
                parts = resolved.relative_to(root).parts
                break
        else:
            return False
        if any(p in IGNORED_FOLDERS or p.startswith(".") for p in parts[:-1]):
            return False
        return path.suffix in WATCHED_SUFFIXES and not path.name.startswith(".")

    def reload(self, changed: list[str] | None = None) -> Reload:
        """Load the bot again. Valid: it becomes `self.bot`. Invalid: `self.bot` stays, and
        carries the diagnostics (`Bot.reload_problems`) until a valid edit."""
        config, diagnostics = check_bot(self.path)
        errors = [d for d in diagnostics if d.severity == "error"]
        if config is not None and not errors and self.bot is not None and config.name != self.bot.name:
            errors = [Diagnostic(config.path, 1, 1, "error",
                                 f"the bot's name changed from {self.bot.name!r} to {config.name!r}; "
                                 "sessions belong to a name, so restart to rename a bot", "name")]
            diagnostics = errors
        if config is None or errors:
            if self.bot is not None:
                self.bot.reload_problems = list(diagnostics)
            return Reload(None, list(diagnostics), list(changed or []))
        try:
            bot = Bot(config, self.bot.store if self.bot is not None else None)
        except Exception as exc:  # noqa: BLE001 - a broken edit must never stop the running bot
            problem = Diagnostic(config.path, 0, 0, "error", f"the bot could not be built: {exc}")
            if self.bot is not None:
                self.bot.reload_problems = [problem]
            return Reload(None, [problem], list(changed or []))
        self.bot = bot
        return Reload(bot, list(diagnostics), list(changed or []))

    async def watch(self, stop_event: object | None = None) -> AsyncIterator[Reload]:
        """A Reload for every batch of relevant edits, until cancelled (or `stop_event` is set)."""
        from watchfiles import awatch

        async for changes in awatch(*self.roots(), watch_filter=lambda _c, p: self.relevant(p),
                                    stop_event=stop_event, debounce=200, step=50):
            yield self.reload(sorted({p for _c, p in changes}))
