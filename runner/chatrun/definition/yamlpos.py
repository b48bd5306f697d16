"""YAML loading that remembers where every node came from.

pyyaml's `safe_load` forgets positions and silently keeps the last of two equal keys.
Validation needs both: every diagnostic names the line of the node at fault, and a
duplicate key is an error naming both lines. So we let libyaml (when available)
compose the node tree, then build the Python values ourselves in one pass,
recording a position per JSON path.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import yaml

from chatrun.errors import Diagnostic

_BaseLoader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _AnyCharacter:
    def __contains__(self, item: object) -> bool:
        return True


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """The safe loader with a quicker tag resolver: the same tags, found with less work.

    libyaml composes in C but calls this Python method once per node: on a 5,000-route bot
    that is half a million calls. PyYAML's resolver builds a list of candidate regexes for
    every plain scalar; most scalars are keys and words whose first character no implicit
    resolver claims (`description`, `You are...`), so they are text without trying any.
    The rest (`true`, `12`, `null`, `no`...) are resolved by PyYAML itself and remembered
    for the document, since the same few values recur."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._resolved: dict[str, str] = {}
        if not self.yaml_path_resolvers:
            # libyaml also calls descend_resolver(parent, index) and ascend_resolver() around
            # every node; without path resolvers (the safe loader has none) both do nothing.
            # C callables that do nothing cost a fraction of PyYAML's Python methods.
            nothing: dict[Any, Any] = {}
            self.descend_resolver = nothing.get  # (parent, index) -> index, unused
            self.ascend_resolver = ().__len__

    def resolve(self, kind: type, value: Any, implicit: tuple[bool, bool]) -> str:
        if kind is yaml.ScalarNode:
            if not implicit[0]:  # quoted or block text: PyYAML too returns the string tag here
                return _STR
            if value and value[0] not in _RESOLVED_FIRST:
                return _STR
            tag = self._resolved.get(value)
            if tag is None:
                tag = self._resolved[value] = super().resolve(kind, value, implicit)
            return tag
        return _SEQ if kind is yaml.SequenceNode else _MAP

Path = tuple  # a JSON path: ("routes", "flight", "tools", 0)

# Bounds against pathological YAML: no bot nests deeper than a few dozen levels, and aliases
# may repeat parts of a file but not multiply it (a "billion laughs" 9^9 alias bomb would
# otherwise build ~400 million values).
MAX_DEPTH = 100
ALIAS_GROWTH = 10  # values built may exceed the file's own nodes by this factor...
ALIAS_SLACK = 100_000  # ...plus this many
# Where an anchor (`&name`) may stand: a node property follows white space, the start of the
# text or a flow indicator (`[&a x]`, `{"k":&a v}`). Text without one has no anchors, hence no
# aliases (an alias of an undefined anchor does not compose): every node is built once, so the
# guard cannot trip and its count of the file's nodes (a second walk of the whole tree) is skipped.
# A false match ("a &b" inside a string) only costs that count.
_AMPERSAND_NAME = re.compile(r"&[^\s\[\]{},]")  # starts with a literal: re skips to each `&` at C speed
_BEFORE_AN_ANCHOR = frozenset("[]{},:\ufeff")


def _may_hold_an_anchor(text: str) -> bool:
    for match in _AMPERSAND_NAME.finditer(text):
        at = match.start()
        if at == 0 or text[at - 1].isspace() or text[at - 1] in _BEFORE_AN_ANCHOR:
            return True
    return False


class _TooBig(Exception):
    def __init__(self, node: yaml.Node, message: str):
        self.node, self.message = node, message

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_MERGE = "tag:yaml.org,2002:merge"
_SEQ = "tag:yaml.org,2002:seq"
_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_FLOAT = "tag:yaml.org,2002:float"
# Scalar tags whose values JSON can hold (timestamps are kept as their text).
_JSON_SCALARS = frozenset({"tag:yaml.org,2002:null", "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", _FLOAT})
# The first characters of plain scalars that some implicit resolver may claim (any other
# plain scalar is text). A resolver for any first character (key None) would void the shortcut:
# then every character counts as claimed.
_RESOLVERS = yaml.SafeLoader.yaml_implicit_resolvers  # the dict CSafeLoader uses too
_RESOLVED_FIRST: Any = _AnyCharacter() if None in _RESOLVERS else frozenset(k for k in _RESOLVERS if k)


