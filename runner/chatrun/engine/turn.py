"""One turn: the user's input runs through the current route's model loop and tool actions.

The turn mutates the session in place; the session snapshots itself before and
restores the snapshot if the turn raises, so a failed turn changes nothing.

Rules the loop follows (README, "The model loop"):
- The model is offered only the current route's tools.
- Tool calls of one response run in order. Once a call leaves the route (push, pop,
  route), the calls after it in that response are not run; each gets a tool result
  saying so, so memory never holds a tool call without its result.
- `immediate`: the remaining calls of the response still run, then the loop ends
  without sending the results back to the model.
- `execute`: after the loop ends, the (new) current route runs with the same user message.
- Hops (route invocations) and model calls per turn are bounded (`limits:`).

After each model answer the loop takes one typed next step (engine/steps.py): ask the model
again, hand off to the route the conversation moved to, or end the turn. What a tool call
does to get its result is its kind's (chatrun.toolkinds), reached through the Toolbox.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from chatrun import events as ev
from chatrun.definition.config import (
    ModelConfig,
    Price,
    RouteConfig,
    ToolConfig,
)
from chatrun.definition.page_texts import page_texts
from chatrun.engine import grounding, observe, tracing, waiting
from chatrun.engine.call import ToolCalls
from chatrun.engine.context import Emit, TurnContext, storable
from chatrun.engine.conversation import Conversation
from chatrun.engine.guardrails import (
    Guardrails,
    OutputHold,
    bot_storage_guards,
    kept_text,
    storage_mapper,
)
from chatrun.engine.pending import Decision
from chatrun.engine.steps import (
    NextStep,
    NextStepFinalOutput,
    NextStepHandoff,
    NextStepRunAgain,
    ToolOutcome,
    combine,
)
from chatrun.engine.stream_chunks import StreamBatcher
from chatrun.engine.tools import (
    RoutePlan,
    Toolbox,
    ToolMocks,
    parse_output,
    plan_route,
)
from chatrun.engine.usage import Attempt, Usage, UserSpent, call_usage, check_budgets
from chatrun.errors import MessageTooLong, ModelError, TurnFailed
from chatrun.knowledge import CITE_NUDGE, Hit
from chatrun.memory import ChatMemory, SummaryMemory, TokenWindowMemory
from chatrun.memory.tokens import TokenCounter, pinned_counter, tiktoken_counter
from chatrun.messages import (
    AssistantMessage,
    Attachment,
    ContextMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.models import fallback
from chatrun.models.base import ChatModel, ChunkCallback, ModelRequest, ModelResponse
from chatrun.models.fallback import Breakers, Switch
from chatrun.models.text_calls import TextCalls
from chatrun.store.billing import unfinished
from chatrun.store.blobs import BlobArea

log = logging.getLogger("chatrun.engine")

@dataclass
class RouteRun:
    """What a route's model loop works with, gathered once per route invocation."""

    route: RouteConfig
    memory: ChatMemory  # the scope's memory of the route
    offered: dict[str, ToolConfig]
    specs: list[dict[str, Any]]  # the offered tools as the model sees them
    model: ModelConfig
    plan: RoutePlan  # what the YAML fixes for the route's calls, assembled when the bot loaded
    returning: bool  # a called route with `returns: answer`: its answer is the call's result
    # A rejected JSON answer and what was wrong with it, sent after the memory's messages (never
    # kept in the memory); once set it stays for the rest of this route's loop, as it always has.
    correction: list[Message] = field(default_factory=list)
    # The route's `tool_choice` for the next model call; `required` or a tool's name lasts until the
    # model calls a tool (then the loop goes on as `auto`, else the model could never answer).
    tool_choice: str | None = None
    # The nudge after an empty answer (engine/turn.py `empty_answer`): sent once, after the
    # memory's messages, with the next call only; never kept in the memory.
    nudge: list[Message] = field(default_factory=list)
    # The knowledge passages given with each request of this route's loop (`retrieve: auto`,
    # engine/grounding.py), never kept in the memory; and the passages the last answer cites.
    knowledge: list[Message] = field(default_factory=list)
    cited: list[Hit] = field(default_factory=list)
    sent: list[Message] = field(default_factory=list)  # what the last request sent the model (what it could cite)


