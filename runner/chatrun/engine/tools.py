"""Tool plumbing: OpenAI tool specs, argument checks, and each bot's tool kinds at work.

Everything here turns a bad tool call into a message for the model (`ToolRefusal`),
never a crash: the model reads what was wrong and can try again. What a tool's call does
is its kind's (chatrun.toolkinds); the Toolbox keeps each kind's runtime for the bot.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from jsonschema import Draft202012Validator

from chatrun.definition.config import BotConfig, ModelConfig, RouteConfig, ToolConfig
from chatrun.engine.binding import bound_problem, offered_parameters
from chatrun.errors import ModelError, ToolRefusal
from chatrun.memory.tokens import TokenCounter
from chatrun.messages import lone_surrogate_at
from chatrun.toolkinds import KINDS
from chatrun.toolkinds.base import KindRuntime


class Toolbox:
    """A bot's tools as the engine calls them: argument validators and the runtime of each
    tool kind (imported handlers, HTTP connections, MCP servers), each built once per bot
    and shared by its sessions."""

    def __init__(self, config: BotConfig):
        self.config = config
        self._validators: dict[str, Draft202012Validator] = {}
        self._runtimes: dict[str, KindRuntime[Any] | None] | None = None  # by kind key, made on first use
        self._setters: dict[str, list[Setter]] | None = None  # by state path, made on first use
        # The token counters the bot's turns use, by (pinned tokenizer, model): made on first use
        # (engine/turn.py), not once per turn.
        self.counters: dict[tuple[str | None, str], TokenCounter] = {}
        # What each route's model calls need that the YAML fixes, assembled once here (issue 39):
        # the turn reads these fields and calls nothing to get them.
        self.plans = {name: plan_route(config, route) for name, route in config.routes.items()}

    def setters(self, path: str) -> list[Setter]:
        """The tools whose action writes `path` (`set:`, a case's `set:`, `ask.into`), in the
        order the bot declares them: what a `requires` refusal tells the model to call. A tool
        that writes a path above or below it counts too (it may set the whole object, or make it)."""
        if self._setters is None:
            self._setters = setter_map(self.config)
        return [s for written, setters in self._setters.items() if _related(written, path) for s in setters]

    def argument_validator(self, tool: ToolConfig) -> Draft202012Validator:
        """The validator of a tool's `parameters` (built once per bot tool; an MCP server's
        tools are validated against the schema the server lists), `format` included: date,
        date-time, time, email, uri, uri-reference, uuid, ipv4, ipv6 are checked."""
        key = tool.name if tool.name in self.config.tools and self.config.tools[tool.name] is tool else None
        validator = self._validators.get(key) if key else None
        if validator is None:
            validator = Draft202012Validator(tool.parameters, format_checker=Draft202012Validator.FORMAT_CHECKER)
            if key:
                self._validators[key] = validator
        return validator

    def output_validator(self, route: str) -> Draft202012Validator:
        """The validator of a route's `output` schema (formats checked)."""
        key = f"route:{route}"
        validator = self._validators.get(key)
        if validator is None:
            output = self.config.routes[route].output
            assert output is not None
            validator = self._validators[key] = Draft202012Validator(
                output.schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        return validator

    async def route_tools(self, route: RouteConfig,
                          mocks: ToolMocks | None = None) -> tuple[dict[str, ToolConfig], list[dict[str, Any]]]:
        """The tools the model may call on a route, by name, and their specs as the model sees them:
        assembled when the bot loaded, or (a kind adds to them: MCP) asked of the kinds now."""
        plan = self.plans.get(route.name)
        if plan is not None and plan.route is route and plan.tools is not None:
            return dict(plan.tools[0]), plan.tools[1]
        offered = await self.offered(route, mocks)
        return offered, [tool_spec(t) for t in offered.values()]

    async def offered(self, route: RouteConfig, mocks: ToolMocks | None = None) -> dict[str, ToolConfig]:
        """The tools the model may call on a route, by name: its `tools:`, as each kind completes
        them and with the tools kinds add (an MCP server's). With mocks that stand in for
        outside services, none is reached: a replayed transcript stays offline and deterministic."""
        offered = {name: self.config.tools[name] for name in route.tools if name in self.config.tools}
        mocked = mocks.mocked_tools() if mocks is not None and not mocks.live else None
        for runtime in self.runtimes().values():
            if runtime is not None:
                await runtime.offer(route, offered, mocked)
        return offered

    def runtimes(self) -> dict[str, KindRuntime[Any] | None]:
        """Each kind's runtime for this bot, by kind key (None: a kind that is gone once loaded)."""
        if self._runtimes is None:
            self._runtimes = {key: kind.runtime(self.config) for key, kind in KINDS.items()}
        return self._runtimes

    def runtime(self, key: str) -> KindRuntime[Any]:
        """The runtime of the kind `key` (a tool's ToolConfig.kind)."""
        runtime = self.runtimes()[key]
        if runtime is None:
            raise RuntimeError(f"tool kind `{key}` has no runtime: its tools become another kind when the bot loads")
        return runtime

    async def aclose(self) -> None:
        """Close what the tools opened on the running event loop: HTTP connections, MCP servers."""
        for runtime in (self._runtimes or {}).values():
            if runtime is not None:
                await runtime.aclose()


@dataclass(frozen=True)
class Setter:
    """A tool whose action writes a state path, and how: `asks` (its `ask.into`: the runtime asks
    the user), `from_args` (a `set:` of the model's arguments: the user should give the value)."""

    tool: str
    asks: bool = False
    from_args: bool = False


def setter_map(config: BotConfig) -> dict[str, list[Setter]]:
    """Each state path a tool's action writes, with the tools that write it."""
    out: dict[str, list[Setter]] = {}
    for tool in config.tools.values():
        action = tool.action
        written: dict[str, Setter] = {}
        for assignments in [action.set, *(case.action.set for case in action.cases)]:
            for path, template in assignments.items():
                from_args = isinstance(template, str) and "args" in template
                if path not in written or from_args:
                    written[path] = Setter(tool.name, from_args=from_args)
        if action.ask is not None and action.ask.into:
            written[action.ask.into] = Setter(tool.name, asks=True)
        for path, setter in written.items():
            out.setdefault(path, []).append(setter)
    return out


def _related(written: str, path: str) -> bool:
    """Whether writing `written` may set `path`: the same path, one above it, or one below it."""
    return written == path or path.startswith(written + ".") or written.startswith(path + ".")


def tool_spec(tool: ToolConfig) -> dict[str, Any]:
    """The tool as the model sees it: its bound arguments are not offered (engine/binding.py)."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": offered_parameters(tool)},
    }


@dataclass(frozen=True)
class RoutePlan:
    """What a route's model calls need that the bot's YAML fixes, assembled when the bot loads:
    its tools and their specs (None when a tool kind adds tools at run time: an MCP route's are
    listed by its servers), its model (the bot's, with the route's own keys), the
    `response_format` its `output:` asks for, and its `context:` template (else the bot's)."""

    route: RouteConfig
    tools: tuple[dict[str, ToolConfig], list[dict[str, Any]]] | None
    model: ModelConfig
    response_format: dict[str, Any] | None
    context: str | None


def plan_route(config: BotConfig, route: RouteConfig) -> RoutePlan:
    return RoutePlan(route, assemble_route_tools(config, route), config.route_model(route.name),
                     response_format(route), config.route_context(route.name))


def assemble_route_tools(
        config: BotConfig, route: RouteConfig) -> tuple[dict[str, ToolConfig], list[dict[str, Any]]] | None:
    """A route's offered tools and specs, when no tool kind adds to them at run time (else None)."""
    offered = {name: config.tools[name] for name in route.tools if name in config.tools}
    if any(kind.adds_tools(route, offered) for kind in KINDS.values()):
        return None
    return offered, [tool_spec(tool) for tool in offered.values()]


def route_tool_specs(config: BotConfig, route: str) -> list[dict[str, Any]]:
    return [tool_spec(config.tools[name]) for name in config.routes[route].tools if name in config.tools]


def response_format(route: RouteConfig) -> dict[str, Any] | None:
    """The `response_format` a route with `output:` asks for (OpenAI's field), else None."""
    output = route.output
    if output is None or output.request == "none":
        return None
    if output.request == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": f"{route.name}_output", "schema": output.schema}}


def parse_output(text: str | None, validator: Draft202012Validator) -> tuple[Any, str | None]:
    """A structured answer: (the value, None), or (None, what is wrong with it). A ```json fence
    around the JSON is tolerated (models without JSON mode add one)."""
    raw = (text or "").strip()
    if raw.startswith("```") and raw.endswith("```"):
        raw = raw.strip("`").removeprefix("json").strip()
    try:
        value = model_json(raw)
    except ValueError as exc:
        return None, f"it is not JSON ({exc})"
    refuse_lone_surrogates(value, "the structured answer's values")
    problems = []
    for err in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "the answer"
        problems.append(f"{where}: {err.message}")
    if problems:
        return None, "; ".join(problems)
    return value, None


def parse_arguments(tool: ToolConfig, raw: str, validator: Draft202012Validator) -> dict[str, Any]:
    """The call's arguments as a dict, checked against the tool's `parameters`."""
    args = decode_arguments(tool, raw)
    check_arguments(tool, args, validator)
    return args


def decode_arguments(tool: ToolConfig, raw: str) -> dict[str, Any]:
    """The model's arguments as a dict (not yet checked)."""
    try:
        args = model_json(raw) if raw and raw.strip() else {}
    except ValueError as exc:
        raise ToolRefusal(
            f"Error: the arguments of {tool.name} are not valid JSON ({exc}). "
            "Call it again with a JSON object matching its parameters."
        ) from None
    if not isinstance(args, dict):
        raise ToolRefusal(f"Error: the arguments of {tool.name} must be a JSON object, not {json_kind(args)}.")
    refuse_lone_surrogates(args, f"the arguments of tool {tool.name}")
    return args


def json_kind(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words (the model wrote JSON, not Python)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else "a list"


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _NotJSON(f"{text} is too large a number")
    return value


def model_json(raw: str) -> Any:
    """JSON the model wrote, as JSON has it: Python's reader also takes NaN, Infinity and 1e999
    (inf), which no state, history or reply can hold (the turn failed when it saved), and fails on
    a number of more digits than Python converts (a traceback). ValueError says what is wrong."""
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at character {exc.pos}") from None
    except _NotJSON:
        raise
    except ValueError:  # Python's bound on the digits of an integer it converts
        raise ValueError(f"a number has more than {sys.get_int_max_str_digits()} digits") from None


def refuse_lone_surrogates(value: Any, what: str) -> None:
    """JSON from the model whose escapes make a lone UTF-16 surrogate (`"\\ud800"`): nothing can
    carry or store it, so the turn fails as a model error (rolled back, the attempt in the
    history) before any of it is shown, set or sent."""
    where = lone_surrogate_at(value)
    if where is not None:
        raise ModelError(f"the model's answer is not valid text: {what} hold a lone UTF-16 surrogate "
                         f"(\\ud800-\\udfff) at {where or 'the top'}")


def check_arguments(tool: ToolConfig, args: dict[str, Any], validator: Draft202012Validator) -> None:
    """Refuse arguments that miss the tool's `parameters`. A bound argument's value is the
    bot's (`bind:`), not the model's: its problem is reported as the bot's."""
    problems: list[str] = []
    bound: list[str] = []
    for err in sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "arguments"
        name = bound_problem(tool, list(err.absolute_path))
        (bound if name else problems).append(f"{where}: {err.message}")
    if bound:
        raise BoundInvalid(tool.name, "; ".join(bound))
    if problems:
        raise ToolRefusal(f"Error: invalid arguments for {tool.name}: " + "; ".join(problems) + ". Call it again with valid arguments.")


class BoundInvalid(ToolRefusal):
    """A bound argument's rendered value does not match the tool's `parameters`: the bot's
    problem (its template or its data), which the model cannot fix."""

    def __init__(self, tool: str, problems: str):
        super().__init__(f"Error: {tool} cannot run: an argument the bot sets is invalid. Nothing was sent.")
        self.detail = f"tool {tool}: a bound argument is invalid: {problems}; the call was not made"


@dataclass
class Mocked:
    """A stand-in for what a tool returns: its `result`, or the `error` it fails with."""

    result: Any = None
    error: str | None = None
    # Checks the HTTP request the tool would send (None when the kind sends none) before the
    # stand-in applies; raises TurnFailed when it is not what the mock expects (its `request:`).
    check_request: Callable[[dict[str, Any] | None], None] | None = None

    def value(self, tool: ToolConfig) -> Any:
        if self.error is not None:  # a recorded failure is the whole text the model read
            text = self.error if self.error.startswith("Error:") else f"Error: {tool.name} failed: {self.error}"
            raise ToolRefusal(text)
        return copy.deepcopy(self.result)


class ToolMocks(Protocol):
    """Stands in for handlers and HTTP tools (golden transcripts use it): `lookup` gives the
    mocked outcome of a call, or None to run the tool for real (or raises TurnFailed when a
    call must not run for real); `observe` hears the outcome of every real call."""

    live: bool  # False: tools without a mock must not run for real (HTTP, MCP)

    def lookup(self, tool: ToolConfig, args: dict[str, Any]) -> Mocked | None: ...

    def mocked_tools(self) -> set[str]: ...

    def observe(self, tool: ToolConfig, args: dict[str, Any], result: Any, error: str | None) -> None: ...


def result_text(value: Any) -> str:
    """A handler's return value as the text of a tool result."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)
