"""The web chat page in a real browser: Debian's chromium driven by playwright, against the real
server (uvicorn) with the travel bot answered by the fake OpenAI server.

Set CHATRUN_SCREENSHOTS=DIR to keep screenshots of each step."""

from __future__ import annotations

import pytest

import chatrun
from browser_support import (
    BROWSER_MARKS,
    chat_page,
    chromium,
    open_page,
    restarted_mid_turn,
    send,
    send_while_the_model_thinks,
    shot,
)
from chatrun.server import create_app
from server_support import REPO, ThreadServer, call, free_port, write_travel

pytestmark = BROWSER_MARKS


@pytest.fixture
def bot_path(tmp_path):
    return write_travel(tmp_path / "bots")


@pytest.fixture
def page(fake, tmp_path, bot_path):
    bot = chatrun.load_bot(bot_path)
    app = create_app([bot], f"sqlite:///{tmp_path / 'chat.db'}")
    with ThreadServer(app) as server, chat_page(server.url) as tab:
        yield tab


def crumbs(page) -> list[str]:
    return page.locator("#breadcrumb .crumb").all_inner_texts()


def test_a_full_booking_in_the_browser(page, fake):
    assert crumbs(page) == ["main_menu"]
    assert page.locator(".graph .node.current").get_attribute("data-route") == "main_menu"

    fake.queue(
        call("book_flight"),
        call("set_destination", destination="Dublin"),
        {"chunks": ["Lovely, ", "Dublin! ", "When do you leave?"], "chunk_delay": 0.02},
    )
    send(page, "I want to fly to Dublin")
    shot(page, "1-flight")
    assert page.locator(".msg.user").last.inner_text() == "I want to fly to Dublin"
    assert page.locator(".msg.bot").last.inner_text() == "Lovely, Dublin! When do you leave?"
    assert page.locator(".note").filter(has_text="Destination set to Dublin").count() == 1
    assert crumbs(page) == ["main_menu", "flight"]
    assert page.locator("#breadcrumb .crumb.current").inner_text() == "flight"
    # Inspector: the graph highlights the route, the scope stack shows the reservation...
    assert page.locator(".graph .node.current").get_attribute("data-route") == "flight"
    assert page.locator(".graph .node.on-stack").count() == 2
    scopes = page.locator("#scopes .scope")
    assert scopes.count() == 2
    assert '"destination": "Dublin"' in scopes.nth(1).inner_text()
    assert "current" in (scopes.nth(1).get_attribute("class") or "")
    # ...and the memory is what the model was sent, with its answer.
    memory = page.locator("#memory .mem")
    assert memory.first.inner_text().lower().startswith("system")
    assert "Reservation so far" in page.locator("#memory").inner_text()  # the route's `context:`, sent after the memory
    assert "set_destination" in page.locator("#memory").inner_text()
    assert memory.last.inner_text().endswith("When do you leave?")

    fake.queue(call("set_departure", date="2026-07-01"), call("book"))
    send(page, "July 1st")
    shot(page, "2-booked")
    assert page.locator(".msg.bot").last.inner_text() == "Your flight to Dublin on 2026-07-01 is booked."
    assert crumbs(page) == ["main_menu"]
    assert page.locator(".graph .node.current").get_attribute("data-route") == "main_menu"
    assert page.locator("#scopes .scope").count() == 1
    # The flight's result was handed back to the main menu's memory.
    assert page.locator("#memory .mem").last.inner_text().endswith("Flight booked")
    # The last turn's events, in order, as the history recorded them.
    page.click("#panel-turn summary")
    kinds = page.locator("#last-turn .event-type").all_inner_texts()
    assert kinds == ["Thinking", "Message", "RouteChanged"]
    assert "turn 2 · ok" in page.locator("#turn-meta").inner_text()


