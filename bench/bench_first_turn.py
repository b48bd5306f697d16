"""The first turn of a new library session: `bot.session()`, one `chat`, `close()`.

CPU time of this process (the fake OpenAI model answers from its own process, no delay),
per conversation, against two floors measured in the same run, contenders interleaved:

- floor: a bare `openai`-SDK conversation as a library session runs it: a new event loop,
  a new AsyncOpenAI client (on the process's one SSL context: loading the CA bundle once
  per process is what any careful caller does), the system and user message and the tool
  specs passed as the SDK's `messages=`/`tools=`, the client closed, the loop closed;
- floor_eb: the same, passing messages and tools the way chatrun does (`extra_body`, so the
  SDK skips re-walking them against its TypedDicts): the real minimum.

Each round runs `--conversations` conversations per contender; the table shows the min and
the median over rounds of the per-round mean. Goal (issue 26): chatrun <= 1.2x floor_eb.

    python bench/bench_first_turn.py                     # 5 rounds of 20 conversations
    python bench/bench_first_turn.py --rounds 7 --conversations 40
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "runner"))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))

from bench_server import free_port, wait_port  # noqa: E402

SYSTEM = "You are a concise assistant."
BOT = f"""
name: bench
model: {{provider: openai, name: gpt-4o-mini, max_retries: 0, timeout: 120, stream: false}}
routes:
  main:
    default: true
    system: "{SYSTEM}"
    tools: [lookup]
tools:
  lookup:
    description: Look a word up.
    parameters: {{type: object, properties: {{word: {{type: string}}}}, required: [word]}}
    action: {{reply: "{{{{ args.word }}}}"}}
"""
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]


def floor_turn(extra_body: bool) -> Callable[[], None]:
    import openai

    from chatrun.models.openai_model import shared_ssl_context

    async def conversation() -> None:
        client = openai.AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key="bench", max_retries=0,
                                    http_client=openai.DefaultAsyncHttpxClient(verify=shared_ssl_context()))
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello there"}]
        if extra_body:
            answer = await client.chat.completions.create(model="gpt-4o-mini", messages=[],
                                                          extra_body={"messages": messages, "tools": TOOLS})
        else:
            answer = await client.chat.completions.create(model="gpt-4o-mini", messages=messages,  # type: ignore[arg-type]
                                                          tools=TOOLS)  # type: ignore[arg-type]
        assert answer.choices[0].message.content
        await client.close()

    def run() -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(conversation())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    return run


def chatrun_turn(bot_path: Path) -> Callable[[], None]:
    import chatrun

    bot = chatrun.load_bot(bot_path)

    def run() -> None:
        session = bot.session()
        events = session.chat("hello there")
        assert any(e.type == "Message" for e in events), events
        session.close()

    return run


def measure(run: Callable[[], None], conversations: int) -> float:
    """Mean CPU seconds of this process per conversation."""
    start = time.process_time()
    for _ in range(conversations):
        run()
    return (time.process_time() - start) / conversations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--conversations", type=int, default=20, help="conversations per contender per round")
    args = parser.parse_args()
    port = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "chatrun.testing.fake_openai", "--port", str(port),
                             "--text", "Sure, happy to help with that."],
                            env=dict(os.environ, PYTHONPATH=str(REPO / "runner")), stdout=subprocess.DEVNULL)
    try:
        wait_port(port, fake)
        os.environ["OPENAI_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
        os.environ["OPENAI_API_KEY"] = "bench"
        with tempfile.TemporaryDirectory() as tmp:
            bot_path = Path(tmp) / "bot.yaml"
            bot_path.write_text(BOT)
            contenders = {"floor": floor_turn(False), "floor_eb": floor_turn(True), "chatrun": chatrun_turn(bot_path)}
            for run in contenders.values():  # imports, the SSL context, the bot's compiled templates
                run()
            results: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(args.rounds):
                for name, run in contenders.items():
                    results[name].append(measure(run, args.conversations))
    finally:
        fake.terminate()
        fake.wait(10)
    floor_eb = statistics.median(results["floor_eb"])
    print(f"first turn of a new library session: CPU ms per conversation, {args.rounds} rounds x "
          f"{args.conversations} conversations, contenders interleaved; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'contender':<10}{'min':>9}{'median':>9}{'x floor_eb':>12}")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name:<10}{min(values) * 1000:>9.2f}{median * 1000:>9.2f}{median / floor_eb:>12.2f}")
    print("goal: chatrun <= 1.2x floor_eb")


if __name__ == "__main__":
    main()
