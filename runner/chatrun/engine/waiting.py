"""Humans in the loop at work in a turn: who may decide, and the turns that resolve what waits.

The data (PendingItem, the inputs Approve/Reject/Answer/TakeOver/OperatorSay/Release/Expire) is
engine/pending.py's; the items are made inside a tool call by engine/pausing.py. This module:

- `check_decision` runs before a decision turn starts (roles, the self rule, a pending item,
  valid edited arguments or answer) and raises: nothing is committed when it refuses.
- `first_step` is where every turn begins: a decision resolves its item and says how the model
  loop continues; a message while something waits follows the rules of docs/format.md
  ("Messages while something is pending"); otherwise the current route runs as always.

A resolution resumes the call that waited through the call path (engine/call.py's `ToolCalls`:
`run_checked_tool` for an approved call, `apply` for an answered question) and sees the rest of
its turn only through the call path's `TurnContext`; it never imports the turn.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator

from chatrun import events as ev
from chatrun.definition.config import (
    ApprovalCaseConfig,
    BotConfig,
    OperatorTimeoutConfig,
    ToolConfig,
)
from chatrun.definition.page_texts import UNNAMED_OPERATOR, about_operator, said
from chatrun.definition.templates import holds
from chatrun.engine import follow_up, tracing
from chatrun.engine.call import ToolCalls
from chatrun.engine.context import storable
from chatrun.engine.conversation import Conversation
from chatrun.engine.pausing import new_item, takeover_data
from chatrun.engine.pending import (
    ANSWERED,
    APPROVAL,
    APPROVED,
    BACKEND_ROLE,
    EDITED,
    HELD_KEY,
    OPERATOR_ROLE,
    QUESTION,
    REJECTED,
    RELEASED,
    TAKEN,
    TAKEOVER,
    TIMED_OUT,
    USER_ROLE,
    Answer,
    Approve,
    Decision,
    Expire,
    OperatorSay,
    PendingItem,
    Reject,
    Release,
    TakeOver,
    decision_entry,
    format_time,
    granted_roles,
    parse_time,
)
from chatrun.engine.steps import (
    NextStep,
    NextStepFinalOutput,
    NextStepHandoff,
    ToolOutcome,
    combine,
)
from chatrun.engine.tools import check_arguments
from chatrun.errors import (
    ChatrunError,
    DecisionRefused,
    HeldByAnother,
    InvalidDecision,
    NotPending,
    ToolRefusal,
    TurnFailed,
    UnknownRouteError,
)
from chatrun.memory import ChatMemory, SummaryMemory
from chatrun.messages import (
    AssistantMessage,
    Attachment,
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

if TYPE_CHECKING:
    from chatrun.engine.tools import Toolbox

RESOLVED_KEPT = 50  # how many resolved items' outcomes a session remembers (for NotPending)
_YES = {"approve", "approved", "yes", "y", "ok", "okay", "sure", "confirm", "go ahead"}
_NO = {"reject", "rejected", "no", "n", "deny", "cancel", "decline"}
OTHER_ANSWER = "the user answered with another message"  # the reason of a decline by any other message
# An operator's written message to a phone call's session: the takeover put the caller through to
# the channel's `handoff_to` (or hung up), so no relay is left to say it, and a call has no outbox.
_CALLER_UNREACHABLE = ("not sent: session {session} is a phone call, and the caller cannot receive a written "
                       "message (the takeover puts the call through to the twilio channel's handoff_to number, or "
                       "hangs up without one, and a call has no outbox); speak to the caller on that line, then "
                       "release the conversation")


# -- who may decide (before the turn) -------------------------------------------------------------


def check_decision(c: Conversation, tools: Toolbox, decision: Decision) -> None:
    """Refuse a decision before its turn starts: NotPending, DecisionRefused or InvalidDecision.
    Expire, TakeOver of a conversation nobody handed over, and the like need no item."""
    if isinstance(decision, Expire):
        return
    if isinstance(decision, TakeOver | OperatorSay | Release):
        item = takeover_item(c)
        if item is None and not isinstance(decision, TakeOver):
            raise NotPending(c.id, "takeover", None)
        needed = list(dict.fromkeys([*(item.by if item else handover_roles(c.config)), OPERATOR_ROLE]))
        _check_roles(c, item.id if item else "takeover", needed)
        _check_holder(c, decision)
        if isinstance(decision, OperatorSay) and c.meta.get(follow_up.CALL):
            raise InvalidDecision(item.id if item else "takeover", _CALLER_UNREACHABLE.format(session=c.id))
        if isinstance(decision, Release) and decision.route and decision.route not in c.config.routes:
            raise UnknownRouteError(decision.route, list(c.config.routes))
        return
    item = find_item(c, decision.item)
    if HELD_KEY in item.data:
        raise InvalidDecision(item.id, "it is decided already: what was decided is held until the operator "
                              "releases the conversation, and applies then")
    if isinstance(decision, Answer):
        if item.kind != QUESTION:
            what = "an approval, not a question: approve or reject it" if item.kind == APPROVAL else \
                "a takeover, not a question: release it"
            raise InvalidDecision(item.id, f"it is {what}")
        if BACKEND_ROLE in item.by or item.token is not None:
            # A backend proves itself with the item's token, always: also where roles are not
            # checked, and whatever roles the caller holds (no role is `backend`: granted_roles).
            if not _token_matches(item.token, decision.token):
                why = "the token does not match this question's" if decision.token else \
                    "a question for a backend is answered with its token (the one its sinks received)"
                raise DecisionRefused(item.id, item.by, _caller_roles(c, item) or [], f"item {item.id}: {why}")
        else:
            _check_roles(c, item.id, item.by, item)
        problem = answer_problem(item, decision.value)
        if problem:
            raise InvalidDecision(item.id, f"the answer is invalid: {problem}")
        return
    if item.kind != APPROVAL:
        raise InvalidDecision(item.id, f"it is a {item.kind}, not an approval: "
                              + ("answer it" if item.kind == QUESTION else "release it"))
    _check_roles(c, item.id, item.by, item)
    if not item.data.get("self", True) and _same_principal(c.principal, item.requested_by):
        raise DecisionRefused(item.id, item.by, _caller_roles(c, item) or [],
                              f"item {item.id}: the principal whose message caused the call of {item.tool} may not "
                              "decide it (the tool's `approval` does not allow `self`); another approver must")
    if isinstance(decision, Approve) and decision.args is not None:
        edited_args(c, tools, item, decision.args)


def _check_holder(c: Conversation, decision: TakeOver | OperatorSay | Release) -> None:
    """One operator holds a taken conversation: another one's takeover, message or release is
    refused (HeldByAnother), so the user never reads a leaving they never read joining. The
    holder taking over again is not refused: nothing happens (an idempotent retry). A forced
    takeover is not refused either: it moves the hold, announced (`operate`), so a holder who
    went home without releasing does not leave the user unanswered for ever."""
    if isinstance(decision, TakeOver) and decision.force:
        return
    holder = held_by_another(c.taken_over, c.principal)
    if holder is None:
        return
    action = {TakeOver: "takeover", OperatorSay: "an operator's message", Release: "release"}[type(decision)]
    raise HeldByAnother(c.id, action, holder)


def held_by_another(taken_over: dict[str, Any] | None, principal: dict[str, Any] | None) -> str | None:
    """The name of the operator who holds a taken conversation when it is not `principal`
    (whose takeover, message or release is then refused: HeldByAnother), else None. The
    operator console asks it too, so it offers no action the server would refuse."""
    if taken_over is None:
        return None
    holder = taken_over.get("by")
    # Taken by no one signed in (auth off then): no holder to name, whoever may act does, so a
    # conversation taken before the server had --auth is not held for ever.
    if holder is None or _same_principal(principal, holder):
        return None
    return _operator_name(holder)


def _token_matches(expected: str | None, sent: str | None) -> bool:
    """Whether a backend sent its item's token (compared in constant time, as bytes: a token
    is any text a request carries)."""
    return bool(expected and sent) and secrets.compare_digest(str(expected).encode(), str(sent).encode())


def find_item(c: Conversation, item_id: str) -> PendingItem:
    for item in c.pending:
        if item.id == item_id:
            return item
    raise NotPending(c.id, item_id, c.resolved.get(item_id))


def takeover_item(c: Conversation) -> PendingItem | None:
    return next((item for item in c.pending if item.kind == TAKEOVER), None)


def handover_roles(config: BotConfig) -> list[str]:
    """The roles a bot's `operator:` actions name: besides `operators`, who may take over any of
    its sessions (one nobody handed over too)."""
    roles = (tool.action.operator.role for tool in config.tools.values() if tool.action.operator is not None)
    return sorted(set(roles))


def _caller_roles(c: Conversation, item: PendingItem | None = None) -> list[str] | None:
    """The caller's roles, with `user` when it is the session's user: no one signed in, the
    session's owner, or the principal whose message made the item. None: roles are not checked
    (a program or a server without --auth). `user` and `backend` among the caller's own roles
    count for nothing (granted_roles): the engine alone says who the user is."""
    if c.roles is None:
        return None
    roles = granted_roles(c.roles)
    name = (c.principal or {}).get("name")
    owner = c.meta.get("owner")
    if c.principal is None or (owner and name == owner) or (item and _same_principal(c.principal, item.requested_by)):
        roles.add(USER_ROLE)
    return sorted(roles)


def _check_roles(c: Conversation, item_id: str, needed: list[str], item: PendingItem | None = None) -> None:
    roles = _caller_roles(c, item)
    if roles is not None and not set(roles) & set(needed):
        raise DecisionRefused(item_id, needed, roles)


def _same_principal(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two principals are the same one (by name; no one signed in is the same no one)."""
    if a is None or b is None:
        return a is None and b is None
    return bool(a.get("name")) and a.get("name") == b.get("name")


