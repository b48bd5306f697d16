"""The validated bot configuration: plain data built from the YAML by `chatrun.definition.loader`.

Everything downstream (the route graph, the engine) reads these dataclasses, never
raw YAML. Every object keeps `where` (a `Location`) so runtime errors can name the
file and line of the YAML that caused them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from chatrun import events as ev
from chatrun.definition.catalogs import Catalogs


@dataclass(frozen=True)
class Location:
    file: str = ""
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file


@dataclass(frozen=True)
class BreakerConfig:
    """`model.breaker:`: after `failures` failures of an endpoint in a row (fallback reasons
    only), its calls are skipped for `cool_down` seconds while a fallback answers."""

    failures: int = 3
    cool_down: float = 30.0

    @staticmethod
    def from_raw(raw: Any) -> BreakerConfig:
        """From the YAML mapping (the schema checked it; a bad value keeps its default)."""
        if not isinstance(raw, dict):
            return DEFAULT_BREAKER
        failures = raw.get("failures")
        cool_down = raw.get("cool_down")
        return BreakerConfig(
            failures if isinstance(failures, int) and not isinstance(failures, bool) and failures > 0
            else DEFAULT_BREAKER.failures,
            seconds_or(cool_down, DEFAULT_BREAKER.cool_down))


DEFAULT_BREAKER = BreakerConfig()


@dataclass
class ModelConfig:
    """Which model answers and how. Route-level configs are merged over the bot's."""

    provider: str = "openai"  # "openai" | "scripted"
    name: str = "gpt-4o-mini"
    temperature: float | None = None
    max_tokens: int | None = None  # reply limit sent to the model
    base_url: str | None = None  # else OPENAI_BASE_URL
    api_key_env: str | None = None  # name of the env var holding the key; else OPENAI_API_KEY
    timeout: float = 60.0  # seconds per model call
    max_retries: int = 3  # on 429/5xx/timeouts, with backoff honouring Retry-After
    stream: bool = True
    params: dict[str, Any] = field(default_factory=dict)  # extra request fields (top_p, seed, ...)
    # The content kinds the endpoint takes as parts (chatrun.messages.CONTENT_KINDS); the files of
    # other kinds are sent as a text description. None: text, image, file (not audio).
    accepts: tuple[str, ...] | None = None
    # Calls the model writes as text (`<tool_call>` blocks, JSON): "native" (left as text), "text"
    # (always read), "auto" (read when the answer has no native call); chatrun.models.text_calls.
    tool_calls: str = "auto"
    # `fallback:`: the models that answer when this one cannot (quota, overload, timeout, outage),
    # in order, each a raw mapping of model fields over this config (chatrun.models.fallback).
    fallback: tuple[dict[str, Any], ...] = ()
    breaker: BreakerConfig = DEFAULT_BREAKER  # frozen: shared
    # A provider prompt-cache key (OpenAI's `prompt_cache_key`, one per bot and route): None sends it
    # to OpenAI's own API only (other endpoints may refuse a field they do not know), True always,
    # False never (and `validate` then says nothing of system prompts that change every turn).
    prompt_cache: bool | None = None
    where: Location = field(default_factory=Location)

    def merged(self, override: dict[str, Any] | None) -> ModelConfig:
        """A copy with the keys of `override` (raw route-level YAML mapping) applied."""
        if not override:
            return self
        values = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for key, value in override.items():
            if key == "params":
                values["params"] = {**self.params, **value}
            elif key == "accepts":
                values["accepts"] = tuple(value) if isinstance(value, list) else None
            elif key == "fallback":
                values["fallback"] = fallback_items(value)
            elif key == "breaker":
                values["breaker"] = BreakerConfig.from_raw(value)
            elif key in values:
                values[key] = value
        return ModelConfig(**values)

    def fallback_configs(self) -> list[ModelConfig]:
        """The configs of `fallback:`, in order: each entry's fields over this config (so a
        fallback keeps the temperature, timeout, ... it does not set), with no fallback of its own."""
        if not self.fallback:
            return []
        base = replace(self, fallback=())
        return [base.merged(item) for item in self.fallback]

    @property
    def endpoint(self) -> tuple[str, str, str]:
        """(provider, base URL or "", model name): what a circuit breaker keeps apart."""
        return self.provider, self.base_url or "", self.name




def fallback_items(raw: Any) -> tuple[dict[str, Any], ...]:
    """`fallback:` as the config keeps it: its mappings (the schema reports anything else)."""
    return tuple(dict(item) for item in raw if isinstance(item, dict)) if isinstance(raw, list) else ()


@dataclass
class MemoryPolicy:
    """How much of the conversation a route's memory keeps.

    type: "message_window" (max_messages), "token_window" (max_tokens, encoding),
    "summary" (max_tokens as the trigger, keep_messages, summary_model, summary_prompt),
    or "none" (nothing kept between turns).
    """

    type: str = "message_window"
    max_messages: int = 20
    max_tokens: int = 3000
    encoding: str | None = None  # tiktoken encoding; None: from the model name, then o200k_base
    # max_tokens: {context_size, reply_reserve}: the window is context_size - reserve, the
    # reserve being reply_reserve, else the route model's max_tokens (checks.py makes sure).
    context_size: int | None = None
    reply_reserve: int | None = None
    keep_messages: int = 10  # summary: the newest messages kept verbatim
    summary_model: dict[str, Any] | None = None  # summary: model fields the summarizing call overrides
    summary_prompt: str | None = None  # summary: the summarizing call's instructions (None: built in)
    clear_tool_results: int | None = None  # any policy: keep only the newest N tool results' content
    where: Location = field(default_factory=Location)


