"""Checks the JSON Schema cannot express: cross references, templates, state paths,
handlers, tool parameter schemas and the shape of the route graph.

Each problem is a Diagnostic on the exact line of the YAML node at fault (template
errors on the line inside a multi-line template).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Any
from urllib.parse import urlsplit

from jinja2 import TemplateSyntaxError, nodes

from chatrun.definition import languages
from chatrun.definition.binding import check_binding
from chatrun.definition.catalogs import T_CALL, T_COMPUTED, catalog_checks
from chatrun.definition.config import (
    ACTION_ORDER,
    CHATRUN_BACKEND_TYPES,
    GUARD_OUTCOMES,
    KIND_STAGES,
    MODERATION_CATEGORIES,
    STAGE_OUTCOMES,
    SUMMARY_FACT,
    WHOLE_TEXT_KINDS,
    WIDGET_LOGO_TYPES,
    ActionConfig,
    ApprovalCaseConfig,
    ApprovalConfig,
    AskConfig,
    BotConfig,
    GuardrailConfig,
    Location,
    ModelConfig,
    OperatorConfig,
    RouteConfig,
    ToolConfig,
    UserMemoryConfig,
    declared_arguments,
    duration_seconds,
)
from chatrun.definition.graph import RouteGraph
from chatrun.definition.kinds import kinds
from chatrun.definition.knowledge import check_knowledge
from chatrun.definition.page_texts import direction
from chatrun.definition.sources import Sources, suggest
from chatrun.definition.templates import (
    DISPLAY_VARIABLES,
    ENV,
    TEMPLATE_VARIABLES,
    nested_templates,
    zone_named,
)
from chatrun.definition.versions import policy_problem
from chatrun.definition.yamlpos import YamlDoc
from chatrun.errors import Diagnostic

TOOL_CHOICES = ("auto", "required", "none")  # a route's `tool_choice` besides a tool's name

# A parameter named like the user's consent (`confirmed`, `user_approved`, `consent`, `yes`): the model fills it.
_CONSENT = re.compile(r"^(\w+_)?(confirm\w*|approved|consent\w*|yes)$", re.IGNORECASE)


def _reads_arg(condition: str, name: str) -> bool:
    """Whether a condition reads the argument `name` (`args.name`, `args['name']`)."""
    return re.search(rf"\bargs\s*(\.\s*{re.escape(name)}\b|\[\s*['\"]{re.escape(name)}['\"]\s*\])", condition) is not None


# The checks' memos and shortcuts on a big bot's repeated shapes (a template read once per shape,
# a state path judged once, ...). They change no diagnostic: tests/test_validate_shapes.py turns
# them off and compares every diagnostic of a set of bots.
MEMOS = True

# Dict methods a template may call on state (`state.prefs.get('x')`): not state keys.
_DICT_METHODS = frozenset({"get", "items", "keys", "values"})


def run_checks(config: BotConfig, sources: Sources) -> list[Diagnostic]:
    checker = _Checker(config, sources)
    checker.run()
    return checker.out


def seconds_to_year_9999() -> float:
    """The longest wait a clock can time from now: a datetime ends with the year 9999."""
    return (datetime.max.replace(tzinfo=UTC) - datetime.now(UTC)).total_seconds()



def contrast_with_white(color: str) -> float | None:
    """WCAG 2's contrast ratio of white on `color` (#rrggbb), or None for another form."""
    if not re.fullmatch(r"#[0-9a-fA-F]{6}", color or ""):
        return None

    def linear(channel: str) -> float:
        c = int(channel, 16) / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(color[i:i + 2]) for i in (1, 3, 5))
    return 1.05 / (0.2126 * r + 0.7152 * g + 0.0722 * b + 0.05)

