"""Validator false alarms and misses (issue 34, finding 8): a computed catalog key
(`t('day.' ~ n)`) is no error and leaves no key of its prefix "unused"; `{% if data.game %}`
in a `user:` template is safe (an undefined field is false there); an `emit:` value that is a
mapping of templates is rendered, value by value, and each template is checked."""

from __future__ import annotations

import textwrap
from pathlib import Path

from chatrun.definition.loader import check_bot


def found(path: Path) -> list[tuple[str, int, str, str]]:
    _, diagnostics = check_bot(path)
    return [(Path(d.file).name, d.line, d.severity, d.message) for d in diagnostics]


RENDERED_NOW = ("`emit Handoff` of tool `score`: the texts inside its data are rendered as templates now (before "
                "this release `{{ }}` in them was sent as written); write {{ '{{' }} for braces meant literally")


def bot(tmp_path: Path, text: str, catalogs: dict[str, str] | None = None) -> Path:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "bot.yaml").write_text(textwrap.dedent(text))
    for locale, entries in (catalogs or {}).items():
        (tmp_path / "locales").mkdir(exist_ok=True)
        (tmp_path / "locales" / f"{locale}.yaml").write_text(textwrap.dedent(entries))
    return tmp_path


# -- computed catalog keys ------------------------------------------------------------------------

DAYS = """\
    name: week
    format: 3
    locales: [en, de]
    state: {n: 1}
    routes:
      main:
        default: true
        context: "{{ t('prompt') }} {{ t('day.' ~ state.n) }}"
    """
EN_DAYS = "prompt: Be brief.\n" + "".join(f"day.{n}: Day {n}\n" for n in range(1, 22))
DE_DAYS = "prompt: Kurz.\n" + "".join(f"day.{n}: Tag {n}\n" for n in range(1, 22))


def test_a_computed_key_is_no_error_and_its_prefix_keys_are_not_unused_one_note_says_so(tmp_path):
    path = bot(tmp_path, DAYS, {"en": EN_DAYS, "de": DE_DAYS})
    assert found(path) == [
        ("bot.yaml", 8, "warning", "note: a `t()` call computes its key, so the 21 keys starting with `day.` count as "
         "used (each is still checked in every locale); which one it reads is known only when it runs"),
    ]


def test_a_computed_prefix_no_key_has_is_an_error_and_a_prefix_key_a_locale_lacks_too(tmp_path):
    path = bot(tmp_path, DAYS.replace("'day.'", "'dya.'"), {"en": EN_DAYS, "de": DE_DAYS})
    problems = found(path)
    assert ("bot.yaml", 8, "error", "t('dya.' ~ …) computes its key, but no key of locale `en` starts with `dya.` "
            "(add them to locales/en.yaml)") in problems
    assert sum("is not used by any template" in p[3] for p in problems) == 42  # now nothing reads them (21 keys, 2 locales)
    path = bot(tmp_path / "lacking", DAYS, {"en": EN_DAYS, "de": DE_DAYS.replace("day.21: Tag 21\n", "")})
    assert ("en.yaml", 22, "error", "`day.21` has no text in locale `de` (add it to locales/de.yaml)") in found(path)


def test_a_key_computed_from_nothing_literal_counts_every_key_as_used(tmp_path):
    path = bot(tmp_path, DAYS.replace("t('day.' ~ state.n)", "t(state.key)").replace("{n: 1}", "{n: 1, key: prompt}"),
               {"en": EN_DAYS, "de": DE_DAYS})
    assert [p[3] for p in found(path)] == [
        "note: a `t()` call computes its key, so all the keys count as used (each is still checked in every locale); "
        "which one it reads is known only when it runs"]


# -- a `user:` template that tests a field of `data` ----------------------------------------------

GAME = """\
    name: arcade
    format: 3
    routes:
      main:
        default: true
        system: You run a games arcade.
        user: "{USER}"
    """


