"""`chatrun upgrade BOT...`: rewrite bots to the current format version, keeping every other byte.

yaml.compose reads the bot (its nodes know where they start and end in the text); each edit
replaces one node's span of the text (cli/upgrade_edits.py), so comments, order, quoting and
blank lines stay exactly as they were: `format: N` is set to the current version, or added
after `name:`, and format 2's second spellings become format 3's one way.
What changed in meaning between the versions (definition/migrations.py, FORMAT_CHANGES) is
printed with the lines to review.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import click
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from chatrun.cli._output import BotPath
from chatrun.cli.upgrade_edits import (
    Edits,
    add_pair,
    after_line,
    compose,
    flow_safe,
    get,
    moved_value,
    nested,
    remove_pair,
    reorder,
    source,
)

MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class Upgrade:
    """What upgrading one file does: its new text, what changed, and what to review by hand."""

    file: Path
    text: str
    outdated: bool = True  # its format is not the current one (a current bot may still get its keys ordered)
    changes: list[str] = field(default_factory=list)
    review: list[str] = field(default_factory=list)
    others: dict[Path, str] = field(default_factory=dict)  # included files rewritten, by path


@click.command("upgrade")
@click.argument("paths", nargs=-1, required=True, type=BotPath())
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 when a bot is not on the current format (for CI).")
@click.option("--diff", "show_diff", is_flag=True, help="Write nothing; print the changes as a unified diff.")
def upgrade(paths: tuple[str, ...], check: bool, show_diff: bool) -> None:
    """Rewrite bots to the current format (3), keeping comments, order and every
    untouched line byte for byte, and print what changed. A bot served in several versions
    (`versions/<v>/bot.yaml`) has each version upgraded; files it includes are rewritten too.

    Exit status: 0 when done (or, with --check, when every bot is current), 1 when --check
    finds a bot to upgrade, 2 on errors (a bot that cannot be read: the others are still
    upgraded, and every error is printed).

    \b
    Examples:
      chatrun upgrade bots/travel
      chatrun upgrade --diff bots/travel
      chatrun upgrade bots/shop        (versions/1/bot.yaml, versions/2/bot.yaml, ...)
      chatrun upgrade --check bots/*/
    """
    outdated, failed = 0, 0
    for path in [bot for given in paths for bot in each_bot(given)]:
        try:
            result = upgraded(path)
        except Exception as exc:  # never a traceback from the CLI: `file:line: message`, exit 2
            click.echo(f"{exc}" if str(exc).startswith(path) else f"{path}: error: {exc}", err=True)
            failed += 1
            continue
        for line in [*result.changes, *result.review]:
            click.echo(line)
        if not result.changes or (check and not result.outdated):
            click.echo(f"{result.file}: already on the current format")
            continue
        outdated += result.outdated
        written = {result.file: result.text, **result.others}
        if show_diff:
            click.echo(_diff(written), nl=False)
        elif not check:
            for file, text in written.items():
                _write(file, text)
    if failed:
        click.echo(f"{failed} bot(s) could not be upgraded (above)", err=True)
        raise click.exceptions.Exit(2)
    if check and outdated:
        click.echo(f"{outdated} bot(s) to upgrade: run chatrun upgrade {' '.join(paths)}")
        raise click.exceptions.Exit(1)


def _diff(written: dict[Path, str]) -> str:
    import difflib

    return "".join(
        line for file, text in written.items()
        for line in difflib.unified_diff(_read(file).splitlines(keepends=True),
                                         text.splitlines(keepends=True), f"{file}", f"{file} (format 3)"))


BOM = b"\xef\xbb\xbf"


def _read(file: Path) -> str:
    """The file's text as the edits see it: without a byte order mark, each line ending in `\\n`
    (`_write` puts back what the file had). A file the loader cannot read is an error at its line,
    in `chatrun validate`'s words."""
    from chatrun.definition.yamlpos import read_yaml_file

    doc = read_yaml_file(file)
    if doc.data is None and doc.diagnostics:
        raise ValueError(doc.diagnostics[0].format())
    raw = file.read_bytes().removeprefix(BOM)
    return raw.decode("utf-8").replace("\r\n", "\n") if _crlf(raw) else raw.decode("utf-8")


def _crlf(raw: bytes) -> bool:
    """Every line of the file ends in CRLF (a file that mixes line ends is edited as it is)."""
    return b"\n" in raw and raw.count(b"\r\n") == raw.count(b"\n")


def _write(file: Path, text: str) -> None:
    """`text` in place of the file, with its byte order mark and CRLF line ends if it had them."""
    raw = file.read_bytes()
    new = (text.replace("\n", "\r\n") if _crlf(raw.removeprefix(BOM)) else text).encode("utf-8")
    file.write_bytes(BOM + new if raw.startswith(BOM) else new)


def each_bot(path: str) -> list[str]:
    """The bots a path names: itself, or each version of a bot in versions/ (docs/versions.md)."""
    from chatrun.definition.versions import version_folders

    found = version_folders(path)
    return [str(folder) for _, folder in found] if found is not None else [path]


def bot_file(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        p = p / "bot.yaml"
        if not p.is_file():
            raise ValueError(f"no bot.yaml in directory {path}")
    return p


def upgraded(path: str) -> Upgrade:
    """The bot's main file (and its included files) as the current format would have them:
    the main file's text, with the files it includes rewritten in `result.others`."""
    from chatrun.definition.config import CURRENT_FORMAT, SUPPORTED_FORMATS

    file = bot_file(path)
    text = _read(file)
    root = compose(text)
    if not isinstance(root, MappingNode):
        raise ValueError(f"{file}: not a YAML mapping")
    result = Upgrade(file, text)
    found = get(root, "format")
    if found is not None and not isinstance(found[1], ScalarNode):  # `format: [1]`: no version to read
        raise ValueError(f"{file}:{found[1].start_mark.line + 1}: `format:` must be a number "
                         f"({', '.join(map(str, SUPPORTED_FORMATS))}), not a {'list' if isinstance(found[1], SequenceNode) else 'mapping'}")
    declared = _int(found[1]) if found else None
    if declared == CURRENT_FORMAT:  # nothing to rewrite but the order of actions' keys (validate's warning)
        return _ordered(result, root)
    if declared is not None and declared not in SUPPORTED_FORMATS:
        raise ValueError(f"{file}:{found[0].start_mark.line + 1}: format {declared!r} is not one this chatrun "  # type: ignore[index]
                         f"reads ({', '.join(map(str, SUPPORTED_FORMATS))})")
    edits = Edits(text)
    _set_format(edits, root, declared, CURRENT_FORMAT)
    result.text, said, review = format3(edits, root)
    result.changes += [f"{file}:{line}: {what}" for line, what in said]
    result.review += [f"{file}:{line}: {what}" for line, what in review]
    if declared is not None:
        result.review += _review(path, declared)
    for other in _included_files(file, root):
        more = Edits(_read(other))
        new_text, said, _ = format3(more, compose(more.text))
        if said:
            result.others[other] = new_text
            result.changes += [f"{other}:{line}: {what}" for line, what in said]
    return result


def format3(edits: Edits, root: Node | None) -> tuple[str, list[tuple[int, str]], list[tuple[int, str]]]:
    """A file's text in format 3: the second spellings rewritten, then (on the text that gives)
    each action's keys put in the order they apply. Returns (text, what changed, what to review)."""
    spelling_edits(edits, root)
    said, review = sorted(edits.said), sorted(edits.review)
    ordered = Edits(edits.applied())
    for line in _order_actions(ordered, compose(ordered.text)):
        said.append((line, "the action's keys are now in the order they apply (docs/format.md, \"The order actions apply\")"))
    return ordered.applied(), said, review


def _ordered(result: Upgrade, root: MappingNode) -> Upgrade:
    """A bot on the current format with each action's keys in the order they apply, in its own
    file and the files it includes."""
    result.outdated = False
    for file, text, node in [(result.file, result.text, root),
                             *((other, _read(other), None) for other in _included_files(result.file, root))]:
        edits = Edits(text)
        moved = _order_actions(edits, node if node is not None else compose(text))
        if moved:
            said = "the action's keys are now in the order they apply (docs/format.md, \"The order actions apply\")"
            result.changes += [f"{file}:{line}: {said}" for line in moved]
            if file == result.file:
                result.text = edits.applied()
            else:
                result.others[file] = edits.applied()
    return result


def _order_actions(edits: Edits, root: Node | None) -> list[int]:
    """Reorder every action's keys (`ACTION_ORDER`); the lines of those moved (of the new text's
    first pass: the spelling edits may have shifted lines, so these are approximate only for them)."""
    from chatrun.definition.config import ACTION_ORDER

    rank = {key: i for i, key in enumerate(ACTION_ORDER)}
    tools = get(root, "tools")
    moved: list[int] = []
    seen: set[int] = set()  # a node that aliases name (`*act`) is one span of the text: edited once
    for _, tool in tools[1].value if tools is not None and isinstance(tools[1], MappingNode) else []:
        action = get(tool, "action")
        if action is None or not isinstance(action[1], MappingNode):
            continue
        for each in _actions(action[1]):
            if id(each) not in seen and reorder(edits, each, _with_merge(each, rank)):
                moved.append(each.start_mark.line + 1)
            seen.add(id(each))
    return moved


def _with_merge(action: MappingNode, rank: dict[str, int]) -> dict[str, int]:
    """`rank` with a place for the action's `<<: *anchor`: the keys it brings (those the action does
    not write itself) read where it stands, so it moves as one key, ranked by the first of them
    that applies. When they apply on both sides of a key the action writes, no order of the lines
    is right: validate says to write them out (definition/checks.py, `action_order`)."""
    own = {key.value for key, _ in action.value if isinstance(key, ScalarNode) and key.tag != MERGE_TAG}
    brought: list[int] = []
    for key, value in action.value:
        if key.tag == MERGE_TAG:
            sources = value.value if isinstance(value, SequenceNode) else [value]
            brought += [rank[k.value] for source in sources if isinstance(source, MappingNode)
                        for k, _ in source.value if k.value in rank and k.value not in own]
    return {**rank, "<<": min(brought)} if brought else rank


def _int(node: Node) -> int | str | None:
    value = node.value if isinstance(node, ScalarNode) else None
    return int(value) if isinstance(value, str) and value.isdigit() else value


def _set_format(edits: Edits, root: MappingNode, declared: int | str | None, current: int) -> None:
    found = get(root, "format")
    if found is None:
        name = get(root, "name")
        after = name[1] if name else root.value[0][1]
        at = after_line(edits.text, after.end_mark.index)  # a block scalar ends where the next key starts
        prefix = "" if at == 0 or edits.text[at - 1] == "\n" else "\n"  # `name: x` on the last line, no newline
        edits.replace(at, at, f"{prefix}format: {current}\n")
        edits.said.append((edits.text.count("\n", 0, at) + 1 + len(prefix), f"added `format: {current}`"))
        return
    node = found[1]
    edits.replace(node.start_mark.index, node.end_mark.index, str(current))
    edits.said.append((node.start_mark.line + 1, f"`format: {declared}` is now `format: {current}`"))


def spelling_edits(edits: Edits, root: Node | None) -> None:
    """Format 2's second spellings rewritten in format 3's one way (chatrun.cli.upgrade_edits)."""

    tools = get(root, "tools")
    if tools is None or not isinstance(tools[1], MappingNode):
        return
    seen: set[int] = set()  # a node that aliases name (`*act`) is one span of the text: edited once
    for _, tool in tools[1].value:
        approval = get(tool, "approval")
        if approval is not None and isinstance(approval[1], MappingNode) and id(approval[1]) not in seen:
            seen.add(id(approval[1]))
            _approval_question(edits, approval[1])
        action = get(tool, "action")
        if action is None or not isinstance(action[1], MappingNode) or id(action[1]) in seen:
            continue
        seen.add(id(action[1]))
        _ask_into(edits, action[1])
        for each in _actions(action[1]):
            if id(each) not in seen or each is action[1]:
                seen.add(id(each))
                _emit_message(edits, each)


def _actions(action: MappingNode) -> list[MappingNode]:
    """An action and the actions of its cases."""

    out = [action]
    cases = get(action, "cases")
    for case in cases[1].value if cases is not None and isinstance(cases[1], SequenceNode) else []:
        for key in ("then", "else"):
            found = get(case, key)
            if found is not None and isinstance(found[1], MappingNode):
                out.append(found[1])
    return out


def _ask_into(edits: Edits, action: MappingNode) -> None:

    ask = get(action, "ask")
    into = get(ask[1], "into") if ask is not None else None
    if ask is None or into is None or not isinstance(ask[1], MappingNode):
        return
    path = source(edits, into[1])
    remove_pair(edits, ask[1], *into)
    assignments = get(action, "set")
    if assignments is not None and isinstance(assignments[1], MappingNode) and assignments[1].value:
        add_pair(edits, assignments[1], path, "'{{ result }}'")
    else:
        add_pair(edits, action, "set", f"{{{path}: '{{{{ result }}}}'}}")
    edits.said.append((into[0].start_mark.line + 1, f"`ask.into: {path}` is now `set: {{{path}: '{{{{ result }}}}'}}`"))


def _approval_question(edits: Edits, approval: MappingNode) -> None:
    """`ask: TEXT` (+ `tell: TEXT`) -> `ask: {text: TEXT, tell: TEXT}`, in the approval's style."""
    ask, tell = get(approval, "ask"), get(approval, "tell")
    if (ask is None and tell is None) or (ask is not None and not isinstance(ask[1], ScalarNode)):
        return
    parts = [(name, found) for name, found in (("text", ask), ("tell", tell)) if found is not None]
    first_key = parts[0][1][0]
    edits.said.append((first_key.start_mark.line + 1, "approval `ask:`/`tell:` are now `ask: {text, tell}`"))
    if approval.flow_style:
        body = ", ".join(f"{name}: {flow_safe(edits, found[1])}" for name, found in parts)
        edits.replace(first_key.start_mark.index, parts[0][1][1].end_mark.index, f"ask: {{{body}}}")
        if len(parts) == 2:
            remove_pair(edits, approval, *parts[1][1])
        return
    indent = " " * (first_key.start_mark.column + 2)
    keys = [k.value for k, _ in approval.value]
    if ask is not None and tell is not None and keys.index("tell") == keys.index("ask") + 1:
        _nest(edits, ask, f"ask:\n{indent}text")
        _nest(edits, tell, "  tell")  # the next lines: each moves in under `ask:`, its comments with it
        return
    if ask is not None:
        _nest(edits, ask, f"ask:\n{indent}text")
    if tell is not None and ask is None:  # `tell:` alone: a new `ask:` takes it in where it is
        _nest(edits, tell, f"ask:\n{indent}tell")
    elif tell is not None and ask is not None:  # elsewhere in the approval: it moves to the end of `ask:`
        remove_pair(edits, approval, *tell, keep_comment=False)
        at = after_line(edits.text, ask[1].end_mark.index)
        prefix = "" if edits.text[at - 1] == "\n" else "\n"
        edits.replace(at, at, f"{prefix}{indent}tell: {moved_value(edits, tell[1], 2)}\n")


def _nest(edits: Edits, pair: tuple[ScalarNode, Node], new_key: str) -> None:
    """Replace a block pair's key with `new_key` (the `: value` and its comment stay) and indent
    the value's further lines two columns deeper."""
    key, value = pair
    edits.replace(key.start_mark.index, key.end_mark.index, new_key)
    if "\n" in source(edits, value).rstrip("\n"):
        edits.replace(value.start_mark.index, value.end_mark.index, nested(edits, value, 2))


def _emit_message(edits: Edits, action: MappingNode) -> None:
    """`emit: {Message: TEXT}` -> `message: TEXT` (an action that also has `message:`: to review)."""

    emit = get(action, "emit")
    message = get(emit[1], "Message") if emit is not None else None
    if emit is None or message is None or not isinstance(emit[1], MappingNode):
        return
    line = message[0].start_mark.line + 1
    if get(action, "message") is not None:
        edits.review.append((line, "`emit: {Message: ...}` beside `message:`: keep one `message:`"))
        return
    if len(emit[1].value) == 1:  # `emit: {Message: X}` becomes `message: X` in its place
        end = emit[1].end_mark.index if emit[1].flow_style else message[1].end_mark.index
        edits.replace(emit[0].start_mark.index, end,
                      "message: " + nested(edits, message[1], emit[0].start_mark.column - message[0].start_mark.column))
    else:
        remove_pair(edits, emit[1], *message, keep_comment=False)
        add_pair(edits, action, "message",
                 moved_value(edits, message[1], emit[0].start_mark.column - message[0].start_mark.column))
    edits.said.append((line, "`emit: {Message: ...}` is now `message:`"))


def _included_files(file: Path, root: MappingNode) -> list[Path]:

    found = get(root, "include")
    if found is None:
        return []
    node = found[1]
    names = [node.value] if isinstance(node, ScalarNode) else [
        n.value for n in node.value if isinstance(n, ScalarNode)] if isinstance(node, SequenceNode) else []
    out: list[Path] = []
    for name in names:
        out += sorted(p for p in file.parent.glob(name) if p.is_file())
    return out


def _review(path: str, old_format: int) -> list[str]:
    """The `set` templates whose meaning the upgrade changes, to check by hand."""
    from chatrun.definition.loader import load_config
    from chatrun.definition.migrations import FORMAT_CHANGES, set_templates

    if old_format >= 2:
        return []
    config, _ = load_config(path)
    return [f"{where}: review {what}: {FORMAT_CHANGES[2]}" for where, what in set_templates(config)]
