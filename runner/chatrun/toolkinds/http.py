"""The `http:` tool kind: a declarative HTTP call, rendered and sent with httpx.

    tools:
      get_order:
        http: {url: "{{ env.API_URL }}/orders/{{ args.id | urlsegment }}", headers: {...}}

Every text of the section is a template over `args`, the state and `env` (the bot's
declared environment variables). The response becomes the tool's `result` for its action:

    {"status": 200, "ok": true, "json": {...} or null, "text": "...", "headers": {...}}

A failure — no connection, a timeout, a status that is neither 2xx nor listed in
`accept` (after the retries) — is a `ToolRefusal`: the model reads a short reason as the
tool result and nothing of the action applies. Values of `secret: true` environment
variables never leave this module: they are replaced by `[redacted]` in the result and
in every reason. A replay mocks it (an HTTP API); `--record` keeps its real results.

A `multipart:` body (multipart/form-data) sends files of the conversation on: a field
`{file: TEMPLATE}` names one (chatrun.toolkinds.attachments), the others are text fields.
Templates see `attachments`, the conversation's files.

Each request carries the call's idempotency key (`ctx.idempotency_key`, the same when this very
call runs again after a crash or a retried turn) in an `Idempotency-Key` header, by default on
every method but GET; `idempotency_key:` renames the header or turns it off.
"""

from __future__ import annotations

import email.utils
import json
import os
import re
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import parse_qsl, urlsplit

from chatrun.definition.config import BotConfig, EnvVar, Location, ToolConfig
from chatrun.definition.kinds import Checks
from chatrun.definition.secret_forms import redact_secrets, secret_values
from chatrun.definition.templates import TEMPLATE_VARIABLES, EmptySegment, is_nothing
from chatrun.definition.yamlpos import YamlDoc
from chatrun.errors import ToolRefusal, TurnFailed
from chatrun.messages import Attachment
from chatrun.toolkinds.attachments import find_attachment, read_or_refuse, template_values
from chatrun.toolkinds.base import CallContext, RuntimeDefaults, ToolKind, unknown_outcome

if TYPE_CHECKING:  # asyncio and httpx (with the click, rich and pygments its CLI pulls in) load on the first call
    import asyncio

    import httpx

REDACTED = "[redacted]"
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # HTTP's: sending one twice changes nothing
BACKOFF_S = 0.2
CONNECT_SHARE = 0.8  # of a tool's timeout, for making the connection
MAX_TEXT_CHARS = 100_000  # a result the model and templates can use, not a download
MAX_BODY_BYTES = 10_000_000  # an answer read at most (its JSON is parsed whole): a bigger one is a failure

Render = Callable[[Any, bool], Any]  # (template or value, typed) -> rendered
# (the value a `file:` template rendered, the field) -> the file and its bytes
FileOf = Callable[[Any, str], tuple[Attachment, bytes]]
BODIES = ("json", "form", "multipart")  # a request has one of these at most
FILE_KEYS = ("file", "name", "media_type")  # a multipart field that is a file: {file, name?, media_type?}
_EXPRESSION = re.compile(r"\{\{(.*?)\}\}", re.S)
IDEMPOTENCY_HEADER = "Idempotency-Key"  # the IETF draft's name (draft-ietf-httpapi-idempotency-key-header)
_ENV_READ = re.compile(r"\benv(?:\.|\[\s*['\"])([A-Za-z_]\w*)")
_ARGS_READ = re.compile(r"(?<![\w.])args\b")  # `args.id`, `args['id']`, `args | tojson`: an argument in the path


@dataclass
class HttpConfig:
    """A declarative HTTP call (`http:` of a tool). Every text is a template over `args`,
    `state`, `scope`, `turn` and `env` (the bot's declared environment variables)."""

    url: str
    method: str = "GET"
    query: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)
    json: Any = None  # a JSON body: a template, or data whose strings are templates
    form: dict[str, Any] | None = None  # a form body (application/x-www-form-urlencoded)
    # a multipart/form-data body: NAME to a text template, or {file, name?, media_type?} (a file)
    multipart: dict[str, Any] | None = None
    retries: int = 2  # more attempts on 429, 5xx and connection errors, with backoff
    accept: list[int] = field(default_factory=list)  # statuses besides 2xx that are results, not failures
    args_in_query: list[str] = field(default_factory=list)  # arguments sent as query parameters when given
    idempotency_header: str | None = None  # the header the call's idempotency key goes in (None: none)
    where: Location = field(default_factory=Location)
    section: str = "http"  # the YAML key it was written under (`openapi` for an operation's call)