def edited_args(c: Conversation, tools: Toolbox, item: PendingItem, changes: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments with an approver's changes, which must be editable and valid."""
    tool = c.config.tools[item.tool or ""]
    original = item.args or {}
    changed = sorted(k for k, v in changes.items() if original.get(k, _MISSING) != v)
    editable = set(item.edit)
    refused = [k for k in changed if k not in editable]
    if refused:
        allowed = ", ".join(item.edit) or "none"
        raise InvalidDecision(item.id, f"these arguments of {tool.name} may not be edited: {', '.join(refused)} "
                              f"(editable: {allowed})")
    args = {**original, **changes}
    try:
        check_arguments(tool, args, tools.argument_validator(tool))
    except ToolRefusal as refusal:
        raise InvalidDecision(item.id, _problem(refusal)) from None
    return args


def _problem(refusal: ToolRefusal) -> str:
    """A refusal of arguments as a person reads it (without what the model is told to do)."""
    return str(refusal).removeprefix("Error: ").replace(" Call it again with valid arguments.", "")


_MISSING = object()


def answer_problem(item: PendingItem, value: Any) -> str | None:
    """What is wrong with an answer to a question (None: it matches the item's schema)."""
    validator = Draft202012Validator(item.schema or {}, format_checker=Draft202012Validator.FORMAT_CHECKER)
    problems = [f"{'.'.join(map(str, e.absolute_path)) or 'the answer'}: {e.message}"
                for e in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))]
    return "; ".join(problems) or None


# -- where a turn begins ------------------------------------------------------------------------


