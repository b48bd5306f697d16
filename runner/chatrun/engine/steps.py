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
    NextStepPause         the turn ends with something pending: a tool call waiting for
                          approval, a question waiting for its answer, a handover to an
                          operator (engine/pending.py); a decision turn continues it

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


@dataclass(frozen=True)
class NextStepPause:
    """The turn ends now, committed, with a pending item: the model is not asked again until a
    decision (approve, reject, answer, release, a timeout) resumes the loop in a later turn."""


NextStep = NextStepRunAgain | NextStepFinalOutput | NextStepHandoff | NextStepPause

# Which step wins when the calls of one response ask for different ones: a pause beats all (the
# calls after a pausing call do not run, so nothing moved after it); running the route they moved
# to beats ending the turn, which beats asking the model again.
PRECEDENCE: tuple[type[NextStep], ...] = (NextStepPause, NextStepHandoff, NextStepFinalOutput, NextStepRunAgain)


@dataclass
class ToolOutcome:
    """What one tool call gave: the result the model reads, and the step it asks the loop for."""

    reply: str
    next: NextStep = NextStepRunAgain()
    moved: bool = False  # it left the route or ended the conversation: the response's later calls do not run
    deferred: bool = False  # a `call`: the result comes when the called scope returns
    failed: bool = False  # the tool did not do its work (refused, failed, unknown): for metrics



def combine(steps: Iterable[NextStep]) -> NextStep:
    """The one step a response's tool calls lead to (no calls: run again)."""
    asked = list(steps)
    for kind in PRECEDENCE:
        for step in asked:
            if isinstance(step, kind):
                return step
    return NextStepRunAgain()