def test_an_if_on_a_data_field_is_safe_and_what_still_fails_is_still_told(tmp_path):
    safe = bot(tmp_path / "safe", GAME.replace("{USER}", "{% if data.game %}[{{ data.game }}] {% endif %}"
                                                        "{{ user_message }} {{ data.mode or 'casual' }}"))
    assert found(safe) == []
    for name, template, read in (("printed", "{{ data.game }}", "data.game"),
                                 ("else", "{% if data.game %}x{% else %}{{ data.game }}{% endif %}", "data.game"),
                                 ("below", "{% if data.game.id %}x{% endif %}", "data.game"),
                                 ("other", "{% if data.game %}{{ data.level }}{% endif %}", "data.level")):
        problems = found(bot(tmp_path / name, GAME.replace("{USER}", template)))
        assert [p[3].split(",")[0] for p in problems] == [f"`user` of route `main` reads `{read}`"], name
        assert "every such turn fails" in problems[0][3]


def test_the_safe_template_really_runs_for_a_text_only_message_and_with_the_field(tmp_path):
    import chatrun
    from chatrun.models.scripted import ScriptedModel

    path = bot(tmp_path, GAME.replace("{USER}", "{% if data.game %}[{{ data.game }}] {% endif %}{{ user_message }}"))
    model = ScriptedModel([{"text": "Hi."}, {"text": "Go on."}])
    session = chatrun.load_bot(path).session(model=model)
    session.chat("hello")
    session.chat({"userMessage": "move", "game": "chess"})
    assert [r.messages[-1].content for r in model.requests] == ["hello", "[chess] move"]


# -- `emit:` data with templates in it ------------------------------------------------------------

HANDOFF = """\
    name: survey
    format: 3
    events: {Handoff: {audience: user}}
    routes:
      main: {default: true, system: Ask for a score., tools: [score]}
    tools:
      score:
        description: Record the customer's score
        parameters: {type: object, properties: {score: {type: integer}}, required: [score]}
        action:
          emit:
            Handoff:
              channel: chat
              score: "{{ args.score }}"
              note: "Scored {{ args.score }} on {{ route }}"
              tags: ["{{ 'low' if args.score < 7 else 'high' }}", fixed]
              missing: "{{ args.comment }}"
          reply: Thanks.
    """


def test_an_emit_mapping_renders_each_of_its_templates_keeping_types(tmp_path):
    import chatrun
    from chatrun.models.scripted import ScriptedModel

    path = bot(tmp_path, HANDOFF.replace('              missing: "{{ args.comment }}"\n', ""))
    assert [p[2:] for p in found(path)] == [("warning", RENDERED_NOW)]  # the change of meaning, for older bots
    model = ScriptedModel([{"tool_calls": [{"id": "c1", "name": "score", "arguments": {"score": 4}}]}, {"text": "Bye."}])
    events = chatrun.load_bot(path).session(model=model).chat("4")
    assert [e.data for e in events if e.type == "Handoff"] == [
        {"channel": "chat", "score": 4, "note": "Scored 4 on main", "tags": ["low", "fixed"]}]


def test_each_template_in_emit_data_is_checked_at_its_line_and_one_that_renders_nothing_is_none(tmp_path):
    import chatrun
    from chatrun.models.scripted import ScriptedModel

    problems = found(bot(tmp_path / "typo", HANDOFF.replace("args.comment", "args.coment")))
    assert problems[1:] == [("bot.yaml", 17, "warning", "`emit Handoff` of tool `score` reads `args.coment`, but the "
                         "tool's `parameters` declare no property `coment`")]
    model = ScriptedModel([{"tool_calls": [{"id": "c1", "name": "score", "arguments": {"score": 8}}]}, {"text": "Bye."}])
    events = chatrun.load_bot(bot(tmp_path / "plain", HANDOFF)).session(model=model).chat("8")
    assert [e.data for e in events if e.type == "Handoff"] == [
        {"channel": "chat", "score": 8, "note": "Scored 8 on main", "tags": ["high", "fixed"], "missing": None}]
