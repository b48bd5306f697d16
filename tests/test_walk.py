"""One message's walk through the code (docs/architecture.md) is the walk the code takes.

bench/walk.py traces one steady message to bots/travel in process (sys.setprofile over the
library session, the scripted model): the files of runner/chatrun/ it enters, in order. The
doc's numbered list must be that walk, in that order, and it must stay within 30 files
(issue 39: each route's pipeline is assembled when the bot loads).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from walk import travel_walk  # noqa: E402

SECTION = "## One message's walk through the code"


def documented_walk() -> list[str]:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `([^`]+)`", section, flags=re.MULTILINE)


def test_the_documented_walk_is_the_walk_of_one_message_to_travel() -> None:
    walk = travel_walk()
    assert len(walk.files) <= 30, walk.files
    assert documented_walk() == walk.files


def test_a_message_enters_no_hook_of_a_feature_travel_does_not_use() -> None:
    entered = set(travel_walk().files)
    unused = {"engine/waiting.py", "engine/clock.py", "engine/binding.py", "engine/versions.py",
              "toolkinds/mcp.py", "toolkinds/base.py", "engine/pausing.py", "engine/pending.py"}
    assert not entered & unused
