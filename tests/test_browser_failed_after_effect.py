"""The page after a failed turn, in Debian's Chromium: a plain failure (nothing outside the
conversation changed) gives the message back in the box to send again; a failure after a tool
with an outside effect ran does not (sending it again would run the tool again): the page shows
the server's text naming the tool, and says why the message is not back. The real server
(uvicorn) and the fake model, which fails after the tool ran.

Set CHATRUN_SCREENSHOTS=DIR to keep screenshots (390 and 1280 px)."""

from __future__ import annotations

from pathlib import Path

import pytest

import chatrun
from browser_support import BROWSER_MARKS, chat_page, send, shot
from chatrun.definition.page_texts import BUILTIN
from chatrun.server import create_app
from server_support import ThreadServer, call
from test_failed_after_effect import AFTER_BOOK, BOT, MODEL_DOWN, TOOLS

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

KEPT_OUT = BUILTIN["en"]["failed_kept_out"].format(tools="book")


@pytest.mark.parametrize("width", [390, 1280])
def test_a_failure_after_a_tool_ran_keeps_the_message_out_of_the_box(write_bot, tmp_path, fake, width):
    folder = Path(write_bot(BOT, extra={"book_tools.py": TOOLS}))
    app = create_app([chatrun.load_bot(folder)], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=width) as page:
        fake.queue(MODEL_DOWN)  # no tool ran: the message comes back
        send(page, "hello")
        assert page.input_value("#input") == "hello"
        assert page.locator("#messages .error").all_inner_texts()[-1] == BUILTIN["en"]["failed_turn"]

        page.fill("#input", "")
        fake.queue(call("book"), MODEL_DOWN)  # the booking ran, then the model failed
        send(page, "book it")
        shot(page, f"failed-after-effect-{width}")
        errors = page.locator("#messages .error").all_inner_texts()
        assert errors[-2:] == [AFTER_BOOK, KEPT_OUT]  # the server's text naming the tool, then why
        assert page.input_value("#input") == ""  # not back to send again: it would book again
        assert BUILTIN["en"]["failed_turn"] not in errors[2:]
    assert (folder.parent / "booked.txt").read_text() == "booked\n"
