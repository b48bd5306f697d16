"""One structured log line per turn the server runs (logger `chatrun.turns`, level INFO).

    INFO:     chatrun.turns: turn session=4f2a bot=travel turn=3 route=main_menu->flight outcome=ok
              duration_ms=812 input_tokens=220 output_tokens=15 cost=4.2e-05 calls=2 request_id=r-17

`chatrun serve --log-format json` writes the same fields as one JSON object per line
(JsonFormatter, for every `chatrun.*` logger). The user's message and the bot's replies are
logged only when asked (`--log-content`), redacted by the bot's `storage` guardrails as the
history keeps them; an author's failure detail stays in the engine's
own log line. Outcomes: ok, failed (rolled back), cancelled, replayed (a retried request id:
nothing ran), conflict (not committed: the session changed meanwhile), refused (the session
cannot take a message, e.g. it ended), error (the store failed, or a bug).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from chatrun import events as ev
from chatrun.engine import guardrails, observe, tracing
from chatrun.engine.pending import DECISION_TYPES, decision_entry
from chatrun.errors import SessionError

if TYPE_CHECKING:
    from chatrun.engine.session import Session
    from chatrun.server.metrics import ServerMetrics

log = logging.getLogger("chatrun.turns")

OK, FAILED, CANCELLED, REPLAYED, CONFLICT, REFUSED, ERROR = (
    "ok", "failed", "cancelled", "replayed", "conflict", "refused", "error")


class TurnReport:
    """Measures one request's turn, then logs it and counts it (TurnRun uses it)."""

    def __init__(self, session: Session, request_id: str | None, metrics: ServerMetrics | None,
                 content: bool, message: Any):
        self.session, self.request_id, self.metrics, self.content = session, request_id, metrics, content
        self.bot = session.bot.name
        self.route = session.route
        self.started = time.perf_counter()
        self.message = message
        self.replies: list[str] = []
        self.outcome = ERROR
        self.turn = 0
        self.number = session.turn_count + 1  # the number the turn will have, if it runs
        self.entry: dict[str, Any] = {}
        self.waiting = {item.id: item.created for item in session.pending}  # what a Resolved may resolve
        self.opened: list[str] = []  # the items this turn opened ("p1:approval")
        self.resolved: list[dict[str, Any]] = []  # the Resolved events' data
        self.outcomes: list[str] = []  # the outcome this turn recorded (engine/outcomes.py), if any

    def observing(self) -> Any:
        """The block the turn runs in: the engine reports its model and tool calls to the metrics."""
        return observe.observing(self.metrics.turn_observer(self.bot) if self.metrics is not None else None)

    def saw(self, event: ev.Event) -> None:
        if self.content and event.type == ev.MESSAGE:
            self.replies.append(str(event.data))
        elif event.type == ev.PENDING and isinstance(event.data, dict) and event.for_user:
            self.opened.append(f"{event.data.get('id')}:{event.data.get('kind')}")
            tracing.pending_noted("pending", event.data)
        elif event.type == ev.RESOLVED and isinstance(event.data, dict):
            self.resolved.append(event.data)
            tracing.pending_noted("resolved", event.data)
        elif event.type == ev.OUTCOME and isinstance(event.data, dict):
            self.outcomes.append(str(event.data.get("name")))

    def ran(self) -> None:
        """The engine finished the turn: ok, failed or cancelled, as its history entry says."""
        self.entry = self.session.last_turn or {}
        self.turn = int(self.entry.get("turn") or 0)
        error = self.entry.get("error")
        self.outcome = OK if self.entry.get("ok") else CANCELLED if error == "cancelled" else FAILED

    def stopped(self) -> None:
        """The turn was stopped (cancelled, or its reader went): when the engine recorded it (ok
        false, error cancelled), its number and usage are reported as a failed turn's are."""
        self.outcome = CANCELLED
        try:
            entry = self.session.last_turn or {}
        except SessionError:  # stopped before it started: no record
            return
        if not self.entry and entry.get("turn") == self.number and entry.get("error") == "cancelled":
            self.entry, self.turn = entry, self.number

    def committed(self, unfinished: list[dict[str, Any]]) -> None:
        """The turn's commit (or its failed or stopped record's) landed, counting `unfinished`: the
        session's earlier attempts that never committed (Session.unfinished_counted). Counted here,
        once the store has them: a commit that does not land counts nothing, and the attempt
        that counts them next (which reads them again) is the one that counts them."""
        if self.metrics is not None and unfinished:
            self.metrics.unfinished_counted(self.bot, unfinished)

    def replayed(self, recorded: dict[str, Any]) -> None:
        self.outcome, self.turn = REPLAYED, int(recorded.get("turn") or 0)

    def finish(self) -> None:
        seconds = time.perf_counter() - self.started
        if self.metrics is not None:
            self.metrics.turn_done(self.bot, self.route, self.outcome, seconds)
            if self.outcome == OK:  # a rolled-back decision decided nothing
                for done in self.resolved:
                    self.metrics.decided(self.bot, str(done.get("kind")), str(done.get("outcome")),
                                         self._waited(done.get("id")))
                for name in self.outcomes:  # committed with the turn: counted once, by the replica that ran it
                    self.metrics.outcome_recorded(self.bot, name, self.session.bot_version)
            cost = (self.entry.get("usage") or {}).get("cost")
            self.metrics.version_turn_done(self.bot, self.session.bot_version, self.outcome, cost)
        if log.isEnabledFor(logging.INFO):
            fields = self.fields(seconds)
            log.info("turn %s", plain(fields), extra={"chatrun": fields})

    def _waited(self, item: Any) -> float | None:
        """Seconds from the item's creation to now (None: it was not open when the turn began)."""
        created = self.waiting.get(item)
        if not isinstance(created, str):
            return None
        try:
            return time.time() - datetime.fromisoformat(created).timestamp()
        except ValueError:
            return None

    def _given(self) -> Any:
        """The input as the history keeps it (a decision as plain JSON, without a backend's token);
        a turn that did not run (replayed, refused): the request's, in the same form."""
        if "input" in self.entry:
            return self.entry["input"]
        message = self.message
        if isinstance(message, DECISION_TYPES):
            return decision_entry(message)
        return message.get("userMessage") if isinstance(message, dict) else message

    def fields(self, seconds: float) -> dict[str, Any]:
        usage = self.entry.get("usage") or {}
        after = self.session.route if self.outcome == OK else self.route
        fields: dict[str, Any] = {
            "session": self.session.id, "bot": self.bot, "turn": self.turn or None,
            "route": self.route, "route_after": after, "outcome": self.outcome,
            "duration_ms": round(seconds * 1000, 1),
            "input_tokens": usage.get("input_tokens"), "output_tokens": usage.get("output_tokens"),
            "cost": usage.get("cost"), "calls": usage.get("calls"),
            "estimated": usage.get("estimated") or None, "request_id": self.request_id,
            # humans in the loop: the items this turn opened, and those it resolved (id:outcome)
            "pending": ",".join(self.opened) or None,
            "resolved": ",".join(f"{r.get('id')}:{r.get('outcome')}" for r in self.resolved) or None,
            "bot_version": self.session.bot_version,
        }
        if self.content:
            # A log keeps what it holds: on a bot with `storage` guardrails, as the history keeps it.
            fields["input"], fields["reply"] = guardrails.kept_value(self.session.bot.config, [self.route, after],
                                                                     [self._given(), "\n".join(self.replies)])
        return {k: v for k, v in fields.items() if v is not None}


def plain(fields: dict[str, Any]) -> str:
    """key=value pairs; a value with spaces or quotes is JSON-quoted; route before->after."""
    parts = []
    for key, value in fields.items():
        if key == "route_after":
            continue
        if key == "route" and fields.get("route_after") not in (None, value):
            value = f"{value}->{fields['route_after']}"
        text = value if isinstance(value, str) else json.dumps(value)
        if isinstance(value, str) and (not value or any(c in value for c in ' "=\n\t\\')):
            text = json.dumps(value, ensure_ascii=False)
        parts.append(f"{key}={text}")
    return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, and a turn line's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
        }
        fields = getattr(record, "chatrun", None)
        if isinstance(fields, dict):
            out["event"] = "turn"
            out.update(fields)
        else:
            out["message"] = record.getMessage()
            if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
                client, method, path, _version, status = record.args  # uvicorn's access record
                out.update(event="request", client=client, method=method, path=path, status=status)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)
