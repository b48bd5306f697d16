"""`/metrics`: what the server is doing, in Prometheus' text format (prometheus-client,
`pip install 'chatrun[metrics]'`). docs/observability.md lists every metric.

Each app has its own CollectorRegistry (never the process-wide default), so two apps in one
process (tests, an embedding program) count separately; each also carries the process and
Python collectors (`process_*`, `python_*`), as a default registry would. Counters and
histograms have no `_created` series (a timestamp per series that Prometheus does not read
and that doubles what a scrape stores). Model and tool calls are measured
by the engine (chatrun.engine.observe) and reported to the TurnObserver the session registry
installs for the turn. Without prometheus-client `ServerMetrics.create()` is None and nothing
is measured; `/metrics` then answers 501 saying what to install.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

try:
    import prometheus_client as _prom
except ImportError:  # the optional extra is not installed: no metrics, no cost
    _prom = None  # type: ignore[assignment]  # None says "off"

from chatrun.engine.observe import ModelCallMeasure

if TYPE_CHECKING:
    from chatrun.server.sessions import SessionRegistry

# The OpenTelemetry GenAI semantic conventions' explicit bucket boundaries (v1.37).
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
# A turn is several model calls and tools; waiting for a session is usually nothing.
TURN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60)
# A person decides in seconds to days.
DECISION_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 86400, 7 * 86400)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MISSING = "/metrics needs prometheus-client: pip install 'chatrun[metrics]'"


def available() -> bool:
    return _prom is not None


class ServerMetrics:
    """The metrics of one app."""

    @classmethod
    def create(cls, registry: SessionRegistry) -> ServerMetrics | None:
        return cls(registry) if _prom is not None else None

    def __init__(self, sessions: SessionRegistry):
        prom = _prom
        prom.disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client; process-wide
        self.registry = reg = prom.CollectorRegistry()
        prom.ProcessCollector(registry=reg)
        prom.PlatformCollector(registry=reg)
        prom.GCCollector(registry=reg)
        self._children: dict[tuple[Any, ...], Any] = {}
        self._pending_seen: set[tuple[str, str]] = set()
        self.turns = prom.Counter("chatrun_turns", "Turns served, by the route they started on and how they ended",
                                  ["bot", "route", "outcome"], registry=reg)
        self.turn_seconds = prom.Histogram("chatrun_turn_duration_seconds", "Time a turn took, commit included",
                                           ["bot", "outcome"], buckets=TURN_BUCKETS, registry=reg)
        self._model_metrics(prom, reg)
        # Per bot version (docs/versions.md, "Canaries"): compare a canary with the version it may replace.
        self.version_turns = prom.Counter("chatrun_version_turns", "Turns served, by the bot version that ran them "
                                          "and how they ended", ["bot", "bot_version", "outcome"], registry=reg)
        self.version_cost = prom.Counter("chatrun_version_cost", "Cost of the turns of each bot version, in the "
                                         "units of the bot's `prices:`", ["bot", "bot_version"], registry=reg)
        # Stored bot versions this replica would not load (server/bundles.py): a forged or unsigned
        # bundle, or a fleet whose replicas do not share the bundle key.
        self.bundles_refused = prom.Counter("chatrun_bundles_refused", "Bot versions in the store this replica "
                                            "refused to load, by reason (no_key, unsigned, bad_signature, "
                                            "too_large, starts_program)", ["bot", "reason"], registry=reg)
        self.feedback = prom.Counter("chatrun_feedback", "Ratings of bot replies by their users (thumbs up/down), "
                                     "by the route the rated turn ran on", ["bot", "route", "rating"], registry=reg)
        self.outcomes = prom.Counter("chatrun_outcomes", "Conversations' outcomes as the bot's `outcomes:` name them, "
                                     "each counted once, when recorded", ["bot", "outcome", "version"], registry=reg)
        self.tool_calls = prom.Counter("chatrun_tool_calls", "Tool calls run", ["bot", "tool"], registry=reg)
        self.guardrails = prom.Counter("chatrun_guardrail", "Guardrails that matched (docs/guardrails.md), by "
                                       "stage, kind and what they did", ["bot", "stage", "kind", "outcome"],
                                       registry=reg)
        self.tool_failures = prom.Counter("chatrun_tool_failures",
                                          "Tool calls that did not do their work (refused, failed, unknown tool)",
                                          ["bot", "tool"], registry=reg)
        self.tool_seconds = prom.Histogram("chatrun_tool_duration_seconds", "Time a tool call took",
                                           ["bot", "tool"], buckets=DURATION_BUCKETS, registry=reg)
        self.websockets = prom.Gauge("chatrun_websocket_connections", "Open WebSocket connections", registry=reg)
        self.wait_seconds = prom.Histogram(
            "chatrun_session_wait_seconds", "Time a request waited for its session (the per-session lock / lease)",
            ["bot"], buckets=WAIT_BUCKETS, registry=reg)
        self._outbox_metrics(prom, reg)
        self._pending_metrics(prom, reg)
        prom.Gauge("chatrun_live_sessions", "Sessions held in memory", registry=reg).set_function(
            sessions.live_count)
        prom.Gauge("chatrun_session_requests_waiting", "Requests waiting for a session held by another request",
                   registry=reg).set_function(lambda: sessions.waiting)
        prom.Gauge("chatrun_session_requests_active", "Requests holding a session",
                   registry=reg).set_function(lambda: sessions.active)

    def _model_metrics(self, prom: Any, reg: Any) -> None:
        model = ["bot", "gen_ai_provider_name", "gen_ai_request_model"]
        self.call_seconds = prom.Histogram(
            "gen_ai_client_operation_duration_seconds", "Duration of a model call (GenAI semantic conventions)",
            ["gen_ai_operation_name", *model, "error_type"], buckets=DURATION_BUCKETS, registry=reg)
        self.first_chunk = prom.Histogram(
            "chatrun_model_time_to_first_chunk_seconds", "Time from a streamed model call to its first chunk",
            model, buckets=DURATION_BUCKETS, registry=reg)
        self.tokens = prom.Histogram(
            "gen_ai_client_token_usage", "Tokens used per model call (GenAI semantic conventions)",
            ["gen_ai_operation_name", *model, "gen_ai_token_type"], buckets=TOKEN_BUCKETS, registry=reg)
        # What providers' prompt caches served (issue 38, docs/models.md "Stable prompts"): compare
        # with the input tokens of gen_ai_client_token_usage for the share of prompts cached.
        self.cached_tokens = prom.Counter("chatrun_model_cached_input_tokens", "Input tokens the provider "
                                          "reported served from its prompt cache", model, registry=reg)
        self.cost = prom.Counter("chatrun_cost", "Cost of the model calls, in the units of the bot's `prices:`",
                                 ["bot", "gen_ai_request_model"], registry=reg)
        # A killed process's attempt (store/billing.py): its calls, counted by the commit that takes it up.
        self.unfinished_attempts = prom.Counter("chatrun_unfinished_attempts", "Attempts of a turn whose process "
                                                "ended after paid model calls and before the commit, counted by "
                                                "the commit of the session's next attempt", ["bot"], registry=reg)
        self.unfinished_tokens = prom.Counter("chatrun_unfinished_tokens", "Tokens of the model calls of those "
                                              "attempts (not in gen_ai_client_token_usage)",
                                              ["bot", "gen_ai_request_model", "gen_ai_token_type"], registry=reg)
        self.unfinished_cost = prom.Counter("chatrun_unfinished_cost", "Cost of the model calls of those attempts "
                                            "(not in chatrun_cost), in the units of the bot's `prices:`",
                                            ["bot", "gen_ai_request_model"], registry=reg)
        self.fallbacks = prom.Counter("chatrun_model_fallbacks", "Model calls moved to the next model of "
                                      "`model.fallback:`, by the model that could not answer, the one asked "
                                      "next and why (quota, overload, timeout, outage, breaker_open)",
                                      ["bot", "from", "to", "reason"], registry=reg)

    def _outbox_metrics(self, prom: Any, reg: Any) -> None:
        sink = ["bot", "sink"]
        self.deliveries = prom.Counter("chatrun_outbox_deliveries",
                                       "Delivery attempts of backend events to sinks, by outcome "
                                       "(delivered, retry: failed and due again, dead: failed for good)",
                                       [*sink, "outcome"], registry=reg)
        self.delivery_seconds = prom.Histogram("chatrun_outbox_delivery_duration_seconds",
                                               "Time a delivery attempt took", sink, buckets=DURATION_BUCKETS,
                                               registry=reg)
        self.outbox_depth = prom.Gauge("chatrun_outbox_entries", "Outbox entries, by state (pending, dead)",
                                       ["state"], registry=reg)
        self.outbox_age = prom.Gauge("chatrun_outbox_oldest_pending_age_seconds",
                                     "Age of the oldest pending outbox entry (0: none)", registry=reg)
        self.unserved_entries = prom.Gauge("chatrun_outbox_unserved_entries",
                                           "Pending outbox entries long overdue whose bot or sink this replica "
                                           "does not serve (no replica seems to), by bot and sink", sink,
                                           registry=reg)
        self._unserved_seen: set[tuple[str, str]] = set()

    def _pending_metrics(self, prom: Any, reg: Any) -> None:
        self.pending_items = prom.Gauge("chatrun_pending_items",
                                        "Open pending items (approvals, questions, takeovers), by bot and kind, "
                                        "as the store lists them (measured by the sweeper)", ["bot", "kind"],
                                        registry=reg)
        self.pending_oldest = prom.Gauge("chatrun_pending_oldest_age_seconds",
                                         "Age of the oldest open pending item, by bot and kind", ["bot", "kind"],
                                         registry=reg)
        self.decisions = prom.Counter("chatrun_pending_decisions",
                                      "Pending items resolved, by outcome (approved, edited, rejected, timed_out, "
                                      "answered, released, taken)", ["bot", "kind", "outcome"], registry=reg)
        self.decision_seconds = prom.Histogram("chatrun_pending_decision_seconds",
                                               "Time from a pending item's creation to its resolution",
                                               ["bot", "kind"], buckets=DECISION_BUCKETS, registry=reg)

    def decided(self, bot: str, kind: str, outcome: str, seconds: float | None) -> None:
        """A committed turn resolved an item (seconds: how long it waited, when known)."""
        self.child(self.decisions, bot, kind, outcome).inc()
        if seconds is not None:
            self.child(self.decision_seconds, bot, kind).observe(max(0.0, seconds))

    def pending_state(self, counts: dict[tuple[str, str], tuple[int, float]]) -> None:
        """(bot, kind) -> (open items, the oldest's age): the whole picture, so kinds that no
        longer wait drop to 0."""
        for labels in set(self._pending_seen) - set(counts):
            self.pending_items.labels(*labels).set(0)
            self.pending_oldest.labels(*labels).set(0)
        for labels, (count, oldest) in counts.items():
            self.pending_items.labels(*labels).set(count)
            self.pending_oldest.labels(*labels).set(oldest)
        self._pending_seen = set(counts) | set(self._pending_seen)

    def delivered(self, bot: str, sink: str, outcome: str, seconds: float) -> None:
        """One delivery attempt: outcome "delivered", "retry" or "dead"."""
        self.child(self.deliveries, bot, sink, outcome).inc()
        self.child(self.delivery_seconds, bot, sink).observe(seconds)

    def outbox_state(self, pending: int, dead: int, oldest_age: float) -> None:
        self.outbox_depth.labels("pending").set(pending)
        self.outbox_depth.labels("dead").set(dead)
        self.outbox_age.set(oldest_age)

    def outbox_unserved(self, counts: dict[tuple[str, str], int]) -> None:
        """(bot, sink) -> long-overdue entries no replica claims: the whole picture (others drop to 0)."""
        for labels in self._unserved_seen - set(counts):
            self.unserved_entries.labels(*labels).set(0)
        for labels, count in counts.items():
            self.unserved_entries.labels(*labels).set(count)
        self._unserved_seen |= set(counts)

    def child(self, metric: Any, *labels: str) -> Any:
        """metric.labels(*labels), remembered: a turn reports a dozen measurements, and
        prometheus-client's own lookup (validating the labels each time) is most of their cost."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def render(self) -> bytes:
        return bytes(_prom.generate_latest(self.registry))

    def turn_observer(self, bot: str) -> TurnObserver:
        return TurnObserver(self, bot)

    def turn_done(self, bot: str, route: str, outcome: str, seconds: float) -> None:
        self.child(self.turns, bot, route, outcome).inc()
        self.child(self.turn_seconds, bot, outcome).observe(seconds)

    def version_turn_done(self, bot: str, version: str, outcome: str, cost: float | None) -> None:
        self.child(self.version_turns, bot, version, outcome).inc()
        if cost:
            self.child(self.version_cost, bot, version).inc(cost)

    def unfinished_counted(self, bot: str, attempts: list[dict[str, Any]]) -> None:
        """A commit landed that counted the session's earlier attempts that never committed (a
        killed process's, as the history records them: store/billing.py `failed_entry`): their
        calls, by model, into the unfinished counters, and their cost into the version's (the
        one its usage record names; a record written before records named it counts for none)."""
        for attempt in attempts:
            self.child(self.unfinished_attempts, bot).inc()
            usage = attempt.get("usage")
            cost = usage.get("cost") if isinstance(usage, dict) else None
            if attempt.get("version") and isinstance(cost, (int, float)) and cost:
                self.child(self.version_cost, bot, str(attempt["version"])).inc(float(cost))
            for call in _calls(usage if isinstance(usage, dict) else {}):
                model = str(call.get("model") or "")
                for kind, key in (("input", "input_tokens"), ("output", "output_tokens")):
                    if call.get(key):
                        self.child(self.unfinished_tokens, bot, model, kind).inc(int(call[key]))
                if call.get("cost"):
                    self.child(self.unfinished_cost, bot, model).inc(float(call["cost"]))

    def feedback_given(self, bot: str, route: str, rating: str) -> None:
        self.child(self.feedback, bot, route, rating).inc()

    def outcome_recorded(self, bot: str, outcome: str, version: str) -> None:
        self.child(self.outcomes, bot, outcome, version).inc()

    def bundle_refused(self, bot: str, reason: str) -> None:
        self.child(self.bundles_refused, bot, reason).inc()

    def waited(self, bot: str, seconds: float) -> None:
        self.child(self.wait_seconds, bot).observe(seconds)

    @contextlib.contextmanager
    def websocket(self) -> Iterator[None]:
        self.websockets.inc()
        try:
            yield
        finally:
            self.websockets.dec()


def _calls(usage: dict[str, Any]) -> list[dict[str, Any]]:
    """An attempt's model calls (its usage's `by_call`); the usage itself, by no model, without one."""
    calls = usage.get("by_call")
    if isinstance(calls, list):
        return [call for call in calls if isinstance(call, dict)]
    return [usage] if usage else []


class TurnObserver:
    """What the engine reports during one turn of `bot` (chatrun.engine.observe.Observer)."""

    def __init__(self, metrics: ServerMetrics, bot: str):
        self.m, self.bot = metrics, bot

    def model_call(self, measure: ModelCallMeasure) -> None:
        m = self.m
        m.child(m.call_seconds, "chat", self.bot, measure.provider, measure.model,
                measure.error or "").observe(measure.seconds)
        if measure.first_chunk_seconds is not None:
            m.child(m.first_chunk, self.bot, measure.provider, measure.model).observe(measure.first_chunk_seconds)

    def model_usage(self, provider: str, model: str, usage: dict[str, Any]) -> None:
        m = self.m
        for kind, key in (("input", "input_tokens"), ("output", "output_tokens")):
            m.child(m.tokens, "chat", self.bot, provider, model, kind).observe(int(usage.get(key) or 0))
        if usage.get("cached_input_tokens"):
            m.child(m.cached_tokens, self.bot, provider, model).inc(int(usage["cached_input_tokens"]))
        if usage.get("cost") is not None:
            m.child(m.cost, self.bot, model).inc(float(usage["cost"]))

    def model_fallback(self, from_model: str, to_model: str, reason: str) -> None:
        self.m.child(self.m.fallbacks, self.bot, from_model, to_model, reason).inc()

    def tool_call(self, tool: str, seconds: float, failed: bool) -> None:
        m = self.m
        m.child(m.tool_calls, self.bot, tool).inc()
        m.child(m.tool_seconds, self.bot, tool).observe(seconds)
        if failed:
            m.child(m.tool_failures, self.bot, tool).inc()

    def guardrail(self, stage: str, kind: str, outcome: str) -> None:
        m = self.m
        m.child(m.guardrails, self.bot, stage, kind, outcome).inc()
