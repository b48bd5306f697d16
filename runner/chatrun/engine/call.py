"""The tool call: one call of a model's answer, from its check to its action.

A model answer's calls run here in order (`ToolCalls.run_calls`), each through the one call path:

    unknown tool?  ->  arguments (decoded, bound, checked, `from_user` said by the user)  ->  `requires`  ->  the action can
    complete?  ->  approval gate (engine/pausing.py)  ->  the kind's result (or its mock)  ->
    the case that applies  ->  a question (engine/pausing.py), or the action: state, events,
    memory, message, choices, the move (push, pop, route, call), `end`, an operator

Every refusal on the way is a `ToolOutcome` the model reads (`failed`), never an exception
that fails the turn; a handler's own writes go to copies (`WorkingState`) adopted only when it
succeeds. A decision turn (engine/waiting.py) resumes a call that waited through
`run_checked_tool` (approved) or `apply` (answered). A new rule for calls goes here, in the
step of the path where it applies (docs/architecture.md).

The call path sees its turn only through `TurnContext` (engine/context.py).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from chatrun import events as ev
from chatrun.definition.config import (
    ONCE,
    ActionConfig,
    Location,
    RouteConfig,
    ToolConfig,
    declared_arguments,
)
from chatrun.definition.templates import holds, is_nothing, render_nested
from chatrun.engine import observe, once, pausing, tracing
from chatrun.engine.binding import Unbound, bind_arguments, ignored_note, undeclared_note
from chatrun.engine.context import TurnContext, storable
from chatrun.engine.guardrails import Guardrails
from chatrun.engine.migrate import older_spellings, spelled_before, spelled_forward_is
from chatrun.engine.said import said
from chatrun.engine.scopes import Scope, ScopeView, get_path
from chatrun.engine.steps import (
    NextStep,
    NextStepFinalOutput,
    NextStepHandoff,
    NextStepPause,
    NextStepRunAgain,
    ToolOutcome,
)
from chatrun.engine.tools import (
    BoundInvalid,
    Setter,
    check_arguments,
    decode_arguments,
    result_text,
)
from chatrun.errors import ChatrunError, ToolRefusal, TurnFailed
from chatrun.messages import Attachment, ToolCall
from chatrun.toolkinds.base import ToolFailed, Writable

log = logging.getLogger("chatrun.engine")


@dataclass
class WorkingState:
    """The copies of the state a tool's own code writes to (ToolCalls.working_copy)."""

    state: dict[str, Any]
    scopes: list[Scope]
    turn: dict[str, Any]


