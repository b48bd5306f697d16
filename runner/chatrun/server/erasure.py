"""Erasure of one principal over HTTP: `DELETE /principals/{principal}` (docs/deploy.md, "Erasing
a person's data"; docs/security.md); and a user's own view of what a bot remembers of them:
`GET`/`DELETE /bots/{bot}/user-memory`, `DELETE /bots/{bot}/user-memory/{fact}` (docs/memory.md,
"User memory").

Deletes everything stored of the principal (store/retention.py `erase_principal`): every
session it owns, with its history, files, records and open pending items; its dead letters;
and its backend events not yet delivered where its bot says `retention: {erased_outbox: drop}`
(else they are delivered, then deleted as every delivered entry is). Answers what it deleted:

    {"principal": "ana", "dry_run": false,
     "erased": {"sessions": 2, "files": 1, "dead_letters": 0, "outbox": 0, "user_memory": 1, "busy": []}}

With auth on, only principals with the role `privacy` may erase (a person asks the operator,
who erases for them: a user's own token cannot, so a stolen one cannot wipe its traces). A
session running a turn right now is left and named in `busy`: send the request again.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter

from chatrun.definition.config import SUMMARY_FACT, Retention
from chatrun.server import wire
from chatrun.server.auth import Principal
from chatrun.server.http import ERROR_RESPONSES
from chatrun.server.plumbing import Caller, Registry
from chatrun.store import user_memory
from chatrun.store.aio import scrub
from chatrun.store.retention import erase_principal

PRIVACY_ROLE = "privacy"  # with auth on, only principals with this role erase others' data


def make_erasure_router() -> APIRouter:
    router = APIRouter(responses=ERROR_RESPONSES, tags=["privacy"])
    router.add_api_route("/principals/{principal}", erase, methods=["DELETE"])
    router.add_api_route("/bots/{bot}/user-memory", list_user_memory, methods=["GET"])
    router.add_api_route("/bots/{bot}/user-memory", erase_user_memory, methods=["DELETE"])
    router.add_api_route("/bots/{bot}/user-memory/{fact}", erase_user_fact, methods=["DELETE"])
    return router


async def erase(principal: str, who: Caller, registry: Registry, dry_run: bool = False) -> Any:
    """Delete everything stored of `principal`; `dry_run`: only count it."""
    _allowed(who)

    def retention_of(bot: str | None) -> Retention:
        served = registry.bots.get(bot) if bot is not None else None
        return served.config.retention if served is not None else Retention()

    counts = await erase_principal(registry.store, principal, retention_of, registry.erase, registry.blobs, dry_run)
    return {"principal": principal, "dry_run": dry_run, "erased": counts.to_json()}


async def list_user_memory(bot: str, who: Caller, registry: Registry) -> Any:
    """What `bot` keeps of the caller across conversations (`user_memory:`): each fact, its
    value and when it was written (epoch seconds); the summary written at a conversation's end
    (`user_memory.summary:`) is the fact `summary`, marked `"summary": true`."""
    name, keep = _own_memory(bot, who, registry)
    facts = await user_memory.alist(registry.store, bot, name, keep, time.time())
    declared = registry.bot(bot).config.user_memory
    if declared is not None and declared.summary is not None:
        facts = [{**f, "summary": True} if f["fact"] == SUMMARY_FACT else f for f in facts]
    return {"bot": bot, "principal": name, "facts": facts}


async def erase_user_memory(bot: str, who: Caller, registry: Registry) -> Any:
    """Delete everything `bot` keeps of the caller; answers how many facts went."""
    name, _ = _own_memory(bot, who, registry)
    erased = await user_memory.aerase(registry.store, bot, name)
    await scrub(registry.store)
    return {"bot": bot, "principal": name, "erased": erased}


async def erase_user_fact(bot: str, fact: str, who: Caller, registry: Registry) -> Any:
    """Delete one fact `bot` keeps of the caller (the summary too: `summary`); `erased`: 1, or 0
    when it kept no such fact."""
    name, keep = _own_memory(bot, who, registry)
    erased = await user_memory.aforget(registry.store, bot, name, fact, keep, time.time())
    await scrub(registry.store)
    return {"bot": bot, "principal": name, "fact": fact, "erased": erased}


def _own_memory(bot: str, who: Principal | None, registry: Registry) -> tuple[str, float | None]:
    """The caller's own name and the bot's `retention.user_memory`: a user reads and erases only
    what is kept of themselves, so there must be someone signed in."""
    retention = registry.bot(bot).config.retention  # 404 for an unknown bot
    if who is None:
        raise wire.RequestFailed(wire.FORBIDDEN, "user memory is kept per signed-in principal: this server runs "
                                                 "without --auth, so there is no one to list or erase it for")
    return who.name, retention.user_memory


def _allowed(who: Principal | None) -> None:
    if who is not None and PRIVACY_ROLE not in who.roles:
        raise wire.RequestFailed(wire.FORBIDDEN, f"erasing a principal's data is for principals with the role "
                                                 f"`{PRIVACY_ROLE}`")
