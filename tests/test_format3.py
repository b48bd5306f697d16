"""Format 3: one way to say each thing (issue 39), `chatrun upgrade` from format 2 by node
positions, and format 2 still read (its frozen schema) with one warning."""

from __future__ import annotations

from click.testing import CliRunner

from chatrun.cli import main
from chatrun.definition.loader import check_bot
from test_schema_keys_read import normal

FORMAT2 = """\
# A format-2 bot: every second spelling, with comments that must survive.
name: desk
format: 2   # written for format 2
state: {size: null, plan: null}
routes:
  main: {default: true, system: Hi., tools: [refund, pick, bye, size]}
  other: {system: Other.}
tools:
  refund:
    parameters: {type: object, properties: {amount: {type: number}}}
    approval:
      by: [supervisor]
      ask: "Refund {{ args.amount }} EUR?"   # the supervisor reads this
      tell: Your refund waits.               # the customer reads this
      timeout: 1h
  pick:
    approval: {by: [lead], ask: "Pick {{ args }}?", tell: Wait.}
    action: {route: other, message: "Off we go"}
  bye:
    action:
      cases:
        - if: state.plan
          then: {emit: {Message: "Bye, {{ state.plan }}"}}
        - else:
            pop: true   # back
            result: Done.
  size:
    action:
      ask:
        from: user
        text: Which size?
        into: state.size   # where the answer lands
      message: "Size {{ result }}."
"""

FORMAT3 = """\
# A format-2 bot: every second spelling, with comments that must survive.
name: desk
format: 3   # written for format 2
state: {size: null, plan: null}
routes:
  main: {default: true, system: Hi., tools: [refund, pick, bye, size]}
  other: {system: Other.}
tools:
  refund:
    parameters: {type: object, properties: {amount: {type: number}}}
    approval:
      by: [supervisor]
      ask:
        text: "Refund {{ args.amount }} EUR?"   # the supervisor reads this
        tell: Your refund waits.               # the customer reads this
      timeout: 1h
  pick:
    approval: {by: [lead], ask: {text: "Pick {{ args }}?", tell: Wait.}}
    action: {message: "Off we go", route: other}
  bye:
    action:
      cases:
        - if: state.plan
          then: {message: "Bye, {{ state.plan }}"}
        - else:
            result: Done.
            pop: true   # back
  size:
    action:
      ask:
        from: user
        text: Which size?
        # where the answer lands
      set: {state.size: '{{ result }}'}
      message: "Size {{ result }}."
"""


def test_upgrade_writes_each_second_spelling_the_one_way_and_keeps_every_comment(tmp_path):
    bot = tmp_path / "bot.yaml"
    bot.write_text(FORMAT2)
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert bot.read_text() == FORMAT3
    said = result.output
    for what in ("`format: 2` is now `format: 3`", "approval `ask:`/`tell:` are now `ask: {text, tell}`",
                 "`ask.into: state.size` is now `set: {state.size: '{{ result }}'}`",
                 "`emit: {Message: ...}` is now `message:`", "the action's keys are now in the order they apply"):
        assert what in said, said
    assert f"{bot}:13: approval" in said  # at the line of the `ask:` it rewrote


def test_both_formats_of_the_same_bot_load_into_the_same_config(tmp_path):
    (tmp_path / "two").mkdir()
    (tmp_path / "three").mkdir()
    (tmp_path / "two" / "bot.yaml").write_text(FORMAT2)
    (tmp_path / "three" / "bot.yaml").write_text(FORMAT3)
    two, found_two = check_bot(tmp_path / "two")
    three, found_three = check_bot(tmp_path / "three")
    assert [d.severity for d in found_three if d.path == "format" or d.severity == "error"] == []
    assert [(d.line, d.severity) for d in found_two if d.path == "format"] == [(3, "warning")]
    assert "chatrun upgrade" in next(d.message for d in found_two if d.path == "format")
    assert three.tools["size"].action.ask.into == "state.size" and three.tools["size"].action.set == {}
    assert three.tools["refund"].approval.tell == "Your refund waits."
    differs = {"format", "content_version"}
    assert {k: v for k, v in _as_message(normal(two)).items() if k not in differs} == \
           {k: v for k, v in normal(three).items() if k not in differs}


