"""Follow-ups: a message the bot writes to the user later, unasked (a route's `follow_up:`;
docs/format.md, "Follow-ups").

The life of one, all in the session's snapshot (`follow_up`: {"due", "route", "since"}):
- **armed** by every committed turn that is not the sweeper's (`Expire`) and leaves the
  conversation on a route with `follow_up:`: due `after` the turn's instant (`since`, the user's
  last word); a turn that leaves it elsewhere, ends the conversation or hands it to an operator
  disarms it. So the user's next message always starts the silence again.
- **fired** by `Expire` (the server's sweeper finds it in the due index the stores keep,
  store/record.py `due_items`, and runs Expire as a system turn: lease, fencing, one commit):
  the message is rendered, shown as the turn's Message (so it reaches a channel through the
  session's `reply_to` and the outbox, and the history otherwise), kept in the route's memory
  (the model knows it reminded), and the follow-up is gone: it fires once per silence.
- **refused** on WhatsApp past the platform's 24-hour customer-service window (a business may
  write then only with a pre-approved template): unless the follow-up names a
  `whatsapp_template`, nothing is sent, a warning is logged and a `FollowUpRefused` backend
  event is recorded (sinks that take it get it).
- **refused** on the phone (a Twilio call's session, meta `call`): a call that is over cannot be
  written to, and a live call hears only its own turns; the same warning and `FollowUpRefused`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from chatrun import events as ev
from chatrun.engine.pending import TAKEOVER, format_time, parse_time, time_after
from chatrun.messages import AssistantMessage

if TYPE_CHECKING:
    from datetime import datetime

    from chatrun.definition.config import FollowUpConfig
    from chatrun.engine.context import TurnContext
    from chatrun.engine.conversation import Conversation

log = logging.getLogger("chatrun.follow_up")
WHATSAPP_SINK = "channel:whatsapp"  # the outbox sink of a WhatsApp conversation's replies (ChannelConfig.sink)
WHATSAPP_WINDOW = timedelta(hours=24)  # WhatsApp's customer-service window after the user's last message
REFUSED = "FollowUpRefused"  # the backend event of a follow-up the platform's rules do not allow
CALL = "call"  # a session's meta key: the phone call (Twilio's CallSid) the session is (server/channels/twilio.py)


def armed(c: Conversation, expired: bool) -> dict[str, Any] | None:
    """The follow-up a committed turn leaves: an Expire turn keeps what it has (fired: none)
    while the conversation stays on its route; every other turn arms the current route's anew."""
    if expired:
        kept = c.follow_up
        return kept if kept is not None and kept.get("route") == c.scope.route and not _with_operators(c) else None
    config = _config(c, c.scope.route)
    if config is None or c.ended or _with_operators(c):
        return None
    since = c.now()
    return {"due": time_after(since, timedelta(seconds=config.after)), "route": c.scope.route,
            "since": format_time(since)}


def is_due(c: Conversation, now: datetime) -> bool:
    due = (c.follow_up or {}).get("due")
    return isinstance(due, str) and parse_time(due) <= now


def _with_operators(c: Conversation) -> bool:
    """Whether the conversation is the operators': handed over (waiting for one) or taken. The bot
    is silent then (docs/format.md, "During a takeover (handed over or taken)")."""
    return c.taken_over is not None or any(item.kind == TAKEOVER for item in c.pending)


def fire(t: TurnContext, now: datetime) -> None:
    """Send the armed follow-up if it is due by `now`; either way a due one is gone after this
    turn (never due again: the sweeper does not come back for it). With an operator in the
    conversation nothing is sent: the bot is silent then."""
    c = t.c
    armed_now = c.follow_up
    if armed_now is None or not is_due(c, now):
        return
    c.follow_up = None  # once: whatever happens below, this silence has had its follow-up
    if _with_operators(c):
        return  # the operators have the conversation, or it waits for them: the bot says nothing (the release arms it again)
    route = str(armed_now.get("route"))
    config = _config(c, route)
    if config is None or route != c.scope.route:
        return  # the bot changed under it: nothing to say any more
    if c.meta.get(CALL):
        _refuse(t, config, route, "a phone call cannot be written to once it is over (and a live call hears only "
                "the answers to what the caller says), so follow-ups are not sent on the phone; the message is "
                "not sent (to remind a caller, use another channel, or say it before the call ends)")
        return
    hours = _past_whatsapp_window(c, armed_now, now)
    template = config.whatsapp_template if hours is not None else None
    if hours is not None and template is None:
        _refuse(t, config, route, f"WhatsApp allows free text only within 24 hours of the user's last message "
                f"({hours:.0f} hours ago); give route {route}'s follow_up a whatsapp_template (a template approved "
                "in WhatsApp Manager) or a shorter `after`")
        return
    text = t.render_template(config.message, "follow_up message", config.where)
    meta: dict[str, Any] = {"from": "follow_up", "route": route}
    if template is not None:
        meta["whatsapp_template"] = {"name": template[0], "language": template[1] or whatsapp_language(c.locale)}
    t.emit(ev.MESSAGE, text, meta=meta, audience=ev.USER)
    c.memory_for(c.scope, route).add(AssistantMessage(text))


def whatsapp_language(locale: str | None) -> str:
    """A template's language when the bot names none: the session's locale as WhatsApp spells
    its codes (pt-BR is pt_BR), `en` for a bot without `locales:`."""
    return locale.replace("-", "_") if locale else "en"


def _past_whatsapp_window(c: Conversation, armed_now: Mapping[str, Any], now: datetime) -> float | None:
    """How many hours the user has been silent when the session is a WhatsApp conversation past
    the platform's 24-hour window; None otherwise (free text is allowed)."""
    reply_to = c.meta.get("reply_to")
    if not isinstance(reply_to, Mapping) or reply_to.get("sink") != WHATSAPP_SINK:
        return None
    silence = now - parse_time(str(armed_now.get("since") or armed_now.get("due")))
    return silence.total_seconds() / 3600 if silence > WHATSAPP_WINDOW else None


def _refuse(t: TurnContext, config: FollowUpConfig, route: str, reason: str) -> None:
    """The platform would refuse the message now: nothing is sent; a log line and a backend event say why."""
    log.warning("session %s: follow-up of route %s (%s:%s) not sent: %s", t.c.id, route, config.where.file,
                config.where.line, reason)
    t.emit(REFUSED, {"route": route, "reason": reason}, audience=ev.BACKEND)


def _config(c: Conversation, route: str) -> FollowUpConfig | None:
    found = c.config.routes.get(route)
    return found.follow_up if found is not None else None
