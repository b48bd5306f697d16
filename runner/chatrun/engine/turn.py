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
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chatrun import events as ev
from chatrun.definition.config import Price, RouteConfig, ToolConfig
from chatrun.engine import tracing
from chatrun.engine.conversation import Conversation
from chatrun.engine.scopes import get_path, set_path
from chatrun.engine.tools import (
    Toolbox,
    ToolContext,
    ToolMocks,
    call_handler,
    parse_arguments,
    result_text,
    tool_spec,
)
from chatrun.engine.usage import Usage, call_usage, check_budgets
from chatrun.errors import ChatrunError, ModelError, ToolRefusal, TurnFailed
from chatrun.memory import SummaryMemory
from chatrun.memory.tokens import TokenCounter, tiktoken_counter
from chatrun.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.models.base import ChatModel, ModelRequest

Emit = Callable[..., None]  # (type, data, runtime=False)
log = logging.getLogger("chatrun.engine")


@dataclass
class ToolOutcome:
    reply: str
    left_route: bool = False
    execute: bool = False
    immediate: bool = False


class Turn:
    """Runs one user input on a conversation; `emit` sends the turn's events as they happen."""

    def __init__(self, conversation: Conversation, tools: Toolbox, model: ChatModel, emit: Emit,
                 text: str | None, data: dict[str, Any], mocks: ToolMocks | None = None):
        self.c = conversation
        self.config = conversation.config
        self.tools = tools
        self.model = model
        self.emit = emit
        self.mocks = mocks
        self.number = conversation.turn_count + 1
        self.user_message = text
        self.data = data
        self.turn_state: dict[str, Any] = {}
        self.model_calls = 0
        self.usage = Usage()  # the turn's model calls, summed
        self.calls_usage: list[dict[str, Any]] = []  # each call's, for the history
        self._counters: dict[str, TokenCounter] = {}
        self.summaries: list[dict[str, Any]] = []  # what summarize() did, for the history
        self.hops: list[str] = []
        self.wipe_scheduled: set[str] = set()
        self.wipe_aborted: set[str] = set()

    # -- the loop ---------------------------------------------------------------

    async def run(self) -> None:
        execute = True
        while execute:
            route = self.c.scope.route
            self.hops.append(route)
            if len(self.hops) > self.config.limits.max_hops:
                raise TurnFailed(
                    f"this turn invoked routes {len(self.hops) - 1} times ({' -> '.join(self.hops[:-1])}), "
                    f"more than limits.max_hops = {self.config.limits.max_hops}; a tool probably executes "
                    "a route that executes again"
                )
            execute = await self.invoke_route()
        self.finish()

    async def invoke_route(self) -> bool:
        """Run the current route's model loop. Returns True when the route asked to execute the next one."""
        scope = self.c.scope
        route = self.config.routes[scope.route]
        memory = self.c.memory_for(scope, route.name)
        user_text = self.render_user(route)  # the system prompt goes first anyway: memories keep it first
        if user_text:
            memory.add(UserMessage(user_text))
        offered = await self.tools.offered(route, self.mocks)
        tools = [tool_spec(t) for t in offered.values()]
        model_config = self.config.route_model(route.name)
        while True:
            self.model_calls += 1
            if self.model_calls > self.config.limits.max_model_calls:
                raise TurnFailed(
                    f"this turn called the model {self.model_calls - 1} times, more than "
                    f"limits.max_model_calls = {self.config.limits.max_model_calls} (route {route.name})"
                )
            self.add_system(memory, route)
            request = ModelRequest(memory.messages(), tools, model_config, route.name)
            price = self.config.prices.get(model_config.name)
            if self.config.limits.has_budgets:
                sent = sum(self.count_tokens(model_config.name, m) for m in request.messages)
                check_budgets(self.config.limits, self.usage, self.c.usage, sent, price, route.name)
            on_chunk = self.stream_chunk if model_config.stream else None
            with tracing.chat_span(model_config.provider, model_config.name, route.name,
                                   model_config.temperature) as span:
                response = await self.model.complete(request, on_chunk)
                calls = tuple(
                    ToolCall(c.id or f"call_{self.number}_{self.model_calls}_{i}", c.name, c.arguments)
                    for i, c in enumerate(response.tool_calls)
                )
                answer = AssistantMessage(response.text, calls)
                usage = self.account(route.name, model_config.name, response.usage, price, request.messages, answer)
                if span is not None:
                    content = tracing.capture_content()
                    tracing.record_answer(span, usage, response.finish_reason,
                                          [m.to_dict() for m in request.messages] if content else None,
                                          answer.to_dict() if content else None)
            memory.add(answer)
            if response.text:
                self.emit(ev.MESSAGE, response.text)
            if not calls:
                return False
            outcomes = await self.run_calls(route, offered, calls)
            for call, outcome in zip(calls, outcomes, strict=True):
                # Into the memory that holds the call; a cleared or popped memory drops it as an orphan.
                memory.add(ToolResultMessage(call.id, call.name, outcome.reply))
            if any(o.left_route or o.immediate for o in outcomes):
                return any(o.execute for o in outcomes)

    async def run_calls(self, route: RouteConfig, offered: dict[str, ToolConfig],
                        calls: tuple[ToolCall, ...]) -> list[ToolOutcome]:
        outcomes: list[ToolOutcome] = []
        left = False
        for call in calls:
            if left:
                outcomes.append(ToolOutcome(
                    f"Not run: an earlier tool call moved the conversation to route {self.c.scope.route}."
                ))
                continue
            with tracing.tool_span(call.name, call.id, _action_words(offered.get(call.name))):
                outcome = await self.run_tool(offered, call)
            left = outcome.left_route
            outcomes.append(outcome)
        return outcomes

    def finish(self) -> None:
        """End of turn: scheduled wipes, then one-turn memories forget."""
        for scope in self.c.scopes:
            if scope.id in self.wipe_scheduled and scope.id not in self.wipe_aborted:
                self.c.clear_scope_memories(scope)
        self.c.forget_turn_memories()

    # -- rendering ----------------------------------------------------------------

    def render_template(self, source: Any, what: str, where: Any, values: dict[str, Any] | None = None,
                        *, typed: bool = False) -> Any:
        """Render for text (typed=False) or for a value that keeps its type (setters, event data).
        `values` adds to what templates see (a tool's `args` and `result`)."""
        try:
            context = self.c.template_context(self.turn_state, self.user_message, self.data, **(values or {}))
            return self.c.render(source, context, typed=typed)
        except ChatrunError:
            raise
        except Exception as exc:  # jinja2 UndefinedError, TypeError in filters, ...
            raise TurnFailed(f"{where}: {what} template failed: {exc}") from exc

    def add_system(self, memory: Any, route: RouteConfig) -> None:
        if route.system:
            text = self.render_template(route.system, f"route {route.name} system", route.where)
            if not text.strip():
                # An empty SystemMessage would replace the route's instructions in the memory
                # (LangChain4j's rule); fail the turn instead, naming the template.
                raise TurnFailed(f"{route.where}: route {route.name} system template rendered empty text; "
                                 "the model would lose its instructions (make the template always say something)")
            memory.add(SystemMessage(text))

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
            config = self.config.route_model(route).merged(policy.summary_model)
            request = ModelRequest(
                [SystemMessage(policy.summary_prompt or SUMMARY_PROMPT), UserMessage(_fold_text(memory, folded))],
                [], config, f"{route} (summary)")
            try:
                with tracing.chat_span(config.provider, config.name, request.route, config.temperature):
                    response = await self.model.complete(request, None)
                answer = AssistantMessage(response.text)
                self.account(request.route, config.name, response.usage, self.config.prices.get(config.name),
                             request.messages, answer)
                if not (response.text or "").strip():
                    raise ModelError("the summarizing call answered no text")
                memory.apply_summary(response.text.strip(), folded)
                self.summaries.append({"memory": memory_id, "folded": len(folded)})
            except Exception as exc:  # noqa: BLE001 - a summary never fails the turn
                reason = f"{type(exc).__name__}: {exc}"
                log.warning("session %s: summarizing memory %s failed (the turn goes on, the next one "
                            "retries): %s", self.c.id, memory_id, reason)
                self.summaries.append({"memory": memory_id, "failed": reason})

    def account(self, route: str, model: str, raw: dict[str, Any], price: Price | None,
                sent: list[Message], answer: AssistantMessage) -> dict[str, Any]:
        """Add one call's usage to the turn's; returns the call's entry for the history."""
        usage = call_usage(raw, price, sent, answer, lambda m: self.count_tokens(model, m))
        self.usage.add(usage)
        entry = {"route": route, "model": model, **usage.to_dict()}
        del entry["calls"]
        self.calls_usage.append(entry)
        return entry

    def count_tokens(self, model: str, message: Message) -> int:
        counter = self._counters.get(model)
        if counter is None:
            counter = self._counters[model] = tiktoken_counter(model_name=model)
        return counter(message)

    async def stream_chunk(self, chunk: str) -> None:
        if chunk:
            self.emit(ev.STREAM, chunk)

    # -- tools ----------------------------------------------------------------------

    async def run_tool(self, offered: dict[str, ToolConfig], call: ToolCall) -> ToolOutcome:
        tool = offered.get(call.name)
        if tool is None:
            names = ", ".join(offered) or "none"
            return ToolOutcome(f"Error: there is no tool {call.name!r} here. Tools you can call: {names}.")
        try:
            args = parse_arguments(tool, call.arguments, self.tools.argument_validator(tool))
            self.check_requires(tool)
            self.check_action(tool)
        except ToolRefusal as refusal:
            return ToolOutcome(str(refusal))
        try:
            result = await self.tool_result(tool, args)
        except ToolRefusal as refusal:  # the handler refused, or the API call failed
            return ToolOutcome(str(refusal))
        return await self.apply(tool, args, result)

    async def tool_result(self, tool: ToolConfig, args: dict[str, Any]) -> Any:
        """What the tool's mock, handler or HTTP call gives as `result` (None: an action-only tool)."""
        if self.mocks is None:
            return await self.run_tool_for_real(tool, args)
        mocked = self.mocks.lookup(tool, args)
        if mocked is not None:
            return mocked.value(tool)
        try:
            result = await self.run_tool_for_real(tool, args)
        except ToolRefusal as refusal:
            self.mocks.observe(tool, args, None, str(refusal))
            raise
        self.mocks.observe(tool, args, result, None)
        return result

    async def run_tool_for_real(self, tool: ToolConfig, args: dict[str, Any]) -> Any:
        if tool.handler:
            return await self.call_handler(tool, args)
        if tool.http:
            http = self.tools.http
            values = {"args": args, "env": http.env}
            return await http.call(tool, args, lambda source, typed: self.render_template(
                source, "http", tool.where, values, typed=typed))
        if tool.mcp:
            return await self.tools.mcp.call(tool, args, tool.timeout)
        return None

    async def call_handler(self, tool: ToolConfig, args: dict[str, Any]) -> Any:
        roots = self.roots()
        ctx = ToolContext(tool.name, args, roots["state"], roots["scope"], roots["turn"],
                          self.c.scope.route, self.c.id, self.emit)
        where = tool.where
        try:
            return await call_handler(self.tools.handler(tool.handler or ""), ctx, tool.timeout)
        except ToolRefusal:
            raise
        except TimeoutError as exc:
            raise TurnFailed(f"tool {tool.name} ({where}): handler {tool.handler} did not finish within "
                             f"{tool.timeout:g} s (the tool's `timeout`)") from exc
        except (Exception, SystemExit) as exc:  # a handler's sys.exit() must not end the server
            raise TurnFailed(f"tool {tool.name} ({where}): handler {tool.handler} raised "
                             f"{type(exc).__name__}: {exc}") from exc

    def check_requires(self, tool: ToolConfig) -> None:
        roots = self.roots()
        missing = [p for p in tool.requires if get_path(roots, p) in (None, "")]
        if missing:
            raise ToolRefusal(
                f"Error: {tool.name} cannot run yet; these are not set: {', '.join(missing)}. "
                "Ask the user for them (and set them) first."
            )

    def check_action(self, tool: ToolConfig) -> None:
        """Refuse, before anything applies, an action that cannot complete."""
        action = tool.action
        if action.pop and len(self.c.scopes) == 1:
            msg = (f"{tool.name} tried to pop the root scope (route {self.c.scopes[0].route}); "
                   "there is no parent route to return to, so nothing changed")
            self.emit(ev.ERROR, msg, runtime=True)
            raise ToolRefusal(f"Error: {msg}.")
        for target in (action.push, action.route):
            if target and not self.c.may_enter(target):
                roles = ", ".join(self.config.routes[target].roles)
                msg = f"you are not allowed to enter route {target} (it needs one of the roles: {roles})"
                self.emit(ev.ERROR, msg[0].upper() + msg[1:], runtime=True)
                raise ToolRefusal(f"Error: {tool.name} failed: the user is not allowed to enter route {target}.")

    def roots(self) -> dict[str, Any]:
        return self.c.state_roots(self.turn_state)

    async def apply(self, tool: ToolConfig, args: dict[str, Any], result: Any) -> ToolOutcome:
        action = tool.action
        where = tool.where
        extra = {"args": args, "result": result}
        roots = self.roots()
        for path, template in action.set.items():
            value = self.render_template(template, f"set {path}", where, extra, typed=True)
            try:
                set_path(roots, path, copy.deepcopy(value))
            except ChatrunError as exc:
                raise TurnFailed(f"tool {tool.name} ({where}): {exc}") from exc
        for event_type, template in action.emit.items():
            self.emit(event_type, self.render_template(template, f"emit {event_type}", where, extra, typed=True))
        scope = self.c.scope
        if action.clear_memory:
            self.c.clear_scope_memories(scope)
        if action.wipe == "schedule":
            self.wipe_scheduled.add(scope.id)
        elif action.wipe == "abort":
            self.wipe_aborted.add(scope.id)
        if action.message:
            self.emit(ev.MESSAGE, self.render_template(action.message, "message", where, extra))
        handed_back = self.render_template(action.result, "result", where, extra) if action.result else None
        reply = self.render_template(action.reply, "reply", where, extra) if action.reply else None
        if action.pop:
            self.c.pop_scope(handed_back)
        if action.push:
            self.c.push_scope(action.push)
        if action.route:
            self.c.change_route(action.route)
        if action.leaves_route:
            self.emit(ev.ROUTE_CHANGED, {"route": self.c.scope.route, "stack": self.c.stack})
        if reply is None:
            reply = self.default_reply(tool, result)
        return ToolOutcome(reply, action.leaves_route, action.execute, action.immediate)

    def default_reply(self, tool: ToolConfig, result: Any) -> str:
        if result is not None:
            return result_text(result)
        if tool.action.leaves_route:
            return f"Done. The conversation is now on route {self.c.scope.route}."
        return "Done."



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
