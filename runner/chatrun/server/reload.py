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
from chatrun.errors import ChatrunError

if TYPE_CHECKING:
    from chatrun.engine.bot import Bot
    from chatrun.server.sessions import SessionRegistry

log = logging.getLogger("chatrun.reload")


class Watchers:
    """The watcher tasks of a server, and the bots reloads replaced. A replaced bot's tools
    (HTTP connections, MCP servers) stay open while a session the server holds still runs on
    it (a cached session moves to the new bot when next used); once none does, they are
    closed, so an edit never leaves a server process behind. stop() closes the rest."""

    CHECK_EVERY_S = 1.0  # how often replaced bots are checked for sessions still on them

    def __init__(self, registry: SessionRegistry) -> None:
        self.registry = registry
        self.retired: list[Bot] = []
        self._retired_more = asyncio.Event()
        self.tasks = [asyncio.create_task(self._watch(name), name=f"chatrun-reload-{name}")
                      for name in list(registry.bots)]
        self.tasks.append(asyncio.create_task(self._close_unused_forever(), name="chatrun-reload-close"))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for bot in self.retired:
            await bot.tools.aclose()
        self.retired.clear()

    async def close_unused(self) -> int:
        """Close the tools of the replaced bots no session runs on any more; how many."""
        in_use = self.registry.bots_in_use() | {id(bot) for bot in self.registry.shelf.all_bots()}
        unused = [bot for bot in self.retired if id(bot) not in in_use]
        self.retired = [bot for bot in self.retired if id(bot) in in_use]
        for bot in unused:
            try:
                await bot.tools.aclose()
            except Exception as exc:  # noqa: BLE001 - a tool that fails to close must not stop the server
                log.warning("chatrun: closing the tools of a replaced %s bot failed: %s", bot.name, exc)
        return len(unused)

    async def _close_unused_forever(self) -> None:
        while True:
            if not self.retired:
                await self._retired_more.wait()
                self._retired_more.clear()
            if await self.close_unused() == 0 and self.retired:
                await asyncio.sleep(self.CHECK_EVERY_S)

    async def _watch(self, name: str) -> None:
        bot = self.registry.bots[name]
        reloader = BotReloader(bot.config.path, bot)
        log.info("chatrun: watching %s for changes (bot %s)", reloader.root, name)
        async for outcome in reloader.watch():
            old = self.registry.bots[name]
            if apply(self.registry, name, outcome):
                self.retired.append(old)
                self._retired_more.set()
                version = self.registry.shelf.bots[name].of(self.registry.bots[name])
                if version is not None:  # other replicas may need it for the sessions it runs
                    try:
                        await self.registry.shelf.publish_one(name, version)
                    except ChatrunError as exc:  # over the bundle size limit: served here, not published
                        log.warning("chatrun: the new version of bot %s is served but not published to the "
                                    "store: %s", name, exc)


def apply(registry: SessionRegistry, name: str, outcome: Reload) -> bool:
    """Serve the reloaded bot if it is valid (True), else log why not."""
    changed = ", ".join(outcome.changed) or "the bot's files"
    if outcome.bot is None:
        lines = "\n".join(d.format() for d in outcome.diagnostics)
        log.warning("chatrun: %s changed but bot %s is invalid; still serving the previous version\n%s",
                    changed, name, lines)
        return False
    registry.serve_new_version(outcome.bot)
    log.info("chatrun: reloaded bot %s (%s changed)", name, changed)
    return True