async def first_step(calls: ToolCalls) -> NextStep:
    """A decision's continuation, a message's handling while something waits, or (nothing
    waits) the current route runs."""
    decision = calls.t.decision
    if decision is not None:
        return await decide(calls, decision)
    c = calls.t.c
    if takeover_item(c) is not None:
        return to_operators(calls)
    blocking = [item for item in c.pending if item.scope_id == c.scope.id]
    if not blocking:
        return NextStepHandoff()
    item = blocking[0]
    if item.kind == APPROVAL and user_decides(calls, item):
        return await approval_by_message(calls, item)
    if item.kind == QUESTION and item.by == [USER_ROLE]:
        return await answer_by_message(calls, item)
    return queue(calls, item)


def user_decides(calls: ToolCalls, item: PendingItem) -> bool:
    return USER_ROLE in item.by and (item.data.get("self", True)
                                     or not _same_principal(calls.t.c.principal, item.requested_by))


async def approval_by_message(calls: ToolCalls, item: PendingItem) -> NextStep:
    """The user's message decides an approval they may decide: yes runs the call; no, or
    anything else, does not. Anything else is no answer to the question but a new request
    ("make it 50", "to Ana, not Maria"): the call is declined and the model reads the
    message after it, to call again (the user is asked again) or answer it (docs/tools.md,
    "Consent from the user"). Asking the same question again instead would keep a user who
    changed their mind stuck until they typed no."""
    consent = _consent(_said(calls), item, calls.t.texts())
    if consent is True:
        return await decide(calls, Approve(item.id))
    if consent is False:
        return await decide(calls, Reject(item.id))
    step = await rejected(calls, item, REJECTED, OTHER_ANSWER)
    c = calls.t.c
    text = calls.t.render_user(c.route)
    if text or calls.t.attachments:  # after the call's result: the model reads it as the user's answer
        calls.t.give(_memory_of(calls, item), text)
    return step


def _consent_choices(item: PendingItem, texts: dict[str, str]) -> list[dict[str, Any]]:
    """The labels a yes or no may be given as: the user's (in their locale) and chatrun's English."""
    return [*(item.for_user(texts).get("choices") or ()), *(item.public().get("choices") or ())]


def _consent(said: str, item: PendingItem, texts: dict[str, str]) -> bool | None:
    """True for a yes, False for a no (a choice's label or value, or a word of _YES/_NO, with
    a polite "please" or "thanks"), None for anything else."""
    text = re.sub(r"[\s,.!]+", " ", said).strip().casefold()
    text = re.sub(r"^please |( please| thanks| thank you)$", "", text).strip()
    for choice in _consent_choices(item, texts):
        if text in (str(choice.get("label", "")).casefold(), str(choice.get("value", "")).casefold()):
            text = str(choice.get("value", "")).casefold()
    if text in _YES:
        return True
    if text in _NO:
        return False
    return None


async def answer_by_message(calls: ToolCalls, item: PendingItem) -> NextStep:
    value = _answer_of(calls, item)
    problem = answer_problem(item, value)
    if problem:
        calls.t.emit(ev.MESSAGE, calls.t.own_text("answer_unfit", problem=problem, text=item.ask))
        if item.choices:
            calls.t.emit(ev.CHOICES, {"choices": item.choices})
        return NextStepFinalOutput()
    return await decide(calls, Answer(item.id, value))


def _said(calls: ToolCalls) -> str:
    value = calls.t.data.get("value") if calls.t.data else None
    return str(value) if value is not None else calls.t.user_message or ""


def _answer_of(calls: ToolCalls, item: PendingItem) -> Any:
    """A user's message as an answer: a choice's value (by label or value), the text for a string
    schema, else the data sent (without userMessage) or the text read as JSON."""
    text = _said(calls).strip()
    for choice in item.choices or ():
        if text.casefold() in (str(choice.get("label", "")).casefold(), str(choice.get("value", "")).casefold()):
            return choice.get("value")
    if (item.schema or {}).get("type") == "string":
        return text
    data = {k: v for k, v in (calls.t.data or {}).items() if k != "userMessage"}
    if data:
        return data
    try:
        return json.loads(text)
    except ValueError:
        return text


def queue(calls: ToolCalls, item: PendingItem) -> NextStep:
    """Waiting on someone else: the message joins the scope's memory (the model reads it when the
    loop resumes) and the user hears what is awaited. No model call."""
    c = calls.t.c
    scope = c.scope
    memory = c.memory_for(scope, scope.route)
    text = calls.t.render_user(c.route)
    if text:
        memory.add(UserMessage(text))
    texts = calls.t.texts()  # what the user was told (`tell`), never the deciders' `ask`
    calls.t.emit(ev.MESSAGE, said(texts, "still_waiting", text=item.for_user(texts)["ask"]))
    return NextStepFinalOutput()


def to_operators(calls: ToolCalls) -> NextStep:
    """During a takeover the bot is silent: the message goes to the operators and is kept."""
    item = takeover_item(calls.t.c)
    assert item is not None
    data: dict[str, Any] = {"text": calls.t.user_message,
                            "data": {k: v for k, v in calls.t.data.items() if k != "userMessage"}}
    # The talk is kept in the snapshot until the release puts it in the memory: as the history keeps it.
    line: dict[str, Any] = {"from": "user", "text": calls.kept(_said(calls))}
    if calls.t.attachments:  # the files too: the operators see them, and the bot reads them after the release
        data["attachments"] = [a.to_dict() for a in calls.t.attachments]
        line["attachments"] = [a.stored() for a in calls.t.attachments]  # with what the memory counts
    item.data.setdefault("messages", []).append(line)
    calls.t.emit(ev.USER_MESSAGE, data, audience=ev.OPERATORS)
    return NextStepFinalOutput()


# -- decisions ----------------------------------------------------------------------------------


async def decide(calls: ToolCalls, decision: Decision) -> NextStep:
    if isinstance(decision, Expire):
        return await expire(calls, decision)
    if isinstance(decision, TakeOver | OperatorSay | Release):
        return await operate(calls, decision)
    item = find_item(calls.t.c, decision.item)
    if takeover_item(calls.t.c) is not None:
        return hold(calls, item, decision)
    if isinstance(decision, Answer):
        return await answered(calls, item, decision.value, ANSWERED)
    if isinstance(decision, Reject):
        return await rejected(calls, item, REJECTED, decision.reason)
    args = item.args or {}
    if decision.args is not None:
        args = edited_args(calls.t.c, calls.t.tools, item, decision.args)
    return await approved(calls, item, args, EDITED if args != (item.args or {}) else APPROVED, decision.reason)


