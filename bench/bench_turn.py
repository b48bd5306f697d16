"""Runner overhead per turn, with the scripted model (which answers at once).

Measures what chatrun itself costs per turn (templates, memory, scopes, snapshots
for atomic turns, events, the in-process store) at 10, 100 and 1,000 messages in
the route's memory. Target: under 1 ms per turn.

    python bench/bench_turn.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))

import chatrun  # noqa: E402
from chatrun.memory.tokens import tiktoken_counter  # noqa: E402
from chatrun.messages import AssistantMessage, UserMessage  # noqa: E402
from chatrun.models.scripted import ScriptedModel  # noqa: E402

BOT = """
name: bench
model: {{provider: scripted, name: gpt-4o-mini}}
memory: {memory}
state: {{user: Ana}}
routes:
  main:
    default: true
    system: "You help {{{{ state.user }}}}. Turn state: {{{{ scope.count }}}}"
    scope: {{local: {{count: 0}}}}
    tools: [bump]
tools:
  bump:
    description: count
    parameters: {{type: object, properties: {{n: {{type: integer}}}}, required: [n]}}
    action: {{set: {{scope.count: "{{{{ args.n }}}}"}}}}
"""

FILLER_Q = "filler question with a few words in it"
FILLER_A = "filler answer with a few words in it"


def policy(kind: str, size: int) -> str:
    if kind == "message_window":
        return f"{{type: message_window, max_messages: {size}}}"
    count = tiktoken_counter(model_name="gpt-4o-mini")
    per_pair = count(UserMessage(FILLER_Q)) + count(AssistantMessage(FILLER_A))
    return f"{{type: token_window, max_tokens: {size * per_pair // 2}}}"


def measure(kind: str, size: int, turns: int = 300) -> tuple[float, float, int]:
    """Median seconds of a plain turn (one model call) and of a tool turn (two calls and a setter),
    with the route's memory held at about `size` messages by its own window."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bot.yaml"
        path.write_text(BOT.format(memory=policy(kind, size)))
        bot = chatrun.load_bot(path)
        model = ScriptedModel()
        session = bot.session(model=model)
        for _ in range(size):  # fill the window (each turn adds two messages; the window evicts)
            model.add({"text": FILLER_A})
            session.chat(FILLER_Q)
        plain, tool = [], []
        for i in range(turns):
            model.add({"text": FILLER_A})
            start = time.process_time()
            session.chat(FILLER_Q)
            plain.append(time.process_time() - start)
            model.add({"tool_calls": [{"name": "bump", "arguments": {"n": i}}]}, {"text": "done"})
            start = time.process_time()
            session.chat("please bump")
            tool.append(time.process_time() - start)
        held = len(session.memory())  # the tool turns' messages are shorter, so a token window holds more
        return statistics.median(plain), statistics.median(tool), held


def main() -> None:
    print("chatrun runner overhead per turn (scripted model answers at once; in-process store)")
    print(f"{'memory':>15} {'messages':>9} {'held':>6} {'plain turn':>11} {'tool turn':>11}   target: plain turn < 1 ms")
    for kind in ("message_window", "token_window"):
        for size in (10, 100, 1000):
            plain, tool, held = measure(kind, size)
            verdict = "ok" if plain < 0.001 else "OVER"
            print(f"{kind:>15} {size:>9} {held:>6} {plain * 1000:>8.3f} ms {tool * 1000:>8.3f} ms   {verdict}")


if __name__ == "__main__":
    main()
