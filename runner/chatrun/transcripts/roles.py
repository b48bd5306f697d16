"""Transcripts that declare no `roles:`: their bot's role-restricted routes are open in them
(role checks off). `chatrun test` and the pytest plugin say so once per run, naming them."""

from __future__ import annotations

from typing import Any

from chatrun.errors import ChatrunError
from chatrun.transcripts.format import Transcript
from chatrun.transcripts.setting import load_bot_cached


def roles_off(transcript: Transcript, bots: dict[str, Any] | None = None) -> bool:
    """The transcript gives no `roles:` (nor expects a refused start) though its bot has
    routes that need one: those routes are open in it."""
    if transcript.roles is not None or transcript.refused is not None:
        return False
    try:
        bot = load_bot_cached(str(transcript.bot_path), bots)
    except ChatrunError:  # the run reports it
        return False
    return any(route.roles for route in bot.config.routes.values())


def roles_off_note(names: list[str]) -> str | None:
    """The one line said at the end of a run, or None when every transcript declares roles."""
    off = list(dict.fromkeys(names))
    if not off:
        return None
    listed = ", ".join(off[:3]) + (f" and {len(off) - 3} more" if len(off) > 3 else "")
    return (f"note: role checks are off in {len(off)} transcript{'s' if len(off) != 1 else ''} with no `roles:` "
            f"whose bot has routes with `roles:` ({listed}); declare the principal's roles, e.g. "
            "`roles: []` or `roles: [staff]`")