async def expire(calls: ToolCalls, decision: Expire) -> NextStep:
    """Every item due by `now` (the session clock's, unless given) is resolved as its timeout
    says, and a follow-up due by then is sent (engine/follow_up.py)."""
    now = parse_time(decision.now) if decision.now else calls.t.c.now()
    follow_up.fire(calls.t, now)
    steps: list[NextStep] = []
    for item in [i for i in calls.t.c.pending if i.is_due(now)]:
        if item.kind == TAKEOVER:
            steps.append(await handover_timed_out(calls, item))
        elif takeover_item(calls.t.c) is not None:
            steps.append(hold(calls, item, None))
        else:
            steps.append(await timed_out(calls, item))
    return combine(steps) if steps else NextStepFinalOutput()


async def timed_out(calls: ToolCalls, item: PendingItem) -> NextStep:
    """An approval or a question whose time is up is resolved as its `on_timeout` says."""
    if item.kind == APPROVAL:
        return await approval_timed_out(calls, item)
    tool = calls.t.config.tools[item.tool or ""]
    ask = tool.action.ask
    if ask is not None and ask.has_on_timeout:
        return await answered(calls, item, ask.on_timeout, TIMED_OUT)
    return dropped(calls, item)


# -- while an operator has the conversation -------------------------------------------------------


def hold(calls: ToolCalls, item: PendingItem, decision: Decision | None) -> NextStep:
    """While the conversation is with the operators the bot is silent: a decision on another item
    (a supervisor's, a backend's answer) or its timeout (`decision` None) is recorded on the item
    (`held`: not due any more, no second decision) and applied on release (`apply_held`). Nothing
    of it runs now and the model does not run; the operators see the item as held."""
    c = calls.t.c
    entry = decision_entry(decision)["decision"] if decision is not None else {"kind": "timeout", "item": item.id}
    record = {"decision": entry, "by": copy.deepcopy(c.principal) if decision is not None else None,
              "at": format_time(c.now())}
    held = replace(item, due=None, data={**item.data, HELD_KEY: record})
    c.pending = tuple(held if i.id == item.id else i for i in c.pending)
    calls.t.emit(ev.PENDING, held.public(), audience=ev.OPERATORS)
    return NextStepFinalOutput()


async def apply_all_held(calls: ToolCalls) -> NextStep:
    """The bot has the conversation back: what was decided meanwhile applies now, in the order it
    was decided; the model goes on after it as after any decision (nothing held: it waits for the
    user's next message)."""
    held = sorted((i for i in calls.t.c.pending if HELD_KEY in i.data), key=lambda i: str(i.data[HELD_KEY]["at"]))
    steps = [await apply_held(calls, item) for item in held]
    return combine(steps) if steps else NextStepFinalOutput()


async def apply_held(calls: ToolCalls, item: PendingItem) -> NextStep:
    """One held decision, applied as if made now by whoever made it (`decision.by`, the Resolved
    event's `by`), not by the operator who released."""
    record = item.data[HELD_KEY]
    entry = record["decision"]
    c = calls.t.c
    principal = c.principal
    c.principal = record.get("by")
    try:
        if entry["kind"] == "timeout":
            return await timed_out(calls, item)
        return await decide(calls, _held_decision(entry))
    finally:
        c.principal = principal


def _held_decision(entry: dict[str, Any]) -> Decision:
    """A held decision (its history form, engine/pending.py `decision_entry`) as the input it was."""
    if entry["kind"] == "answer":
        return Answer(entry["item"], entry.get("value"))
    if entry["kind"] == "reject":
        return Reject(entry["item"], entry.get("reason"))
    return Approve(entry["item"], entry.get("args"), entry.get("reason"))


async def approval_timed_out(calls: ToolCalls, item: PendingItem) -> NextStep:
    """A timeout decides as `on_timeout` says: reject, approve, or the named case's first entry
    that holds (none holds, or the bot no longer has the case: reject)."""
    on_timeout = item.data.get("on_timeout") or "reject"
    if on_timeout == "approve":
        return await approved(calls, item, item.args or {}, TIMED_OUT, None)
    tool = calls.t.config.tools[item.tool or ""]
    entries = tool.approval.cases.get(on_timeout, []) if tool.approval is not None else []
    entry = _holding_entry(calls, tool, item, entries)
    if entry is None:
        return await rejected(calls, item, TIMED_OUT, None)
    calls.t.decision_info = _decision(calls, TIMED_OUT, None, item.args, on_timeout)
    if entry.message:
        calls.t.emit(ev.MESSAGE, calls.t.render_template(entry.message, "timeout case message", entry.where,
                                                   {"args": item.args}))
    if entry.reject is not None:
        step = await rejected(calls, item, TIMED_OUT, None, case=on_timeout, text=entry.reject or None)
        if entry.route and entry.route != calls.t.c.scope.route:
            calls.t.c.change_route(entry.route)
            calls.t.emit(ev.ROUTE_CHANGED, {"route": calls.t.c.scope.route, "stack": calls.t.c.stack})
            return NextStepFinalOutput()  # the next message goes to the new route
        return step
    changes = {k: calls.t.render_template(v, f"timeout case approve.{k}", entry.where, {"args": item.args}, typed=True)
               if isinstance(v, str) else v for k, v in (entry.approve or {}).items()}
    args = {**(item.args or {}), **changes}
    try:
        check_arguments(tool, args, calls.t.tools.argument_validator(tool))
    except ToolRefusal as refusal:  # the author's case gave invalid arguments: refuse, never run them
        calls.t.emit(ev.CONSOLE, f"timeout case {on_timeout} of {tool.name}: {_problem(refusal)}")
        return await rejected(calls, item, TIMED_OUT, None, case=on_timeout,
                              text=f"No one approved this call of {tool.name} in time, and the arguments the "
                              f"timeout's case `{on_timeout}` gave are invalid; it was not run.")
    return await approved(calls, item, args, TIMED_OUT, None, case=on_timeout)


