"""Rewriting parts of a transcript file (`expect:` for --update, `model:` for --record)
while leaving every other byte as it was.

ruamel.yaml reads the file (round trip: comments and positions kept) to find the lines
of each turn's block and to carry the comments of the keys that do not change; only
those lines are replaced in the original text, so the rest of the file, its comments,
quoting and order stay byte-identical.
"""

from __future__ import annotations

import difflib
import io
import json
import re
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.emitter import Emitter
from ruamel.yaml.scalarstring import (
    DoubleQuotedScalarString,
    LiteralScalarString,
    SingleQuotedScalarString,
)
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

from chatrun.errors import ChatrunError
from chatrun.transcripts.expect import escape_unseen, unseen

_RESOLVER = Resolver()  # PyYAML's: how the transcript loader reads a plain scalar
TURN_KEY_ORDER = ("clock", "as", "user", "data", "attach", "approve", "reject", "answer", "operator", "expire", "model", "mocks", "expect", "judged")


class _Escaping:
    """The emitter's stream while it writes a double-quoted scalar: the characters a reader
    cannot see (a no-break space, a zero-width space) go in as escapes, which read back as them."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: Any) -> Any:
        return self.stream.write(escape_unseen(data) if isinstance(data, str) else data)


class _Emitter(Emitter):
    """ruamel's emitter, writing what a reader cannot see in a double-quoted scalar as escapes
    (ruamel writes each printable character as it is, a no-break space too)."""

    def write_double_quoted(self, text: Any, split: Any = True) -> None:
        stream = self.stream
        self.stream = _Escaping(stream)
        try:
            super().write_double_quoted(text, split)
        finally:
            self.stream = stream


def _yaml() -> YAML:
    y = YAML()
    y.Emitter = _Emitter
    y.preserve_quotes = True
    y.width = 4096  # never fold a long line: a diff of the file stays one line per change
    y.indent(mapping=2, sequence=4, offset=2)
    return y


def to_node(value: Any, top: bool = True) -> Any:
    """Plain data as ruamel nodes in a readable style: short lists and mappings of scalars
    in flow style ([main_menu, flight]), one-key items ({Message: ..}) and the rest in
    block style, multi-line text as literal blocks."""
    if isinstance(value, str):
        if _hidden(value):  # double-quoted, where they are written as escapes
            return DoubleQuotedScalarString(value)
        if "\n" in value.strip("\n"):
            return LiteralScalarString(value)
        return SingleQuotedScalarString(value) if _not_text_to_the_reader(value) else value
    if isinstance(value, dict):
        node = CommentedMap()
        for k, v in value.items():
            node[k] = to_node(v, False)
        if not top and len(value) > 1 and _flat(value.values(), value.keys()):
            node.fa.set_flow_style()
        elif not top and len(value) == 0:
            node.fa.set_flow_style()
        return node
    if isinstance(value, list):
        seq = CommentedSeq(to_node(v, False) for v in value)
        if not value or (not any(isinstance(v, dict) for v in value) and _flat(value)):
            seq.fa.set_flow_style()
        return seq
    return value


def _hidden(text: str) -> bool:
    """Whether `text` holds a character a reader of the file would not see: a no-break or
    zero-width space, or a tab (which reads as spaces in a literal block)."""
    return any(c == "\t" or unseen(c) for c in text)


def _not_text_to_the_reader(text: str) -> bool:
    """Text that a plain scalar would not give back: ruamel writes YAML 1.2, where `yes`,
    `no`, `on` and `off` are text, but transcripts are read as YAML 1.1, where they are
    booleans (a user's "yes" to a confirmation would come back as `true`)."""
    return _RESOLVER.resolve(ScalarNode, text, (True, False)) != "tag:yaml.org,2002:str"


def _flat(values: Any, keys: Any = ()) -> bool:
    """Short enough, and simple enough, for one flow-style line."""
    values = list(values)
    for v in values:
        if isinstance(v, list):
            if not _flat(v):
                return False
        elif isinstance(v, dict):
            if not _flat(v.values(), v.keys()):
                return False
        elif not (isinstance(v, (str, int, float, bool)) or v is None):
            return False
        elif isinstance(v, str) and ("\n" in v or ": " in v or "#" in v):
            return False
    return sum(len(str(v)) + 2 for v in [*values, *keys]) < 60


def _same(a: Any, b: Any) -> bool:
    """Equal as plain data (ruamel nodes compare like dicts and lists)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def merge_block(old: Any, new: dict[str, Any]) -> CommentedMap:
    """`new` as a ruamel mapping that keeps, for keys whose value did not change, the old
    node (with its comments and style)."""
    out = CommentedMap()
    for key, value in new.items():
        if isinstance(old, CommentedMap) and key in old and _same(old[key], value):
            out[key] = old[key]
        else:
            out[key] = to_node(value, False) if not isinstance(value, dict) else to_node(value, True)
    if isinstance(old, CommentedMap):
        # Comments attached to kept keys (ruamel keeps them in .ca.items) travel with them.
        for key in out:
            if key in old and key in old.ca.items:
                out.ca.items[key] = old.ca.items[key]
    return out


def rewrite_turns(path: str | Path, changes: dict[int, dict[str, Any]]) -> bool:
    """Replace (or add) keys of turns in a transcript file: `changes` maps a 0-based turn
    index to {key: new plain value} for keys `model` and `expect`. Returns True when the
    file changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    y = _yaml()
    try:
        root = y.load(text)
    except Exception as exc:  # ruamel raises many kinds
        raise ChatrunError(f"{path}: cannot read the transcript for rewriting: {exc}") from exc
    lines = text.splitlines(keepends=True)
    turns = root["turns"]
    edits: list[tuple[int, int, list[str]]] = []
    for index, keys in sorted(changes.items()):
        turn = turns[index]
        first = next(i for i, each in enumerate(turns) if each is turn)
        if first != index:  # `- *t`: its text is turn `first`'s; an edit there would change both
            alias = f"*{turn.anchor.value}"
            said = re.compile(rf"\s*-\s+{re.escape(alias)}(\s|$)")  # ruamel keeps no line for an alias
            line = next((f":{n}" for n, text in enumerate(lines, 1) if said.match(text)), "")
            raise ChatrunError(f"{path}{line}: turn {index + 1} is an alias of turn {first + 1} (`{alias}`); "
                               "write it out to update it")
        if not isinstance(turn, CommentedMap) or turn.fa.flow_style():
            raise ChatrunError(f"{path}:{turns.lc.item(index)[0] + 1}: turn {index + 1} is written in flow style; "
                               "write it as a block mapping to update it")
        for key, value in keys.items():
            if key in turn and _same(turn[key], value):
                continue
            if key in turn and key not in turn.lc.data:  # from `<<: *t`: its lines are another turn's
                raise ChatrunError(f"{path}:{turns.lc.item(index)[0] + 1}: turn {index + 1} takes `{key}` from "
                                   "another (`<<:`); write it out to update it")
            edits += _edit(y, root, turns, index, key, value, lines)
    if not edits:
        return False
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        lines[start:end] = new
    _write_as_before(path, "".join(lines))
    return True


def _edit(y: YAML, root: CommentedMap, turns: CommentedSeq, index: int, key: str, value: Any,
          lines: list[str]) -> list[tuple[int, int, list[str]]]:
    turn = turns[index]
    keys = list(turn)
    col = turn.lc.key(keys[0])[1]
    turn_end = _trim(lines, turn.lc.key(keys[0])[0], _turn_end(root, turns, index, len(lines)), col)
    block: Any  # a node as to_node makes it: CommentedMap, CommentedSeq or a scalar
    if isinstance(value, dict):
        block = merge_block(turn.get(key), value)
    else:
        block = to_node(value, False)
        if isinstance(block, CommentedSeq):
            block.fa.set_block_style()
            if key == "model" and isinstance(turn.get(key), CommentedSeq):
                block = _keep_model_items(turn[key], value, block)
    if key in turn:
        start = turn.lc.key(key)[0]
        later = [k for k in keys[keys.index(key) + 1:]]
        end = turn.lc.key(later[0])[0] if later else turn_end
        end = _trim(lines, start, end, col)
        old = turn[key]
        if isinstance(value, dict) and isinstance(old, CommentedMap) and old and not old.fa.flow_style() \
                and old.lc.key(next(iter(old)))[0] > start:
            return _map_edits(y, old, value, block, start, end, lines)
        return [(start, end, _dump(y, key, block, col))]
    new = _dump(y, key, block, col)
    # A new key: before the first existing key that comes after it in the usual order.
    after = TURN_KEY_ORDER[TURN_KEY_ORDER.index(key) + 1:] if key in TURN_KEY_ORDER else ()
    for k in keys:
        if k in after:
            at = turn.lc.key(k)[0]
            return [(at, at, new)]
    return [(turn_end, turn_end, new)]


def _map_edits(y: YAML, old: CommentedMap, value: dict[str, Any], block: CommentedMap, start: int, end: int,
               lines: list[str]) -> list[tuple[int, int, list[str]]]:
    """Edits inside a block mapping, key by key: unchanged keys keep their lines as they are."""
    keys = list(old)
    col = old.lc.key(keys[0])[1]
    edits: list[tuple[int, int, list[str]]] = []
    for i, key in enumerate(keys):
        k_start = old.lc.key(key)[0]
        k_end = _trim(lines, k_start, old.lc.key(keys[i + 1])[0] if i + 1 < len(keys) else end, col)
        if key not in value:
            edits.append((k_start, k_end, []))
        elif not _same(old[key], value[key]):
            items = _seq_edits(y, old[key], value[key], block[key], k_start, k_end, lines)
            edits += items if items is not None else [(k_start, k_end, _dump(y, key, block[key], col))]
    added = [k for k in value if k not in old]
    if added:
        at = _trim(lines, start, end, col)
        new: list[str] = []
        for key in added:
            new += _dump(y, key, block[key], col)
        edits.append((at, at, new))
    return edits


def _seq_edits(y: YAML, old: Any, value: Any, block: Any, start: int, end: int,
               lines: list[str]) -> list[tuple[int, int, list[str]]] | None:
    """Edits inside a block list, item by item: the items that still hold keep their lines, and
    so do the comments between them (one changed event of twenty rewrites that event's lines; an
    event more or less is one item added or removed, the others matched as they are).
    None when the list is not one written in block style, one `- ` item per line start."""
    if not (isinstance(old, CommentedSeq) and isinstance(value, list) and old and not old.fa.flow_style()):
        return None
    dashes = [_dash_at(lines, *old.lc.item(i)) for i in range(len(old))]
    starts = [d for d in dashes if d is not None]
    if len(starts) < len(old) or starts[0][0] <= start:  # an item with no dash of its own, or on the key's line
        return None
    dash = starts[0][1]
    bounds = [line for line, _ in starts] + [end]

    def after(i: int) -> int:  # where item i's lines end: the comments below it are the next item's
        return _trim(lines, bounds[i], bounds[i + 1], dash)

    def new_lines(j1: int, j2: int) -> list[str]:
        return [line for item in block[j1:j2] for line in _dump_item(y, item, dash)]

    matcher = difflib.SequenceMatcher(None, [_key(v) for v in old], [_key(v) for v in value], autojunk=False)
    edits: list[tuple[int, int, list[str]]] = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "replace" and i2 - i1 == j2 - j1:  # as many items: each in place, the comments between kept
            edits += [(bounds[i], after(i), new_lines(j, j + 1)) for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
        elif op in ("replace", "delete"):  # removed items go with the comments above them
            edits.append((after(i1 - 1) if i1 else bounds[i1], after(i2 - 1), new_lines(j1, j2)))
        elif op == "insert":  # after the item before, above the comments of the item after
            at = after(i1 - 1) if i1 else bounds[0]
            edits.append((at, at, new_lines(j1, j2)))
    return edits


def _key(item: Any) -> str:
    """An item as plain data, for matching the old list's items with the new one's."""
    return json.dumps(item, sort_keys=True, default=str)


def _dash_at(lines: list[str], line: int, col: int) -> tuple[int, int] | None:
    """The line and column of the `-` that starts a list item whose value ruamel places at
    (line, col); None when the value is not on its dash's line (`-` alone on a line)."""
    before = lines[line][:col].rstrip() if line < len(lines) else ""
    return (line, len(before) - 1) if before.endswith("-") and not before[:-1].strip() else None


def _dump_item(y: YAML, node: Any, dash: int) -> list[str]:
    """One list item's lines, its `-` at column `dash`."""
    dumped = _dump(y, "x", CommentedSeq([node]), 0)[1:]  # "x:" then "  - ..." (the sequence's offset)
    shift = len(dumped[0]) - len(dumped[0].lstrip()) - dash
    if shift >= 0:  # every line of the item is indented at least as far as its dash was
        return [line[shift:] if line.strip() else line for line in dumped]
    return [" " * -shift + line if line.strip() else line for line in dumped]


def _keep_model_items(old: CommentedSeq, value: list, block: CommentedSeq) -> CommentedSeq:
    for i, item in enumerate(value):
        if i < len(old) and _same(old[i], item):
            block[i] = old[i]
    return block


def _turn_end(root: CommentedMap, turns: CommentedSeq, index: int, total: int) -> int:
    if index + 1 < len(turns):
        return turns.lc.item(index + 1)[0]
    keys = list(root)
    after = keys[keys.index("turns") + 1:]
    return root.lc.key(after[0])[0] if after else total


def _trim(lines: list[str], start: int, end: int, col: int) -> int:
    """Leave blank lines and comments (at or left of `col`) that end a block where they are:
    they belong to what follows."""
    while end > start + 1:
        line = lines[end - 1]
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not stripped or (stripped.startswith("#") and indent <= col):
            end -= 1
            continue
        break
    return end


def _dump(y: YAML, key: str, node: Any, col: int) -> list[str]:
    buf = io.StringIO()
    y.dump({key: node}, buf)
    pad = " " * col
    return [(pad + line if line.strip() else line) for line in buf.getvalue().splitlines(keepends=True)]


def _write_as_before(path: Path, text: str) -> None:
    """`text` (read with `\\n` line ends) in place of the file, with CRLF line ends if all of its had them:
    an update changes the lines it rewrites, not every line of a file written on Windows."""
    raw = path.read_bytes()
    crlf = b"\n" in raw and raw.count(b"\r\n") == raw.count(b"\n")
    path.write_text(text, encoding="utf-8", newline="\r\n" if crlf else "\n")


def pin_tokenizer(path: str | Path, tokenizer: str | None) -> bool:
    """Write `tokenizer: NAME` above `turns:` in a transcript that pins none, so its token
    windows replay the same on every machine. Returns True when the file changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    root = _yaml().load(text)
    if not tokenizer or not isinstance(root, CommentedMap) or "tokenizer" in root or "turns" not in root:
        return False
    lines = text.splitlines(keepends=True)
    at = root.lc.key("turns")[0]
    lines.insert(at, f"tokenizer: {tokenizer}  # the token counter its windows were written with\n")
    _write_as_before(path, "".join(lines))
    return True


def update_from_result(result: Any, accept_errors: bool = False, notes: list[str] | None = None) -> bool:
    """Rewrite the `expect:` blocks of a transcript from what its run (a run.Result) observed.
    Returns True when the file changed. A turn that ends in an Error it does not expect is the
    bot failing, not a changed reply: the file is left as it was (ChatrunError at the turn's
    line), unless `accept_errors` (`/save` writes a conversation as it happened, errors too).
    `notes` gets one line for each turn whose `error:` the rewrite adds, drops or changes
    (error_notes): a behaviour change the author should see said, not only in the diff."""
    from chatrun.transcripts.expect import updated

    if result.transcript is None:
        return False
    if not accept_errors:
        refuse_unexpected_error(result)
    changes = {}
    for tr in result.turns:
        if tr.observed is None:
            continue
        new = updated(tr.turn.expect, tr.observed)
        if tr.turn.expect is None or not _same(tr.turn.expect, new):
            changes[tr.turn.index - 1] = {"expect": new}
            if notes is not None:
                notes += error_notes(result.transcript, tr.turn, new)
    if not changes:  # a passing transcript keeps every byte
        return False
    # The expectations just written hold for the counter this run counted with: pin it.
    return pin_tokenizer(result.transcript.file, result.tokenizer) | rewrite_turns(result.transcript.file, changes)


def error_notes(transcript: Any, turn: Any, new: dict[str, Any]) -> list[str]:
    """The line saying how a turn's expected error changes from `turn.expect` to `new`, at the
    line of its `expect:` as the file was (none when it does not change)."""
    before, after = (turn.expect or {}).get("error", False), new.get("error", False)
    if _same(before, after):
        return []
    where = f"{transcript.file}:{turn.expect_line or turn.line}: turn {turn.index}"
    if after is False:
        return [f"{where}: `error:` dropped: the turn now succeeds (it expected the error {_shown(before)})"]
    if before is False:
        return [f"{where}: `error:` added: the turn now fails with {_shown(after)}"]
    return [f"{where}: `error:` changed: {_shown(before)} -> {_shown(after)}"]


def _shown(value: Any) -> str:
    """An expected error as one line: its text quoted, a matcher or `true` as JSON."""
    return json.dumps(value, ensure_ascii=False)


def refuse_unexpected_error(result: Any) -> None:
    """--update never decides that a turn may fail: the first turn ending in an Error it does not
    expect (no `error:`, or `error: false`) raises, naming its line. A turn without `error:` whose
    scripted model response fails (`{error: ...}`) is the transcript's own doing: its Error may be
    written; `error: false` (a fallback must answer it) never is overwritten."""
    for tr in result.turns:
        turn, obs, expect = tr.turn, tr.observed, tr.turn.expect or {}
        if obs is None or obs.error is None or expect.get("error", False) is not False:
            continue
        if "error" not in expect and any(isinstance(r, dict) and "error" in r for r in turn.model):
            continue
        raise ChatrunError(
            f"{result.transcript.file}:{turn.line}: --update left this transcript as it was: turn {turn.index} "
            f"ends in an Error it does not expect ({obs.error}). That is the bot failing, not a changed reply: "
            "fix the bot; if the turn should fail, write its `error:` (true, or a matcher on the text) yourself")