@dataclass
class AskConfig:
    """An action's `ask:`: a question that waits for an answer of `schema` from `source`."""

    source: str  # "user" | "operator" | "backend" (YAML `from:`)
    text: str | None = None  # template: the question those who answer read (the user too, `from: user`)
    tell: str | None = None  # template: what the user reads while others answer (None: the locale's default)
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    choices: list[Any] | str | None = None
    into: str | None = None  # state path the answer lands at
    timeout: str | None = None  # a duration ("2d")
    on_timeout: Any = None
    has_on_timeout: bool = False  # `on_timeout:` given (its value may be null)
    where: Location = field(default_factory=Location)


@dataclass
class OperatorTimeoutConfig:
    """`operator.on_timeout`: what happens when nobody takes the conversation within `timeout`,
    in order: a call of `tool` with `args` (templates typed like `set`, over `args`), the
    `message` to the user (over `args` and the call's `result`), then the move to `route`."""

    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    message: str | None = None
    route: str | None = None
    where: Location = field(default_factory=Location)


@dataclass
class OperatorConfig:
    """An action's `operator:`: a handover to a live operator."""

    role: str = "operators"  # the server's operator role (server/audience.py), one name for one role
    text: str | None = None
    release_to: str | None = None
    remember: str = "messages"  # "messages" | "summary"
    timeout: str | None = None  # how long the handover waits for an operator to take it (None: forever)
    on_timeout: OperatorTimeoutConfig | None = None
    where: Location = field(default_factory=Location)


@dataclass
class ApprovalCaseConfig:
    """One entry of a named case of an approval (`approval.cases.NAME`): `if:` with the decision
    it makes (`then:`), or the `else:` decision (condition None). A decision approves (with
    `approve` the argument changes, templates typed like `set`; empty: as asked) or rejects
    (`reject` the text the model reads; "" the approval's `rejected`)."""

    condition: str | None
    approve: dict[str, Any] | None = None
    reject: str | None = None
    message: str | None = None  # template: a Message event to the user
    route: str | None = None  # a rejection moves the conversation here
    where: Location = field(default_factory=Location)
    index: int = 0  # its place in the case's YAML list

    @property
    def label(self) -> str:
        return f"if {self.condition}" if self.condition is not None else "else"


@dataclass
class ApprovalConfig:
    """A tool's `approval:`: the call waits for a decision by one of `by` before it runs."""

    condition: str | None = None  # YAML `if:`; None: always
    by: list[str] = field(default_factory=lambda: ["user"])
    self_decide: bool | None = None  # YAML `self:`; None: true only when `by` has `user`
    edit: list[str] | bool = field(default_factory=list)
    ask: str | None = None  # template: the question the deciders read
    tell: str | None = None  # template: what the user reads while others decide (None: the locale's default)
    timeout: str | None = None
    on_timeout: str = "reject"  # "reject" | "approve" | the name of one of `cases`
    rejected: str | None = None
    cases: dict[str, list[ApprovalCaseConfig]] = field(default_factory=dict)  # named decisions
    where: Location = field(default_factory=Location)
    key: str = "approval"  # the tool's YAML key it was written as: `approval`, or `confirm` (its short form)

    @property
    def may_self_decide(self) -> bool:
        return self.self_decide if self.self_decide is not None else "user" in self.by

    @property
    def confirms(self) -> bool:
        """Whether this is the user's own confirmation: the user alone decides (`by: [user]`,
        which `confirm:` is). The runtime asks them yes or no (engine/pausing.py) and only their
        yes runs the call (engine/waiting.py)."""
        return self.by == ["user"] and self.may_self_decide


@dataclass
class ActionConfig:
    """What a tool does to the conversation besides returning a result.

    Applied in this order (README, "Scopes and routes"; docs/format.md):
    arguments validated -> requires checked -> the action's feasibility checked (pop at
    the root, roles of a push/route target) -> handler -> set -> emit -> remember -> clear_memory /
    wipe -> message, result, reply rendered (the current scope still exists) -> pop ->
    push -> route -> loop control (execute, immediate).
    """

    push: str | None = None
    pop: bool = False
    route: str | None = None
    call: str | None = None  # push this route and run it now; its result comes back as this call's result
    end: bool = False  # end the conversation (Quarkus ChatScope.end())
    execute: bool = False
    immediate: bool = False
    clear_memory: bool = False
    wipe: str | None = None  # "schedule" | "abort"
    set: dict[str, str] = field(default_factory=dict)  # PATH -> template
    emit: dict[str, Any] = field(default_factory=dict)  # EVENT_TYPE -> template (str) or data
    remember: dict[str, str] = field(default_factory=dict)  # user memory FACT -> template (`user_memory:`)
    message: str | None = None  # template: a Message event to the user
    reply: str | None = None  # template: the tool result the model sees
    result: str | None = None  # template: with pop, handed to the parent route's memory
    choices: list[Any] | str | None = None  # choices offered to the user: a list, or a template of one
    cases: list[CaseConfig] = field(default_factory=list)  # the first whose condition holds adds its action
    ask: AskConfig | None = None  # a question that waits (the tool's action only, not a case's)
    operator: OperatorConfig | None = None  # a handover to an operator (the tool's action only)
    where: Location = field(default_factory=Location)
    _merged: dict[int, ActionConfig] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def leaves_route(self) -> bool:
        return bool(self.push or self.pop or self.route or self.call)

    def with_case(self, case: CaseConfig) -> ActionConfig:
        """This action with a case's action over it: the case's keys win, its `set` and `emit`
        entries come after this action's (the same key: the case's value, in the case's place).
        Computed once per case (the engine asks on every call)."""
        merged = self._merged.get(id(case))
        if merged is None:
            # Field by field through the instances' dicts: a big bot merges tens of thousands of
            # cases at load (the effects, the graph, the checks), and most cases set two or three keys.
            mine, theirs = self.__dict__, case.action.__dict__
            values = dict(mine)
            for key in _SCALAR_KEYS:
                if theirs[key]:
                    values[key] = theirs[key]
            values["set"] = _over(self.set, case.action.set)
            values["emit"] = _over(self.emit, case.action.emit)
            values["remember"] = {**self.remember, **case.action.remember}
            values["cases"], values["where"], values["_merged"] = [], case.action.where, {}  # a merge has no cases
            merged = ActionConfig.__new__(ActionConfig)
            merged.__dict__.update(values)
            self._merged[id(case)] = merged
        return merged

    def variants(self) -> list[tuple[CaseConfig | None, ActionConfig]]:
        """Every action calling the tool can apply: (the case, the merged action) for each
        case, and (None, this action) when no case may match (there is no `else`)."""
        out: list[tuple[CaseConfig | None, ActionConfig]] = [(case, self.with_case(case)) for case in self.cases]
        if not self.cases or self.cases[-1].condition is not None:
            out.append((None, self))
        return out


