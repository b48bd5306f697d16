"""The REPL's side of `--reload` and `/reload`: a thread watches the bot's files and loads
the bot again on each edit; the REPL takes the new bot between turns, so a turn always
runs on one bot from start to end. Diagnostics of an invalid edit are printed at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import click

from chatrun.engine.bot import Bot
from chatrun.engine.reload import BotReloader, Reload


class ReplReloader:
    def __init__(self, bot: Bot, echo: Callable[[str], None] | None = None):
        self.reloader = BotReloader(bot.config.path, bot)
        self.echo = echo or (lambda text: click.secho(text, fg="yellow", err=False))
        self._pending: Bot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Watch in the background until stop()."""
        self._thread = threading.Thread(target=self._watch, name="chatrun-reload", daemon=True)
        self._thread.start()
        self.echo(f"(watching {self.reloader.root} for changes)")

    def stop(self) -> None:
        self._stop.set()

    def reload_now(self) -> Reload:
        """/reload: load the bot's files again now."""
        return self._take(self.reloader.reload())

    def newest_bot(self) -> Bot:
        """The bot the next turn runs on: the last valid edit's, taken or not."""
        assert self.reloader.bot is not None  # made with the running bot
        return self.reloader.bot

    def take_new_bot(self) -> Bot | None:
        """The bot a valid edit produced since the last call, if any."""
        with self._lock:
            bot, self._pending = self._pending, None
        return bot

    def _watch(self) -> None:
        from watchfiles import watch

        for changes in watch(*self.reloader.roots(), watch_filter=lambda _c, p: self.reloader.relevant(p),
                             stop_event=self._stop, debounce=200, step=50, rust_timeout=500):
            self._take(self.reloader.reload(sorted({p for _c, p in changes})))

    def _take(self, outcome: Reload) -> Reload:
        if outcome.bot is not None:
            with self._lock:
                self._pending = outcome.bot
        self.echo(describe(outcome))
        return outcome


def describe(outcome: Reload) -> str:
    """What the author reads after a reload."""
    what = ", ".join(outcome.changed) if outcome.changed else "the bot's files"
    if outcome.bot is not None:
        warnings = "".join(f"\n  {d.format()}" for d in outcome.diagnostics)
        return f"[reloaded {outcome.bot.name}: {what}; the next turn uses it]{warnings}"
    lines = "".join(f"\n  {d.format()}" for d in outcome.diagnostics)
    return f"[{what} changed, but the bot is invalid; still running the previous version]{lines}"