class _Checker:
    def __init__(self, config: BotConfig, sources: Sources):
        self.config = config
        self.src = sources
        self.out: list[Diagnostic] = []
        self.declared_scope: dict[str, Any] = {}
        for route in config.routes.values():
            _merge_decl(self.declared_scope, route.scope.local)
            _merge_decl(self.declared_scope, route.scope.shared)
        self.cache: dict[str, Any] = {}  # what the tool kinds' checks keep for this run
        self.undeclared_paths: dict[str | tuple[str, ...], str | None] = {}  # `undeclared`, once per path
        self.fine_parameters: set[str] = set()  # `parameters` schemas found fine (their repr)
        self.defaults = [r.name for r in config.routes.values() if r.default]
        self.graph = RouteGraph.from_config(config)
        self.visibility = ScopeVisibility(config, self.graph)
        self.routes_of: dict[str, list[str]] = {}  # tool -> the routes that list it
        self.used_keys: dict[str, tuple[str, int, int]] = {}  # t('key') -> where it is first used
        self.computed_keys: dict[str, tuple[str, int, int]] = {}  # t('day.' ~ n): prefix -> where first used
        for route in config.routes.values():
            for name in route.tools:
                self.routes_of.setdefault(name, []).append(route.name)

    def add(self, severity: str, message: str, kind: str, name: str, *sub: Any) -> None:
        self.out.append(self.src.diag(severity, message, kind, name, *sub))

    def quarkus_stream(self, route: RouteConfig) -> None:
        """A Quarkus-dialect chat now gets a streamed reply as one Message unless the route
        says `stream_to_quarkus: true`: a route that asks its model to stream gets a warning
        until it says which it means."""
        if route.stream_to_quarkus is None and (route.model or {}).get("stream") is True:
            self.add("warning", f"route `{route.name}` streams (`model: {{stream: true}}`), but Quarkus-dialect "
                     "WebSocket chats now get its reply as one Message: add `stream_to_quarkus: true` to send them "
                     "Stream chunks (a Quarkus Multi<String> route), or `false` to keep the Message",
                     "routes", route.name, "model", "stream")

    def tool_choice(self, route: RouteConfig) -> None:
        """A route's `tool_choice`: auto, required, none, or one of its tools (a server's tools,
        `mcp:`, are known only when it runs)."""
        choice = route.tool_choice
        if choice is None or choice in TOOL_CHOICES or choice in route.tools or route.kind_config:
            return
        known = [*TOOL_CHOICES, *route.tools]
        self.add("error", f"`tool_choice` of route `{route.name}` is `{choice}`, which is neither auto, required, "
                 f"none nor one of the route's tools{suggest(choice, known)}; the route's tools: "
                 f"{', '.join(route.tools) or 'none'}", "routes", route.name, "tool_choice")

    def output_read_as_call(self, route: RouteConfig) -> None:
        """A route whose JSON answers look like a tool call (`name` and `arguments` or `parameters`):
        under `model.tool_calls: auto` (the default since issue 32) an answer naming one of its
        tools is run as that call instead of being its answer."""
        if route.output is None or not route.tools:
            return
        keys = set((route.output.schema.get("properties") or {}) if isinstance(route.output.schema, dict) else ())
        if "name" in keys and keys & {"arguments", "parameters"} and \
                self.config.route_model(route.name).tool_calls != "native":
            self.add("warning", f"the `output` of route `{route.name}` has `name` and `arguments` (or `parameters`): "
                     f"with `model.tool_calls: {self.config.route_model(route.name).tool_calls}` an answer naming "
                     "one of the route's tools is run as that tool call; set `model: {tool_calls: native}` on the "
                     "route if such answers are answers", "routes", route.name, "output")

    def run(self) -> None:
        self.default_route()
        self.on_change()
        self.encodings()
        self.context_windows()
        self.message_windows()
        for route in self.config.routes.values():
            self.route_tools(route.name, route.tools)
            for field in ("system", "context", "user"):
                source = getattr(route, field)
                if source:
                    self.template(source, f"`{field}` of route `{route.name}`", ("routes", route.name, field), None,
                                  routes=[route.name])
            self.stable_system(route)
            if route.output is not None:
                self.output(route)
            if isinstance(route.choices, list) and route.choices and self.config.catalogs is not None:
                self.untranslated(f"`choices` of route `{route.name}`", ("routes", route.name, "choices"))
            if isinstance(route.choices, str):
                self.template(route.choices, f"`choices` of route `{route.name}`", ("routes", route.name, "choices"),
                              None, routes=[route.name])
            self.quarkus_stream(route)
            self.tool_choice(route)
            self.output_read_as_call(route)
        if self.config.context:
            self.template(self.config.context, "the bot's `context`", ("context",), None,
                          routes=[r.name for r in self.config.routes.values() if r.context is None])
        self.fallbacks()
        self.model_fallbacks()
        self.follow_ups()
        self.outcomes()
        self.display_texts()
        for tool in self.config.tools.values():
            self.tool(tool)
        self.env()
        self.timezones()
        self.retention()
        self.reachable_waits()
        self.user_memory()
        self.widget()
        self.guardrails()
        self.user_budget()
        for kind in kinds():  # the bot-level declarations a tool kind uses (`mcp_servers:`)
            kind.check_bot(self.config, self)
        check_knowledge(self.config, self)
        _graph_checks(self)
        _user_template_checks(self)
        _audience_checks(self)
        self.engine_audience_roles()
        self.format_and_migrations()
        if self.config.catalogs is not None:
            self.out.extend(catalog_checks(self.config.catalogs, self.used_keys, self.computed_keys))

    def user_budget(self) -> None:
        """`limits.max_user_cost` counts money from `prices:`: without any price no call costs
        anything, and the budget never ends a turn. `user_window` without either budget counts nothing."""
        if self.config.limits.max_user_cost is not None and not self.config.prices:
            self.add("warning", "`limits.max_user_cost` counts the cost `prices:` gives each model, and the bot "
                     "gives none, so it never ends a turn: add the price of the bot's models under `prices:` "
                     "(docs/observability.md, \"Budgets\"), or bound tokens with `max_user_tokens`",
                     "limits", "max_user_cost")
        given = self.src.main.data.get("limits") if isinstance(self.src.main.data, dict) else None
        if isinstance(given, dict) and "user_window" in given and not self.config.limits.has_user_budget:
            self.add("warning", "`limits.user_window` is the window of a budget per user, and the bot sets none, so "
                     "nothing is counted: add `max_user_tokens` or `max_user_cost` under `limits:` "
                     "(docs/observability.md, \"A budget per user\"), or remove `user_window`",
                     "limits", "user_window")

    def model_fallbacks(self) -> None:
        """`model.fallback:` (the bot's and each route's own): an empty list at the top does nothing,
        and a fallback that is the very model it stands in for fails when that one fails; a
        `breaker:` without fallbacks never skips anything."""
        raw = self.config.model
        top = self.src.main.data.get("model") if isinstance(self.src.main.data, dict) else None
        if isinstance(top, dict) and top.get("fallback") == []:
            self.add("warning", f"`model.fallback` is an empty list: no model stands in for `{raw.name}`; remove "
                     "it, or list the models that answer when it cannot (e.g. `[{name: gpt-4o}]`)", "model", "fallback")
        if isinstance(top, dict) and "breaker" in top and not raw.fallback and not any(
                (r.model or {}).get("fallback") for r in self.config.routes.values()):
            self.add("warning", "`model.breaker` does nothing without a `fallback:`: an endpoint is skipped only "
                     "when another model can answer; add `fallback:` or remove `breaker:`", "model", "breaker")
        self.same_fallbacks(raw, "`model`", ("model", "fallback"))
        for route in self.config.routes.values():
            own = "fallback" in (route.model or {})
            if route.model and (own or raw.fallback):
                where = ("routes", route.name, "model", "fallback") if own else ("routes", route.name, "model")
                self.same_fallbacks(self.config.route_model(route.name), f"the model of route `{route.name}`",
                                    where, own)

    def same_fallbacks(self, config: ModelConfig, what: str, where: tuple[Any, ...], own: bool = True) -> None:
        """A fallback of `config` that is `config`'s own model (or an earlier fallback) at the same endpoint."""
        seen = {config.endpoint: config.name}
        for i, (item, fallback) in enumerate(zip(config.fallback, config.fallback_configs(), strict=True)):
            if not set(item) <= set(ModelConfig.__dataclass_fields__):
                continue  # an unknown key: the schema's error says it
            if fallback.endpoint not in seen:
                seen[fallback.endpoint] = fallback.name
                continue
            same = "the same model as the one it stands in for" if fallback.endpoint == config.endpoint \
                else "the same model as an earlier fallback"
            at: tuple[Any, ...] = (*where, i) if own else where
            inherited = "" if own else " (the bot's `model.fallback`, under the route's `model:`)"
            self.add("warning", f"fallback {i + 1} of {what}{inherited} is {same} (`{fallback.name}` at the same "
                     "endpoint): it fails when that one does; name another model or `base_url`", at[0], at[1], *at[2:])

    def format_and_migrations(self) -> None:
        from chatrun.definition.migrations import format_diagnostics, migration_diagnostics

        main = self.src.main
        at = None
        if isinstance(main.data, dict) and "format" in main.data:
            pos = main.pos(("format",))
            at = Location(main.file, pos.line, pos.col)
        if at is None or self.config.format is not None:  # a `format:` the schema refused says nothing more
            self.out += format_diagnostics(self.config, at)
        self.out += migration_diagnostics(self.config)

    def engine_audience_roles(self) -> None:
        """`user` and `backend` are the engine's own parties, never a principal's role (the --auth
        file refuses them, issue 33): a route or an operator action that needs one of them as a
        role, or an approval by `backend` (an approval has no item token), waits for no one."""
        from chatrun import events as ev

        why = ("no principal holds the role `{role}` (the --auth file refuses it: `user` is the session's own "
               "user, `backend` whoever holds a backend question's item token); name a role of your own")
        for route in self.config.routes.values():
            for i, role in enumerate(route.roles or []):
                if role in ev.ENGINE_AUDIENCES:
                    self.add("warning", f"route `{route.name}` needs the role `{role}`: {why.format(role=role)}, or "
                             "drop `roles:` for a route anyone signed in may use", "routes", route.name, "roles", i)
        for tool in self.config.tools.values():
            if tool.approval is not None and ev.BACKEND in tool.approval.by:
                at = ("tools", tool.name, tool.approval.key, "by", tool.approval.by.index(ev.BACKEND))
                self.add("warning", f"`approval.by` of tool `{tool.name}` names `backend`, but an approval has no item "
                         f"token a backend could answer with: {why.format(role=ev.BACKEND)} (e.g. `kyc_service`), or "
                         "ask the backend with `action: {ask: {from: backend}}`", *at)
            operator = tool.action.operator
            if operator is not None and operator.role in ev.ENGINE_AUDIENCES:
                self.add("warning", f"the `operator` action of tool `{tool.name}` waits for the role "
                         f"`{operator.role}`: {why.format(role=operator.role)} (e.g. `operators`)",
                         "tools", tool.name, "action", "operator", "role")

    # -- routes ------------------------------------------------------------------

    def on_change(self) -> None:
        problem = policy_problem(self.config.on_change, list(self.config.routes))
        if problem:
            doc = self.src.main
            pos = doc.pos(("on_change",))
            self.out.append(Diagnostic(doc.file, pos.line, pos.col, "error", problem, "on_change"))

    def default_route(self) -> None:
        defaults = self.defaults
        if not self.config.routes:
            return  # the loader said there are no routes
        if not defaults:
            names = ", ".join(f"`{n}`" for n in self.config.routes)
            doc = self.src.main
            pos = doc.pos(("routes",)) if "routes" in (doc.data or {}) else doc.pos(())
            self.out.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                       f"no default route: mark exactly one route with `default: true` (routes: {names})",
                                       "routes"))
        elif len(defaults) > 1:
            listed = ", ".join(f"`{n}` ({self._where('routes', n, 'default')})" for n in defaults)
            self.add("error", f"several default routes: {listed}; exactly one route may have `default: true`",
                     "routes", defaults[1], "default")

    def encodings(self) -> None:
        """An unknown tiktoken encoding would fail every turn of a token-window route."""
        wanted: list[tuple[str | None, YamlDoc, tuple[str, ...]]] = [
            (self.config.memory.encoding, self.src.main, ("memory", "encoding"))]
        for route in self.config.routes.values():
            if route.memory is not None:
                wanted.append((route.memory.encoding, self.src.doc_of("routes", route.name),
                               ("routes", route.name, "memory", "encoding")))
        named = [(encoding, doc, path) for encoding, doc, path in wanted if encoding]
        if not named:
            return
        import tiktoken  # only for bots that name an encoding: importing it costs time

        known = sorted(tiktoken.list_encoding_names())
        for encoding, doc, path in named:
            if encoding not in known:
                pos = doc.pos(path)
                self.out.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                           f"unknown tiktoken encoding `{encoding}`{suggest(encoding, known)} "
                                           "(leave `encoding` out to use the model's; e.g. o200k_base, cl100k_base)",
                                           ".".join(path)))

    def context_windows(self) -> None:
        """A window of `context_size - reserve` tokens needs a reserve smaller than the context."""
        for route in self.config.routes.values():
            policy = self.config.route_memory(route.name)
            if policy.type != "token_window" or policy.context_size is None:
                continue
            own = route.memory is not None
            doc = self.src.doc_of("routes", route.name) if own else self.src.main
            path = ("routes", route.name, "memory", "max_tokens") if own else ("memory", "max_tokens")
            reserve = policy.reply_reserve or self.config.route_model(route.name).max_tokens
            problem = None
            if reserve is None:
                problem = ("has no `reply_reserve` and the route's model sets no `max_tokens` to reserve; "
                           "give one of them")
            elif reserve >= policy.context_size:
                problem = (f"leaves no room for messages: the reserve of {reserve} tokens is not smaller than "
                           f"context_size {policy.context_size}")
            if problem:
                pos = doc.pos(path)
                self.out.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                           f"memory `max_tokens` of route `{route.name}` {problem}", ".".join(path)))

    def message_windows(self) -> None:
        """A window of one message on a route with a system prompt keeps only the prompt: every
        message of the user is refused as too long (engine/turn.py `sent_whole`)."""
        for route in self.config.routes.values():
            policy = self.config.route_memory(route.name)
            if policy.type != "message_window" or policy.max_messages > 1 or not route.system:
                continue
            own = route.memory is not None
            doc = self.src.doc_of("routes", route.name) if own else self.src.main
            path = ("routes", route.name, "memory", "max_messages") if own else ("memory", "max_messages")
            pos = doc.pos(path)
            self.out.append(Diagnostic(doc.file, pos.line, pos.col, "warning",
                                       f"memory `max_messages: 1` of route `{route.name}` keeps only its system "
                                       "prompt, so every message of the user is refused as too long for the memory; "
                                       "keep at least 2 (the system prompt counts as one)", ".".join(path)))

    def _where(self, kind: str, name: str, *sub: Any) -> str:
        file, pos = self.src.at(kind, name, *sub)
        return f"{file}:{pos.line}"

    def route_tools(self, route: str, tools: list[str]) -> None:
        for i, tool in enumerate(tools):
            if tool not in self.config.tools:
                self.add("error", f"route `{route}` lists unknown tool `{tool}`"
                         f"{suggest(tool, self.config.tools)}", "routes", route, "tools", i)

    def output(self, route: RouteConfig) -> None:
        """A route's `output:`: a valid JSON Schema, and `set` paths and templates like an action's."""
        output = route.output
        assert output is not None
        at = ("routes", route.name, "output")
        try:
            _check_schema(json.dumps(output.schema, sort_keys=True))
        except NotASchema as exc:
            where = ".".join(map(str, exc.path))
            self.add("error", f"`output.schema` of route `{route.name}` is not a valid JSON Schema"
                     f"{f' at `{where}`' if where else ''}: {exc.message}", *at, "schema", *exc.path)
        except (TypeError, ValueError) as exc:  # a key JSON cannot hold (the YAML reader said which)
            self.add("error", f"`output.schema` of route `{route.name}` is not JSON: {exc}", *at, "schema")
        for path, template in output.set.items():
            problem = self.undeclared(path)
            if problem:
                self.add("warning", f"`output.set` of route `{route.name}` sets `{path}`, but {problem}",
                         *at, "set", path)
            if isinstance(template, str):
                self.template(template, f"`output.set {path}` of route `{route.name}`", (*at, "set", path), None,
                              routes=[route.name])

    # -- tools -------------------------------------------------------------------

    def tool(self, tool: ToolConfig) -> None:
        name = tool.name
        base = ("tools", name)
        routes = self.routes_of.get(name, [])
        for i, path in enumerate(tool.requires):
            problem = self.undeclared(path) or self.invisible(tuple(path.split(".")), routes)
            if problem:
                self.add("error", f"`requires` of tool `{name}` names `{path}`, but {problem}", *base, "requires", i)
        self.action(tool, tool.action, (*base, "action"), "")
        self.approval(tool)
        self.ask_and_operator(tool)
        self.cases(tool)
        self.loops(tool)
        if tool.on_error is not None:
            for key in ("message", "reply"):
                source = getattr(tool.on_error, key)
                if source:
                    self.template(source, f"`on_error {key}` of tool `{name}`", (*base, "on_error", key), tool,
                                  routes=routes)
        declared = list(tool.kinds)
        if len(declared) > 1:
            self.add("error", f"tool `{name}` has {' and '.join(f'`{k}`' for k in declared)}; give one "
                     "(a tool gets its result from one place)", *base, declared[1])
        for kind in kinds():  # each kind checks its own config (chatrun.toolkinds)
            if kind.key in tool.kinds:
                kind.check(tool, tool.kinds[kind.key], self)
        section = self.src.doc_of("tools", name).data.get("tools")
        raw = section.get(name) if isinstance(section, dict) else None
        if isinstance(raw, dict) and "parameters" in raw:  # the default needs no check
            self.parameters(tool)
        check_binding(self, tool, raw if isinstance(raw, dict) else None, routes)
        self.confirm(tool, raw if isinstance(raw, dict) else {})
        self.from_user(tool, raw if isinstance(raw, dict) else {})
        if (self.config.format or 0) >= 3 and isinstance(raw, dict):  # a bot that says it is written for 3
            self.action_order(tool.name, raw.get("action"), ("tools", name, "action"))

    def _written_at(self, name: str, at: tuple, key: str) -> tuple:
        """Where an action's key is written: a key `<<: *anchor` brings is on the anchor's line, in
        another tool; the warning names the action that reads it, so it stands there."""
        _, brought = self.src.doc_of("tools", name).merged.get(".".join(map(str, at)), (0, frozenset()))
        return at if key in brought else (*at, key)

    def _who_reorders(self, name: str, steps: list[str], at: tuple) -> str:
        """`chatrun upgrade` moves `<<: *anchor` as one key, where the keys it brings read (the
        loader's order, yamlpos): it cannot when they apply on both sides of a key the action writes."""
        line, brought = self.src.doc_of("tools", name).merged.get(".".join(map(str, at)), (0, frozenset()))
        ranks = [ACTION_ORDER.index(k) for k in steps if k in brought]
        between = [k for k in steps if k not in brought and ranks and min(ranks) < ACTION_ORDER.index(k) < max(ranks)]
        if not between:
            return "`chatrun upgrade` reorders them"
        return (f"`chatrun upgrade` cannot: the keys `<<:` on line {line} brings apply before and after "
                f"`{between[0]}`; write them in the action itself, or `{between[0]}` in the anchored mapping")

    def action_order(self, name: str, action: Any, at: tuple) -> None:
        """Format 3 writes an action's keys in the order they apply (ACTION_ORDER), so it reads
        top to bottom as it happens; its cases' actions too."""
        if not isinstance(action, dict):
            return
        steps = [key for key in action if key in ACTION_ORDER]
        for before, key in zip(steps, steps[1:], strict=False):
            if ACTION_ORDER.index(key) < ACTION_ORDER.index(before):
                self.add("warning", f"`{key}` of tool `{name}` is written after `{before}` but applies before it: "
                         f"write an action's keys in the order they apply ({', '.join(k for k in ACTION_ORDER if k in steps)}; "
                         f"docs/format.md, \"The order actions apply\"); {self._who_reorders(name, steps, at)}",
                         *self._written_at(name, at, key))
                break
        cases = action.get("cases")
        for i, case in enumerate(cases if isinstance(cases, list) else []):
            for branch in ("then", "else"):
                if isinstance(case, dict) and branch in case:
                    self.action_order(name, case[branch], (*at, "cases", i, branch))

    def from_user(self, tool: ToolConfig, raw: dict[str, Any]) -> None:
        """`from_user:` names parameters of the tool the bot does not bind (a bound value is the bot's,
        not the user's). An `mcp:` tool that takes the server's schema is not known until it connects."""
        at = ("tools", tool.name, "from_user")
        properties = tool.parameters.get("properties")
        declared = list(properties) if isinstance(properties, dict) else []
        for i, name in enumerate(tool.from_user):
            if name in tool.bind:
                self.add("error", f"`from_user` of tool `{tool.name}` names `{name}`, which the bot binds (`bind:`): "
                         "its value is the bot's, never the user's; drop one of the two", *at, i)
            elif name not in declared and not ("mcp" in raw and "parameters" not in raw):
                self.add("warning", f"`from_user` of tool `{tool.name}` names `{name}`, which is not one of its "
                         f"parameters{suggest(name, declared)} (it takes: {', '.join(declared) or 'none'}); "
                         "nothing is checked for it", *at, i)

    def env(self) -> None:
        for name, var in self.config.env.items():
            if var.default is None and name not in os.environ:
                self.add("warning", f"environment variable `{name}` is declared under `env:` but not set "
                             "(and has no `default`); a tool that reads it will fail its turn", "env", name)

    def timed_waits(self) -> Iterator[tuple[ToolConfig, str, ApprovalConfig | AskConfig | OperatorConfig, float]]:
        """Each tool's waits that have a `timeout`, with it in seconds: its approval, its question
        (`ask`) and its handover (`operator`). A timeout the schema refuses is left to the schema."""
        for tool in self.config.tools.values():
            waits: tuple[tuple[str, ApprovalConfig | AskConfig | OperatorConfig | None], ...] = (
                ("approval", tool.approval), ("ask", tool.action.ask), ("operator", tool.action.operator))
            for what, wait in waits:
                if wait is None or not wait.timeout:
                    continue
                try:
                    yield tool, what, wait, duration_seconds(wait.timeout)
                except ValueError:
                    continue

    def retention(self) -> None:
        """A wait longer than `retention.idle_sessions` never ends as declared: the session is
        deleted, waiting item and all, once it has been idle that long (docs/deploy.md)."""
        idle = self.config.retention.idle_sessions
        if idle is None:
            return
        for tool, what, wait, seconds in self.timed_waits():
            if what == "operator" or seconds <= idle:
                continue
            at = wait.where
            self.out.append(Diagnostic(
                at.file, at.line, at.col, "warning",
                f"tool `{tool.name}`: its {'question' if what == 'ask' else what} waits up to {wait.timeout}, longer "
                "than `retention.idle_sessions` keeps an idle session; the session would be deleted before "
                "the timeout's `on_timeout` runs: shorten the timeout or lengthen the retention",
                f"tools.{tool.name}"))

    def reachable_waits(self) -> None:
        """A `timeout:` of an approval, a question or a handover that no clock reaches (a datetime ends
        with the year 9999): its item could never be given a due time (the turn failed with an
        OverflowError); such a wait is no timeout at all."""
        for tool, what, wait, seconds in self.timed_waits():
            if seconds <= seconds_to_year_9999():
                continue
            at = wait.where
            self.out.append(Diagnostic(
                at.file, at.line, at.col, "error",
                f"tool `{tool.name}`: `{what}.timeout: {wait.timeout}` is longer than any clock reaches (from now "
                "it passes the year 9999): leave `timeout` out to wait for ever, or write a shorter one",
                f"tools.{tool.name}.{what}.timeout"))

    def user_memory(self) -> None:
        """`user_memory:` facts that some action writes, and a `retention.user_memory` with
        something to forget (docs/memory.md, "User memory")."""
        declared = self.config.user_memory
        if declared is not None:
            actions = [a for tool in self.config.tools.values()
                       for a in (tool.action, *(case.action for case in tool.action.cases))]
            written = {fact for action in actions for fact in action.remember}
            unwritten = [fact for fact in declared.facts if fact not in written]
            if unwritten:
                at = declared.where
                self.out.append(Diagnostic(at.file, at.line, at.col, "warning",
                                           f"`user_memory` declares {', '.join(f'`{f}`' for f in unwritten)}, which no "
                                           "tool's action remembers: add `remember: {FACT: TEMPLATE}` to an action, "
                                           "or leave the fact out", "user_memory"))
            self.user_summary(declared)
        elif self.config.retention.user_memory is not None:
            self.add("warning", "`retention.user_memory` forgets remembered facts, but the bot declares no "
                     "`user_memory:`: declare one, or leave the retention out", "retention", "user_memory")

    def user_summary(self, declared: UserMemoryConfig) -> None:
        """`user_memory.summary:`: kept as the fact `summary`, so no declared fact may be called
        that; `when: outcome` needs `outcomes:`; its prompt compiles."""
        summary = declared.summary
        if summary is None:
            return
        if SUMMARY_FACT in declared.facts:
            self.add("error", f"`user_memory.facts` names `{SUMMARY_FACT}`, which is where `user_memory.summary` keeps "
                     "the conversation's summary: call the fact something else", "user_memory", "facts")
        if "outcome" in summary.when and not self.config.outcomes:
            self.add("warning", "`user_memory.summary` is written `when: outcome`, but the bot declares no `outcomes:`, "
                     "so no outcome is ever recorded: add `outcomes:` or write it `when: end`",
                     "user_memory", "summary", "when")
        if summary.prompt is not None:
            self.template(summary.prompt, "`user_memory.summary.prompt`", ("user_memory", "summary", "prompt"), None)

    def guardrails(self) -> None:
        """`guardrails:` (the bot's and each route's): patterns that compile, and outcomes each
        stage can have (docs/guardrails.md)."""
        guards: list[tuple[GuardrailConfig, tuple]] = [(g, ("guardrails", i)) for i, g in enumerate(self.config.guardrails)]
        for route in self.config.routes.values():
            guards += [(g, ("routes", route.name, "guardrails", i)) for i, g in enumerate(route.guardrails)]
        for guard, path in guards:
            at = guard.where
            if len(guard.detectors) != 1:
                problem = (f"has {' and '.join(f'`{d}`' for d in guard.detectors)}: one detector per guardrail; "
                           "split it in two" if guard.detectors else
                           "detects nothing: give it `patterns`, `pii`, `max_chars`, `moderation` or `languages`")
                self.out.append(Diagnostic(at.file, at.line, at.col, "error", f"guardrail `{guard.name}` {problem}",
                                           "guardrails"))
            for source, where in zip(guard.patterns, guard.pattern_where, strict=False):
                try:
                    re.compile(source)
                except re.error as exc:
                    self.out.append(Diagnostic(where.file, where.line, where.col, "error",
                                               f"guardrail `{guard.name}`: pattern {source!r} is not a valid regular "
                                               f"expression: {exc}", "guardrails"))
            for stage in guard.stages:
                allowed = STAGE_OUTCOMES.get(stage, GUARD_OUTCOMES)
                if guard.outcome in GUARD_OUTCOMES and guard.outcome not in allowed:  # else: the schema's
                    self.out.append(Diagnostic(at.file, at.line, at.col, "error",
                                               f"guardrail `{guard.name}`: stage `{stage}` cannot `{guard.outcome}` "
                                               f"(it can: {', '.join(allowed)}); give that stage a guardrail of its own",
                                               "guardrails"))
            self.guardrail_kind(guard)
            if guard.message and guard.outcome not in ("block", "operator"):
                self.out.append(Diagnostic(at.file, at.line, at.col, "warning",
                                           f"guardrail `{guard.name}`: `message` is read only when it blocks or hands "
                                           f"over, and its outcome is `{guard.outcome}`", "guardrails"))
            if guard.message:
                self.template(guard.message, f"`message` of guardrail `{guard.name}`", (*path, "message"), None,
                              routes=[path[1]] if path[0] == "routes" else None)

    def guardrail_kind(self, guard: GuardrailConfig) -> None:
        """What the whole-text kinds (`moderation`, `languages`) can do: no `redact`, their stages,
        categories the endpoint knows, languages the detector knows (and the detector installed)."""
        if guard.kind not in WHOLE_TEXT_KINDS:
            return
        at, key = guard.where, "moderation" if guard.kind == "moderation" else "languages"

        def add(level: str, message: str, where: Location = at) -> None:
            self.out.append(Diagnostic(where.file, where.line, where.col, level, f"guardrail `{guard.name}`: {message}",
                                       "guardrails"))
        if guard.outcome == "redact":
            add("error", f"`{key}` judges the whole text: it cannot `redact` (it can: block, flag, operator)")
        for stage in guard.stages:
            if stage not in KIND_STAGES[guard.kind]:
                add("error", f"`{key}` does not watch stage `{stage}` (it watches: {', '.join(KIND_STAGES[guard.kind])})")
        if guard.moderation is not None:
            for category, where in zip(guard.moderation.categories, guard.moderation.category_where, strict=False):
                if category not in MODERATION_CATEGORIES:
                    add("warning", f"moderation category `{category}` is not one of the OpenAI-compatible "
                                   f"endpoint's{suggest(category, MODERATION_CATEGORIES)} (another endpoint may "
                                   "name it; it counts only if the endpoint reports it)", where)
        if guard.kind == "language":
            for code in guard.languages:
                if code not in languages.KNOWN:
                    add("error", f"unknown language `{code}` (give ISO 639-1 codes such as `en`, `de`, `fr`)"
                                 f"{suggest(code, sorted(languages.KNOWN))}")
            if not languages.available():
                add("error", "`languages` needs the language detector: `pip install chatrun[language]` (py3langid)")

    def widget(self) -> None:
        """`widget:`: origins a browser can send, a logo that exists, a key for signed identities."""
        widget = self.config.widget
        raw = self.src.main.data.get("widget") if isinstance(self.src.main.data, dict) else None
        if widget is None or not isinstance(raw, dict):
            return
        for i, origin in enumerate(raw.get("origins") or []):
            if not isinstance(origin, str):
                continue
            parts = urlsplit(origin)
            if parts.scheme in ("http", "https") and parts.netloc and (parts.path not in ("", "/") or parts.query):
                self.add("error", f"`widget.origins`: {origin!r} has a path; an origin is scheme://host[:port] "
                         f"only, as browsers send it: write {parts.scheme}://{parts.netloc}", "widget", "origins", i)
        if widget.logo_is_file:
            logo = os.path.join(self.config.root, widget.logo)
            if not os.path.isfile(logo):
                self.add("error", f"`widget.logo`: no file {widget.logo!r} in the bot's folder ({self.config.root}); "
                         "give a file beside bot.yaml (.svg, .png, .jpg, .webp) or an https:// URL", "widget", "logo")
            elif os.path.splitext(logo)[1].lower() not in WIDGET_LOGO_TYPES:
                self.add("error", f"`widget.logo`: {widget.logo!r} is not an image the widget shows; use "
                         f"{', '.join(WIDGET_LOGO_TYPES)}", "widget", "logo")
        ratio = contrast_with_white(widget.color)
        if ratio is not None and ratio < 4.5:
            self.add("warning", f"`widget.color`: {widget.color} under white text (the launcher, the panel's header, "
                     f"the Send button, the visitor's messages) has a contrast of {ratio:.1f}:1, under the 4.5:1 readers need "
                     "(WCAG AA); pick a darker colour, such as the default #2563eb (5.2:1)", "widget", "color")
        if widget.identity == "signed" and widget.secret_env not in os.environ:
            self.add("warning", f"`widget.identity` is `signed`, but the environment variable `{widget.secret_env}` "
                     "(the key signed identities are checked with) is not set, so every visitor is refused; set it "
                     "where the server runs (docs/widget.md)", "widget", "identity")
        self.widget_position(raw)

    def widget_position(self, raw: dict[str, Any]) -> None:
        """`widget.position`'s default became `end` (the host page's line end: the left on a
        right-to-left page, where it was the right): a bot written in a right-to-left language,
        whose pages are likely right to left, is told until it names its corner."""
        catalogs = self.config.catalogs
        rtl = [loc for loc in (catalogs.locales if catalogs else ()) if direction(loc) == "rtl"]
        if "position" in raw or not rtl:
            return
        self.add("warning", f"`widget` has no `position`: its default is now `end`, the end of the host page's line, "
                 f"so on a right-to-left page (as for this bot's `{rtl[0]}`) the launcher and its panel sit bottom-left, "
                 "where they sat bottom-right before; write `position: end` to keep that, or `position: right` for the "
                 "old corner (docs/widget.md)", "widget", "position")

    def timezones(self) -> None:
        """`timezone:` and a declared `state.timezone` default name IANA zones (docs/format.md, "The clock")."""
        doc = self.src.main
        for value, path in ((self.config.timezone, ("timezone",)), (self.config.state.get("timezone"), ("state", "timezone"))):
            if not isinstance(value, str) or zone_named(value) is not None:
                continue
            pos = doc.pos(path)
            known = _zone_names()
            hint = (suggest(value, known) + " (e.g. Europe/Paris, America/New_York, UTC)" if known else
                    " (this machine has no time zone database: install the system's tzdata, or `pip install tzdata`)")
            self.out.append(Diagnostic(doc.file, pos.line, pos.col, "error",
                                       f"`{'.'.join(path)}` is {value!r}, which is not an IANA time zone name{hint}",
                                       ".".join(path)))

    def remembered(self, of: str, action: ActionConfig, at: tuple, tool: ToolConfig, routes: list[str]) -> None:
        """An action's `remember:` facts: declared in `user_memory.facts`, with templates that compile."""
        declared = self.config.user_memory
        for fact, template in action.remember.items():
            if declared is None:
                self.add("error", f"{of} remembers `{fact}`, but the bot declares no `user_memory:` "
                         f"(add `user_memory: {{facts: [{fact}]}}` at the top level)", *at, "remember", fact)
            elif fact not in declared.facts:
                self.add("error", f"{of} remembers `{fact}`, which is not one of `user_memory.facts` "
                         f"({', '.join(declared.facts)}){suggest(fact, declared.facts)}", *at, "remember", fact)
            if isinstance(template, str):
                self.template(template, f"`remember {fact}` of {of}", (*at, "remember", fact), tool, routes=routes)

    def action(self, tool: ToolConfig, action: ActionConfig, at: tuple, case: str) -> None:
        """The targets and templates of an action (`case`: "" for the tool's own, else which case)."""
        name = tool.name
        of = f"tool `{name}`{case}"
        routes = self.routes_of.get(name, [])
        for key in ("push", "route", "call"):
            target = getattr(action, key)
            if target and target not in self.config.routes:
                verb = {"push": "pushes", "route": "routes to", "call": "calls"}[key]
                self.add("error", f"{of} {verb} unknown route `{target}`{suggest(target, self.config.routes)}", *at, key)
        for path, template in action.set.items():
            problem = self.undeclared(path)
            if problem:
                self.add("warning", f"{of} sets `{path}`, but {problem}", *at, "set", path)
            if isinstance(template, str):
                self.template(template, f"`set {path}` of {of}", (*at, "set", path), tool, routes=routes)
        if action.remember:
            self.remembered(of, action, at, tool, routes)
        for event, template in action.emit.items():
            nested = list(nested_templates(template))
            for below, text in nested:  # data: each text in it is a template
                self.template(text, f"`emit {event}` of {of}", (*at, "emit", event, *below), tool, routes=routes,
                              said=False)  # event data, as the event type is (not a text the bot says)
            if any(below and "{{" in text for below, text in nested):  # a change of meaning (CHANGELOG)
                self.add("warning", f"`emit {event}` of {of}: the texts inside its data are rendered as templates now "
                         "(before this release `{{ }}` in them was sent as written); write {{ '{{' }} for braces "
                         "meant literally", *at, "emit", event)
        for key in ("message", "reply", "result", "choices"):
            source = getattr(action, key)
            if source and isinstance(source, str):
                self.template(source, f"`{key}` of {of}", (*at, key), tool, routes=routes)
            elif key == "choices" and source and self.config.catalogs is not None:
                self.untranslated(f"`choices` of {of}", (*at, key))

    def approval(self, tool: ToolConfig) -> None:
        """`approval:`: its condition compiles, its editable names are parameters, its texts compile
        (`rejected` sees `decision`). Durations and enums are the schema's."""
        approval = tool.approval
        if approval is None:
            return
        at = ("tools", tool.name, "approval")
        routes = self.routes_of.get(tool.name, [])
        if approval.condition is not None:
            self.condition(approval.condition, f"`approval.if` of tool `{tool.name}`", (*at, "if"), tool, routes)
        declared = _listed_args(tool.parameters)
        for i, name in enumerate(approval.edit if isinstance(approval.edit, list) else []):
            if name not in declared:
                self.add("error", f"`approval.edit` of tool `{tool.name}` names `{name}`, which is not one of its "
                         f"parameters{suggest(name, declared)}", *at, "edit", i)
            elif name in tool.bind:
                self.add("error", f"`approval.edit` of tool `{tool.name}` names `{name}`, which the bot binds "
                         "(`bind:`): an approver cannot change it", *at, "edit", i)
        if approval.self_decide is False and approval.by == ["user"]:
            self.add("error", f"`approval` of tool `{tool.name}` has `by: [user]` and `self: false`: the user who "
                     "caused the call is the only one who may decide it, so no one could; add a role to `by`",
                     *at, "self")
        # Where each text is written: format 3 asks `ask: {text, tell}`, format 2 `ask:` and `tell:`.
        place = {"ask": ("ask", "text"), "tell": ("ask", "tell"), "rejected": ("rejected",)} \
            if self.config.format_version >= 3 else {"ask": ("ask",), "tell": ("tell",), "rejected": ("rejected",)}
        if approval.tell and "user" in approval.by:
            self.add("warning", f"`approval.{'.'.join(place['tell'])}` of tool `{tool.name}` is never shown: `by` has "
                     f"`user`, so the user decides the call and reads its `{'.'.join(place['ask'])}` (with the buttons "
                     "to decide); `tell` is what the user reads while others decide", *at, *place["tell"])
        for key in ("ask", "tell", "rejected"):
            source = getattr(approval, key)
            if source and approval.key == "confirm":  # `confirm: TEXT` is the ask
                self.template(source, f"`confirm` of tool `{tool.name}`", ("tools", tool.name, "confirm"), tool,
                              routes=routes)
            elif source:
                self.template(source, f"`approval.{'.'.join(place[key])}` of tool `{tool.name}`", (*at, *place[key]),
                              tool, routes=routes)
        self.approval_cases(tool)

    def confirm(self, tool: ToolConfig, raw: dict[str, Any]) -> None:
        """`confirm:` is the short form of an approval by the user: not both. A parameter named like
        consent (`confirmed`, `approved`, `consent`, `yes`) that a case decides a side effect on
        lets the model say yes for the user: a warning pointing at `confirm:`."""
        if "confirm" in raw and "approval" in raw:
            self.add("error", f"tool `{tool.name}` has both `confirm` and `approval`: `confirm: TEXT` is "
                     "`approval: {by: [user], ask: TEXT}`; give one (the approval's `ask` says what the user is "
                     "asked)", "tools", tool.name, "confirm")
        if tool.approval is not None and tool.approval.confirms:
            return
        consent = [n for n in _declared_args(tool.parameters) or [] if isinstance(n, str) and _CONSENT.match(n) and n not in tool.bind]
        if not consent or not any(v.set or v.emit for _, v in tool.action.variants()):
            return
        for case in tool.action.cases:
            used = [n for n in consent if case.condition and _reads_arg(case.condition, n)]
            if used:
                self.add("warning", f"tool `{tool.name}` decides what it does on `args.{used[0]}`, an argument the "
                         "model fills: the model can consent for the user. Ask the user with `confirm:` on the tool "
                         "that acts, and drop the argument (docs/tools.md, \"Consent from the user\")",
                         "tools", tool.name, "action", "cases", case.index, "if")
                return

    def approval_cases(self, tool: ToolConfig) -> None:
        """`approval.on_timeout` names `reject`, `approve` or one of the approval's named cases;
        each case's entries are checked like an action's cases (conditions, `else` last), their
        changed arguments are parameters the bot does not bind, their routes exist."""
        approval = tool.approval
        assert approval is not None
        at = ("tools", tool.name, "approval")
        routes = self.routes_of.get(tool.name, [])
        names = list(approval.cases)
        if approval.on_timeout not in ("reject", "approve", *names):
            known = ", ".join(f"`{n}`" for n in ["reject", "approve", *names])
            self.add("error", f"`approval.on_timeout` of tool `{tool.name}` names `{approval.on_timeout}`, which is "
                     f"neither `reject`, `approve` nor one of the approval's `cases`"
                     f"{suggest(approval.on_timeout, ['reject', 'approve', *names])} (it may be: {known})",
                     *at, "on_timeout")
        for name, entries in approval.cases.items():
            if name in ("reject", "approve"):
                self.add("error", f"tool `{tool.name}`'s approval names a case `{name}`: `on_timeout: {name}` means "
                         "the built-in decision; give the case another name", *at, "cases", name)
            elif name != approval.on_timeout:
                self.add("warning", f"case `{name}` of tool `{tool.name}`'s approval is never used: "
                         "`on_timeout` names another", *at, "cases", name)
            for n, entry in enumerate(entries):
                self.approval_case(tool, name, entry, n == len(entries) - 1, (*at, "cases", name, entry.index),
                                   routes)

    def approval_case(self, tool: ToolConfig, name: str, entry: ApprovalCaseConfig, last: bool, at: tuple,
                      routes: list[str]) -> None:
        of = f"case `{name}` ({entry.label}) of tool `{tool.name}`'s approval"
        body = (*at, "then" if entry.condition is not None else "else")
        if (entry.approve is None) == (entry.reject is None):
            self.add("error", f"{of} must say `approve` or `reject` (exactly one): what the decision is", *body)
        elif entry.route and entry.approve is not None:
            self.add("error", f"{of} has `route` with `approve`: a call that runs moves by its own action "
                     "(cases on `decision.case`); `route` goes with `reject`", *body, "route")
        if entry.condition is None and not last:
            self.add("error", f"the `else` entry of case `{name}` of tool `{tool.name}`'s approval must be the last: "
                     "the entries after it could never decide", *at, "else")
        if entry.condition is not None:
            self.condition(entry.condition, f"condition `{entry.condition}` of {of}", (*at, "if"), tool, routes)
        declared = _listed_args(tool.parameters)
        for arg, value in (entry.approve or {}).items():
            if arg not in declared:
                self.add("error", f"`approve` of {of} changes `{arg}`, which is not one of the tool's parameters"
                         f"{suggest(arg, declared)}", *body, "approve", arg)
            elif arg in tool.bind:
                self.add("error", f"`approve` of {of} changes `{arg}`, which the bot binds (`bind:`)",
                         *body, "approve", arg)
            elif isinstance(value, str):
                self.template(value, f"`approve.{arg}` of {of}", (*body, "approve", arg), tool, routes=routes)
        if entry.route and entry.route not in self.config.routes:
            self.add("error", f"`route` of {of} names unknown route `{entry.route}`"
                     f"{suggest(entry.route, self.config.routes)}", *body, "route")
        for key in ("message", "reject"):
            source = getattr(entry, key)
            if source:
                self.template(source, f"`{key}` of {of}", (*body, key), tool, routes=routes)

    def ask_and_operator(self, tool: ToolConfig) -> None:
        """An action's `ask:` (its schema, `into` path, texts, `on_timeout` answer) and `operator:`
        (its `release_to` route); at most one of them, and no move beside them."""
        action, at = tool.action, ("tools", tool.name, "action")
        routes = self.routes_of.get(tool.name, [])
        ask, operator = action.ask, action.operator
        if ask is not None and operator is not None:
            self.add("error", f"tool `{tool.name}` has both `ask` and `operator`: one pause per call", *at, "operator")
        if ask is not None:
            try:
                _check_schema(json.dumps(ask.schema, sort_keys=True))
            except (NotASchema, TypeError, ValueError) as exc:
                self.add("error", f"`ask.schema` of tool `{tool.name}` is not a valid JSON Schema: "
                         f"{getattr(exc, 'message', exc)}", *at, "ask", "schema")
            if ask.into:
                problem = self.undeclared(ask.into)
                if problem and self.config.format_version >= 3:  # written `set: {PATH: '{{ result }}'}`
                    self.add("warning", f"tool `{tool.name}` sets `{ask.into}` (its question's answer), but {problem}",
                             *at, "set", ask.into)
                elif problem:
                    self.add("warning", f"`ask.into` of tool `{tool.name}` is `{ask.into}`, but {problem}",
                             *at, "ask", "into")
            for key in ("text", "tell"):
                source = getattr(ask, key)
                if source:
                    self.template(source, f"`ask.{key}` of tool `{tool.name}`", (*at, "ask", key), tool, routes=routes)
            self.question_texts(tool, ask)
            if ask.choices is not None and ask.source != "user":
                self.add("error", f"`ask.choices` of tool `{tool.name}`: choices are for `from: user`",
                         *at, "ask", "choices")
        if operator is not None:
            if operator.release_to and operator.release_to not in self.config.routes:
                self.add("error", f"`operator.release_to` of tool `{tool.name}` names unknown route "
                         f"`{operator.release_to}`{suggest(operator.release_to, self.config.routes)}",
                         *at, "operator", "release_to")
            if operator.text:
                self.template(operator.text, f"`operator.text` of tool `{tool.name}`", (*at, "operator", "text"),
                              tool, routes=routes)
            self.operator_timeout(tool, operator, (*at, "operator"), routes)

    def operator_timeout(self, tool: ToolConfig, operator: OperatorConfig, at: tuple, routes: list[str]) -> None:
        """`operator.timeout` and `on_timeout`: one needs the other; the tool, its arguments (a
        template for each parameter it requires) and the route exist; the texts compile."""
        plan, of = operator.on_timeout, f"`operator.on_timeout` of tool `{tool.name}`"
        if plan is None:
            return
        if not operator.timeout:
            self.add("error", f"{of} never applies: the handover has no `timeout` (e.g. `timeout: 10m`)",
                     *at, "on_timeout")
        if plan.tool is not None:
            called = self.config.tools.get(plan.tool)
            if called is None:
                self.add("error", f"{of} calls unknown tool `{plan.tool}`{suggest(plan.tool, self.config.tools)}",
                         *at, "on_timeout", "tool")
            else:
                missing = [p for p in called.parameters.get("required") or () if p not in plan.args]
                if missing:
                    self.add("error", f"{of} calls `{plan.tool}` without its required argument(s) "
                             f"{', '.join(missing)} (give them in `args:`)", *at, "on_timeout", "args")
            for key, value in plan.args.items():
                if isinstance(value, str):
                    self.template(value, f"`args.{key}` of {of}", (*at, "on_timeout", "args", key), tool,
                                  routes=routes)
        elif plan.args:
            self.add("error", f"{of} has `args` but no `tool` to call with them", *at, "on_timeout", "args")
        if plan.route and plan.route not in self.config.routes:
            self.add("error", f"`route` of {of} names unknown route `{plan.route}`"
                     f"{suggest(plan.route, self.config.routes)}", *at, "on_timeout", "route")
        if plan.message:
            self.template(plan.message, f"`message` of {of}", (*at, "on_timeout", "message"), tool, routes=routes)

    def question_texts(self, tool: ToolConfig, ask: AskConfig) -> None:
        """Who reads which text of a question: `text` those who answer, `tell` the user while
        others answer. A question `from: operator`/`backend` with a `text:` and no `tell:` was
        shown to the user before chatrun had `tell:`; now the user reads the default."""
        at = ("tools", tool.name, "action", "ask")
        if ask.tell and ask.source == "user":
            self.add("warning", f"`ask.tell` of tool `{tool.name}` is never shown: with `from: user` the user answers "
                     "and reads `text`; `tell` is what the user reads while an operator or a backend answers",
                     *at, "tell")
        elif ask.text and not ask.tell and ask.source != "user":
            self.add("warning", f"`ask.text` of tool `{tool.name}` is the question the {ask.source} reads; the user "
                     "no longer sees it (chatrun tells them \"Your request is waiting for an answer.\" in their "
                     "locale): write what the user should read as `tell:` (docs/format.md, \"Humans in the loop\")",
                     *at, "text")

    def condition(self, condition: str, what: str, path: tuple, tool: ToolConfig | None, routes: list[str]) -> bool:
        """A condition (a Jinja expression without braces) compiles and reads what is declared;
        False when it does not compile."""
        if _TEMPLATE_MARK.search(condition):
            self.add("error", f"{what}: a condition is a Jinja expression without `{{{{ }}}}` "
                     "(write `args.amount > state.balance`)", *path)
            return False
        source = "{{ " + condition + " }}"
        # Parsed here (syntax errors at load, with their line); compiled to Python on first
        # use, once per process: compiling costs a millisecond each, too much for a big bot.
        try:
            _analyse(source)
        except TemplateSyntaxError as exc:
            message = (exc.message or "").replace("end of print statement", "end of the condition")
            self.add("error", f"{what} does not compile: {message}", *path)
            return False
        self.template(source, what, path, tool, routes=routes)
        return True

    def cases(self, tool: ToolConfig) -> None:
        """Each case's condition compiles and reads what is declared and visible; `else` comes last;
        each case's action is checked like the tool's own."""
        base = ("tools", tool.name, "action", "cases")
        routes = self.routes_of.get(tool.name, [])
        cases = tool.action.cases
        for n, case in enumerate(cases):
            at = (*base, case.index)
            if case.condition is None:
                if n != len(cases) - 1:
                    self.add("error", f"the `else` case of tool `{tool.name}` must be the last case: the cases after "
                             "it could never apply", *at, "else")
                self.action(tool, case.action, (*at, "else"), " (else case)")
                continue
            what = f"condition `{case.condition}` of tool `{tool.name}`"
            if not self.condition(case.condition, what, (*at, "if"), tool, routes):
                if _TEMPLATE_MARK.search(case.condition):
                    continue
            self.action(tool, case.action, (*at, "then"), f" (case `if: {case.condition}`)")

    def loops(self, tool: ToolConfig) -> None:
        """Moves that cannot work together: `execute` without a move runs the same route again with
        the same message (a loop); `call` with another move; `end` with a move or `execute`."""
        action = tool.action  # a merge's flag is the case's or the action's: none set, no problem
        if MEMOS and not any(a.end or a.call or a.execute for a in (action, *(case.action for case in action.cases))):
            return
        for case, merged in tool.action.variants():
            if case is None:
                at: tuple = ("action",)
                which = ""
            else:
                at = ("action", "cases", case.index, "then" if case.condition is not None else "else")
                which = f" (case `{case.label}`)"
            moves = [k for k in ("push", "pop", "route", "call") if getattr(merged, k)]
            problem = None
            if merged.end and (moves or merged.execute):
                problem = (f"has `end: true` with `{'`, `'.join(moves + ['execute'] * merged.execute)}`: the "
                           "conversation ends after this tool, so nothing would run on; remove one")
            elif merged.call and len(moves) > 1:
                problem = (f"has `call` with `{'`, `'.join(m for m in moves if m != 'call')}`: a call pushes the "
                           "called route and comes back here; it cannot move anywhere else too")
            elif merged.execute and not moves:
                problem = ("has `execute: true` but no `push`, `pop`, `route` or `call`: it would run the same "
                           "route again with the same message, over and over until a limit; add a move or "
                           "remove `execute`")
            if problem:
                self.add("error", f"tool `{tool.name}`{which} {problem}", "tools", tool.name, *at)
                return

    def parameters(self, tool: ToolConfig) -> None:
        """`parameters:` a JSON Schema of an object. What it says hangs on the schema alone (and
        the tool's name in its words): a schema found fine once (the same text: `repr` tells
        `1:` from `'1':`) is fine for every tool that has it."""
        shape = repr(tool.parameters)
        if MEMOS and shape in self.fine_parameters:
            return
        count = len(self.out)
        self._parameters(tool)
        if len(self.out) == count:
            self.fine_parameters.add(shape)

    def _parameters(self, tool: ToolConfig) -> None:
        base = ("tools", tool.name, "parameters")
        odd = _non_text_key(tool.parameters, ())
        if odd is not None:  # JSON Schema is JSON: `1:` or `true:` as a key has no meaning there
            # Only the last step is a key YAML read as no text (`no:` is false): name it as written.
            key = self.src.doc_of("tools", tool.name).written((*base, *odd))
            self.add("error", f"`parameters` of tool `{tool.name}`: key `{key}` at "
                     f"`{'.'.join([*map(str, odd[:-1]), key])}` must be text; quote it", *base, *odd)
            return
        text = json.dumps(tool.parameters, sort_keys=True)  # the cache key of both checks below
        try:
            _check_schema(text)
        except NotASchema as exc:
            where = ".".join(map(str, exc.path))
            self.add("error", f"`parameters` of tool `{tool.name}` is not a valid JSON Schema"
                     f"{f' at `{where}`' if where else ''}: {exc.message}", "tools", tool.name, "parameters", *exc.path)
            return
        unresolved = _unresolved_ref(text)
        if unresolved:
            self.add("error", f"`parameters` of tool `{tool.name}`: `$ref: {unresolved}` points nowhere "
                     "(a tool's schema can only refer inside itself, e.g. `#/$defs/NAME`)", *base)
        if tool.parameters.get("type") != "object":
            self.add("error", f"`parameters` of tool `{tool.name}` must have `type: object` "
                     "(a tool's arguments are a JSON object)", *base)

    # -- state paths ---------------------------------------------------------------

    def undeclared(self, path: str | tuple[str, ...]) -> str | None:
        """Why a state path is not declared, or None when it is (or cannot be checked). Once per
        path: the declarations do not change while the checks run, and a big bot reads the same
        paths from many templates (`state.user_name` in every route's prompt)."""
        if MEMOS and path in self.undeclared_paths:
            return self.undeclared_paths[path]
        known = self.undeclared_paths[path] = self._undeclared(path)
        return known

    def _undeclared(self, path: str | tuple[str, ...]) -> str | None:
        parts = tuple(path.split(".")) if isinstance(path, str) else path
        if len(parts) < 2:
            return None
        root, rest = parts[0], parts[1:]
        if root == "state":
            missing = _missing(self.config.state, rest)
            if missing:
                return f"`state.{'.'.join(missing)}` is not declared in the top-level `state:`" \
                       f"{suggest(missing[-1], _keys_at(self.config.state, missing[:-1]))}"
        elif root == "scope":
            missing = _missing(self.declared_scope, rest)
            if missing:
                return f"`scope.{'.'.join(missing)}` is not declared in any route's `scope: local:` or `shared:`" \
                       f"{suggest(missing[-1], _keys_at(self.declared_scope, missing[:-1]))}"
        return None

    def invisible(self, ref: tuple[str, ...], routes: list[str]) -> str | None:
        """Why a declared `scope.KEY` cannot be seen from one of `routes` (the routes the
        template runs on), or None."""
        if len(ref) < 2 or ref[0] != "scope":
            return None
        for route in routes:
            if not self.visibility.sees(route, ref[1]):
                owners = ", ".join(f"`{r}`" for r in self.visibility.declaring(ref[1]))
                return (f"`scope.{ref[1]}` is declared by {owners} and is not visible on route `{route}` (a route "
                        "sees its own scope's keys and the `shared` keys of the scopes it is pushed from)")
        return None

    # -- templates -------------------------------------------------------------------

    def template(self, source: str, what: str, path: tuple, tool: ToolConfig | None,
                 variables: tuple[str, ...] = TEMPLATE_VARIABLES, routes: list[str] | None = None,
                 undeclared: str = "warning", said: bool | None = None) -> None:
        said = path[-1] in USER_FACING if said is None else said
        if "{" not in source:
            if said and self.config.catalogs is not None and source.strip():
                self.untranslated(what, path)
            return  # plain text: nothing to compile or resolve
        # A big bot has tens of thousands of templates and nearly all are fine: the file, the
        # line and the closures that place a diagnostic are made only when there is one.
        try:
            refs, names = _analyse(source)
        except TemplateSyntaxError as exc:
            self.at_template_line(path, "error", f"template error in {what}: {exc.message}", exc.lineno or 1)
            return
        if "t(" in source or (said and self.config.catalogs is not None):
            doc = self.src.doc_of(path[0], path[1]) if len(path) > 1 else self.src.main
            self.translations(source, what, partial(self.at_template_line, path),
                              partial(_template_line, doc, path), doc.file, said)
        for kind_, unknown, lineno in names:
            known = ENV.filters if kind_ == "filter" else ENV.tests
            self.at_template_line(path, "error", f"template error in {what}: no {kind_} named `{unknown}`"
                                  f"{suggest(unknown, known)}", lineno)
        for ref, lineno in refs:
            if MEMOS and len(ref) == 1 and (ref[0] in variables or ref[0] in ENV.globals):
                continue  # a variable it may read, read whole: nothing to say (template_read's first answer)
            problem = self.template_read(ref, what, tool, variables, routes)
            if problem is not None:
                self.at_template_line(path, undeclared if problem[0] is None else problem[0], problem[1], lineno)

    def template_read(self, ref: tuple[str, ...], what: str, tool: ToolConfig | None, variables: tuple[str, ...],
                      routes: list[str] | None) -> tuple[str | None, str] | None:
        """What is wrong with one variable a template reads: (severity, message), the severity
        None for an undeclared name (the caller's `undeclared` severity); None when nothing is."""
        head = ref[0]
        if head not in variables and head not in ENV.globals:
            if head == "env":
                return "error", (f"{what} reads `{'.'.join(ref)}`, but `env` can only be read in a tool's "
                                 "`http:` section (so secrets never reach prompts, events or the history)")
            return "error", (f"{what} uses unknown template variable `{head}`"
                             f"{suggest(head, variables)} (templates can use: {', '.join(variables)})")
        if len(ref) == 1:
            return None
        if head == "env" and ref[1] not in self.config.env:
            return "error", (f"{what} reads `env.{ref[1]}`, but the bot does not declare it under `env:`"
                             f"{suggest(ref[1], self.config.env)}")
        if head in ("state", "scope"):
            problem = self.undeclared(ref) or self.invisible(ref, routes or [])
            if problem:
                return None, f"{what} reads `{'.'.join(ref)}`, but {problem}"
        elif head == "args" and tool is not None:
            declared = _declared_args(tool.parameters)
            if declared is not None and ref[1] not in declared:
                return None, (f"{what} reads `args.{ref[1]}`, but the tool's `parameters` declare no "
                              f"property `{ref[1]}`{suggest(ref[1], declared)}")
        return None

    def at_template_line(self, path: tuple, severity: str, message: str, lineno: int) -> None:
        """A diagnostic at line `lineno` of the template at `path`."""
        doc = self.src.doc_of(path[0], path[1]) if len(path) > 1 else self.src.main
        line, col = _template_line(doc, path, lineno)
        self.out.append(Diagnostic(doc.file, line, col, severity, message, ".".join(map(str, path))))

    def stable_system(self, route: RouteConfig) -> None:
        """A `system:` that reads the clock or per-turn state renders a new prompt on (almost) every
        call, so providers' prompt caches never hit (issue 38): warned at the first such read,
        unless the route's model says `prompt_cache: false`."""
        source = route.system
        if "{" not in source or self.config.route_model(route.name).prompt_cache is False:
            return
        try:
            refs, _ = _analyse(source)
        except TemplateSyntaxError:
            return  # reported by the template check
        changing = [(ref, lineno) for ref, lineno in refs if ref[0] in CHANGING_VARIABLES]
        if not changing:
            return
        path = ("routes", route.name, "system")
        doc = self.src.doc_of(*path[:2])
        line, col = _template_line(doc, path, changing[0][1])
        names = _changing_names([ref for ref, _ in changing])
        self.out.append(Diagnostic(doc.file, line, col, "warning", (
            f"`system` of route `{route.name}` reads {', '.join(f'`{n}`' for n in _shortest(names))}, which "
            f"{'changes' if len(names) == 1 else 'change'} as the conversation goes: every call is then a new prompt to the provider's prompt cache. "
            "Move them to the route's (or the bot's) `context:`, sent after the memory on every call "
            "(docs/models.md, \"Stable prompts\"), or set `model: {prompt_cache: false}` on the route"),
            ".".join(path)))

    def translations(self, source: str, what: str, emit: Any, line_of: Any, file: str, said: bool) -> None:
        """The `t('key')` calls of a template (docs/i18n.md): kept for the catalog checks; an
        error without `locales:`; a text the user gets that uses no `t()` is untranslated."""
        calling = "t(" in source  # both patterns need `t(`: most templates skip them
        calls = list(T_CALL.finditer(source)) if calling else []
        computed = list(T_COMPUTED.finditer(source)) if calling else []
        if (calls or computed) and self.config.catalogs is None:
            emit("error", f"{what} calls `t()`, but the bot declares no `locales:` (docs/i18n.md)",
                 source.count("\n", 0, min(c.start() for c in calls + computed)) + 1)
            return
        for found, keys in ((calls, self.used_keys), (computed, self.computed_keys)):
            for call in found:
                lineno = source.count("\n", 0, call.start()) + 1
                line, col = line_of(lineno)
                keys.setdefault(call.group(2) or "", (file, line, col))
        if said and not calling and self.config.catalogs is not None:
            emit("warning", f"{what} is sent to the user untranslated: the bot declares `locales:`, so write "
                 "it as `{{ t('key') }}` with the key in each catalog (docs/i18n.md)", 1)

    def untranslated(self, what: str, path: tuple) -> None:
        message = (f"{what} is sent to the user untranslated: the bot declares `locales:`, so write it "
                   "as `{{ t('key') }}` with the key in each catalog (docs/i18n.md)")
        if len(path) > 1:
            self.add("warning", message, *path)
        else:  # a top-level field (the bot's `description:`)
            pos = self.src.main.pos(path)
            self.out.append(Diagnostic(self.src.main.file, pos.line, pos.col, "warning", message, path[0]))

    def fallbacks(self) -> None:
        """`fallback:` of the bot and of routes (what the user gets when the model has nothing to
        say): templates on the routes they serve; in a bot with `locales:`, translated."""
        for route in self.config.routes.values():
            if route.fallback:
                self.template(route.fallback, f"`fallback` of route `{route.name}`", ("routes", route.name, "fallback"),
                              None, routes=[route.name])
        if self.config.fallback:
            served = [name for name, route in self.config.routes.items() if not route.fallback]
            self.template(self.config.fallback, "the bot's `fallback`", ("fallback",), None, routes=served)

    def follow_ups(self) -> None:
        """Routes' `follow_up:` (engine/follow_up.py): the message is a template the user reads
        (translated in a bot with `locales:`); WhatsApp refuses free text more than 24 hours after
        the user's last message, so a longer `after` there needs a `whatsapp_template`; a phone
        call cannot be written to at all."""
        whatsapp = "whatsapp" in self.config.channels
        for route in self.config.routes.values():
            follow_up = route.follow_up
            if follow_up is None:
                continue
            at = ("routes", route.name, "follow_up")
            self.template(follow_up.message, f"`follow_up.message` of route `{route.name}`", (*at, "message"), None,
                          routes=[route.name], said=True)
            if whatsapp and follow_up.after > 24 * 3600 and follow_up.whatsapp_template is None:
                self.add("warning", f"route `{route.name}`'s follow-up comes more than 24 hours after the user's "
                         "last message: WhatsApp refuses free text then, so on WhatsApp it is never sent (give it a "
                         "`whatsapp_template:` approved in WhatsApp Manager, or an `after` of 24h or less)",
                         *at, "after")
            if set(self.config.channels) == {"twilio"}:
                self.add("warning", f"route `{route.name}` has a follow-up, but the bot's only channel is the phone "
                         "(twilio): a call cannot be written to once it is over, so callers never get it (it is "
                         "refused with a `FollowUpRefused` event); only users of the web page and the HTTP API do",
                         *at)
            if follow_up.whatsapp_template is not None and not whatsapp:
                self.add("warning", f"route `{route.name}`'s follow-up names a `whatsapp_template`, but the bot has "
                         "no `whatsapp` channel: it is never used", *at, "whatsapp_template")

    def outcomes(self) -> None:
        """`outcomes:` (engine/outcomes.py): the routes they name exist (an error: the outcome
        could never be recorded), the events they name are ones the bot can emit (a warning: a
        Python handler may emit a type no YAML names), the `if:` compiles."""
        if not self.config.outcomes:
            return  # (the bot's event types are a walk of every tool's actions)
        emitted = self.config.event_types()
        for outcome in self.config.outcomes:
            at = ("outcomes", outcome.name)
            for route in outcome.routes:
                if route not in self.config.routes:
                    self.add("error", f"outcome `{outcome.name}` names route `{route}`, which the bot does not have"
                             f"{suggest(route, self.config.routes)}", *at, "route")
            for event in outcome.events:
                if event not in emitted:
                    self.add("warning", f"outcome `{outcome.name}` waits for event `{event}`, which no `events:` "
                             f"declares and no tool emits, so it is recorded only if a handler emits it"
                             f"{suggest(event, emitted)}", *at, "event")
            if outcome.condition is not None:
                self.condition(outcome.condition, f"the `if` of outcome `{outcome.name}`", (*at, "if"), None,
                               list(self.config.routes))

    def display_texts(self) -> None:
        """The texts the page shows end users outside the conversation: the bot's `description:`,
        each route's `title:` and the widget's `title:` and `greeting:`; in a bot with `locales:`, templates that
        see `t()` and `locale` only, warned of when plain (as a channel's greeting is: said).
        An operator's `canned:` replies see the same (the operator page renders them apart from a turn)."""
        for name, text in self.config.canned.items():
            self.template(text, f"canned reply `{name}`", ("canned", name), None, variables=DISPLAY_VARIABLES)
        if self.config.catalogs is None:
            return
        if self.config.description:
            self.template(self.config.description, "the bot's `description`", ("description",), None,
                          variables=DISPLAY_VARIABLES)
        widget = self.config.widget
        for field in ("title", "greeting") if widget is not None else ():  # the panel's (server/widget.py)
            if getattr(widget, field):
                self.template(getattr(widget, field), f"`widget.{field}`", ("widget", field), None,
                              variables=DISPLAY_VARIABLES, said=True)
        for route in self.config.routes.values():
            if route.title:
                self.template(route.title, f"`title` of route `{route.name}`", ("routes", route.name, "title"), None,
                              variables=DISPLAY_VARIABLES, routes=[route.name])


