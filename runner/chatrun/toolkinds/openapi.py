"""The `openapi:` tool kind: `openapi: {spec, operation}` becomes an HTTP tool.

The operation (found by its `operationId`) gives the method, the path, the description
and the arguments: path and query parameters become properties of the tool's
`parameters`, a JSON request body becomes its `body` property. Path parameters are put
into the URL escaped (`urlsegment`), query parameters are sent when the model gives them.
The error statuses the operation documents (a 404, a 409) are results for the action, not
failures: the document says they are answers.
Declared once, in the document; read and checked when the bot loads (`resolve`), which
turns the tool into an `http:` one: its call, checks and mocks are those of `http`, so
this kind has no runtime of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from chatrun.definition.config import Location, ToolConfig
from chatrun.definition.kinds import Load, in_table_order
from chatrun.definition.sources import suggest
from chatrun.definition.yamlpos import YamlDoc
from chatrun.errors import ChatrunError
from chatrun.toolkinds.base import ToolKind
from chatrun.toolkinds.http import HttpConfig, idempotency_header

METHODS = ("get", "post", "put", "patch", "delete")


@dataclass
class OpenApiRef:
    """A tool made from an OpenAPI operation (`openapi:` of a tool)."""

    spec: str  # the document, relative to the bot directory
    operation: str  # its operationId
    base_url: str | None = None  # template; default: the document's first server
    headers: dict[str, Any] = field(default_factory=dict)  # templates, e.g. Authorization
    idempotency_key: Any = None  # as `http.idempotency_key` (None: the default for the method)


class OpenApiKind(ToolKind[OpenApiRef]):
    key: ClassVar[str] = "openapi"

    def parse(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> OpenApiRef | None:
        section = raw.get("openapi")
        if (not isinstance(section, dict) or not isinstance(section.get("spec"), str)
                or not isinstance(section.get("operation"), str)):
            return None
        base_url, headers = section.get("base_url"), section.get("headers")
        return OpenApiRef(section["spec"], section["operation"], base_url if isinstance(base_url, str) else None,
                          dict(headers) if isinstance(headers, dict) else {}, section.get("idempotency_key"))

    def resolve(self, tools: list[ToolConfig], load: Load) -> None:
        """Give each `openapi:` tool the HTTP call, description and parameters its operation
        declares: it becomes an `http:` tool (or loses this kind, its problem reported)."""
        specs: dict[Path, dict[str, Any] | str] = {}
        for tool in tools:
            ref = tool.kinds.pop(self.key, None)
            if isinstance(ref, OpenApiRef):
                _resolve(tool, ref, load, specs)


def _resolve(tool: ToolConfig, ref: OpenApiRef, load: Load, specs: dict[Path, dict[str, Any] | str]) -> None:
    sources, root = load.sources, load.root
    raw = sources.doc_of("tools", tool.name).data["tools"][tool.name]
    try:
        path = (root / ref.spec).resolve()
        if not path.is_relative_to(root.resolve()):
            raise ChatrunError(f"the OpenAPI document {ref.spec} is outside the bot directory {root}")
        if path not in specs:
            try:
                specs[path] = read_spec(path)
            except ChatrunError as exc:
                specs[path] = str(exc)
        spec = specs[path]
        if isinstance(spec, str):
            raise ChatrunError(spec)
        http, description, parameters = operation_tool(ref, spec, tool.where)
    except ChatrunError as exc:
        load.diagnostics.append(sources.diag("error", f"tool `{tool.name}`: {exc}", "tools", tool.name, "openapi"))
        return
    if "parameters" in raw or "http" in raw:
        load.diagnostics.append(sources.diag("error", f"tool `{tool.name}` takes its HTTP call and parameters from "
                                             "its OpenAPI operation; remove `parameters:` and `http:` (declared once)",
                                             "tools", tool.name, "openapi"))
        return
    tool.kinds = in_table_order({**tool.kinds, "http": http})
    tool.parameters = parameters
    tool.description = tool.description or description


def read_spec(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ChatrunError(f"cannot read the OpenAPI document {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ChatrunError(f"the OpenAPI document {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                           f"{str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("paths"), dict):
        raise ChatrunError(f"{path} is not an OpenAPI document: it has no `paths:`")
    return data


def operation_tool(ref: OpenApiRef, spec: dict[str, Any], where: Location) -> tuple[HttpConfig, str, dict[str, Any]]:
    """(the HTTP call, the description, the parameters schema) of the referenced operation."""
    found = {op.get("operationId"): (method, path, op, item)
             for path, item in spec["paths"].items() if isinstance(item, dict)
             for method, op in item.items() if method in METHODS and isinstance(op, dict)}
    if ref.operation not in found:
        known = [k for k in found if isinstance(k, str)]
        raise ChatrunError(f"the OpenAPI document {ref.spec} has no operation `{ref.operation}`"
                           f"{suggest(ref.operation, known)} (operationIds: {', '.join(sorted(known)) or 'none'})")
    method, path, op, item = found[ref.operation]
    base = ref.base_url or _server_url(spec)
    if not base:
        raise ChatrunError(f"the OpenAPI document {ref.spec} names no server; give `base_url:` "
                           "(e.g. `{{ env.API_URL }}`)")
    properties: dict[str, Any] = {}
    required: list[str] = []
    query: list[str] = []
    schemas = _Schemas(spec)
    for param in [*item.get("parameters", []), *op.get("parameters", [])]:
        param = _deref(param, spec)
        where_in, name = param.get("in"), param.get("name")
        if where_in not in ("path", "query") or not isinstance(name, str):
            continue  # headers and cookies are the bot's to set (`headers:`), not the model's
        schema = dict(_deref(param.get("schema") or {"type": "string"}, spec))
        if param.get("description"):
            schema.setdefault("description", param["description"])
        properties[name] = schemas.convert(schema)
        if where_in == "path" or param.get("required"):
            required.append(name)
        if where_in == "query":
            query.append(name)
    body = _json_body(op, schemas)
    if body is not None:
        properties["body"] = body[0]
        if body[1]:
            required.append("body")
    url = base.rstrip("/") + _templated_path(path)
    documented = [int(code) for code in (op.get("responses") or {}) if str(code).isdigit() and int(code) >= 300]
    http = HttpConfig(url=url, method=method.upper(), headers=dict(ref.headers),
                      json="{{ args.body }}" if body is not None else None,
                      accept=documented, args_in_query=query, where=where, section="openapi",
                      idempotency_header=idempotency_header(ref.idempotency_key, method))
    description = op.get("summary") or op.get("description") or ""
    parameters = {"type": "object", "properties": properties, "required": sorted(set(required))}
    if schemas.defs:
        parameters["$defs"] = schemas.defs
    return http, description, parameters


def _server_url(spec: dict[str, Any]) -> str:
    servers = spec.get("servers")
    if isinstance(servers, list) and servers and isinstance(servers[0], dict):
        return str(servers[0].get("url") or "")
    return ""


def _templated_path(path: str) -> str:
    out, rest = "", path
    while "{" in rest:
        head, _, tail = rest.partition("{")
        name, _, rest = tail.partition("}")
        # `order-id` is no name in a template (`args.order - id`): such a one is read by subscript
        arg = f"args.{name}" if name.isidentifier() else f"args[{json.dumps(name)}]"
        out += head + "{{ " + arg + " | urlsegment }}"
    return out + rest


def _json_body(op: dict[str, Any], schemas: _Schemas) -> tuple[dict[str, Any], bool] | None:
    body = _deref(op.get("requestBody") or {}, schemas.spec)
    content = body.get("content") or {}
    media = content.get("application/json")
    if not isinstance(media, dict):
        return None
    return schemas.convert(media.get("schema") or {}), bool(body.get("required"))


def _deref(node: Any, spec: dict[str, Any]) -> Any:
    """Follow a local `$ref` (`#/components/...`)."""
    seen = 0
    while isinstance(node, dict) and isinstance(node.get("$ref"), str) and seen < 32:
        node, seen = _target(node["$ref"], spec), seen + 1
    return node


def _target(ref: str, spec: dict[str, Any]) -> Any:
    """What a local `$ref` points at (one step)."""
    if not ref.startswith("#/"):
        raise ChatrunError(f"the OpenAPI document refers to {ref}; only references inside it (#/...) are read")
    target: Any = spec
    for part in ref[2:].split("/"):
        target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
    if target is None:
        raise ChatrunError(f"the OpenAPI document's reference {ref} points nowhere")
    return target


@dataclass
class _Schemas:
    """The walk that turns an operation's schemas into the tool's JSON Schema: references are
    written out in place, except a schema that refers to itself (a tree, a thread of replies),
    which cannot be: it goes into the parameters' `$defs` once, referred to by `$ref`."""

    spec: dict[str, Any]
    defs: dict[str, Any] = field(default_factory=dict)  # `$defs` name -> the schema
    recursive: set[str] = field(default_factory=set)  # the references met inside themselves
    within: tuple[str, ...] = ()  # the references being written out, outermost first

    def convert(self, schema: Any) -> Any:
        """An OpenAPI schema as JSON Schema: references resolved, 3.0's `nullable` as a null type."""
        if isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            return self._reference(schema["$ref"])
        if isinstance(schema, list):
            return [self.convert(s) for s in schema]
        if not isinstance(schema, dict):
            return schema
        out = {k: self.convert(v) for k, v in schema.items() if k not in ("nullable", "example", "xml")}
        if schema.get("nullable") and isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        return out

    def _reference(self, ref: str) -> Any:
        name = ref[2:].replace("/", ".")
        if name in self.defs or ref in self.within:
            self.recursive.add(ref)
            return {"$ref": f"#/$defs/{name}"}
        if len(self.within) >= 64:
            raise ChatrunError(f"the OpenAPI document's schemas nest more than 64 references deep at {ref}")
        self.within = (*self.within, ref)
        try:
            out = self.convert(_target(ref, self.spec))
        finally:
            self.within = self.within[:-1]
        if ref not in self.recursive:
            return out
        self.defs[name] = out
        return {"$ref": f"#/$defs/{name}"}