class Pos(NamedTuple):
    """Where a node is: `line`/`col` (1-based) of its key for mapping entries (of the item
    itself for sequence items and the document), `value_line`/`value_col` of its value,
    and the value's scalar `style` ('|' and '>' are block scalars whose text starts on
    the next line)."""

    line: int
    col: int
    value_line: int
    value_col: int
    style: str | None = None


@dataclass
class YamlDoc:
    """A loaded YAML file: its data, the position of every node, and the problems found."""

    file: str
    data: Any = None
    # A dict from the full builder; NodePositions (read from the node tree on demand) after the fast build.
    positions: Mapping[Path, Pos] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    text: str = ""
    # Dotted paths of values JSON cannot hold (`.nan`, `!!binary`): reported here, their text
    # kept as a stand-in, so the loader drops later complaints about the stand-in.
    replaced: set[str] = field(default_factory=set)
    # Dotted paths of mappings that hold `<<: *anchor`: the line of `<<:` and the keys it brought
    # (those the mapping does not write itself), which read where `<<:` stands.
    merged: dict[str, tuple[int, frozenset]] = field(default_factory=dict)
    _lines: list[str] | None = field(default=None, repr=False)

    def indent(self, line: int) -> int:
        """The 1-based column of the first non-blank character of `line` (1 when unknown)."""
        if self._lines is None:
            self._lines = self.text.splitlines()
        if not 1 <= line <= len(self._lines):
            return 1
        text = self._lines[line - 1]
        return len(text) - len(text.lstrip()) + 1

    def written(self, path: Path) -> str:
        """The last key of `path` as the file spells it: `off`, `null`, `yes`, `1` (YAML reads them
        as False, None, True, 1). Every diagnostic names a key so, never as Python prints its value."""
        key = path[-1]
        if isinstance(key, str):
            return key
        pos = self.pos(path)
        if self._lines is None:
            self._lines = self.text.splitlines()
        line = self._lines[pos.line - 1][pos.col - 1:] if 0 < pos.line <= len(self._lines) else ""
        spelled = re.match(r"[^\s:,{}\[\]]+", line)
        return spelled.group(0) if spelled else json.dumps(key)

    def key_place(self, path: Path) -> tuple[int, int]:
        """`pos(path)`'s line and column alone (of its key; of the item itself in a list): what a
        config object's `where` keeps. The loader asks for tens of thousands of them."""
        if isinstance(self.positions, NodePositions):
            return self.positions.key_place(path)
        pos = self.pos(path)
        return pos.line, pos.col

    def pos(self, path: Path) -> Pos:
        """The position of `path`, or of its nearest ancestor that has one."""
        path = tuple(path)
        if isinstance(self.positions, NodePositions):
            return self.positions.nearest(path)
        while path not in self.positions and path:
            path = path[:-1]
        return self.positions.get(path, Pos(1, 1, 1, 1))


# Pos(...) runs the NamedTuple's __new__, a Python function: building the tuple directly is a
# third of the cost, and a big bot makes one per YAML node.
_new_pos = tuple.__new__