class ToolCalls:
    """The tool calls of one turn, on the turn's context `t`."""

    def __init__(self, t: TurnContext):
        self.t = t
        self.work: WorkingState | None = None  # the copies the current tool's own code writes to
        self.took_effect = False  # the current call did something that is done once (engine/once.py)
        self.key = ""  # the idempotency key of the call running now (`call_key`)
        self.checked: tuple[dict[str, Any], str] | None = None  # (args, identity) `repeated` computed last
        self.made: dict[str, int] = {}  # how often each call (tool and arguments) ran in this turn
        # The turn's guardrails (engine/guardrails.py); None: the bot declares none.
        self.guard = Guardrails(t) if t.config.guarded else None

    async def run_calls(self, route: RouteConfig, offered: dict[str, ToolConfig],
                        calls: tuple[ToolCall, ...]) -> list[ToolOutcome]:
        """A model answer's calls, in order, each seeing the state the calls before it left. After
        a call that moved the conversation (or, with `one_change_per_answer`, changed something
        a later call depends on) the rest are not run: the model reads why."""
        outcomes: list[ToolOutcome] = []
        left = False
        changed: str | None = None  # what an earlier call changed, when the rest must wait for the model
        for index, call in enumerate(calls):
            if left:
                where = ("an earlier tool call ended the conversation" if self.t.ended else
                         "an earlier tool call waits for a person; call this again after it is resolved"
                         if self.t.paused else
                         f"an earlier tool call moved the conversation to route {self.t.c.scope.route}")
                outcomes.append(ToolOutcome(f"Not run: {where}."))
                continue
            if changed is not None:
                outcomes.append(ToolOutcome(f"Not run: an earlier call in this answer {changed}; read its result "
                                            "first, then call this again if it is still needed."))
                continue
            watched = self.watched(route, offered.get(call.name), offered, calls[index + 1:])
            self.took_effect = False
            with tracing.tool_span(tool_label(call, offered), call.id, _action_words(offered.get(call.name)),
                                   sent=call.name) as span:
                outcome = await self.timed_tool(offered, call)
                if outcome.failed:
                    tracing.tool_failed(span)
            left = outcome.moved
            self.t.paused = self.t.paused or isinstance(outcome.next, NextStepPause)
            outcomes.append(outcome)
            if watched is not None and not left and not outcome.failed:
                changed = self.change_of(call.name, watched)
        return outcomes

    def watched(self, route: RouteConfig, tool: ToolConfig | None, offered: dict[str, ToolConfig],
                later: tuple[ToolCall, ...]) -> dict[str, Any] | None:
        """With `one_change_per_answer` (the route's or the tool's) and calls after this one: the
        values the later calls `require`, as they are before this call (None: the rule is off)."""
        if not later or tool is None or not (route.one_change_per_answer or tool.one_change_per_answer):
            return None
        roots = self.t.roots()
        paths = dict.fromkeys(p for call in later if call.name in offered for p in offered[call.name].requires)
        return {path: copy.deepcopy(get_path(roots, path)) for path in paths}

    def change_of(self, tool: str, watched: dict[str, Any]) -> str | None:
        """What the call that just ran changed that the answer's later calls must not run past:
        a `once` effect, or a value they require (None: nothing)."""
        if self.took_effect:
            return f"({tool}) did something that is done once"
        roots = self.t.roots()
        moved = [path for path, before in watched.items() if get_path(roots, path) != before]
        return f"({tool}) changed {', '.join(moved)}, which a later call requires" if moved else None

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
            observe.tool_call(tool_label(call, offered), time.perf_counter() - started, failed)

    async def run_tool(self, offered: dict[str, ToolConfig], call: ToolCall) -> ToolOutcome:
        record: dict[str, Any] = {"tool": call.name, "route": self.t.c.scope.route}
        self.t.tool_calls.append(record)
        outcome = await self.run_offered_tool(offered, call, record)
        record["error" if outcome.failed else "reply"] = storable(outcome.reply)  # what the model reads
        return outcome

    async def run_offered_tool(self, offered: dict[str, ToolConfig], call: ToolCall,
                               record: dict[str, Any]) -> ToolOutcome:
        tool = offered.get(call.name)
        if tool is None:
            names = ", ".join(offered) or "none"
            if not call.name.strip():  # e.g. a call written as text whose JSON could not be read
                return ToolOutcome("Error: this tool call names no tool (or its JSON could not be read), so "
                                   'nothing ran. Call a tool with its name and a JSON object of arguments, as '
                                   f'{{"name": "...", "arguments": {{...}}}}. Tools you can call: {names}.',
                                   failed=True)
            return ToolOutcome(f"Error: there is no tool {call.name!r} here. Tools you can call: {names}.",
                               failed=True)
        notes = ""  # what the model sent that was not its to give, or that the tool does not take
        try:
            self.check_call_limit(tool)
            args, notes = self.arguments(tool, call.arguments)
            record["args"] = storable(args)
            outcome = self.repeated(tool, args)  # not None: not run, the model reads what became of it before
            if outcome is None:
                self.check_requires(tool)
                self.check_action(tool)
                if pausing.needs_approval(self.t, tool, args):  # nothing of the tool runs before the decision
                    outcome = pausing.request_approval(self.t, tool, args, call.id)
        except ToolRefusal as refusal:
            return ToolOutcome(str(refusal) + notes, failed=True)
        if outcome is None:
            outcome = await self.run_checked_tool(tool, args, call.id)
        outcome.reply += notes
        return outcome

    def check_call_limit(self, tool: ToolConfig) -> None:
        """Refuse a call past the tool's bound of calls per turn (the call's record counts itself)."""
        limit = tool.max_calls_per_turn or self.t.config.limits.max_calls_per_tool
        if limit is None:
            return
        made = sum(1 for record in self.t.tool_calls if record.get("tool") == tool.name)
        if made > limit:
            setting = (f"tools.{tool.name}.max_calls_per_turn" if tool.max_calls_per_turn
                       else "limits.max_calls_per_tool")
            raise ToolRefusal(f"Error: {tool.name} was not run: it was called {limit} times in this turn already, "
                              f"the most this bot allows ({setting}: {limit}). Do not call it again in this turn; "
                              "answer the user with what you have.")

    def repeated(self, tool: ToolConfig, args: dict[str, Any]) -> ToolOutcome | None:
        """The answer to a call identical to one that waits for a person (whatever the tool's
        effect: never a second item for the same call) or, for a `once` tool, to one already done
        in this conversation; None: the call is new."""
        if tool.effect != ONCE and not self.t.c.pending:
            return None  # most calls: nothing to compare with
        acted_on = self.acted_on(tool)
        same = once.identity(tool.name, args, acted_on)
        self.checked = (args, same)
        item = once.waiting_with(self.t.c, same, acted_on)
        if item is not None:
            return ToolOutcome(once.still_waiting(item))
        if tool.effect != ONCE:
            return None
        migrations = self.t.config.migrations
        if not migrations:  # every version spells it alike
            done = once.done_before(self.t.c, same, once.tag(self.t.config.version))
        else:  # an entry of another version: this call spelled back to it, or it spelled forward to this call
            mine = once.made_of(tool.name, args, acted_on)
            done = once.done_before(self.t.c, same, once.tag(self.t.config.version),
                                    lambda tagged: older_spellings(migrations, tagged, tool.name, args, acted_on),
                                    lambda tagged, parts: spelled_forward_is(migrations, tagged, parts, mine))
        return ToolOutcome(once.already_done(done)) if done is not None else None

    def identity_of(self, tool: ToolConfig, args: dict[str, Any]) -> str:
        """What makes two calls the same call (engine/once.py), as the state is now."""
        return once.identity(tool.name, args, self.acted_on(tool))

    def made_of(self, tool: ToolConfig, args: dict[str, Any]) -> str:
        """What the call's identity is made of, as the state is now (once.made_of: kept in the
        record, so a later version spells it forward)."""
        return once.made_of(tool.name, args, self.acted_on(tool)) if self.t.config.version else ""

    def acted_on(self, tool: ToolConfig) -> dict[str, Any]:
        """What a call acts on besides its arguments: the values of the paths its tool `requires`
        (a booking tool without parameters books what the wizard collected)."""
        if not tool.requires:
            return {}
        roots = self.t.roots()
        return {path: get_path(roots, path) for path in tool.requires}

    def remember_done(self, tool: ToolConfig, identity: str, reply: str, parts: str = "") -> None:
        """A `once` call that did something: an identical one later is answered with `reply`
        (`parts`: what its identity is made of, once.made_of)."""
        once.remember(self.t.c, identity, self.t.number, reply, once.tag(self.t.config.version), parts)
        self.took_effect = True

    def arguments(self, tool: ToolConfig, raw: str) -> tuple[dict[str, Any], str]:
        """The call's arguments: the model's, without the names the tool does not take, with the
        tool's bound arguments (`bind:`) put in over whatever it sent for them, checked against
        the tool's `parameters`. Returns them and the notes the model reads about what it sent
        that was ignored (binding.ignored_note, binding.undeclared_note)."""
        sent, notes = self.drop_undeclared(tool, decode_arguments(tool, raw))
        model_args = {k: v for k, v in sent.items() if k not in tool.bind}

        def render(source: Any, what: str) -> Any:
            return self.t.render_template(source, f"{what} of tool {tool.name}", tool.where, {"args": model_args},
                                        typed=True)

        try:
            args, ignored = bind_arguments(tool, sent, render)
            check_arguments(tool, args, self.t.tools.argument_validator(tool))
        except Unbound as unbound:
            why = "" if self.t.c.principal is not None else " (no one is signed in)"
            self.t.emit(ev.ERROR, f"{tool.name} could not run: the bot has no value for its argument `{unbound.name}`"
                      f"{why}", runtime=True, meta={"detail": self.kept(f"{tool.where}: {unbound}{why}")})
            raise ToolRefusal(f"Error: {tool.name} cannot run: its argument `{unbound.name}` is set by the bot "
                              "and has no value here. Nothing was sent.") from None
        except BoundInvalid as invalid:
            self.t.emit(ev.ERROR, f"{tool.name} could not run: a value the bot gives its arguments is invalid",
                      runtime=True, meta={"detail": self.kept(f"{tool.where}: {invalid.detail}")})
            raise
        if ignored:
            self.t.emit(ev.CONSOLE, f"tool {tool.name}: the model sent {', '.join(ignored)}, which the bot binds; "
                      "ignored, the bound value was used")
            notes = ignored_note(ignored) + notes
        self.check_from_user(tool, args)
        return args, notes

    def kept(self, text: str) -> str:
        """A failure's text as an event a client receives may hold it: what the `storage` guards
        leave of it (engine/guardrails.py `kept_text`); as it is on a bot without guardrails."""
        return text if self.guard is None else self.guard.kept(text)

    def drop_undeclared(self, tool: ToolConfig, sent: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The model's arguments without the names the tool's `parameters` do not take (a tool
        without parameters takes none), and the note that names them back to the model. A schema
        with `additionalProperties: false` keeps them: its validator refuses the call instead
        (the model must call again), and an open schema takes any name (config.declared_arguments)."""
        props = tool.parameters.get("properties")
        if isinstance(props, dict) and props.keys() >= sent.keys():
            return sent, ""  # most calls: every name sent is a property (declared_arguments' list, or an open schema)
        takes = declared_arguments(tool.parameters)
        if takes is None or tool.parameters.get("additionalProperties") is False:
            return sent, ""
        undeclared = [name for name in sent if name not in takes and name not in tool.bind]
        if not undeclared:
            return sent, ""
        self.t.emit(ev.CONSOLE, f"tool {tool.name}: the model sent {', '.join(undeclared)}, which the tool does not "
                    "take (not in its `parameters`); ignored")
        offered = [name for name in takes if name not in tool.bind]
        return {k: v for k, v in sent.items() if k not in undeclared}, undeclared_note(tool.name, undeclared, offered)

    def check_from_user(self, tool: ToolConfig, args: dict[str, Any]) -> None:
        """`from_user:`: refuse values of these parameters the user has not said in this scope
        (engine/said.py); the model is told to ask the user for them."""
        checked = [name for name in tool.from_user if name in args and name not in tool.bind]
        if not checked:
            return
        texts, today, locale = self.t.user_texts(), self.t.c.now().date(), self.t.c.locale
        unsaid = [name for name in checked if not said(args[name], texts, today, locale)]
        if not unsaid:
            return
        values = ", ".join(f"{name} = {json.dumps(args[name], ensure_ascii=False)}" for name in unsaid)
        them = "it" if len(unsaid) == 1 else "them"
        asked = " and ".join(f"the {name.replace('_', ' ')}" for name in unsaid)
        raise ToolRefusal(f"Error: {tool.name} cannot take {values}: the user has not said {them}. "
                          f"Ask the user for {asked}, then call {tool.name} with their words. Do not guess.")

    async def run_checked_tool(self, tool: ToolConfig, args: dict[str, Any], call_id: str) -> ToolOutcome:
        """A call whose arguments, requirements and action were checked: its result, then its
        action; what the model reads of it passes the `tool_result` guardrails (a call run now,
        or resumed once approved, or run when an operator's wait timed out: all come here)."""
        outcome = await self.checked_tool(tool, args, call_id)
        if self.guard is not None:
            outcome.reply = await self.guard.check_tool_result(tool.name, outcome.reply)
        return outcome

    async def checked_tool(self, tool: ToolConfig, args: dict[str, Any], call_id: str) -> ToolOutcome:
        self.work = None
        # Only a kind's call reaches the world (a handler's `ctx.idempotency_key`, an `http:` header).
        self.key = self.call_key(tool, args) if tool.kind is not None else ""
        asks = tool.action.ask is not None  # the action applies once the answer is in (engine/pausing.py)
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
            return pausing.ask_question(self.t, tool, args, result, call_id)
        return await self.apply(tool, args, result, action, call_id)

    def call_key(self, tool: ToolConfig, args: dict[str, Any]) -> str:
        """The call's idempotency key (`ctx.idempotency_key`, an `http:` tool's `Idempotency-Key`):
        the session (a `/v1` fork's original: `Conversation.keyed_as`), the turn's number, the tool, its arguments and how many times this same call
        ran before in this turn. A turn run again — retried after a failure, or a decision retried
        on another replica after the first died — has the same number and makes the same calls,
        so each gets its key again; any other call gets another. The model's call id is left out:
        most servers make a new random one for each answer, even the same answer again. In the turn
        that moves the session to another version, the call as the version it left spells it
        (`spelled_before`): that turn may be the retry of an attempt the old version ran."""
        spelled = spelled_before(self.t.c.moved_by, tool.name, args) if self.t.c.moved_by else (tool.name, args)
        call = json.dumps(list(spelled), sort_keys=True, default=str, separators=(",", ":"))
        occurrence = self.made[call] = self.made.get(call, 0) + 1
        identity = f"{self.t.c.keyed_as}\n{self.t.number}\n{occurrence}\n{call}"
        return hashlib.sha256(identity.encode()).hexdigest()[:32]

    async def tool_result(self, tool: ToolConfig, args: dict[str, Any]) -> Any:
        """What the tool's mock, handler or HTTP call gives as `result` (None: an action-only
        tool), kept in the call's history record."""
        result = await self.tool_result_of(tool, args)
        if result is not None and self.t.tool_calls:
            self.t.tool_calls[-1]["result"] = storable(result)
        return result

    async def tool_result_of(self, tool: ToolConfig, args: dict[str, Any]) -> Any:
        if self.t.mocks is None:
            return await self.run_tool_for_real(tool, args)
        mocked = self.t.mocks.lookup(tool, args)
        if mocked is not None:
            if mocked.check_request is not None:
                mocked.check_request(await self.request_of(tool, args))
            return mocked.value(tool)
        try:
            result = await self.run_tool_for_real(tool, args)
        except ToolRefusal as refusal:
            self.t.mocks.observe(tool, args, None, str(refusal))
            raise
        self.t.mocks.observe(tool, args, result, None)
        return result

    async def request_of(self, tool: ToolConfig, args: dict[str, Any]) -> dict[str, Any] | None:
        """The HTTP request the tool's kind would send for this call, built but not sent (None:
        the kind sends none, or an action-only tool)."""
        key = tool.kind
        if key is None:
            return None
        return await self.t.tools.runtime(key).request(tool, tool.kinds[key], args, _KindCall(self))

    async def run_tool_for_real(self, tool: ToolConfig, args: dict[str, Any]) -> Any:
        """What the tool's kind gives (None: an action-only tool)."""
        key = tool.kind
        if key is None:
            return None
        return await self.t.tools.runtime(key).call(tool, tool.kinds[key], args, _KindCall(self))

    def check_requires(self, tool: ToolConfig) -> None:
        """Refuse a call whose `requires` paths are not set, naming for each the tools that set it."""
        roots = self.t.roots()
        missing = [p for p in tool.requires if get_path(roots, p) in (None, "")]
        if not missing:
            return
        groups: dict[tuple[str, ...], list[str]] = {}  # the paths with the same setters, in order
        here = self.t.config.routes[self.t.c.scope.route].tools
        for path in missing:
            setters = [s for s in self.t.tools.setters(path) if s.tool != tool.name]
            offered = [s for s in setters if s.tool in here]
            key = ("here", *dict.fromkeys(s.tool for s in offered)) if offered else \
                  ("elsewhere", *dict.fromkeys(s.tool for s in setters))
            groups.setdefault(key + (_hint(offered),), []).append(path)
        parts = [_missing_part(paths, key) for key, paths in groups.items()]
        raise ToolRefusal(f"Error: {tool.name} cannot run yet: {'; '.join(parts)}.")

    def check_action(self, tool: ToolConfig, action: ActionConfig | None = None) -> None:
        """Refuse, before anything applies, an action that cannot complete."""
        action = action or tool.action
        if action.pop and len(self.t.c.scopes) == 1:
            msg = (f"{tool.name} tried to pop the root scope (route {self.t.c.scopes[0].route}); "
                   "there is no parent route to return to, so nothing changed")
            self.t.emit(ev.ERROR, msg, runtime=True)
            raise ToolRefusal(f"Error: {msg}.")
        for target in (action.push, action.route, action.call):
            if target and not self.t.c.may_enter(target):
                roles = ", ".join(self.t.config.routes[target].roles)
                msg = f"you are not allowed to enter route {target} (it needs one of the roles: {roles})"
                self.t.emit(ev.ERROR, msg[0].upper() + msg[1:], runtime=True)
                raise ToolRefusal(f"Error: {tool.name} failed: the user is not allowed to enter route {target}.")
    async def apply(self, tool: ToolConfig, args: dict[str, Any], result: Any, action: ActionConfig,
                    call_id: str = "") -> ToolOutcome:
        """The action (`apply_action`); a `once` call that did something is remembered as done."""
        same = parts = ""
        if tool.effect == ONCE:  # its identity before the action changes the state (the one `repeated` made, if
            # this call's and nothing a handler wrote can have changed it: the tool `requires` nothing)
            checked = self.checked
            same = checked[1] if checked is not None and checked[0] is args and not tool.requires \
                else self.identity_of(tool, args)
            parts = self.made_of(tool, args)
        outcome = await self.apply_action(tool, args, result, action, call_id)
        if same and _did_something(tool, action):
            self.remember_done(tool, same, outcome.reply, parts)
        return outcome

    async def apply_action(self, tool: ToolConfig, args: dict[str, Any], result: Any, action: ActionConfig,
                           call_id: str = "") -> ToolOutcome:
        """The action's effects, in order: state and events, the scope's memory, the user's
        message and choices, then the move; returns what the model reads and the next step."""
        where = tool.where
        extra = {"args": args, "result": result}
        self.assign_and_emit(tool, action, extra)
        if action.remember:
            self.remember(tool, action, extra)
        scope = self.t.c.scope
        if action.clear_memory:
            self.t.c.clear_scope_memories(scope)
        if action.wipe == "schedule":
            self.t.wipe_scheduled.add(scope.id)
        elif action.wipe == "abort":
            self.t.wipe_aborted.add(scope.id)
        if action.message:
            self.t.emit(ev.MESSAGE, self.t.render_template(action.message, "message", where, extra))
        self.t.offer(action.choices, f"tool {tool.name} choices", where, extra)
        handed_back = self.t.render_template(action.result, "result", where, extra) if action.result else None
        reply = self.t.render_template(action.reply, "reply", where, extra) if action.reply else None
        resumes = self.move(tool, action, handed_back, call_id)
        if action.end:
            self.t.ended = tool.name
        if action.operator is not None:
            pausing.hand_over(self.t, tool, action.operator, extra)
            if reply is None:
                reply = "An operator takes the conversation over now; the conversation continues with them."
            return ToolOutcome(reply, NextStepPause(), moved=True)
        if reply is None:
            reply = self.default_reply(tool, result, action)
        # A call runs the called route now; a returning call resumes the caller now.
        execute = action.execute or bool(action.call) or resumes
        return ToolOutcome(reply, _next_step(action, execute), moved=action.leaves_route or action.end,
                           deferred=bool(action.call))

    def assign_and_emit(self, tool: ToolConfig, action: ActionConfig, extra: dict[str, Any]) -> None:
        """The action's `set` assignments, then its `emit` events."""
        where = tool.where
        self.t.assign(action.set, "set", where, extra, f"tool {tool.name}")
        for event_type, template in action.emit.items():
            def render(text: str, of: str = f"emit {event_type}") -> Any:
                return self.t.render_template(text, of, where, extra, typed=True)

            value = render_nested(template, render)  # data: each text in it is a template
            if isinstance(template, str) and is_nothing(value):
                continue  # ... and sends no event
            self.t.emit(event_type, value)

    def remember(self, tool: ToolConfig, action: ActionConfig, extra: dict[str, Any]) -> None:
        """The action's `remember:` facts, kept of the signed-in user (`user_memory:`): this
        conversation reads them at once, later ones once the turn commits (the server saves
        `remembered`). A template that renders nothing (None, undefined: docs/format.md, "Nothing")
        writes nothing: that fact stays as it was. No principal: nothing to keep them under."""
        c = self.t.c
        if c.user_memory_owner() is None:
            log.info("session %s: tool %s remembers nothing: no one is signed in", c.id, tool.name)
            return
        written = {fact: self.t.render_template(template, f"remember {fact}", tool.where, extra, typed=True)
                   for fact, template in action.remember.items()}
        changes = {fact: value for fact, value in written.items() if not is_nothing(value)}
        if changes:
            c.remembered = {**c.remembered, **changes}
            c.user_memory = {**c.user_memory, **changes}

    def move(self, tool: ToolConfig, action: ActionConfig, handed_back: str | None, call_id: str) -> bool:
        """The action's pop, push, route change or call. Returns True when a pop resumed a caller."""
        resumes = False
        if action.pop:
            caller = self.t.c.pop_scope(handed_back)
            self.t.resume(caller)
            resumes = caller is not None
        if action.push:
            self.t.c.push_scope(action.push)
        if action.route:
            self.t.c.change_route(action.route)
        if action.call:
            self.t.c.push_scope(action.call, {"call_id": call_id, "tool": tool.name})
        if action.leaves_route:
            self.t.emit(ev.ROUTE_CHANGED, {"route": self.t.c.scope.route, "stack": self.t.c.stack})
        return resumes

    def choose(self, tool: ToolConfig, args: dict[str, Any], result: Any) -> ActionConfig:
        """The action calling the tool applies: its own, with the first case whose condition holds
        (else the `else:` case) over it. Conditions see the state as it is before the action."""
        action = tool.action
        if not action.cases:
            return action
        context = self.t.context(args=args, result=result)
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
        return WorkingState(ev.copy_plain(self.t.c.state), [s.copy() for s in self.t.c.scopes],
                            ev.copy_plain(self.t.turn_state))

    def adopt(self, work: WorkingState) -> None:
        self.t.c.state = work.state
        for live, written in zip(self.t.c.scopes, work.scopes, strict=True):
            live.local, live.shared = written.local, written.shared
        self.t.turn_state.clear()
        self.t.turn_state.update(work.turn)

    def handler_error(self, tool: ToolConfig, args: dict[str, Any], failure: ToolFailed) -> ToolOutcome:
        """A declared failure (`on_error:`): the user gets its message, the model its reply."""
        on_error = tool.on_error
        assert on_error is not None
        # chatrun's own note goes to every client as it is sent: it holds what the store would keep
        # of the failure. The author's `{{ error }}` renders the text as raised (the store redacts its copies).
        self.t.emit(ev.CONSOLE, self.kept(f"handled failure: {failure}"))
        extra = {"args": args, "error": failure.reason}
        if on_error.message:
            self.t.emit(ev.MESSAGE, self.t.render_template(on_error.message, "on_error message", on_error.where, extra))
        if on_error.reply:
            return ToolOutcome(self.t.render_template(on_error.reply, "on_error reply", on_error.where, extra),
                               failed=True)
        return ToolOutcome(f"Error: {tool.name} failed: {failure.reason}. Nothing was done.", failed=True)

    def default_reply(self, tool: ToolConfig, result: Any, action: ActionConfig) -> str:
        if result is not None:
            return result_text(result)
        if action.leaves_route:
            return f"Done. The conversation is now on route {self.t.c.scope.route}."
        return "Done."




class _KindCall:
    """What a tool kind's call gets from the turn (chatrun.toolkinds.base.CallContext)."""

    def __init__(self, calls: ToolCalls):
        self.calls = calls

    @property
    def route(self) -> str:
        return self.calls.t.c.scope.route

    @property
    def session_id(self) -> str:
        return self.calls.t.c.id

    @property
    def idempotency_key(self) -> str:
        return self.calls.key

    def render(self, source: Any, what: str, where: Location, values: dict[str, Any], *, typed: bool) -> Any:
        return self.calls.t.render_template(source, what, where, values, typed=typed)

    def writable(self) -> Writable:
        """Copies of the state, kept as `turn.work` and adopted only if the tool goes on."""
        work = self.calls.work = self.calls.working_copy()
        return Writable(work.state, ScopeView(work.scopes), work.turn)

    def emit(self, event_type: str, data: object, audience: str | None = None) -> None:
        self.calls.t.emit(event_type, data, audience=audience)

    def trace_headers(self, headers: dict[str, str]) -> None:
        tracing.inject(headers)

    def attachments(self) -> list[Attachment]:
        return self.calls.t.conversation_attachments()

    @property
    def message_attachments(self) -> tuple[Attachment, ...]:
        return self.calls.t.attachments

    def read_attachment(self, attachment: Attachment) -> bytes | None:
        return None if attachment.is_url else self.calls.t.read_blob(attachment.ref)


def _hint(setters: list[Setter]) -> str:
    """How the value reaches a setter the model can call: the runtime asks the user (`ask.into`),
    or the model gives it from what the user says (a `set:` of its arguments); "" else."""
    if any(s.asks for s in setters):
        return "asks"
    return "from_args" if any(s.from_args for s in setters) else ""


def _missing_part(paths: list[str], key: tuple[str, ...]) -> str:
    """One part of a `requires` refusal: the paths not set, and what the model should do about them."""
    where, *tools, hint = key
    it = "it" if len(paths) == 1 else "them"
    listed = f"{', '.join(paths)} {'is' if len(paths) == 1 else 'are'} not set"
    if where == "here" and tools:
        extra = " (it asks the user)" if hint == "asks" else f" (ask the user for {it})" if hint == "from_args" else ""
        return f"{listed} — call {' or '.join(tools)} first{extra}"
    if tools:
        return f"{listed} — {' or '.join(tools)} {'sets' if len(tools) == 1 else 'set'} {it}, not offered here; " \
               f"ask the user for {it}"
    return f"{listed} — ask the user for {it}"


def _next_step(action: ActionConfig, execute: bool) -> NextStep:
    """The step a tool call's action asks for: the conversation ends, or the loop stops (a move,
    `immediate`) and the route it is on runs next only with `execute`, or the model reads the result."""
    if action.end:
        return NextStepFinalOutput()
    if action.leaves_route or action.immediate:
        return NextStepHandoff() if execute else NextStepFinalOutput()
    return NextStepRunAgain()


def _did_something(tool: ToolConfig, action: ActionConfig) -> bool:
    """Whether a call did anything to remember: its kind ran (a handler, an API, a server), the
    action that applied writes state or sends events, or a person approved it (a tool with
    `approval:` or `confirm:`: the same call again would ask them again for what they said yes
    to). A case that only answered (a refusal written as a case) did nothing: the same call may
    run when it would do something."""
    return (tool.kind is not None or bool(action.set or action.emit) or bool(action.ask and action.ask.into)
            or tool.approval is not None)


UNKNOWN_TOOL = "(unknown)"  # the tool of a call naming none the route offers, in metrics and span names


def tool_label(call: ToolCall, offered: dict[str, ToolConfig]) -> str:
    """The tool a call is counted and its span named by: a name the model made up is not a label
    (one series, or span name, per invented name would never end); the span keeps the name sent."""
    return call.name if call.name in offered else UNKNOWN_TOOL


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
