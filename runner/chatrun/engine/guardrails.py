"""Guardrails (issue 37, docs/guardrails.md): the one place the engine checks what goes in,
what comes back and what is kept, against a bot's and a route's `guardrails:`.

Four stages, each checked at the one spot its text passes through:
- `input`: the user's message as the turn starts (engine/turn.py `Turn.run`), before a model reads it;
- `tool_result`: a call's reply, in the call path's `run_tool` (engine/call.py), before the model reads it;
- `output`: the model's answer as it comes back (engine/turn.py `ask_model`); streamed chunks pass
  through `OutputHold`, the turn's chunk sender, so no client of any door sees a chunk before it
  is checked (held whole, or released a checked sentence at a time);
- `storage`: the turn's history entry and changed memories as they are committed (engine/session.py).

The detectors are hand-written (`find`): regular expressions for patterns and emails, digits with
the Luhn check for card numbers, the mod-97 check for IBANs; a guard costs microseconds a turn.
Two kinds judge a whole text: `languages` (offline, engine/language_id.py, about 0.1 ms) and
`moderation` (the route's endpoint's `/moderations`, a round trip: `Guardrails.screen` asks it
after the local guards, on the text as they redacted it, and only if none of them stopped it).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from chatrun import events as ev
from chatrun.definition import languages, secret_forms
from chatrun.definition.config import BotConfig, GuardrailConfig
from chatrun.engine import language_id, observe, pausing
from chatrun.engine.context import TurnContext
from chatrun.engine.pending import OPERATOR_ROLE, TAKEOVER, USER_ROLE, Answer
from chatrun.errors import ModelError
from chatrun.messages import (
    AssistantMessage,
    Attachment,
    Message,
    SummaryMessage,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

log = logging.getLogger("chatrun.engine")

# The event of a guardrail that matched: {name, stage, kind, outcome, route, found}
GUARDRAIL = ev.GUARDRAIL

# -- the detectors --------------------------------------------------------------------------

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# 13 to 19 digits, maybe grouped by single spaces or dashes (4111 1111 1111 1111, 4111-1111-...).
_CARD = re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])")
# A country, two check digits, then 11 to 30 letters or digits, maybe in groups of four.
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}\d{2}(?: ?[A-Za-z0-9]){11,30}(?![A-Za-z0-9])")
# An international number (+41 44 668 18 00) or a grouped national one (044 668 18 00, (555) 123-4567).
_PHONE = re.compile(r"(?<![\w+])(?:\+\d[\d ().-]{6,18}\d|\(?\d{2,5}\)?[ .-]\d[\d .-]{4,14}\d)(?![\w])")


def luhn(digits: str) -> bool:
    """The Luhn check every card number passes (a mistyped digit fails it)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def iban_valid(text: str) -> bool:
    """ISO 13616's check: the country and check digits moved to the end, letters as 10..35, mod 97 == 1."""
    s = text.replace(" ", "").upper()
    moved = s[4:] + s[:4]
    return int("".join(str(int(ch, 36)) for ch in moved)) % 97 == 1


def _cards(text: str) -> Iterable[tuple[int, int]]:
    for m in _CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and luhn(digits):
            yield m.span()


def _ibans(text: str) -> Iterable[tuple[int, int]]:
    for m in _IBAN.finditer(text):
        candidate = m.group()
        while True:  # the pattern may run on into the next words ("... 7654 32 ok"): shorter, by groups
            if len(candidate.replace(" ", "")) >= 15 and iban_valid(candidate):
                yield m.start(), m.start() + len(candidate)
                break
            cut = candidate.rfind(" ")
            if cut <= 4:
                break
            candidate = candidate[:cut]


def _phones(text: str) -> Iterable[tuple[int, int]]:
    for m in _PHONE.finditer(text):
        if 8 <= sum(ch.isdigit() for ch in m.group()) <= 15:
            yield m.span()


