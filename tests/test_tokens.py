"""Token counting: exact tiktoken counts from the shared offline cache, and the fallback
estimate when tiktoken cannot load its files (checked in a fresh process, so this
process's encoding cache does not hide the failure)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tiktoken

from chatrun.errors import ChatrunError
from chatrun.memory.tokens import (
    MESSAGE_OVERHEAD,
    encoding_name,
    estimate_tokens,
    load_encoding,
    tiktoken_counter,
)
from chatrun.messages import (
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

RUNNER = Path(__file__).resolve().parents[1] / "runner"


@pytest.mark.needs_encodings
def test_hello_world_is_two_tokens_in_o200k_base():
    count = tiktoken_counter("o200k_base")
    assert count(UserMessage("hello world")) == 2 + MESSAGE_OVERHEAD
    assert MESSAGE_OVERHEAD == 4


@pytest.mark.needs_encodings
def test_cl100k_base_counts_with_its_own_tokens():
    count = tiktoken_counter(model_name="gpt-3.5-turbo")
    assert count.encoding == "cl100k_base"
    text = "Réservez un vol pour Dublin en juillet, s'il vous plaît."
    expected = len(tiktoken.get_encoding("cl100k_base").encode(text))
    assert count(SystemMessage(text)) == expected + MESSAGE_OVERHEAD
    # A different tokenizer really is used: o200k splits this French text differently.
    assert len(tiktoken.get_encoding("o200k_base").encode(text)) != expected


@pytest.mark.parametrize(
    ("encoding", "model", "expected"),
    [
        ("cl100k_base", "gpt-4o", "cl100k_base"),  # the policy's encoding wins
        (None, "gpt-4o-mini", "o200k_base"),
        (None, "gpt-4", "cl100k_base"),
        (None, "some-local-model", "o200k_base"),  # unknown model: documented fallback
        (None, None, "o200k_base"),
    ],
)
def test_encoding_resolution(encoding, model, expected):
    assert encoding_name(encoding, model) == expected


def test_unknown_encoding_is_a_clear_error():
    with pytest.raises(ChatrunError, match="unknown tiktoken encoding 'p50k_nope'"):
        tiktoken_counter("p50k_nope")


@pytest.mark.needs_encodings
def test_tool_calls_are_counted():
    count = tiktoken_counter("o200k_base")
    plain = AssistantMessage("Booking now.")
    with_calls = AssistantMessage("Booking now.", (ToolCall("c1", "book_flight", '{"destination": "Dublin"}'),))
    enc = tiktoken.get_encoding("o200k_base")
    assert count(with_calls) == len(enc.encode('Booking now.\nbook_flight({"destination": "Dublin"})')) + 4
    assert count(with_calls) > count(plain)
    assert count(AssistantMessage(None, (ToolCall("c2", "cancel"),))) == len(enc.encode("\ncancel({})")) + 4


@pytest.mark.needs_encodings
def test_special_token_text_is_counted_as_plain_text():
    count = tiktoken_counter("o200k_base")
    # tiktoken.encode raises on special tokens by default; a user may type one.
    assert count(ToolResultMessage("c", "t", "<|endoftext|>")) > MESSAGE_OVERHEAD


@pytest.mark.needs_encodings
def test_encodings_are_loaded_once_per_process():
    assert load_encoding("o200k_base") is load_encoding("o200k_base")


def test_estimate():
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2


OFFLINE_SCRIPT = textwrap.dedent(
    """
    import json, time, warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from chatrun.memory import TokenWindowMemory
        from chatrun.memory.tokens import tiktoken_counter
        from chatrun.messages import UserMessage
        t0 = time.monotonic()
        a = tiktoken_counter("o200k_base")
        b = tiktoken_counter(model_name="gpt-4")  # a second encoding: still one warning
        c = tiktoken_counter("o200k_base")
        memory = TokenWindowMemory("s#r", max_tokens=10)
        memory.add(UserMessage("hello world"))    # 11 chars: 3 + 4
        memory.add(UserMessage("hi"))             # 1 + 4: 12 > 10, the first goes
        out = {
            "counts": [a(UserMessage("hello world")), b(UserMessage("x" * 17)), c(UserMessage(""))],
            "window": [m.content for m in memory.messages()],
            "tokens": memory.token_count,
            "warnings": [str(w.message) for w in caught],
            "categories": [w.category.__name__ for w in caught],
            "seconds": time.monotonic() - t0,
        }
    print(json.dumps(out))
    """
)


def offline_env(tmp_path) -> dict[str, str]:
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "all_proxy")}
    env.update(
        TIKTOKEN_CACHE_DIR=str(empty),
        # Fail fast even on a machine with network: every download goes to a dead proxy.
        HTTPS_PROXY="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        https_proxy="http://127.0.0.1:9",
        http_proxy="http://127.0.0.1:9",
        PYTHONPATH=str(RUNNER),
    )
    return env


@pytest.mark.subprocess
def test_offline_falls_back_to_the_estimate_and_warns_once(tmp_path):
    env = offline_env(tmp_path)
    empty = Path(env["TIKTOKEN_CACHE_DIR"])
    proc = subprocess.run(
        [sys.executable, "-c", OFFLINE_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["counts"] == [math.ceil(11 / 4) + 4, math.ceil(17 / 4) + 4, 0 + 4]
    assert out["window"] == ["hi"]
    assert out["tokens"] == 5
    tokenizer_warnings = [w for w, c in zip(out["warnings"], out["categories"], strict=True)
                          if c == "TokenizerUnavailableWarning"]
    assert len(tokenizer_warnings) == 1, out["warnings"]
    assert "TIKTOKEN_CACHE_DIR" in tokenizer_warnings[0]
    assert "o200k_base" in tokenizer_warnings[0]
    assert not os.listdir(empty)  # nothing half-written into the cache


@pytest.mark.subprocess
def test_offline_with_warnings_as_errors_still_counts(tmp_path):
    script = (
        "from chatrun.memory import TokenWindowMemory\n"
        "from chatrun.messages import UserMessage\n"
        "m = TokenWindowMemory('s#r', max_tokens=10)\n"
        "m.add(UserMessage('hello world'))\n"
        "print(m.token_count)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], env=offline_env(tmp_path),
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "7"  # the estimate: ceil(11 / 4) + 4
    assert "TIKTOKEN_CACHE_DIR" in proc.stderr  # logged instead of warned