def _holding_entry(calls: ToolCalls, tool: ToolConfig, item: PendingItem,
                   entries: list[ApprovalCaseConfig]) -> ApprovalCaseConfig | None:
    context = calls.t.context(args=item.args or {})
    for entry in entries:
        if entry.condition is None:
            return entry
        try:
            if holds(entry.condition, context):
                return entry
        except ChatrunError:
            raise
        except Exception as exc:
            raise TurnFailed(f"tool {tool.name} ({entry.where}): condition `{entry.condition}` failed: {exc}") from exc
    return None


def _decision(calls: ToolCalls, outcome: str, reason: str | None, args: dict[str, Any] | None,
              case: str | None = None) -> dict[str, Any]:
    """What `decision` is in templates (a case's condition, `rejected`) while it applies; `case`
    names the approval's case a timeout decided by."""
    by = None if outcome == TIMED_OUT else (calls.t.c.principal or {}).get("name")
    return {"outcome": outcome, "by": by, "reason": reason, "args": args, "case": case}


async def approved(calls: ToolCalls, item: PendingItem, args: dict[str, Any], outcome: str,
                   reason: str | None, case: str | None = None) -> NextStep:
    """The call runs now with `args` (its action too), its result replaces the placeholder."""
    tool = calls.t.config.tools[item.tool or ""]
    calls.t.decision_info = _decision(calls, outcome, reason, args, case)
    memory = _memory_of(calls, item)
    resolve(calls, item, outcome, reason=reason, args=args, case=case)
    with tracing.tool_span(tool.name, item.call_id or "", f"{outcome} {item.id}") as span:
        calls.took_effect = False
        asked = calls.identity_of(tool, item.args or {})  # before the call changes what it acts on
        asked_parts = calls.made_of(tool, item.args or {})
        # The call runs in this turn: its history record (args, result) is this turn's, so a
        # transcript's `calls:` and `chatrun record --from-session`'s mocks see it here.
        record: dict[str, Any] = {"tool": tool.name, "route": calls.t.c.scope.route, "args": storable(args)}
        calls.t.tool_calls.append(record)
        try:
            calls.check_action(tool)  # the state may have changed while it waited (a route's roles)
            # ... and the bot: a version move may have changed the tool's parameters (docs/versions.md)
            check_arguments(tool, args, calls.t.tools.argument_validator(tool))
            tool_outcome = await calls.run_checked_tool(tool, args, item.call_id or "")
        except ToolRefusal as refusal:
            tool_outcome = ToolOutcome(str(refusal), failed=True)
        record["error" if tool_outcome.failed else "reply"] = storable(tool_outcome.reply)
        if calls.took_effect and args != (item.args or {}):
            # The call asked for is done too (with the approver's changes): asked again, it gets this result.
            calls.remember_done(tool, asked, tool_outcome.reply, asked_parts)
        if tool_outcome.failed:
            tracing.tool_failed(span)
    return _continue(calls, item, memory, tool_outcome)


async def rejected(calls: ToolCalls, item: PendingItem, outcome: str, reason: str | None, *, case: str | None = None,
                   text: str | None = None) -> NextStep:
    """The call is refused: the model reads `text` (a timeout case's), else the tool's `rejected`."""
    tool = calls.t.config.tools[item.tool or ""]
    approval = tool.approval
    calls.t.decision_info = _decision(calls, outcome, reason, item.args, case)
    memory = _memory_of(calls, item)
    resolve(calls, item, outcome, reason=reason, case=case)
    if text:
        reply = calls.t.render_template(text, "timeout case reject", approval.where if approval else tool.where,
                                     {"args": item.args})
    elif approval is not None and approval.rejected:
        reply = calls.t.render_template(approval.rejected, "approval rejected", approval.where, {"args": item.args})
    elif approval is not None and approval.confirms:
        reply = _declined(tool, item, outcome, reason)
    elif outcome == TIMED_OUT:
        reply = f"No one approved this call of {tool.name} in time; it was not run."
    else:
        reply = f"This call of {tool.name} was rejected{': ' + reason if reason else ''}; it was not run."
    return _continue(calls, item, memory, await _guarded(calls, tool.name, ToolOutcome(reply)))


def _declined(tool: ToolConfig, item: PendingItem, outcome: str, reason: str | None) -> str:
    """What the model reads when the user did not confirm a call: it was not run, and what to do."""
    asked = json.dumps(item.ask, ensure_ascii=False)
    if outcome == TIMED_OUT:
        return f"The user did not answer {asked} in time: {tool.name} was not run."
    if reason == OTHER_ANSWER:
        return (f"The user did not confirm {asked}: they answered with the message that follows instead of yes or "
                f"no, so {tool.name} was not run. If they still want it, call it again (with what they said now); "
                "they will be asked again.")
    return (f"The user declined {asked}{': ' + reason if reason else ''}: {tool.name} was not run. "
            "Do not call it again unless the user asks for it again.")


async def answered(calls: ToolCalls, item: PendingItem, value: Any, outcome: str) -> NextStep:
    """The answer lands at `into`, then the rest of the tool's action applies with result = it."""
    tool = calls.t.config.tools[item.tool or ""]
    ask = tool.action.ask
    assert ask is not None
    calls.t.decision_info = _decision(calls, outcome, None, item.args)
    memory = _memory_of(calls, item)
    resolve(calls, item, outcome, answer=value)
    args = item.args or {}
    if ask.into:
        calls.t.write_state(ask.into, value, f"tool {tool.name}", ask.where)
    try:
        action = calls.choose(tool, args, value)
        calls.check_action(tool, action)
        # `apply` never reads `ask` (it was this pause): the rest of the action applies now.
        tool_outcome = await calls.apply(tool, args, value, action, item.call_id or "")
    except ToolRefusal as refusal:
        tool_outcome = ToolOutcome(str(refusal), failed=True)
    return _continue(calls, item, memory, await _guarded(calls, tool.name, tool_outcome))