def _emails(text: str) -> Iterable[tuple[int, int]]:
    return (m.span() for m in _EMAIL.finditer(text))


# In this order: an IBAN's or a card's digits are not also a phone number.
PII_DETECTORS: dict[str, Callable[[str], Iterable[tuple[int, int]]]] = {
    "iban": _ibans, "card": _cards, "email": _emails, "phone": _phones}


@dataclass(frozen=True)
class Hit:
    start: int
    end: int
    label: str  # what it is: card, iban, email, phone, pattern, length, a language, a moderation category, unavailable


def find(guard: GuardrailConfig, text: str) -> list[Hit]:
    """Where `guard` matches `text`, without overlaps, in order."""
    if guard.kind == "length":
        limit = guard.max_chars or 0
        return [Hit(limit, len(text), "length")] if len(text) > limit else []
    if guard.kind == "language":
        language = language_id.refused(text, guard.languages)
        return [Hit(0, len(text), language)] if language else []
    if guard.kind == "moderation":
        return []  # a round trip: Guardrails.screen asks the endpoint
    spans: list[Hit] = []
    if guard.kind == "pii":
        for label in PII_DETECTORS:
            if label in guard.pii:
                spans += [Hit(a, b, label) for a, b in PII_DETECTORS[label](text)
                          if not any(a < h.end and h.start < b for h in spans)]
    else:
        for pattern in compiled(guard):
            spans += [Hit(*m.span(), "pattern") for m in pattern.finditer(text)
                      if m.end() > m.start() and not any(m.start() < h.end and h.start < m.end() for h in spans)]
    return sorted(spans, key=lambda h: h.start)


_COMPILED: dict[str, re.Pattern[str]] = {}


def compiled(guard: GuardrailConfig) -> list[re.Pattern[str]]:
    """A guard's patterns, compiled once per process (the validator has refused bad ones)."""
    out = []
    for source in guard.patterns:
        pattern = _COMPILED.get(source)
        if pattern is None:
            pattern = _COMPILED[source] = re.compile(source)
        out.append(pattern)
    return out


def redacted(guard: GuardrailConfig, text: str, hits: list[Hit]) -> str:
    """`text` with each hit replaced (a length hit: cut to the limit)."""
    out: list[str] = []
    last = 0
    for hit in hits:
        if hit.label == "length":
            return "".join(out) + text[last:hit.start]
        default = "[redacted]" if hit.label == "pattern" else f"[{hit.label}]"
        out += [text[last:hit.start], guard.replacement if guard.replacement is not None else default]
        last = hit.end
    return "".join(out) + text[last:]


# -- one stage's verdict -------------------------------------------------------------------


@dataclass
class Verdict:
    """What the guards of one stage made of a text: the text to go on with (redacted), the guard
    that blocked it or hands it to an operator (None: it passes), and every guard that matched."""

    text: str
    stopped_by: GuardrailConfig | None = None
    matched: list[tuple[GuardrailConfig, list[Hit]]] = field(default_factory=list)


    def take(self, guard: GuardrailConfig, hits: list[Hit]) -> bool:
        """A guard's hits: the text redacted, or stopped (True: no later guard need look)."""
        if not hits:
            return False
        self.matched.append((guard, hits))
        if guard.outcome == "redact":
            self.text = redacted(guard, self.text, hits)
        elif guard.outcome in ("block", "operator"):
            self.stopped_by = guard
            return True
        return False


def judge(guards: Iterable[GuardrailConfig], stage: str, text: str) -> Verdict:
    """Apply the local guards of `stage` to `text` in order; a block or an operator hand-over stops
    there. A `moderation` guard is a round trip: `Guardrails.screen` adds it."""
    verdict = Verdict(text)
    for guard in guards:
        if stage in guard.stages and guard.kind != "moderation" and verdict.take(guard, find(guard, verdict.text)):
            break
    return verdict