class HttpKind(ToolKind[HttpConfig]):
    key: ClassVar[str] = "http"

    def parse(self, raw: dict[str, Any], doc: YamlDoc, at: tuple[Any, ...]) -> HttpConfig | None:
        section = raw.get("http")
        if not isinstance(section, dict) or not isinstance(section.get("url"), str):
            return None  # absent, or the schema reported it
        retries, accept, pos = section.get("retries"), section.get("accept"), doc.pos((*at, "http"))
        method, form, multipart = section.get("method"), section.get("form"), section.get("multipart")
        return HttpConfig(
            url=section["url"],
            method=((method if isinstance(method, str) else None) or "GET").upper(),
            query=_mapping(section.get("query")),
            headers=_mapping(section.get("headers")),
            json=section.get("json"),
            form=dict(form) if isinstance(form, dict) else None,
            multipart=dict(multipart) if isinstance(multipart, dict) else None,
            retries=retries if isinstance(retries, int) and not isinstance(retries, bool) else 2,
            accept=[a for a in accept if isinstance(a, int)] if isinstance(accept, list) else [],
            idempotency_header=idempotency_header(section.get("idempotency_key"), method if isinstance(method, str)
                                                  else "GET"),
            where=Location(doc.file, pos.line, pos.col),
        )

    def check(self, tool: ToolConfig, spec: HttpConfig, checks: Checks) -> None:
        check_http(tool, spec, checks)

    def runtime(self, config: BotConfig) -> HttpCaller:
        return HttpCaller(config.env)

    def effect(self, spec: HttpConfig) -> str:
        """A GET reads (HTTP's safe method); a POST, PUT, PATCH or DELETE is done once."""
        return "read" if spec.method == "GET" else "once"

    def outside(self, spec: HttpConfig) -> str | None:
        return "an HTTP API"


def idempotency_header(setting: Any, method: str) -> str | None:
    """The header a tool's `idempotency_key:` setting sends the key in (None: none). By default on
    every method but GET (a read needs none: the draft standard's header is for the methods that
    change something); `true` or `{header: NAME}` on every method; `false` never."""
    header = setting.get("header") if isinstance(setting, dict) else None
    if isinstance(header, str):
        return header
    if isinstance(setting, bool):
        return IDEMPOTENCY_HEADER if setting else None
    return None if method.upper() == "GET" else IDEMPOTENCY_HEADER


def check_http(tool: ToolConfig, http: HttpConfig, checks: Checks) -> None:
    """Its templates (which may read `env`), one body at most, path arguments escaped."""
    base = ("tools", tool.name, "http")
    variables = (*TEMPLATE_VARIABLES, "env", "attachments")
    bodies = [b for b in BODIES if getattr(http, b) is not None]
    if len(bodies) > 1:
        checks.add("error", f"`http` of tool `{tool.name}` has both `{bodies[0]}` and `{bodies[1]}`; a request has "
                   "one body", *base, bodies[1])
    _check_multipart(tool, http, checks)
    _check_own_key(tool, http, checks)
    texts = _texts(http)
    for sub, value in texts:
        if isinstance(value, str):
            # A body path that names nothing sends null (or fails the call) every time: an error.
            body = sub[0] in BODIES
            checks.template(value, f"`http.{'.'.join(map(str, sub))}` of tool `{tool.name}`", (*base, *sub), tool,
                            variables, undeclared="error" if body else "warning")
    for sub, value in texts:
        if isinstance(value, str):
            _check_empty_env(tool, http.section, value, sub, checks)
    path_part = http.url.split("?", 1)[0]
    for expr in _EXPRESSION.findall(path_part):
        if _ARGS_READ.search(expr) and "urlsegment" not in expr:
            checks.add("warning", f"`http.url` of tool `{tool.name}` puts `{{{{{expr}}}}}` into the URL path "
                       "unescaped; use `| urlsegment` so a value like `..` or `../admin` stays one path segment",
                       *base, "url")