def test_errors_reload_and_reset(page, fake):
    fake.queue({"status": 400, "body": {"error": {"message": "model says no"}}})
    send(page, "hello")
    assert page.locator("#messages .error").count() == 2  # the turn's error, then: the message is back
    shown = page.locator("#messages .error").first.inner_text()
    assert "cannot answer right now" in shown and "127.0.0.1" not in shown  # safe text, no endpoint
    assert page.input_value("#input") == "hello"  # rolled back: back in the box, to send again

    fake.queue(call("book_flight"), {"text": "Where to?"})
    send(page, "a flight")
    chat_id = page.evaluate("localStorage.getItem(Object.keys(localStorage)[0])")
    # A reload resumes the stored session: transcript, breadcrumb and inspector come back.
    page.reload()
    page.wait_for_selector("body[data-ready=true]")
    page.wait_for_function("document.body.dataset.turn === '1'")
    assert crumbs(page) == ["main_menu", "flight"]
    assert page.locator(".msg.bot").last.inner_text() == "Where to?"
    assert page.locator(".msg.user").all_inner_texts() == ["hello", "a flight"]
    assert page.locator("#messages .error").count() == 1  # the failed turn is part of the transcript too
    shot(page, "3-reloaded")

    page.click("#reset")
    page.wait_for_function("document.body.dataset.turn === '0'")
    assert crumbs(page) == ["main_menu"]
    assert page.locator(".msg").count() == 0
    new_id = page.evaluate("localStorage.getItem(Object.keys(localStorage)[0])")
    assert new_id != chat_id
    assert fake.requests  # the conversation really went through the model


def test_the_javascript_client_has_the_quarkus_api(page, fake):
    fake.queue(
        {"chunks": ["a", "b"]},
        call("remember_name", name="Zoe"),
        {"text": "Hi Zoe"},
    )
    result = page.evaluate(
        """async () => {
        const seen = [];
        const client = new ChatScopesClient();
        await client.open(location.origin.replace("http", "ws") + "/_chat/routes");
        const session = await client.builder()
            .messageHandler((m) => seen.push(["Message", m]))
            .streamHandler((c) => seen.push(["Stream", c]))
            .defaultHandler((type, data) => seen.push([type, data]))
            .connect("main_menu");
        const first = await session.chat("hello");
        await session.sendData({userMessage: "I am Zoe", locale: "en"});
        let failure = null;
        try {
            await client.builder().connect("nowhere");
        } catch (err) {
            failure = {reason: err.reason, message: err.message, detail: err.detail};
        }
        const resumed = await client.builder().resume(session.chatId).connect();
        await session.close();
        let closed = null;
        try { await client.builder().resume(session.chatId).connect(); }
        catch (err) { closed = err.reason; }
        return {seen, first, scopeId: session.scopeId, chatId: session.chatId, failure,
                resumedScope: resumed.scopeId, closed, ws: client.websocket instanceof WebSocket};
    }"""
    )
    assert result["first"] == result["chatId"] + ".1" == result["scopeId"]
    assert result["seen"][:3] == [["Stream", "a"], ["Stream", "b"], ["Message", "ab"]]
    assert ["Message", "Hi Zoe"] in result["seen"]
    assert result["failure"]["reason"] == "RouteNotFound" == result["failure"]["message"]
    assert "nowhere" in result["failure"]["detail"]
    assert result["resumedScope"] == result["scopeId"]
    assert result["closed"] == "SessionNotActive"
    assert result["ws"] is True
    assert fake.requests[-2]["messages"][-1]["content"] == "I am Zoe"