def sent_whole(run: RouteRun, said: Message, messages: list[Message]) -> None:
    """The first request after the user's message joined the memory holds it, else MessageTooLong: a
    message larger than the whole window was evicted on its own, and the model would answer what it
    never read."""
    if any(message is said for message in messages):
        return
    memory, where = run.memory, f"route {run.route.name} ({run.route.where})"
    if isinstance(memory, TokenWindowMemory):
        size = f"{memory.counter(said)} tokens"
        system = sum(memory.counter(m) for m in messages[:1] if isinstance(m, SystemMessage))
        room = f"its memory holds {memory.max_tokens} tokens (max_tokens), the system prompt's {system} included"
    else:
        size, room = "one message", f"its memory keeps no room for it beside the system prompt ({type(memory).__name__})"
    raise MessageTooLong(f"{where}: the user's message is {size} and {room}, so it was not sent to the model. "
                         "Give the route's memory a larger maximum, or an input guardrail of max_chars to cut "
                         "long messages (docs/guardrails.md)")


class Turn:
    """Runs one user input on a conversation; `emit` sends the turn's events as they happen."""

    def __init__(self, conversation: Conversation, tools: Toolbox, model: ChatModel, emit: Emit,
                 text: str | None, data: dict[str, Any], mocks: ToolMocks | None = None,
                 decision: Decision | None = None, attachments: tuple[Attachment, ...] = (),
                 blobs: BlobArea | None = None):
        # What the tool calls and the decisions see of this turn (engine/context.py).
        self.t = TurnContext(conversation, tools, emit, text, data, mocks, decision, attachments, blobs,
                             self.summary_call)
        self.model = TextCalls(model)  # calls the model writes as text become calls (models/text_calls.py)
        # The circuit breakers of the endpoints the model's clients call (`model.breaker:`), if it has any.
        self.breakers: Breakers | None = getattr(model, "breakers", None)
        self.number = self.t.number
        self.tool_calls = self.t.tool_calls  # the history's `calls` (the call path appends to it)
        self.model_calls = 0
        self.usage = Usage()  # the turn's model calls, summed
        self.calls_usage: list[dict[str, Any]] = []  # each call's, for the history
        self.attempt: Attempt | None = None  # on a server that records each call's usage: from the first call
        self.summaries: list[dict[str, Any]] = []  # what summarize() did, for the history
        self.hops: list[str] = []
        # Each model answer of the turn ({text?, tool_calls?}), for the history (its `model`): with
        # `calls`, what `chatrun record --from-session` replays the turn from.
        self.answers: list[dict[str, Any]] = []
        self.nudged = False  # an empty answer was asked again (once per turn)
        self.asked_to_cite = False  # an answer that cited nothing (`cite: required`) was asked again (once)
        # Whether the turn's spans are recorded, read once per turn: a tracer provider set while a
        # turn runs counts from the next one (each reading costs ~10,000 instructions: OpenTelemetry
        # looks its provider's variable up in os.environ every time; issue 39).
        self.recorded = tracing.recording()

    @functools.cached_property
    def calls(self) -> ToolCalls:
        """The turn's one call path (engine/call.py), made when the turn first needs it: a turn whose
        model calls no tool, with no guardrails and nothing waiting, never enters it."""
        calls = ToolCalls(self.t)
        if calls.guard is not None:
            calls.guard.model = self.model  # a `moderation` guardrail asks it (engine/guardrails.py)
        return calls

    @property
    def guard(self) -> Guardrails | None:
        """The turn's guardrails (engine/guardrails.py), None when the bot declares none."""
        return self.calls.guard if self.t.config.guarded else None

    # -- the loop ---------------------------------------------------------------

    async def run(self) -> None:
        # The current route runs first, unless something waits (engine/waiting.py): then a decision
        # resolves it and the loop goes on (run again or hand off), or a message is handled without it.
        c = self.t.c
        if self.guard is not None and await self.guard.check_input():  # blocked, or handed to an operator
            self.finish()
            return
        nothing_waits = self.t.decision is None and not c.pending  # engine/waiting.py only when something does
        step: NextStep = NextStepHandoff() if nothing_waits else await waiting.first_step(self.calls)
        while isinstance(step, NextStepHandoff | NextStepRunAgain):
            route = self.t.c.scope.route
            self.hops.append(route)
            if len(self.hops) > self.t.config.limits.max_hops:
                raise TurnFailed(
                    f"this turn invoked routes {len(self.hops) - 1} times ({' -> '.join(self.hops[:-1])}), "
                    f"more than limits.max_hops = {self.t.config.limits.max_hops}; a tool probably executes "
                    "a route that executes again"
                )
            step = await self.invoke_route()
        self.finish()

    async def invoke_route(self) -> NextStep:
        """Run the current route's model loop until it hands off to another route or the turn is done."""
        run = await self.start_route()
        step: NextStep = NextStepRunAgain()
        while isinstance(step, NextStepRunAgain):
            step = await self.model_step(run)
        return step

    async def start_route(self) -> RouteRun:
        """The route's memory (given the user's message, once per memory and turn) and tools."""
        scope = self.t.c.scope
        route = self.t.config.routes[scope.route]
        memory = self.t.c.memory_for(scope, route.name)
        memory_id = scope.memory_id(route.name)
        if memory_id not in self.t.user_given:
            self.t.user_given.add(memory_id)
            user_text = self.t.render_user(route)  # the system prompt goes first anyway: memories keep it first
            if user_text or self.t.attachments:  # files alone are a message too (a photo, no words)
                self.t.give(memory, user_text)
        plan = self.t.tools.plans.get(route.name)
        if plan is None or plan.route is not route:  # a route the loaded bot does not hold as it is
            plan = plan_route(self.t.config, route)
        tools = plan.tools
        offered, specs = (dict(tools[0]), tools[1]) if tools is not None else \
            await self.t.tools.route_tools(route, self.t.mocks)
        return RouteRun(route, memory, offered, specs, plan.model, plan,
                        route.returns == "answer" and scope.caller is not None,
                        tool_choice=sendable_tool_choice(route.tool_choice, offered),
                        knowledge=await grounding.retrieved(self.t, route, self.guard) if route.knowledge else [])

    async def model_step(self, run: RouteRun) -> NextStep:
        """One model call on the route and what follows from its answer."""
        limit = self.t.config.limits.max_model_calls
        if self.model_calls >= limit:
            return self.fall_back(run, f"this turn called the model {self.model_calls} times, as many as "
                                       f"limits.max_model_calls = {limit} allows (route {run.route.name}){self.repeats()}")
        response, answer = await self.ask_model(run)
        route, calls = run.route, answer.tool_calls
        if response.finish_reason == "length":
            self.cut_off(run, bool(calls))
        value = None
        if route.output is not None and not calls:
            value, problem = parse_output(response.text, self.t.tools.output_validator(route.name))
            if problem is not None:
                return self.correct(run, response.text, problem)
        elif not calls and not (response.text or "").strip():
            step = self.empty_answer(run)
            if step is not None:
                return step  # the empty answer is not kept: the memory gets what the user gets
        elif not calls and route.knowledge is not None and not run.returning:
            run.cited = await grounding.cited(self.t, route, response.text, run.sent)
            stopped = self.guard is not None and self.guard.stopped_output  # the guard's message cites nothing
            if not run.cited and route.knowledge.cite_required and not stopped:
                return self.uncited(run, response.text)  # not kept either, and never sent (not streamed)
        run.memory.add(answer)
        if not calls:
            return self.answered(run, response.text, value)
        if run.tool_choice != "none":
            run.tool_choice = None  # a call was made: the model may answer now
        if response.text and response.text.strip():  # blanks are no reply: an empty answer after them is asked again
            self.t.emit(ev.MESSAGE, response.text)
        # A cut-off answer's last call may hold truncated arguments (a lenient server closes the JSON):
        # it is not run, whatever they parse as; the model reads why.
        cut = response.finish_reason == "length"
        outcomes = await self.calls.run_calls(route, run.offered, calls[:-1] if cut else calls)
        if cut:
            outcomes.append(ToolOutcome(f"Not run: your answer was cut off at the length limit "
                                        f"({_max_tokens(run.model)}) while writing the arguments of "
                                        f"{calls[-1].name}. Call it again with shorter arguments.", failed=True))
        for call, outcome in zip(calls, outcomes, strict=True):
            if outcome.deferred:
                continue  # the called route's result answers it when it returns
            # Into the memory that holds the call; a cleared or popped memory drops it as an orphan.
            run.memory.add(ToolResultMessage(call.id, call.name, outcome.reply))
        return combine(outcome.next for outcome in outcomes)

    async def ask_model(self, run: RouteRun) -> tuple[ModelResponse, AssistantMessage]:
        """Call the model (within the turn's limits and budgets, traced, its usage counted)."""
        route, model_config = run.route, run.model
        self.model_calls += 1  # bounded by model_step (limits.max_model_calls)
        self.add_system(run.memory, route)
        # The route's `context:` follows the memory, rendered anew for each call and never kept:
        # the system prompt and the memory stay the prefix a provider's prompt cache keeps.
        extra, run.nudge = self.context_message(run.plan) + run.knowledge + run.correction + run.nudge, []
        if isinstance(run.memory, TokenWindowMemory):  # a window sized to the context leaves room for these
            run.memory.leave_room(extra, run.specs)
        request = ModelRequest(run.memory.messages() + extra, run.specs, model_config, route.name,
                               run.plan.response_format, self.t.read_blob if self.t.blobs is not None else None,
                               run.tool_choice, cache_key=prompt_cache_key(self.t.config.name, route.name))
        run.sent = request.messages
        if self.t.given is not None and self.t.given[0] is run.memory:
            sent_whole(run, self.t.given[1], request.messages)
            self.t.given = None  # checked once: later calls may have evicted it for tool results
        counted = self.sent_tokens(run.memory, request.messages, len(extra), self.counter(model_config.name))
        price = self.t.config.prices.get(model_config.name)
        if self.attempt is None and self.t.c.journal is not None:
            self.attempt = await self.open_attempt()
        if self.t.config.limits.has_budgets:
            check_budgets(self.t.config.limits, self.usage, self.session_usage(), counted(), price, route.name,
                          self.user_spent())
        # A returning route's answer is its result, and JSON is no text for the user: never streamed.
        # A reply that must cite a source is checked before anyone sees it: not streamed either.
        must_cite = route.knowledge is not None and route.knowledge.cite_required
        streamed = model_config.stream and not run.returning and not route.output and not must_cite
        guard = self.guard
        batcher = StreamBatcher(self.t.emit, bool(route.stream_to_quarkus)) if streamed else None
        sender = batcher.send if batcher is not None else None
        # Output guards hold the stream until checked: the one place chunks leave the engine.
        hold = OutputHold(guard, sender) if sender is not None and guard is not None and guard.holds_output() else None
        chat = tracing.chat_span(model_config.provider, model_config.name, route.name,
                                 model_config.temperature) if self.recorded else tracing.OFF
        with chat as span:
            try:
                response, used, switches = await self.call_model(request, hold if hold is not None else sender)
            finally:
                if batcher is not None:
                    batcher.close()  # what the model sent last goes before anything else of the turn
            sent_tokens: Callable[[], int] | None = counted
            if switches:
                price, sent_tokens = self.t.config.prices.get(used.name), None  # counted with its own encoding
                tracing.record_answered_by(span, used.name, model_config.name)
            text, handed_over = await guard.check_output(response.text, hold) if guard is not None else (response.text, False)
            if text != response.text or handed_over:  # what the user reads is what the memory keeps
                response = replace(response, text=text, tool_calls=[] if handed_over else response.tool_calls)
            calls = _with_ids(response.tool_calls, f"call_{self.t.number}_{self.model_calls}_")
            answer = AssistantMessage(response.text, calls)
            self.answers.append(_answer_record(answer))
            usage = self.account(route.name, used.name, response.usage, price, request.messages, answer,
                                 used.provider, sent_tokens, switches)
            if self.attempt is not None:
                await self.journaled(self.attempt)
            if span is not None:
                content = tracing.capture_content()
                # The storage rule applies to traces: they are kept too (the `storage` guardrails, and
                # the values of `secret: true` variables on a bot without guardrails as on any).
                kept = self.traced(route.name) if content and self.t.config.redacts_kept else _as_is
                tracing.record_answer(span, usage, response.finish_reason,
                                      kept([m.to_dict() for m in request.messages]) if content else None,
                                      kept(answer.to_dict()) if content else None)
        return response, answer

    def traced(self, route: str) -> Callable[[Any], Any]:
        """What a trace keeps of a value: its strings with the `storage` guardrails applied."""
        return storage_mapper(bot_storage_guards(self.t.config, [route]))

    def correct(self, run: RouteRun, text: str | None, problem: str) -> NextStep:
        """A JSON answer that misses the route's `output` schema: asked again once, with what was wrong."""
        route = run.route
        if run.correction:
            assert route.output is not None
            raise TurnFailed(f"route {route.name} ({route.output.where}): the model's answer does not match "
                             f"the route's `output` schema, even after a corrective retry: {problem}")
        run.correction = [AssistantMessage(text), UserMessage(
            f"Your answer is not valid: {problem}. Answer again with only a JSON value that "
            "matches the required schema, and nothing else.")]
        return NextStepRunAgain()

    def cut_off(self, run: RouteRun, calls: bool) -> None:
        """The model's answer stopped at its length limit (`finish_reason: length`, `model.max_tokens`):
        what it says is shown as it is, but the author learns it was cut (a reply may look complete)."""
        what = "its last tool call is not run" if calls else "the reply may be incomplete"
        note = (f"route {run.route.name}: the model's answer was cut off at its length limit "
                f"(model.{_max_tokens(run.model)}); {what}")
        log.warning("session %s, turn %s: %s", self.t.c.id, self.number, note)
        self.t.emit(ev.CONSOLE, note)

    def empty_answer(self, run: RouteRun) -> NextStep | None:
        """An answer with no text and no tool call. If the user has had nothing yet this turn
        (or a called route owes its caller a result), the model is asked again once, with a nudge
        sent in that request only; a second empty answer gets the fallback reply. None: the
        answer stands as it is (the user has had a reply, or a called route returns it empty)."""
        if self.t.said and not run.returning:
            return None  # a tool's message, an earlier text, a question...: the user is not left without a reply
        if not self.nudged:
            self.nudged = True
            run.nudge = [UserMessage(NUDGE)]
            self.t.emit(ev.CONSOLE, f"route {run.route.name}: the model answered nothing (no text, no tool call); "
                        "asked again once")
            return NextStepRunAgain()
        if run.returning:
            return None  # its caller's model reads the empty result and answers the user
        return self.fall_back(run, f"the model answered nothing on route {run.route.name}, again after a nudge")

    def uncited(self, run: RouteRun, text: str | None) -> NextStep:
        """A reply on a route with `cite: required` that cites no passage: the model is asked once
        to cite (or say it does not know); a second such reply gets the route's fallback."""
        if not self.asked_to_cite:
            self.asked_to_cite = True
            run.nudge = [AssistantMessage(text), UserMessage(CITE_NUDGE)]
            self.t.emit(ev.CONSOLE, f"route {run.route.name}: the reply cites no knowledge source "
                        "(`cite: required`); asked again once")
            return NextStepRunAgain()
        return self.fall_back(run, f"the reply on route {run.route.name} cites no knowledge source "
                                   "(`cite: required`), again after being asked to")

    def fall_back(self, run: RouteRun, why: str) -> NextStep:
        """The model has nothing (more) to say: the user gets the route's or the bot's `fallback:`
        (else the built-in text in the session's locale), the route's memory keeps it as the
        answer, and the turn ends normally, keeping what its tool calls did (CHANGELOG, issue 32)."""
        route = run.route
        log.info("session %s, turn %s: %s; the fallback reply was sent", self.t.c.id, self.number, why)
        self.t.emit(ev.CONSOLE, f"{why}; the fallback reply was sent")
        text = self.fallback_text(route)
        run.memory.add(AssistantMessage(text))
        self.t.emit(ev.MESSAGE, text)
        self.t.offer(route.choices, f"route {route.name} choices", route.where)
        return NextStepFinalOutput()

    def fallback_text(self, route: RouteConfig) -> str:
        """The route's `fallback:`, else the bot's, rendered; else (or when it renders blank) the
        built-in text in the session's locale (definition/page_texts.py, `page.fallback`)."""
        source, where = (route.fallback, route.where) if route.fallback else (self.t.config.fallback, self.t.config.where)
        if source:
            text = self.t.render_template(source, "fallback", where)
            if text.strip():
                return text
        return page_texts(self.t.config.catalogs, self.t.c.locale)["fallback"]

    def repeats(self) -> str:
        """For the detail of a turn that reached its limit: when the model went round in circles at
        the end of the turn, the words "; its last N answers all called TOOL with the same
        arguments", else nothing."""
        calls = [answer.get("tool_calls") for answer in self.answers]
        last = calls[-1] if calls else None
        if not last:
            return ""
        n = 0
        for answer_calls in reversed(calls):
            if answer_calls != last:
                break
            n += 1
        names = ", ".join(sorted({c["name"] for c in last}))
        return f"; its last {n} answers all called {names} with the same arguments" if n > 1 else ""

    def answered(self, run: RouteRun, text: str | None, value: Any) -> NextStep:
        """The model answered without tool calls: a returning route's result, a structured
        answer, or a message to the user."""
        route = run.route
        if run.returning:
            return self.return_answer(text or "" if value is None else json.dumps(value, ensure_ascii=False))
        if route.output is not None:
            self.apply_output(route, value)
        elif text and text.strip():  # blanks after a reply are no reply (empty_answer let them stand)
            self.t.emit(ev.MESSAGE, text)
            if run.cited:  # a route without knowledge never enters engine/grounding.py
                grounding.send_sources(self.t, run.cited)
        if route.choices is not None:  # no choices, no event: most answers skip the call and its label
            self.t.offer(route.choices, f"route {route.name} choices", route.where)
        return NextStepFinalOutput()

    def apply_output(self, route: RouteConfig, value: Any) -> None:
        """A valid structured answer: an Object event, then the output's `set` assignments."""
        output = route.output
        assert output is not None
        self.t.emit(ev.OBJECT, value)
        self.t.assign(output.set, "output set", output.where, {"output": value}, f"route {route.name}")

    def return_answer(self, text: str) -> NextStep:
        """A called route with `returns: answer` answered: that answer is its result. Its scope
        pops, the answer becomes the result of the call waiting in the parent, which resumes."""
        self.t.resume(self.t.c.pop_scope(text))
        self.t.emit(ev.ROUTE_CHANGED, {"route": self.t.c.scope.route, "stack": self.t.c.stack})
        return NextStepHandoff()

    def finish(self) -> None:
        """End of turn: scheduled wipes, then one-turn memories forget; an `end` ends the conversation."""
        for scope in self.t.c.scopes:
            if scope.id in self.t.wipe_scheduled and scope.id not in self.t.wipe_aborted:
                self.t.c.clear_scope_memories(scope)
        self.t.c.forget_turn_memories()
        if self.t.ended:
            route = self.t.c.scope.route
            self.t.c.end(self.t.ended)
            self.t.emit(ev.ENDED, {"route": route, "tool": self.t.ended})

    # -- rendering ----------------------------------------------------------------
    def add_system(self, memory: ChatMemory, route: RouteConfig) -> None:
        if route.system:
            text = self.t.render_template(route.system, f"route {route.name} system", route.where)
            if not text.strip():
                # An empty SystemMessage would replace the route's instructions in the memory
                # (LangChain4j's rule); fail the turn instead, naming the template.
                raise TurnFailed(f"{route.where}: route {route.name} system template rendered empty text; "
                                 "the model would lose its instructions (make the template always say something)")
            memory.add(SystemMessage(text))

    def context_message(self, plan: RoutePlan) -> list[Message]:
        """The route's (else the bot's) `context:` rendered now, as the message that follows the
        memory on this call; none when it is not declared or renders blank."""
        source, route = plan.context, plan.route
        if not source:
            return []
        where = route.where if route.context is not None else self.t.config.where
        # Stripped: a line left empty by an `{% if %}` would make the text differ in nothing but blanks.
        text = self.t.render_template(source, f"route {route.name} context", where).strip()
        return [ContextMessage(text)] if text else []

    # -- summaries --------------------------------------------------------------

    def may_summarize(self) -> bool:
        """Whether summarize() has anything to look at: a `summary` memory among those loaded.
        Most turns have none, and the look (the live scopes' memory ids) cost ~20,000 instructions
        a turn (issue 39)."""
        return self.t.c.has_loaded(SummaryMemory)

    def kept_text(self, text: str) -> str:
        """`text` (a failure's, which may quote what was said) as what keeps it may hold it: the
        `storage` guards of the routes this turn ran on (engine/guardrails.py `kept_text`)."""
        return kept_text(self.t.config, [*self.hops, self.t.c.scope.route], text)

    async def summarize(self) -> None:
        """After the reply: fold what `summary` memories have outgrown into their running
        summaries. A failed summary fails nothing: the memory stays as it is (larger than its
        trigger) and the next turn tries again; the history and the log say why."""
        for memory_id, route, memory in self.t.c.loaded_memories():
            if not isinstance(memory, SummaryMemory):
                continue
            folded = memory.fold_plan()
            if not folded:
                continue
            policy = self.t.config.route_memory(route)
            try:
                text = await self.summary_call(route, policy.summary_prompt or SUMMARY_PROMPT,
                                               _fold_text(memory, folded))
                memory.apply_summary(text, folded)
                self.summaries.append({"memory": memory_id, "folded": len(folded)})
            except Exception as exc:  # a summary never fails the turn
                reason = self.kept_text(f"{type(exc).__name__}: {exc}")  # it may quote what was said
                log.warning("session %s: summarizing memory %s failed (the turn goes on, the next one "
                            "retries): %s", self.t.c.id, memory_id, reason)
                self.summaries.append({"memory": memory_id, "failed": reason})

    async def summary_call(self, route: str, instructions: str, text: str) -> str:
        """One summarizing call on `route`'s summary model (its model with the memory's
        `summary_model:` over it), accounted like any call; raises when it answers no text."""
        policy = self.t.config.route_memory(route)
        config = self.t.config.route_model(route).merged(policy.summary_model)
        request = ModelRequest([SystemMessage(instructions), UserMessage(text)], [], config, f"{route} (summary)")
        if self.attempt is None and self.t.c.journal is not None:
            self.attempt = await self.open_attempt()
        with tracing.chat_span(config.provider, config.name, request.route, config.temperature) as span:
            response, used, switches = await self.call_model(request, None)
            tracing.record_answered_by(span, used.name, config.name)
        answer = AssistantMessage(response.text)
        self.account(request.route, used.name, response.usage, self.t.config.prices.get(used.name),
                     request.messages, answer, used.provider, switches=switches)
        if self.attempt is not None:
            await self.journaled(self.attempt)
        return summary_answer(response, used, "the memory's summary_model")

    async def call_model(self, request: ModelRequest, on_chunk: ChunkCallback | None
                         ) -> tuple[ModelResponse, ModelConfig, list[Switch]]:
        """The request answered by its model, else by the next of its `fallback:` (models/fallback.py):
        (the answer, the config of the model that gave it, the moves made). Each move is counted
        (metrics), noted on the call's span and logged."""
        if not request.config.fallback:  # the one call, as before fallbacks (models/fallback.py is not entered)
            model = self.model.for_request(request)  # no text-call reader where no call can be read
            return await observe.timed_call(model, request, on_chunk), request.config, []

        def switched(switch: Switch) -> None:
            observe.model_fallback(switch.from_model, switch.to_model, switch.reason)
            tracing.model_fallback(switch.from_model, switch.to_model, switch.reason)
            log.info("session %s, turn %s, route %s: model %s could not answer (%s); asking %s",
                     self.t.c.id, self.number, request.route, switch.from_model, switch.reason, switch.to_model)

        answered = await fallback.complete(self.model, request, on_chunk, observe.timed_call, self.breakers,
                                           self.t.c.clock.now, switched)
        return answered.response, answered.config, answered.switches

    async def open_attempt(self) -> Attempt:
        """Before the turn's first model call, on a server that records each call's usage as it
        ends (store/billing.py): the attempt, with the session's earlier attempts that never
        committed, which the budgets count from now on and the turn's commit counts once."""
        c = self.t.c
        assert c.journal is not None
        if c.record_read and c.journal.local:  # only this process writes the record: it knows it
            return Attempt([])
        c.record_read = True  # a live copy is dropped when a commit of it fails: it counted what it read
        known, c.lease_record = c.lease_record, None  # read with the lease: for this request's first attempt only
        return Attempt(unfinished(await c.journal.read(c.id, known), c.billed))

    async def journaled(self, attempt: Attempt) -> None:
        """A model call ended: the attempt's usage so far recorded durably (one write), so a process
        killed before the commit does not lose what the provider billed."""
        c = self.t.c
        assert c.journal is not None
        record = attempt.record(self.number, self.usage, self.calls_usage, c.config.content_version)
        if await c.journal.write(c.id, record):
            attempt.written = True

    def session_usage(self) -> Usage:
        """The session's usage the budgets count: with the earlier attempts that never committed."""
        return self.with_unfinished(self.t.c.usage)

    def with_unfinished(self, usage: Usage) -> Usage:
        """`usage` with what the session's earlier attempts that never committed used (a killed
        server's, store/billing.py), which this turn's commit counts; `usage` itself when none."""
        if self.attempt is None or not self.attempt.unfinished:
            return usage
        total = usage.copy()
        total.add(self.attempt.earlier())
        return total

    def user_spent(self) -> UserSpent | None:
        """What the user's budgets count (limits.max_user_*): with the earlier attempts that never
        committed, which this turn's commit charges to the user too (server/user_budgets.py)."""
        spent = self.t.c.user_spent
        return None if spent is None else replace(spent, usage=self.with_unfinished(spent.usage))

    def account(self, route: str, model: str, raw: dict[str, Any], price: Price | None,
                sent: list[Message], answer: AssistantMessage, provider: str,
                sent_tokens: Callable[[], int] | None = None, switches: list[Switch] | None = None) -> dict[str, Any]:
        """Add one call's usage to the turn's; returns the call's entry for the history (`model`:
        the model that answered; `fallbacks`: the moves from the route's own model to it)."""
        usage = call_usage(raw, price, sent, answer, self.counter(model), sent_tokens)
        self.usage.add(usage)
        entry = {"route": route, "model": model, **usage.to_dict()}
        if switches:
            entry["fallbacks"] = [{"from": s.from_model, "to": s.to_model, "reason": s.reason} for s in switches]
        del entry["calls"]
        self.calls_usage.append(entry)
        observe.model_usage(provider, model, entry)
        return entry

    @staticmethod
    def sent_tokens(memory: ChatMemory, sent: list[Message], extra: int, count: TokenCounter) -> Callable[[], int]:
        """What counts the tokens of a call's messages `sent` (the memory's, then `extra` more): the
        window's running total while the memory is as it was sent, else one by one (issue 26)."""
        version = getattr(memory, "version", None)
        total = getattr(memory, "token_sum", None)

        def tokens() -> int:
            if total is not None and version is not None and getattr(memory, "version", None) == version:
                return int(total(count)) + sum(map(count, sent[len(sent) - extra:]))
            return sum(map(count, sent))
        return tokens

    def counter(self, model: str) -> TokenCounter:
        """The token counter of a model's encoding (it keeps each message's count with the message),
        or the pinned one (a transcript's `tokenizer:`): usage estimates then agree on every machine."""
        key = (self.t.c.tokenizer, model)
        counters = self.t.tools.counters  # made once per bot, shared by its turns
        counter = counters.get(key)
        if counter is None:
            pinned = self.t.c.tokenizer
            counter = counters[key] = pinned_counter(pinned) if pinned else tiktoken_counter(model_name=model)
        return counter

    # -- tools ----------------------------------------------------------------------