def _check_own_key(tool: ToolConfig, http: HttpConfig, checks: Checks) -> None:
    """A header of `headers:` in the key's place is sent instead of the call's key: say so."""
    name = http.idempotency_header
    own = next((n for n in http.headers if name and n.lower() == name.lower()), None)
    if own is not None:
        checks.add("warning", f"`{http.section}.headers.{own}` of tool `{tool.name}` is sent instead of the call's "
                   f"own idempotency key, which chatrun sends in that header (the same when this very call runs "
                   f"again, another for every other call); remove the header to send the call's key, or write "
                   f"`idempotency_key: false` to keep yours", "tools", tool.name, http.section, "headers", own)


def _check_multipart(tool: ToolConfig, http: HttpConfig, checks: Checks) -> None:
    """A file field names its file with `file:`; the routes offering a tool that sends files
    should take files (else the conversation has none to send)."""
    if http.multipart is None:
        return
    at = ("tools", tool.name, "http", "multipart")
    files = [k for k, v in http.multipart.items() if isinstance(v, dict)]
    for name in files:
        if not isinstance(http.multipart[name].get("file"), str):
            checks.add("error", f"`http.multipart.{name}` of tool `{tool.name}` is a file field without `file:`; "
                       "write `{file: \"{{ attachments[-1] }}\"}` (the newest file) or name one", *at, name)
    if http.method == "GET":
        checks.add("error", f"`http` of tool `{tool.name}` sends a multipart body with GET; use POST, PUT or PATCH",
                   *at)
    if not files:
        return
    taking = [r for r in checks.config.routes.values() if tool.name in r.tools]
    if taking and all(r.attachments is None for r in taking):
        shown = ", ".join(r.name for r in taking)
        checks.add("warning", f"tool `{tool.name}` sends a file (`http.multipart.{files[0]}`), but no route that "
                   f"offers it ({shown}) takes attachments (`attachments:`): its conversations have no file to send",
                   *at, files[0])


def _texts(http: HttpConfig) -> list[tuple[tuple[Any, ...], Any]]:
    """Every template of the request, with its path under `http`."""
    texts: list[tuple[tuple[Any, ...], Any]] = [(("url",), http.url)]
    texts += [(("query", k), v) for k, v in http.query.items()]
    texts += [(("headers", k), v) for k, v in http.headers.items()]
    texts += [(("form", k), v) for k, v in (http.form or {}).items()]
    for name, value in (http.multipart or {}).items():
        if isinstance(value, dict):
            texts += [(("multipart", name, k), value[k]) for k in FILE_KEYS if isinstance(value.get(k), str)]
        else:
            texts.append((("multipart", name), value))
    texts += _strings_in(http.json, ("json",))
    return texts


def _check_empty_env(tool: ToolConfig, section: str, template: str, sub: tuple[Any, ...], checks: Checks) -> None:
    """A secret (or a header's variable) that is set but empty would send `Authorization: Bearer `
    and fail as a mystery at the API: an error now, naming it (unset is the `env:` warning)."""
    for name in env_reads(template):
        var = checks.config.env.get(name)
        if var is None or not _needs_value(var, sub):
            continue
        if os.environ.get(name, var.default) == "":
            where = "set" if name in os.environ else "given `default: \"\"`"
            checks.add("error", f"`{section}.{'.'.join(map(str, sub))}` of tool `{tool.name}` reads `env.{name}`, "
                       f"which is {where} but empty; {_empty_why(var)}", "tools", tool.name, section, *sub)


def _needs_value(var: EnvVar, sub: tuple[Any, ...]) -> bool:
    return var.secret or sub[0] == "headers"


def _empty_why(var: EnvVar) -> str:
    what = "a secret" if var.secret else "a header's value"
    return f"{what} cannot be empty (the request would go out without it); set it to its value"


def _empty_segment_refusal(tool: ToolConfig, args: dict[str, Any]) -> str:
    """What the model reads when a `urlsegment` value is empty: nothing was sent, and which
    argument to give (when an empty argument is the cause) or to tell the user."""
    empty = [name for name, value in args.items() if value == ""]
    if not empty:
        return (f"Error: {tool.name} was not sent: a value of its URL path is empty (an empty path segment "
                "would send the request to another address). Tell the user it did not work this time.")
    shown = ", ".join(f"`{name}`" for name in empty)
    return (f"Error: {tool.name} was not sent: {shown} went into its URL path empty (an empty path segment "
            f"would send the request to another address). Call {tool.name} again with a value for {shown}, "
            "or ask the user for it.")


