"""Hover documentation for editors: every `description` in schemas/*.json gets a
`markdownDescription` (what the YAML language server shows on hover), written from the
description and the node's `examples` as YAML.

    python -m chatrun.definition.schema_docs          # add the missing ones, in place
    python -m chatrun.definition.schema_docs --check  # exit 1 if any is missing

The files are edited as text, inserting after each description, so their hand-made layout
(and anyone's pending edits to them) survive; tests/test_editor_support.py checks they are
up to date.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

# Values that are data, not schemas: a "description" key inside them is not an annotation.
DATA_KEYWORDS = {"examples", "default", "const", "enum"}
_DESCRIPTION = re.compile(r'"description"\s*:\s*("(?:[^"\\]|\\.)*")')


def markdown(node: dict[str, Any], key: str | None) -> str:
    """The hover text of a schema node: its description, then its examples as YAML."""
    text = node["description"]
    examples = node.get("examples") or []
    if examples:
        shown = "\n".join(_example_yaml(example, key) for example in examples[:3])
        text += f"\n\n**Example{'s' if len(examples) > 1 else ''}**\n\n```yaml\n{shown}\n```"
    return text


def _example_yaml(example: Any, key: str | None) -> str:
    """`key: value` on one line (collections in flow style), or the bare value as block YAML."""
    if key is None:
        return yaml.safe_dump(example, sort_keys=False, allow_unicode=True).rstrip("\n").removesuffix("\n...")
    flow = yaml.safe_dump(example, sort_keys=False, allow_unicode=True, default_flow_style=True, width=10_000)
    return f"{key}: {flow.strip().removesuffix('...').strip()}"


def _descriptions(node: Any, key: str | None = None, data: bool = False) -> list[tuple[dict, str | None, bool]]:
    """Every string-valued "description" in document order: (its node, the property name the
    node documents, whether it is a schema annotation rather than data)."""
    found: list[tuple[dict, str | None, bool]] = []
    if isinstance(node, list):
        for item in node:
            found += _descriptions(item, None, data)
    elif isinstance(node, dict):
        for k, v in node.items():
            if k == "description" and isinstance(v, str):
                found.append((node, key, not data))
            elif k == "properties" and isinstance(v, dict) and not data:
                for name, sub in v.items():
                    found += _descriptions(sub, name, data)
            else:
                found += _descriptions(v, None, data or k in DATA_KEYWORDS)
    return found


def add_markdown(text: str) -> str:
    """The schema text with a markdownDescription after every description that lacks one."""
    nodes = _descriptions(json.loads(text))
    matches = list(_DESCRIPTION.finditer(text))
    if len(matches) != len(nodes):
        raise ValueError(f"found {len(matches)} description strings in the text but {len(nodes)} in the JSON")
    out, last = [], 0
    for (node, key, annotation), m in zip(nodes, matches, strict=True):
        if not annotation or "markdownDescription" in node:
            continue
        out += [text[last:m.end()], ', "markdownDescription": ', json.dumps(markdown(node, key), ensure_ascii=False)]
        last = m.end()
    out.append(text[last:])
    result = "".join(out)
    json.loads(result)  # still JSON
    return result


def missing(text: str) -> list[str]:
    """The descriptions (their first words) with no markdownDescription."""
    return [node["description"][:60] for node, _key, annotation in _descriptions(json.loads(text))
            if annotation and "markdownDescription" not in node]


def schema_files() -> list[Path]:
    from chatrun.definition.schemas import schema_path

    return [schema_path(name) for name in ("bot.schema.json", "transcript.schema.json", "wire.schema.json")]


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    status = 0
    for path in schema_files():
        text = path.read_text(encoding="utf-8")
        if check:
            for description in missing(text):
                print(f"{path}: no markdownDescription for: {description}")
                status = 1
            continue
        new = add_markdown(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"updated {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