def file_texts(attachments: tuple[Attachment, ...]) -> list[str]:
    """What a model reads of each file as text, which guards judge: its name and the media type
    its client declared (`[attached: NAME (TYPE, size)]`; a PDF's filename), in that order."""
    return [text for a in attachments for text in (a.name, a.media_type)]


def renamed(attachments: tuple[Attachment, ...], texts: list[str]) -> tuple[Attachment, ...]:
    """`attachments` with the names and media types (in `file_texts`' order) a guard redacted."""
    said = zip(texts[0::2], texts[1::2], strict=True)
    return tuple(a if (a.name, a.media_type) == (name, media_type) else replace(a, name=name, media_type=media_type)
                 for a, (name, media_type) in zip(attachments, said, strict=True))


def judged_message(guards: tuple[GuardrailConfig, ...], message: UserMessage) -> tuple[UserMessage, bool]:
    """A user message judged by the local input `guards`, its text and its files' names and media
    types, as a turn judges its own (`Guardrails.check_input`): redacted, and whether a guard stopped it."""
    verdict = judge(guards, "input", message.content)
    texts = []
    for text in file_texts(message.attachments):
        if verdict.stopped_by is not None:
            break
        judged = judge(guards, "input", text)
        verdict.stopped_by = judged.stopped_by
        texts.append(judged.text)
    if verdict.stopped_by is not None:
        return message, True
    return UserMessage(verdict.text, renamed(message.attachments, texts)), False


WHOLE_TEXT = ("language", "moderation")  # the kinds a seeded conversation's turn judges (`check_seeded`)


def unscreened(guards: Iterable[GuardrailConfig], seeded: list[Message]) -> tuple[str, ...]:
    """The user's texts of a seeded conversation that `languages` and `moderation` input guards
    are yet to judge (none when the route has no such guard)."""
    if not any(g.kind in WHOLE_TEXT for g in stage_guards(guards, "input")):
        return ()
    return tuple(m.content for m in seeded if isinstance(m, UserMessage) and m.content)


def left_out(messages: list[Message], judged: dict[str, str | None]) -> list[Message]:
    """`messages` with each user message `judged` maps to None left out with the answers it got,
    and each one it maps to a text given that text."""
    kept: list[Message] = []
    stopped = False
    for m in messages:
        if isinstance(m, UserMessage) and m.content in judged:
            text = judged[m.content]
            stopped = text is None
            m = m if text is None or text == m.content else UserMessage(text, m.attachments)
        elif isinstance(m, UserMessage):
            stopped = False
        if not stopped:
            kept.append(m)
    return kept


def stage_guards(guards: Iterable[GuardrailConfig], stage: str) -> tuple[GuardrailConfig, ...]:
    return tuple(g for g in guards if stage in g.stages)


# -- the turn's guardrails ----------------------------------------------------------------------


