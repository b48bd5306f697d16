"""AG-UI, the open Agent–User Interaction protocol (ag-ui-protocol), so CopilotKit-style front
ends talk to a bot: `POST /agui/{bot}` takes a RunAgentInput and answers with its events as
Server-Sent Events (docs/agui.md).

- The thread is the session (`threadId`, started at its first run, the caller's own as on
  the HTTP API); the run's input is the last user message of `messages` (the server keeps the
  history: earlier messages are not read again), or the `resume` entry that answers an
  interrupt. The last user message's id is the turn's request id (a `resume` run's: its
  `runId`): a run sent again, a regenerate, a history resent after the answer is replayed from
  the committed turn, never run twice; the same id with other text (an edit) is refused.
- The bot's words stream as TEXT_MESSAGE_START/CONTENT/END; an item the user decides (an
  approval, `confirm:`, a question) ends the run with RUN_FINISHED's `interrupt` outcome
  (the item's id, kind, question, choices and the shape of the answer), and the next run's
  `resume` decides it; the passages a reply cites (a Sources event) are an ACTIVITY_SNAPSHOT of
  activity type `sources` after the message (`{messageId, sources}`: a front end renders them as
  a widget in their place in the conversation); what has no AG-UI event of its own (choices, a route change, a
  structured object) is a CUSTOM event named `chatrun.<EventType>`. A turn that failed (and
  was rolled back) ends with RUN_ERROR.
- AG-UI has no push: what others said to the user since the thread's last run (an operator's
  words, a decision's reply) comes first in the next run, once, as on /v1.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from chatrun import events as ev
from chatrun.definition.page_texts import page_texts
from chatrun.engine.pending import Answer, Reject
from chatrun.server import wire
from chatrun.server.auth import Principal
from chatrun.server.openai_sessions import trailing_others_turns
from chatrun.server.openai_turn import caught_up_events, operator_text
from chatrun.server.pending_api import checked_words, decision_of
from chatrun.server.plumbing import (
    KEEPALIVE,
    Caller,
    DetachedTurn,
    Emit,
    Registry,
    limits_of,
    read_json_object,
)
from chatrun.server.sessions import OPEN
from chatrun.server.turn_run import MAX_REQUEST_ID, request_asks

if TYPE_CHECKING:
    from chatrun.events import Event
    from chatrun.server.sessions import SessionRegistry

log = logging.getLogger("chatrun.agui")
KEEPALIVE_S = 15.0  # seconds of silence after which an SSE comment keeps proxies from closing the stream
APPROVAL_SCHEMA = {"type": "object", "required": ["decision"], "properties": {
    "decision": {"enum": ["approve", "reject"]}, "reason": {"type": "string"}, "args": {"type": "object"}}}


def make_agui_router() -> APIRouter:
    router = APIRouter(tags=["ag-ui"])
    # Not in chatrun's OpenAPI document: the body and the stream are AG-UI's own (its
    # RunAgentInput and events, ag-ui-protocol), documented by the protocol and docs/agui.md.
    router.add_api_route("/agui/{bot}", run_agent, methods=["POST"], include_in_schema=False)
    return router


async def run_agent(bot: str, request: Request, who: Caller, registry: Registry) -> StreamingResponse:
    try:
        from ag_ui.core import RunAgentInput
        from ag_ui.encoder import EventEncoder
    except ImportError:
        raise wire.RequestFailed(wire.SERVER_ERROR, "AG-UI needs ag-ui-protocol: pip install 'chatrun[channels]'") from None
    from pydantic import ValidationError

    try:
        run = RunAgentInput.model_validate(await read_json_object(request))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise wire.RequestFailed(wire.BAD_REQUEST, f"not an AG-UI RunAgentInput: {'.'.join(map(str, first['loc']))}: "
                                 f"{first['msg']}") from None
    problem = wire.chat_id_problem(run.thread_id)
    if problem:
        raise wire.RequestFailed(wire.BAD_REQUEST, f"threadId must be {problem}")
    message, request_id = _input_of(run, limits_of(request))
    registry.bot(bot)  # an unknown bot is a 404 before the stream starts
    encoder = EventEncoder(accept=request.headers.get("accept") or "text/event-stream")
    start = functools.partial(_run, registry, bot, who, run, message, request_id, encoder.encode, _locale_of(run, request))
    turn = DetachedTurn(start)
    return StreamingResponse(_frames(turn), media_type=encoder.get_content_type(),
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _locale_of(run: Any, request: Request) -> str | None:
    """The locale a new session speaks (docs/i18n.md): the run's `forwardedProps.locale` (a
    front end's word), else the request's Accept-Language (the browser's)."""
    props = run.forwarded_props
    wanted = props.get("locale") if isinstance(props, dict) else None
    return wanted if isinstance(wanted, str) and wanted else request.headers.get("accept-language")


async def _frames(turn: DetachedTurn) -> AsyncIterator[str]:
    async for item in turn.items(KEEPALIVE_S):
        yield ": keepalive\n\n" if item is KEEPALIVE else item


def _input_of(run: Any, limits: wire.ServerLimits) -> tuple[Any, str]:
    """The turn's input and request id: the decision a `resume` entry makes (the run's id), else
    the last user message's text (refused over --max-message-chars, as on every door) and its
    message id (`_message_request`)."""
    if run.resume:
        if len(run.resume) > 1:
            raise wire.RequestFailed(wire.BAD_REQUEST, "resume one interrupt per run (chatrun decides one item a turn)")
        entry = run.resume[0]
        if entry.status == "cancelled":
            return Reject(entry.interrupt_id), f"agui:{run.run_id}"
        payload = entry.payload
        if isinstance(payload, dict) and ({"decision", "answer"} & set(payload)):
            return decision_of(entry.interrupt_id, payload, None, limits), f"agui:{run.run_id}"
        return Answer(entry.interrupt_id, checked_words(limits, payload, "resume[0].payload")), f"agui:{run.run_id}"
    for at in reversed(range(len(run.messages))):
        message = run.messages[at]
        if message.role == "user":  # the last one: an earlier one was a turn already
            text = _text(message.content)
            if wire.says_nothing(text, ()):
                raise wire.RequestFailed(wire.EMPTY_MESSAGE, wire.nothing_said("the last user message of messages"))
            too_long = limits.message_too_long(text, f"messages[{at}].content")
            if too_long:
                raise wire.RequestFailed(wire.TOO_LARGE, too_long)
            return text, _message_request(message.id)
    raise wire.RequestFailed(wire.BAD_REQUEST, "an AG-UI run needs a user message with text, or `resume`")


def _message_request(message_id: str) -> str:
    """The request id of the turn a user message runs: its AG-UI message id, so the message runs
    once however many runs carry it as their last user message — a run sent again, a front end's
    "regenerate" (a new run, the answer dropped), a history resent after the answer — each is
    answered from the committed turn, and a tool's effect is not repeated (docs/agui.md)."""
    kept = f"agui:m:{message_id}"
    return kept if len(kept) <= MAX_REQUEST_ID else "agui:m#" + hashlib.sha256(message_id.encode()).hexdigest()


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") or "" for part in content or ())


async def _run(registry: SessionRegistry, bot: str, who: Principal | None, run: Any, message: Any,
               request_id: str, encode: Any, locale: str | None, emit: Emit) -> None:
    from ag_ui.core import RunErrorEvent, RunFinishedEvent, RunStartedEvent

    emit(encode(RunStartedEvent(thread_id=run.thread_id, run_id=run.run_id)))
    try:
        async with registry.session(bot, run.thread_id, who, OPEN, locale=locale) as session:
            turn = registry.turn(session, message, request_id, asks=request_asks(message))
            events = _Translator(encode, emit)
            replay = await _is_replay(turn, request_id)
            unseen, keep = await _unseen(registry, session, run.run_id, replay)
            for event in unseen:
                events.add(event)
            said = events.said
            async for event in turn:
                events.add(event)
            events.close()
            if keep is not None:
                await registry.store.put_record(_seen_key(session), keep | {"turn": session.turn_count},
                                                session=session.id)
            if turn.entry.get("ok") and events.said == said and operator_text(session):
                # The bot is silent during a takeover: the user learns where the message went (as on /v1).
                events.add(ev.Event(ev.MESSAGE, operator_text(session), session.turn_count, {"from": "chatrun"}))
                events.close()
            if not turn.entry.get("ok"):
                failure = events.failure or page_texts(session.bot.config.catalogs, session.locale)["turn_failed"]
                emit(encode(RunErrorEvent(message=failure, code="TurnFailed")))
                return
            emit(encode(RunFinishedEvent(thread_id=run.thread_id, run_id=run.run_id, outcome=events.outcome())))
    except wire.RequestFailed as exc:
        emit(encode(RunErrorEvent(message=exc.message, code=exc.reason)))
    except Exception as exc:  # a bug: the client still learns the run ended
        log.exception("AG-UI run %s of thread %s failed", run.run_id, run.thread_id)
        emit(encode(RunErrorEvent(message=f"internal server error: {type(exc).__name__}", code=wire.SERVER_ERROR)))


async def _is_replay(turn: Any, request_id: str) -> bool:
    """Whether the run's turn committed already (its message ran: answered from the commit); a
    message that ran with other text (an edit in the front end) is refused, not run again."""
    try:
        replay: bool = await turn.is_replay()
    except wire.RequestFailed as exc:
        if exc.reason != wire.KEY_REUSED or not request_id.startswith("agui:m"):
            raise
        raise wire.RequestFailed(wire.KEY_REUSED, "this user message (its id) was answered already with other "
                                 "text: an edited message is not run again (the thread keeps the conversation as it "
                                 "was); send it as a new message") from None
    return replay


def _seen_key(session: Any) -> str:
    """The record of the last turn the thread's runs delivered (deleted with the session)."""
    return f"agui:{session.bot.name}:{session.id}"


async def _unseen(registry: SessionRegistry, session: Any, run_id: str,
                  replay: bool) -> tuple[list[Event], dict[str, Any] | None]:
    """What others said to the user since the thread's last run (an operator joining, their words,
    their leaving; a decision's reply): AG-UI has no push, so it comes first in the next run, as
    on /v1 (openai_sessions); all since the user's last turn when no run was made here yet. A run
    sent again tells it again (its first stream may have been lost). With it, what to keep of
    this run (None: a replay keeps what its first attempt kept)."""
    seen = await registry.store.get_record(_seen_key(session)) or {}
    last = int(seen.get("turn") or 0)
    if replay:  # what the first attempt told before its turn (the turns between `since` and its own)
        if seen.get("run") != run_id:
            return [], None
        before = [e for e in await registry.history(session) if int(e.get("turn") or 0) < last]
        return caught_up_events(trailing_others_turns(before, int(seen.get("since") or 0))), None
    if session.turn_count <= last:
        return [], {"since": last, "run": run_id}  # nothing since: no history to read
    return caught_up_events(trailing_others_turns(await registry.history(session), last)), {"since": last, "run": run_id}


class _Translator:
    """chatrun's events of one turn as AG-UI events."""

    def __init__(self, encode: Any, emit: Emit):
        self.encode, self.emit = encode, emit
        self.open: str | None = None  # the id of the text message being streamed
        self.last: str | None = None  # the id of the last text message (the one a Sources event cites)
        self.streamed = ""  # the text of the message being streamed, so far
        self.interrupts: list[Any] = []
        self.failure: str | None = None
        self.said = 0  # the messages told so far (a turn that told none while an operator has the thread says so)

    def add(self, event: Event) -> None:
        from ag_ui.core import CustomEvent

        kind, data = event.type, event.data
        if kind == ev.STREAM:
            self._delta(str(data))
        elif kind == ev.MESSAGE:
            self.said += 1
            meta = event.meta or {}  # an operator's words are named after them; a notice is chatrun's
            self._message(str(data), meta.get("name") if meta.get("from") == "operator" else None)
        elif kind == ev.ERROR:
            self.close()
            self.failure = str(data)
            self.emit(self.encode(CustomEvent(name="chatrun.Error", value=data)))
        elif kind == ev.PENDING and isinstance(data, dict):
            self._pending(data)
        elif kind == ev.SOURCES and isinstance(data, dict):
            self._sources(data)
        else:
            self.close()
            self.emit(self.encode(CustomEvent(name=f"chatrun.{kind}", value=data)))

    def _delta(self, text: str) -> None:
        from ag_ui.core import TextMessageContentEvent, TextMessageStartEvent

        if self.open is None:
            self.open = self.last = "msg_" + secrets.token_hex(8)
            self.emit(self.encode(TextMessageStartEvent(message_id=self.open, role="assistant")))
        if text:
            self.streamed += text
            self.emit(self.encode(TextMessageContentEvent(message_id=self.open, delta=text)))

    def _message(self, text: str, name: Any) -> None:
        from ag_ui.core import TextMessageContentEvent, TextMessageEndEvent, TextMessageStartEvent

        if self.open is not None:  # the message its chunks streamed: what it adds to them (a guarded
            # reply streams its checked sentences only; the rest, or a guardrail's message, is here)
            rest = text[len(self.streamed):] if text.startswith(self.streamed) else ""
            if rest:
                self.emit(self.encode(TextMessageContentEvent(message_id=self.open, delta=rest)))
            self.close()
            return
        message_id = self.last = "msg_" + secrets.token_hex(8)
        self.emit(self.encode(TextMessageStartEvent(message_id=message_id, role="assistant",
                                                    name=name if isinstance(name, str) else None)))
        if text:
            self.emit(self.encode(TextMessageContentEvent(message_id=message_id, delta=text)))
        self.emit(self.encode(TextMessageEndEvent(message_id=message_id)))

    def _sources(self, data: dict[str, Any]) -> None:
        """The passages the last message cites: AG-UI has no citation event; an activity is
        its structured, non-conversation content that keeps its place (a CUSTOM event would be
        outside the protocol: no front end could know it)."""
        from ag_ui.core import ActivitySnapshotEvent

        self.close()
        content = {"messageId": self.last, "sources": data.get("sources") or []}
        self.emit(self.encode(ActivitySnapshotEvent(message_id="sources_" + secrets.token_hex(8),
                                                    activity_type="sources", content=content)))

    def _pending(self, item: dict[str, Any]) -> None:
        from ag_ui._generated.models import Interrupt

        self.close()
        if "user" not in (item.get("by") or ()):  # others decide it: the user is told
            self._message(str(item.get("tell") or item.get("ask") or ""), None)
            return
        schema = APPROVAL_SCHEMA if item.get("kind") == "approval" else {
            "type": "object", "required": ["answer"], "properties": {"answer": item.get("schema") or {}}}
        self.interrupts.append(Interrupt(id=str(item["id"]), reason=str(item.get("kind")),
                                         message=item.get("ask"), response_schema=schema,
                                         expires_at=item.get("due"), metadata={"choices": item.get("choices")}))

    def close(self) -> None:
        from ag_ui.core import TextMessageEndEvent

        if self.open is not None:
            self.emit(self.encode(TextMessageEndEvent(message_id=self.open)))
            self.open, self.streamed = None, ""

    def outcome(self) -> Any:
        from ag_ui._generated.models import RunFinishedInterruptOutcome, RunFinishedSuccessOutcome

        if self.interrupts:
            return RunFinishedInterruptOutcome(type="interrupt", interrupts=self.interrupts)
        return RunFinishedSuccessOutcome(type="success")



