"""Bot versions at runtime (issue 23): content versions, several versions served at once,
the `on_change` policies (pin, migrate, restart_scope), versions kept in the store for
replicas, canaries. Real apps on a real SQLite file, the fake OpenAI server, bots/shop.
The replicas on Redis (real processes) are in test_versions_replicas.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import chatrun
from chatrun.definition.versions import bot_files, content_version, version_layout
from chatrun.errors import BotError
from server_support import app_for_testclient as create_app
from server_support import until_done

SHOP = Path(__file__).resolve().parents[1] / "bots" / "shop"
WORDS = {"add": ("add_item", {"sku": "T1"}), "basket": ("add_to_basket", {"product": "T2", "quantity": 2}),
         "mail": ("save_email", None), "wrap": ("wrap_gift", {}), "checkout": ("checkout", {})}


def shop_responder(body: dict) -> dict:
    """The model: a word of the last user message calls its tool when the route offers it."""
    offered = {t["function"]["name"] for t in body.get("tools") or []}
    last = next(m for m in reversed(body["messages"]) if m["role"] in ("user", "tool"))
    if last["role"] == "user":
        for word, (tool, args) in WORDS.items():
            if word in str(last["content"]) and tool in offered:
                email = str(last["content"]).split()[-1]
                return {"tool_calls": [{"name": tool, "arguments": args if args is not None else {"email": email}}]}
    return {"text": "ok"}


def sent_calls(fake) -> list[tuple[str, dict]]:
    """The tool calls in the memory the model was last sent: (name, arguments)."""
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for m in fake.requests[-1]["messages"] for c in m.get("tool_calls") or []]


BUNDLE_KEY = "a-bundle-key-the-replicas-share-0123"  # docs/security.md, "The store"


def shop_copy(tmp_path: Path, on_change: str | None = None, weights: str | None = None) -> Path:
    """bots/shop in tmp_path, version 2 with `on_change:` (None: as shipped, migrate), versions.yaml with weights."""
    root = tmp_path / "shop"
    shutil.copytree(SHOP, root)
    if on_change is not None:
        v2 = root / "versions" / "2" / "bot.yaml"
        v2.write_text(v2.read_text().replace("on_change: migrate", f"on_change: {on_change}"))
    if weights is not None:
        (root / "versions.yaml").write_text(f"weights: {weights}\n")
    return root


def messages(response) -> dict:
    assert response.status_code in (200, 201), response.text
    return response.json()


def say(client: TestClient, sid: str, text: str) -> dict:
    """One turn, which must not fail."""
    answer = messages(client.post(f"/bots/shop/sessions/{sid}/messages", json={"userMessage": text}))
    assert answer["ok"] and not [e for e in answer["events"] if e["type"] == "Error"], answer
    return answer


def resource(client: TestClient, sid: str) -> dict:
    return messages(client.get(f"/bots/shop/sessions/{sid}"))


# -- content versions ---------------------------------------------------------------------------


def test_a_content_version_is_a_stable_hash_of_the_files(tmp_path):
    root = shop_copy(tmp_path) / "versions" / "1"
    first = chatrun.load_bot(root).config.content_version
    assert first == chatrun.load_bot(root).config.content_version == content_version(bot_files(root))
    (root / "transcripts").mkdir(exist_ok=True)  # versions/1 has transcripts of its own
    (root / "transcripts" / "t.yaml").write_text("turns: []\n")  # not part of the bot
    assert chatrun.load_bot(root).config.content_version == first
    (root / "bot.yaml").write_text((root / "bot.yaml").read_text().replace("You sell tea.", "You sell coffee."))
    assert chatrun.load_bot(root).config.content_version != first


def test_a_versions_layout_lists_its_versions_oldest_first_and_checks_weights(tmp_path):
    layout = version_layout(shop_copy(tmp_path, weights='{"1": 90, "2": 10}'))
    assert layout is not None and [label for label, _ in layout.versions] == ["1", "2"]
    assert layout.weights == {"1": 90, "2": 10}
    (tmp_path / "shop" / "versions.yaml").write_text("# canary\nweights: {\"3\": 10}\n")
    with pytest.raises(BotError) as caught:
        version_layout(tmp_path / "shop")
    (problem,) = caught.value.diagnostics
    assert problem.line == 2 and "version '3', which is not in versions/" in problem.message


def test_on_change_must_be_a_policy_or_a_route(tmp_path):
    root = shop_copy(tmp_path, on_change="nowhere") / "versions" / "2"
    with pytest.raises(BotError) as caught:
        chatrun.load_bot(root)
    found = [d for d in caught.value.diagnostics if d.path == "on_change"]
    assert found and found[0].line == 68 and "pin, migrate, restart_scope or a route name" in found[0].message


# -- several versions served; what sessions of version 1 do when version 2 is served ------------


def start_v1_sessions(store_url: str, root: Path, count: int) -> dict[str, str]:
    """`count` sessions of version 1 (only), a third each wrapping a gift (a route version 2
    deletes), at the checkout (renamed) and browsing; each with an email (a renamed key) and an
    add_item call (a tool version 2 changed) in its memory. Returns id -> where it sits."""
    where: dict[str, str] = {}
    with TestClient(create_app(str(root / "versions" / "1"), store_url)) as v1:
        for i in range(count):
            sid = f"s{i}"
            messages(v1.post("/bots/shop/sessions", json={"id": sid}))
            say(v1, sid, "add tea")
            say(v1, sid, f"mail me at a{i}@example.com")
            where[sid] = ("gift_wrap", "checkout", "browse")[i % 3]
            if where[sid] == "gift_wrap":
                say(v1, sid, "wrap it please")
            elif where[sid] == "checkout":
                say(v1, sid, "checkout now")
            assert resource(v1, sid)["route"] == where[sid]
    return where


@pytest.mark.slow  # 100 sessions, a few turns each
def test_migrate_moves_100_sessions_to_version_2_with_zero_failed_turns(fake, tmp_path):
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="migrate")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    where = start_v1_sessions(store, root, 100)
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version
    with TestClient(create_app(str(root), store)) as both:
        for i, (sid, was) in enumerate(where.items()):
            fake.requests.clear()
            say(both, sid, "hello again")  # zero failed turns: say() asserts no Error
            session = resource(both, sid)
            assert session["botVersion"] == v2_hash
            assert session["state"]["contact"] == {"email": f"a{i}@example.com"} and "email" not in session["state"]
            assert session["state"]["currency"] == "GBP"  # the migration's default, not the state's EUR
            assert session["route"] == {"gift_wrap": "browse", "checkout": "payment", "browse": "browse"}[was]
            if session["route"] == "browse":  # browse's memory holds the add_item call: mapped
                assert sent_calls(fake)[0] == ("add_to_basket", {"product": "T1", "quantity": 1})
            moved = [h for h in session["history"] if h.get("moved")]
            assert len(moved) == 1 and moved[0]["ok"] and moved[0]["moved"]["to"] == v2_hash
        assert messages(both.post("/bots/shop/sessions", json={"id": "new"}))["botVersion"] == v2_hash


@pytest.mark.slow  # 100 sessions, a few turns each
def test_pin_finishes_100_sessions_on_version_1_while_new_ones_start_on_version_2(fake, tmp_path):
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="pin")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    where = start_v1_sessions(store, root, 100)
    v1_hash = chatrun.load_bot(root / "versions" / "1").config.content_version
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version
    with TestClient(create_app(str(root), store)) as both:
        for i, (sid, was) in enumerate(where.items()):
            say(both, sid, "hello again")
            session = resource(both, sid)
            assert session["botVersion"] == v1_hash and session["route"] == was
            assert session["state"]["email"] == f"a{i}@example.com"
        assert messages(both.post("/bots/shop/sessions", json={"id": "new"}))["botVersion"] == v2_hash
        say(both, "new", "basket please")  # version 2's changed tool
        assert resource(both, "new")["state"]["cart"] == ["2 x T2"]


def test_restart_scope_continues_a_session_whose_route_is_gone_at_the_default_route(fake, tmp_path):
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="restart_scope")  # migrations unused
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    where = start_v1_sessions(store, root, 3)
    with TestClient(create_app(str(root), store)) as both:
        for sid, was in where.items():
            fake.requests.clear()
            say(both, sid, "hello again")
            session = resource(both, sid)
            if was == "browse":
                assert session["route"] == "browse" and session["stack"] == ["browse"]
            else:  # the scope on the lost route restarted on the default route, with a note
                assert session["stack"][-1] == "browse"
                assert "no longer exists" in str(fake.requests[-1]["messages"])
            assert [h for h in session["history"] if h.get("moved")][0]["ok"]


def test_a_replica_without_a_sessions_version_loads_it_from_the_store_and_never_downgrades(fake, tmp_path,
                                                                                         monkeypatch):
    fake.responder = shop_responder
    monkeypatch.setenv("CHATRUN_BUNDLE_KEY", BUNDLE_KEY)  # both servers: what one publishes, the other loads
    root = shop_copy(tmp_path, on_change="migrate")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    start_v1_sessions(store, root, 3)
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version
    with TestClient(create_app(str(root), store)) as both:
        say(both, "s0", "hello again")  # moved to version 2 (and version 2's files are in the store)
    with TestClient(create_app(str(root / "versions" / "1"), store)) as old:  # a replica not yet upgraded
        say(old, "s0", "and again")
        assert resource(old, "s0")["botVersion"] == v2_hash  # ran on version 2, loaded from the store
        say(old, "s1", "hello")  # its own version's sessions stay on version 1 there
        assert resource(old, "s1")["botVersion"] != v2_hash
        bot = messages(old.get("/bots/shop"))
        assert {v["content_version"]: v["stored"] for v in bot["versions"]}[v2_hash] is True
        metrics = old.get("/metrics").text  # per version: a canary is compared with what it may replace
        assert f'chatrun_version_turns_total{{bot="shop",bot_version="{v2_hash}",outcome="ok"}} 1.0' in metrics


def test_a_named_route_as_policy_restarts_lost_scopes_there(fake, tmp_path):
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="payment")
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    start_v1_sessions(store, root, 1)  # s0 wraps a gift: version 2 has no gift_wrap
    with TestClient(create_app(str(root), store)) as both:
        say(both, "s0", "hello again")
        assert resource(both, "s0")["stack"] == ["browse", "payment"]


def test_canary_weights_split_new_sessions_and_the_header_picks_one(fake, tmp_path):
    fake.responder = shop_responder
    root = shop_copy(tmp_path, weights='{"1": 50, "2": 50}')
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    v1_hash = chatrun.load_bot(root / "versions" / "1").config.content_version
    with TestClient(create_app(str(root), store)) as both:
        started = [messages(both.post("/bots/shop/sessions", json={"id": f"c{i}"}))["botVersion"] for i in range(40)]
        assert 8 <= started.count(v1_hash) <= 32  # about half: a stable hash of each id
        again = messages(both.post("/bots/shop/sessions", json={"id": "c0-again"}))  # another id, same rule
        assert again["botVersion"] in started
        picked = both.post("/bots/shop/sessions", json={"id": "tester"}, headers={"Chatrun-Bot-Version": "1"})
        assert messages(picked)["botVersion"] == v1_hash
        unknown = both.post("/bots/shop/sessions", json={"id": "t2"}, headers={"Chatrun-Bot-Version": "9"})
        assert unknown.status_code == 400 and "no version '9'" in unknown.json()["message"]
        shown = messages(both.get("/bots/shop"))
        assert [(v["label"], v["weight"]) for v in shown["versions"]] == [("1", 50), ("2", 50)]
        assert shown["version"] == "2"  # the primary: ties go to the newest


def test_a_canarys_session_stays_on_it_moves_to_the_primary_at_weight_0_and_never_back(fake, tmp_path):
    """docs/versions.md: a session never moves away from a version that still takes new sessions,
    and never to an older one."""
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="migrate", weights='{"1": 10, "2": 90}')
    store = f"sqlite:///{tmp_path / 'sessions.db'}"
    v1_hash = chatrun.load_bot(root / "versions" / "1").config.content_version
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version
    with TestClient(create_app(str(root), store)) as both:
        for sid, label in (("on1", "1"), ("on2", "2")):
            both.post("/bots/shop/sessions", json={"id": sid}, headers={"Chatrun-Bot-Version": label})
            say(both, sid, "hello")
        assert resource(both, "on1")["botVersion"] == v1_hash  # version 1 still takes new sessions
    (root / "versions.yaml").write_text('weights: {"1": 0, "2": 100}\n')
    with TestClient(create_app(str(root), store)) as promoted:
        say(promoted, "on1", "hello again")
        assert resource(promoted, "on1")["botVersion"] == v2_hash  # its weight is 0: to the primary
    (root / "versions.yaml").write_text('weights: {"1": 100, "2": 0}\n')  # rolled back
    with TestClient(create_app(str(root), store)) as rolled_back:
        for sid in ("on1", "on2"):
            say(rolled_back, sid, "and again")
            assert resource(rolled_back, sid)["botVersion"] == v2_hash, sid  # never a downgrade


def test_the_v1_api_reads_the_version_header_for_new_sessions(fake, tmp_path):
    fake.responder = shop_responder
    root = shop_copy(tmp_path, on_change="pin")  # version 2 is the primary; a session stays on its version
    v1_hash = chatrun.load_bot(root / "versions" / "1").config.content_version
    with TestClient(create_app(str(root), f"sqlite:///{tmp_path / 'sessions.db'}")) as server:
        body = {"model": "shop", "messages": [{"role": "user", "content": "hello"}]}
        chat = messages(server.post("/v1/chat/completions", json=body, headers={"Chatrun-Bot-Version": "1"}))
        assert resource(server, chat["chatrun"]["session"])["botVersion"] == v1_hash
        plain = messages(server.post("/v1/chat/completions", json=body | {"user": "another"}))
        assert resource(server, plain["chatrun"]["session"])["botVersion"] != v1_hash
        answer = messages(server.post("/v1/responses", json={"model": "shop", "input": "hello"},
                                      headers={"Chatrun-Bot-Version": "1"}))
        assert resource(server, answer["chatrun"]["session"])["botVersion"] == v1_hash
        unknown = server.post("/v1/chat/completions", json=body | {"user": "third"}, headers={"Chatrun-Bot-Version": "9"})
        assert unknown.status_code == 400 and "no version '9'" in unknown.text


def test_repl_talks_to_the_primary_version_or_the_one_named(tmp_path):
    from click.testing import CliRunner

    from chatrun.cli.repl import repl

    root = shop_copy(tmp_path)
    primary = CliRunner().invoke(repl, [str(root), "--play-model"], input="hello\n")
    assert "tools: add_to_basket, save_email, checkout" in primary.output, primary.output  # version 2
    named = CliRunner().invoke(repl, [str(root), "--play-model", "--version", "1"], input="hello\n")
    assert "tools: add_item, save_email, wrap_gift, checkout" in named.output, named.output
    (root / "versions.yaml").write_text('weights: {"1": 90, "2": 10}\n')  # the weights make 1 the primary
    weighted = CliRunner().invoke(repl, [str(root), "--play-model"], input="hello\n")
    assert "tools: add_item," in weighted.output, weighted.output
    unknown = CliRunner().invoke(repl, [str(root), "--version", "3"], input="")
    assert unknown.exit_code != 0 and "no version '3' in versions/ (there are: 1, 2)" in unknown.output
    flat = CliRunner().invoke(repl, [str(root / "versions" / "1"), "--version", "1"], input="")
    assert flat.exit_code != 0 and "this bot has no versions/ folder" in flat.output


def test_chatrun_test_runs_each_versions_transcripts(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from chatrun.cli.test import test as chatrun_test

    shop_copy(tmp_path / "bots")
    for args in ([str(tmp_path / "bots" / "shop"), "-v"], ["-v"]):  # the folder, or found from the root
        monkeypatch.chdir(tmp_path)
        ran = CliRunner().invoke(chatrun_test, args)
        assert ran.exit_code == 0, ran.output
        assert "versions/1/transcripts/add.yaml PASSED" in ran.output
        assert "versions/2/transcripts/add.yaml PASSED" in ran.output
        assert "shop/transcripts/migrated_basket.yaml PASSED" in ran.output  # across versions
        transcripts = list((tmp_path / "bots" / "shop").glob("**/transcripts/*.yaml"))
        assert ran.output.splitlines()[-1] == f"{len(transcripts)} passed, 0 failed"


# -- serve --reload: each valid edit is a new version, under the same policies ------------------


@pytest.mark.parametrize("policy", ["pin", "restart_scope"])
def test_a_reload_keeps_pinned_sessions_on_their_version_and_moves_the_others(fake, tmp_path, policy):
    from chatrun.engine.reload import BotReloader
    from chatrun.server.reload import apply

    fake.responder = shop_responder
    folder = shop_copy(tmp_path, on_change=policy) / "versions" / "1"
    bot_yaml = folder / "bot.yaml"
    bot_yaml.write_text(bot_yaml.read_text().replace('version: "1"\n', f'version: "1"\non_change: {policy}\n'))
    app = create_app(str(folder), f"sqlite:///{tmp_path / 'sessions.db'}")
    with TestClient(app) as client:
        registry = app.state.registry
        first = registry.bots["shop"]
        messages(client.post("/bots/shop/sessions", json={"id": "w"}))
        say(client, "w", "wrap it please")  # on gift_wrap, which the edit removes
        text = bot_yaml.read_text()
        cut = text[text.index("  gift_wrap:"):text.index("  checkout:\n    description: Paying")]
        bot_yaml.write_text(text.replace(cut, "").replace(", wrap_gift", "")
                            .replace("  wrap_gift:\n    description: Wrap the order as a gift\n"
                                     "    action: {message: \"Which ribbon colour would you like? (red so far)\", "
                                     "reply: Let us choose a ribbon., push: gift_wrap}\n", ""))
        outcome = BotReloader(folder, first).reload()
        assert outcome.ok, [d.format() for d in outcome.diagnostics]
        assert apply(registry, "shop", outcome)
        say(client, "w", "hello again")  # no turn fails because the bot changed
        session = resource(client, "w")
        if policy == "pin":
            assert session["botVersion"] == first.config.content_version and session["route"] == "gift_wrap"
        else:
            assert session["botVersion"] == outcome.bot.config.content_version and session["route"] == "browse"
        created = messages(client.post("/bots/shop/sessions", json={"id": "fresh"}))
        assert created["botVersion"] == outcome.bot.config.content_version


# -- what a team compares a canary by: per-version traces, log lines, metrics ---------------------


def priced_responder(body: dict) -> dict:
    return shop_responder(body) | {"usage": {"prompt_tokens": 1000, "completion_tokens": 500}}


def test_each_turn_says_its_version_in_its_span_its_log_line_and_the_metrics(fake, tmp_path, spans, caplog):
    """Two sessions, one per version (the WebSocket's header picks version 1 for one, the other
    starts on the primary): each turn's span, log line and cost are its own version's."""
    import logging

    prom_parser = pytest.importorskip("prometheus_client.parser")
    fake.responder = priced_responder
    root = shop_copy(tmp_path, on_change="pin")
    prices = {"1": "1.0", "2": "3.0"}  # per million input tokens: the versions' costs differ
    for label, price in prices.items():
        bot_yaml = root / "versions" / label / "bot.yaml"
        bot_yaml.write_text(bot_yaml.read_text() + f"prices:\n  gpt-4o-mini: {{input: {price}, output: 2.0}}\n")
    v1_hash = chatrun.load_bot(root / "versions" / "1").config.content_version
    v2_hash = chatrun.load_bot(root / "versions" / "2").config.content_version
    caplog.set_level(logging.INFO, logger="chatrun.turns")
    with TestClient(create_app(str(root), f"sqlite:///{tmp_path / 'sessions.db'}")) as server:
        with server.websocket_connect("/_chat/routes", headers={"Chatrun-Bot-Version": "1"}) as ws:
            ws.send_json({"type": "Connect", "chatId": "tester", "extensions": True})
            assert until_done(ws)[-1]["type"] == "Completed"
            ws.send_json({"type": "ChatRouteMessage", "chatId": "tester", "data": {"userMessage": "hello"}})
            assert until_done(ws)[-1]["type"] == "Completed"
        with server.websocket_connect("/_chat/routes") as ws:  # no header: the primary, version 2
            ws.send_json({"type": "Connect", "chatId": "plain", "extensions": True})
            assert until_done(ws)[-1]["type"] == "Completed"
            ws.send_json({"type": "ChatRouteMessage", "chatId": "plain", "data": {"userMessage": "hello"}})
            assert until_done(ws)[-1]["type"] == "Completed"
        assert resource(server, "tester")["botVersion"] == v1_hash and resource(server, "plain")["botVersion"] == v2_hash
        samples = {(s.name, frozenset(s.labels.items())): s.value
                   for family in prom_parser.text_string_to_metric_families(server.get("/metrics").text)
                   for s in family.samples}
    for content, price in ((v1_hash, 1.0), (v2_hash, 3.0)):
        labels = frozenset({"bot": "shop", "bot_version": content}.items())
        assert samples[("chatrun_version_cost_total", labels)] == pytest.approx((1000 * price + 500 * 2.0) / 1e6)
        assert samples[("chatrun_version_turns_total", labels | {("outcome", "ok")})] == 1
    agents = [s for s in spans.get_finished_spans() if s.name == "invoke_agent shop"]
    assert sorted(s.attributes["gen_ai.agent.version"] for s in agents) == sorted([v1_hash, v2_hash])
    lines = {r.chatrun["session"]: r for r in caplog.records if r.name == "chatrun.turns"}
    assert lines["tester"].chatrun["bot_version"] == v1_hash and lines["plain"].chatrun["bot_version"] == v2_hash
    assert f"bot_version={v1_hash}" in lines["tester"].getMessage()