class Guardrails:
    """The guardrails of one turn, on its context: each stage's check and what its outcome does
    (the events, the metric, the user's message, the hand-over)."""

    def __init__(self, t: TurnContext):
        self.t = t
        # The turn's ChatModel (engine/turn.py sets it): a `moderation` guard asks its `moderate`.
        self.model: Any = None
        # Whether the last answer checked was stopped (blocked, or handed over): what the user reads
        # is the guard's message, which `cite: required` must not refuse (engine/turn.py).
        self.stopped_output = False

    def on(self, stage: str, route: str | None = None) -> tuple[GuardrailConfig, ...]:
        """The guards of `stage` on `route` (default: the current one)."""
        return stage_guards(self.t.config.route_guardrails(route or self.t.c.scope.route), stage)

    def kept(self, text: str) -> str:
        """`text` as what keeps it may hold it (`kept_text`) on the routes the turn is on."""
        return kept_text(self.t.config, [self.t.c.scope.route], text)

    def holds_output(self) -> bool:
        """Whether a streamed reply must be held: an output guard may change it (one that only
        flags lets it stream, and flags the whole text at the end)."""
        return any(g.outcome != "flag" for g in self.on("output"))

    def report(self, verdict: Verdict, stage: str, outcome: str | None = None) -> None:
        """A Guardrail event (for the operators, unless `events:` says otherwise) and the metric,
        for each guard that matched. The event names what was found, never the value. `outcome`:
        what happened instead of the guard's own (`allow`: its endpoint failed, the text passed)."""
        audience = self.t.config.events[GUARDRAIL].audience if GUARDRAIL in self.t.config.events else ev.OPERATORS
        for guard, hits in verdict.matched:
            done = outcome or guard.outcome
            self.t.emit(GUARDRAIL, {"name": guard.name, "stage": stage, "kind": guard.kind, "outcome": done,
                                    "route": self.t.c.scope.route, "found": sorted({h.label for h in hits})},
                        audience=audience)
            observe.guardrail(stage, guard.kind, done)

    def message(self, guard: GuardrailConfig) -> str:
        """What the user reads when `guard` blocks or hands over: its `message:`, else chatrun's own
        text in the session's locale (the fallback's, or the hand-over's)."""
        if guard.message:
            text = self.t.render_template(guard.message, f"guardrail {guard.name} message", guard.where)
            if text.strip():
                return text
        if guard.outcome == "operator":
            return self.t.own_text("handover")
        if guard.kind == "language":
            return self.t.own_text("language_refused", languages=languages.names(guard.languages))
        return self.t.own_text("fallback")

    def hand_over(self, guard: GuardrailConfig, text: str) -> None:
        """An `operator` outcome: the conversation waits for an operator, as an `operator:` action's."""
        item = pausing.new_item(self.t, TAKEOVER, None, tool=None, ask=text, tell=text, by=[OPERATOR_ROLE],
                                data={**pausing.takeover_data(None, "all"), "guardrail": guard.name})
        pausing.announce(self.t, item)
        self.t.paused = True

    # -- the verdict of one stage, round trips included ---------------------------------------

    async def screen(self, stage: str, text: str, guards: tuple[GuardrailConfig, ...] | None = None) -> Verdict:
        """`text` judged by the guards of `stage`: the local ones first, then (unless one stopped
        it) each `moderation` guard, on the text as they redacted it, so the moderation endpoint
        never reads what a guard redacts, and a text already blocked costs no round trip."""
        guards = self.on(stage) if guards is None else guards
        if any(g.kind == "language" for g in guards):
            await language_id.ready()
        verdict = judge(guards, stage, text)
        for guard in guards:
            if verdict.stopped_by is not None:
                break
            if guard.kind == "moderation" and stage in guard.stages:
                verdict.take(guard, await self.moderation_hits(guard, stage, verdict.text))
        return verdict

    async def moderation_hits(self, guard: GuardrailConfig, stage: str, text: str) -> list[Hit]:
        """The categories the route's endpoint's `/moderations` finds in `text` that count for
        `guard` (each a hit on the whole text); a failed call follows `on_error`."""
        spec = guard.moderation
        moderate = getattr(self.model, "moderate", None)
        if spec is None or moderate is None or not text.strip():
            return []
        config = self.t.config.route_model(self.t.c.scope.route)
        try:
            result = await asyncio.wait_for(moderate(config, spec.model, text), spec.timeout)
        except TimeoutError:
            return self.unavailable(guard, stage, text, f"no answer within {spec.timeout:g} s")
        except ModelError as exc:
            return self.unavailable(guard, stage, text, str(exc))
        if result is None:  # a model with no endpoint to ask (a replayed transcript's script)
            return []
        named = spec.categories or tuple(dict.fromkeys([*result.categories, *result.scores]))
        if spec.threshold is not None:
            found = [c for c in named if result.scores.get(c, 0.0) >= spec.threshold]
        else:
            found = [c for c in named if result.categories.get(c)]
        return [Hit(0, len(text), category) for category in found]

    def unavailable(self, guard: GuardrailConfig, stage: str, text: str, reason: str) -> list[Hit]:
        """A moderation call that failed: `on_error: block` counts the text as matched (the guard's
        outcome applies); `allow` lets it pass, reported as such. Logged with the session."""
        assert guard.moderation is not None
        block = guard.moderation.on_error == "block"
        log.warning("session %s, turn %s: guardrail %s (%s): the moderation endpoint failed (%s); on_error: %s, so "
                    "the text %s", self.t.c.id, self.t.number, guard.name, stage, reason, guard.moderation.on_error,
                    "counts as flagged" if block else "passes unchecked")
        hits = [Hit(0, len(text), "unavailable")]
        if block:
            return hits
        self.report(Verdict(text, matched=[(guard, hits)]), stage, outcome="allow")
        return []

    # -- the stages ------------------------------------------------------------------------

    async def check_input(self) -> bool:
        """The user's message (its text and its data's texts) before any model reads it: redacted
        in place, or stopped. True: the turn ends here (the user has read the guard's message)."""
        guards = self.on("input")
        if not guards:
            return False
        if self.t.c.unscreened:
            await self.check_seeded(guards)
        if self.t.decision is not None:
            return await self.check_answer(guards)
        stopped = None
        if self.t.user_message:
            verdict = await self.screen("input", self.t.user_message, guards)
            self.report(verdict, "input")
            self.t.user_message, stopped = verdict.text, verdict.stopped_by
        if stopped is None and (self.t.data or self.t.attachments):
            # The names and media types of the files sent are text a model reads (`[attached:
            # NAME (TYPE ...)]`, a PDF's filename): judged with the data's texts, one moderation
            # round trip for all.
            (self.t.data, texts), stopped = await self.data_verdict(
                guards, [self.t.data, file_texts(self.t.attachments)])
            self.t.attachments = renamed(self.t.attachments, texts)
        return self.stop_input(stopped)

    async def check_seeded(self, guards: tuple[GuardrailConfig, ...]) -> None:
        """The user's messages of a conversation just seeded (`Session.seed_memory`, the earlier
        messages a `/v1` client resends) judged by the `languages` and `moderation` guards, which
        the synchronous seeding could not run, before any model reads them: one they stop is taken
        out of the memory with the answers it got, as the local guards left theirs out."""
        texts, self.t.c.unscreened = self.t.c.unscreened, ()
        whole = tuple(g for g in guards if g.kind in WHOLE_TEXT)
        judged: dict[str, str | None] = {}
        for text in dict.fromkeys(texts):
            verdict = await self.screen("input", text, whole)
            self.report(verdict, "input")
            if verdict.stopped_by is not None or verdict.text != text:
                judged[text] = None if verdict.stopped_by is not None else verdict.text
        if judged:
            memory = self.t.c.memory_for(self.t.c.scope, self.t.c.scope.route)
            memory.set(left_out(memory.messages(), judged))

    async def check_answer(self, guards: tuple[GuardrailConfig, ...]) -> bool:
        """A user's answer to a question the user is asked (an `Answer`: the web page's card, the
        HTTP decision, the extended dialect's frame) is the user's message too: judged as a message
        that answers it is on every other door (engine/waiting.py `answer_by_message`)."""
        decision = self.t.decision
        item = next((i for i in self.t.c.pending if i.id == getattr(decision, "item", None)), None)
        if not isinstance(decision, Answer) or item is None or USER_ROLE not in item.by:
            return False  # another decision, or one engine/waiting.py refuses (an item no longer waiting)
        value, stopped = await self.data_verdict(guards, decision.value)
        self.t.decision = replace(decision, value=value)
        return self.stop_input(stopped)

    def stop_input(self, stopped: GuardrailConfig | None) -> bool:
        """An input a guard stopped: the user reads its message (and an `operator` guard hands the
        conversation over). True: the turn ends here."""
        if stopped is None:
            return False
        text = self.message(stopped)
        self.t.emit(ev.MESSAGE, text)
        if stopped.outcome == "operator":
            self.hand_over(stopped, text)
        return True

    async def data_verdict(self, guards: tuple[GuardrailConfig, ...], data: Any) -> tuple[Any, GuardrailConfig | None]:
        """The texts in a message's data, each judged as input by the local guards; then all of
        them, joined, by the moderation guards: one round trip, not one per text."""
        stopped: list[GuardrailConfig] = []
        texts: list[str] = []
        if any(g.kind == "language" for g in guards):
            await language_id.ready()

        def visit(text: str) -> str:
            verdict = judge(guards, "input", text)
            self.report(verdict, "input")
            if verdict.stopped_by is not None:
                stopped.append(verdict.stopped_by)
            texts.append(verdict.text)
            return verdict.text
        data = map_strings(data, visit)
        moderated = tuple(g for g in guards if g.kind == "moderation")
        if not stopped and moderated and texts:
            verdict = await self.screen("input", "\n".join(texts), moderated)
            self.report(verdict, "input")
            stopped += [verdict.stopped_by] if verdict.stopped_by is not None else []
        return data, (stopped[0] if stopped else None)

    async def check_tool_result(self, tool: str, reply: str) -> str:
        """A call's reply before the model reads it: redacted, or replaced by the guard's message."""
        guards = self.on("tool_result")
        if not guards:
            return reply
        verdict = await self.screen("tool_result", reply, guards)
        self.report(verdict, "tool_result")
        if verdict.stopped_by is not None:
            guard = verdict.stopped_by
            return (f"The result of {tool} was withheld by the guardrail {guard.name}. Do not repeat the call; "
                    "tell the user you cannot give them this.")
        return verdict.text

    async def check_output(self, text: str | None, hold: OutputHold | None) -> tuple[str | None, bool]:
        """The model's answer before the user reads it (what a streamed reply's hold released
        counts as checked): the text to show and keep, and whether the turn was handed to an
        operator (its calls then do not run)."""
        guards = self.on("output")
        self.stopped_output = False
        if not guards or not text:
            return text, False
        if hold is not None:
            return await hold.final(text)
        verdict = await self.screen("output", text, guards)
        return self.apply_output(verdict, "")

    def apply_output(self, verdict: Verdict, released: str) -> tuple[str, bool]:
        """An output verdict's text: what was released, then the rest as checked or the guard's message."""
        self.report(verdict, "output")
        guard = verdict.stopped_by
        if guard is None:
            return released + verdict.text, False
        self.stopped_output = True
        text = self.message(guard)
        if released:  # what went out stays the start of the Message: every door relies on it
            text = released + ("" if released[-1].isspace() else " ") + text
        if guard.outcome == "operator":
            self.hand_over(guard, text)
            return text, True
        return text, False