def _over(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base`'s entries with `extra`'s over them, `extra`'s keys after the others (in its order)."""
    if not extra:
        return dict(base)
    return {**{k: v for k, v in base.items() if k not in extra}, **extra}


_SCALAR_KEYS = ("push", "pop", "route", "call", "end", "execute", "immediate", "clear_memory", "wipe", "message", "reply",
                "result", "choices")


@dataclass
class CaseConfig:
    """One case of an action's `cases:`: `if: CONDITION` (a Jinja expression) with the action
    to add (`then:`), or the `else:` action (condition None)."""

    condition: str | None
    action: ActionConfig
    where: Location = field(default_factory=Location)
    index: int = 0  # its place in the YAML list `cases:`

    @property
    def label(self) -> str:
        return f"if {self.condition}" if self.condition is not None else "else"


@dataclass
class OnErrorConfig:
    """A tool's `on_error:`: when its handler raises (or times out), nothing of the action
    applies, `message` (if any) goes to the user and `reply` to the model, and the turn goes on."""

    message: str | None = None  # template
    reply: str | None = None  # template
    where: Location = field(default_factory=Location)


DEFAULT_TOOL_TIMEOUT = 30.0  # seconds a handler, HTTP call or MCP call may take


@dataclass
class EnvVar:
    """An environment variable a bot declares (`env:`); only declared ones reach templates."""

    name: str
    secret: bool = False  # never shown: redacted from results, events, history, logs
    default: str | None = None
    description: str = ""


# What a tool's call does besides answering (`effect:`; definition/effects.py gives the defaults).
READ, IDEMPOTENT, ONCE = "read", "idempotent", "once"
EFFECTS = (READ, IDEMPOTENT, ONCE)  # weakest first


@dataclass
class ToolConfig:
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )  # JSON Schema of the arguments
    requires: list[str] = field(default_factory=list)  # state paths that must be set (not null)
    # Where the result comes from: the tool's kind by its YAML key ("handler", "http", "openapi",
    # "mcp"), with that kind's own config (each kind is a module of chatrun.toolkinds, which
    # defines it). Empty: an action-only tool. Two or more are an error the checks report.
    # Once loaded, an `openapi:` tool is an `http:` one (its operation gave the call).
    kinds: dict[str, Any] = field(default_factory=dict)
    timeout: float = DEFAULT_TOOL_TIMEOUT
    action: ActionConfig = field(default_factory=ActionConfig)
    on_error: OnErrorConfig | None = None  # what a failing handler does instead of failing the turn
    where: Location = field(default_factory=Location)
    # Bound arguments (`bind:`): argument NAME -> template. Not offered to the model, never taken
    # from it: the engine renders them into the call's arguments (engine/binding.py).
    bind: dict[str, Any] = field(default_factory=dict)
    # Parameters whose value must be one the user said (`from_user:`): the call path refuses a
    # value the user's messages in the scope do not hold (engine/said.py). Not in the model's spec.
    from_user: list[str] = field(default_factory=list)
    approval: ApprovalConfig | None = None  # the call waits for a person's decision (`approval:`)
    # What a call does besides answering (`effect:`): READ, IDEMPOTENT or ONCE. The loader puts the
    # default in when the YAML says none (definition/effects.py); `effect_declared` says whether it did.
    effect: str = READ
    effect_declared: bool = False
    max_calls_per_turn: int | None = None  # calls of this tool per turn (None: limits.max_calls_per_tool)
    one_change_per_answer: bool = False  # after a call of it that changes something, the answer's other calls wait

    @property
    def kind(self) -> str | None:
        """The key of the kind that gives the tool its result (None: an action-only tool)."""
        return next(iter(self.kinds), None)


@dataclass
class ScopeConfig:
    local: dict[str, Any] = field(default_factory=dict)  # per scope, not inherited
    shared: dict[str, Any] = field(default_factory=dict)  # inherited by nested scopes


@dataclass
class OutputConfig:
    """A route's `output:`: its final answers are JSON matching `schema`, sent as an Object event
    (not a Message) and assignable with `set` (templates see it as `output`)."""

    schema: dict[str, Any]
    request: str = "json_schema"  # "json_schema" | "json_object" | "none": the response_format asked for
    set: dict[str, Any] = field(default_factory=dict)  # PATH -> template reading `output`
    where: Location = field(default_factory=Location)


@dataclass
class KnowledgeSource:
    """One of the bot's `knowledge:` sources: a folder of files, or web pages (`urls:`, or a
    `sitemap:`'s) fetched at `chatrun index` time only, cut into passages along their headings
    and indexed for full-text search (chatrun.knowledge)."""

    name: str
    path: str  # the folder, relative to the bot's directory ("" for web pages: see `web`)
    include: list[str] = field(default_factory=list)  # glob patterns; []: every supported file
    url: str | None = None  # a passage's link: `{path}` and `{anchor}` filled in; None: no link
    where: Location = field(default_factory=Location)
    embeddings: str | None = None  # a model for embeddings (hybrid search, chatrun.knowledge.vectors); None: BM25
    urls: list[str] = field(default_factory=list)  # web pages, fetched by `chatrun index` (chatrun.knowledge.web)
    urls_where: list[Location] = field(default_factory=list)  # each of `urls:`'s line, for its errors
    sitemap: str | None = None  # a sitemap (or sitemap index) listing the web pages to fetch
    exclude: list[str] = field(default_factory=list)  # a sitemap's URL paths left out (glob patterns)
    max_pages: int | None = None  # a sitemap's pages fetched at most (None: chatrun.knowledge.web.MAX_PAGES)
    language: str | None = None  # the PostgreSQL index's text search configuration (None: english); SQLite: unused

    @property
    def web(self) -> bool:
        """Web pages (fetched at index time only), not a folder."""
        return bool(self.urls or self.sitemap)


@dataclass
class RouteKnowledge:
    """A route's `knowledge:`: the sources it may read, and how."""

    sources: list[str]
    retrieve: str = "tool"  # "tool": the model calls search_knowledge; "auto": passages come with each turn
    cite: str = "optional"  # "required": a reply that cites no passage is refused (asked once, then the fallback)
    top_k: int = 5  # passages per search
    where: Location = field(default_factory=Location)

    @property
    def cite_required(self) -> bool:
        return self.cite == "required"


@dataclass
class RouteConfig:
    name: str
    system: str = ""  # Jinja2 template
    # What changes every turn (clock, state, retrieved text): a template sent after the memory on
    # every model call, never kept (docs/models.md, "Stable prompts"); None: the bot's `context:`.
    context: str | None = None
    description: str = ""
    title: str = ""  # what end users read for the route (the web page); "": its name
    default: bool = False
    entry: bool = False  # clients start conversations here too (so it counts as reachable)
    user: str | None = None  # Jinja2 template turning structured input into the user message
    memory: MemoryPolicy | None = None  # None: the bot's default policy
    model: dict[str, Any] | None = None  # raw override merged over the bot's ModelConfig
    tools: list[str] = field(default_factory=list)
    # What tool kinds declare on the route, by kind key (the mcp kind: its `mcp:` list of servers' tools).
    kind_config: dict[str, Any] = field(default_factory=dict)
    scope: ScopeConfig = field(default_factory=ScopeConfig)
    roles: list[str] = field(default_factory=list)
    returns: str | None = None  # "answer": when called, the final answer is the result (the scope pops)
    output: OutputConfig | None = None  # structured output: JSON answers, validated
    choices: list[Any] | str | None = None  # offered after the route's final answer: a list, or a template
    # Quarkus-dialect WebSocket chats get this route's streamed reply as Stream chunks (a Quarkus
    # route returning Multi<String>); else as one Message (a route returning String).
    stream_to_quarkus: bool | None = None  # None: not said (false)
    attachments: AttachmentPolicy | None = None  # None: the route takes no files
    one_change_per_answer: bool = False  # after a call that changes something, the answer's other calls wait
    # What the model must do on its first call of the route's loop: "auto", "required", "none" or
    # a tool's name (OpenAI's `tool_choice`); None: not sent (the endpoint's default, auto).
    tool_choice: str | None = None
    # What the user gets when the model has nothing to say (an empty answer, even after a nudge;
    # a turn that reached `limits.max_model_calls`): a template, over the bot's `fallback:`.
    fallback: str | None = None
    follow_up: FollowUpConfig | None = None  # a message written later, unasked, when the user goes quiet here
    guardrails: tuple[GuardrailConfig, ...] = ()  # `guardrails:`: the route's own, after the bot's
    knowledge: RouteKnowledge | None = None  # `knowledge:`: the sources the route reads (None: none)
    where: Location = field(default_factory=Location)


@dataclass(frozen=True)
class FollowUpConfig:
    """A route's `follow_up:` (docs/format.md, "Follow-ups"): `message` (a template) goes to the
    user once, `after` seconds of their silence on the route; `whatsapp_template` (name,
    language; "" for the session's locale) replaces it on WhatsApp past the platform's 24-hour window."""

    after: float
    message: str
    whatsapp_template: tuple[str, str] | None = None
    where: Location = field(default_factory=Location)


# -- guardrails (issue 37): checks on what goes in, comes back and is kept ----------------------

# The stages a guardrail watches: the user's input (before the model reads it), a tool's result
# (before the model reads it), the model's output (before a client sees it, streamed or not), and
# what is stored (the history, the memories, the turn's trace).
GUARD_STAGES = ("input", "tool_result", "output", "storage")
GUARD_KINDS = ("pattern", "pii", "length", "moderation", "language")
PII_KINDS = ("email", "phone", "iban", "card")
# The categories of the OpenAI-compatible `/moderations` endpoint (omni-moderation); another
# endpoint may name others: the validator warns about a name it does not know, it does not refuse it.
MODERATION_CATEGORIES = (
    "harassment", "harassment/threatening", "hate", "hate/threatening", "illicit", "illicit/violent",
    "self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "sexual/minors", "violence",
    "violence/graphic")
# The kinds that judge a whole text (nothing to cut out): they block, flag or hand over, never redact.
WHOLE_TEXT_KINDS = ("moderation", "language")
# The stages each kind may watch (the others: every stage). Moderation reads what a model would
# read or say; a language is the user's or the model's, not a tool's.
KIND_STAGES = {"moderation": ("input", "tool_result", "output"), "language": ("input", "output")}
GUARD_OUTCOMES = ("block", "redact", "flag", "operator")
# What each stage can do: a stored value can only be redacted (the turn is over); a tool's result
# cannot wait for an operator (the call would have to pause: an `operator:` action does that).
STAGE_OUTCOMES = {"input": GUARD_OUTCOMES, "tool_result": ("block", "redact", "flag"),
                  "output": GUARD_OUTCOMES, "storage": ("redact",)}


@dataclass(frozen=True)
class ModerationConfig:
    """A guardrail's `moderation:` (docs/guardrails.md): the bot's endpoint's `/moderations` asked
    about the text. `categories`: those that count (none: any the endpoint flags); `threshold`: a
    category counts when its score reaches it (None: when the endpoint flags it); `on_error`: what a
    failed or timed-out call means (`block`: as if it matched; `allow`: the text passes, reported);
    `window`: with `release: sentence`, the streamed reply is moderated in runs of whole sentences
    of at least this many characters (one round trip each)."""

    categories: tuple[str, ...] = ()
    threshold: float | None = None
    model: str = "omni-moderation-latest"
    timeout: float = 5.0
    on_error: str = "block"
    window: int = 400
    category_where: tuple[Location, ...] = ()  # each category's place, for the validator


@dataclass(frozen=True)
class GuardrailConfig:
    """One entry of `guardrails:` (the bot's or a route's; docs/guardrails.md): what it detects
    (`kind`: `patterns`, `pii` or `max_chars`), on which `stages`, and what happens to a match
    (`outcome`; `message` is what the user reads for block/operator, `replacement` what a
    redacted match becomes: by default `[card]`, `[email]`, ... or `[redacted]`)."""

    name: str
    kind: str
    stages: tuple[str, ...]
    outcome: str
    patterns: tuple[str, ...] = ()
    pii: tuple[str, ...] = PII_KINDS
    max_chars: int | None = None
    message: str | None = None
    replacement: str | None = None
    release: str = "reply"  # an output guard on a streamed reply: "reply" (held whole) or "sentence"
    moderation: ModerationConfig | None = None  # `moderation:` (kind "moderation")
    languages: tuple[str, ...] = ()  # `languages:` (kind "language"): ISO 639-1 codes
    where: Location = field(default_factory=Location)
    pattern_where: tuple[Location, ...] = ()  # each pattern's place, for the validator
    detectors: tuple[str, ...] = ()  # the detector keys it has (the validator wants exactly one)
@dataclass(frozen=True)
class OutcomeConfig:
    """One entry of the bot's `outcomes:` (engine/outcomes.py; docs/report.md): its name and
    its condition, every part given must hold. `events`/`routes`: any of them; `condition`: a
    Jinja expression over the state; `ended`: whether the conversation has ended; `silent_for`:
    seconds without a user message; `taken_over`: whether an operator holds it."""

    name: str
    events: tuple[str, ...] = ()
    routes: tuple[str, ...] = ()
    condition: str | None = None
    ended: bool | None = None
    silent_for: float | None = None
    taken_over: bool | None = None
    where: Location = field(default_factory=Location)


# A file's media type as a client names it (`image/png`, `application/vnd.ms-excel`; `image/*`:
# an image behind an http(s) URL, its type unknown): what `attachments.kinds` can match at all.
MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9.+-]*/([a-z0-9][a-z0-9.+-]*|\*)")


@dataclass(frozen=True)
class AttachmentPolicy:
    """A route's `attachments:`: the media types it takes (`image/*` matches every image), the
    largest file and how many files one message may carry. A route without one takes none."""

    kinds: tuple[str, ...]
    max_bytes: int = 10 * 1024 * 1024
    max_count: int = 4

    def accepts(self, media_type: str) -> bool:
        major = media_type.split("/", 1)[0]
        return any(kind in (media_type, f"{major}/*", "*/*") for kind in self.kinds)

    def problem(self, route: str, files: list[tuple[str, int]]) -> str | None:
        """Why a message with these files (media type, size; 0: unknown, a URL) is refused, naming
        the limit, or None. The one place the limits are applied."""
        if len(files) > self.max_count:
            return f"route {route} takes at most {self.max_count} attachments per message (attachments.max_count), not {len(files)}"
        for i, (media_type, size) in enumerate(files):
            if not MEDIA_TYPE.fullmatch(media_type):
                return f"attachments[{i}]: {media_type!r} is not a media type (type/subtype, e.g. image/png)"
            if not self.accepts(media_type):
                return (f"attachments[{i}]: route {route} takes {', '.join(self.kinds)} (attachments.kinds), "
                        f"not {media_type}")
            if size > self.max_bytes:
                return (f"attachments[{i}]: {size} bytes is over route {route}'s limit of {self.max_bytes} "
                        "(attachments.max_bytes)")
        return None


# -- user memory (issue 37): facts kept of a user across conversations ------------------------------


@dataclass
class UserMemoryConfig:
    """`user_memory:`: the facts a bot keeps of each user (principal) across conversations,
    written by a tool action's `remember:`, read by templates as `user_memory.FACT`. How long
    they are kept is the bot's `retention.user_memory`."""

    facts: list[str] = field(default_factory=list)
    summary: UserSummaryConfig | None = None  # `summary:`: written by the model when a conversation ends
    where: Location = field(default_factory=Location)


SUMMARY_FACT = "summary"  # the name the summary is kept and read under (`user_memory.summary`)
SUMMARY_WHEN = ("end", "outcome")  # what ends a conversation, for `summary.when`


@dataclass
class UserSummaryConfig:
    """`user_memory.summary:`: a summary of each conversation the model writes when it ends
    (`when`: `end` — a tool's `end` action; `outcome` — its outcome was recorded), kept of the
    user as the fact `summary` (docs/memory.md, "A summary at conversation end")."""

    when: tuple[str, ...] = ("end",)
    prompt: str | None = None  # a template: what the summarizing model is told (None: the built-in text)
    where: Location = field(default_factory=Location)


# -- retention (issue 33): how long a bot's stored data is kept -----------------------------------

DURATION_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DELIVER, DROP = "deliver", "drop"  # `retention.erased_outbox`: an erased principal's undelivered events
ERASED_OUTBOX = (DELIVER, DROP)


def seconds_or(value: Any, default: float) -> float:
    """A duration in seconds, or `default` when it is not one (the schema reports that)."""
    try:
        return duration_seconds(value) if isinstance(value, str) else default
    except ValueError:
        return default


def duration_seconds(text: str) -> float:
    """`90s`, `30m`, `2h`, `30d` (the schema's `duration`) in seconds; ValueError otherwise."""
    text = str(text).strip()
    unit = DURATION_SECONDS.get(text[-1:])
    if unit is None or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise ValueError(f"not a duration: {text!r} (write a whole number and s, m, h or d, e.g. 30d)")
    return float(int(text[:-1]) * unit)


@dataclass(frozen=True)
class Retention:
    """`retention:`: how long what a bot stores is kept (docs/deploy.md, "What is kept, and for
    how long"). None: for ever (what every bot did before issue 33). The server's own options
    (`chatrun serve --retain-idle`, `--retain-dead-letters`) cap these: the shorter wins."""

    idle_sessions: float | None = None  # seconds unwritten before a session goes, with its history, files, records
    dead_letters: float | None = None  # seconds a dead letter is kept after it died
    erased_outbox: str = DELIVER  # an erased principal's pending backend events: delivered, or dropped
    user_memory: float | None = None  # seconds a remembered fact not written again is kept (`user_memory:`)

    def capped(self, cap: Retention) -> Retention:
        """This retention within a server's `cap` (each duration: the shorter of the two)."""
        def shorter(a: float | None, b: float | None) -> float | None:
            return b if a is None else a if b is None else min(a, b)

        return Retention(shorter(self.idle_sessions, cap.idle_sessions), shorter(self.dead_letters, cap.dead_letters),
                         self.erased_outbox, shorter(self.user_memory, cap.user_memory))


# -- the widget (issue 35): the chat other sites embed with one <script> tag ---------------------

WIDGET_IDENTITIES = ("either", "signed", "anonymous")
WIDGET_SECRET_ENV = "CHATRUN_WIDGET_SECRET"
WIDGET_LOGO_TYPES = {".svg": "image/svg+xml", ".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
                     ".webp": "image/webp"}


@dataclass(frozen=True)
class WidgetConfig:
    """`widget:`: the sites that may embed the bot's chat and how it looks there (docs/widget.md)."""

    origins: tuple[str, ...] = ()  # scheme://host[:port], lower case, no trailing slash
    title: str = ""  # "": the bot's description, else its name
    greeting: str = ""
    color: str = "#2563eb"
    logo: str = ""  # a file of the bot (relative to its folder) or an https:// URL; "": none
    position: str = "end"  # start/end: the host page's line sides; left/right: physical
    identity: str = "either"  # signed identities, anonymous visitors, or either
    secret_env: str = WIDGET_SECRET_ENV
    where: Location = field(default_factory=Location)

    def allows(self, origin: str | None) -> bool:
        return origin is not None and origin.lower().rstrip("/") in self.origins

    @property
    def logo_is_file(self) -> bool:
        return bool(self.logo) and not self.logo.startswith(("https://", "http://", "data:"))


# chatrun's own backend events: a user's rating, an outcome, a turn's usage
CHATRUN_BACKEND_TYPES = (ev.FEEDBACK, ev.OUTCOME, ev.USAGE)
# Those a sink gets only when its `events:` lists them: one Usage a turn is a volume (and a type)
# the receivers of a bot's own events never asked for.
OPT_IN_TYPES = (ev.USAGE,)


@dataclass
class BotConfig:
    name: str
    routes: dict[str, RouteConfig]
    tools: dict[str, ToolConfig]
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    state: dict[str, Any] = field(default_factory=dict)
    limits: Limits = field(default_factory=lambda: Limits())
    env: dict[str, EnvVar] = field(default_factory=dict)
    prices: dict[str, Price] = field(default_factory=dict)  # model name -> price
    timezone: str | None = None  # IANA name `now` is shown in (None: UTC); a session's `state.timezone` wins
    # What tool kinds declare for the whole bot, by kind key (the mcp kind: its `mcp_servers:`).
    kind_config: dict[str, Any] = field(default_factory=dict)
    events: dict[str, EventTypeConfig] = field(default_factory=dict)  # `events:`: declared types, their audience
    sinks: dict[str, SinkConfig] = field(default_factory=dict)  # `sinks:`: where backend events go
    channels: dict[str, ChannelConfig] = field(default_factory=dict)  # `channels:`: platforms the bot answers on
    format: int | None = None  # `format:`: the format version declared (None: not declared; read as current)
    version: str | None = None  # `version:`: the bot's own version, for people and migrations' `from:`
    migrations: list[MigrationConfig] = field(default_factory=list)  # `migrations:`, in order
    path: str = ""  # the bot.yaml (or single file) it was loaded from
    root: str = ""  # directory handlers are resolved against
    where: Location = field(default_factory=Location)
    content_version: str = ""  # the hash of the bot's files (chatrun.definition.versions)
    on_change: str = "restart_scope"  # what older sessions do when this version serves them
    catalogs: Catalogs | None = None  # `locales:` and their texts (definition/catalogs.py); None: one language
    fallback: str | None = None  # `fallback:` (a route's own wins); None: the built-in text in the session's locale
    retention: Retention = field(default_factory=Retention)  # `retention:`: how long its stored data is kept
    user_memory: UserMemoryConfig | None = None  # `user_memory:`: facts kept of each user across conversations
    widget: WidgetConfig | None = None  # `widget:`: the chat other sites embed (None: no widget)
    canned: dict[str, str] = field(default_factory=dict)  # `canned:`: an operator's ready replies, name -> template
    context: str | None = None  # `context:`: the per-turn template of every route without its own

    def route_context(self, route: str) -> str | None:
        """The `context:` template a route's model calls end with: its own, else the bot's."""
        own = self.routes[route].context
        return own if own is not None else self.context
    guardrails: tuple[GuardrailConfig, ...] = ()  # `guardrails:`: on every route (a route's own add to them)
    knowledge: dict[str, KnowledgeSource] = field(default_factory=dict)  # `knowledge:`: sources, by name
    outcomes: list[OutcomeConfig] = field(default_factory=list)  # `outcomes:`, in the order written (first match wins)

    @property
    def version_label(self) -> str:
        """How the version is shown: the human name and the content hash, or the hash alone."""
        return f"{self.version} ({self.content_version})" if self.version else self.content_version

    @property
    def format_version(self) -> int:
        """The format version whose meaning applies (an undeclared one reads as the current)."""
        return self.format if self.format is not None else CURRENT_FORMAT

    @property
    def default_route(self) -> str:
        return next(name for name, route in self.routes.items() if route.default)

    def route_model(self, route: str) -> ModelConfig:
        return self.model.merged(self.routes[route].model)

    @cached_property  # a config is not changed once loaded; a bot of 5,000 routes asks once
    def guarded(self) -> bool:
        """Whether any guardrail is declared (else the engine never enters engine/guardrails.py)."""
        return bool(self.guardrails) or any(route.guardrails for route in self.routes.values())

    @cached_property
    def redacts_kept(self) -> bool:
        """Whether what chatrun keeps passes the storage rule (engine/guardrails.py `kept_text`): a
        guardrail is declared, or a `secret: true` variable (whose values are never kept)."""
        return self.guarded or any(var.secret for var in self.env.values())

    def route_guardrails(self, route: str) -> tuple[GuardrailConfig, ...]:
        """The guardrails on a route: the bot's, then the route's own."""
        own = self.routes[route].guardrails if route in self.routes else ()
        return self.guardrails + own if own else self.guardrails

    def route_memory(self, route: str) -> MemoryPolicy:
        return self.routes[route].memory or self.memory

    def audience_of(self, event_type: str) -> str:
        """Who events of this type are for: as `events:` declares it, else the user."""
        return self.audiences.get(event_type, ev.USER)

    @cached_property  # read for every event a turn sends (engine/session.py), as audience_of says
    def audiences(self) -> dict[str, str]:
        """The audience of each event type `events:` declares (any other type's events are the user's)."""
        return {name: declared.audience for name, declared in self.events.items()}

    def event_types(self) -> set[str]:
        """The event types a turn of the bot can send as far as its YAML says: chatrun's own
        (`Outcome` when it declares `outcomes:`, `Guardrail` when it has guardrails, `Sources` when
        a route reads `knowledge:`), declared in `events:`, or sent by a tool's `emit` (a Python
        handler may send others). A rating's `Feedback` is no turn's."""
        known = {*ev.BUILTIN_TYPES, *self.events, *((ev.OUTCOME,) if self.outcomes else ())}
        if self.guardrails or any(route.guardrails for route in self.routes.values()):
            known.add(ev.GUARDRAIL)
        if not any(route.knowledge for route in self.routes.values()):
            known.discard(ev.SOURCES)  # only a route with `knowledge:` cites sources
        for tool in self.tools.values():
            for _, action in tool.action.variants():
                known.update(action.emit)
        return known

    def sinks_for(self, event_type: str) -> list[SinkConfig]:
        """The sinks that take backend events of this type, in the order `sinks:` lists them."""
        return [sink for sink in self.sinks.values() if sink.takes(event_type)]


# The keys of an action that do something, in the order they apply (docs/format.md, "The order
# actions apply"): format 3 writes them in this order (`validate` warns otherwise; `chatrun
# upgrade` reorders), so an action reads top to bottom as it happens. `ask` (a pause before all
# of them) and `cases` (which add to them) are not steps.
ACTION_ORDER = ("set", "emit", "remember", "clear_memory", "wipe", "message", "choices", "result", "reply",
                "pop", "push", "route", "call", "end", "operator", "execute", "immediate")

CURRENT_FORMAT = 3  # the bot format this runner writes; it also reads the ones before
SUPPORTED_FORMATS = (1, 2, 3)


@dataclass
class KeyChanges:
    """Keys renamed, dropped and defaulted: a migration's `state:` (paths `state.KEY`, `KEY` or
    `scope.KEY`) or one tool's entry in its `arguments:` (argument names)."""

    rename: dict[str, str] = field(default_factory=dict)
    drop: list[str] = field(default_factory=list)
    default: dict[str, Any] = field(default_factory=dict)


@dataclass
class MigrationConfig:
    """One entry of a bot's `migrations:`: how a session of an older version (`from_version`,
    "*" for any) moves to this one. docs/format.md, "Migrations"."""

    from_version: str = "*"
    routes: dict[str, str] = field(default_factory=dict)  # old route -> new route
    state: KeyChanges = field(default_factory=KeyChanges)
    scopes: dict[str, str] = field(default_factory=dict)  # old route -> "reset" | "drop"
    tools: dict[str, str] = field(default_factory=dict)  # old tool -> new tool (in memories)
    arguments: dict[str, KeyChanges] = field(default_factory=dict)  # new tool -> its calls' arguments in memories
    index: int = 0  # its place in the YAML list
    where: Location = field(default_factory=Location)
    # Where each entry is, for diagnostics: "routes.cart", "state.rename.email", "state.drop.0", ...
    places: dict[str, Location] = field(default_factory=dict)

    def place(self, *key: Any) -> Location:
        return self.places.get(".".join(map(str, key)), self.where)

    def applies_to(self, old_version: str | None) -> bool:
        return self.from_version == "*" or self.from_version == old_version


@dataclass
class Limits:
    """Per-turn guards: a bot that loops forever gets an Error event, not a hang."""

    max_hops: int = 8  # route invocations per turn (execute chains)
    max_model_calls: int = 16  # model calls per turn, over all hops
    # Budgets (None: none). A turn ends with an Error before a model call would pass one.
    max_turn_tokens: int | None = None  # input + output tokens of one turn's model calls
    max_session_tokens: int | None = None  # the same over the whole session, failed turns included
    max_turn_cost: float | None = None  # money (in `prices:` units) of one turn
    max_session_cost: float | None = None
    max_calls_per_tool: int | None = None  # calls of one tool per turn (None: no bound but max_model_calls)
    # One user's budgets over all their sessions (the session's owner), per window of `user_window`
    # seconds (windows start at multiples of it from the epoch, UTC: 1d renews at midnight UTC).
    max_user_tokens: int | None = None
    max_user_cost: float | None = None
    user_window: float = 86400.0

    @cached_property  # read on every model call; limits are not changed once loaded
    def has_budgets(self) -> bool:
        return any(v is not None for v in (self.max_turn_tokens, self.max_session_tokens,
                                           self.max_turn_cost, self.max_session_cost)) or self.has_user_budget

    @cached_property  # read once per served turn: a bot without it reads and writes no tally
    def has_user_budget(self) -> bool:
        return self.max_user_tokens is not None or self.max_user_cost is not None


@dataclass
class Price:
    """What a model costs per million tokens (any currency; costs are reported in it)."""

    input: float = 0.0
    output: float = 0.0
    cached_input: float | None = None  # default: the input price


@dataclass
class EventTypeConfig:
    """One entry of the bot's `events:`: an event type and who its events are for."""

    name: str
    audience: str = ev.USER  # events.USER, OPERATORS or BACKEND
    description: str = ""
    where: Location = field(default_factory=Location)


@dataclass
class RetryPolicy:
    """How a sink retries a delivery that failed: the n-th retry waits about
    backoff * 2**(n-1) seconds (at most max_backoff, with jitter); after `attempts` tries or
    `max_age` seconds since the event, the entry becomes a dead letter."""

    attempts: int = 10
    backoff: float = 1.0
    max_backoff: float = 300.0
    max_age: float = 86400.0


@dataclass
class WebhookConfig:
    """A sink's `webhook:`: POST each event as JSON to `url` (a template over `env`), signed
    with HMAC-SHA256 when `secret` names a declared environment variable."""

    url: str
    secret: str | None = None  # the name of an `env:` variable holding the signing secret
    headers: dict[str, str] = field(default_factory=dict)  # extra headers: templates over `env`
    timeout: float = 10.0


@dataclass
class SinkConfig:
    """One entry of the bot's `sinks:`: where backend events go, which types, how retried."""

    name: str
    webhook: WebhookConfig | None = None
    events: list[str] | None = None  # None: every backend event type
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    where: Location = field(default_factory=Location)

    def takes(self, event_type: str) -> bool:
        """Whether it takes backend events of this type: those `events:` lists, or (no `events:`)
        every type but the ones a sink must ask for by name (`OPT_IN_TYPES`)."""
        if self.events is None:
            return event_type not in OPT_IN_TYPES
        return event_type in self.events


# Each channel kind's keys that name a declared `env:` variable (a credential), and those that
# are templates over `env` (docs/channels.md). The server's channel modules read the values.
CHANNEL_SECRETS: dict[str, tuple[str, ...]] = {
    "telegram": ("token", "secret"),
    "slack": ("token", "signing_secret"),
    "whatsapp": ("token", "app_secret", "verify_token"),
    "teams": ("app_id", "app_password"),
    "twilio": ("auth_token",),
}
CHANNEL_TEMPLATES: dict[str, tuple[str, ...]] = {
    "telegram": ("api",),
    "slack": ("api",),
    "whatsapp": ("api",),
    "teams": ("openid", "token_url"),
    "twilio": ("public_url", "greeting", "handoff_to"),
}


@dataclass
class ChannelConfig:
    """One entry of the bot's `channels:`: a platform the bot answers on (its kind is its key),
    its options as written (credentials as env names, templates over `env`), and how its
    replies are retried (they go through the outbox, as a sink's events do)."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    where: Location = field(default_factory=Location)

    @property
    def sink(self) -> str:
        """The outbox's sink name of this channel's replies (no `sinks:` name has a colon)."""
        return f"channel:{self.kind}"


JSON_TYPES = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}


def initial_state_problem(state: dict[str, Any], declared: dict[str, Any]) -> tuple[str, str] | None:
    """The one rule for a state a conversation starts with (the HTTP API's `state`, a
    transcript's `state:`): it reaches the system prompt, so only declared keys, each of the
    JSON type of its declared default (any type when the default is null). (key, message) of
    the first problem, or None."""
    for key, value in state.items():
        if key not in declared:
            known = ", ".join(declared) or "none"
            return key, f"state.{key} is not declared by the bot (its state keys: {known})"
        default = declared[key]
        if default is None or value is None:
            continue
        want, got = JSON_TYPES.get(type(default)), JSON_TYPES.get(type(value))
        if want != got:
            return key, f"state.{key} must be a {want} like its declared default {json.dumps(default)}, not a {got}"
    return None



# Keywords of a `parameters` schema that let it take names `properties` does not list, or whose
# meaning depends on the values (then only the validator can say what the tool takes).
_OPEN_KEYWORDS = frozenset({"patternProperties", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "$ref",
                            "$dynamicRef", "if", "dependentSchemas", "propertyNames"})


def declared_arguments(parameters: dict[str, Any]) -> list[str] | None:
    """The argument names a tool's `parameters` take: its `properties` (none: a tool declared
    without `parameters` takes no arguments), or None when the schema leaves the names open (no
    `properties` at all, `additionalProperties` other than false, or a keyword that takes names
    `properties` does not list). The one rule for which arguments a tool takes: the validator's
    checks of `args.X` and the engine's dropping of undeclared arguments (engine/call.py) use it."""
    props = parameters.get("properties")
    if not isinstance(props, dict) or not _OPEN_KEYWORDS.isdisjoint(parameters):
        return None
    extra = parameters.get("additionalProperties")
    if extra is not None and extra is not False:
        return None
    return list(props)
