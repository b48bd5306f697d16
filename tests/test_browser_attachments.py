"""Attachments on the web page (issue 28): the attach button, a pasted image and files dropped on
the chat wait in a tray (removable) and are uploaded when the message is sent; the WebSocket
frame carries only their references. Real Chromium against the real server (SQLite and its blob
folder), the model played by the fake OpenAI server, the bot bots/claims: its `report` route
takes photos and PDFs, `filed` takes none.

Set CHATRUN_SCREENSHOTS=DIR to keep screenshots."""

from __future__ import annotations

import base64
import shutil

import httpx
import pytest

import chatrun
from browser_support import (
    BROWSER_MARKS,
    chat_page,
    open_page,
    restarted_mid_turn,
    send,
    send_while_the_model_thinks,
    shot,
)
from chatrun.server import create_app
from server_support import REPO, ThreadServer

pytestmark = [*BROWSER_MARKS, pytest.mark.slow]

PHOTO = REPO / "bots" / "claims" / "transcripts" / "dented-box.png"
PNG = PHOTO.read_bytes()
PNG_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()
PDF = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"


@pytest.fixture
def server(fake, tmp_path):
    app = create_app([chatrun.load_bot(REPO / "bots" / "claims")], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as running:
        yield running


def stored_blobs(tmp_path) -> list[str]:
    """Every blob file in the SQLite store's blob folder (all sessions)."""
    folder = tmp_path / "chat.db.blobs"
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def user_parts(request: dict) -> list[dict]:
    last = [m for m in request["messages"] if m["role"] == "user"][-1]
    assert isinstance(last["content"], list), last
    return last["content"]


def page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def tray(page) -> list[str]:
    return page.eval_on_selector_all("#attach-tray .attachment", "items => items.map(i => i.className + ' ' + i.dataset.name)")


# A File built in the page (the bytes as base64), put on a DataTransfer and dispatched as a paste
# on the message box or as a drag and drop onto the chat: what a browser does for a user.
DISPATCH = """([kind, selector, b64, type, name]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const transfer = new DataTransfer();
  transfer.items.add(new File([bytes], name, { type: type }));
  const target = document.querySelector(selector);
  if (kind === "paste") {
    target.dispatchEvent(new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true }));
  } else {
    for (const t of ["dragenter", "dragover", "drop"]) {
      target.dispatchEvent(new DragEvent(t, { dataTransfer: transfer, bubbles: true, cancelable: true }));
    }
  }
}"""


def dispatch(page, kind: str, selector: str, data: bytes, media_type: str, name: str) -> None:
    page.evaluate(DISPATCH, [kind, selector, base64.b64encode(data).decode(), media_type, name])


def test_an_image_attached_on_the_page_reaches_the_model_once_stored_and_goes_with_the_session(server, fake, tmp_path):
    fake.queue({"text": "I see a dented box. What is the order number?"}, {"text": "Thanks, the same dent."})
    with chat_page(server.url, width=1280) as page:
        frames: list[str] = []  # what the page sends on its WebSocket (reopened by the reload)
        page.on("websocket", lambda ws: ws.on("framesent", lambda payload: frames.append(str(payload))))
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        assert page.is_visible("#attach")
        assert page.get_attribute("#attach", "aria-label") == "Attach files"
        with page.expect_file_chooser() as chooser:
            page.click("#attach")
        chooser.value.set_files(str(PHOTO))
        assert tray(page) == ["attachment image dented-box.png"]
        assert page.eval_on_selector("#attach-tray img", "img => img.complete && img.naturalWidth") == 64
        shot(page, "attach-tray-1280")
        send(page, "My parcel arrived like this")

        # The model got the photo as a content part, from the bytes the page uploaded ...
        assert user_parts(fake.requests[0]) == [{"type": "text", "text": "My parcel arrived like this"},
                                                {"type": "image_url", "image_url": {"url": PNG_URL}}]
        assert len(stored_blobs(tmp_path)) == 1
        assert tray(page) == []
        # The WebSocket carried the reference, never the bytes.
        assert any(stored_blobs(tmp_path)[0] in f and "dented-box.png" in f for f in frames), frames
        assert not any(base64.b64encode(PNG).decode()[:40] in f for f in frames)
        bubble = page.locator(".msg.user").last
        assert bubble.locator(".attachment.image img").evaluate("img => img.naturalWidth") == 64
        assert "My parcel arrived like this" in bubble.inner_text()
        # The inspector shows what the memory keeps: the reference, not the bytes.
        assert f"[attached: dented-box.png (image/png, {len(PNG)} bytes)]" in page.inner_text("#memory")

        # ... and again, pasted, with no text: the model is sent it with both messages, the store
        # keeps it once.
        dispatch(page, "paste", "#input", PNG, "image/png", "pasted.png")
        assert tray(page) == ["attachment image pasted.png"]
        send(page, "")
        assert user_parts(fake.requests[1]) == [{"type": "image_url", "image_url": {"url": PNG_URL}}]
        sent = [p for m in fake.requests[1]["messages"] if m["role"] == "user" for p in m["content"]]
        assert sent.count({"type": "image_url", "image_url": {"url": PNG_URL}}) == 2
        assert page.locator(".msg.user").last.inner_text() == ""
        assert len(stored_blobs(tmp_path)) == 1

        # A PDF dropped on the chat is a name + size chip, removable with the keyboard.
        dispatch(page, "drop", ".messages", PDF, "application/pdf", "invoice.pdf")
        assert tray(page) == ["attachment file invoice.pdf"]
        assert page.inner_text("#attach-tray .attachment-size") == f"{len(PDF)} bytes"
        page.focus("#attach-tray .attach-remove")
        assert page.evaluate("document.activeElement.getAttribute('aria-label')") == "Remove invoice.pdf"
        page.keyboard.press("Enter")
        assert tray(page) == [] and page.is_hidden("#attach-tray")
        assert len(fake.requests) == 2

        # After a reload the conversation is replayed with its images (read back from the uploads).
        page.reload()
        page.wait_for_selector("body[data-ready=true]")
        images = page.locator(".msg.user .attachment.image img")
        assert images.count() == 2
        page.wait_for_function("[...document.querySelectorAll('.msg.user img')].every(i => i.naturalWidth === 64)")
        assert [n for n in page.eval_on_selector_all(".msg.user .attachment", "a => a.map(x => x.dataset.name)")] == [
            "dented-box.png", "pasted.png"]
        shot(page, "attach-sent-1280")
        assert page_width(page) == 1280
        page.set_viewport_size({"width": 390, "height": 860})
        shot(page, "attach-sent-390")
        assert page_width(page) == 390

        # Deleting the session (a new conversation) deletes its files.
        session = page.evaluate("localStorage.getItem(Object.keys(localStorage).find(k => k.endsWith(':chatId')))")
        page.click("#reset")
        page.wait_for_function(f"localStorage.getItem(Object.keys(localStorage).find(k => k.endsWith(':chatId'))) !== {session!r}")
        assert httpx.get(f"{server.url}/bots/claims/sessions/{session}").status_code == 404
        assert stored_blobs(tmp_path) == []


def test_what_the_route_does_not_take_is_refused_naming_the_limit(server, fake, tmp_path):
    with chat_page(server.url, width=390) as page:
        # Refused on the page, before any upload: the kind, the count (the route takes 3).
        dispatch(page, "drop", ".messages", b"a,b\n", "text/csv", "rows.csv")
        problem = page.inner_text("#attach-problem")
        assert "rows.csv is text/csv" in problem
        assert "image/png, image/jpeg, application/pdf (attachments.kinds)" in problem
        page.evaluate("""() => {
          const transfer = new DataTransfer();
          transfer.items.add(new File([new Uint8Array(5000001)], "huge.png", { type: "image/png" }));
          document.querySelector("#input").dispatchEvent(
            new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true }));
        }""")
        assert page.inner_text("#attach-problem") == (
            "huge.png is 5,000,001 bytes, over this chat's limit of 5,000,000 bytes per file (attachments.max_bytes).")
        for i in range(4):
            dispatch(page, "paste", "#input", PNG[:-i or None] + bytes(i), "image/png", f"photo{i}.png")
        assert len(tray(page)) == 3
        assert page.inner_text("#attach-problem") == (
            "Files per message: at most 3 (attachments.max_count); photo3.png was not added.")
        shot(page, "attach-refused-390")
        assert page_width(page) == 390
        assert page.evaluate("document.querySelector('.composer').scrollWidth <= document.querySelector('.composer').clientWidth")
        assert stored_blobs(tmp_path) == []
        for _ in range(3):
            page.click("#attach-tray .attach-remove")
        assert tray(page) == []

        # Another tab of the same user files the claim: the session is on `filed`, which takes no
        # files, but this page still offers them. The server refuses the upload, and says why.
        session = page.evaluate("localStorage.getItem(Object.keys(localStorage).find(k => k.endsWith(':chatId')))")
        fake.queue({"tool_calls": [{"name": "file_claim", "arguments": {"order": "123456", "damage": "a dent"}}]})
        reply = httpx.post(f"{server.url}/bots/claims/sessions/{session}/messages", json={"userMessage": "order 123456"})
        assert reply.status_code == 200, reply.text
        dispatch(page, "paste", "#input", PNG, "image/png", "late.png")
        page.fill("#input", "One more photo")
        page.press("#input", "Enter")
        page.wait_for_selector("#attach-problem:not([hidden])", timeout=10_000)
        assert page.inner_text("#attach-problem") == (
            "Not sent: route filed takes no attachments (it declares no `attachments:`)")
        shot(page, "attach-server-refused-390")
        assert page.input_value("#input") == "One more photo"  # kept, to send without the file
        assert page.locator(".msg.user").count() == 0
        assert len(fake.requests) == 1
        assert stored_blobs(tmp_path) == []

        # Once the page knows the route, the attach button is gone.
        page.click("#attach-tray .attach-remove")
        fake.queue({"text": "You are welcome."})
        send(page, "Thanks")
        assert page.is_hidden("#attach")
        dispatch(page, "drop", ".messages", PNG, "image/png", "after.png")
        assert "takes no files" in page.inner_text("#attach-problem")
        assert tray(page) == []
        shot(page, "attach-no-files-390")
        assert page_width(page) == 390


def test_a_turn_the_server_died_in_gives_its_files_back_with_the_message(fake, tmp_path):
    """kill -9 mid-turn, a photo attached: nothing was committed. Back online, the page puts the
    message back in the box and its photo back in the tray (it gave the text back alone, the
    photo gone); sent again, the model gets both."""

    from browser_support import chromium
    from redis_support import Replica

    replica = Replica(str(REPO / "bots" / "claims"), f"sqlite:///{tmp_path / 'chat.db'}", fake.base_url).start()
    with replica.served():
        with chromium() as browser:
            tab, errors = open_page(browser, replica.url + "/", 1280)
            with tab.expect_file_chooser() as chooser:
                tab.click("#attach")
            chooser.value.set_files(str(PHOTO))
            assert tray(tab) == ["attachment image dented-box.png"]
            send_while_the_model_thinks(tab, fake, "My parcel arrived like this")
            assert tray(tab) == []  # sent: the tray emptied
            restarted_mid_turn(tab, replica, fake)
            tab.locator("#messages .error", has_text="The connection was lost before the reply").wait_for(timeout=30_000)
            assert tab.input_value("#input") == "My parcel arrived like this"
            assert tray(tab) == ["attachment image dented-box.png"]
            assert tab.eval_on_selector("#attach-tray img", "img => img.complete && img.naturalWidth") == 64
            fake.queue({"text": "I see a dented box."})
            send(tab, tab.input_value("#input"))
            assert user_parts(fake.requests[0]) == [{"type": "text", "text": "My parcel arrived like this"},
                                                    {"type": "image_url", "image_url": {"url": PNG_URL}}]
            assert len(fake.requests) == 1 and tray(tab) == []
            assert tab.locator(".msg.user").last.locator(".attachment.image").count() == 1
            assert not errors, errors


def test_a_turn_that_fails_gives_its_text_and_files_back_with_the_error(server, fake):
    """The model cannot be reached: the turn fails (rolled back, nothing kept). The page shows the
    error and puts the message back in the box and its photo back in the tray (before: both gone,
    only a turn lost with the server came back); sent again, the model gets both."""
    fake.responder = lambda body: {"status": 500, "body": "down"}
    with chat_page(server.url, width=390) as page:
        with page.expect_file_chooser() as chooser:
            page.click("#attach")
        chooser.value.set_files(str(PHOTO))
        page.fill("#input", "My parcel arrived like this")
        page.press("#input", "Enter")
        page.locator("#messages .error", has_text="Your message is back in the box").wait_for(timeout=60_000)
        assert page.locator("#messages .error").count() == 2  # the turn's error, then the note
        assert page.input_value("#input") == "My parcel arrived like this"
        assert tray(page) == ["attachment image dented-box.png"]
        shot(page, "failed-turn-gives-back-390")
        fake.responder = None
        fake.reset()
        fake.queue({"text": "I see a dented box."})
        send(page, page.input_value("#input"))
        assert user_parts(fake.requests[0]) == [{"type": "text", "text": "My parcel arrived like this"},
                                                {"type": "image_url", "image_url": {"url": PNG_URL}}]
        assert tray(page) == [] and page.input_value("#input") == ""
        assert not page.js_errors, page.js_errors


def test_a_limit_of_one_byte_is_said_in_the_singular_on_the_page(fake, tmp_path):
    """The page said "over this chat's limit of 1 bytes": `size_bytes_one`/`_other` by the plural
    rule of the page's language, as the server's notices pick them."""
    shutil.copytree(REPO / "bots" / "claims", tmp_path / "claims")
    yaml = tmp_path / "claims" / "bot.yaml"
    yaml.write_text(yaml.read_text().replace("max_bytes: 5000000,", "max_bytes: 1,"))
    app = create_app([chatrun.load_bot(tmp_path / "claims")], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url, width=390) as page:
        dispatch(page, "paste", "#input", b"ab", "image/png", "tiny.png")
        assert page.inner_text("#attach-problem") == (
            "tiny.png is 2 bytes, over this chat's limit of 1 byte per file (attachments.max_bytes).")
