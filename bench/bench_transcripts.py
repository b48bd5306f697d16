"""How fast `chatrun test` replays golden transcripts.

Generates a small bot (a menu that pushes a two-field wizard, setters, requires, pop)
and N transcripts of 10 turns each in a temporary directory, then runs
`chatrun test DIR` serially and with `-n 2` (each a fresh process, startup included)
and prints transcripts per second and turns per second.

    python bench/bench_transcripts.py            # 1,000 transcripts
    python bench/bench_transcripts.py --count 200
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BOT = """\
name: bench
description: A menu and a wizard.
model: {provider: openai, name: gpt-4o-mini}
memory: {type: message_window, max_messages: 30}
routes:
  menu:
    default: true
    description: Menu
    system: "You are a shop. Orders so far: {{ state.orders }}."
    tools: [order]
  wizard:
    description: Order wizard
    system: "Order so far: {{ scope.order | tojson }}"
    scope: {local: {order: {item: null, size: null}}}
    tools: [set_item, set_size, confirm]
state: {orders: 0}
tools:
  order:
    description: Start an order
    action: {push: wizard, execute: true, immediate: true}
  set_item:
    description: Set the item
    parameters: {type: object, properties: {item: {type: string}}, required: [item]}
    action: {set: {scope.order.item: "{{ args.item }}"}, emit: {Thinking: "Item {{ args.item }}"}}
  set_size:
    description: Set the size
    parameters: {type: object, properties: {size: {type: string}}, required: [size]}
    action: {set: {scope.order.size: "{{ args.size }}"}}
  confirm:
    description: Confirm the order
    requires: [scope.order.item, scope.order.size]
    action:
      set: {state.orders: "{{ state.orders + 1 }}"}
      pop: true
      message: "Ordered a {{ scope.order.size }} {{ scope.order.item }}."
      result: "Order placed."
"""

# Five turns (one order), repeated twice: 10 turns per transcript.
ORDER = """\
  - user: I want to order a {item}
    model:
      - tool_calls: [{{name: order, arguments: {{}}}}]
      - tool_calls: [{{name: set_item, arguments: {{item: {item}}}}}]
      - text: Which size?
    expect:
      route: wizard
      stack: [menu, wizard]
      events:
        - RouteChanged: {{route: wizard, stack: [menu, wizard]}}
        - Thinking: Item {item}
        - Message: Which size?
  - user: Can I confirm now?
    model:
      - tool_calls: [{{name: confirm, arguments: {{}}}}]
      - text: I still need the size.
    expect:
      route: wizard
      events: [{{Message: {{contains: size}}}}]
  - user: Large
    model:
      - tool_calls: [{{name: set_size, arguments: {{size: large}}}}]
      - text: Large {item}. Confirm?
    expect:
      state: {{scope.order.size: large, scope.order.item: {item}}}
  - user: Yes, please
    model:
      - tool_calls: [{{name: confirm, arguments: {{}}}}]
    expect:
      route: menu
      stack: [menu]
      state: {{state.orders: {n}, scope.order: null}}
  - user: Thanks
    model:
      - text: You are welcome.
    expect:
      events: [{{Message: You are welcome.}}]
      sent:
        - messages_count: 5
"""


def generate(root: Path, count: int) -> Path:
    (root / "bot").mkdir(parents=True)
    (root / "bot" / "bot.yaml").write_text(BOT)
    folder = root / "bot" / "transcripts"
    folder.mkdir()
    items = ["coffee", "tea", "cake", "bagel", "juice"]
    for i in range(count):
        item = items[i % len(items)]
        turns = ORDER.format(item=item, n=1) + ORDER.format(item=item, n=2).replace(
            "messages_count: 5", "messages_count: 11")
        (folder / f"t{i:05d}.yaml").write_text(f"bot: ..\nturns:\n{turns}")
    return folder


def run(folder: Path, extra: list[str]) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "runner")}
    env.setdefault("TIKTOKEN_CACHE_DIR", str(REPO.parent / "shared" / "tiktoken"))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "chatrun", "test", str(folder), *extra],
                          capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"chatrun test failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return elapsed, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="transcripts to generate (10 turns each)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = generate(Path(tmp), args.count)
        print(f"{args.count} transcripts x 10 turns ({args.count * 10} turns, {args.count * 14} model calls), "
              f"os.cpu_count() = {os.cpu_count()}")
        for label, extra in (("serial", []), ("-n 2", ["-n", "2"])):
            elapsed, last = run(folder, extra)
            print(f"  {label:>6}: {elapsed:6.2f} s  {args.count / elapsed:8.1f} transcripts/s  "
                  f"{args.count * 10 / elapsed:8.0f} turns/s   ({last})")


if __name__ == "__main__":
    main()
