"""`chatrun serve BOT [BOT...]`: the WebSocket/HTTP server and the web chat page."""

from __future__ import annotations

import asyncio
import functools
import importlib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from chatrun.cli._output import BotPath
from chatrun.cli.purge import DURATION, RETAIN_DEAD_HELP, RETAIN_IDLE_HELP, server_retention
from chatrun.errors import ChatrunError

if TYPE_CHECKING:  # the server's modules need the `serve` extra: imported when the command runs
    from chatrun.server.guard import EdgePolicy
    from chatrun.server.listen import ListenOptions
    from chatrun.server.sessions import SessionSettings
    from chatrun.server.wire import ServerLimits


@dataclass(frozen=True)
class ServeOptions:
    """`chatrun serve`'s command line, one field per option (`chatrun serve --help` says what each does)."""

    bots: tuple[str, ...]
    host: str
    port: int
    store: str
    knowledge_store: str | None
    auth_file: str | None
    max_message_chars: int
    max_in_flight: int
    session_headers: tuple[str, ...]
    front_end_tasks: str
    allow_origin: tuple[str, ...]
    allow_host: tuple[str, ...]
    send_timeout: float
    header_timeout: float
    body_timeout: float
    keep_alive_timeout: int
    max_connections: int
    reload: bool
    log_level: str
    log_format: str
    log_content: bool
    if_busy: str
    queue_timeout: float
    lease_ttl: float
    drain_timeout: float
    cache_size: int
    cache_mb: int
    cache_idle: float
    max_sessions_per_principal: int
    sweep_interval: float
    retain_idle: float | None
    retain_dead_letters: float | None
    bundle_key: str | None
    allow_unsigned_data_bundles: bool
    max_bundle_mb: float
    clock_file: str | None

    @property
    def wildcard(self) -> bool:
        """Listening on every interface."""
        return self.host in ("0.0.0.0", "::", "")

    def limits(self) -> ServerLimits:
        from chatrun.server.wire import ServerLimits

        return ServerLimits(max_message_chars=self.max_message_chars, max_in_flight=self.max_in_flight,
                            send_timeout=self.send_timeout)

    def edge(self, max_body_bytes: int) -> EdgePolicy:
        from chatrun.server.guard import LOOPBACK_HOSTS, EdgePolicy

        hosts = self.allow_host or (("*",) if self.wildcard else tuple(dict.fromkeys((*LOOPBACK_HOSTS, self.host))))
        return EdgePolicy(allowed_hosts=hosts, allowed_origins=self.allow_origin,
                          max_body_bytes=max_body_bytes, body_timeout=self.body_timeout)

    def sessions(self) -> SessionSettings:
        from chatrun.engine.clock import FileClock
        from chatrun.server.bundles import BundlePolicy
        from chatrun.server.sessions import SessionSettings
        from chatrun.store.aio import LeaseSettings

        clock = FileClock(self.clock_file) if self.clock_file else None
        if clock is not None:
            clock.now()  # a file that holds no instant stops the start, not every turn later (TurnFailed)
        return SessionSettings(
            if_busy=self.if_busy,
            lease=LeaseSettings(ttl=self.lease_ttl, wait=self.queue_timeout),
            cache_size=self.cache_size,
            cache_bytes=self.cache_mb * 2**20,
            cache_idle=self.cache_idle,
            max_sessions_per_principal=self.max_sessions_per_principal,
            bundles=BundlePolicy.from_env(self.bundle_key, self.allow_unsigned_data_bundles,
                                          int(self.max_bundle_mb * 2**20)),
            clock=clock,
        )

    def listen_options(self) -> ListenOptions:
        from chatrun.server.listen import ListenOptions

        return ListenOptions(header_timeout=self.header_timeout, keep_alive_timeout=self.keep_alive_timeout,
                             log_format=self.log_format, max_connections=self.max_connections)


def _gathered(command: Callable[[ServeOptions], None]) -> Callable[..., None]:
    """click hands a command each option as a keyword argument; `serve` takes them as one ServeOptions."""

    @functools.wraps(command)
    def with_options(**options: Any) -> None:
        command(ServeOptions(**options))

    return with_options


def _origins(values: tuple[str, ...]) -> tuple[str, ...]:
    """--allow-origin's values, each an origin a browser sends (scheme://host[:port]) or '*': one
    with a path or another scheme would never match, and the server would refuse its page for a
    reason the operator could not see."""
    from urllib.parse import urlsplit

    for value in values:
        if value == "*":
            continue
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/") \
                or parts.query or parts.fragment:
            raise click.BadParameter(f"{value!r} is not an origin: write scheme://host[:port] as the browser's "
                                     "address bar shows it, without a path (e.g. https://chat.example.com), or '*'")
    return values