# What a template reads that changes as a conversation goes: the clock, and the per-turn state
# and input. Read in a `system:` they make every call a new prompt to a provider's cache.
CLOCK_VARIABLES = frozenset({"now", "today"})
CHANGING_VARIABLES = CLOCK_VARIABLES | {"state", "scope", "turn", "user_message", "data"}


def _template_line(doc: Any, path: tuple, lineno: int) -> tuple[int, int]:
    """The file line and column of line `lineno` of the template at `path` in `doc`."""
    pos = doc.pos(path)  # only when there is something to report: most templates are fine
    if pos.style in ("|", ">"):  # the text starts on the line after `|` / `>`
        line = pos.value_line + lineno
        return line, doc.indent(line)
    line = pos.value_line + lineno - 1
    return line, pos.value_col if lineno == 1 else doc.indent(line)


def _changing_names(refs: list[tuple[str, ...]]) -> list[str]:
    """`now`, `state.booking`...: each clock variable, and each state key read (a root read alone
    only when nothing below it is), in the order first read."""
    names: dict[str, None] = {}
    for ref in refs:
        names[ref[0] if ref[0] in CLOCK_VARIABLES else ".".join(ref[:2])] = None
    return [n for n in names if "." in n or not any(m.startswith(n + ".") for m in names)]


