"""The text edits `chatrun upgrade` makes, found by node positions (yaml.compose marks).

Every edit replaces one span of the file's text; everything outside the spans (comments,
quoting, blank lines, key order) stays byte for byte. Format 2 -> 3 (docs/format.md,
"From format 2"):

- `ask: {into: PATH}` of a tool's action: the entry leaves `ask` and the action gets
  `set: {PATH: '{{ result }}'}` (one vocabulary for writing state);
- an approval's `ask: TEXT` and `tell: TEXT` become `ask: {text: TEXT, tell: TEXT}` (one shape
  for a question);
- `emit: {Message: TEXT}` becomes `message: TEXT` (messages said one way).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode


@dataclass
class Edits:
    """Spans of `text` to replace, and a line of what each did (for the user)."""

    text: str
    spans: list[tuple[int, int, str]] = field(default_factory=list)
    said: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, what changed)
    review: list[tuple[int, str]] = field(default_factory=list)  # (1-based line, what to do by hand)

    def replace(self, start: int, end: int, new: str) -> None:
        self.spans.append((start, end, new))

    def applied(self) -> str:
        out = self.text
        for start, end, new in sorted(self.spans, key=lambda s: (s[0], s[1]), reverse=True):
            out = out[:start] + new + out[end:]
        return out


# libyaml, as the loader reads bots (definition/yamlpos.py): PyYAML's own parser refuses some
# files libyaml takes (`{ask: Sure?, tell: x}`). Its marks count characters, not a BOM (cli/upgrade.py
# takes the BOM off first).
_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def compose(text: str) -> Node | None:
    return yaml.compose(text, Loader=_LOADER)


def get(mapping: Node | None, key: str) -> tuple[ScalarNode, Node] | None:
    if not isinstance(mapping, MappingNode):
        return None
    for k, v in mapping.value:
        if isinstance(k, ScalarNode) and k.value == key:
            return k, v
    return None


def source(edits: Edits, node: Node) -> str:
    return edits.text[node.start_mark.index:node.end_mark.index]


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def after_line(text: str, index: int) -> int:
    """The start of the line after the one `index` is on. A node that ends at a line start, or in
    the next line's indentation (a block mapping ends at the next key), ends at that line start."""
    start = _line_start(text, index)
    if not text[start:index].strip(" "):
        return start
    nl = text.find("\n", index)
    return len(text) if nl < 0 else nl + 1


def remove_pair(edits: Edits, mapping: MappingNode, key: ScalarNode, value: Node, keep_comment: bool = True) -> None:
    """Take one `key: value` out of a mapping: its whole lines but the comment at their end (block;
    not when the pair moves elsewhere with it, `moved_value`), or it and a comma (flow)."""
    text = edits.text
    if mapping.flow_style:
        start, end = key.start_mark.index, value.end_mark.index
        after = text[end:].lstrip(" ")
        if after.startswith(","):
            end = text.index(",", end) + 1
            end += len(text[end:]) - len(text[end:].lstrip(" "))
        else:
            before = text[:start].rstrip(" ")
            if before.endswith(","):
                start = len(before) - 1
        edits.replace(start, end, "")
        return
    end = after_line(text, value.end_mark.index)
    comment = text[value.end_mark.index:end].strip()  # `into: state.x   # why`: the comment stays, on its own line
    kept = f"{' ' * key.start_mark.column}{comment}\n" if comment.startswith("#") and keep_comment else ""
    edits.replace(_line_start(text, key.start_mark.index), end, kept)


def add_pair(edits: Edits, mapping: MappingNode, key: str, value: str) -> None:
    """Add `key: value` (one line of YAML source) at the end of a mapping."""
    text = edits.text
    if mapping.flow_style:
        close = text.rindex("}", 0, mapping.end_mark.index)
        body = text[mapping.start_mark.index + 1:close].strip()
        edits.replace(close, close, f"{', ' if body else ''}{key}: {value}")
        return
    last_key, last_value = mapping.value[-1]
    indent = " " * last_key.start_mark.column
    at = after_line(text, last_value.end_mark.index)
    prefix = "" if at == 0 or text[at - 1] == "\n" else "\n"
    edits.replace(at, at, f"{prefix}{indent}{key}: {value}\n")


def flow_safe(edits: Edits, node: Node) -> str:
    """The node's source as it can stand inside a flow mapping (a plain scalar with `{`, `,` ...
    is quoted)."""
    src = source(edits, node)
    if isinstance(node, ScalarNode) and node.style is None and any(c in src for c in "{}[],#"):
        return json.dumps(node.value, ensure_ascii=False)
    return src


def nested(edits: Edits, node: Node, indent: int) -> str:
    """A value's source moved `indent` columns deeper, or shallower when negative (the lines after its first)."""
    text = source(edits, node)
    # A block scalar's source ends with its last line break: the line after it is not the value's.
    text, end = (text[:-1], "\n") if text.endswith("\n") else (text, "")
    if indent >= 0:
        return text.replace("\n", "\n" + " " * indent) + end
    return text.replace("\n" + " " * -indent, "\n") + end


def moved_value(edits: Edits, value: Node, indent: int) -> str:
    """A block pair's value as it reads after its key on a line moved `indent` columns (`nested`),
    with the comment at the end of its line, and no line break at its end (a block scalar's source
    ends with one: the line after it must not start with its indentation)."""
    text = nested(edits, value, indent)
    text = text[:-1] if text.endswith("\n") else text
    tail = edits.text[value.end_mark.index:after_line(edits.text, value.end_mark.index)].rstrip("\n")
    return text + tail if tail.strip().startswith("#") else text


_ALIAS = re.compile(r"\s*:?\s*\*[^\s,\]}]+")


def value_end(text: str, key: Node, value: Node) -> int:
    """Where a pair's value ends in the text. An alias (`<<: *base`, `set: *common`) is the node it
    names, whose marks are the anchor's, elsewhere in the file: its own text is `*name` after the key."""
    if value.start_mark.index >= key.end_mark.index:
        return int(value.end_mark.index)
    found = _ALIAS.match(text, key.end_mark.index)
    return found.end() if found else int(key.end_mark.index)


def reorder(edits: Edits, mapping: MappingNode, rank: dict[str, int]) -> bool:
    """Put the keys `rank` orders in that order, each with its value and comments, in the places
    those keys held (the other keys stay where they are). Returns whether anything moved."""
    text = edits.text
    pairs = mapping.value
    ranked = [i for i, (k, _) in enumerate(pairs) if isinstance(k, ScalarNode) and k.value in rank]
    wanted = sorted(ranked, key=lambda i: rank[pairs[i][0].value])
    if wanted == ranked:
        return False
    ends = [value_end(text, k, v) for k, v in pairs]
    if mapping.flow_style:
        spans = [(k.start_mark.index, end) for (k, _), end in zip(pairs, ends, strict=True)]
    else:
        starts = [_line_start(text, pairs[0][0].start_mark.index)] + [after_line(text, end) for end in ends[:-1]]
        spans = list(zip(starts, [*starts[1:], after_line(text, ends[-1])], strict=True))
    pieces = [text[a:b] if mapping.flow_style or text[a:b].endswith("\n") else text[a:b] + "\n" for a, b in spans]
    for slot, source_index in zip(ranked, wanted, strict=True):
        a, b = spans[slot]
        piece = pieces[source_index]
        if not mapping.flow_style and not text[a:b].endswith("\n"):
            piece = piece[:-1]  # the file's last line had no newline: neither has what takes its place
        edits.replace(a, b, piece)
    return True
