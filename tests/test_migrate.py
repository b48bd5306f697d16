"""Declarative migrations (issue 23): sessions of bots/shop version 1, run for real and
stored in SQLite, moved to version 2 by `migrate_snapshot`, then continued on version 2."""

from __future__ import annotations

from pathlib import Path

import chatrun
from chat_support import call
from chatrun.engine.migrate import migrate_snapshot
from chatrun.store.record import memory_ids_of

SHOP = Path(__file__).resolve().parents[1] / "bots" / "shop" / "versions"
V1, V2 = SHOP / "1", SHOP / "2"


def stored(store, session_id):
    snapshot = store.load_session(session_id)
    return snapshot, {mid: store.get_messages(mid) for mid in memory_ids_of(snapshot)}


def run_v1(store, *answers_and_inputs, folder=V1):
    """A version 1 session (of `folder`): each (input, answers) pair is one turn."""
    bot = chatrun.load_bot(folder, store=store)
    model = chatrun.ScriptedModel([a for _, answers in answers_and_inputs for a in answers])
    session = bot.session(model=model)
    for text, _ in answers_and_inputs:
        session.chat(text)
    return bot, session.id


def write_back(store, session_id, result, before):
    """What the server's migrate policy does with a result: store it, delete dropped memories."""
    memories = {mid: None for mid in set(before) - set(result.memories)} | dict(result.memories)
    store.commit_turn(session_id, result.snapshot, memories, [])


def test_a_session_wrapping_a_gift_moves_to_version_2_and_goes_on(tmp_path):
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    v1, sid = run_v1(store, ("add T1", [call("add_item", sku="T1"), "ok"]),
                     ("mail a@b.c", [call("save_email", email="a@b.c"), "ok"]),
                     ("wrap it", [call("wrap_gift"), "Which ribbon?"]))
    snapshot, memories = stored(store, sid)
    assert [s["route"] for s in snapshot["scopes"]] == ["browse", "gift_wrap"]
    before = copy_of(snapshot)
    v2 = chatrun.load_bot(V2, store=store)

    result = migrate_snapshot(snapshot, v1.config, v2.config, memories)

    assert snapshot == before  # pure: the input is untouched
    assert result.snapshot["state"] == {"cart": ["T1"], "contact": {"email": "a@b.c"}, "currency": "GBP"}
    assert [s["route"] for s in result.snapshot["scopes"]] == ["browse"]  # gift_wrap: drop
    assert result.unmapped_routes == [] and result.applied == [0]
    (root_memory,) = result.memories
    names = [c.name for m in result.memories[root_memory] for c in getattr(m, "tool_calls", ())]
    assert names == ["add_to_basket", "save_email", "wrap_gift"]
    assert any("gift_wrap" in n and "dropped" in n for n in result.notes)
    assert any("state.email renamed to state.contact.email" in n for n in result.notes)

    write_back(store, sid, result, memories)
    model = chatrun.ScriptedModel([call("add_to_basket", product="T2", quantity=2), call("checkout"), "Pay now?"])
    session = v2.session(model=model, session_id=sid)
    events = session.chat("two T2 and check out")
    assert not [e for e in events if e.type == "Error"]
    assert session.state["cart"] == ["T1", "2 x T2"] and session.route == "payment"
    # the model saw the renamed tool's old call next to its result, under the new name
    sent = model.requests[0].messages
    assert [c.name for m in sent for c in getattr(m, "tool_calls", ())][0] == "add_to_basket"


def test_a_session_at_the_checkout_continues_on_the_renamed_route_with_its_memory(tmp_path):
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    v1, sid = run_v1(store, ("mail a@b.c", [call("save_email", email="a@b.c"), call("checkout"), "Pay?"]))
    snapshot, memories = stored(store, sid)
    assert snapshot["scopes"][0]["route"] == "checkout"
    v2 = chatrun.load_bot(V2, store=store)
    result = migrate_snapshot(snapshot, v1.config, v2.config, memories)
    scope = result.snapshot["scopes"][0]
    assert scope["route"] == "payment"
    assert set(result.memories) == {f"{scope['id']}#{r}" for r in scope["memory_routes"]}
    write_back(store, sid, result, memories)
    session = v2.session(model=chatrun.ScriptedModel([call("pay")]), session_id=sid)
    events = session.chat("yes")
    assert [e.data for e in events if e.type == "Message"][-1] == "Paid. Thank you!"


def test_a_removed_route_no_migration_maps_is_reported_not_failed(tmp_path):
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    v1, sid = run_v1(store, ("wrap it", [call("wrap_gift"), "Which ribbon?"]))
    snapshot, memories = stored(store, sid)
    v2 = chatrun.load_bot(V2, store=store)
    v2.config.migrations[0].scopes = {}
    result = migrate_snapshot(snapshot, v1.config, v2.config, memories)
    assert result.unmapped_routes == ["gift_wrap"]
    assert [s["route"] for s in result.snapshot["scopes"]] == ["browse", "gift_wrap"]