def env_reads(template: str) -> list[str]:
    """The `env.NAME`s a template reads (in the order written, once each)."""
    return list(dict.fromkeys(_ENV_READ.findall(template)))


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _strings_in(value: Any, at: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], str]]:
    """Every string inside JSON-like data, with its path (the templates of an `http.json` body)."""
    if isinstance(value, str):
        return [(at, value)]
    if isinstance(value, dict):
        return [found for k, v in value.items() for found in _strings_in(v, (*at, k))]
    if isinstance(value, list):
        return [found for i, v in enumerate(value) for found in _strings_in(v, (*at, i))]
    return []


class Environment(Mapping[str, str]):
    """`env` in templates: the declared variables only. Reading one that is neither set nor
    defaulted fails the turn with its name, not a template's "undefined"."""

    def __init__(self, declared: dict[str, EnvVar]):
        self._declared = declared

    @property
    def declared(self) -> dict[str, EnvVar]:
        return self._declared

    def __getitem__(self, name: str) -> str:
        var = self._declared.get(name)
        if var is None:
            raise KeyError(name)
        value = os.environ.get(name, var.default)
        if value is None:
            raise TurnFailed(f"environment variable {name} is not set (the bot declares it under `env:`); "
                             "set it, or give it a `default`")
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._declared)

    def __len__(self) -> int:
        return len(self._declared)

    def secrets(self) -> tuple[str, ...]:
        """The values of the `secret: true` variables, each redacted in every form a response or
        an error may carry it (definition/secret_forms.py: as written, URL-escaped, base64)."""
        return secret_values(self._declared)