def _shortest(names: list[str], most: int = 4) -> list[str]:
    """At most `most` names, the rest counted: a warning stays one line."""
    return names if len(names) <= most else [*names[:most], f"and {len(names) - most} more"]


# The fields whose text a bot sends without a model: in a bot with `locales:` they must use `t()`.
USER_FACING = frozenset({"message", "reply", "text", "ask", "rejected", "choices", "title", "description", "fallback"})

_Analysis = tuple[tuple[tuple[tuple[str, ...], int], ...], tuple[tuple[str, str, int], ...]]

# `{{ dotted.name | filter }}` and simple conditions (`a.b > 3 and not c is none`): most
# templates and every usual condition are only text and such expressions, and they are read
# here without Jinja's parser (a big bot has thousands of them).
_NAME = r"(?!(?:not|in|is|or|and|if|else)\b)[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_OPERAND = r"""(?:""" + _NAME + r"""|'[^'\\{}\n]*'|"[^"\\{}\n]*"|\d+(?:\.\d+)?)"""
_TERM = r"(?:not\s+)*" + _OPERAND + r"(?:\s+is\s+(?:not\s+)?(?:none|defined|undefined)\b)?"
_BINARY = r"(?:\s+(?:or|and|in|not\s+in)\s+|\s*(?:==|!=|<=|>=|<|>|\+|\*|/)\s*|\s+-\s+)"
_SIMPLE = re.compile(
    r"\{\{-?\s*(" + _TERM + r"(?:" + _BINARY + _TERM + r")*)\s*((?:\|\s*[A-Za-z_]\w*\s*)*)-?\}\}"
)
_TOKEN = re.compile(r"""'[^']*'|"[^"]*"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*""")
_KEYWORDS = frozenset({"true", "false", "none", "True", "False", "None", "and", "or", "not", "in", "is", "if",
                       "else", "elif", "for", "recursive", "with", "without", "import", "from", "as"})
