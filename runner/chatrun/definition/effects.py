"""What a tool's call does besides answering: its `effect:` (docs/tools.md, "Side effects").

    read        it changes nothing: every call runs
    idempotent  it changes something, but doing it again changes nothing more: every call runs
    once        doing it again would do it twice (pay, send, count): an identical call that
                already ran in the conversation is answered with the earlier result, not run

A tool that declares none gets the strongest of what its kind does (an `http:` call with a
method other than GET is `once`; a handler or MCP tool is `read`: chatrun cannot
see what their code does, so one with side effects says `effect: once`) and what its action does
(`action_effect`). The engine's rules for `once` are in engine/call.py.
"""

from __future__ import annotations

from jinja2 import TemplateSyntaxError

from chatrun.definition.checks import paths_read
from chatrun.definition.config import ActionConfig, ToolConfig
from chatrun.definition.kinds import kinds

READ, IDEMPOTENT, ONCE = "read", "idempotent", "once"
EFFECTS = (READ, IDEMPOTENT, ONCE)  # weakest first


def default_effect(tool: ToolConfig) -> str:
    """The effect of a tool that declares none: its kind's, or its action's if stronger. An
    action-only tool that takes no arguments and `requires` nothing is never `once` by default:
    every call of it is the same call, so the identical-call rule could not tell a second request
    (a counter's "one more") from a repeat; it runs each time (`effect: once` says otherwise)."""
    found = [action_effect(tool.action)]
    if found[0] == ONCE and not _distinguishable(tool):
        found = [IDEMPOTENT]
    by_key = {kind.key: kind for kind in kinds()} if tool.kinds else {}  # an action-only tool has none
    for key, spec in tool.kinds.items():
        kind = by_key.get(key)
        if kind is not None:
            found.append(kind.effect(spec))
    return max(found, key=EFFECTS.index)


def _distinguishable(tool: ToolConfig) -> bool:
    """Whether two calls of the tool can differ: it takes arguments, has bound ones, a kind (whose
    parameters may come from its server) or `requires` (whose values are part of a call's identity)."""
    return bool((tool.parameters.get("properties") or {}) or tool.bind or tool.kind or tool.requires)


def action_effect(action: ActionConfig) -> str:
    """`once` for an action that writes a value computed from the value it replaces (a running
    total, a list appended to; in any of its cases): doing it again would add again;
    `idempotent` for one that writes only other values (the call's arguments, its result, a
    question's answer at `ask.into`, other state, fixed values): doing it again writes the same;
    `read` for one that writes nothing."""
    writes = False
    for _, variant in action.variants():
        for path, template in variant.set.items():
            if _reads_itself(path, template):
                return ONCE
            writes = True
    return IDEMPOTENT if writes or (action.ask is not None and action.ask.into) else READ


def _reads_itself(path: str, template: object) -> bool:
    """Whether a `set` template reads the path it writes (or a part of it, or what holds it)."""
    if not isinstance(template, str) or "{" not in template:
        return False  # a fixed value
    try:
        read = paths_read(template)
    except TemplateSyntaxError:
        return True  # the checks report it; until then, the careful reading
    if not read:
        return False
    written = tuple(path.split("."))
    size = len(written)
    for r in read:
        if r[:size] == written or written[:len(r)] == r:
            return True
    return False