def test_the_javascript_client_is_a_superset_of_the_quarkus_client(page, fake):
    """What a page written for Quarkus relies on: the public members, the console.log handlers
    the builder pre-registers (a Message with no messageHandler never reaches defaultHandler),
    sendEvent/send/onMessage, session.id/currentScope, rejection with Error(reason)."""
    fake.queue({"text": "hello"}, {"status": 400, "body": {"error": {"message": "no"}}})
    result = page.evaluate(
        """async () => {
        const defaults = [];
        const client = new ChatScopesClient();
        await client.open(location.origin.replace("http", "ws") + "/_chat/routes");
        const members = ["open", "builder", "send", "onMessage"].filter((m) => typeof client[m] !== "function");
        const builder = client.builder().defaultHandler((type, data) => defaults.push(type));
        for (const m of ["eventHandler", "messageHandler", "errorHandler", "consoleHandler", "thinkingHandler",
                         "streamHandler", "objectHandler", "defaultHandler", "connect"]) {
            if (typeof builder[m] !== "function") members.push(m);
        }
        const preset = ["Message", "Thinking", "Console", "SystemError"].filter((t) => !builder.eventHandlers.has(t));
        const session = await builder.connect();
        for (const m of ["chat", "sendData", "sendEvent"]) if (typeof session[m] !== "function") members.push(m);
        const counter = client.counter;
        await session.chat("hi");
        let rejected = null;
        try { await session.sendEvent("ChatRouteMessage", {userMessage: "again"}); }
        catch (err) { rejected = {isError: err instanceof Error, message: err.message, detail: err.detail}; }
        client.onMessage({data: JSON.stringify({chatId: session.id, type: "Custom", data: 1})});
        return {members, preset, counter, id: session.id, scope: session.currentScope,
                sessions: client.sessions.get(session.id) === session, defaults, rejected,
                ws: client.websocket instanceof WebSocket};
    }"""
    )
    assert result["members"] == [] and result["preset"] == []
    assert result["counter"] == 1 and result["sessions"] is True and result["ws"] is True
    assert result["scope"] == result["id"] + ".1"
    # The Message went to the preset console.log handler; the Stream chunk (no streamHandler),
    # the Error (an extension) and the custom frame to defaultHandler.
    assert result["defaults"] == ["Stream", "Error", "Custom"]
    assert result["rejected"]["isError"] and result["rejected"]["message"] == "ServerError"
    assert result["rejected"]["detail"] == chatrun.events.MODEL_FAILED_TEXT  # the safe text: what users may see


def test_a_session_without_a_default_handler_logs_an_unhandled_frame_type_and_goes_on(page, fake):
    """docs/protocol.md: a page without a `defaultHandler` never breaks on an unhandled frame type."""
    logged: list[str] = []
    page.on("console", lambda message: logged.append(message.text))
    fake.queue({"chunks": ["a", "b"]}, {"text": "still here"})
    replies = page.evaluate(
        """async () => {
        const replies = [];
        const client = new ChatScopesClient();
        await client.open(location.origin.replace("http", "ws") + "/_chat/routes");
        const session = await client.builder().messageHandler((m) => replies.push(m)).connect();
        await session.chat("hello");  // its Stream frames have no handler
        client.onMessage({data: JSON.stringify({chatId: session.id, type: "Custom", data: 1})});
        await session.chat("again");
        return replies;
    }"""
    )
    assert replies == ["ab", "still here"]
    assert {"Handler not found for eventType: Stream", "Handler not found for eventType: Custom"} <= set(logged)


@pytest.mark.parametrize("bot_path", [REPO / "bots" / "travel"])
def test_the_travel_example_bot_books_a_flight_in_the_browser(page, fake, bot_path):
    fake.queue(
        call("set_name", name="Ana"),
        {"text": "Hello Ana! Where would you like to go?"},
    )
    send(page, "Hi, I'm Ana")
    assert page.locator(".msg.bot").last.inner_text() == "Hello Ana! Where would you like to go?"
    assert '"traveller_name": "Ana"' in page.locator("#state").inner_text()

    fake.queue(
        call("book_flight"),
        call("set_destination", destination="Dublin"),
        {"text": "Dublin it is. When do you leave and come back, and in which class?"},
    )
    send(page, "A flight to Dublin please")
    assert crumbs(page) == ["main_menu", "flight"]
    assert page.locator(".graph .node.current").get_attribute("data-route") == "flight"
    flight_scope = page.locator("#scopes .scope").nth(1).inner_text()
    assert '"destination": "Dublin"' in flight_scope
    assert "Reservation so far" in page.locator("#memory").inner_text()  # the route's `context:`

    fake.queue(
        {"tool_calls": [
            {"name": "set_departure", "arguments": {"date": "2026-07-01"}},
            {"name": "set_return_date", "arguments": {"date": "2026-07-10"}},
            {"name": "set_ticket_class", "arguments": {"ticket_class": "economy"}},
        ]},
        call("book"),
    )
    send(page, "July 1st to 10th, economy")
    shot(page, "4-travel-booked")
    booked = page.locator(".msg.bot").last.inner_text()
    assert booked.startswith("Your economy flight to Dublin is booked: FL-")
    assert page.locator(".object").filter(has_text="booking").count() == 1  # the handler's Object event
    assert crumbs(page) == ["main_menu"]
    assert page.locator(".graph .node.current").get_attribute("data-route") == "main_menu"
    assert page.locator("#scopes .scope").count() == 1
    # The main menu's shared scope got the destination from the wizard; the state the booking.
    assert '"destination": "Dublin"' in page.locator("#scopes .scope").first.inner_text()
    assert '"last_booking": "flight FL-' in page.locator("#state").inner_text()
    assert "Booked flight FL-" in page.locator("#memory .mem:not(.context)").last.inner_text()  # the hand-back result


