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

import copy
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from chatrun import events as ev
from chatrun.definition.config import (
    ActionConfig,
    Location,
    ModelConfig,
    Price,
    RouteConfig,
    ToolConfig,
)
from chatrun.definition.templates import holds, is_nothing
from chatrun.engine import observe, tracing, waiting
from chatrun.engine.binding import Unbound, bind_arguments, ignored_note
from chatrun.engine.conversation import Conversation
from chatrun.engine.pending import Decision
from chatrun.engine.scopes import Scope, ScopeView, get_path, set_path
from chatrun.engine.steps import (
    NextStep,
    NextStepFinalOutput,
    NextStepHandoff,
    NextStepPause,
    NextStepRunAgain,
    ToolOutcome,
    combine,
)
from chatrun.engine.tools import (
    BoundInvalid,
    Toolbox,
    ToolMocks,
    check_arguments,
    decode_arguments,
    parse_output,
    response_format,
    result_text,
    tool_spec,
)
from chatrun.engine.usage import Usage, call_usage, check_budgets
from chatrun.errors import ChatrunError, ModelError, ToolRefusal, TurnFailed
from chatrun.memory import ChatMemory, SummaryMemory
from chatrun.memory.tokens import TokenCounter, pinned_counter, tiktoken_counter
from chatrun.messages import (
    AssistantMessage,
    Attachment,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.models.base import ChatModel, ModelRequest, ModelResponse
from chatrun.store.blobs import BlobArea
from chatrun.toolkinds.base import ToolFailed, Writable

Emit = Callable[..., None]  # (type, data, runtime=False, audience=None, multi=False)
log = logging.getLogger("chatrun.engine")


@dataclass
class WorkingState:
    """The copies of the state a tool's own code writes to (Turn.working_copy)."""

    state: dict[str, Any]
    scopes: list[Scope]
    turn: dict[str, Any]


@dataclass
class RouteRun:
    """What a route's model loop works with, gathered once per route invocation."""

    route: RouteConfig
    memory: ChatMemory  # the scope's memory of the route
    offered: dict[str, ToolConfig]
    specs: list[dict[str, Any]]  # the offered tools as the model sees them
    model: ModelConfig
    returning: bool  # a called route with `returns: answer`: its answer is the call's result
    # A rejected JSON answer and what was wrong with it, sent after the memory's messages (never
    # kept in the memory); once set it stays for the rest of this route's loop, as it always has.
    correction: list[Message] = field(default_factory=list)


class Turn:
    """Runs one user input on a conversation; `emit` sends the turn's events as they happen."""

    def __init__(self, conversation: Conversation, tools: Toolbox, model: ChatModel, emit: Emit,
                 text: str | None, data: dict[str, Any], mocks: ToolMocks | None = None,
                 decision: Decision | None = None, attachments: tuple[Attachment, ...] = (),
                 blobs: BlobArea | None = None):
        self.c = conversation
        self.config = conversation.config
        self.tools = tools
        self.model = model
        self.emit = emit
        self.mocks = mocks
        self.number = conversation.turn_count + 1
        self.user_message = text
        self.data = data
        self.attachments = attachments  # the files sent with the message: in its UserMessage
        self.blobs = blobs
        self.turn_state: dict[str, Any] = {}
        self.model_calls = 0
        self.usage = Usage()  # the turn's model calls, summed
        self.calls_usage: list[dict[str, Any]] = []  # each call's, for the history
        self._counters: dict[str, TokenCounter] = {}
        self.summaries: list[dict[str, Any]] = []  # what summarize() did, for the history
        self.hops: list[str] = []
        # Each tool call of the turn, in order, for the history (its `calls`): the tool, the route
        # it ran on, the arguments it ran with (bound ones included), its result, and what the
        # model read of it (`reply`, or `error` when it failed).
        self.tool_calls: list[dict[str, Any]] = []
        # Each model answer of the turn ({text?, tool_calls?}), for the history (its `model`): with
        # `calls`, what `chatrun record --from-session` replays the turn from.
        self.answers: list[dict[str, Any]] = []
        self.wipe_scheduled: set[str] = set()
        self.wipe_aborted: set[str] = set()
        # Memories that have this turn's user message, or resume a call without it: a route run
        # again in the same turn (pop + execute, a route change back) does not get it twice.
        self.user_given: set[str] = set()
        self.ended: str | None = None  # the tool that ended the conversation
        self.work: WorkingState | None = None  # the copies the current tool's own code writes to
        self.decision = decision  # the input of a decision turn (Approve, Answer, Expire, ...), else None
        self.decision_info: dict[str, Any] | None = None  # `decision` in templates while one applies
        self.paused = False  # a call of this turn waits (approval, question, operator)

    # -- the loop ---------------------------------------------------------------

    async def run(self) -> None:
        # The current route runs first, unless something waits (engine/waiting.py): then a decision
        # resolves it and the loop goes on (run again or hand off), or a message is handled without it.
        step: NextStep = await waiting.first_step(self)
        while isinstance(step, NextStepHandoff | NextStepRunAgain):
            route = self.c.scope.route
            self.hops.append(route)
            if len(self.hops) > self.config.limits.max_hops:
                raise TurnFailed(
                    f"this turn invoked routes {len(self.hops) - 1} times ({' -> '.join(self.hops[:-1])}), "
                    f"more than limits.max_hops = {self.config.limits.max_hops}; a tool probably executes "
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
        scope = self.c.scope
        route = self.config.routes[scope.route]
        memory = self.c.memory_for(scope, route.name)
        memory_id = scope.memory_id(route.name)
        if memory_id not in self.user_given:
            self.user_given.add(memory_id)
            user_text = self.render_user(route)  # the system prompt goes first anyway: memories keep it first
            if user_text or self.attachments:  # files alone are a message too (a photo, no words)
                memory.add(UserMessage(user_text or "", self.attachments))
        offered = await self.tools.offered(route, self.mocks)
        return RouteRun(route, memory, offered, [tool_spec(t) for t in offered.values()],
                        self.config.route_model(route.name), route.returns == "answer" and scope.caller is not None)

    async def model_step(self, run: RouteRun) -> NextStep:
        """One model call on the route and what follows from its answer."""
        response, answer = await self.ask_model(run)
        route, calls = run.route, answer.tool_calls
        value = None
        if route.output is not None and not calls:
            value, problem = parse_output(response.text, self.tools.output_validator(route.name))
            if problem is not None:
                return self.correct(run, response.text, problem)
        run.memory.add(answer)
        if not calls:
            return self.answered(run, response.text, value)
        if response.text:
            self.emit(ev.MESSAGE, response.text)
        outcomes = await self.run_calls(route, run.offered, calls)
        for call, outcome in zip(calls, outcomes, strict=True):
            if outcome.deferred:
                continue  # the called route's result answers it when it returns
            # Into the memory that holds the call; a cleared or popped memory drops it as an orphan.
            run.memory.add(ToolResultMessage(call.id, call.name, outcome.reply))
        return combine(outcome.next for outcome in outcomes)

    async def ask_model(self, run: RouteRun) -> tuple[ModelResponse, AssistantMessage]:
        """Call the model (within the turn's limits and budgets, traced, its usage counted)."""
        route, model_config = run.route, run.model
        self.model_calls += 1
        if self.model_calls > self.config.limits.max_model_calls:
            raise TurnFailed(
                f"this turn called the model {self.model_calls - 1} times, more than "
                f"limits.max_model_calls = {self.config.limits.max_model_calls} (route {route.name})"
            )
        self.add_system(run.memory, route)
        request = ModelRequest(run.memory.messages() + run.correction, run.specs, model_config, route.name,
                               response_format(route), self.read_blob if self.blobs is not None else None)
        sent_tokens = self.sent_tokens(run.memory, request.messages, len(run.correction),
                                       self.counter(model_config.name))
        price = self.config.prices.get(model_config.name)
        if self.config.limits.has_budgets:
            sent = sent_tokens()
            check_budgets(self.config.limits, self.usage, self.c.usage, sent, price, route.name)
        # A returning route's answer is its result, and JSON is no text for the user: never streamed.
        streamed = model_config.stream and not run.returning and not route.output
        with tracing.chat_span(model_config.provider, model_config.name, route.name,
                               model_config.temperature) as span:
            response = await observe.timed_call(self.model, request, self.chunk_sender(bool(route.stream_to_quarkus)) if streamed else None)
            calls = tuple(
                ToolCall(c.id or f"call_{self.number}_{self.model_calls}_{i}", c.name, c.arguments)
                for i, c in enumerate(response.tool_calls)
            )
            answer = AssistantMessage(response.text, calls)
            self.answers.append(_answer_record(answer))
            usage = self.account(route.name, model_config.name, response.usage, price, request.messages, answer,
                                 model_config.provider, sent_tokens)
            if span is not None:
                content = tracing.capture_content()
                tracing.record_answer(span, usage, response.finish_reason,
                                      [m.to_dict() for m in request.messages] if content else None,
                                      answer.to_dict() if content else None)
        return response, answer

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

    def answered(self, run: RouteRun, text: str | None, value: Any) -> NextStep:
        """The model answered without tool calls: a returning route's result, a structured
        answer, or a message to the user."""
        route = run.route
        if run.returning:
            return self.return_answer(text or "" if value is None else json.dumps(value, ensure_ascii=False))
        if route.output is not None:
            self.apply_output(route, value)
        elif text:
            self.emit(ev.MESSAGE, text)
        self.offer(route.choices, f"route {route.name} choices", route.where)
        return NextStepFinalOutput()

    async def run_calls(self, route: RouteConfig, offered: dict[str, ToolConfig],
                        calls: tuple[ToolCall, ...]) -> list[ToolOutcome]:
        outcomes: list[ToolOutcome] = []
        left = False
        for call in calls:
            if left:
                where = ("an earlier tool call ended the conversation" if self.ended else
                         "an earlier tool call waits for a person; call this again after it is resolved"
                         if self.paused else
                         f"an earlier tool call moved the conversation to route {self.c.scope.route}")
                outcomes.append(ToolOutcome(f"Not run: {where}."))
                continue
            with tracing.tool_span(call.name, call.id, _action_words(offered.get(call.name))) as span:
                outcome = await self.timed_tool(offered, call)
                if outcome.failed:
                    tracing.tool_failed(span)
            left = outcome.moved
            self.paused = self.paused or isinstance(outcome.next, NextStepPause)
            outcomes.append(outcome)
        return outcomes

    def offer(self, choices: list[Any] | str | None, what: str, where: Any,
              values: dict[str, Any] | None = None) -> None:
        """A Choices event: static choices, or a template's list (none or empty: no event)."""
        normalized = self.choice_list(choices, what, where, values)
        if normalized:
            self.emit(ev.CHOICES, {"choices": normalized})

    def choice_list(self, choices: list[Any] | str | None, what: str, where: Any,
                    values: dict[str, Any] | None = None) -> list[dict[str, str]]:
        """Choices as `[{label, value}]`: static ones, or a template's list (none: no choices)."""
        if choices is None:
            return []
        items = self.render_template(choices, what, where, values, typed=True) if isinstance(choices, str) else choices
        if is_nothing(items):
            return []
        if not isinstance(items, list):
            raise TurnFailed(f"{where}: {what}: the template gave {type(items).__name__}, not a list of choices")
        normalized = []
        for item in items:
            if isinstance(item, dict) and item.get("label") not in (None, ""):
                normalized.append({"label": str(item["label"]), "value": str(item.get("value") or item["label"])})
            elif isinstance(item, (str, int, float)) and not isinstance(item, bool) and str(item):
                normalized.append({"label": str(item), "value": str(item)})
            else:
                raise TurnFailed(f"{where}: {what}: {item!r} is not a choice (a text, or a mapping with a label)")
        return normalized

    def apply_output(self, route: RouteConfig, value: Any) -> None:
        """A valid structured answer: an Object event, then the output's `set` assignments."""
        output = route.output
        assert output is not None
        self.emit(ev.OBJECT, value)
        roots = self.roots()
        for path, template in output.set.items():
            assigned = self.render_template(template, f"output set {path}", output.where, {"output": value}, typed=True)
            if self.assigns_nothing(template, assigned):
                continue
            try:
                set_path(roots, path, copy.deepcopy(None if is_nothing(assigned) else assigned))
            except ChatrunError as exc:
                raise TurnFailed(f"route {route.name} ({output.where}): {exc}") from exc

    def return_answer(self, text: str) -> NextStep:
        """A called route with `returns: answer` answered: that answer is its result. Its scope
        pops, the answer becomes the result of the call waiting in the parent, which resumes."""
        self.resume(self.c.pop_scope(text))
        self.emit(ev.ROUTE_CHANGED, {"route": self.c.scope.route, "stack": self.c.stack})
        return NextStepHandoff()

    def resume(self, caller: dict[str, str] | None) -> None:
        """After a called scope returned: the parent runs on without this turn's user message (the
        called route had it; the parent's memory ends with the call and its result)."""
        if caller is not None:
            self.user_given.add(self.c.scope.memory_id(self.c.scope.route))

    def finish(self) -> None:
        """End of turn: scheduled wipes, then one-turn memories forget; an `end` ends the conversation."""
        for scope in self.c.scopes:
            if scope.id in self.wipe_scheduled and scope.id not in self.wipe_aborted:
                self.c.clear_scope_memories(scope)
        self.c.forget_turn_memories()
        if self.ended:
            route = self.c.scope.route
            self.c.end(self.ended)
            self.emit(ev.ENDED, {"route": route, "tool": self.ended})

    # -- rendering ----------------------------------------------------------------

    @overload
    def render_template(self, source: Any, what: str, where: Any, values: dict[str, Any] | None = None,
                        *, typed: Literal[False] = False) -> str: ...

    @overload
    def render_template(self, source: Any, what: str, where: Any, values: dict[str, Any] | None = None,
                        *, typed: bool) -> Any: ...

    def render_template(self, source: Any, what: str, where: Any, values: dict[str, Any] | None = None,
                        *, typed: bool = False) -> Any:
        """Render for text (typed=False) or for a value that keeps its type (setters, event data).
        `values` adds to what templates see (a tool's `args` and `result`)."""
        try:
            return self.c.render(source, self.context(**(values or {})), typed=typed)
        except ChatrunError:
            raise
        except Exception as exc:  # jinja2 UndefinedError, TypeError in filters, ...
            raise TurnFailed(f"{where}: {what} template failed: {exc}") from exc

    def context(self, **values: Any) -> dict[str, Any]:
        """What this turn's templates see, with `values` (a tool's `args`, `result`) and, while a
        decision applies, `decision`."""
        if self.decision_info is not None:
            values = {"decision": self.decision_info, **values}
        return self.c.template_context(self.turn_state, self.user_message, self.data, **values)

    def add_system(self, memory: ChatMemory, route: RouteConfig) -> None:
        if route.system:
            text = self.render_template(route.system, f"route {route.name} system", route.where)
            if not text.strip():
                # An empty SystemMessage would replace the route's instructions in the memory
                # (LangChain4j's rule); fail the turn instead, naming the template.
                raise TurnFailed(f"{route.where}: route {route.name} system template rendered empty text; "
                                 "the model would lose its instructions (make the template always say something)")
            memory.add(SystemMessage(text))

    def read_blob(self, ref: str) -> bytes | None:
        return self.blobs.read(self.c.id, ref) if self.blobs is not None else None

    def conversation_attachments(self) -> list[Attachment]:
        """The files the current route's memory holds (what its model has seen), oldest first,
        each once, then this turn's message's (a route whose memory keeps no user message)."""
        scope = self.c.scope
        memory = self.c.memory_for(scope, scope.route, create=False)
        found: dict[str, Attachment] = {}
        for message in [*memory.messages(), UserMessage("", self.attachments)]:
            for attachment in message.attachments if isinstance(message, UserMessage) else ():
                found.pop(attachment.ref, None)  # seen again: it is as new as its latest sending
                found[attachment.ref] = attachment
        return list(found.values())

    def render_user(self, route: RouteConfig) -> str | None:
        if route.user:
            return self.render_template(route.user, f"route {route.name} user", route.where)
        if self.user_message is not None:
            return self.user_message
        if self.data:
            return json.dumps(self.data, ensure_ascii=False)
        return None

    # -- summaries --------------------------------------------------------------

    async def summarize(self) -> None:
        """After the reply: fold what `summary` memories have outgrown into their running
        summaries. A failed summary fails nothing: the memory stays as it is (larger than its
        trigger) and the next turn tries again; the history and the log say why."""
        for memory_id, route, memory in self.c.loaded_memories():
            if not isinstance(memory, SummaryMemory):
                continue
            folded = memory.fold_plan()
            if not folded:
                continue
            policy = self.config.route_memory(route)
            try:
                text = await self.summary_call(route, policy.summary_prompt or SUMMARY_PROMPT,
                                               _fold_text(memory, folded))
                memory.apply_summary(text, folded)
                self.summaries.append({"memory": memory_id, "folded": len(folded)})
            except Exception as exc:  # a summary never fails the turn
                reason = f"{type(exc).__name__}: {exc}"
                log.warning("session %s: summarizing memory %s failed (the turn goes on, the next one "
                            "retries): %s", self.c.id, memory_id, reason)
                self.summaries.append({"memory": memory_id, "failed": reason})

    async def summary_call(self, route: str, instructions: str, text: str) -> str:
        """One summarizing call on `route`'s summary model (its model with the memory's
        `summary_model:` over it), accounted like any call; raises when it answers no text."""
        policy = self.config.route_memory(route)
        config = self.config.route_model(route).merged(policy.summary_model)
        request = ModelRequest([SystemMessage(instructions), UserMessage(text)], [], config, f"{route} (summary)")
        with tracing.chat_span(config.provider, config.name, request.route, config.temperature):
            response = await observe.timed_call(self.model, request, None)
        answer = AssistantMessage(response.text)
        self.account(request.route, config.name, response.usage, self.config.prices.get(config.name),
                     request.messages, answer, config.provider)
        if not (response.text or "").strip():
            raise ModelError("the summarizing call answered no text")
        return (response.text or "").strip()

    def account(self, route: str, model: str, raw: dict[str, Any], price: Price | None,
                sent: list[Message], answer: AssistantMessage, provider: str,
                sent_tokens: Callable[[], int] | None = None) -> dict[str, Any]:
        """Add one call's usage to the turn's; returns the call's entry for the history."""
        usage = call_usage(raw, price, sent, answer, self.counter(model), sent_tokens)
        self.usage.add(usage)
        entry = {"route": route, "model": model, **usage.to_dict()}
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
        counter = self._counters.get(model)
        if counter is None:
            pinned = self.c.tokenizer
            counter = pinned_counter(pinned) if pinned else tiktoken_counter(model_name=model)
            self._counters[model] = counter
        return counter

    def chunk_sender(self, multi: bool) -> Callable[[str], Awaitable[None]]:
        """What the model calls with each chunk of a streamed reply: a Stream event. `multi`: the
        route streams to Quarkus-dialect clients too (`stream_to_quarkus`, Quarkus' Multi<String>)."""
        async def send(chunk: str) -> None:
            if chunk:
                self.emit(ev.STREAM, chunk, multi=multi)
        return send

    # -- tools ----------------------------------------------------------------------

    async def timed_tool(self, offered: dict[str, ToolConfig], call: ToolCall) -> ToolOutcome:
        """run_tool, reporting its duration and whether it failed to whoever observes the turn."""
        if not observe.active():
            return await self.run_tool(offered, call)
        started, failed = time.perf_counter(), True
        try:
            outcome = await self.run_tool(offered, call)
            failed = outcome.failed
            return outcome
        finally:  # a failure that fails the turn counts too
            # A name the model made up is not a label: one series per invented name would never end.
            observe.tool_call(call.name if call.name in offered else "(unknown)", time.perf_counter() - started,
                              failed)

    async def run_tool(self, offered: dict[str, ToolConfig], call: ToolCall) -> ToolOutcome:
        record: dict[str, Any] = {"tool": call.name, "route": self.c.scope.route}
        self.tool_calls.append(record)
        outcome = await self.run_offered_tool(offered, call, record)
        record["error" if outcome.failed else "reply"] = _storable(outcome.reply)  # what the model reads
        return outcome

    async def run_offered_tool(self, offered: dict[str, ToolConfig], call: ToolCall,
                               record: dict[str, Any]) -> ToolOutcome:
        tool = offered.get(call.name)
        if tool is None:
            names = ", ".join(offered) or "none"
            return ToolOutcome(f"Error: there is no tool {call.name!r} here. Tools you can call: {names}.",
                               failed=True)
        try:
            args, ignored = self.arguments(tool, call.arguments)
            record["args"] = _storable(args)
            self.check_requires(tool)
            self.check_action(tool)
            if waiting.needs_approval(self, tool, args):  # nothing of the tool runs before the decision
                return waiting.request_approval(self, tool, args, call.id)
        except ToolRefusal as refusal:
            return ToolOutcome(str(refusal), failed=True)
        outcome = await self.run_checked_tool(tool, args, call.id)
        if ignored:  # the model sent arguments the bot sets: it reads that they were not its to give
            outcome.reply += ignored_note(ignored)
        return outcome

    def arguments(self, tool: ToolConfig, raw: str) -> tuple[dict[str, Any], list[str]]:
        """The call's arguments: the model's, with the tool's bound arguments (`bind:`) put in
        over whatever it sent for them, checked against the tool's `parameters`. Returns them
        and the bound names the model sent (ignored)."""
        sent = decode_arguments(tool, raw)
        model_args = {k: v for k, v in sent.items() if k not in tool.bind}

        def render(source: Any, what: str) -> Any:
            return self.render_template(source, f"{what} of tool {tool.name}", tool.where, {"args": model_args},
                                        typed=True)

        try:
            args, ignored = bind_arguments(tool, sent, render)
            check_arguments(tool, args, self.tools.argument_validator(tool))
        except Unbound as unbound:
            why = "" if self.c.principal is not None else " (no one is signed in)"
            self.emit(ev.ERROR, f"{tool.name} could not run: the bot has no value for its argument `{unbound.name}`"
                      f"{why}", runtime=True, meta={"detail": f"{tool.where}: {unbound}{why}"})
            raise ToolRefusal(f"Error: {tool.name} cannot run: its argument `{unbound.name}` is set by the bot "
                              "and has no value here. Nothing was sent.") from None
        except BoundInvalid as invalid:
            self.emit(ev.ERROR, f"{tool.name} could not run: a value the bot gives its arguments is invalid",
                      runtime=True, meta={"detail": f"{tool.where}: {invalid.detail}"})
            raise
        if ignored:
            self.emit(ev.CONSOLE, f"tool {tool.name}: the model sent {', '.join(ignored)}, which the bot binds; "
                      "ignored, the bound value was used")
        return args, ignored

    async def run_checked_tool(self, tool: ToolConfig, args: dict[str, Any], call_id: str) -> ToolOutcome:
        """A call whose arguments, requirements and action were checked: its result, then its action."""
        self.work = None
        asks = tool.action.ask is not None  # the action applies once the answer is in (engine/waiting.py)
        try:
            result = await self.tool_result(tool, args)
            action = tool.action if asks else self.choose(tool, args, result)
            if action is not tool.action:
                self.check_action(tool, action)  # a case's move, now that the case is known
        except ToolRefusal as refusal:  # the handler refused, the API call failed, the case cannot complete
            return ToolOutcome(str(refusal), failed=True)  # nothing applies: the handler's writes were to copies
        except ToolFailed as failure:
            if tool.on_error is None:
                raise TurnFailed(str(failure)) from failure.__cause__
            return self.handler_error(tool, args, failure)
        if self.work is not None:
            self.adopt(self.work)
        if asks:
            return waiting.ask_question(self, tool, args, result, call_id)
        return await self.apply(tool, args, result, action, call_id)

    async def tool_result(self, tool: ToolConfig, args: dict[str, Any]) -> Any:
        """What the tool's mock, handler or HTTP call gives as `result` (None: an action-only
        tool), kept in the call's history record."""
        result = await self.tool_result_of(tool, args)
        if result is not None and self.tool_calls:
            self.tool_calls[-1]["result"] = _storable(result)
        return result

    async def tool_result_of(self, tool: ToolConfig, args: dict[str, Any]) -> Any:
        if self.mocks is None:
            return await self.run_tool_for_real(tool, args)
        mocked = self.mocks.lookup(tool, args)
        if mocked is not None:
            if mocked.check_request is not None:
                mocked.check_request(await self.request_of(tool, args))
            return mocked.value(tool)
        try:
            result = await self.run_tool_for_real(tool, args)
        except ToolRefusal as refusal:
            self.mocks.observe(tool, args, None, str(refusal))
            raise
        self.mocks.observe(tool, args, result, None)
        return result

    async def request_of(self, tool: ToolConfig, args: dict[str, Any]) -> dict[str, Any] | None:
        """The HTTP request the tool's kind would send for this call, built but not sent (None:
        the kind sends none, or an action-only tool)."""
        key = tool.kind
        if key is None:
            return None
        return await self.tools.runtime(key).request(tool, tool.kinds[key], args, _KindCall(self))

    async def run_tool_for_real(self, tool: ToolConfig, args: dict[str, Any]) -> Any:
        """What the tool's kind gives (None: an action-only tool)."""
        key = tool.kind
        if key is None:
            return None
        return await self.tools.runtime(key).call(tool, tool.kinds[key], args, _KindCall(self))

    def check_requires(self, tool: ToolConfig) -> None:
        roots = self.roots()
        missing = [p for p in tool.requires if get_path(roots, p) in (None, "")]
        if missing:
            raise ToolRefusal(
                f"Error: {tool.name} cannot run yet; these are not set: {', '.join(missing)}. "
                "Ask the user for them (and set them) first."
            )

    def check_action(self, tool: ToolConfig, action: ActionConfig | None = None) -> None:
        """Refuse, before anything applies, an action that cannot complete."""
        action = action or tool.action
        if action.pop and len(self.c.scopes) == 1:
            msg = (f"{tool.name} tried to pop the root scope (route {self.c.scopes[0].route}); "
                   "there is no parent route to return to, so nothing changed")
            self.emit(ev.ERROR, msg, runtime=True)
            raise ToolRefusal(f"Error: {msg}.")
        for target in (action.push, action.route, action.call):
            if target and not self.c.may_enter(target):
                roles = ", ".join(self.config.routes[target].roles)
                msg = f"you are not allowed to enter route {target} (it needs one of the roles: {roles})"
                self.emit(ev.ERROR, msg[0].upper() + msg[1:], runtime=True)
                raise ToolRefusal(f"Error: {tool.name} failed: the user is not allowed to enter route {target}.")

    def roots(self) -> dict[str, Any]:
        return self.c.state_roots(self.turn_state)

    async def apply(self, tool: ToolConfig, args: dict[str, Any], result: Any, action: ActionConfig,
                    call_id: str = "") -> ToolOutcome:
        """The action's effects, in order: state and events, the scope's memory, the user's
        message and choices, then the move; returns what the model reads and the next step."""
        where = tool.where
        extra = {"args": args, "result": result}
        self.assign_and_emit(tool, action, extra)
        scope = self.c.scope
        if action.clear_memory:
            self.c.clear_scope_memories(scope)
        if action.wipe == "schedule":
            self.wipe_scheduled.add(scope.id)
        elif action.wipe == "abort":
            self.wipe_aborted.add(scope.id)
        if action.message:
            self.emit(ev.MESSAGE, self.render_template(action.message, "message", where, extra))
        self.offer(action.choices, f"tool {tool.name} choices", where, extra)
        handed_back = self.render_template(action.result, "result", where, extra) if action.result else None
        reply = self.render_template(action.reply, "reply", where, extra) if action.reply else None
        resumes = self.move(tool, action, handed_back, call_id)
        if action.end:
            self.ended = tool.name
        if action.operator is not None:
            waiting.hand_over(self, tool, action.operator, extra)
            if reply is None:
                reply = "An operator takes the conversation over now; the conversation continues with them."
            return ToolOutcome(reply, NextStepPause(), moved=True)
        if reply is None:
            reply = self.default_reply(tool, result, action)
        # A call runs the called route now; a returning call resumes the caller now.
        execute = action.execute or bool(action.call) or resumes
        return ToolOutcome(reply, _next_step(action, execute), moved=action.leaves_route or action.end,
                           deferred=bool(action.call))

    def assigns_nothing(self, template: Any, value: Any) -> bool:
        """Whether a `set` template's value assigns nothing: in format 2 a template that renders to
        none/undefined does; in format 1 it assigned None (docs/format.md, "Format version")."""
        return isinstance(template, str) and is_nothing(value) and self.c.config.format_version >= 2

    def assign_and_emit(self, tool: ToolConfig, action: ActionConfig, extra: dict[str, Any]) -> None:
        """The action's `set` assignments, then its `emit` events."""
        where = tool.where
        roots = self.roots()
        for path, template in action.set.items():
            value = self.render_template(template, f"set {path}", where, extra, typed=True)
            if self.assigns_nothing(template, value):
                continue
            try:
                set_path(roots, path, copy.deepcopy(None if is_nothing(value) else value))
            except ChatrunError as exc:
                raise TurnFailed(f"tool {tool.name} ({where}): {exc}") from exc
        for event_type, template in action.emit.items():
            value = self.render_template(template, f"emit {event_type}", where, extra, typed=True)
            if isinstance(template, str) and is_nothing(value):
                continue  # ... and sends no event
            self.emit(event_type, value)

    def move(self, tool: ToolConfig, action: ActionConfig, handed_back: str | None, call_id: str) -> bool:
        """The action's pop, push, route change or call. Returns True when a pop resumed a caller."""
        resumes = False
        if action.pop:
            caller = self.c.pop_scope(handed_back)
            self.resume(caller)
            resumes = caller is not None
        if action.push:
            self.c.push_scope(action.push)
        if action.route:
            self.c.change_route(action.route)
        if action.call:
            self.c.push_scope(action.call, {"call_id": call_id, "tool": tool.name})
        if action.leaves_route:
            self.emit(ev.ROUTE_CHANGED, {"route": self.c.scope.route, "stack": self.c.stack})
        return resumes

    def choose(self, tool: ToolConfig, args: dict[str, Any], result: Any) -> ActionConfig:
        """The action calling the tool applies: its own, with the first case whose condition holds
        (else the `else:` case) over it. Conditions see the state as it is before the action."""
        action = tool.action
        if not action.cases:
            return action
        context = self.context(args=args, result=result)
        for case in action.cases:
            if case.condition is None:
                return action.with_case(case)
            try:
                if holds(case.condition, context):
                    return action.with_case(case)
            except ChatrunError:
                raise
            except Exception as exc:  # jinja2 UndefinedError, TypeError comparing None, ...
                raise TurnFailed(f"tool {tool.name} ({case.where}): condition `{case.condition}` failed: {exc}") from exc
        return action

    # -- handlers -------------------------------------------------------------------

    def working_copy(self) -> WorkingState:
        """What a handler may write: copies of the state, adopted only when the handler succeeds,
        so a refusal, a failure or a timeout leaves nothing behind."""
        return WorkingState(copy.deepcopy(self.c.state), copy.deepcopy(self.c.scopes), copy.deepcopy(self.turn_state))

    def adopt(self, work: WorkingState) -> None:
        self.c.state = work.state
        for live, written in zip(self.c.scopes, work.scopes, strict=True):
            live.local, live.shared = written.local, written.shared
        self.turn_state.clear()
        self.turn_state.update(work.turn)

    def handler_error(self, tool: ToolConfig, args: dict[str, Any], failure: ToolFailed) -> ToolOutcome:
        """A declared failure (`on_error:`): the user gets its message, the model its reply."""
        on_error = tool.on_error
        assert on_error is not None
        self.emit(ev.CONSOLE, f"handled failure: {failure}")
        extra = {"args": args, "error": failure.reason}
        if on_error.message:
            self.emit(ev.MESSAGE, self.render_template(on_error.message, "on_error message", on_error.where, extra))
        if on_error.reply:
            return ToolOutcome(self.render_template(on_error.reply, "on_error reply", on_error.where, extra),
                               failed=True)
        return ToolOutcome(f"Error: {tool.name} failed: {failure.reason}. Nothing was done.", failed=True)

    def default_reply(self, tool: ToolConfig, result: Any, action: ActionConfig) -> str:
        if result is not None:
            return result_text(result)
        if action.leaves_route:
            return f"Done. The conversation is now on route {self.c.scope.route}."
        return "Done."



class _KindCall:
    """What a tool kind's call gets from the turn (chatrun.toolkinds.base.CallContext)."""

    def __init__(self, turn: Turn):
        self.turn = turn

    @property
    def route(self) -> str:
        return self.turn.c.scope.route

    @property
    def session_id(self) -> str:
        return self.turn.c.id

    def render(self, source: Any, what: str, where: Location, values: dict[str, Any], *, typed: bool) -> Any:
        return self.turn.render_template(source, what, where, values, typed=typed)

    def writable(self) -> Writable:
        """Copies of the state, kept as `turn.work` and adopted only if the tool goes on."""
        work = self.turn.work = self.turn.working_copy()
        return Writable(work.state, ScopeView(work.scopes), work.turn)

    def emit(self, event_type: str, data: object, audience: str | None = None) -> None:
        self.turn.emit(event_type, data, audience=audience)

    def trace_headers(self, headers: dict[str, str]) -> None:
        tracing.inject(headers)

    def attachments(self) -> list[Attachment]:
        return self.turn.conversation_attachments()

    @property
    def message_attachments(self) -> tuple[Attachment, ...]:
        return self.turn.attachments

    def read_attachment(self, attachment: Attachment) -> bytes | None:
        return None if attachment.is_url else self.turn.read_blob(attachment.ref)


def _next_step(action: ActionConfig, execute: bool) -> NextStep:
    """The step a tool call's action asks for: the conversation ends, or the loop stops (a move,
    `immediate`) and the route it is on runs next only with `execute`, or the model reads the result."""
    if action.end:
        return NextStepFinalOutput()
    if action.leaves_route or action.immediate:
        return NextStepHandoff() if execute else NextStepFinalOutput()
    return NextStepRunAgain()


def _action_words(tool: ToolConfig | None) -> str:
    """What a tool's action does, for traces: "push flight", "pop", "set", ..."""
    if tool is None:
        return "unknown tool"
    action = tool.action
    words = [f"push {action.push}" if action.push else "", "pop" if action.pop else "",
             f"route {action.route}" if action.route else "", "set" if action.set else "",
             "emit" if action.emit else "", "execute" if action.execute else "",
             "immediate" if action.immediate else ""]
    return " ".join(w for w in words if w) or "none"


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


def _storable(value: Any) -> Any:
    """A call's arguments or result as the history keeps them: plain JSON, a lone UTF-16
    surrogate (the model's arguments may hold one; no store can) replaced, so that the record of
    a failed turn stays readable."""
    text = json.dumps(ev.plain(value), ensure_ascii=False)
    return json.loads(text.encode("utf-8", "replace").decode("utf-8"))


def _answer_record(answer: AssistantMessage) -> dict[str, Any]:
    """A model answer as a transcript's `model:` item writes it: its text, and its tool calls
    with their arguments as the model sent them (a mapping when they are a JSON object)."""
    out: dict[str, Any] = {}
    if answer.content:
        out["text"] = answer.content
    if answer.tool_calls:
        out["tool_calls"] = [{"name": c.name, "arguments": _arguments(c.arguments)} for c in answer.tool_calls]
    stored: dict[str, Any] = _storable(out or {"text": ""})
    return stored


def _arguments(raw: str) -> Any:
    try:
        decoded = json.loads(raw)
    except ValueError:
        return raw
    return decoded if isinstance(decoded, dict) else raw

