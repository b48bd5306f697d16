"""The inspector's Usage panel and a `summary` memory's summary, in real Chromium through
playwright, against the real server answered by the fake OpenAI server (which reports usage,
or none when told: then chatrun counts and marks it estimated).

Set CHATRUN_SCREENSHOTS=DIR to keep a screenshot."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send
from chatrun.server import create_app
from server_support import ThreadServer

pytestmark = BROWSER_MARKS

BOT = """
name: long
model: {provider: openai, name: gpt-4o-mini, max_retries: 0}
prices:
  gpt-4o-mini: {input: 0.15, output: 0.60, cached_input: 0.075}
  cheap-model: {input: 0.05, output: 0.20}
memory: {type: summary, max_tokens: 60, keep_messages: 2, summary_model: {name: cheap-model}, clear_tool_results: 3}
routes:
  main: {default: true, system: You chat.}
"""
LONG = " ".join(["word"] * 30)


def usage(prompt: int, completion: int, cached: int = 0) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


@pytest.fixture
def page(fake, tmp_path):
    (tmp_path / "bot.yaml").write_text(textwrap.dedent(BOT))
    app = create_app([chatrun.load_bot(tmp_path / "bot.yaml")], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, height=1000) as tab:
        yield tab


def rows(page, cls: str) -> list[list[str]]:
    return [[cell.strip() for cell in row.locator("td").all_inner_texts()]
            for row in page.locator(f"#usage tr.{cls}").all()]


def test_the_inspector_shows_usage_per_turn_per_call_and_in_all_and_the_summary_as_such(page, fake):
    page.wait_for_function("Number(document.body.dataset.refreshes || 0) > 0", timeout=10_000)
    assert "0 model calls" in page.locator("#usage-meta").inner_text()
    fake.queue({"text": "a " + LONG, "usage": usage(100, 31)})
    send(page, "one")
    # 100 input at 0.15 + 31 output at 0.60, per million
    assert rows(page, "turn-usage") == [["turn 1", "100", "31", "0.0000336", ""]]
    assert rows(page, "call-usage") == [["main · gpt-4o-mini", "100", "31", "0.0000336", ""]]

    # Turn 2 passes the memory's 60 tokens: after the reply, cheap-model folds the oldest messages.
    fake.queue({"text": "b " + LONG, "usage": usage(200, 31, cached=100)},
               {"text": "S: the user said one.", "usage": usage(150, 12)})
    send(page, "two")
    assert rows(page, "call-usage") == [
        ["main · gpt-4o-mini", "200 (100 cached)", "31", "0.0000411", ""],  # 15 + 7.5 + 18.6 per million
        ["main (summary) · cheap-model", "150", "12", "0.0000099", ""],  # 7.5 + 2.4 per million
    ]
    assert rows(page, "turn-usage")[1] == ["turn 2", "350 (100 cached)", "43", "0.000051", ""]
    assert rows(page, "session-total") == [["total", "450 (100 cached)", "74", "0.0000846", ""]]
    assert "3 model calls · 524 tokens · cost 0.0000846" in page.locator("#usage-meta").inner_text()
    # The memory shows the summary as a summary, right after the system message, not as a user message.
    memory = page.locator("#memory .mem")
    assert "system" in (memory.nth(0).get_attribute("class") or "")
    summary = page.locator("#memory .mem.summary")
    assert summary.count() == 1 and memory.nth(1).get_attribute("class") == "mem summary"
    assert summary.locator(".role").inner_text().lower() == "summary of earlier messages · sent as user"
    assert summary.locator(".content").inner_text() == "S: the user said one."
    assert page.locator("#memory .mem.user").all_inner_texts()[-1].endswith("two")
    assert "summary (over 60 tokens, newest 2 kept) · tool results older than the newest 3 cleared · gpt-4o-mini" \
        in page.locator("#memory-meta").inner_text()
    page.click("#panel-turn summary")
    assert page.locator("#last-turn .summary-note").inner_text().endswith(": 2 messages folded into its summary")

    fake.queue({"text": "c", "usage": None},  # an endpoint that reports nothing: chatrun counts
               {"text": "S: the user said one and two.", "usage": usage(120, 9)})  # the summary is extended
    send(page, "three")
    third = rows(page, "turn-usage")[2]
    assert third[0] == "turn 3" and int(third[1]) > 120 and third[4] == "estimated"
    calls = rows(page, "call-usage")
    assert calls[0][0] == "main · gpt-4o-mini" and calls[0][4] == "estimated"
    assert calls[1] == ["main (summary) · cheap-model", "120", "9", "0.0000078", ""]  # reported: not estimated
    assert page.locator("#memory .mem.summary .content").inner_text() == "S: the user said one and two."
    [total] = rows(page, "session-total")
    assert total[4] == "estimated" and float(total[3]) > 0.0000846
    assert page.locator("#usage-meta").inner_text().endswith("estimated")
    directory = os.environ.get("CHATRUN_SCREENSHOTS")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(directory) / "usage.png"), full_page=True)
        for panel in ("usage", "memory"):  # the inspector scrolls by itself: each panel whole
            page.locator(f"#panel-{panel}").screenshot(path=str(Path(directory) / f"usage-{panel}-panel.png"))
