"""A loaded bot: its validated config, its route graph, and the sessions it starts."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chatrun.definition.config import BotConfig
from chatrun.definition.graph import RouteGraph
from chatrun.engine.session import Session
from chatrun.engine.tools import Toolbox
from chatrun.errors import Diagnostic
from chatrun.models.base import ChatModel
from chatrun.store import SessionStore
from chatrun.store.blobs import BlobArea


class Bot:
    """Built once from a bot's YAML; cheap to start sessions from, safe to share."""

    def __init__(self, config: BotConfig, store: SessionStore | None = None):
        from chatrun.store.memory import InMemoryStore

        self.config = config
        self.name = config.name  # an attribute, not a property: read on every request a server serves
        self.graph = RouteGraph.from_config(config)
        self.store: SessionStore = store if store is not None else InMemoryStore()
        self.tools = Toolbox(config)
        # Set by `--reload` when the bot's files were edited into an invalid bot: this bot
        # keeps running, and clients (the inspector) show these diagnostics.
        self.reload_problems: list[Diagnostic] = []

    def session(
        self,
        route: str | None = None,
        store: SessionStore | None = None,
        model: ChatModel | None = None,
        session_id: str | None = None,
        state: dict[str, Any] | None = None,
        roles: set[str] | None = None,
        meta: dict[str, Any] | None = None,
        principal: Mapping[str, Any] | None = None,
        blobs: BlobArea | None = None,
    ) -> Session:
        """A new conversation (on `route`, else the default route), or, when `session_id` is in
        the store, that conversation resumed.

        store: where the session lives between turns (default: this bot's in-process store).
        model: answers every route (default: built from each route's model config).
        state: initial conversation state over the YAML's `state:` (new sessions only).
        roles: the principal's roles; routes with `roles:` need one of them (None: no checks).
        principal: who is signed in, as templates see it (`principal.name`, `principal.roles`,
            claims such as `principal.email`); its `roles` are the roles when `roles` is not given.
        """
        return Session(self, store if store is not None else self.store, model=model, session_id=session_id,
                       route=route, state=state, roles=roles, meta=meta, principal=principal, blobs=blobs)

    def __repr__(self) -> str:
        return f"<Bot {self.name!r} routes={list(self.config.routes)}>"


def load_bot(path: str | Path, store: SessionStore | None = None) -> Bot:
    """Load, validate and build a bot. Raises chatrun.BotError carrying every diagnostic."""
    from chatrun.definition.loader import load_config

    config, _warnings = load_config(str(path))
    return Bot(config, store)
