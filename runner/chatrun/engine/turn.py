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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chatrun import events as ev
from chatrun.definition.config import RouteConfig, ToolConfig
from chatrun.definition.templates import render, render_value
from chatrun.engine.scopes import Scope, ScopeView, get_path, init_declared, scope_view, set_path
from chatrun.engine.tools import (
    ToolContext,
    ToolRefusal,
    call_handler,
    parse_arguments,
    result_text,
    route_tool_specs,
)
from chatrun.errors import ChatrunError
from chatrun.messages import (
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.models.base import ModelRequest

if TYPE_CHECKING:
    from chatrun.engine.session import Session


class TurnFailed(ChatrunError):
    """The turn cannot complete; the session is restored and the message becomes an Error event."""


@dataclass
class ToolOutcome:
    reply: str
    left_route: bool = False
    execute: bool = False
    immediate: bool = False


class Turn:
    def __init__(self, session: Session, number: int, text: str | None, data: dict[str, Any]):
        self.s = session
        self.config = session.bot.config
        self.number = number
        self.user_message = text
        self.data = data
        self.turn_state: dict[str, Any] = {}
        self.model_calls = 0
        self.hops: list[str] = []
        self.wipe_scheduled: set[str] = set()
        self.wipe_aborted: set[str] = set()

    # -- the loop ---------------------------------------------------------------

    async def run(self) -> None:
        execute = True
        while execute:
            route = self.s.scopes[-1].route
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
        scope = self.s.scopes[-1]
        route = self.config.routes[scope.route]
        memory = self.s.memory_for(scope, route.name)
        user_text = self.render_user(route)  # the system prompt goes first anyway: memories keep it first
        if user_text:
            memory.add(UserMessage(user_text))
        tools = route_tool_specs(self.config, route.name)
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
            on_chunk = self.stream_chunk if model_config.stream else None
            response = await self.s.model_for(model_config).complete(request, on_chunk)
            calls = tuple(
                ToolCall(c.id or f"call_{self.number}_{self.model_calls}_{i}", c.name, c.arguments)
                for i, c in enumerate(response.tool_calls)
            )
            memory.add(AssistantMessage(response.text, calls))
            if response.text:
                self.s.emit(ev.MESSAGE, response.text)
            if not calls:
                return False
            outcomes = await self.run_calls(route, calls)
            for call, outcome in zip(calls, outcomes, strict=True):
                # Into the memory that holds the call; a cleared or popped memory drops it as an orphan.
                memory.add(ToolResultMessage(call.id, call.name, outcome.reply))
            if any(o.left_route or o.immediate for o in outcomes):
                return any(o.execute for o in outcomes)

    async def run_calls(self, route: RouteConfig, calls: tuple[ToolCall, ...]) -> list[ToolOutcome]:
        outcomes: list[ToolOutcome] = []
        left = False
        for call in calls:
            if left:
                outcomes.append(ToolOutcome(
                    f"Not run: an earlier tool call moved the conversation to route {self.s.scopes[-1].route}."
                ))
                continue
            outcome = await self.run_tool(route, call)
            left = outcome.left_route
            outcomes.append(outcome)
        return outcomes

    def finish(self) -> None:
        """End of turn: scheduled wipes, then one-turn memories forget."""
        for scope in self.s.scopes:
            if scope.id in self.wipe_scheduled and scope.id not in self.wipe_aborted:
                self.s.clear_scope_memories(scope)
        self.s.forget_turn_memories()

    # -- rendering ----------------------------------------------------------------

    def context(self, **extra: Any) -> dict[str, Any]:
        ctx = {
            "state": self.s.state,
            "scope": scope_view(self.s.scopes),
            "turn": self.turn_state,
            "user_message": self.user_message,
            "data": self.data,
            "route": self.s.scopes[-1].route,
            "stack": [sc.route for sc in self.s.scopes],
            "args": {},
            "result": None,
        }
        ctx.update(extra)
        return ctx

    def render_template(self, source: Any, what: str, where: Any, *, typed: bool = False, **extra: Any) -> Any:
        """Render for text (typed=False) or for a value that keeps its type (setters, event data)."""
        try:
            return (render_value if typed else render)(source, self.context(**extra))
        except ChatrunError:
            raise
        except Exception as exc:  # jinja2 UndefinedError, TypeError in filters, ...
            raise TurnFailed(f"{where}: {what} template failed: {exc}") from exc

    def add_system(self, memory: Any, route: RouteConfig) -> None:
        if route.system:
            text = self.render_template(route.system, f"route {route.name} system", route.where)
            memory.add(SystemMessage(text))

    def render_user(self, route: RouteConfig) -> str | None:
        if route.user:
            return self.render_template(route.user, f"route {route.name} user", route.where)
        if self.user_message is not None:
            return self.user_message
        if self.data:
            return json.dumps(self.data, ensure_ascii=False)
        return None

    async def stream_chunk(self, chunk: str) -> None:
        if chunk:
            self.s.emit(ev.STREAM, chunk)

    # -- tools ----------------------------------------------------------------------

    async def run_tool(self, route: RouteConfig, call: ToolCall) -> ToolOutcome:
        tool = self.config.tools.get(call.name) if call.name in route.tools else None
        if tool is None:
            offered = ", ".join(route.tools) or "none"
            return ToolOutcome(f"Error: there is no tool {call.name!r} here. Tools you can call: {offered}.")
        try:
            args = parse_arguments(tool, call.arguments, self.s.bot.argument_validator(tool.name))
            self.check_requires(tool)
            self.check_action(tool)
        except ToolRefusal as refusal:
            return ToolOutcome(str(refusal))
        return await self.apply(tool, args)

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
        if action.pop and len(self.s.scopes) == 1:
            msg = (f"{tool.name} tried to pop the root scope (route {self.s.scopes[0].route}); "
                   "there is no parent route to return to, so nothing changed")
            self.s.emit(ev.ERROR, msg)
            raise ToolRefusal(f"Error: {msg}.")
        for target in (action.push, action.route):
            if target and not self.s.may_enter(target):
                roles = ", ".join(self.config.routes[target].roles)
                msg = f"you are not allowed to enter route {target} (it needs one of the roles: {roles})"
                self.s.emit(ev.ERROR, msg[0].upper() + msg[1:])
                raise ToolRefusal(f"Error: {tool.name} failed: the user is not allowed to enter route {target}.")

    def roots(self) -> dict[str, Any]:
        return {"state": self.s.state, "scope": ScopeView(self.s.scopes), "turn": self.turn_state}

    async def apply(self, tool: ToolConfig, args: dict[str, Any]) -> ToolOutcome:
        action = tool.action
        where = tool.where
        result = None
        if tool.handler:
            ctx = ToolContext(tool.name, args, self.s.state, ScopeView(self.s.scopes), self.turn_state,
                              self.s.scopes[-1].route, self.s.id, self.s.emit)
            try:
                func = self.s.bot.handler(tool.handler)
                result = await call_handler(func, ctx)
            except (Exception, SystemExit) as exc:  # a handler's sys.exit() must not end the server
                raise TurnFailed(f"tool {tool.name} ({where}): handler {tool.handler} raised {type(exc).__name__}: {exc}") from exc
        extra = {"args": args, "result": result}
        roots = self.roots()
        for path, template in action.set.items():
            value = self.render_template(template, f"set {path}", where, typed=True, **extra)
            try:
                set_path(roots, path, copy.deepcopy(value))
            except ChatrunError as exc:
                raise TurnFailed(f"tool {tool.name} ({where}): {exc}") from exc
        for event_type, template in action.emit.items():
            self.s.emit(event_type, self.render_template(template, f"emit {event_type}", where, typed=True, **extra))
        scope = self.s.scopes[-1]
        if action.clear_memory:
            self.s.clear_scope_memories(scope)
        if action.wipe == "schedule":
            self.wipe_scheduled.add(scope.id)
        elif action.wipe == "abort":
            self.wipe_aborted.add(scope.id)
        if action.message:
            self.s.emit(ev.MESSAGE, self.render_template(action.message, "message", where, **extra))
        handed_back = self.render_template(action.result, "result", where, **extra) if action.result else None
        reply = self.render_template(action.reply, "reply", where, **extra) if action.reply else None
        if action.pop:
            self.s.pop_scope(handed_back)
        if action.push:
            self.s.push_scope(action.push)
        if action.route:
            self.s.change_route(action.route)
        if action.leaves_route:
            self.s.emit(ev.ROUTE_CHANGED, {"route": self.s.scopes[-1].route, "stack": self.s.stack})
        if reply is None:
            reply = self.default_reply(tool, result)
        return ToolOutcome(reply, action.leaves_route, action.execute, action.immediate)

    def default_reply(self, tool: ToolConfig, result: Any) -> str:
        if result is not None:
            return result_text(result)
        if tool.action.leaves_route:
            return f"Done. The conversation is now on route {self.s.scopes[-1].route}."
        return "Done."


def new_scope(scope_id: str, route: RouteConfig) -> Scope:
    scope = Scope(scope_id, route.name)
    init_declared(scope, route.scope.local, route.scope.shared)
    return scope