async def _guarded(calls: ToolCalls, tool: str, outcome: ToolOutcome) -> ToolOutcome:
    """A decided call's result (an answer, a reject's reason): the model reads it as `tool_result`."""
    if calls.guard is not None:
        outcome.reply = await calls.guard.check_tool_result(tool, outcome.reply)
    return outcome


def dropped(calls: ToolCalls, item: PendingItem) -> NextStep:
    memory = _memory_of(calls, item)
    calls.t.decision_info = _decision(calls, TIMED_OUT, None, item.args)
    resolve(calls, item, TIMED_OUT, answer=None)
    return _continue(calls, item, memory, ToolOutcome("No answer came in time; the question was dropped."))


def _memory_of(calls: ToolCalls, item: PendingItem) -> ChatMemory:
    c = calls.t.c
    scope = c.find_scope(item.scope_id)
    return c.memory_for(scope, item.route)


def _continue(calls: ToolCalls, item: PendingItem, memory: ChatMemory, outcome: ToolOutcome) -> NextStep:
    """The placeholder result becomes the real one; the model loop goes on on the current route
    without a user message (the memory ends with the call, its result and any queued messages)."""
    replace_result(memory, item.call_id, outcome.reply, drop=outcome.deferred,
                   call=ToolCall(item.call_id or "", item.tool or "", json.dumps(item.args or {})))
    c = calls.t.c
    calls.t.user_given.add(c.scope.memory_id(c.scope.route))
    return outcome.next


def replace_result(memory: ChatMemory, call_id: str | None, reply: str, *, drop: bool = False,
                   call: ToolCall | None = None) -> None:
    """The call's result message (the placeholder) replaced by `reply`, in place (dropped when a
    `call` action's called route will give the result). When the memory no longer holds the
    placeholder (a message window dropped it, with its call, while the item waited), `call` and
    its result are added at the end, so the model reads what was decided as a whole pair."""
    messages = memory.messages()
    at = placeholder_at(messages, call_id)
    if at is not None:
        placeholder = messages[at]
        assert isinstance(placeholder, ToolResultMessage)
        kept = [] if drop else [ToolResultMessage(placeholder.tool_call_id, placeholder.name, reply)]
        messages = [*messages[:at], *kept, *messages[at + 1:]]
    elif not drop and call is not None:
        messages = [*messages, AssistantMessage(None, (call,)), ToolResultMessage(call.id, call.name, reply)]
    memory.set(messages)


# What the model reads of a waiting call in a /v1 fork, which does not take the item (server/openai_sessions.py).
NOT_DECIDED = ("Not decided: the conversation was taken up again from before this call was decided, so {tool} did "
               "not run here and nothing waits for it. If it is still wanted, call it again.")


def not_decided_here(memories: dict[str, list[Message]], item: dict[str, Any]) -> None:
    """The placeholder result of a waiting item's call ("Waiting for ...") in `memories`, replaced
    with NOT_DECIDED: a copy of the conversation without the item (a fork) would tell the model
    the call still waits, and read a `yes` after it as if it decided something."""
    call_id, tool = item.get("call_id"), item.get("tool")
    if not call_id or not tool:
        return  # a takeover: no call waits
    for messages in memories.values():
        at = placeholder_at(messages, call_id)
        if at is not None:
            result = messages[at]
            assert isinstance(result, ToolResultMessage)
            messages[at] = ToolResultMessage(call_id, result.name, NOT_DECIDED.format(tool=tool))


def placeholder_at(messages: list[Message], call_id: str | None) -> int | None:
    """Where the call's result is: the first result of its id after the latest answer that made a
    call of that id. Only that one: a model server that numbers each answer's calls from `call_0`
    reuses ids, and the results of earlier calls with the same id are theirs, not this call's."""
    start = 0
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, AssistantMessage) and any(c.id == call_id for c in message.tool_calls):
            start = i + 1
            break
    for i in range(start, len(messages)):
        message = messages[i]
        if isinstance(message, ToolResultMessage) and message.tool_call_id == call_id:
            return i
    return None


def resolve(calls: ToolCalls, item: PendingItem, outcome: str, **extra: Any) -> None:
    """The item is done: gone from the open list, its outcome kept, a Resolved event sent."""
    c = calls.t.c
    c.pending = tuple(i for i in c.pending if i.id != item.id)
    resolved = {**c.resolved, item.id: outcome}
    while len(resolved) > RESOLVED_KEPT:
        del resolved[next(iter(resolved))]
    c.resolved = resolved
    by = None if outcome == TIMED_OUT else (c.principal or {}).get("name")
    data = {"id": item.id, "kind": item.kind, "outcome": outcome, "by": by,
            **{k: v for k, v in extra.items() if v is not None or k == "answer"}}
    calls.t.emit(ev.RESOLVED, data, audience=ev.USER)  # the user learns every outcome (the operators see all)


# -- operators ------------------------------------------------------------------------------------