class _Builder:
    def __init__(self, doc: YamlDoc):
        self.doc = doc
        self.positions: dict[Path, Pos] = {}
        doc.positions = self.positions
        # A constructor instance only to turn non-string scalars (ints, bools, dates) into values.
        self.constructor = yaml.SafeLoader("")
        self.scalar_ctors = yaml.SafeLoader.yaml_constructors
        self.open: set[yaml.Node] = set()  # collections being built, to catch recursive aliases
        self.budget = 0  # values left to build; set by start()

    def start(self, root: yaml.Node, text: str) -> Any:
        may_alias = _may_hold_an_anchor(text)
        self.budget = _count_nodes(root) * ALIAS_GROWTH + ALIAS_SLACK if may_alias else sys.maxsize
        return self.build(root, (), None)

    def build(self, node: yaml.Node, path: Path, key_mark: yaml.Mark | None) -> Any:
        # The hot loop of loading a big bot: kept free of extra calls on purpose (isinstance
        # costs no more than reading node.id did, and tells the type checker the node's kind).
        self.budget -= 1
        if self.budget < 0:
            raise _TooBig(node, "YAML aliases expand to too many values (an alias bomb?): each alias "
                          "copies its anchor's value, and nested ones multiply")
        mark = node.start_mark
        km = key_mark or mark
        if isinstance(node, yaml.ScalarNode):
            self.positions[path] = _new_pos(Pos, (km.line + 1, km.column + 1, mark.line + 1, mark.column + 1,
                                                      node.style))
            return node.value if node.tag == _STR else self.scalar(node, path)
        self.positions[path] = _new_pos(Pos, (km.line + 1, km.column + 1, mark.line + 1, mark.column + 1, None))
        if len(path) > MAX_DEPTH:
            self.error(node, f"YAML nested more than {MAX_DEPTH} levels deep; no bot needs that", path)
            return None
        if node in self.open:  # an alias of a node that contains it: `a: &x [*x]`
            self.doc.diagnostics.append(Diagnostic(self.doc.file, mark.line + 1, mark.column + 1, "error",
                                                   "recursive YAML alias: a node cannot contain itself",
                                                   _dotted(path)))
            return None
        if node.tag != (_MAP if isinstance(node, yaml.MappingNode) else _SEQ):  # `!foo {a: 1}`, `!!set`, `!!omap`
            self.error(node, f"unsupported YAML tag `{_short(node.tag)}`: a bot holds only plain mappings, "
                       "lists, strings, numbers, booleans and null", path)
        self.open.add(node)
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path)
            return [self.build(item, (*path, i), None) for i, item in enumerate(node.value)]
        finally:
            self.open.discard(node)

    def scalar(self, node: yaml.ScalarNode, path: Path = ()) -> Any:
        """The value of a scalar that JSON can hold; anything else is a diagnostic (and
        its text is kept, so later checks do not pile up type errors on it)."""
        tag = node.tag
        if tag == _STR or tag == _TIMESTAMP:  # `2001-01-01`: a date is text to a bot
            return node.value
        if tag not in _JSON_SCALARS:  # !!binary, !!python/..., !custom
            self.error(node, f"unsupported YAML tag `{_short(tag)}`: a bot holds only plain mappings, "
                       "lists, strings, numbers, booleans and null (quote the value to make it text)", path)
            return node.value
        try:
            value = self.scalar_ctors[tag](self.constructor, node)
        except (ValueError, yaml.YAMLError) as exc:  # e.g. `!!int abc`
            self.error(node, f"invalid {_short(tag).lstrip('!')} `{node.value}`: {exc}", path)
            return node.value
        if tag == _FLOAT and (value != value or value in (float("inf"), float("-inf"))):
            self.error(node, f"`{node.value}` is not a number JSON can hold (NaN and infinity are not allowed)", path)
            return node.value
        return value

    def error(self, node: yaml.Node, message: str, path: Path, replaced: bool = True) -> None:
        mark = node.start_mark
        self.doc.diagnostics.append(Diagnostic(self.doc.file, mark.line + 1, mark.column + 1, "error", message,
                                               _dotted(path)))
        if replaced:
            self.doc.replaced.add(_dotted(path))

    def mapping(self, node: yaml.MappingNode, path: Path) -> dict:
        merged: dict = {}
        merge_line = 0
        for key_node, value_node in node.value:  # `<<: *anchor` first: explicit keys win, positions too
            if key_node.tag == _MERGE:
                merge_line = merge_line or key_node.start_mark.line + 1
                sources = value_node.value if value_node.id == "sequence" else [value_node]
                for source in sources:
                    if source.id == "mapping":
                        for key, value in self.mapping(source, path).items():
                            merged.setdefault(key, value)
        result: dict = {}
        seen: dict[Any, tuple[int, yaml.ScalarNode]] = {}  # key -> its first line and node
        if merged:  # the keys the mapping does not write itself, read where `<<:` stands (its order)
            own = {key_node.value for key_node, _ in node.value if key_node.tag == _STR}
            merged = {key: value for key, value in merged.items() if key not in own}
            self.doc.merged[_dotted(path)] = (merge_line, frozenset(merged))
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE:
                result.update((key, value) for key, value in merged.items() if key not in result)
                continue
            if key_node.id != "scalar":  # `? [a, b]`: JSON object keys are text
                self.error(key_node, f"mapping keys must be plain scalars{_in(path)}, not a "
                           f"{'list' if key_node.id == 'sequence' else 'mapping'}", path, replaced=False)
                continue
            key = key_node.value if key_node.tag == _STR else self.scalar(key_node, (*path, key_node.value))
            line = key_node.start_mark.line + 1
            if key in seen:
                self.duplicate(key_node, key, seen[key], path)
                continue
            seen[key] = (line, key_node)
            if key_node.tag == _STR:
                result[key] = self.build(value_node, (*path, key), key_node.start_mark)
            else:
                result[key] = self.build_non_text_key(key_node, value_node, key, path)
        return result


    def build_non_text_key(self, key_node: yaml.ScalarNode, value_node: yaml.Node, key: Any, path: Path) -> Any:
        """The value under a key YAML reads as no text (`on:`, `1:`). Its positions are kept under
        the key as written too: the loader names such a (reported) route or tool `on`, not `True`,
        and its later diagnostics look their lines up by that name."""
        before = len(self.positions)
        value = self.build(value_node, (*path, key), key_node.start_mark)
        depth = len(path)
        for at, pos in list(self.positions.items())[before:]:
            self.positions.setdefault((*path, key_node.value, *at[depth + 1:]), pos)
        return value

    def duplicate(self, node: yaml.ScalarNode, key: Any, first: tuple[int, yaml.ScalarNode], path: Path) -> None:
        """A key the mapping already holds. Keys written alike are the same key; keys written apart
        that YAML 1.1 reads as one Python key (`on` and `yes` are both true, and `1` == true) are
        named both as written with their lines, since neither alone is the duplicate."""
        line, earlier = first
        mark = node.start_mark
        if (node.value, node.tag) == (earlier.value, earlier.tag):
            message = (f"duplicate key `{node.value}`{_in(path)}: first defined on line {line}; "
                       "YAML would silently keep only the last one")
        else:
            message = (f"key `{node.value}`{_in(path)} is the same key as `{earlier.value}` on line {line}: YAML reads "
                       f"`{node.value}` as {_json_text(node)} and `{earlier.value}` as "
                       f"{_json_text(earlier)}, one key once loaded; quote them to make them text "
                       f"(`'{node.value}':`, `'{earlier.value}':`)")
        self.doc.diagnostics.append(Diagnostic(self.doc.file, mark.line + 1, mark.column + 1, "error", message,
                                               _dotted((*path, node.value))))