# Words of a simple expression that are no variables: operators, constants, and (after `is`) tests.
_OPERATOR_WORDS = frozenset({"and", "or", "not", "in", "is"})
_CONSTANTS = frozenset({"true", "false", "none", "True", "False", "None"})
_TESTS_AFTER_IS = frozenset({"none", "defined", "undefined"})
# Names Jinja itself provides in some blocks.
_JINJA_NAMES = frozenset({"loop", "caller", "varargs", "kwargs", "self", "super"})


def _zone_names() -> set[str]:
    import zoneinfo  # only for a bot that names a zone that does not exist

    return zoneinfo.available_timezones()


@lru_cache(maxsize=16384)
def _analyse(source: str) -> _Analysis:
    """Read a template once: the variable paths it reads (with the template line of their
    first use) and the filters/tests it names that do not exist. Raises TemplateSyntaxError."""
    fast = _analyse_simple(source)
    if fast is not None:
        return fast
    ast = ENV.parse(source)
    stored = {n.name for n in ast.find_all(nodes.Name) if n.ctx in ("store", "param")}
    refs: dict[tuple[str, ...], int] = {}
    for node in ast.find_all(nodes.Name):
        if node.ctx == "load" and node.name not in stored and node.name not in _JINJA_NAMES:
            refs.setdefault((node.name,), node.lineno)
    for access in ast.find_all((nodes.Getattr, nodes.Getitem)):
        path = _attr_path(access)
        if path and path[0] not in stored and path[0] not in _JINJA_NAMES:
            refs.setdefault(path, access.lineno)
    _keep_longest(refs)
    unknown: list[tuple[str, str, int]] = []
    for call in ast.find_all((nodes.Filter, nodes.Test)):
        kind, known = ("filter", ENV.filters) if isinstance(call, nodes.Filter) else ("test", ENV.tests)
        if call.name not in known:
            unknown.append((kind, call.name, call.lineno))
    return tuple(sorted(refs.items(), key=lambda kv: kv[1])), tuple(unknown)