# What the model reads, in the next request only, after an answer with no text and no tool call.
NUDGE = ("(Your last answer was empty. Answer the user's last message now: reply with text, or call one of "
         "your tools.)")

SUMMARY_PROMPT = (
    "You keep the running summary of a conversation between a user and an assistant. You are "
    "given the summary so far (if any) and the messages that follow it. Write the new summary: "
    "the summary so far extended with what those messages add — facts the user gave, decisions, "
    "open questions, results of tool calls — in at most 200 words, in the conversation's language. "
    "Answer with the summary only."
)


def _fold_text(memory: SummaryMemory, folded: list[Message]) -> str:
    """The summarizing call's input: the summary so far, then the folded messages as a transcript."""
    lines = []
    if memory.summary is not None:
        lines += ["Summary so far:", memory.summary.content, ""]
    lines.append("Messages to add to it:")
    for message in folded:
        text = message.text().strip()
        if text:
            lines.append(f"{message.role}: {text}")
    return "\n".join(lines)



def summary_answer(response: ModelResponse, used: ModelConfig, whose: str) -> str:
    """A summarizing call's text, else ModelError: it answered none, or it was cut off at its length
    limit (the start of a summary, without its end: taking it would lose what it was to keep)."""
    text = (response.text or "").strip()
    if not text:
        raise ModelError("the summarizing call answered no text")
    if response.finish_reason == "length":
        raise ModelError(f"the summarizing call was cut off at its length limit ({_max_tokens(used)}), so its "
                         f"summary lacks its end; give {whose} a larger max_tokens")
    return text


