"""`chatrun serve --reload`: the server's bots follow their files.

One watcher per bot (chatrun.engine.reload). A valid edit replaces the registry's bot, so
the next request of every session runs on it (the registry hands each session the new bot
between turns, keeping its state, scopes and memories). An invalid edit is logged, the old
bot keeps serving, and the page's inspector shows the diagnostics as a banner (they ride
on the running bot: `Bot.reload_problems`, read by chatrun.server.inspect).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from chatrun.engine.reload import BotReloader, Reload

if TYPE_CHECKING:
    from chatrun.engine.bot import Bot
    from chatrun.server.sessions import SessionRegistry

log = logging.getLogger("chatrun.reload")


class Watchers:
    """The watcher tasks of a server, and the bots reloads replaced: their tools (HTTP
    connections, MCP servers) stay open while a turn may still run on them, until stop()."""

    def __init__(self, registry: SessionRegistry) -> None:
        self.registry = registry
        self.retired: list[Bot] = []
        self.tasks = [asyncio.create_task(self._watch(name), name=f"chatrun-reload-{name}")
                      for name in list(registry.bots)]

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for bot in self.retired:
            await bot.tools.aclose()
        self.retired.clear()

    async def _watch(self, name: str) -> None:
        bot = self.registry.bots[name]
        reloader = BotReloader(bot.config.path, bot)
        log.info("chatrun: watching %s for changes (bot %s)", reloader.root, name)
        async for outcome in reloader.watch():
            old = self.registry.bots[name]
            if apply(self.registry, name, outcome):
                self.retired.append(old)


def apply(registry: SessionRegistry, name: str, outcome: Reload) -> bool:
    """Serve the reloaded bot if it is valid (True), else log why not."""
    changed = ", ".join(outcome.changed) or "the bot's files"
    if outcome.bot is None:
        lines = "\n".join(d.format() for d in outcome.diagnostics)
        log.warning("chatrun: %s changed but bot %s is invalid; still serving the previous version\n%s",
                    changed, name, lines)
        return False
    registry.bots[name] = outcome.bot
    log.info("chatrun: reloaded bot %s (%s changed)", name, changed)
    return True