def _as_message(config):
    """Format 2's `emit: {Message: X}` as format 3 says it, `message: X` (the one difference in meaning:
    an emitted Message went out with the other events, a `message:` after them)."""
    if isinstance(config, dict):
        if "Message" in (config.get("emit") or {}):
            config["message"] = config["emit"].pop("Message")
        for value in config.values():
            _as_message(value)
    elif isinstance(config, list):
        for value in config:
            _as_message(value)
    return config


ALIASED = """\
name: desk
format: 2
state: {size: null}
routes:
  main: {default: true, system: Hi., tools: [size, size2, bye, bye2, ok, ok2]}
tools:
  size:
    action: &ask   # asked twice
      ask: {from: user, text: "Which size?", into: state.size}
      message: "Size {{ result }}."
  size2:
    action: *ask
  bye:
    action: &bye {emit: {Message: Bye.}, result: Done., pop: true}
  bye2:
    action: *bye
  ok:
    approval: &approval {by: [lead], ask: "Sure?", tell: Wait.}
  ok2:
    approval: *approval
"""


def test_upgrade_edits_a_node_that_aliases_name_once(tmp_path):
    bot = tmp_path / "bot.yaml"
    bot.write_text(ALIASED)
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert bot.read_text() == ALIASED.replace("format: 2", "format: 3").replace(
        ", into: state.size}\n", "}\n      set: {state.size: '{{ result }}'}\n").replace(
        "{emit: {Message: Bye.}, result: Done., pop: true}", "{message: Bye., result: Done., pop: true}").replace(
        "ask: \"Sure?\", tell: Wait.}", "ask: {text: \"Sure?\", tell: Wait.}}")
    assert result.output.count("is now `message:`") == 1, result.output
    assert [d.message for d in check_bot(tmp_path)[1] if d.severity == "error"] == []


def test_upgrade_keeps_a_files_crlf_line_ends_and_its_byte_order_mark(tmp_path):
    bot = tmp_path / "bot.yaml"
    bot.write_bytes(b"\xef\xbb\xbf" + FORMAT2.replace("\n", "\r\n").encode())
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert bot.read_bytes() == b"\xef\xbb\xbf" + FORMAT3.replace("\n", "\r\n").encode()
    diff = CliRunner().invoke(main, ["upgrade", "--diff", str(tmp_path)])
    assert diff.output == f"{bot}: already on the current format\n"


def test_upgrade_reads_what_validate_reads_and_names_a_broken_files_line(tmp_path):
    bot = tmp_path / "bot.yaml"
    bot.write_text("name: x\nformat: 2\nroutes: {main: {default: true, tools: [a]}}\n"
                   "tools:\n  a:\n    approval: {by: [lead], ask: Sure?, tell: Wait.}\n")
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert bot.read_text().endswith("    approval: {by: [lead], ask: {text: Sure?, tell: Wait.}}\n")
    bot.write_text("name: x\nformat: 2\nroutes:\n  main: {default: true, system: \"Hi}\n")
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.startswith(f"{bot}:5:1: error: YAML syntax error: while scanning a quoted scalar "
                                     "(from line 4), found unexpected end of stream\n"), result.output
    bot.write_bytes(b"name: x\nformat: 2\nroutes:\n  main: {default: true, system: caf\xe9}\n")
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.startswith(f"{bot}:4:36: error: the file is not UTF-8 text: byte 0xe9 on line 4"), \
        result.output