def _max_tokens(model: ModelConfig) -> str:
    """The length limit a cut-off answer reached, as the author set it (else the server's own)."""
    return f"max_tokens = {model.max_tokens}" if model.max_tokens is not None else "max_tokens not set: the server's own limit"


def sendable_tool_choice(choice: str | None, offered: dict[str, ToolConfig]) -> str | None:
    """A route's `tool_choice` as it can be sent: a tool's name only when that tool is offered
    now (a condition may hide it; naming a tool the request lacks is refused by endpoints)."""
    if choice is None or not offered:
        return None
    if choice in ("auto", "required", "none") or choice in offered:
        return choice
    log.info("tool_choice %s is not sent: that tool is not offered on this call", choice)
    return None


def prompt_cache_key(bot: str, route: str) -> str:
    """A route's provider prompt-cache key: `bot/route`, the same on every call and replica (OpenAI
    takes at most 64 characters: a longer one becomes a digest of it)."""
    key = f"{bot}/{route}"
    if len(key) <= 64:
        return key
    return "chatrun-" + hashlib.sha256(key.encode()).hexdigest()[:40]


def _as_is(value: Any) -> Any:
    return value


def _with_ids(calls: list[ToolCall], prefix: str) -> tuple[ToolCall, ...]:
    """The answer's calls, each with an id of its own: the model's, else (none, or one an earlier
    call of the answer has: a server that gives every call the same id) `prefix` and its place.
    A result is paired with its call by id: a second call of one id would lose its result."""
    out: list[ToolCall] = []
    taken: set[str] = set()
    for i, c in enumerate(calls):
        call_id = c.id if c.id and c.id not in taken else f"{prefix}{i}"
        taken.add(call_id)
        out.append(ToolCall(call_id, c.name, c.arguments))
    return tuple(out)


def _answer_record(answer: AssistantMessage) -> dict[str, Any]:
    """A model answer as a transcript's `model:` item writes it: its text, and its tool calls
    with their arguments as the model sent them (a mapping when they are a JSON object)."""
    if not answer.tool_calls:  # most answers: text alone, no JSON round trip for it
        return {"text": storable(answer.content or "")}
    out: dict[str, Any] = {}
    if answer.content:
        out["text"] = answer.content
    if answer.tool_calls:
        out["tool_calls"] = [{"name": c.name, "arguments": _arguments(c.arguments)} for c in answer.tool_calls]
    stored: dict[str, Any] = storable(out or {"text": ""})
    return stored


def _arguments(raw: str) -> Any:
    try:
        decoded = json.loads(raw)
    except ValueError:
        return raw
    return decoded if isinstance(decoded, dict) else raw