def _keep_longest(refs: dict[tuple[str, ...], int]) -> None:
    """Jinja sees `state.a` inside `state.a.b`: keep the longest paths, so one typo is one warning
    (also when `state.a` is read by itself elsewhere in the template: it is below `state.a.b`)."""
    longest = [p for p in refs if len(p) > 1]
    if len(longest) < 2:
        return
    for path in longest:
        if any(len(q) > len(path) and q[: len(path)] == path for q in longest):
            del refs[path]


def paths_read(source: str) -> list[tuple[str, ...]]:
    """The variable paths a template reads (`("state", "total")`), each root alone only when
    nothing below it is read. Raises TemplateSyntaxError."""
    return list(_paths_read(source))


@lru_cache(maxsize=4096)
def _paths_read(source: str) -> tuple[tuple[str, ...], ...]:
    """`paths_read`, once per template text (a big bot's `set` templates repeat: `{{ args.value }}`)."""
    refs = [path for path, _ in _analyse(source)[0]]
    return tuple(p for p in refs if len(p) > 1 or not any(len(q) > 1 and q[0] == p[0] for q in refs))


def _analyse_simple(source: str) -> _Analysis | None:
    """The same answer as Jinja's parser for templates made only of text and simple
    expressions; None for anything else. Read once per shape (`_SHAPES`)."""
    if "{%" in source or "{#" in source:
        return None
    return _SHAPES.analysis(source)


class _ShapeMemo:
    """A simple template's reading, once per shape: the template with each run of digits written
    `0`, and which runs are the same run (5,000 generated routes' `{{ scope.form_17.field }}`,
    `state.visits > 17`). The reader decides by character classes (a digit is a digit, however
    many), by words without digits (keywords, tests, dict methods, filter names:
    `words_without_digits`) and by comparing names; so a template whose digit runs are renamed one
    for one reads the same paths with the runs renamed in them, at the same lines (a run is never
    cut: a name or number ends where its digits do). Only readings by the simple reader are kept
    (not Jinja's parser's: its literals have escapes). Which paths are declared and visible is
    still judged for each template: that hangs on its names."""

    def __init__(self, size: int = 16384):
        self.size, self.vocabulary, self.usable = size, (-1, -1), False
        self.kept: dict[tuple[str, tuple[int, ...]], _Reading] = {}

    def cache_clear(self) -> None:
        self.kept.clear()

    def analysis(self, source: str) -> _Analysis | None:
        parts = _DIGITS.split(source)  # text, run, text, run, ..., text
        if len(parts) == 1 or not MEMOS or not self.words_without_digits() or _SEP in source:
            return _analyse_simple_text(source)
        first: dict[str, int] = {}
        key = ("0".join(parts[::2]), tuple([first.setdefault(run, len(first)) for run in parts[1::2]]))
        kept = self.kept.get(key)
        if kept is not None:
            renamed = kept.renamed(dict(zip(kept.runs, first, strict=True)))
            if renamed is not None:
                return renamed
        found = _analyse_simple_text(source)
        if found is not None and kept is None:
            if len(self.kept) >= self.size:
                self.kept.clear()
            self.kept[key] = _Reading(tuple(first), found)
        return found

    def words_without_digits(self) -> bool:
        """Whether the words the reader tells apart from names have no digits (a filter `b64`
        beside a name `b65` would read differently: no shapes then). Looked at again when a
        filter or test is added."""
        vocabulary = (len(ENV.filters), len(ENV.tests))
        if vocabulary != self.vocabulary:
            words = (*ENV.filters, *ENV.tests, *_KEYWORDS, *_OPERATOR_WORDS, *_CONSTANTS, *_TESTS_AFTER_IS,
                     *_DICT_METHODS)
            self.vocabulary, self.usable = vocabulary, not any(_HAS_DIGIT.search(word) for word in words)
        return self.usable