# -- the stream's hold ----------------------------------------------------------------------

Chunk = Callable[[str], Awaitable[None]]
_SENTENCE_END = re.compile(r"[.!?…。！？]\s+|\n")


class OutputHold:
    """Between a streaming model and the turn's Stream events, when the route has output guards:
    chunks are held, and released only once checked — the whole reply at the end (`release:
    reply`, the default), or sentence by sentence (`release: sentence`, when every output guard
    says so). A sentence a guard blocks stops the stream: nothing after it is released, and the
    final Message says what the user gets. What is released is always the start of that Message,
    so every door (which takes the Message as the rest of the streamed text) agrees."""

    def __init__(self, guards: Guardrails, send: Chunk):
        self.guards = guards
        self.send = send
        self.by_sentence = all(g.release == "sentence" for g in guards.on("output") if g.outcome != "flag")
        # A moderation call per sentence would be a round trip each: with a moderation guard, the
        # sentences are released in runs of at least its `window` characters, one call per run.
        self.window = max((g.moderation.window for g in guards.on("output") if g.moderation is not None), default=0)
        self.raw = ""  # what the model has streamed so far
        self.consumed = 0  # how much of `raw` has been judged and released
        self.released = ""  # what went out (redacted)
        self.stopped: Verdict | None = None  # a sentence that blocked: the stream went quiet

    async def chunk(self, text: str) -> bool:
        """A streamed chunk, held. Whether the reply has begun to reach the user (models/base.py
        ChunkCallback): never while the whole reply is held, and by the sentence only once a checked
        sentence went out, so a model that fails before may be retried, or a fallback asked, and only
        that answer's text is checked and sent (`begin_again` drops what the failed one streamed)."""
        self.raw += text
        if not self.by_sentence:
            return False
        if self.stopped is None:
            await self.release()
        return bool(self.released)

    __call__ = chunk  # the ChunkCallback the turn gives its model

    def begin_again(self) -> None:
        """A new attempt at the answer (a retry, the next fallback) after one none of which reached
        the user: what that one streamed, and a sentence of it a guard stopped, count no more."""
        if not self.released:
            self.raw, self.consumed, self.stopped = "", 0, None

    async def release(self) -> None:
        """The whole sentences held, checked and sent (runs of `window` characters at least)."""
        cut = None
        for m in _SENTENCE_END.finditer(self.raw, self.consumed):
            cut = m.end()
        if cut is None or cut - self.consumed < self.window:
            return
        verdict = await self.guards.screen("output", self.raw[self.consumed:cut], self.budgeted())
        if verdict.stopped_by is not None:
            self.stopped = verdict
            return
        self.guards.report(verdict, "output")
        self.consumed = cut
        self.released += verdict.text
        if verdict.text:
            await self.send(verdict.text)

    async def final(self, text: str) -> tuple[str, bool]:
        """The reply as the user gets it, from the model's whole text."""
        if self.stopped is not None:
            return self.guards.apply_output(self.stopped, self.released)
        if not text.startswith(self.raw[:self.consumed]):  # the model's text is not what it streamed
            log.info("session %s: a streamed reply differs from the model's text; checked whole", self.guards.t.c.id)
            self.consumed, self.released = 0, ""
        verdict = await self.guards.screen("output", text[self.consumed:], self.budgeted())
        return self.guards.apply_output(verdict, self.released)

    def budgeted(self) -> tuple[GuardrailConfig, ...]:
        """The output guards, each `max_chars` less what already went out: the limit is the
        reply's, not each sentence's (a reply of short sentences would never reach it)."""
        return tuple(replace(g, max_chars=max(0, (g.max_chars or 0) - len(self.released))) if g.kind == "length" else g
                     for g in self.guards.on("output"))