def test_a_migration_from_another_version_does_not_apply(tmp_path):
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    v1, sid = run_v1(store, ("mail a@b.c", [call("save_email", email="a@b.c"), "ok"]))
    snapshot, memories = stored(store, sid)
    v2 = chatrun.load_bot(V2, store=store)
    v2.config.migrations[0].from_version = "0.9"
    result = migrate_snapshot(snapshot, v1.config, v2.config, memories)
    assert result.applied == [] and result.snapshot["state"]["email"] == "a@b.c"
    # what the new version declares still arrives with its YAML value
    assert result.snapshot["state"]["contact"] == {"email": None}


def copy_of(value):
    import copy
    return copy.deepcopy(value)


OLD_DESK = """\
name: desk
format: 3
version: "1"
state: {topic: null}
routes:
  main: {default: true, system: Hi., tools: [ask, note]}
  helper:
    system: Help.
    scope: {local: {draft: ""}}
tools:
  ask: {description: Ask the helper, action: {call: helper}}
  note:
    description: Note the topic
    parameters: {type: object, properties: {topic: {type: string}}}
    action: {set: {state.topic: "{{ args.topic }}"}}
"""

NEW_DESK = """\
name: desk
format: 3
version: "2"
state: {subject: null}
migrations:
  - from: "1"
    scopes: {helper: SCOPES}
    state: {rename: {topic: subject}}
routes:
  main: {default: true, system: Hi., tools: [note]}
tools:
  note:
    description: Note the subject
    parameters: {type: object, properties: {subject: {type: string}}}
    action: {set: {state.subject: "{{ args.subject }}"}}
"""


def desk_session_inside_a_call(tmp_path, write_bot, how: str):
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    old = chatrun.load_bot(write_bot(OLD_DESK, name="old.yaml"), store=store)
    new = chatrun.load_bot(write_bot(NEW_DESK.replace("SCOPES", how), name="new.yaml"), store=store)
    session = old.session(model=chatrun.ScriptedModel([call("note", topic="tea"), call("ask"), "What do you need?"]))
    session.chat("about tea; ask the helper")
    assert session.stack == ["main", "helper"]
    snapshot, memories = stored(store, session.id)
    return store, old, new, session.id, snapshot, memories


def test_dropping_a_called_scope_answers_the_call_waiting_for_it(tmp_path, write_bot):
    store, old, new, sid, snapshot, memories = desk_session_inside_a_call(tmp_path, write_bot, "drop")
    result = migrate_snapshot(snapshot, old.config, new.config, memories)
    assert [s["route"] for s in result.snapshot["scopes"]] == ["main"]
    assert result.snapshot["state"] == {"subject": "tea"}
    (messages,) = result.memories.values()
    assert messages[-1].role == "tool" and "helper ended when the bot changed" in messages[-1].content
    write_back(store, sid, result, memories)
    model = chatrun.ScriptedModel(["Back on the main desk."])
    events = new.session(model=model, session_id=sid).chat("hello?")
    assert not [e for e in events if e.type == "Error"]
    sent = model.requests[0].messages
    calls = {c.id for m in sent for c in getattr(m, "tool_calls", ())}
    answered = {m.tool_call_id for m in sent if m.role == "tool"}
    assert calls and calls <= answered  # every call the model sees has its result


def test_resetting_a_scope_puts_it_on_the_default_route_cleared(tmp_path, write_bot):
    _, old, new, _, snapshot, memories = desk_session_inside_a_call(tmp_path, write_bot, "reset")
    result = migrate_snapshot(snapshot, old.config, new.config, memories)
    scopes = result.snapshot["scopes"]
    assert [s["route"] for s in scopes] == ["main", "main"]
    assert scopes[1]["local"] == {} and scopes[1]["memory_routes"] == [] and "caller" not in scopes[1]
    assert any("reset to `main`" in n for n in result.notes)


def test_scope_fields_are_renamed_in_every_scope_that_holds_them(tmp_path, write_bot):
    _, old, new, _, snapshot, memories = desk_session_inside_a_call(tmp_path, write_bot, "drop")
    new.config.migrations[0].scopes = {}
    new.config.migrations[0].state.rename = {"scope.draft": "scope.text"}
    new.config.migrations[0].state.drop = ["topic"]
    result = migrate_snapshot(snapshot, old.config, new.config, memories)
    helper = result.snapshot["scopes"][1]
    assert helper["local"] == {"text": ""} and result.snapshot["state"] == {"subject": None}
    assert result.unmapped_routes == ["helper"]


