"""The format's own version (issue 23): `format:`, the previous version's meaning kept and
warned about, `chatrun upgrade`; `chatrun validate --against` and `chatrun diff` on the two
versions of bots/shop, with sessions stored in a real SQLite file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chat_support import call
from chatrun.cli import main
from chatrun.definition.loader import check_bot

REPO = Path(__file__).resolve().parents[1]
SHOP = REPO / "bots" / "shop" / "versions"
V1, V2 = SHOP / "1", SHOP / "2"
UPGRADE = REPO / "tests" / "fixtures" / "upgrade"

NICKNAME_BOT = """\
name: nick
{format}model: {{provider: scripted, name: gpt-4o-mini}}
state: {{nickname: anon}}
routes:
  main: {{default: true, system: Hi., tools: [rename]}}
tools:
  rename:
    description: Set the nickname
    parameters: {{type: object, properties: {{nickname: {{type: string}}}}}}
    action:
      set: {{state.nickname: "{{{{ args.nickname }}}}"}}
"""


def cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


# -- the format version: warnings and the old meaning ------------------------------------------


def nickname_after_a_call_without_one(path: Path) -> object:
    bot = chatrun.load_bot(path)
    session = bot.session(model=chatrun.ScriptedModel([call("rename"), "done"]))
    events = session.chat("forget my nickname")
    assert not [e for e in events if e.type == "Error"]
    return session.state["nickname"]


def test_format_1_keeps_its_meaning_none_assigns_none_and_format_2_assigns_nothing(write_bot):
    old = write_bot(NICKNAME_BOT.format(format="format: 1\n"), name="old.yaml")
    new = write_bot(NICKNAME_BOT.format(format="format: 3\n"), name="new.yaml")
    assert nickname_after_a_call_without_one(old) is None
    assert nickname_after_a_call_without_one(new) == "anon"


def test_formats_1_and_2_are_warned_about_at_their_line_and_format_3_is_clean(write_bot):
    _, found = check_bot(write_bot(NICKNAME_BOT.format(format="format: 1\n"), name="old.yaml"))
    assert [(d.line, d.severity) for d in found] == [(2, "warning")]
    assert "format 1 is an earlier version and keeps its meaning" in found[0].message
    assert "assigns nothing (format 1: it assigns None)" in found[0].message
    _, found = check_bot(write_bot(NICKNAME_BOT.format(format="format: 2\n"), name="two.yaml"))
    assert [(d.line, d.severity) for d in found] == [(2, "warning")]  # one warning for the file
    assert "format 2 is an earlier version" in found[0].message and "chatrun upgrade" in found[0].message
    _, found = check_bot(write_bot(NICKNAME_BOT.format(format="format: 3\n"), name="new.yaml"))
    assert found == []


def test_a_bot_without_format_is_warned_at_its_first_set_template(write_bot):
    path = write_bot(NICKNAME_BOT.format(format=""))
    _, found = check_bot(path)
    assert [(d.file, d.line, d.severity) for d in found] == [(str(path), 10, "warning")]
    assert "declares no `format:`" in found[0].message and "chatrun upgrade" in found[0].message
    assert nickname_after_a_call_without_one(path) == "anon"  # read as the current format
    # a bot with nothing whose meaning depends on the version gets no warning
    assert check_bot(write_bot("name: x\nroutes: {main: {default: true, system: Hi.}}\n", name="x.yaml"))[1] == []


def test_an_unknown_format_is_an_error_at_its_line(write_bot):
    _, found = check_bot(write_bot("name: x\nformat: 4\nroutes: {main: {default: true, system: Hi.}}\n"))
    assert [(d.line, d.severity) for d in found] == [(2, "error")]


@pytest.mark.parametrize("value, message", [
    ("4", "`format` must be one of 1, 2, 3 (got `4`)"),
    ('"two"', "`format` must be an integer, not a string"),
    ("2.5", "`format` must be an integer, not a number"),
    ("true", "`format` must be an integer, not a boolean"),
])
def test_a_format_that_is_none_of_the_versions_is_one_error_naming_them(write_bot, value, message):
    path = write_bot(NICKNAME_BOT.format(format=f"format: {value}\n"))
    _, found = check_bot(path)
    assert [(d.line, d.severity, d.message) for d in found] == [(2, "error", message)]


# -- chatrun upgrade ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["format1", "unversioned"])
def test_upgrade_changes_one_line_and_keeps_every_other_byte(tmp_path, name):
    bot = tmp_path / "bot.yaml"
    shutil.copy(UPGRADE / f"{name}.yaml", bot)
    result = cli("upgrade", tmp_path)
    assert result.exit_code == 0, result.output
    assert bot.read_bytes() == (UPGRADE / f"{name}.upgraded.yaml").read_bytes()
    assert check_bot(tmp_path)[1] == []  # upgraded: no format warning left
    again = cli("upgrade", "--check", tmp_path)
    assert again.exit_code == 0 and again.output == f"{bot}: already on the current format\n"


def test_upgrade_says_what_it_changed_and_which_set_to_review(tmp_path):
    bot = tmp_path / "bot.yaml"
    shutil.copy(UPGRADE / "format1.yaml", bot)
    result = cli("upgrade", tmp_path)
    lines = result.output.splitlines()
    assert lines[0] == f"{bot}:4: `format: 1` is now `format: 3`"
    assert lines[1].startswith(f"{bot}:21:")  # the action holding the set and "review `set state.nickname` of tool `rename`" in lines[1]


def test_upgrade_check_writes_nothing_and_fails_for_ci(tmp_path):
    bot = tmp_path / "bot.yaml"
    shutil.copy(UPGRADE / "unversioned.yaml", bot)
    result = cli("upgrade", "--check", tmp_path)
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == f"{bot}:5: added `format: 3`"  # under `name:`
    assert bot.read_bytes() == (UPGRADE / "unversioned.yaml").read_bytes()


def test_upgrade_of_something_that_is_not_a_bot_exits_2_without_a_traceback(tmp_path):
    (tmp_path / "bot.yaml").write_text("- a list\n")
    result = cli("upgrade", tmp_path)
    assert result.exit_code == 2 and "not a YAML mapping" in result.output
    assert "Traceback" not in result.output


def test_upgrade_of_a_bot_in_versions_upgrades_each_version_and_goes_on_after_an_error(tmp_path):
    """bots/shop's layout: versions/1 of format 1, versions/2 unreadable, versions/10 without
    `format:` — 1 and 10 are upgraded (in order: 10 after 2), the error is printed, exit 2."""
    shop = tmp_path / "shop"
    shutil.copytree(REPO / "bots" / "shop", shop)
    shutil.copy(UPGRADE / "format1.yaml", shop / "versions" / "1" / "bot.yaml")
    (shop / "versions" / "2" / "bot.yaml").write_text("- a list\n")
    (shop / "versions" / "10").mkdir()
    shutil.copy(UPGRADE / "unversioned.yaml", shop / "versions" / "10" / "bot.yaml")
    result = cli("upgrade", shop)
    assert result.exit_code == 2 and "Traceback" not in result.output
    out = result.output.splitlines()
    touched = [line.split(":")[0] for line in out if "format: 3" in line]
    assert touched == [str(shop / "versions" / v / "bot.yaml") for v in ("1", "10")]
    assert any(line.startswith(str(shop / "versions" / "2" / "bot.yaml")) and "not a YAML mapping" in line
               for line in out)
    assert out[-1] == "1 bot(s) could not be upgraded (above)"
    assert (shop / "versions" / "1" / "bot.yaml").read_bytes() == (UPGRADE / "format1.upgraded.yaml").read_bytes()
    assert (shop / "versions" / "10" / "bot.yaml").read_bytes() == (UPGRADE / "unversioned.upgraded.yaml").read_bytes()
    shutil.copy(V2 / "bot.yaml", shop / "versions" / "2" / "bot.yaml")
    again = cli("upgrade", "--check", shop)
    assert again.exit_code == 0, again.output
    assert again.output.count("already on the current format") == 3


# -- validate --against ---------------------------------------------------------------------------


def test_validate_against_the_old_version_is_clean_for_the_shop():
    result = cli("validate", V2, "--against", V1)
    assert result.exit_code == 0, result.output
    assert result.output == f"{V2}: valid\n"


def test_validate_against_names_each_wrong_name_at_its_line(tmp_path):
    text = (V2 / "bot.yaml").read_text()
    text = (text.replace("routes: {checkout: payment}", "routes: {checkout: payment, chekout: payment}")
            .replace("rename: {email: contact.email}", "rename: {emial: contact.email}")
            .replace("tools: {add_item: add_to_basket}", "tools: {add_itme: add_to_basket}")
            .replace("    scopes: {gift_wrap: drop}", "    scopes: {}"))
    new = tmp_path / "bot.yaml"
    new.write_text(text)
    line = {needle: text[:text.index(needle)].count("\n") + 1 for needle in ("chekout", "emial", "add_itme")}
    result = cli("validate", tmp_path, "--against", V1)
    assert result.exit_code == 1
    out = result.output.splitlines()
    assert f"{new}:{line['chekout']}:" in "\n".join(o for o in out if "route `chekout`" in o)
    assert any(o.startswith(f"{new}:{line['emial']}:") and "renames `emial`" in o for o in out)
    assert any(o.startswith(f"{new}:{line['add_itme']}:") and "did you mean `add_item`?" in o for o in out)
    removed = [o for o in out if "route `gift_wrap` is removed" in o]
    assert len(removed) == 1 and removed[0].startswith(f"{V1 / 'bot.yaml'}:20:")  # where the old route was


def test_a_migration_naming_what_the_new_version_lacks_is_an_error_alone(tmp_path):
    text = (V2 / "bot.yaml").read_text().replace("checkout: payment}", "checkout: paymnt}")
    (tmp_path / "bot.yaml").write_text(text)
    _, found = check_bot(tmp_path)
    assert [d.message for d in found if d.severity == "error"] == [
        "migration maps route `checkout` to `paymnt`, which this version does not define; did you mean `payment`?"]


def test_a_migration_writing_state_this_version_does_not_declare_is_an_error_at_its_line(tmp_path):
    """The new side of a migration's state paths: a rename's target and a `default:` must be
    declared (by `state:` or a route's `scope:`, as deep as the declaration goes); a drop of a
    key this version still declares is a warning (the key comes back with its default)."""
    text = (V2 / "bot.yaml").read_text()
    text = (text.replace("rename: {email: contact.email}", "rename: {email: contcat.emial, scope.ribbon: scope.colour}")
            .replace("default: {currency: GBP}", "default: {contact.emial: x, currency: GBP}\n      drop: [cart]"))
    (tmp_path / "bot.yaml").write_text(text)
    line = {needle: text[:text.index(needle)].count("\n") + 1 for needle in ("contcat", "contact.emial", "drop:")}
    _, found = check_bot(tmp_path)
    shown = sorted((d.line, d.severity, d.message) for d in found if "migration" in d.message)
    assert shown == sorted([
        (line["contcat"], "error", "migration moves a value to `state.contcat.emial`, which this version does not "
                                   "declare; did you mean `contact`?"),
        (line["contcat"], "error", "migration moves a value to `scope.colour`, which this version does not declare"),
        (line["contact.emial"], "error", "migration gives a default to `state.contact.emial`, which this version does "
                                         "not declare (`state.contact` has no `emial`; did you mean `email`?)"),
        (line["drop:"], "warning", "migration drops `state.cart`, which this version still declares: a migrated "
                                   "session gets it back with its default; to keep it, remove the drop"),
    ])
    result = cli("validate", tmp_path, "--against", V1)  # the CLI says where, as file:line
    assert result.exit_code == 1 and f"{tmp_path / 'bot.yaml'}:{line['contcat']}:" in result.output


def test_a_chain_may_write_an_intermediate_versions_key_that_a_later_link_renames(tmp_path):
    text = (V2 / "bot.yaml").read_text().replace(
        "      add_to_basket: {rename: {sku: product}, default: {quantity: 1}}\n",
        "      add_to_basket: {rename: {sku: product}, default: {quantity: 1}}\n"
        "  - from: \"1.5\"\n    state: {rename: {mail: contact.email}}\n").replace(
        "rename: {email: contact.email}", "rename: {email: mail}")
    (tmp_path / "bot.yaml").write_text(text)
    _, found = check_bot(tmp_path)
    assert [d.message for d in found if "migration" in d.message] == []


# -- chatrun diff ---------------------------------------------------------------------------------


def v1_sessions(db: Path) -> dict[str, str]:
    """Sessions of version 1 left where a deploy finds them: browsing, wrapping a gift, at the checkout."""
    store = chatrun.SQLiteStore(str(db))
    bot = chatrun.load_bot(V1, store=store)
    scripts = {
        "browsing": [("add T1", [call("add_item", sku="T1"), "ok"])],
        "wrapping": [("wrap it", [call("wrap_gift"), "Which ribbon?"])],
        "paying": [("mail a@b.c", [call("save_email", email="a@b.c"), call("checkout"), "Pay?"])],
    }
    ids = {}
    for name, turns in scripts.items():
        session = bot.session(model=chatrun.ScriptedModel([a for _, answers in turns for a in answers]))
        for text, _ in turns:
            session.chat(text)
        ids[name] = session.id
    return ids


def test_diff_of_the_shop_lists_breaking_changes_all_migrated_and_exits_0():
    result = cli("diff", V1, V2)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "migrated  route checkout: renamed to payment (by migration 1 at " in "\n".join(lines)
    assert any(line.startswith("migrated  parameter add_to_basket.sku: removed") for line in lines)
    assert lines[-1] == "13 change(s), 9 breaking, 0 not handled by a migration"


def test_diff_without_the_migration_exits_1_and_json_says_why(tmp_path):
    text = (V2 / "bot.yaml").read_text()
    start, end = text.index("migrations:"), text.index("routes:\n  browse:")
    (tmp_path / "bot.yaml").write_text(text[:start] + text[end:])
    result = cli("diff", V1, tmp_path, "--json")
    assert result.exit_code == 1
    report = json.loads(result.output)
    unhandled = {(c["kind"], c["name"]) for c in report["changes"] if c["breaking"] and not c["migrated"]}
    assert unhandled >= {("route", "checkout"), ("route", "gift_wrap"), ("state", "state.email"),
                         ("requires", "checkout: state.contact.email")}
    assert report["unhandled"] == len(unhandled)


def test_diff_counts_the_stored_sessions_each_change_touches(tmp_path):
    db = tmp_path / "sessions.db"
    v1_sessions(db)
    result = cli("diff", V1, V2, "--store", f"sqlite:///{db}", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    counts = {(c["kind"], c["name"]): c["sessions"] for c in report["changes"]}
    assert report["sessions"] == 3
    assert counts[("route", "checkout")] == 1  # the session at the checkout
    assert counts[("route", "gift_wrap")] == 1  # the one wrapping a gift
    assert counts[("scope", "scope.ribbon")] == 1
    assert counts[("state", "state.email")] == 3  # every session holds the key
    assert counts[("tool", "add_item")] == 1  # only the browsing session called it
    assert counts[("parameter", "add_to_basket.sku")] == 1
    assert counts[("route", "payment")] == 0 if ("route", "payment") in counts else True
    text = cli("diff", V1, V2, "--store", f"sqlite:///{db}").output
    v1 = chatrun.load_bot(V1).config.content_version
    assert "[1 session]" in text and text.splitlines()[-1].endswith(f"; 3 sessions stored on version 1 ({v1})")


def test_diff_counts_only_the_sessions_on_the_old_version_and_the_unversioned_apart(tmp_path):
    """Beside the three sessions of version 1: two of version 2 (not counted: a change from 1
    to 2 does not touch them) and one stored before versions were recorded (no bot_version:
    counted apart, and the summary says so)."""
    db = tmp_path / "sessions.db"
    ids = v1_sessions(db)
    store = chatrun.SQLiteStore(str(db))
    v2 = chatrun.load_bot(V2, store=store)
    for _ in range(2):
        v2.session(model=chatrun.ScriptedModel(["Hello."])).chat("hi")
    old = store.load_session(ids["paying"])
    assert old is not None and old.pop("bot_version") == chatrun.load_bot(V1).config.content_version
    store.commit_turn("from-before-versions", old, {}, [])
    store.close()

    result = cli("diff", V1, V2, "--store", f"sqlite:///{db}", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["sessions"] == 3
    assert report["stored"] == {"old_version": 3, "unversioned": 1, "other_versions": 2}
    counts = {(c["kind"], c["name"]): (c["sessions"], c["unversioned"]) for c in report["changes"]}
    assert counts[("state", "state.email")] == (3, 1)  # version 2's sessions hold no `email`, and are not counted
    assert counts[("route", "checkout")] == (1, 1)  # the unversioned copy of the session at the checkout
    assert counts[("route", "gift_wrap")] == (1, 0)
    text = cli("diff", V1, V2, "--store", f"sqlite:///{db}").output
    assert "route checkout: renamed to payment" in text and "[1 session, 1 unversioned]" in text
    assert text.splitlines()[-1].endswith(
        "; 3 sessions stored on version 1 (" + report["old_version"] + "); 1 session with no version recorded "
        "(stored before versions), counted apart as `unversioned`; 2 sessions on other versions, not counted")


def changes_of(result) -> list[tuple]:
    assert result.exit_code == 0, result.output
    return [(c["kind"], c["name"], c["what"], c["breaking"], c["migrated"] is not None)
            for c in json.loads(result.output)["changes"]]


def test_diff_takes_two_versions_of_a_bot_folder_by_label_or_hash():
    by_path = changes_of(cli("diff", V1, V2, "--json"))
    assert by_path and by_path == changes_of(cli("diff", "1", "2", "--bot", REPO / "bots" / "shop", "--json"))
    v1 = chatrun.load_bot(V1).config.content_version
    assert changes_of(cli("diff", v1[:8], "2", "--bot", REPO / "bots" / "shop", "--json")) == by_path
    missing = cli("diff", "1", "3", "--bot", REPO / "bots" / "shop")
    assert missing.exit_code == 2 and "no version '3' in versions/ (there are: 1, 2)" in missing.output
    alone = cli("diff", "1", "2")
    assert alone.exit_code == 2 and "1: error: no such bot folder or file; to name a version, give --bot" in alone.output


def test_diff_takes_two_versions_kept_in_a_store(tmp_path):
    """The versions a server put in the store when it started (content-addressed records), by
    label or content hash, fetched as a replica fetches them; counted against the sessions."""
    from fastapi.testclient import TestClient

    from server_support import app_for_testclient

    shop = tmp_path / "shop"
    shutil.copytree(REPO / "bots" / "shop", shop)
    db = tmp_path / "sessions.db"
    with TestClient(app_for_testclient(str(shop), f"sqlite:///{db}")):
        pass  # serving publishes both versions' files
    v1_sessions(db)
    shutil.rmtree(shop)  # the folders are gone: only the store has the versions
    url = f"sqlite:///{db}"
    by_path = changes_of(cli("diff", V1, V2, "--json"))
    by_label = cli("diff", "1", "2", "--store", url, "--bot", "shop", "--json")
    assert changes_of(by_label) == by_path and json.loads(by_label.output)["sessions"] == 3
    v1, v2 = (chatrun.load_bot(v).config.content_version for v in (V1, V2))
    assert json.loads(by_label.output)["old_version"] == v1
    assert changes_of(cli("diff", v1, v2[:6], "--store", url, "--json")) == by_path  # one bot kept: no --bot needed
    text = cli("diff", v1, V2, "--store", url).output  # a kept version against a folder
    assert text.splitlines()[-1].endswith(f"; 3 sessions stored on version 1 ({v1})")
    missing = cli("diff", "9", "2", "--store", url, "--bot", "shop")
    assert missing.exit_code == 2
    assert f"bot shop has no version '9' kept in the store (it keeps: 1 ({v1}), 2 ({v2}))" in missing.output


def test_diff_errors_exit_2_naming_the_place(tmp_path):
    (tmp_path / "bot.yaml").write_text("name: broken\nroutes: {main: {default: true, tools: [nope]}}\n")
    result = cli("diff", V1, tmp_path)
    assert result.exit_code == 2
    assert f"{tmp_path / 'bot.yaml'}:2:" in result.output
    result = cli("diff", V1, V2, "--store", "mongodb://nowhere")  # postgres:// is a store since issue 38
    assert result.exit_code == 2 and "unknown store URL" in result.output


def test_validate_on_a_folder_of_versions_checks_each_against_the_one_before(tmp_path):
    shutil.copytree(REPO / "bots" / "shop", tmp_path / "shop")
    for extra in ("3", "10"):  # in order by number: 2 before 10
        shutil.copytree(tmp_path / "shop" / "versions" / "2", tmp_path / "shop" / "versions" / extra)
    ten = tmp_path / "shop" / "versions" / "10" / "bot.yaml"
    ten.write_text(ten.read_text().replace("  payment:\n", "  pay_desk:\n").replace("route: payment", "route: pay_desk")
                   .replace("{checkout: payment}", "{checkout: pay_desk}"))
    result = cli("validate", tmp_path / "shop")
    out = result.output.splitlines()
    assert [line.split(":")[0] for line in out if line.endswith(": valid") or "valid (" in line] == [
        str(tmp_path / "shop" / "versions" / v) for v in ("1", "2", "3", "10")]
    # 10 renames `payment` without a migration from 3: its removal is reported at version 3's line
    removed = [line for line in out if "route `payment` is removed" in line]
    assert len(removed) == 1 and removed[0].startswith(str(tmp_path / "shop" / "versions" / "3" / "bot.yaml"))
    assert result.exit_code == 0 and out[-1] == "4 bots checked, 0 invalid: 0 errors, 1 warning"


@pytest.mark.slow
def test_diff_counts_sessions_kept_in_redis(tmp_path, redis_server):
    """The same three sessions, copied from the SQLite file the engine wrote into a real Redis
    through the store's own commit: the counts are the same."""
    import asyncio

    from chatrun.definition.versions import bot_files, content_version
    from chatrun.server.versions import record_key
    from chatrun.store.aio import open_async_store
    from chatrun.store.record import Commit, memory_ids_of
    from chatrun.store.versions import CREATE

    db = tmp_path / "sessions.db"
    ids = v1_sessions(db)
    sqlite = chatrun.SQLiteStore(str(db))
    url = redis_server.url()

    async def copy() -> None:
        redis = open_async_store(url)
        for sid in ids.values():
            snapshot = sqlite.load_session(sid)
            memories = {mid: sqlite.get_messages(mid) for mid in memory_ids_of(snapshot)}
            await redis.commit_turn(Commit.encode(sid, snapshot, memories, [], expected=CREATE), None)
        for label, folder in (("1", V1), ("2", V2)):  # the versions, as a replica publishes them
            files = bot_files(folder)
            await redis.put_record(record_key("shop", content_version(files)),
                                   {"bot": "shop", "label": label, "files": files, "published": float(label)})
        await redis.put_record(record_key("sh*p", "0123456789ab"), {"bot": "sh*p", "label": "x", "files": {}})
        assert await redis.record_keys("bot-version:sh*p:") == ["bot-version:sh*p:0123456789ab"]  # `*` is no glob
        await redis.close()

    asyncio.run(copy())
    from_sqlite = json.loads(cli("diff", V1, V2, "--store", f"sqlite:///{db}", "--json").output)
    result = cli("diff", V1, V2, "--store", url, "--json")
    assert result.exit_code == 0, result.output
    from_redis = json.loads(result.output)
    assert from_redis["sessions"] == 3
    assert [c["sessions"] for c in from_redis["changes"]] == [c["sessions"] for c in from_sqlite["changes"]]
    kept = cli("diff", "1", "2", "--store", url, "--bot", "shop", "--json")  # listed by SCAN, glob-safe
    assert changes_of(kept) == changes_of(cli("diff", V1, V2, "--json"))