# -- storage --------------------------------------------------------------------------------


def map_strings(value: Any, change: Callable[[str], str]) -> Any:
    """`value` (plain JSON) with every string changed by `change` (keys stay)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {k: map_strings(v, change) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [map_strings(v, change) for v in value]
    return value


def kept_strings(value: Any, redact: Callable[[str], str]) -> Any:
    """`value` (plain JSON) as what keeps it holds it: every string redacted, the keys of its
    mappings too (a tool's result keyed by card numbers). Two keys redacted alike both stay: the
    second is `[card] (2)`, the third `[card] (3)`."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            out[_unique(redact(k), out) if isinstance(k, str) else k] = kept_strings(v, redact)
        return out
    if isinstance(value, list | tuple):
        return [kept_strings(v, redact) for v in value]
    return value


def _unique(key: str, taken: dict[Any, Any]) -> str:
    n, unique = 1, key
    while unique in taken:
        n += 1
        unique = f"{key} ({n})"
    return unique


def storage_redactor(guards: tuple[GuardrailConfig, ...]) -> Callable[[str], str]:
    def redact(text: str) -> str:
        return judge(guards, "storage", text).text if text else text
    return redact


def storage_mapper(guards: tuple[GuardrailConfig, ...]) -> Callable[[Any], Any]:
    """What keeps a value (the history, a trace, user memory) makes of it under `guards`:
    `kept_strings` with their redaction; the value as it is when there are none."""
    if not guards:
        return lambda value: value
    redact = storage_redactor(guards)
    return lambda value: kept_strings(value, redact)


def stored_message(message: Message, redact: Callable[[str], str]) -> Message:
    """A memory's message as the store keeps it: its texts (its calls' arguments, a running
    summary) redacted."""
    if isinstance(message, UserMessage):
        return UserMessage(redact(message.content), renamed(message.attachments, [redact(t) for t in file_texts(message.attachments)]))
    if isinstance(message, AssistantMessage):
        calls = tuple(ToolCall(c.id, c.name, redact(c.arguments)) for c in message.tool_calls)
        return AssistantMessage(redact(message.content) if message.content else message.content, calls)
    if isinstance(message, ToolResultMessage):
        return ToolResultMessage(message.tool_call_id, message.name, redact(message.content))
    if isinstance(message, SystemMessage):
        return SystemMessage(redact(message.content))
    if isinstance(message, SummaryMessage):  # written by a model, from what the user said
        return SummaryMessage(redact(message.content))
    return message


def kept_text(config: BotConfig, routes: Iterable[str], text: str) -> str:
    """`text` as anything that keeps it (the store, the log, an event sent to a client, a span)
    may hold it: redacted by the `storage` guards of the bot and of `routes`, and of the values of
    the bot's secret variables (`secrets_guard`); as it is when there are none. The one rule for a
    failure's text, wherever chatrun keeps or sends it."""
    if not config.redacts_kept:
        return text
    guards = bot_storage_guards(config, routes)
    return storage_redactor(guards)(text) if guards else text


def kept_value(config: BotConfig, routes: Iterable[str], value: Any) -> Any:
    """`value` (plain JSON) with every string, and every key of its mappings, as `kept_text`
    leaves it (`kept_strings`)."""
    if not config.redacts_kept:
        return value
    return storage_mapper(bot_storage_guards(config, routes))(value)


def bot_storage_guards(config: BotConfig, routes: Iterable[str]) -> tuple[GuardrailConfig, ...]:
    """The guard of the bot's secret variables (`secrets_guard`), if it has any set, then the
    storage guards of the bot and of the routes a turn ran on."""
    seen: dict[int, GuardrailConfig] = {id(g): g for g in stage_guards(config.guardrails, "storage")}
    for route in dict.fromkeys(routes):
        if route in config.routes:
            for guard in stage_guards(config.routes[route].guardrails, "storage"):
                seen.setdefault(id(guard), guard)
    secrets = secrets_guard(config)
    # First: a PII guard that took part of a secret (its digits as a phone) would leave the rest.
    return (secrets, *seen.values()) if secrets is not None else tuple(seen.values())


def secrets_guard(config: BotConfig) -> GuardrailConfig | None:
    """The values of the bot's `secret: true` variables as a storage guard (None: it has none set):
    each in every form definition/secret_forms.py knows (as written, URL-escaped, base64),
    replaced by `[redacted]`, as the `http:` kind redacts them from what it returns."""
    values = secret_forms.secret_values(config.env) if config.redacts_kept and config.env else ()
    pattern = secret_forms.secrets_pattern(values) if values else None
    return _pattern_guard(pattern.pattern) if pattern is not None else None


@functools.lru_cache(maxsize=64)
def _pattern_guard(source: str) -> GuardrailConfig:
    return GuardrailConfig("secrets", "pattern", ("storage",), "redact", patterns=(source,),
                           replacement="[redacted]")
