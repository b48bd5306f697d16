"""A tool call that waits for a person: the pending item it makes, inside the call path.

`request_approval` (an `approval:` gate before anything of the tool runs), `ask_question` (an
`ask:` after the tool's result), `hand_over` (an `operator:` action) make a `PendingItem`
(engine/pending.py), announce it, and give the call an outcome asking the loop for
`NextStepPause` (engine/steps.py): the turn ends committed. engine/waiting.py resolves the item
in a later turn.
"""

from __future__ import annotations

import copy
import json
import secrets
from typing import Any

from chatrun import events as ev
from chatrun.definition.config import OperatorConfig, ToolConfig
from chatrun.definition.page_texts import confirm_choices
from chatrun.definition.templates import holds
from chatrun.engine.context import TurnContext
from chatrun.engine.pending import (
    APPROVAL,
    BACKEND_ROLE,
    OPERATOR_ROLE,
    QUESTION,
    TAKEOVER,
    USER_ROLE,
    PendingItem,
    due_after,
    format_time,
)
from chatrun.engine.steps import NextStepPause, ToolOutcome
from chatrun.errors import ChatrunError, TurnFailed


def needs_approval(t: TurnContext, tool: ToolConfig, args: dict[str, Any]) -> bool:
    approval = tool.approval
    if approval is None:
        return False
    if approval.condition is None:
        return True
    context = t.context(args=args)
    try:
        return holds(approval.condition, context)
    except ChatrunError:
        raise
    except Exception as exc:
        raise TurnFailed(f"tool {tool.name} ({approval.where}): condition `{approval.condition}` failed: {exc}") from exc


def request_approval(t: TurnContext, tool: ToolConfig, args: dict[str, Any], call_id: str) -> ToolOutcome:
    """The call waits: an approval item, a Pending event, a placeholder result for the model.
    A user's confirmation (`confirm:`, or `by: [user]`) also gets Yes/No choices."""
    approval = tool.approval
    assert approval is not None
    if approval.ask:
        ask = t.render_template(approval.ask, "approval ask", approval.where, {"args": args})
    else:
        ask = f"Approve {tool.name} with {json.dumps(args, ensure_ascii=False, sort_keys=True)}?"
    editable = [k for k in (tool.parameters.get("properties") or {}) if k not in tool.bind] \
        if approval.edit is True else list(approval.edit or [])
    # The user's own confirmation: they are asked yes or no, in their locale, with buttons.
    choices = confirm_choices(t.config.catalogs, t.c.locale) if approval.confirms else None
    tell = t.render_template(approval.tell, "approval tell", approval.where, {"args": args}) if approval.tell else ""
    item = new_item(t, APPROVAL, approval.timeout, tool=tool.name, call_id=call_id, args=args, ask=ask, tell=tell,
                    by=list(approval.by), edit=editable, choices=choices,
                    data={"self": approval.may_self_decide, "on_timeout": approval.on_timeout})
    announce(t, item)
    if choices:
        t.emit(ev.CHOICES, {"choices": choices}, runtime=True)  # runtime: a Quarkus chat reads them in the Message
        return ToolOutcome(f"Waiting for the user's confirmation: {ask}", NextStepPause(), moved=True)
    return ToolOutcome(f"Waiting for approval: {ask}", NextStepPause(), moved=True)


def ask_question(t: TurnContext, tool: ToolConfig, args: dict[str, Any], result: Any, call_id: str) -> ToolOutcome:
    """After the tool's own result: the question waits for its answer (the call's real result)."""
    ask = tool.action.ask
    assert ask is not None
    extra = {"args": args, "result": result}
    text = t.render_template(ask.text, "ask text", ask.where, extra) if ask.text else t.own_text("waiting_answer")
    tell = t.render_template(ask.tell, "ask tell", ask.where, extra) if ask.tell else ""
    choices = t.choice_list(ask.choices, f"tool {tool.name} ask choices", ask.where, extra)
    by = {"user": [USER_ROLE], "operator": [OPERATOR_ROLE], "backend": [BACKEND_ROLE]}[ask.source]
    item = new_item(t, QUESTION, ask.timeout, tool=tool.name, call_id=call_id, args=args, ask=text, tell=tell, by=by,
                    schema=copy.deepcopy(ask.schema), choices=choices or None,
                    token=secrets.token_urlsafe(24) if ask.source == "backend" else None,
                    data={"result": result})
    announce(t, item)
    return ToolOutcome(f"Waiting for an answer: {text}", NextStepPause(), moved=True)


def hand_over(t: TurnContext, tool: ToolConfig, operator: OperatorConfig, extra: dict[str, Any]) -> None:
    """An `operator:` action: the conversation waits for an operator to take it."""
    text = t.render_template(operator.text, "operator text", operator.where, extra) if operator.text else \
        t.own_text("handover")
    data = takeover_data(operator.release_to, operator.remember)
    if operator.on_timeout is not None:  # what its templates read when nobody takes it (engine/waiting.py)
        data["args"] = copy.deepcopy(extra.get("args"))
    item = new_item(t, TAKEOVER, operator.timeout, tool=tool.name, ask=text, tell=text, by=[operator.role], data=data)
    t.emit(ev.MESSAGE, text)
    announce(t, item)


def takeover_data(release_to: str | None, remember: str) -> dict[str, Any]:
    return {"messages": [], "release_to": release_to, "remember": remember}


def new_item(t: TurnContext, kind: str, timeout: str | None, **fields: Any) -> PendingItem:
    c = t.c
    now = c.now()
    item = PendingItem(id=f"p{c.next_pending}", kind=kind, created=format_time(now), due=due_after(now, timeout),
                       route=c.scope.route, scope_id=c.scope.id, requested_by=copy.deepcopy(c.principal), **fields)
    c.next_pending += 1
    c.pending = (*c.pending, item)  # replaced, never changed in place (see Conversation)
    return item


def announce(t: TurnContext, item: PendingItem) -> None:
    """The Pending events: the user's (`for_user`: what they are told, in their locale), the
    operators' for items others decide (the `ask`), a backend's copy with the token for a question
    it answers."""
    public = item.public()
    if item.kind != TAKEOVER:  # the user reads what they are told, not the deciders' question
        t.emit(ev.PENDING, item.for_user(t.texts()), audience=ev.USER)
    if item.kind == TAKEOVER or any(role != USER_ROLE for role in item.by):
        t.emit(ev.PENDING, public, audience=ev.OPERATORS)
    if item.token:
        t.emit(ev.PENDING, {**public, "token": item.token}, audience=ev.BACKEND)