class HttpCaller(RuntimeDefaults):
    """Sends a bot's HTTP tools: one connection pool per event loop (an httpx client belongs
    to the loop that made it), shared by every session of the bot."""

    def __init__(self, declared: dict[str, EnvVar]):
        self.env = Environment(declared)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def client(self) -> httpx.AsyncClient:
        import asyncio

        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = httpx.AsyncClient(follow_redirects=False)
        return client

    async def aclose(self) -> None:
        import asyncio

        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def call(self, tool: ToolConfig, spec: HttpConfig, args: dict[str, Any],
                   ctx: CallContext) -> dict[str, Any]:
        """The tool's request, its templates rendered by the turn, sent with retries. Returns the result."""
        render, file_of = self._renderers(tool, spec, args, ctx)
        self._refuse_empty_values(tool, spec)
        request, _ = self._build(spec, args, render, tool.timeout, ctx.trace_headers, file_of, ctx.idempotency_key)
        return await self._send(tool, spec, request)

    def _renderers(self, tool: ToolConfig, spec: HttpConfig, args: dict[str, Any],
                   ctx: CallContext) -> tuple[Render, FileOf]:
        """How the call's templates are rendered (seeing `args`, `env` and `attachments`), and
        how a `file:` field's value finds its file."""
        attachments = ctx.attachments()
        values = {"args": args, "env": self.env, "attachments": template_values(attachments, ctx.message_attachments)}

        def render(source: Any, typed: bool) -> Any:
            try:
                return ctx.render(source, "http", tool.where, values, typed=typed)
            except TurnFailed as failed:
                if isinstance(failed.__cause__, EmptySegment):
                    raise ToolRefusal(_empty_segment_refusal(tool, args)) from failed
                raise

        def file_of(value: Any, field: str) -> tuple[Attachment, bytes]:
            attachment = find_attachment(value, attachments, tool.name, f"`{field}`")
            return attachment, read_or_refuse(attachment, ctx.read_attachment, tool.name)

        return render, file_of

    async def request(self, tool: ToolConfig, spec: HttpConfig, args: dict[str, Any],
                      ctx: CallContext) -> dict[str, Any] | None:
        """The request `call` would send, rendered the same way but not sent, as plain data
        with the values of secret environment variables redacted (what a transcript may hold)."""
        render, file_of = self._renderers(tool, spec, args, ctx)
        request, sent = self._build(spec, args, render, tool.timeout, lambda headers: None, file_of,
                                    ctx.idempotency_key)
        plain: dict[str, Any] = _redacted(_plain_request(request, spec, sent), self.env.secrets())
        return plain

    def _refuse_empty_values(self, tool: ToolConfig, spec: HttpConfig) -> None:
        """A secret or a header's variable that is empty now (the environment changed since the
        bot loaded, or nobody validated it): refused naming it, nothing sent."""
        for sub, template in _texts(spec):
            if not isinstance(template, str) or "env" not in template:
                continue
            for name in env_reads(template):
                var = self.env.declared.get(name)
                if var is not None and _needs_value(var, sub) and os.environ.get(name, var.default) == "":
                    raise ToolRefusal(f"Error: {tool.name} was not sent: the environment variable {name} is empty "
                                      f"({_empty_why(var)}). Tell the user it did not work this time.")

    async def _send(self, tool: ToolConfig, http: HttpConfig, request: httpx.Request) -> dict[str, Any]:
        """Send, retrying what may pass on a second try, within the tool's time. A request that
        may change something and carries no idempotency key is retried only when it certainly
        did not reach the API (`repeatable`); else the model reads that its outcome is unknown."""
        import asyncio

        import httpx

        secrets = self.env.secrets()
        deadline = time.monotonic() + tool.timeout * (http.retries + 1)
        attempt, repeatable = 0, _repeatable(request, http)
        while True:
            reached = True  # the API may have acted on it
            try:
                response, body = await self._attempt(request, tool.timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:  # no connection: not sent
                problem, reached = f"cannot connect ({type(exc).__name__})", False
                wait = BACKOFF_S * 2**attempt
            except (httpx.TimeoutException, TimeoutError):
                problem = f"no answer within {tool.timeout:g} s"
                wait = BACKOFF_S * 2**attempt
            except httpx.HTTPError as exc:
                problem = f"cannot connect ({type(exc).__name__})"
                wait = BACKOFF_S * 2**attempt
            except AnswerTooLarge as exc:  # the same API sends the same body again: no retry
                if exc.done:  # the API did it: a "failed" would have the model do it again
                    raise ToolRefusal(_unread_answer(tool, request, exc.status, secrets)) from None
                problem, attempt = f"an answer larger than {MAX_BODY_BYTES // 1_000_000} MB", attempt + 1
                if exc.status >= 500 and not repeatable:  # a 5xx may come after the work, as below
                    raise ToolRefusal(_unknown_outcome(tool, request, f"HTTP {exc.status}, {problem}", secrets)) \
                        from None
                break
            else:
                if response.is_success or response.status_code in http.accept:
                    return _redacted_result(_result(response, body), secrets)
                problem = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
                if response.status_code not in RETRY_STATUSES:
                    break
                reached = not _refused_unprocessed(response)
                wait = retry_after(response) or BACKOFF_S * 2**attempt
            attempt += 1
            if reached and not repeatable:
                raise ToolRefusal(_unknown_outcome(tool, request, problem, secrets))
            if attempt > http.retries or time.monotonic() + wait > deadline:
                break
            await asyncio.sleep(wait)
        where = redact_text(_shown_url(request.url), secrets)
        tries = f" after {attempt} attempts" if attempt > 1 else ""
        raise ToolRefusal(f"Error: {tool.name} failed: {problem} from {request.method} {where}{tries}. "
                          "Tell the user it did not work this time.")

    async def _attempt(self, request: httpx.Request, timeout: float) -> tuple[httpx.Response, bytes]:
        """One attempt: the response and its body, read within `timeout` seconds in all (httpx's
        own timeout is per read: an API trickling its body in would hold the turn for ever) and
        no more than MAX_BODY_BYTES of it (a huge body would take the process's memory)."""
        import asyncio

        async with asyncio.timeout(timeout):
            response = await self.client().send(request, stream=True)
            try:
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_BODY_BYTES:
                        raise AnswerTooLarge(response.status_code, response.is_success)
                    chunks.append(chunk)
            finally:
                await response.aclose()
        return response, b"".join(chunks)

    def _build(self, http: HttpConfig, args: dict[str, Any], render: Render, timeout: float,
               trace_headers: Callable[[dict[str, str]], None], file_of: FileOf,
               key: str) -> tuple[httpx.Request, Multipart | None]:
        """The request, and what its multipart body carries (None: it has none)."""
        import httpx

        url = str(render(http.url, False)).strip()
        if not url.startswith(("http://", "https://")):
            shown = redact_text(url, self.env.secrets())[:80]  # the turn's error is logged and may be shown
            raise TurnFailed(f"{http.where}: http.url rendered to {shown!r}, not an http(s) URL")
        query = _query(http, render)
        # an OpenAPI operation's query parameters, as the model gave them
        query.update({k: _text(args[k]) for k in http.args_in_query if args.get(k) is not None})
        headers = _headers(http, render)
        name = http.idempotency_header
        if name and key and name.lower() not in {n.lower() for n in headers}:  # the author's own header wins
            headers[name] = key  # the same in each attempt of `_send`: a retry is the same call
        trace_headers(headers)  # the API's own traces join the turn's (W3C traceparent)
        body: dict[str, Any] = {}
        sent: Multipart | None = None
        if http.json is not None:
            body["json"] = _render_data(http.json, render)
        elif http.form is not None:
            body["data"] = {k: _text(render(v, False)) for k, v in http.form.items()}
        elif http.multipart is not None:
            body["files"], sent = _multipart(http.multipart, render, file_of)
        # The connection must be made within CONNECT_SHARE of the time: a connect timeout then says
        # the request was never sent (`_send` may retry it), before the whole answer's time runs out.
        limits = httpx.Timeout(timeout, connect=timeout * CONNECT_SHARE)
        request = self.client().build_request(http.method, url, params=_params(url, query), headers=headers,
                                              timeout=limits, **body)
        return request, sent


def _repeatable(request: httpx.Request, http: HttpConfig) -> bool:
    """Whether sending the request twice does what sending it once does: a safe method (HTTP's
    GET, HEAD, OPTIONS), or one that carries an idempotency key the API dedupes by (the call's,
    or the author's own header of that name)."""
    header = http.idempotency_header or IDEMPOTENCY_HEADER
    return request.method in SAFE_METHODS or header in request.headers


def _refused_unprocessed(response: httpx.Response) -> bool:
    """A refusal that says the API did not act on the request: 429 (rate limits are checked
    before the work, RFC 6585), or 503 with `Retry-After` (the server asks to be called again
    later; a 503 without it may be a gateway giving up on a backend that went on working)."""
    return response.status_code == 429 or (response.status_code == 503 and "retry-after" in response.headers)


def _unknown_outcome(tool: ToolConfig, request: httpx.Request, problem: str, secrets: tuple[str, ...]) -> str:
    """What the model reads when a request that may change something got no clear answer: it may
    have been done, so it is not sent again (no key lets the API tell a repeat) nor to be called again."""
    where = redact_text(_shown_url(request.url), secrets)
    return unknown_outcome(tool.name, f"{problem} from {request.method} {where}", "The API")


class AnswerTooLarge(Exception):
    """An API's answer has more than MAX_BODY_BYTES: not read further. `status`: its HTTP status;
    `done`: it says the request succeeded."""

    def __init__(self, status: int, done: bool):
        super().__init__(status)
        self.status, self.done = status, done


def _unread_answer(tool: ToolConfig, request: httpx.Request, status: int, secrets: tuple[str, ...]) -> str:
    """What the model reads when the API did what was asked (a 2xx) but its answer is too large to
    read: that it was done, so it is not asked again (a POST's effect twice)."""
    where = redact_text(_shown_url(request.url), secrets)
    return (f"Error: {tool.name}'s {request.method} {where} succeeded (HTTP {status}), but its answer is larger than "
            f"{MAX_BODY_BYTES // 1_000_000} MB and was not read. It was done: do not call {tool.name} again for "
            "this; tell the user it went through but its answer could not be shown.")


@dataclass
class Multipart:
    """What a multipart body carries, as a transcript mock's `request:` matches it: its text
    fields (`form`) and its files ({field: {name, media_type, size}})."""

    form: dict[str, str] = field(default_factory=dict)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)