async def operate(calls: ToolCalls, decision: TakeOver | OperatorSay | Release) -> NextStep:
    c = calls.t.c
    item = takeover_item(c)
    name = _operator_name(c.principal)
    if item is None:  # an operator takes a conversation nobody handed over
        item = new_item(calls.t, TAKEOVER, None, ask=decision.note if isinstance(decision, TakeOver) and decision.note
                        else "An operator took over.", tell=calls.t.own_text("tell_takeover"), by=_stepping_in_roles(c),
                        data=takeover_data(None, "messages"))
    if isinstance(decision, TakeOver) and decision.force and held_by_another(c.taken_over, c.principal):
        _operator_left(calls, (c.taken_over or {}).get("by"))  # the talk and its item stay: only the holder moves
        c.taken_over = None
    if c.taken_over is None:  # taken: the item stays open (the takeover) until the release
        item = taken(c, item)
        calls.t.emit(ev.RESOLVED, {"id": item.id, "kind": TAKEOVER, "outcome": TAKEN, "by": name})
        # The user reads who joined, in their language, on every channel (the page shows it as a line).
        calls.t.emit(ev.MESSAGE, about_operator(calls.t.texts(), "operator_joined", name),
                     meta={"from": "notice", "notice": "operator_joined", "name": name}, audience=ev.USER)
    if isinstance(decision, OperatorSay):
        item.data.setdefault("messages", []).append({"from": "operator", "name": name,
                                                     "text": calls.kept(decision.text)})
        calls.t.emit(ev.MESSAGE, decision.text, meta={"from": "operator", "name": name})
    elif isinstance(decision, Release):
        await release(calls, item, decision.route)
        return await apply_all_held(calls)
    return NextStepFinalOutput()


def _operator_left(calls: ToolCalls, holder: dict[str, Any] | None) -> None:
    """The user reads who left, in their language: on a release and when another operator takes over."""
    name = _operator_name(holder)
    calls.t.emit(ev.MESSAGE, about_operator(calls.t.texts(), "operator_left", name),
                 meta={"from": "notice", "notice": "operator_left", "name": name}, audience=ev.USER)


def _operator_name(principal: dict[str, Any] | None) -> str:
    """The operator's name as the data keeps it, joining, speaking and leaving (UNNAMED_OPERATOR,
    `operator`, when no one is signed in: a server without --auth, a program; the user reads
    their locale's `*_unnamed` text for it: about_operator)."""
    return (principal or {}).get("name") or UNNAMED_OPERATOR


def _stepping_in_roles(c: Conversation) -> list[str]:
    """Who acts on a takeover nobody handed over: operators, and the role of the bot's
    `operator:` actions the one who stepped in holds (so they may speak and release it)."""
    own = granted_roles(c.roles or ()) & set(handover_roles(c.config))
    return [OPERATOR_ROLE, *sorted(own - {OPERATOR_ROLE})]


def taken(c: Conversation, item: PendingItem) -> PendingItem:
    """An operator has the conversation: the handover's `timeout` no longer applies (it is not due)."""
    c.taken_over = {"by": copy.deepcopy(c.principal), "since": format_time(c.now()), "item": item.id}
    if item.due is None:
        return item
    item = replace(item, due=None)
    c.pending = tuple(item if i.id == item.id else i for i in c.pending)
    return item


async def handover_timed_out(calls: ToolCalls, item: PendingItem) -> NextStep:
    """Nobody took the conversation within the `operator:`'s `timeout`: the handover ends
    (outcome timed_out) and its `on_timeout` applies in order — the tool call (a ticket), the
    message, the route; the bot has the conversation back, and what was held meanwhile applies."""
    c = calls.t.c
    resolve(calls, item, TIMED_OUT)
    plan = _on_timeout_of(calls, item)
    if plan is not None:
        result = await _timeout_call(calls, item, plan) if plan.tool else None
        if plan.message:
            text = calls.t.render_template(plan.message, "operator on_timeout message", plan.where,
                                           {"args": item.data.get("args") or {}, "result": result})
            calls.t.emit(ev.MESSAGE, text)
            c.memory_for(c.scope, c.scope.route).add(AssistantMessage(text))  # the model knows what the user read
        if plan.route and plan.route != c.scope.route and plan.route in c.config.routes:
            c.change_route(plan.route)
            calls.t.emit(ev.ROUTE_CHANGED, {"route": c.scope.route, "stack": c.stack})
    return await apply_all_held(calls)


def _on_timeout_of(calls: ToolCalls, item: PendingItem) -> OperatorTimeoutConfig | None:
    """The handover's `on_timeout` as the bot says now (None: it has none, or no longer the tool)."""
    tool = calls.t.config.tools.get(item.tool or "")
    operator = tool.action.operator if tool is not None else None
    return operator.on_timeout if operator is not None else None


async def _timeout_call(calls: ToolCalls, item: PendingItem, plan: OperatorTimeoutConfig) -> Any:
    """`on_timeout.tool` called with its `args` through the call path (its result, then its
    action); the call and what it gave join the memory as a pair the model reads. Its result
    (None when the arguments are invalid: the author is told on the console, nothing runs)."""
    c = calls.t.c
    tool = c.config.tools.get(plan.tool or "")
    if tool is None:
        calls.t.emit(ev.CONSOLE, f"operator on_timeout ({plan.where}): the bot has no tool {plan.tool!r}")
        return None
    args = {k: calls.t.render_template(v, f"operator on_timeout args.{k}", plan.where, {"args": item.data.get("args") or {}},
                                       typed=True) if isinstance(v, str) else v for k, v in plan.args.items()}
    try:
        check_arguments(tool, args, calls.t.tools.argument_validator(tool))
    except ToolRefusal as refusal:
        calls.t.emit(ev.CONSOLE, f"operator on_timeout ({plan.where}): {tool.name}: {_problem(refusal)}")
        return None
    call_id = f"timeout-{item.id}"
    record: dict[str, Any] = {"tool": tool.name, "route": c.scope.route}
    calls.t.tool_calls.append(record)  # the turn's history shows the call, as a model's call
    with tracing.tool_span(tool.name, call_id, f"{TIMED_OUT} {item.id}"):
        outcome = await calls.run_checked_tool(tool, args, call_id)
    record["error" if outcome.failed else "reply"] = storable(outcome.reply)
    replace_result(c.memory_for(c.scope, c.scope.route), call_id, outcome.reply,
                   call=ToolCall(call_id, tool.name, json.dumps(args)))
    return record.get("result")


