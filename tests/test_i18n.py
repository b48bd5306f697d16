"""Locales and text catalogs (docs/i18n.md): the checks `chatrun validate` makes at file:line,
`t()` with plural rules and placeholders, the session's locale (client, Accept-Language,
`state.locale`), the REPL's `/locale`, and `chatrun test --locale` on the bakery bot."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import chatrun
from chatrun.cli import main
from chatrun.definition.catalogs import Catalogs, plural_category, preferred_tags
from chatrun.definition.loader import check_bot
from chatrun.models.scripted import ScriptedModel

BAKERY = Path(__file__).resolve().parents[1] / "bots" / "bakery"

BOT = """\
name: desk
locales: [en, de]
routes:
  main:
    default: true
    system: "{{ t('prompt') }}"
    tools: [hello, bye]
tools:
  hello:
    action: {message: "{{ t('hello', name=state.name) }}"}
  bye:
    action: {message: Goodbye!, end: true}
state: {name: Ana}
"""


def _bot(tmp_path: Path, en: str, de: str, bot: str = BOT) -> Path:
    (tmp_path / "locales").mkdir()
    (tmp_path / "bot.yaml").write_text(bot)
    (tmp_path / "locales" / "en.yaml").write_text(textwrap.dedent(en))
    (tmp_path / "locales" / "de.yaml").write_text(textwrap.dedent(de))
    return tmp_path


def _found(path: Path) -> list[tuple[str, int, str, str]]:
    _, diagnostics = check_bot(path)
    return [(Path(d.file).name, d.line, d.severity, d.message) for d in diagnostics]


def test_validate_names_a_missing_key_an_unused_key_a_placeholder_mismatch_and_an_untranslated_text(tmp_path):
    path = _bot(tmp_path, """\
        prompt: Be brief.
        hello: Hello {name}!
        spare: Never used.
        """, """\
        hello: Hallo {nom}!
        spare: Nie benutzt.
        """)
    assert _found(path) == [
        ("bot.yaml", 6, "error", "t('prompt'): locale `de` has no text with this key (add it to locales/de.yaml)"),
        ("bot.yaml", 12, "warning", "`message` of tool `bye` is sent to the user untranslated: the bot declares "
         "`locales:`, so write it as `{{ t('key') }}` with the key in each catalog (docs/i18n.md)"),
        ("de.yaml", 1, "error", "`hello` in de has the placeholders {nom}, but in en {name} "
         f"({path / 'locales' / 'en.yaml'}:2)"),
        ("de.yaml", 2, "warning", "`spare` is not used by any template of the bot (t('spare'))"),
        ("en.yaml", 3, "warning", "`spare` is not used by any template of the bot (t('spare'))"),
    ]


def test_a_key_only_the_default_locale_has_is_an_error_at_its_line(tmp_path):
    bot = BOT.replace("message: Goodbye!", "message: \"{{ t('bye') }}\"")
    path = _bot(tmp_path, "prompt: Be brief.\nhello: Hi {name}\nbye: Bye\nextra: More\n",
                "prompt: Kurz.\nhello: Hallo {name}\nbye: Tschüss\n", bot)
    found = _found(path)
    assert ("en.yaml", 4, "error", "`extra` has no text in locale `de` (add it to locales/de.yaml)") in found
    assert [f for f in found if f[2] == "error"] == [found[0]]


def test_t_without_locales_and_a_declared_locale_without_a_catalog_are_errors(tmp_path):
    (tmp_path / "bot.yaml").write_text(BOT.replace("locales: [en, de]\n", ""))
    assert ("bot.yaml", 5, "error", "`system` of route `main` calls `t()`, but the bot declares no `locales:` "
            "(docs/i18n.md)") in _found(tmp_path)
    (tmp_path / "bot.yaml").write_text(BOT)
    found = _found(tmp_path)
    assert [f[:3] for f in found[:2]] == [("bot.yaml", 2, "error")] * 2
    assert {f[3].split(" is declared")[0] for f in found[:2]} == {"locale `en`", "locale `de`"}


def test_the_cli_prints_file_line_and_exits_non_zero(tmp_path):
    path = _bot(tmp_path, "prompt: Be brief.\nhello: Hello {name}!\n", "hello: Hallo {name}!\n",
                BOT.replace("message: Goodbye!", "message: \"{{ t('hello', name='x') }}\""))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code != 0
    assert f"{path / 'bot.yaml'}:6:" in result.output and "locale `de` has no text" in result.output


@pytest.mark.parametrize("de, line, message", [
    (b"prompt: [Kurz\nhello: Hallo {name}!\n", 2, "YAML syntax error"),
    (b"- prompt\n- hello\n", 1, "a catalog is a mapping of keys to texts, not a list"),
    (b"prompt: Kurz.\nhello: Gr\xfc\xdf {name}!\n", 2,
     "the file is not UTF-8 text: byte 0xfc on line 2 cannot be decoded; save the file as UTF-8"),
])
def test_a_catalog_that_cannot_be_read_is_one_error_at_its_line_not_every_key_it_lacks(tmp_path, de, line, message):
    path = _bot(tmp_path, "prompt: Be brief.\nhello: Hello {name}!\n", "",
                BOT.replace("message: Goodbye!", "message: \"{{ t('hello', name='x') }}\""))
    (path / "locales" / "de.yaml").write_bytes(de)
    errors = [f for f in _found(path) if f[2] == "error"]
    assert [(f[0], f[1]) for f in errors] == [("de.yaml", line)]
    assert message in errors[0][3]
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 1 and "unexpected" not in result.output


def test_a_catalog_value_that_is_no_text_says_what_it_is(tmp_path):
    path = _bot(tmp_path, "prompt: Be brief.\nhello: Hello {name}!\n", "prompt: 12\nhello:\n")
    assert [f[1:] for f in _found(path) if f[0] == "de.yaml"] == [
        (1, "error", "`prompt` is a number: a catalog's values are texts (quote a number, write empty text as `''`)"),
        (2, "error", "`hello` is empty: a catalog's values are texts (quote a number, write empty text as `''`)")]


def test_plural_rules_are_cldr_ones():
    assert [plural_category("en", n) for n in (0, 1, 2)] == ["other", "one", "other"]
    assert [plural_category("pl", n) for n in (1, 3, 5, 22)] == ["one", "few", "many", "few"]
    assert plural_category("ar", 0) == "zero"


def test_negotiation_reads_tags_and_accept_language():
    catalogs = Catalogs(("en", "de", "pt-BR"))
    assert catalogs.negotiate("de-AT") == "de"
    assert catalogs.negotiate("fr;q=0.9, pt-br;q=0.8, de;q=0.5") == "pt-BR"
    assert catalogs.negotiate("fr, *;q=0.1") == "en"
    assert catalogs.negotiate(None) == "en"
    assert preferred_tags("en;q=0, de") == ["de"]


def _session(**kw):
    bot = chatrun.load_bot(BAKERY)
    return bot.session(model=ScriptedModel([{"tool_calls": [{"name": "add_loaves", "arguments": {"count": 2}}]},
                                            {"text": "ok"}]), **kw)


def test_the_session_speaks_the_clients_locale_and_state_locale_wins():
    session = _session(meta={"locale": "de-CH"})
    assert session.locale == "de"
    events = session.chat("Zwei Brote")
    assert [e.data for e in events if e.type == "Message"][0] == "Ihre Bestellung hat jetzt 2 Brote."
    assert session.ask_locale("en-US") == "en"
    session2 = _session(meta={"locale": "en"}, state={"locale": "de"})
    assert session2.locale == "de"
    assert _session().locale == "en"


def test_chatrun_test_runs_a_transcript_in_another_locale(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["test", str(BAKERY / "transcripts")]).exit_code == 0
    result = runner.invoke(main, ["test", "--locale", "en", str(BAKERY / "transcripts" / "de.yaml")])
    assert result.exit_code == 1
    assert "+- Message: Your order now has 1 loaf." in result.output


def test_chatrun_test_refuses_a_locale_the_bot_does_not_declare(tmp_path, monkeypatch):
    monkeypatch.chdir(BAKERY.parents[1])
    runner = CliRunner()
    result = runner.invoke(main, ["test", "--locale", "fr", "bots/bakery"])
    assert (result.exit_code, result.output) == (4, "error: --locale fr: bots/bakery declares en, de\n")
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback
    result = runner.invoke(main, ["test", "--locale", "de", "bots/claims", "bots/bakery/transcripts/en.yaml"])
    assert (result.exit_code, result.output) == (
        4, "error: --locale de: bots/claims declares no `locales:` (docs/i18n.md)\n")
    # By language, as a client's tag is matched: de-AT is the bakery's de.
    assert runner.invoke(main, ["test", "--locale", "de-AT", "bots/bakery/transcripts/de.yaml"]).exit_code == 0
    # A transcript's own `locale:` is what a client asks for: one the bot lacks falls back.
    asks_french = tmp_path / "fr.yaml"
    text = (BAKERY / "transcripts" / "en.yaml").read_text()
    asks_french.write_text(text.replace("bot: ..", f"bot: {BAKERY}").replace("locale: en-GB", "locale: fr"))
    assert "locale: fr\n" in asks_french.read_text() and f"bot: {BAKERY}" in asks_french.read_text()
    assert runner.invoke(main, ["test", str(asks_french)]).exit_code == 0


def test_the_bakery_bot_has_no_untranslated_literal(tmp_path):
    copy = tmp_path / "bakery"
    shutil.copytree(BAKERY, copy)
    bot = copy / "bot.yaml"
    bot.write_text(bot.read_text().replace(
        "message: \"{{ t('goodbye', count=state.loaves, total=(state.loaves * 3.2) | format_currency('EUR')) }}\"",
        "message: Thank you!"))
    found = _found(copy)
    assert [f[2] for f in found] == ["warning", "warning", "warning"]
    assert "`message` of tool `goodbye` is sent to the user untranslated" in found[0][3]
    assert {f[3] for f in found[1:]} == {"`goodbye` is not used by any template of the bot (t('goodbye'))"}


@pytest.mark.slow
def test_the_repl_shows_and_changes_the_locale():
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(BAKERY.parents[1] / "runner")
    script = "\n".join(["/locale", "/locale de-AT", "Zwei Brote", '/call add_loaves {"count": 2}', "/say Gern.",
                        "/reset", "/locale", "/quit"]) + "\n"
    out = subprocess.run([sys.executable, "-m", "chatrun", "repl", str(BAKERY), "--play-model"], input=script,
                         capture_output=True, text=True, timeout=120, env=env, cwd=BAKERY.parents[1])
    assert out.returncode == 0, out.stderr
    assert "locale: en (the bot's locales: en, de; default en)" in out.stdout
    assert out.stdout.count("locale: de (the bot's locales: en, de; default en)") == 2  # asked, and kept by /reset
    assert "Ihre Bestellung hat jetzt 2 Brote." in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_a_plain_route_title_and_bot_description_are_untranslated_and_t_calls_count(tmp_path):
    bot = BOT.replace("name: desk\n", "name: desk\ndescription: A help desk.\n").replace(
        "    default: true\n", "    default: true\n    title: Front desk\n")
    path = _bot(tmp_path, "prompt: Be brief.\nhello: Hi {name}\n", "prompt: Kurz.\nhello: Hallo {name}\n", bot)
    untranslated = [(f[1], f[3].split(" is sent")[0]) for f in _found(path) if "untranslated" in f[3]]
    assert untranslated == [(2, "the bot's `description`"), (7, "`title` of route `main`"),
                            (14, "`message` of tool `bye`")]
    bot = bot.replace("description: A help desk.", "description: \"{{ t('about') }}\"").replace(
        "title: Front desk", "title: \"{{ t('desk') }}\"")
    path.joinpath("bot.yaml").write_text(bot)
    found = _found(path)
    assert ("bot.yaml", 2, "error", "t('about'): locale `en` has no text with this key (add it to locales/en.yaml)") in found
    assert ("bot.yaml", 7, "error", "t('desk'): locale `de` has no text with this key (add it to locales/de.yaml)") in found
    # A title sees `t()` and `locale` only: there is no conversation (and no state) outside it.
    path.joinpath("bot.yaml").write_text(bot.replace("t('desk')", "state.name"))
    assert any(f[1] == 7 and "unknown template variable `state`" in f[3] for f in _found(path))


def test_a_bot_serves_its_titles_description_and_page_texts_in_each_locale():
    from chatrun.definition.page_texts import page_data
    from chatrun.definition.templates import display_text

    bakery = chatrun.load_bot(BAKERY)
    config = bakery.config
    assert display_text(config.description, config.catalogs, "de") == "Nimmt Brotbestellungen auf Deutsch oder Englisch an."
    assert display_text(config.routes["counter"].title, config.catalogs, "en") == "Counter"
    german = page_data(config.catalogs, "de")
    assert german["dir"] == "ltr" and german["texts"]["send"] == "Senden"  # built in
    assert german["texts"]["hello"].startswith("Willkommen in der Bäckerei")  # the bakery's page.hello
    assert page_data(None, None)["texts"]["send"] == "Send"  # a bot without locales: English
    arabic = page_data(None, "ar-EG")
    assert arabic["dir"] == "rtl" and arabic["texts"]["send"] == "إرسال"
    assert page_data(None, "he")["dir"] == "rtl" and page_data(None, "he")["texts"]["send"] == "Send"


def test_page_keys_in_a_catalog_override_the_page_and_are_checked(tmp_path):
    path = _bot(tmp_path, "prompt: Be brief.\nhello: Hi {name}\npage:\n  send: Go\n  sendd: Go\n"
                "  talking_to: '{name} and {who}'\n",
                "prompt: Kurz.\nhello: Hallo {name}\npage:\n  send: Los\n  sendd: Los\n  talking_to: '{name}'\n",
                BOT.replace("message: Goodbye!", "message: \"{{ t('hello', name='x') }}\""))
    found = [f for f in _found(path) if f[0] == "en.yaml"]
    assert found == [
        ("en.yaml", 5, "warning", "`page.sendd` is not a text of the page; did you mean `send`? "
         "(the page's texts: docs/i18n.md, \"The page\")"),
        ("en.yaml", 6, "error", "`page.talking_to` has the placeholders {who}, but the page fills only {name}"),
    ]  # `page.send` is no unused key: the page uses it


def test_every_built_in_page_locale_has_every_text_with_its_placeholders():
    from chatrun.definition.catalogs import PLACEHOLDER
    from chatrun.definition.page_texts import BUILTIN, KEYS

    for locale, texts in BUILTIN.items():
        assert set(texts) == KEYS, locale
        for key, text in texts.items():
            assert set(PLACEHOLDER.findall(text)) == set(PLACEHOLDER.findall(BUILTIN["en"][key])), (locale, key)
            if "attachments." in BUILTIN["en"][key]:  # the bot's setting, named as bot.yaml spells it
                assert BUILTIN["en"][key].split("(")[-1].split(")")[0] in text, (locale, key)


@pytest.mark.parametrize(("locale", "count", "text"), [
    ("en", 1, "I take messages of up to 1 character."),
    ("en", 8000, "I take messages of up to 8000 characters."),
    ("de", 1, "Ich nehme Nachrichten mit bis zu 1 Zeichen an."),
    ("ar", 1, "الحد الأقصى لعدد الأحرف في الرسالة: 1."),
    ("ar", 3, "الحد الأقصى لعدد الأحرف في الرسالة: 3."),  # Arabic's `few`: the `other` text
])
def test_a_page_text_with_a_count_takes_the_plural_form_of_its_locale(locale, count, text):
    """`channel_too_long` said "1 characters"; `said_count` picks `_one` or `_other` by the
    locale's plural rule (CLDR's `one`, else `other`), and every such text has both forms."""
    from chatrun.definition.catalogs import said_count
    from chatrun.definition.page_texts import BUILTIN, page_texts

    assert text in said_count(page_texts(None, locale), "channel_too_long", locale, count, limit=count)
    for texts in BUILTIN.values():
        assert {k[:-4] for k in texts if k.endswith("_one")} == {k[:-6] for k in texts if k.endswith("_other")}