def _multipart(fields: dict[str, Any], render: Render, file_of: FileOf) -> tuple[list[tuple[str, Any]], Multipart]:
    """httpx's `files` for a multipart body (a text field is one without a file name, so a body
    of text fields only is multipart too), and what it carries."""
    parts: list[tuple[str, Any]] = []
    sent = Multipart()
    for name, value in fields.items():
        if not isinstance(value, dict):
            text = sent.form[name] = _text(render(value, False))
            parts.append((name, (None, text)))
            continue
        attachment, data = file_of(render(value.get("file"), True), f"multipart.{name}")
        filename = _text(render(value["name"], False)).strip() if "name" in value else ""
        media_type = _text(render(value["media_type"], False)).strip() if "media_type" in value else ""
        filename, media_type = filename or attachment.name or "file", media_type or attachment.media_type
        parts.append((name, (filename, data, media_type)))
        sent.files[name] = {"name": filename, "media_type": media_type, "size": len(data)}
    return parts, sent


def _plain_request(request: httpx.Request, http: HttpConfig, sent: Multipart | None) -> dict[str, Any]:
    """A built request as a transcript mock's `request:` matches it: the body parsed as it was
    written (`json`, `form`, or a multipart body's text fields as `form` and its `files`; None
    when the tool sends none)."""
    body = request.content.decode("utf-8", "replace") if sent is None else ""
    form = dict(parse_qsl(body, keep_blank_values=True)) if http.form is not None else None
    return {
        "method": request.method,
        "url": str(request.url),
        "query": dict(request.url.params),
        "headers": dict(request.headers),
        "json": json.loads(body) if http.json is not None and body else None,
        "form": sent.form if sent is not None else form,
        "files": sent.files if sent is not None else None,
    }