@click.command()
@click.argument("bots", nargs=-1, required=True, metavar="BOT [BOT...]", type=BotPath())
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--store",
    default="sqlite:///chatrun.db",
    show_default=True,
    envvar="CHATRUN_STORE",  # the container's way (Dockerfile, compose.yaml): an environment, no command line
    show_envvar=True,
    help="Where sessions live: sqlite:///path.db (one process, survives restarts; relative to the current "
    "folder, sqlite:////abs/path.db absolute), redis://[:PASSWORD@]HOST:PORT/DB or rediss:// (N replicas "
    "share it; see docs/deploy.md), postgresql://USER@HOST:PORT/DB (N replicas share it) or memory://.",
)
@click.option("--knowledge-store", metavar="URL", default=None, envvar="CHATRUN_KNOWLEDGE_STORE", show_envvar=True,
              help="Where the bots' knowledge index is read: postgresql://USER@HOST:PORT/DB (shared by replicas, "
              "built by `chatrun index BOT --store URL`) or `local` (each bot folder's .chatrun/knowledge.db). "
              "Default: the --store URL when it is PostgreSQL, else local.")
@click.option("--if-busy", type=click.Choice(["queue", "reject"]), default="queue", show_default=True,
              help="A message for a session already running a turn: wait in its FIFO queue, or fail "
              "at once with TooManyRequests (a request may choose with ifBusy).")