def test_the_page_reconnects_after_a_server_restart_and_continues(fake, tmp_path):
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    bot_file = write_travel(tmp_path / "bots")
    port = free_port()
    with chromium() as browser:
        tab = browser.new_page(viewport={"width": 1280, "height": 860})
        with ThreadServer(create_app([chatrun.load_bot(bot_file)], db), port) as server:
            tab.goto(server.url + "/")
            tab.wait_for_selector("body[data-ready=true]")
            fake.queue(call("book_flight"), {"text": "Where to?"})
            send(tab, "a flight")
            assert crumbs(tab) == ["main_menu", "flight"]
        tab.wait_for_function("document.getElementById('status').dataset.state === 'offline'")
        with ThreadServer(create_app([chatrun.load_bot(bot_file)], db), port):
            tab.wait_for_function(
                "document.getElementById('status').dataset.state === 'online'", timeout=15_000
            )
            fake.queue({"text": "Dublin, noted."})
            send(tab, "Dublin")
            assert tab.locator(".msg.bot").last.inner_text() == "Dublin, noted."
            assert crumbs(tab) == ["main_menu", "flight"]
            # The turn's number lands with its end (Completed), which may come after the reply's
            # text on a busy machine: wait for it, then check it.
            tab.wait_for_function("document.body.dataset.turn === '2'", timeout=15_000)
            assert tab.get_attribute("body", "data-turn") == "2"


def test_a_message_sent_while_the_server_is_away_stays_in_the_box_and_goes_once_back(fake, tmp_path):
    """While the page reconnects nothing can be sent: Enter keeps the text in the box (it was
    shown as sent, never reached the server, and no error said so); sent again once the page is
    back online, it goes once."""
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    bot_file = write_travel(tmp_path / "bots")
    port = free_port()
    with chromium() as browser:
        with ThreadServer(create_app([chatrun.load_bot(bot_file)], db), port) as server:
            tab, errors = open_page(browser, server.url + "/", 390)
        tab.wait_for_function("document.getElementById('status').dataset.state === 'offline'")
        tab.fill("#input", "are you there?")
        tab.press("#input", "Enter")
        assert tab.input_value("#input") == "are you there?"
        assert tab.locator(".msg.user").count() == 0  # not shown as sent
        with ThreadServer(create_app([chatrun.load_bot(bot_file)], db), port):
            tab.wait_for_function("document.getElementById('status').dataset.state === 'online'", timeout=15_000)
            fake.queue({"text": "I am."})
            send(tab, tab.input_value("#input"))
            assert tab.locator(".msg.bot").last.inner_text() == "I am."
            assert [m.inner_text() for m in tab.locator(".msg.user").all()] == ["are you there?"]
        sent = [r["messages"][-1]["content"] for r in fake.requests]
        assert sent == ["are you there?"], sent
        assert not errors, errors