def _params(url: str, query: dict[str, str]) -> httpx.QueryParams | None:
    """The request's query: the URL's own (`?q={{ args.q }}`) and `query:`'s, `query:` winning a
    name both give. httpx replaces a URL's query with whatever `params` it is given, `{}` too, so
    None (no `query:` values) keeps the URL's as written."""
    import httpx

    return httpx.URL(url).params.merge(query) if query else None


def _query(http: HttpConfig, render: Render) -> dict[str, str]:
    """The rendered query parameters; one whose template gives none (or undefined) is left out,
    not sent as `None` (an empty text is sent: `?q=` may mean something to the API)."""
    query = {}
    for name, template in http.query.items():
        value = render(template, True)
        if not is_nothing(value):
            query[name] = _text(value)
    return query


def _headers(http: HttpConfig, render: Render) -> dict[str, str]:
    """The rendered headers; one whose template gives nothing (none, undefined, empty or blank
    text) is left out, so `X-Tenant: "{{ state.tenant }}"` is only sent when there is a tenant."""
    headers = {}
    for name, template in http.headers.items():
        value = render(template, True)
        if is_nothing(value):
            continue
        text = _text(value).strip()
        if text:
            headers[name] = text
    return headers


def _render_data(value: Any, render: Render) -> Any:
    if isinstance(value, str):
        return render(value, True)
    if isinstance(value, dict):
        return {k: _render_data(v, render) for k, v in value.items()}
    if isinstance(value, list):
        return [_render_data(v, render) for v in value]
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value) if value is not None else ""


def _result(response: httpx.Response, body: bytes) -> dict[str, Any]:
    text = body.decode(response.encoding or "utf-8", "replace")
    try:
        parsed = json.loads(text) if "json" in response.headers.get("content-type", "") else None
    except ValueError:
        parsed = None
    return {
        "status": response.status_code,
        "ok": response.is_success,
        "json": parsed,
        "text": text[:MAX_TEXT_CHARS],
        "headers": dict(response.headers),
    }


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a `Retry-After` header asks for (a number or an HTTP date), None without one
    (or with one that is neither: a date that cannot be read is no reason to fail)."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time()) if when else None


def _shown_url(url: httpx.URL) -> str:
    """The URL as a reason may show it: no query, no user info."""
    parts = urlsplit(str(url))
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"


def redact_text(text: str, secrets: tuple[str, ...]) -> str:
    """The text with each secret value, in each of its forms, replaced by `[redacted]`."""
    return redact_secrets(text, secrets, REDACTED)


def _redacted_result(result: dict[str, Any], secrets: tuple[str, ...]) -> dict[str, Any]:
    if not secrets:
        return result
    return {_redacted(k, secrets): _redacted(v, secrets) for k, v in result.items()}


def _redacted(value: Any, secrets: tuple[str, ...]) -> Any:
    if not secrets:
        return value
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict):
        return {_redacted(k, secrets): _redacted(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v, secrets) for v in value]
    return value