def test_upgrade_adds_format_after_a_name_written_as_a_block_or_on_the_files_last_line(tmp_path):
    bot = tmp_path / "bot.yaml"
    for before, after, line in [
        ("name: >-\n  desk\nroutes:\n  main: {default: true}\n",
         "name: >-\n  desk\nformat: 3\nroutes:\n  main: {default: true}\n", 3),
        ("routes:\n  main: {default: true}\nname: desk", "routes:\n  main: {default: true}\nname: desk\nformat: 3\n", 4),
    ]:
        bot.write_text(before)
        result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
        assert result.exit_code == 0, result.output  # the text read `name: deskformat: 3`: a YAML error
        assert bot.read_text() == after
        assert result.output == f"{bot}:{line}: added `format: 3`\n"


MOVED2 = """\
name: desk
format: 2
routes:
  main: {default: true, system: Hi., tools: [alone, before, after, two]}
tools:
  alone:
    approval:
      by: [lead]
      tell: "Wait"   # only tell
  before:
    approval:
      tell: |
        Wait please.
      by: [lead]
      ask: >-
        Sure
        really?
  after:
    approval:
      ask: Sure?   # the lead reads this
      by: [lead]
      tell: Wait.  # the user reads this
  two:
    action:
      emit:
        Message: |   # greet
          Hello
        Object: {a: 1}
"""

MOVED3 = """\
name: desk
format: 3
routes:
  main: {default: true, system: Hi., tools: [alone, before, after, two]}
tools:
  alone:
    approval:
      by: [lead]
      ask:
        tell: "Wait"   # only tell
  before:
    approval:
      by: [lead]
      ask:
        text: >-
          Sure
          really?
        tell: |
          Wait please.
  after:
    approval:
      ask:
        text: Sure?   # the lead reads this
        tell: Wait.  # the user reads this
      by: [lead]
  two:
    action:
      emit:
        Object: {a: 1}
      message: |   # greet
        Hello
"""


def test_upgrade_moves_tell_and_message_with_their_comments_and_block_scalars_whole(tmp_path):
    bot = tmp_path / "bot.yaml"
    bot.write_text(MOVED2)
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 0, result.output  # `tell:` alone was a YAML error; a moved block left "  " lines
    assert bot.read_text() == MOVED3
    assert [d.message for d in check_bot(tmp_path)[1] if d.severity == "error"] == []