def _json_text(node: yaml.ScalarNode) -> str:
    """How JSON spells the value YAML read from a key's node (`true`, `1`, `null`; a text key quoted)."""
    if node.tag == _STR:
        return f'the text "{node.value}"'
    value = yaml.SafeLoader.yaml_constructors[node.tag](yaml.SafeLoader(""), node)
    return json.dumps(value)


def _count_nodes(root: yaml.Node) -> int:
    """The distinct nodes of a composed document (aliases are shared nodes, counted once)."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                todo.append(key)
                todo.append(value)
    return len(seen)


class _Irregular(Exception):
    """The fast build met something only the full builder handles (and reports)."""


def _plain_values(root: yaml.Node) -> Any:
    """The values of a document without anchors, built without positions: plain mappings
    with text keys, lists, and scalars JSON can hold. Anything else (a duplicate or
    non-text key, a merge, a tag, a bad or non-JSON scalar, deep nesting) raises
    _Irregular, and the full builder builds the document again and says what is wrong.

    Positions are read from the node tree only when a diagnostic asks (NodePositions):
    a valid bot needs a handful, and recording one per node was half the load."""
    scalar_node, mapping_node = yaml.ScalarNode, yaml.MappingNode
    constructor = yaml.SafeLoader("")
    ctors = yaml.SafeLoader.yaml_constructors
    infinities = (float("inf"), float("-inf"))

    def scalar(node: yaml.ScalarNode) -> Any:
        tag = node.tag
        if tag == _TIMESTAMP:
            return node.value
        if tag not in _JSON_SCALARS:
            raise _Irregular
        try:
            value = ctors[tag](constructor, node)
        except (ValueError, yaml.YAMLError):
            raise _Irregular from None
        if tag == _FLOAT and (value != value or value in infinities):
            raise _Irregular
        return value

    def build(node: yaml.Node, depth: int) -> Any:
        if node.__class__ is scalar_node:
            return node.value if node.tag == _STR else scalar(node)
        if depth > MAX_DEPTH:
            raise _Irregular
        depth += 1
        if node.__class__ is mapping_node:
            if node.tag != _MAP:
                raise _Irregular
            result: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = key_node.value
                if key_node.tag != _STR or key_node.__class__ is not scalar_node or key in result:
                    raise _Irregular
                result[key] = build(value_node, depth)
            return result
        if node.tag != _SEQ:
            raise _Irregular
        return [build(item, depth) for item in node.value]

    return build(root, 0)


class NodePositions(Mapping[Path, Pos]):
    """The positions of a fast-built document, read from its node tree when asked. Each path
    found is remembered (the loader asks for a tool, then its action, then its cases), and
    big mappings (`routes:`, `tools:`) are indexed on their first use."""

    def __init__(self, root: yaml.Node):
        self.root = root
        self._found: dict[Path, tuple[yaml.Mark, yaml.Node]] = {(): (root.start_mark, root)}
        self._keys: dict[int, dict[Any, tuple[yaml.Node, yaml.Node]]] = {}

    def _node(self, path: Path) -> tuple[yaml.Mark, yaml.Node] | None:
        """The mark of `path`'s key (of the item itself in a list) and its node, or None."""
        found = self._found.get(path)
        if found is None and path:
            parent = self._node(path[:-1])
            if parent is None:
                return None
            found = self._step(parent[1], path[-1])
            if found is not None:
                self._found[path] = found
        return found

    def _step(self, node: yaml.Node, step: Any) -> tuple[yaml.Mark, yaml.Node] | None:
        if isinstance(node, yaml.MappingNode):
            entry = self._entry(node, step)
            return None if entry is None else (entry[0].start_mark, entry[1])
        if isinstance(node, yaml.SequenceNode) and type(step) is int and 0 <= step < len(node.value):
            item = node.value[step]
            return item.start_mark, item
        return None

    def _entry(self, node: yaml.MappingNode, key: Any) -> tuple[yaml.Node, yaml.Node] | None:
        """The key and value nodes of `key` in a mapping: a scan of a small mapping (most are),
        an index of a big one, built on its first use."""
        entries = node.value
        if len(entries) <= 16:
            for entry in entries:
                if entry[0].value == key:
                    return entry  # type: ignore[no-any-return]
            return None
        index = self._keys.get(id(node))
        if index is None:
            index = self._keys[id(node)] = {k.value: (k, v) for k, v in entries}
        return index.get(key) if isinstance(key, str) else None

    @staticmethod
    def _pos(found: tuple[yaml.Mark, yaml.Node]) -> Pos:
        key_mark, node = found
        mark = node.start_mark
        style = node.style if node.__class__ is yaml.ScalarNode else None
        return _new_pos(Pos, (key_mark.line + 1, key_mark.column + 1, mark.line + 1, mark.column + 1, style))

    def key_place(self, path: Path) -> tuple[int, int]:
        """The line and column of `nearest(path)`'s key, without the rest of its Pos."""
        found = self._found.get(path) or self._node(path)
        while found is None:
            path = path[:-1]
            found = self._node(path)
        mark = found[0]
        return mark.line + 1, mark.column + 1

    def nearest(self, path: Path) -> Pos:
        """The position of `path`, or of its nearest ancestor in the document."""
        found = self._node(path)
        while found is None:
            path = path[:-1]
            found = self._node(path)
        return self._pos(found)

    def __getitem__(self, path: Path) -> Pos:
        found = self._node(tuple(path))
        if found is None:
            raise KeyError(path)
        return self._pos(found)

    def __iter__(self) -> Iterator[Path]:
        todo: list[tuple[Path, yaml.Node]] = [((), self.root)]
        while todo:
            path, node = todo.pop()
            yield path
            if isinstance(node, yaml.MappingNode):
                todo.extend(((*path, k.value), v) for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                todo.extend(((*path, i), v) for i, v in enumerate(node.value))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _syntax_problem(text: str, mark: yaml.Mark | None, problem: str) -> str:
    """libyaml's message, naming a tab as a tab (it says only "found character that cannot
    start any token")."""
    if mark is not None:
        lines = text.splitlines()
        if mark.line < len(lines) and lines[mark.line][mark.column:mark.column + 1] == "\t":
            return "a tab character; YAML indents with spaces only (replace the tab with spaces)"
    return problem


def _short(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag


def _in(path: Path) -> str:
    return f" in `{_dotted(path)}`" if path else ""


def _dotted(path: Path) -> str:
    return ".".join(str(p) for p in path)


def read_yaml_file(path: pathlib.Path) -> YamlDoc:
    """Read and parse one YAML file of a bot. A file that cannot be read, or is not UTF-8
    (named by its line, not the byte offset), is a diagnostic of a document without data."""
    file = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        return YamlDoc(file, diagnostics=[Diagnostic(file, 0, 0, "error", f"cannot read {file}: {exc}")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        return YamlDoc(file, diagnostics=[Diagnostic(
            file, line, col, "error", f"the file is not UTF-8 text: byte {raw[exc.start]:#04x} on line {line} "
            "cannot be decoded; save the file as UTF-8")])
    return load_yaml(text, file)


def load_yaml(text: str, file: str) -> YamlDoc:
    """Parse one YAML document. Syntax errors and duplicate keys become diagnostics
    (the data is None after a syntax error)."""
    doc = YamlDoc(file, text=text)
    try:
        node = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = _syntax_problem(text, mark, exc.problem or "invalid YAML")
        if exc.context:
            started = exc.context_mark
            if started and mark and started.line != mark.line:
                problem = f"{exc.context} (from line {started.line + 1}), {problem}"
            else:
                problem = f"{exc.context}, {problem}"
        doc.diagnostics.append(Diagnostic(
            file, (mark.line + 1) if mark else 0, (mark.column + 1) if mark else 0,
            "error", f"YAML syntax error: {problem}",
        ))
        return doc
    except yaml.YAMLError as exc:  # e.g. more than one document
        doc.diagnostics.append(Diagnostic(file, 1, 1, "error", f"YAML error: {exc}"))
        return doc
    if node is None:
        doc.data = None
        return doc
    if not _may_hold_an_anchor(text):  # no aliases: each node is one value
        try:
            doc.data = _plain_values(node)
            doc.positions = NodePositions(node)
            return doc
        except _Irregular:
            pass
    try:
        doc.data = _Builder(doc).start(node, text)
    except _TooBig as exc:
        mark = exc.node.start_mark
        doc.diagnostics.append(Diagnostic(file, mark.line + 1, mark.column + 1, "error", exc.message))
        doc.data = None
    except yaml.YAMLError as exc:  # a bad scalar, e.g. an impossible timestamp
        mark = getattr(exc, "problem_mark", None)
        doc.diagnostics.append(Diagnostic(file, (mark.line + 1) if mark else 1, (mark.column + 1) if mark else 1,
                                          "error", f"YAML error: {getattr(exc, 'problem', exc)}"))
        doc.data = None
    return doc