class _Reading:
    """One template's reading, kept for the templates of its shape: its digit runs (in the order
    first seen), and where they are in the paths and names it read (most have none: reused whole)."""

    def __init__(self, runs: tuple[str, ...], analysis: _Analysis):
        self.runs, self.analysis = runs, analysis
        self.refs = [None if not _HAS_DIGIT.search(_SEP.join(path)) else _DIGITS.split(_SEP.join(path))
                     for path, _ in analysis[0]]
        self.names = [None if not _HAS_DIGIT.search(name) else _DIGITS.split(name) for _, name, _ in analysis[1]]
        self.plain = not any(self.refs) and not any(self.names)

    def renamed(self, runs: dict[str, str]) -> _Analysis | None:
        """The reading with each digit run replaced as `runs` says (None if one is not there)."""
        if self.plain:
            return self.analysis
        try:
            refs = tuple(ref if pieces is None else (tuple(_put(pieces, runs).split(_SEP)), ref[1])
                         for ref, pieces in zip(self.analysis[0], self.refs, strict=True))
            names = tuple(entry if pieces is None else (entry[0], _put(pieces, runs), entry[2])
                          for entry, pieces in zip(self.analysis[1], self.names, strict=True))
        except KeyError:
            return None
        return refs, names


def _put(pieces: list[str], runs: dict[str, str]) -> str:
    """Text split around its digit runs, joined again with each run replaced."""
    out = list(pieces)
    out[1::2] = [runs[run] for run in pieces[1::2]]
    return "".join(out)


_SEP = "\x1f"  # between a path's parts while its runs are replaced (no name holds it)


# ASCII digits (the runs renamed): a digit of another script stays in the text compared whole.
_DIGITS = re.compile(r"([0-9]+)")
_HAS_DIGIT = re.compile(r"[0-9]")


_SHAPES = _ShapeMemo()


def _analyse_simple_text(source: str) -> _Analysis | None:
    """`_analyse_simple` of one text (no shape memo)."""
    if "\n" not in source:  # one line: what it reads hangs on its expressions alone
        expressions = tuple(_SIMPLE.findall(source))
        if source.count("{{") != len(expressions):
            return None  # some expression is not simple: let Jinja parse (and judge) it
        return _analyse_one_line(expressions)
    refs: dict[tuple[str, ...], int] = {}
    unknown: list[tuple[str, str, int]] = []
    matches = 0
    lines = "\n" in source  # most are one line: no line breaks to count
    for match in _SIMPLE.finditer(source):
        matches += 1
        found = _simple_expression(match.group(1), match.group(2))
        if found is None:
            return None
        paths, filters = found
        if paths:
            first = source.count("\n", 0, match.start(1)) + 1 if lines else 1
            for path, breaks in paths:
                refs.setdefault(path, first + breaks)
        if filters:  # at the name's own line, as Jinja reports it
            first = source.count("\n", 0, match.start(2)) + 1 if lines else 1
            unknown += [("filter", name, first + breaks) for name, breaks in filters]
    if source.count("{{") != matches:  # a match holds no `{{` (quoted text excludes braces)
        return None  # some expression is not simple: let Jinja parse (and judge) it
    _keep_longest(refs)
    return tuple(sorted(refs.items(), key=lambda kv: kv[1])), tuple(unknown)


@lru_cache(maxsize=16384)
def _analyse_one_line(expressions: tuple[tuple[str, str], ...]) -> _Analysis | None:
    """`_analyse_simple` of a one-line template, from its `{{ }}` parts (expression, filters):
    the text around them changes nothing, so templates that differ only in their text
    (`Step 7 is set to {{ args.value }}`) are read once. Everything is on line 1."""
    refs: dict[tuple[str, ...], int] = {}
    unknown: list[tuple[str, str, int]] = []
    for expression, filters in expressions:
        found = _simple_expression(expression, filters)
        if found is None:
            return None
        for path, _ in found[0]:
            refs.setdefault(path, 1)
        unknown += [("filter", name, 1) for name, _ in found[1]]
    _keep_longest(refs)
    return tuple(refs.items()), tuple(unknown)


_Reads = tuple[tuple[tuple[str, ...], int], ...]


@lru_cache(maxsize=16384)
def _simple_expression(expression: str, filters: str) -> tuple[_Reads, tuple[tuple[str, int], ...]] | None:
    """What one simple `{{ }}` read: its variable paths, and the filters it names that do not
    exist, each with the line breaks before it in its part (the same expressions recur across
    a bot's templates: read once). None when a keyword makes it not simple after all."""
    paths: list[tuple[tuple[str, ...], int]] = []
    previous = ""
    one_line = "\n" not in expression  # most are: no line breaks to count before each name
    for token in _TOKEN.finditer(expression):
        text = token.group()
        after_is = previous == "is" or previous == "is not"
        previous = ("is not" if previous == "is" and text == "not" else text)
        if text[0] in "'\"" or text in _OPERATOR_WORDS or text in _CONSTANTS \
                or (after_is and text in _TESTS_AFTER_IS):
            continue
        parts = tuple(text.split("."))
        if not _KEYWORDS.isdisjoint(parts):
            return None
        breaks = 0 if one_line else expression.count("\n", 0, token.start())
        paths.append((parts[:1], breaks))
        if len(parts) > 1:
            path = _cut_dict_methods(parts) if not _DICT_METHODS.isdisjoint(parts) else parts
            if path and len(path) > 1:
                paths.append((path, breaks))
    unknown = tuple((name.group(), filters.count("\n", 0, name.start()))
                    for name in _FILTER_NAME.finditer(filters) if name.group() not in ENV.filters)
    return tuple(paths), unknown


_FILTER_NAME = re.compile(r"[A-Za-z_]\w*")
# What a condition (an expression without braces) must not hold: the marks of a template.
_TEMPLATE_MARK = re.compile(r"\{\{|\}\}|\{%|%\}|\{#")


def _attr_path(node: nodes.Node) -> tuple[str, ...] | None:
    path: list[str] = []
    cur: Any = node
    while isinstance(cur, (nodes.Getattr, nodes.Getitem)):
        if isinstance(cur, nodes.Getattr):
            path.append(cur.attr)
        elif isinstance(cur.arg, nodes.Const) and isinstance(cur.arg.value, str):
            path.append(cur.arg.value)
        else:
            path = []  # a computed key: only what is above it can be checked
        cur = cur.node
    if not isinstance(cur, nodes.Name) or not path:
        return None
    return _cut_dict_methods((cur.name, *reversed(path)))


def _cut_dict_methods(full: tuple[str, ...]) -> tuple[str, ...] | None:
    """Stop before dict methods: `state.prefs.get('x')` reads state.prefs."""
    for i, part in enumerate(full[1:], start=1):
        if part in _DICT_METHODS:
            return full[:i] if i > 1 else None
    return full


class NotASchema(Exception):
    """What jsonschema's SchemaError says (its message, and the path of the part at fault)."""

    def __init__(self, message: str, path: tuple[Any, ...]):
        super().__init__(message)
        self.message, self.path = message, path


@lru_cache(maxsize=4096)
def _check_schema(text: str) -> None:
    """Draft 2020-12 check of a parameters schema (cached: tools often share one).
    Raises NotASchema."""
    schema = json.loads(text)
    if not _plainly_valid(schema):
        # jsonschema loads only here (about 0.1 s): a valid bot with plain schemas never needs it
        from jsonschema import Draft202012Validator
        from jsonschema.exceptions import SchemaError

        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise NotASchema(exc.message, tuple(exc.path)) from exc


def _non_text_key(node: Any, path: tuple) -> tuple | None:
    """The path of the first mapping key that is not a string, or None."""
    if isinstance(node, dict):
        for key, value in node.items():
            if not isinstance(key, str):
                return (*path, key)
            found = _non_text_key(value, (*path, key))
            if found is not None:
                return found
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found = _non_text_key(item, (*path, i))
            if found is not None:
                return found
    return None


@lru_cache(maxsize=4096)
def _unresolved_ref(text: str) -> str | None:
    """The first `$ref` of a parameters schema that resolves nowhere, or None."""
    if '"$ref"' not in text:
        return None
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    schema = json.loads(text)
    base = "urn:chatrun:parameters"
    resolver = Registry().with_resource(base, DRAFT202012.create_resource(schema)).resolver(base_uri=base)
    for ref in _refs(schema):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            return ref
    return None


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            elif key not in ("const", "enum", "default", "examples"):
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})
_NUMBER_KEYS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
_COUNT_KEYS = frozenset({"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"})
_TEXT_KEYS = frozenset({"description", "title", "format", "$comment"})
_ANY_KEYS = frozenset({"default", "const", "examples"})


def _plainly_valid(schema: Any) -> bool:
    """True when a schema uses only common keywords, each with a value the draft 2020-12
    meta-schema accepts. Checking against the meta-schema takes about a millisecond per
    schema; this takes microseconds. False means: ask the meta-schema (it may still be valid)."""
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key == "type":
            types = value if isinstance(value, list) else [value]
            if not types or not all(t in _TYPES for t in types) or len(set(types)) != len(types):
                return False
        elif key == "properties":
            if not isinstance(value, dict) or not all(_plainly_valid(v) for v in value.values()):
                return False
        elif key in ("items", "additionalProperties"):
            if not _plainly_valid(value):
                return False
        elif key == "required":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value) \
                    or len(set(value)) != len(value):
                return False
        elif key == "enum":
            if not isinstance(value, list):
                return False
        elif key in _NUMBER_KEYS:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return False
        elif key in _COUNT_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return False
        elif key in _TEXT_KEYS:
            if not isinstance(value, str):
                return False
        elif key == "pattern":
            try:
                re.compile(value)
            except (re.error, TypeError):
                return False
        elif key not in _ANY_KEYS:
            return False
    return True


def _declared_args(parameters: dict[str, Any]) -> list[str] | None:
    """The argument names a parameters schema takes (config.declared_arguments); None when it
    leaves the names open (then any `args.X` may come)."""
    return declared_arguments(parameters)


def _listed_args(parameters: dict[str, Any]) -> list[str]:
    """The names of a parameters schema's `properties` (what an approver may edit)."""
    props = parameters.get("properties")
    return list(props) if isinstance(props, dict) else []


def _merge_decl(into: dict[str, Any], decl: dict[str, Any]) -> None:
    for key, value in decl.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and into[key]:
            if value:
                _merge_decl(into[key], value)
            else:
                into[key] = {}  # one route declares it free-form: anything below is fine
        elif key not in into or not isinstance(value, dict) or value:
            into[key] = dict(value) if isinstance(value, dict) else value


def _missing(decl: Any, parts: tuple[str, ...]) -> tuple[str, ...] | None:
    """The shortest prefix of `parts` that the declaration does not have. Below a value
    that is not a non-empty mapping (null, {}, a list) anything goes: it is free-form."""
    node = decl
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or (i > 0 and not node):
            return None
        if part not in node:
            return parts[: i + 1]
        node = node[part]
    return None


def _keys_at(decl: Any, parts: tuple[str, ...]) -> list[str]:
    for part in parts:
        decl = decl.get(part) if isinstance(decl, dict) else None
    return list(decl) if isinstance(decl, dict) else []


class ScopeVisibility:
    """Which `scope.KEY`s a route can see (README, "State"): the keys declared by the routes its
    scope can have been on (it, and the routes that change route into it), and the `shared` keys
    of every scope that can be below it on the stack. A union over every way there: a key no
    way makes visible is an error waiting for every turn.

    As data flow over the route graph (unions only, so strongly connected parts share one set):
    own(R) = R's local and shared keys, flowing along route edges; shared(R) = R's shared keys,
    flowing along route edges; below(R) flows along route edges, and a push P -> R adds
    shared(P) and below(P). A route sees own(R) and below(R)."""

    def __init__(self, config: BotConfig, graph: RouteGraph):
        self.config = config
        names = list(config.routes)
        moves = [e for e in graph.edges if e.target in config.routes and e.kind in ("push", "route", "call")]
        route_edges: list[tuple[str, str, frozenset[str]]] = [
            (e.source, e.target, frozenset()) for e in moves if e.kind == "route" and e.target is not None]
        decl = {n: config.routes[n].scope for n in names}
        own, shared = _flow(names, route_edges, {n: {*decl[n].local, *decl[n].shared} for n in names},
                            {n: set(decl[n].shared) for n in names})  # one graph: its components found once
        push_edges = [(e.source, e.target, shared[e.source]) for e in moves
                      if e.kind in ("push", "call") and e.target is not None]
        (below,) = _flow(names, route_edges + push_edges, {n: set() for n in names})
        self._own, self._below = own, below

    def sees(self, route: str, key: str) -> bool:
        if route not in self._own:
            return True
        return key in self._own[route] or key in self._below[route]

    def declaring(self, key: str) -> list[str]:
        return [r.name for r in self.config.routes.values() if key in r.scope.local or key in r.scope.shared]


