"""One message's walk through the code (docs/architecture.md) is the walk the code takes.

bench/walk.py traces one steady message to bots/travel in process (sys.setprofile over the
library session, the scripted model): the files of runner/chatrun/ it enters, in order. The
doc's numbered list must be that walk, in that order, and it must stay within 30 files
(issue 39: each route's pipeline is assembled when the bot loads). Through `chatrun serve`'s
HTTP API (`bench/walk.py --server`, a slow test: the fake model runs in a subprocess) the
message must pass no hook of a feature travel does not use, in the number of files the doc says.

Whether a tracer provider is set is OpenTelemetry's global, set once per process by the first
test that wants spans (conftest `spans`): each walk here sets it itself (`tracer_provider`), so
the outcome is the same alone, after such a test, or in any order. The documented walk is the
one with none set ("no spans while no tracer provider is set"); the hooks travel does not use
stay unentered with one set too (a traced turn once entered engine/guardrails.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from chatrun.engine import tracing as chatrun_tracing  # noqa: E402
from walk import server_walk, travel_walk  # noqa: E402

SECTION = "## One message's walk through the code"
UNSET, SET = "no tracer provider", "a tracer provider"


@pytest.fixture
def tracer_provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """OpenTelemetry's global tracer provider as the test's parameter says (UNSET by default),
    whatever an earlier test in this process set; put back after the test."""
    state = getattr(request, "param", UNSET)
    try:
        from opentelemetry import trace
    except ImportError:  # not installed: nothing records spans, the UNSET walk
        if state == SET:
            pytest.skip("opentelemetry is not installed (pip install 'chatrun[otel]')")
        return state
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)  # else it would make one
    provider = None
    if state == SET:
        sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK is not installed")
        provider = sdk_trace.TracerProvider()
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)  # the global set_tracer_provider sets once
    assert chatrun_tracing.recording() is (state == SET)
    return state


def documented_walk() -> list[str]:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `([^`]+)`", section, flags=re.MULTILINE)


def test_the_documented_walk_is_the_walk_of_one_message_to_travel(tracer_provider: str) -> None:
    walk = travel_walk()
    assert len(walk.files) <= 30, walk.files
    assert documented_walk() == walk.files


@pytest.mark.parametrize("tracer_provider", [UNSET, SET], indirect=True)
def test_a_message_enters_no_hook_of_a_feature_travel_does_not_use(tracer_provider: str) -> None:
    entered = set(travel_walk().files)
    unused = {"engine/waiting.py", "engine/clock.py", "engine/binding.py", "engine/versions.py",
              "toolkinds/mcp.py", "toolkinds/base.py", "engine/pausing.py", "engine/pending.py",
              "engine/call.py", "engine/guardrails.py", "engine/tools.py", "definition/config.py"}
    assert not entered & unused


def documented_server_files() -> int:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    found = re.search(r"HTTP API \(`python bench/walk.py --server`.*?: (\d+) files", section, flags=re.DOTALL)
    assert found, "the doc's walk section says how many files the HTTP API's walk enters"
    return int(found.group(1))


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_message_through_the_http_api_passes_no_hook_travel_does_not_use(tracer_provider: str) -> None:
    # No caller to identify (auth off, no token), nobody playing the model, no tool call, no
    # per-turn lookup of what the route's YAML fixes: those files are not entered at all.
    walk = server_walk()
    unused = {"server/auth.py", "server/widget_identity.py", "server/play_model.py", "engine/call.py",
              "engine/tools.py", "definition/config.py", "engine/waiting.py", "engine/guardrails.py"}
    assert not set(walk.files) & unused
    assert len(walk.files) == documented_server_files(), walk.files