def test_upgrade_diff_prints_the_change_and_writes_nothing(tmp_path):
    bot = tmp_path / "bot.yaml"
    bot.write_text(FORMAT2)
    result = CliRunner().invoke(main, ["upgrade", "--diff", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert bot.read_text() == FORMAT2
    assert "-format: 2   # written for format 2\n+format: 3   # written for format 2\n" in result.output
    assert "+      set: {state.size: '{{ result }}'}\n" in result.output


def test_format_3_refuses_the_second_spellings_each_at_its_line(write_bot):
    path = write_bot("""\
        name: x
        format: 3
        routes: {main: {default: true, system: Hi., tools: [a, b, c]}}
        tools:
          a:
            approval: {ask: Sure?}
          b:
            action: {ask: {from: user, into: state.x}}
          c:
            action: {emit: {Message: Hi}}
        """)
    _, found = check_bot(path)
    errors = [(d.line, d.message) for d in found if d.severity == "error"]
    assert errors == [
        (6, "`approval.ask` of tool `a` must be a mapping, not a string"),
        (8, "unknown key `into` in `action.ask` of tool `b`"),
        (10, "invalid event type `Message` in `action.emit` of tool `c`: a message is said with `message:` and "
             "choices with `choices:` (format 3); other event types use letters, digits, `_` and `-`, starting "
             "with a letter or `_`"),
    ]


def test_format_3_warns_about_an_action_written_out_of_the_order_it_applies(write_bot):
    bot = """\
        name: x
        format: {fmt}
        routes: {{main: {{default: true, system: Hi., tools: [a]}}, b: {{system: B.}}}}
        tools:
          a:
            action: {{route: b, message: Bye}}
        """
    _, found = check_bot(write_bot(bot.format(fmt=3), name="three.yaml"))
    assert [(d.line, d.severity, d.message) for d in found] == [(6, "warning", (
        "`message` of tool `a` is written after `route` but applies before it: write an action's keys in the "
        "order they apply (message, route; docs/format.md, \"The order actions apply\"); `chatrun upgrade` "
        "reorders them"))]
    _, found = check_bot(write_bot(bot.format(fmt=2), name="two.yaml"))
    assert [d.path for d in found] == ["format"]  # format 2: only the upgrade warning


MERGED = """\
name: m
format: 3
state: {a: 0}
routes:
  main: {default: true, system: hi, tools: [t1, t2, t3]}
tools:
  t1:
    action: &base
      set: {state.a: 1}
      message: hi
  t2:
    action:
      reply: done  # its reply
      <<: *base
  t3:
    action: {reply: ok, set: {state.a: 2}}
"""


def test_upgrade_reorders_a_format_3_bots_actions_also_through_a_merge_as_validate_says(tmp_path):
    """validate's warning says `chatrun upgrade` reorders: it does on a bot already on format 3
    (it said "already on the current format"), `<<: *base` moving as one key, where its keys read."""
    bot = tmp_path / "bot.yaml"
    bot.write_text(MERGED)
    warned = [d.message for d in check_bot(tmp_path)[1]]
    assert len(warned) == 2 and all(m.endswith("`chatrun upgrade` reorders them") for m in warned), warned
    check = CliRunner().invoke(main, ["upgrade", "--check", str(tmp_path)])
    assert check.exit_code == 0 and bot.read_text() == MERGED, check.output  # --check: the format is current
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert bot.read_text() == MERGED.replace("      reply: done  # its reply\n      <<: *base\n",
                                             "      <<: *base\n      reply: done  # its reply\n").replace(
        "{reply: ok, set: {state.a: 2}}", "{set: {state.a: 2}, reply: ok}")
    assert result.output.count("the action's keys are now in the order they apply") == 2, result.output
    assert check_bot(tmp_path)[1] == []


def test_validate_says_to_reorder_by_hand_when_a_merges_keys_apply_on_both_sides_of_the_actions(tmp_path):
    bot = tmp_path / "bot.yaml"
    text = MERGED.replace("      message: hi\n", "      reply: hi\n").replace(
        "      reply: done  # its reply\n      <<: *base\n", "      <<: *base\n      message: done\n").replace(
        ", t3]", "]").split("  t3:")[0]
    bot.write_text(text)
    found = check_bot(tmp_path)[1]
    assert [(d.line, d.message.split("); ")[1]) for d in found] == [(14, (
        "`chatrun upgrade` cannot: the keys `<<:` on line 13 brings apply before and after `message`; write "
        "them in the action itself, or `message` in the anchored mapping"))]
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 0 and bot.read_text() == text, result.output


def test_a_bot_without_format_written_in_format_2_is_read_as_it_with_one_warning(write_bot):
    path = write_bot("""\
        name: x
        routes: {main: {default: true, system: Hi., tools: [a]}}
        tools:
          a:
            approval: {by: [lead], ask: Sure?, tell: Wait.}
        """)
    config, found = check_bot(path)
    assert [(d.line, d.severity) for d in found] == [(1, "warning")]
    assert "declares no `format:` and is written in format 2" in found[0].message
    assert config.tools["a"].approval.ask == "Sure?" and config.tools["a"].approval.tell == "Wait."


def test_upgrade_refuses_a_format_that_is_a_list_instead_of_calling_it_none(tmp_path):
    (tmp_path / "bot.yaml").write_text("name: x\nformat: [1]\nroutes: {main: {default: true, system: Hi.}}\n")
    result = CliRunner().invoke(main, ["upgrade", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / 'bot.yaml'}:2: `format:` must be a number (1, 2, 3), not a list" in result.output, result.output
    assert "None" not in result.output