def _flow(nodes: list[str], edges: list[tuple[str, str, frozenset[str]]],
          *bases: dict[str, set[str]]) -> list[dict[str, frozenset[str]]]:
    """For each base, the least sets with value(n) >= base(n) and, for every edge (a, b, extra),
    value(b) >= value(a) | extra: strongly connected components (found once for all the bases)
    in topological order."""
    succ: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b, _ in edges:
        succ[a].append(b)
    component = _components(nodes, succ)  # node -> component index, sources first
    members: dict[int, list[str]] = {}
    for n in nodes:
        members.setdefault(component[n], []).append(n)
    inside: list[tuple[int, frozenset[str]]] = []  # (component, extra) of the edges inside a cycle
    incoming: dict[int, list[tuple[str, frozenset[str]]]] = {}
    for a, b, extra in edges:
        if component[a] == component[b]:
            inside.append((component[b], extra))
        else:
            incoming.setdefault(component[b], []).append((a, extra))
    return [_flow_one(nodes, component, members, inside, incoming, base) for base in bases]


def _flow_one(nodes: list[str], component: dict[str, int], members: dict[int, list[str]],
              inside: list[tuple[int, frozenset[str]]], incoming: dict[int, list[tuple[str, frozenset[str]]]],
              base: dict[str, set[str]]) -> dict[str, frozenset[str]]:
    """`_flow` of one base over the components it found."""
    value: dict[int, set[str]] = {c: set().union(*(base[n] for n in ms)) for c, ms in members.items()}
    for c, extra in inside:
        value[c] |= extra  # inside a cycle: every member gets it
    done: dict[int, frozenset[str]] = {}
    for c in sorted(members):
        acc = value[c]
        for a, extra in incoming.get(c, ()):
            acc |= done[component[a]]
            acc |= extra
        done[c] = frozenset(acc)
    return {n: done[component[n]] for n in nodes}


def _components(nodes: list[str], succ: dict[str, list[str]]) -> dict[str, int]:
    """Tarjan's strongly connected components, iteratively (a long chain of routes must not
    hit the recursion limit). Numbered in topological order: an edge between two components
    goes from a lower number to a higher one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    scc.append(member)
                    if member == node:
                        break
                found.append(scc)
    # Tarjan finds components in reverse topological order.
    return {n: i for i, scc in enumerate(reversed(found)) for n in scc}


def _user_template_checks(checker: _Checker) -> None:
    """A `user:` template that reads a field of `data` without a guard fails every turn whose
    client sent only text (then `data` is empty and the text is `user_message`)."""
    for route in checker.config.routes.values():
        if not route.user:
            continue
        try:
            reads = _unguarded_data_reads(route.user)
        except TemplateSyntaxError:
            continue  # reported by the template check
        if reads:
            checker.add("warning", f"`user` of route `{route.name}` reads `{reads[0]}`, which is undefined when "
                        "a client sends only text (`data` is then empty): every such turn fails. Read the text "
                        f"as `user_message`, and optional fields as `{reads[0]} | default('')` or under "
                        f"`{{% if {reads[0]} is defined %}}`", "routes", route.name, "user")


@lru_cache(maxsize=1024)
def _unguarded_data_reads(source: str) -> list[str]:
    """The `data.KEY` paths a template reads outside a `default` filter, unless the template
    tests a path with `is defined`/`undefined` or `in` (an author guarding by hand). A field
    only tested for truth (`{% if data.game %}`, `data.game or 'chess'`, `not data.game`) is
    safe, since an undefined field is false there; so is reading it where such a test holds
    (the `if` body, `and`'s right side)."""
    tree = ENV.parse(source)
    if any(t.name in ("defined", "undefined") for t in tree.find_all(nodes.Test)) \
            or any(op.op in ("in", "notin") for op in tree.find_all(nodes.Operand)):
        return []
    found: list[str] = []

    def visit(node: nodes.Node, guarded: bool, true: frozenset[str]) -> None:
        if isinstance(node, nodes.Filter) and node.name in ("default", "d"):
            guarded = True  # what it filters may be undefined; its arguments are visited too
        if isinstance(node, (nodes.If, nodes.CondExpr, nodes.And, nodes.Or, nodes.Not)):
            visit_truth(node, guarded, true)
            return
        if isinstance(node, (nodes.Getattr, nodes.Getitem)) and not guarded:
            path = _attr_path(node)
            if path and path[0] == "data" and len(path) > 1:
                if ".".join(path[:2]) not in true:
                    found.append(".".join(path[:2]))
                return
        for child in node.iter_child_nodes():
            visit(child, guarded, true)

    def test(node: nodes.Node, guarded: bool, true: frozenset[str]) -> frozenset[str]:
        """Visit an expression read for its truth; the fields that hold when it is true."""
        if isinstance(node, nodes.Not):
            test(node.node, guarded, true)
            return frozenset()
        if isinstance(node, nodes.And):
            left = test(node.left, guarded, true)
            return left | test(node.right, guarded, true | left)
        if isinstance(node, nodes.Or):
            test(node.left, guarded, true)
            test(node.right, guarded, true)
            return frozenset()
        field = _data_field(node)
        if field is not None:
            return frozenset({field})  # false when undefined: no read fails
        visit(node, guarded, true)
        return frozenset()

    def visit_truth(node: nodes.Node, guarded: bool, true: frozenset[str]) -> None:
        if isinstance(node, nodes.If):
            holds = test(node.test, guarded, true)
            for child in node.body:
                visit(child, guarded, true | holds)
            for child in [*node.elif_, *node.else_]:
                visit(child, guarded, true)
        elif isinstance(node, nodes.CondExpr):
            holds = test(node.test, guarded, true)
            visit(node.expr1, guarded, true | holds)
            if node.expr2 is not None:
                visit(node.expr2, guarded, true)
        else:  # and, or, not: each side read for its truth (`data.game or 'chess'` is the field or the text)
            test(node, guarded, true)

    visit(tree, False, frozenset())
    return found


def _data_field(node: nodes.Node) -> str | None:
    """`data.KEY` when `node` is exactly that field (not a path below it: `data.game.id` fails
    when `game` is missing, whatever reads it)."""
    if not isinstance(node, (nodes.Getattr, nodes.Getitem)):
        return None
    path = _attr_path(node)
    return ".".join(path) if path and path[0] == "data" and len(path) == 2 else None


def _graph_checks(checker: _Checker) -> None:

    config = checker.config
    graph = checker.graph
    defaults = checker.defaults
    if len(defaults) == 1:
        reached = graph.reachable_from_starts()
        entries = [r.name for r in config.routes.values() if r.entry]
        starts = f"the default route `{defaults[0]}`" + (" or an entry route" if entries else "")
        for name in config.routes:
            if name not in reached:
                checker.add("warning", f"route `{name}` is not reachable from {starts}: no tool on a reachable "
                            "route pushes it or routes to it (if clients start conversations on it, mark it "
                            "`entry: true`)", "routes", name)
    called = {e.target for e in graph.edges if e.kind == "call"}
    for route in config.routes.values():
        if route.returns and route.name not in called:
            checker.add("warning", f"route `{route.name}` has `returns: {route.returns}`, but no tool calls it "
                        "(`call: {route.name}`): it only returns when called".replace("{route.name}", route.name),
                        "routes", route.name, "returns")
    for route in config.routes.values():
        if graph.can_be_nested(route.name):
            continue
        for i, name in enumerate(route.tools):
            tool = config.tools.get(name)
            if tool is not None and tool.action.pop:
                checker.add("warning", f"tool `{name}` pops, but route `{route.name}` is only ever the root scope "
                            "(nothing pushes it): calling it there fails at run time", "routes", route.name, "tools", i)
    used = {name for route in config.routes.values() for name in route.tools}
    used |= {tool.action.operator.on_timeout.tool or "" for tool in config.tools.values()  # a handover's timeout
             if tool.action.operator is not None and tool.action.operator.on_timeout is not None}  # calls it
    for name in config.tools:
        if name not in used:
            checker.add("warning", f"tool `{name}` is not listed by any route, so the model can never call it",
                        "tools", name)


def _channel_checks(checker: _Checker) -> None:
    """`channels:`: a credential names a declared `env:` variable, a template reads declared
    `env` only (the schema has checked each kind's keys)."""
    from chatrun.definition.config import CHANNEL_SECRETS, CHANNEL_TEMPLATES

    config = checker.config
    for kind, channel in config.channels.items():
        at = ("channels", kind)
        for key in CHANNEL_SECRETS.get(kind, ()):
            name = channel.options.get(key)
            if isinstance(name, str) and name not in config.env:
                checker.add("error", f"channel `{kind}` reads its {key} from `env.{name}`, but the bot does not "
                            f"declare it under `env:`{suggest(name, config.env)}", *at, key)
        for key in CHANNEL_TEMPLATES.get(kind, ()):
            text = channel.options.get(key)
            if isinstance(text, str):  # a greeting is said: untranslated in a bot with `locales:`
                checker.template(text, f"`channels.{kind}.{key}`", (*at, key), None, ("env",),
                                 said=key == "greeting" and not _phone_greeting_given(config))
    _phone_handoff_check(checker)


def _phone_greeting_given(config: BotConfig) -> bool:
    """Whether the bot's catalogs give `page.phone_greeting`, said instead of the channel's
    `greeting:` (server/channels/twilio.py `welcome_greeting`)."""
    from chatrun.definition.page_texts import page_texts

    catalogs = config.catalogs
    return catalogs is not None and bool(page_texts(catalogs, catalogs.default)["phone_greeting"])


def _phone_handoff_check(checker: _Checker) -> None:
    """On the phone an operator's takeover is a hand-off to a human number (docs/channels.md,
    "The phone"): without `handoff_to` it ends the call, which an author may not expect."""
    phone = checker.config.channels.get("twilio")
    if phone is None or phone.options.get("handoff_to"):
        return
    for tool in checker.config.tools.values():
        if tool.action.operator is not None:
            checker.add("warning", f"tool `{tool.name}` hands the conversation to an operator, but the "
                        f"`twilio` channel has no `handoff_to:` number: on the phone the hand-over ends the "
                        f"call (set `handoff_to:` to a number the call is then dialled to)",
                        "channels", "twilio")
            return


def _audience_checks(checker: _Checker) -> None:
    """`events:` and `sinks:`: built-in types stay the user's, a sink takes declared backend types
    only, its templates read declared `env` only, its secret is a declared variable; a backend
    type no sink takes is a warning (its events reach only the history)."""
    from chatrun import events as ev

    config = checker.config
    for name in config.events:
        if name in ev.BUILTIN_TYPES:
            checker.add("error", f"`events.{name}`: {name} is a built-in event type, always for the user; "
                        "declare only the bot's own types", "events", name)
        elif name == ev.USAGE:  # a tool's event must not pass for the billed usage a sink takes
            checker.add("error", f"`events.{name}`: {name} is chatrun's own backend event (each turn's usage, for "
                        "a sink that lists it); name the bot's type otherwise", "events", name)
    backend = [name for name, decl in config.events.items() if decl.audience == ev.BACKEND and name not in ev.BUILTIN_TYPES]
    takeable = [*backend, *CHATRUN_BACKEND_TYPES]  # chatrun's own: a user's rating (Session.rate), an outcome
    for sink in config.sinks.values():
        for i, name in enumerate(sink.events or []):
            if name not in takeable:
                checker.add("error", f"sink `{sink.name}` takes event type `{name}`, but `events:` does not declare "
                            f"it with `audience: backend`{suggest(name, takeable)}", "sinks", sink.name, "events", i)
        if sink.webhook is None:
            continue
        hook, at = sink.webhook, ("sinks", sink.name, "webhook")
        texts = [(("url",), hook.url), *((("headers", k), v) for k, v in hook.headers.items())]
        for sub, text in texts:
            checker.template(text, f"`webhook.{'.'.join(sub)}` of sink `{sink.name}`", (*at, *sub), None, ("env",))
        if hook.secret is not None and hook.secret not in config.env:
            checker.add("error", f"sink `{sink.name}` signs with `env.{hook.secret}`, but the bot does not declare it "
                        f"under `env:`{suggest(hook.secret, config.env)}", *at, "secret")
    _channel_checks(checker)
    for name in backend:
        if not config.sinks_for(name):
            checker.add("warning", f"event type `{name}` is for the backend, but no sink takes it: its events "
                        "are kept only in the history", "events", name)