@click.option("--queue-timeout", default=60.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds a request waits for a busy session before TooManyRequests.")
@click.option("--lease-ttl", default=10.0, show_default=True, type=click.FloatRange(min=0.2),
              help="Redis and Postgres stores: seconds a session's lease outlives a dead replica (renewed every ttl/3 while a turn runs).")
@click.option("--drain-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="On SIGTERM: seconds to let running turns finish before closing connections "
              "(the process exits within this plus 5 s; a second SIGTERM exits at once).")
@click.option("--cache-size", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Live sessions kept in memory at most (the rest are reloaded from the store).")
@click.option("--cache-mb", default=256, show_default=True, type=click.IntRange(min=1),
              help="Memory the live sessions may take, in MiB (their estimated share of the RSS).")
@click.option("--cache-idle", default=900.0, show_default=True, type=click.FloatRange(min=1),
              help="Seconds an unused live session stays in memory.")
@click.option("--clock-file", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="For tests and demos: the server's time is the instant written in PATH (ISO 8601 with an offset; "
              "the system clock while PATH is missing or empty), for every session's `now` and timeouts and for the "
              "sweeper. Write the file to move time.")
@click.option("--sweep-interval", default=5.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds between two looks for pending items (approvals, questions) whose timeout has come; "
              "each replica looks, exactly one resolves each; on PostgreSQL the same loop deletes the lease rows a dead "
              "replica left (0: this replica never looks nor sweeps; let another one).")
@click.option("--retain-idle", type=DURATION, default=None, metavar="DURATION", help=RETAIN_IDLE_HELP)
@click.option("--retain-dead-letters", type=DURATION, default=None, metavar="DURATION", help=RETAIN_DEAD_HELP)
@click.option("--bundle-key", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="File holding the bundle key (at least 16 bytes; else $CHATRUN_BUNDLE_KEY): the bot versions this "
              "replica publishes to the store are signed with it, and only versions signed with it are loaded from "
              "the store. Give every replica the same key; keep it out of the store. Without one, no version is "
              "loaded from the store (docs/security.md).")
@click.option("--allow-unsigned-data-bundles", is_flag=True,
              help="Also load unsigned bot versions from the store that hold no code (no .py file, no MCP "
              "server command).")
@click.option("--max-bundle-mb", default=5.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Largest bot version (its files) published to the store or loaded from it, in MiB.")
@click.option("--max-sessions-per-principal", default=0, show_default=True, type=click.IntRange(min=0),
              help="Sessions one principal may own (0: no limit): an --auth token's, a channel's user, a widget "
                   "visitor; checked and counted with each new session's write, across replicas sharing a store "
                   "too (a 429 names it; a channel's user is told why instead, once).")
@click.option(
    "--auth",
    "auth_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="YAML file mapping tokens to principals and roles (else $CHATRUN_AUTH_FILE; else no auth).",
)
@click.option("--max-message-chars", default=8000, show_default=True, type=click.IntRange(min=1), help="Longest userMessage accepted.")
@click.option("--max-in-flight", default=8, show_default=True, type=click.IntRange(min=1), help="Requests in flight per WebSocket connection.")
@click.option(
    "--session-header",
    "session_headers",
    multiple=True,
    metavar="HEADER",
    help="OpenAI API: a front end's chat-id header to trust for telling chats apart, e.g. "
    "X-OpenWebUI-Chat-Id (repeatable; see docs/openai-api.md).",
)
@click.option("--front-end-tasks", default="answer", show_default=True, type=click.Choice(["answer", "run", "refuse"]),
              help="OpenAI API: a chat front end's background tasks (Open WebUI's titles, tags, follow-ups): "
              "answer them at once without running the bot, run them as turns, or refuse them (400).")
@click.option("--allow-origin", multiple=True, metavar="ORIGIN", callback=lambda _c, _p, v: _origins(v),
              help="Browser origin (scheme://host[:port]) allowed to open the WebSocket or POST, besides "
              "the server's own page; it also opens the HTTP API to that origin (CORS): its pages may call "
              "it with fetch and read the answers. Repeatable; '*' allows any.")
@click.option("--allow-host", multiple=True, metavar="NAME",
              help="Host name clients may reach the server by (DNS-rebinding guard); repeatable; '*' allows any. "
              "Default: localhost, 127.0.0.1, ::1 and --host.")
@click.option("--send-timeout", default=20.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a WebSocket client may take to read what it is sent before it is disconnected.")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds to send a request's headers (408 and closed after).")
@click.option("--body-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds to send a request's body (408 after).")
@click.option("--keep-alive-timeout", default=5, show_default=True, type=click.IntRange(min=1),
              help="Seconds an idle HTTP connection stays open.")
@click.option("--max-connections", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Connections served at once; more get 503. Keep under the file-descriptor limit (ulimit -n).")
@click.option("--reload", "reload", is_flag=True, help="Watch each bot's files; serve the new version after a valid edit.")
@click.option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Log records (chatrun's, one line per turn among them, and uvicorn's access log): text, or "
              "one JSON object per line.")
@click.option("--log-content", is_flag=True,
              help="Put the user's message and the bot's replies in the per-turn log line (off: never logged).")
@_gathered
def serve(options: ServeOptions) -> None:
    """Serve bots over WebSocket and HTTP, with a web chat page and inspector.

    \b
    Examples:
      chatrun serve bots/travel
      chatrun serve bots/travel bots/support --port 9000 --store sqlite:///sessions.db
      chatrun serve bots/travel --auth tokens.yaml
      chatrun serve bots/travel --host 0.0.0.0 --auth tokens.yaml --allow-host chat.example.com \\
        --allow-origin https://chat.example.com
      chatrun serve bots/travel --store redis://127.0.0.1:6379/0 --port 8001
      chatrun serve bots/travel --reload       # edit the YAML; the next turn uses it

    \b
    Then open http://HOST:PORT/ (the first bot) or /bots/NAME/ (each bot).
    WebSocket: /_chat/routes (Quarkus Chat Scopes frames); HTTP API docs: /docs;
    OpenAI-compatible API: /v1 (model = the bot's name); Prometheus metrics: /metrics
    (pip install 'chatrun[metrics]').
    """
    app = _create_app(options)
    registry = app.state.registry
    _warn(options, app)
    try:  # bind before saying "serving": a port in use is an error, not a false start
        listener = _listen(options.host, options.port)
    except (OSError, OverflowError) as exc:  # OverflowError: a port outside 0-65535
        asyncio.run(registry.store.close())
        click.echo(f"error: cannot listen on {options.host}:{options.port}: "
                   f"{getattr(exc, 'strerror', None) or exc}", err=True)
        raise click.exceptions.Exit(1) from None
    _announce(options, app)
    _log_to_stderr(options.log_level, options.log_format)
    if options.reload:  # what the watcher did is shown whatever the log level
        import logging

        logging.getLogger("chatrun.reload").setLevel(logging.INFO)
    from chatrun.knowledge import share_index
    from chatrun.server.drain import run

    share_index(knowledge_store(options))  # now, not earlier: a command that failed leaves its process as it was
    try:
        run(app, host=options.host, port=options.port, log_level=options.log_level,
            drain_timeout=options.drain_timeout, options=options.listen_options(), sockets=[listener])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its clean shutdown: the normal way to stop
        pass
    click.echo("chatrun: stopped", err=True)


def knowledge_store(options: ServeOptions) -> str | None:
    """Where the bots read their knowledge index: PostgreSQL (chatrun.knowledge.pg_index) when the
    store is PostgreSQL or --knowledge-store names one; None (`local`): each bot folder's file."""
    from chatrun.store import POSTGRES_SCHEMES

    chosen = options.knowledge_store
    if chosen is None:
        chosen = options.store if options.store.startswith(POSTGRES_SCHEMES) else "local"
    if chosen != "local" and not chosen.startswith(POSTGRES_SCHEMES):
        raise click.BadParameter(f"{chosen!r}: give postgresql://USER@HOST:PORT/DB (the index shared by replicas) "
                                 "or `local` (each bot folder's .chatrun/knowledge.db)", param_hint="--knowledge-store")
    return None if chosen == "local" else chosen


def _create_app(options: ServeOptions) -> Any:
    """The app, or the exit of any other command: 1 for an invalid bot or a bad store."""
    knowledge_store(options)  # first: a bad --knowledge-store is the command's error before anything loads
    try:  # the `serve` extra is optional: say how to install it before anything starts
        for module in ("chatrun.server", "chatrun.server.drain"):
            importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise click.ClickException(
            f"`chatrun serve` needs {exc.name}; install it with: pip install 'chatrun[serve]'"
        ) from None
    from chatrun.cli._output import fail
    from chatrun.server import create_app
    from chatrun.server.openai_api import OpenAIOptions
    from chatrun.server.sweeper import SweepSettings

    limits = options.limits()
    edge = options.edge(limits.max_frame_bytes)
    try:  # the same messages and exit codes as the other commands (1: invalid bot, bad store)
        app = create_app(list(options.bots), options.store, auth=options.auth_file, limits=limits,
                         sessions=options.sessions(), edge=edge,
                         openai=OpenAIOptions(session_headers=options.session_headers,
                                              front_end_tasks=options.front_end_tasks), reload=options.reload,
                         log_content=options.log_content, sweep=SweepSettings(
                             interval=options.sweep_interval,
                             retention=server_retention(options.retain_idle, options.retain_dead_letters)))
        if options.store.startswith(("redis://", "rediss://")):
            from chatrun.store.redis import check_reachable

            check_reachable(options.store)
        from chatrun.store import POSTGRES_SCHEMES

        if options.store.startswith(POSTGRES_SCHEMES):
            from chatrun.store.postgres import check_reachable as check_postgres

            check_postgres(options.store)
    except ChatrunError as exc:
        fail(exc)
    return app


def _warn(options: ServeOptions, app: Any) -> None:
    """What may not be meant: a bot without a model, a public address without auth, any Host."""
    from chatrun.cli.repl import model_is_configured
    from chatrun.server.guard import LOOPBACK_HOSTS

    for name, bot in app.state.registry.bots.items():
        if not model_is_configured(bot.config.model):
            click.secho(f"warning: bot {name} has no model configured, so every message will fail: set "
                        f"OPENAI_API_KEY (and OPENAI_BASE_URL for other providers) or model.base_url in "
                        f"{bot.config.path}", fg="yellow", err=True)
    if options.host not in LOOPBACK_HOSTS and not app.state.auth:
        click.echo(f"chatrun: warning: listening on {options.host} without --auth: anyone who can reach this "
                   "address can use every session (see docs/security.md)", err=True)
    if options.wildcard and not options.allow_host:
        click.echo("chatrun: warning: any Host name is accepted; name the server's with --allow-host", err=True)
    from chatrun.server.listen import fd_headroom

    short = fd_headroom(options.max_connections)
    if short:
        click.echo(f"chatrun: warning: {short}", err=True)


def _announce(options: ServeOptions, app: Any) -> None:
    from chatrun.cli._output import describe_store

    registry = app.state.registry
    auth_note = f"auth on ({app.state.auth.source})" if app.state.auth else "auth off"
    click.echo(f"chatrun: serving {', '.join(registry.bots)} on http://{options.host}:{options.port}/  "
               f"(store: {describe_store(getattr(registry.store, 'sync', registry.store))}; {auth_note})", err=True)


def _log_to_stderr(level: str, log_format: str = "text") -> None:
    """The server log: chatrun's own records (a failed turn's full detail, which users never see;
    one line per turn) go to stderr beside uvicorn's, as text or as JSON lines."""
    import logging

    from chatrun.server.turnlog import JsonFormatter

    logger = logging.getLogger("chatrun")
    ours: list[logging.Handler] = [h for h in logger.handlers if getattr(h, "chatrun_serve", False)]
    if not logger.handlers:
        handler: logging.Handler = logging.StreamHandler()
        handler.chatrun_serve = True  # type: ignore[attr-defined]  # marks the handler serve owns
        logger.addHandler(handler)
        ours = [handler]
    for handler in ours:
        handler.setFormatter(JsonFormatter() if log_format == "json"
                             else logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    logger.setLevel(level.upper())


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, as uvicorn would open it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