def test_a_reply_the_server_committed_as_it_went_away_shows_once_after_the_reconnect(fake, tmp_path):
    """The server stops mid-turn (it ends the turn, commits it, and closes the connection before
    the reply reaches the page): back online, the page shows that reply once, without a reload
    (it showed none, and no error)."""
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    bot_file = write_travel(tmp_path / "bots")
    port = free_port()
    with chromium() as browser:
        with ThreadServer(create_app([chatrun.load_bot(bot_file)], db), port) as server:
            tab, errors = open_page(browser, server.url + "/", 390)
            tab.wait_for_function("document.body.dataset.refreshes !== undefined")  # the turn it is at
            fake.queue({"text": "A slow reply.", "delay": 2.0})
            tab.fill("#input", "hello")
            tab.press("#input", "Enter")
            tab.wait_for_selector("#thinking", state="visible")
        tab.wait_for_function("document.getElementById('status').dataset.state === 'offline'")
        with ThreadServer(create_app([chatrun.load_bot(bot_file)], db), port):
            tab.wait_for_function("document.getElementById('status').dataset.state === 'online'", timeout=15_000)
            tab.locator(".msg.bot", has_text="A slow reply.").wait_for(timeout=15_000)
            assert [m.inner_text() for m in tab.locator(".msg.user").all()] == ["hello"]
            assert tab.locator(".msg.bot", has_text="A slow reply.").count() == 1
            # Drawn again with the history, which is not read out; the reply the reader waited for is.
            tab.wait_for_function("document.getElementById('announce').textContent === 'A slow reply.'")
            assert tab.input_value("#input") == "" and tab.locator("#thinking").is_hidden()
        assert len(fake.requests) == 1
        assert not errors, errors


def test_a_turn_the_server_died_in_gives_the_message_back_once_reconnected(fake, tmp_path):
    """kill -9 mid-turn: nothing was committed. Back online, the page says the reply was lost and
    puts the message back in the box (it stayed shown as sent, unanswered, with no error);
    sent again, it goes once and is answered."""

    from redis_support import Replica

    bot_file = write_travel(tmp_path / "bots")
    replica = Replica(str(bot_file), f"sqlite:///{tmp_path / 'chat.db'}", fake.base_url).start()
    with replica.served():
        with chromium() as browser:
            tab, errors = open_page(browser, replica.url + "/", 390)
            send_while_the_model_thinks(tab, fake, "hello")
            restarted_mid_turn(tab, replica, fake)
            tab.locator("#messages .error", has_text="The connection was lost before the reply").wait_for(timeout=30_000)
            assert tab.input_value("#input") == "hello"
            assert tab.inner_text("#announce").startswith("The connection was lost before the reply")  # read out
            assert tab.locator(".msg.user").count() == 0  # the server has no such message
            fake.queue({"text": "Hello again."})
            send(tab, tab.input_value("#input"))
            assert [m.inner_text() for m in tab.locator(".msg.user").all()] == ["hello"]
            assert tab.locator(".msg.bot").last.inner_text() == "Hello again."
            assert [r["messages"][-1]["content"] for r in fake.requests] == ["hello"]
            assert not errors, errors


def test_the_page_takes_its_token_out_of_the_url_and_keeps_working(fake, tmp_path, bot_path):
    from chatrun.server.auth import Auth

    auth = Auth.from_mapping({"tokens": {"page-token-123": {"principal": "ana"}}})
    app = create_app([chatrun.load_bot(bot_path)], "memory://", auth=auth)
    with ThreadServer(app) as server, chromium() as browser:
        tab = browser.new_context().new_page()
        tab.goto(server.url + "/?token=page-token-123")
        tab.wait_for_selector("body[data-ready=true]", timeout=10_000)
        assert "token" not in tab.url  # gone from the address bar (and so from history)
        fake.queue({"text": "Hello Ana"})
        send(tab, "hi")
        assert tab.locator(".msg.bot").last.inner_text() == "Hello Ana"
        tab.reload()  # the tab still has its token, from sessionStorage
        tab.wait_for_selector("body[data-ready=true]", timeout=10_000)
        assert "token" not in tab.url
        fake.queue({"text": "Still you"})
        send(tab, "again")
        assert tab.locator(".msg.bot").last.inner_text() == "Still you"
