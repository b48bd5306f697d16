"""What the turn loop does next: one type per outcome, not a set of flags.

The model is asked, its answer and tool calls are handled, and the result is one
`NextStep` (openai-agents' `NextStep*` classes in `agents/_run_impl.py` are the model):

    NextStepRunAgain      ask the model again on the same route: tool results were added to
                          its memory, or a JSON answer that missed the route's `output`
                          schema is to be corrected
    NextStepFinalOutput   the turn is done: the route answered, a tool ended the loop
                          (`immediate`, a move without `execute`) or the conversation
    NextStepHandoff       the conversation is on another route that runs now with the same
                          user message (`execute`, a `call`, a called route that returned)

Each tool call of a response says which step it asks for (`ToolOutcome.next`); `combine`
makes the response's one step from them. A new outcome (a pause for approval, a handoff to
an operator) is one new class here, its place in `PRECEDENCE`, and the code in
`engine/turn.py` that returns it and acts on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class NextStepRunAgain:
    """Call the model again on the current route."""


@dataclass(frozen=True)
class NextStepFinalOutput:
    """The turn ends after this route."""


@dataclass(frozen=True)
class NextStepHandoff:
    """The (new) current route runs next in this turn, with the same user message."""


NextStep = NextStepRunAgain | NextStepFinalOutput | NextStepHandoff

# Which step wins when the calls of one response ask for different ones: running the route
# they moved to beats ending the turn, which beats asking the model again.
PRECEDENCE: tuple[type[NextStep], ...] = (NextStepHandoff, NextStepFinalOutput, NextStepRunAgain)


def combine(steps: Iterable[NextStep]) -> NextStep:
    """The one step a response's tool calls lead to (no calls: run again)."""
    asked = list(steps)
    for kind in PRECEDENCE:
        for step in asked:
            if isinstance(step, kind):
                return step
    return NextStepRunAgain()