async def release(calls: ToolCalls, item: PendingItem, route: str | None) -> None:
    """The bot has the conversation back, with what was said in its memory; maybe on another route."""
    c = calls.t.c
    said = item.data.get("messages") or []
    taken, c.taken_over = c.taken_over, None
    resolve(calls, item, RELEASED)
    if taken is not None:  # the user read who joined (also no one signed in: auth off): they read who left
        _operator_left(calls, taken.get("by"))
    target = route or item.data.get("release_to")
    if target and target != c.scope.route:
        if target not in c.config.routes:
            raise TurnFailed(f"release to unknown route {target!r}; the bot defines: {', '.join(c.config.routes)}")
        c.change_route(target)
        calls.t.emit(ev.ROUTE_CHANGED, {"route": c.scope.route, "stack": c.stack})
    # What was said goes into the memory of the route the bot goes on with (after a release to
    # another route, that route's: the one whose model answers next must read it).
    scope = c.scope if target else c.find_scope(item.scope_id) if any(s.id == item.scope_id for s in c.scopes) \
        else c.scope
    memory = c.memory_for(scope, scope.route)
    talk: list[Message]
    if item.data.get("remember") == "summary":
        talk = [AssistantMessage(await _summary(calls, scope.route, memory, said))] if said else []
    else:
        talk = [_talk_message(line) for line in said]
    if not _all_kept(memory, talk):
        _remember_digest(calls, scope.route, memory, said)


def _talk_message(line: dict[str, Any]) -> Message:
    """A line said during a takeover as the bot's memory keeps it: the user's as theirs, the
    operator's as `[operator NAME] ...` of the assistant."""
    if line["from"] == "user":
        return UserMessage(line["text"], tuple(map(Attachment.from_dict, line.get("attachments") or ())))
    return AssistantMessage(f"[operator {line.get('name') or ''}] {line['text']}".replace("  ", " "))


def _all_kept(memory: ChatMemory, messages: list[Message]) -> bool:
    """Add `messages`; whether the window kept them all (it may evict older ones). When it did not,
    the memory is as it was before."""
    before = memory.messages()
    for message in messages:
        memory.add(message)
    kept = {id(m) for m in memory.messages()}
    if all(id(m) in kept for m in messages):
        return True
    memory.set(before)
    return False


def _remember_digest(calls: ToolCalls, route: str, memory: ChatMemory, said: list[dict[str, Any]]) -> None:
    """The talk did not fit the route's window (a long paste, a long talk): added line by line, the
    window would have evicted lines, the user's last one too, without a word, and the model would
    answer what it never read. The memory gets the longest digest that fits instead (it says what
    it left out and cut), and the author a Console note."""
    for last in (DIGEST_LINES, 5, 1):
        if _all_kept(memory, [AssistantMessage(_digest(said, last))]):
            kept = f"kept a digest of its last {min(last, len(said))} line(s), each cut to {DIGEST_CHARS} characters"
            break
    else:
        kept = "not even a digest of its last line fits, so the memory holds none of it"
    calls.t.emit(ev.CONSOLE, f"route {route}: what the operator and the user said ({len(said)} line(s)) does "
                             f"not fit the route's memory; {kept}. Give the memory a larger maximum, or the "
                             "handover `remember: summary` (docs/format.md)")


DIGEST_LINES = 20  # a summary digest keeps the last this many lines of the talk...
DIGEST_CHARS = 300  # ...each cut to this many characters
SUMMARY_INPUT_LINES = 200  # what a summarizing model reads of the talk (its last lines)
HANDOVER_PROMPT = (
    "While the assistant was away, a human operator talked with the user. You are given what they said. "
    "Write a summary for the assistant, who takes the conversation back now: what the user asked for and "
    "told, what the operator answered, promised or did, and what is still open — in at most 120 words, in "
    "the conversation's language. Answer with the summary only."
)


async def _summary(calls: ToolCalls, route: str, memory: ChatMemory, said: list[dict[str, Any]]) -> str:
    """`remember: summary`: written by the route's summary model when its memory is a `summary`
    one (docs/memory.md), else — or when that call fails — a bounded digest of every line."""
    if isinstance(memory, SummaryMemory):
        talk = "\n".join(_talk_line(line, 4 * DIGEST_CHARS) for line in said[-SUMMARY_INPUT_LINES:])
        try:
            text = await calls.t.summarize(route, HANDOVER_PROMPT, talk)
            return f"(Summary of what an operator and the user said while I was away: {text})"
        except Exception as exc:  # a summary never fails the release: the digest says it instead
            calls.t.emit(ev.CONSOLE, calls.kept(f"the handover summary failed ({type(exc).__name__}: {exc}); "
                                                "kept a digest"))
    return _digest(said)


def _digest(said: list[dict[str, Any]], last: int = DIGEST_LINES) -> str:
    """What was said while the bot was away, line by line: the last `last` lines, each cut
    to DIGEST_CHARS, with a count of what was left out."""
    users = sum(1 for line in said if line["from"] == "user")
    head = (f"(An operator talked with the user while I was away: {users} message(s) from the user, "
            f"{len(said) - users} from the operator")
    left_out = max(0, len(said) - last)
    head += f"; the first {left_out} left out" if left_out else ""
    lines = [_talk_line(line, DIGEST_CHARS) for line in said[left_out:]]
    return head + ":\n" + "\n".join(lines) + ")"


def _talk_line(line: dict[str, Any], limit: int) -> str:
    who = "user" if line["from"] == "user" else f"operator {line.get('name') or ''}".strip()
    text = re.sub(r"\s+", " ", str(line.get("text") or "")).strip()
    files = "".join(" " + Attachment.from_dict(a).description() for a in line.get("attachments") or ())
    return f"{who}: {text if len(text) <= limit else text[:limit - 1] + '…'}{files}"