def test_a_state_key_moved_into_scope_state_lands_where_every_scope_sees_it(tmp_path, write_bot):
    _, old, new, sid, snapshot, memories = desk_session_inside_a_call(tmp_path, write_bot, "drop")
    new.config.migrations[0].state.rename = {"topic": "scope.topic"}
    result = migrate_snapshot(snapshot, old.config, new.config, memories)
    (root,) = result.snapshot["scopes"]
    assert root["shared"] == {"topic": "tea"} and result.snapshot["state"] == {"subject": None}


def test_migrations_chain_a_session_of_version_1_through_2_to_3(tmp_path):
    text = (V2 / "bot.yaml").read_text()
    text = (text.replace('version: "2"', 'version: "3"').replace("  payment:\n", "  pay_desk:\n")
            .replace("route: payment", "route: pay_desk")
            .replace("routes:\n  browse:", '  - from: "2"\n    routes: {payment: pay_desk}\nroutes:\n  browse:'))
    (tmp_path / "bot.yaml").write_text(text)
    v3 = chatrun.load_bot(tmp_path)  # valid: `payment`, the first link's target, is renamed by the second
    for old in (V1, V2):
        assert check_bot_against(old, tmp_path) == []
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    v1, sid = run_v1(store, ("mail a@b.c", [call("save_email", email="a@b.c"), call("checkout"), "Pay?"]))
    snapshot, memories = stored(store, sid)
    result = migrate_snapshot(snapshot, v1.config, v3.config, memories)
    assert result.applied == [0, 1]
    assert result.snapshot["scopes"][0]["route"] == "pay_desk"
    assert result.snapshot["state"]["contact"] == {"email": "a@b.c"}
    v2 = chatrun.load_bot(V2)
    from_2 = migrate_snapshot(migrate_snapshot(snapshot, v1.config, v2.config, memories).snapshot,
                              v2.config, v3.config, {})
    assert from_2.applied == [1] and from_2.snapshot["scopes"][0]["route"] == "pay_desk"


def check_bot_against(old, new):
    from chatrun.definition.loader import load_config
    from chatrun.definition.migrations import against_diagnostics

    return [d.format() for d in against_diagnostics(load_config(old)[0], load_config(new)[0])]


def test_a_dropped_scope_field_is_gone_from_every_scope_and_the_renamed_one_keeps_its_value(tmp_path):
    """Version 1b keeps gift wrapping but calls the ribbon a `colour` and forgets the old
    `scope.note`: a session half-way through choosing (blue) keeps blue under its new name,
    loses the note, and goes on choosing on the new version."""
    text = (V1 / "bot.yaml").read_text().replace("local: {ribbon: red}", "local: {ribbon: red, note: ''}")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "bot.yaml").write_text(text)
    new_text = (text.replace('version: "1"', 'version: "1b"')
                .replace("local: {ribbon: red, note: ''}", "local: {colour: red}")
                .replace("scope.ribbon", "scope.colour").replace("({{ scope.ribbon }}", "({{ scope.colour }}")
                .replace("routes:\n  browse:", 'migrations:\n  - from: "1"\n    state:\n'
                         '      rename: {scope.ribbon: scope.colour}\n      drop: [scope.note]\nroutes:\n  browse:'))
    assert "ribbon }}" not in new_text.replace("{{ scope.colour }}", "")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "bot.yaml").write_text(new_text)
    store = chatrun.SQLiteStore(str(tmp_path / "s.db"))
    v1, sid = run_v1(store, ("wrap it", [call("wrap_gift")]),
                     ("blue", [call("choose_ribbon", colour="blue"), "Blue it is."]), folder=tmp_path / "old")
    snapshot, memories = stored(store, sid)
    snapshot["scopes"][1]["local"]["note"] = "for grandma"  # as a handler would have set it
    assert snapshot["scopes"][1]["local"] == {"ribbon": "blue", "note": "for grandma"}
    new = chatrun.load_bot(tmp_path / "new", store=store)
    assert check_bot_against(tmp_path / "old", tmp_path / "new") == []

    result = migrate_snapshot(snapshot, v1.config, new.config, memories)

    assert [s["local"] for s in result.snapshot["scopes"]] == [{}, {"colour": "blue"}]
    assert any("scope.note dropped" in n for n in result.notes)
    write_back(store, sid, result, memories)
    model = chatrun.ScriptedModel([call("wrapped"), "Wrapped in blue."])
    session = new.session(model=model, session_id=sid)
    events = session.chat("done")
    assert not [e for e in events if e.type == "Error"]
    assert session.stack == ["browse"]
    # the new version's template (the route's context) read the renamed field
    assert model.requests[0].messages[-1].content == "The ribbon so far: blue."
