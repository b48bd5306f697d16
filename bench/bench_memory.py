"""Cost of adding a message to a token window as the conversation grows to 10,000 messages.

chatrun: TokenWindowMemory (tiktoken o200k_base counter, max_tokens=3000). Each message
is counted once when added; eviction pops from the front. We time every add and report the
mean over the last (up to) 100 adds before each checkpoint, alone and followed by
`messages()` (what the engine does before each model call).

langchain-core: the app keeps the whole history in a list and, after each add, runs
`trim_messages(history, max_tokens=3000, strategy="last", include_system=True,
token_counter=<tiktoken o200k_base, same formula>)` to get the window to send. Re-running
that for each of 10,000 adds would take many minutes, so it is SAMPLED: at each checkpoint
we time trim_messages on the history of that length (the cost of the add that brings the
conversation to that length).

Both sides count a message as tokens(text) + 4, text including tool calls as name(arguments).

Run: python bench/bench_memory.py   (TIKTOKEN_CACHE_DIR defaults to ../shared/tiktoken)
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))
sys.path.insert(0, str(REPO / "runner"))

import tiktoken  # noqa: E402
from langchain_core import messages as lc  # noqa: E402

from chatrun.memory import TokenWindowMemory  # noqa: E402
from chatrun.memory.tokens import MESSAGE_OVERHEAD, tiktoken_counter  # noqa: E402
from chatrun.messages import (  # noqa: E402
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

N = 10_000
CHECKPOINTS = [10, 100, 1_000, 10_000]
MAX_TOKENS = 3000
WINDOW = 100  # adds averaged per checkpoint

WORDS = (
    "flight hotel Dublin July booking seat window aisle price euro passenger luggage "
    "return departure arrival gate terminal upgrade cancel refund date morning evening "
    "please thanks could you would like to the a for in on with and or"
).split()


def conversation(n: int, seed: int = 7) -> list[Message]:
    """A system prompt, then user/assistant exchanges, one in four with a tool call and its result."""
    rnd = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(lo, hi)))

    out: list[Message] = [SystemMessage("You are a travel agent. " + text(20, 40))]
    i = 0
    while len(out) < n:
        out.append(UserMessage(text(5, 40)))
        if i % 4 == 3:
            cid = f"call_{i}"
            out.append(AssistantMessage(None, (ToolCall(cid, "search_flights", f'{{"to": "{rnd.choice(WORDS)}"}}'),)))
            out.append(ToolResultMessage(cid, "search_flights", text(10, 60)))
        out.append(AssistantMessage(text(10, 80)))
        i += 1
    return out[:n]


def to_langchain(m: Message) -> lc.BaseMessage:
    if isinstance(m, SystemMessage):
        return lc.SystemMessage(m.content)
    if isinstance(m, UserMessage):
        return lc.HumanMessage(m.content)
    if isinstance(m, ToolResultMessage):
        return lc.ToolMessage(m.content, tool_call_id=m.tool_call_id, name=m.name)
    assert isinstance(m, AssistantMessage)
    calls = [{"name": c.name, "args": {"raw": c.arguments}, "id": c.id, "type": "tool_call"} for c in m.tool_calls]
    msg = lc.AIMessage(m.content or "", tool_calls=calls)
    msg.additional_kwargs["raw_calls"] = [f"{c.name}({c.arguments})" for c in m.tool_calls]
    return msg


def make_lc_counter():
    enc = tiktoken.get_encoding("o200k_base")

    def count(messages: list[lc.BaseMessage]) -> int:
        total = 0
        for m in messages:
            text = m.content if isinstance(m.content, str) else str(m.content)
            raw = m.additional_kwargs.get("raw_calls")
            if raw:
                text = "\n".join([text, *raw])
            total += len(enc.encode_ordinary(text)) + MESSAGE_OVERHEAD
        return total

    return count


def bench_chatrun(msgs: list[Message]) -> tuple[dict[int, tuple[float, float]], TokenWindowMemory]:
    counter = tiktoken_counter("o200k_base")
    counter(UserMessage("warm up"))
    memory = TokenWindowMemory("bench#main", MAX_TOKENS, counter=counter)
    add_ns: list[int] = []
    read_ns: list[int] = []
    clock = time.perf_counter_ns
    for m in msgs:
        t0 = clock()
        memory.add(m)
        t1 = clock()
        memory.messages()
        t2 = clock()
        add_ns.append(t1 - t0)
        read_ns.append(t2 - t0)
    out = {}
    for c in CHECKPOINTS:
        lo = max(0, c - WINDOW)
        out[c] = (statistics.fmean(add_ns[lo:c]) / 1e3, statistics.fmean(read_ns[lo:c]) / 1e3)
    return out, memory


def bench_trim(msgs: list[Message]) -> dict[int, tuple[float, int]]:
    history = [to_langchain(m) for m in msgs]
    count = make_lc_counter()
    out = {}
    for c in CHECKPOINTS:
        reps = 20 if c <= 100 else 3
        times = []
        kept = 0
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            window = lc.trim_messages(
                history[:c], max_tokens=MAX_TOKENS, strategy="last", include_system=True, token_counter=count
            )
            times.append(time.perf_counter_ns() - t0)
            kept = len(window)
        out[c] = (min(times) / 1e3, kept)
    return out


def main() -> None:
    msgs = conversation(N)
    print(f"token window of {MAX_TOKENS} tokens, tiktoken o200k_base, {N:,} messages "
          f"(user/assistant, 1 exchange in 4 with a tool call)")
    print(f"TIKTOKEN_CACHE_DIR={os.environ['TIKTOKEN_CACHE_DIR']}")
    t0 = time.perf_counter()
    ours, memory = bench_chatrun(msgs)
    t1 = time.perf_counter()
    print(f"chatrun: {N:,} adds in {t1 - t0:.2f} s; window now {len(memory.messages())} messages, "
          f"{memory.token_count} tokens")
    theirs = bench_trim(msgs)
    print(f"trim_messages sampled at the checkpoints in {time.perf_counter() - t1:.1f} s "
          "(min of 20 runs up to 100 messages, of 3 runs above)")
    print()
    print(f"{'messages':>9} | {'chatrun add':>12} | {'add+messages()':>14} | {'trim_messages':>14} | {'kept (ours/trim)':>16} | {'speed-up':>9}")
    print("-" * 92)
    for c in CHECKPOINTS:
        add_us, read_us = ours[c]
        trim_us, kept = theirs[c]
        probe = TokenWindowMemory("probe", MAX_TOKENS, counter=tiktoken_counter("o200k_base"))
        probe.set(msgs[:c])
        print(f"{c:>9,} | {add_us:>9.1f} µs | {read_us:>11.1f} µs | {trim_us:>11.1f} µs | "
              f"{len(probe.messages()):>7} / {kept:<6} | {trim_us / read_us:>8.0f}×")
    add10, read10 = ours[N]
    trim10 = theirs[N][0]
    print()
    print(f"at {N:,} messages: chatrun add {add10:.1f} µs (add+messages() {read10:.1f} µs), "
          f"trim_messages {trim10 / 1e3:.1f} ms per add")
    print(f"speed-up at {N:,}: {trim10 / add10:,.0f}× (add alone), {trim10 / read10:,.0f}× (add+messages()); target >= 10×")
    flat = ours[N][0] / ours[100][0]
    print(f"flatness: per-add cost at {N:,} / at 100 = {flat:.2f} (target: about 1)")


if __name__ == "__main__":
    main()
