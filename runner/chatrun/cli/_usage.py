"""Usage as the commands print it (REPL `/usage`, `chatrun test -v`): tokens, cost when the
bot has `prices:`, and `(estimated)` when a count was made by chatrun rather than reported.

    route main  model gpt-4o-mini  input 1,000 (400 cached)  output 50 (8 reasoning)  cost 0.00015
"""

from __future__ import annotations

from typing import Any

ESTIMATED = "(estimated)"


def tokens_text(usage: dict[str, Any]) -> str:
    """"input 1,000 (400 cached)  output 50 (8 reasoning)  cost 0.00015 (estimated)"."""
    text = f"input {usage.get('input_tokens', 0):,}"
    if usage.get("cached_input_tokens"):
        text += f" ({usage['cached_input_tokens']:,} cached)"
    text += f"  output {usage.get('output_tokens', 0):,}"
    if usage.get("reasoning_tokens"):
        text += f" ({usage['reasoning_tokens']:,} reasoning)"
    if usage.get("cost") is not None:
        text += f"  cost {cost_text(usage['cost'])}"
    if usage.get("estimated"):
        text += f"  {ESTIMATED}"
    return text


def cost_text(cost: float) -> str:
    """Four significant digits for fractions of a cent, four decimals above 1, no float noise
    and no exponent: 0.0000846, 0.000342, 1.25, 0 (the inspector writes it the same way)."""
    if not cost:
        return "0"
    text = f"{cost:.4f}" if cost >= 1 else f"{float(f'{cost:.4g}'):.12f}"
    return text.rstrip("0").rstrip(".")


def calls_text(n: int) -> str:
    return f"{n} call{'' if n == 1 else 's'}"


def turn_usage_lines(entry: dict[str, Any] | None) -> list[str]:
    """A turn's usage from its history entry: one line per model call, then the turn's total."""
    if entry is None:
        return ["no turn yet"]
    usage = entry.get("usage")
    outcome = turn_outcome(entry)
    if not usage:
        return [f"last turn {entry.get('turn')}: no model call{f', {outcome}' if outcome else ''}"]
    failed = f", {outcome} and rolled back; its calls still count" if outcome else ""
    lines = [f"last turn {entry.get('turn')} ({calls_text(usage.get('calls', 0))}{failed}):"]
    for call in usage.get("by_call", []):
        lines.append(f"  route {call.get('route')}  model {call.get('model')}  {tokens_text(call)}")
    lines.append(f"  total  {tokens_text(usage)}")
    return lines


def turn_outcome(entry: dict[str, Any]) -> str:
    """"" for a committed turn; "cancelled" for one the author stopped (Ctrl-C: the engine
    records "cancelled" or "interrupted: KeyboardInterrupt"); else "failed"."""
    if entry.get("ok") is not False:
        return ""
    error = str(entry.get("error") or "")
    return "cancelled" if error == "cancelled" or error.startswith("interrupted:") else "failed"


def session_usage_line(usage: dict[str, Any]) -> str:
    return f"session ({calls_text(usage.get('calls', 0))}): {tokens_text(usage)}"
