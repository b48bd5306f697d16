"""`chatrun repl BOT`: talk to a bot in the terminal (or through a pipe)."""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import shlex
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import click

from chatrun import events as ev
from chatrun.cli._complete import DELIMITERS, Names, command_names, completions
from chatrun.cli._output import BotPath, plural
from chatrun.cli._reload import ReplReloader
from chatrun.cli.human_model import HumanModel
from chatrun.definition.config import ModelConfig
from chatrun.engine.clock import Clock, FixedClock, SystemClock, parse_duration, parse_instant
from chatrun.engine.pending import Answer, Approve, Expire, OperatorSay, Reject, Release, TakeOver
from chatrun.errors import (
    ChatrunError,
    DecisionRefused,
    HeldByAnother,
    InvalidDecision,
    NotPending,
    UnknownRouteError,
)
from chatrun.events import Event
from chatrun.memory.tokens import counter_label
from chatrun.models.pool import ModelPool

COMMANDS = """\
/help              this help
/say TEXT          (playing the model) answer with this text
/call TOOL {{JSON}}  (playing the model) call a tool with these arguments
/route             the current route
/stack             the scope stack, each scope with its route and state
/state             the state the current scope sees
/memory            the current route's memory, as the model will see it, with token counts
/history           everything said in this session
/usage             the last turn's tokens and cost, per model call, and the session's total
/roles [a,b]       the roles route checks use; with a list, a new session with those roles
/principal [NAME k=v ...]  who is signed in (templates' `principal`); NAME email=a@b.c signs one in, - no one;
                   roles=a,b gives them roles for the next turns (a supervisor, an operator), no new session
/pending           the items waiting for someone (approvals, questions, a takeover)
/approve ID [{{JSON}}] [REASON]  approve item ID as the principal, with edited arguments
/reject ID [REASON]  reject item ID (the model reads the tool's `rejected` text)
/answer ID VALUE   answer question ID (JSON, else text); a backend's question with its token
/operator take|force|say TEXT|release [ROUTE]  act as an operator: take the conversation (force: from
                   the operator who holds it, announced to the user), speak, give it back
/expire            let the timeouts of the items due by the clock decide them (/clock +31m first)
/locale [TAG]      the session's locale and the bot's `locales:`; with a tag (de, pt-BR), speak it
/clock [WHEN|real] the time templates see (`now`); 2026-12-24T18:00 pins it (in the bot's
                   time zone unless it has an offset), +2h or +1d moves it on, real unpins it
/reload            load the bot's files again (--reload does it on every edit)
/save FILE         write the conversation so far as a golden transcript
/reset [ROUTE]     start a new session (on ROUTE, else --route or the default route)
/quit              leave (Ctrl-D too)
Ctrl-C cancels a running turn, or clears the line; twice on an empty line quits.
Up/Down recall earlier lines (kept in {history}); Tab completes commands, and the names of
tools (/call), routes (/reset) and roles (/roles) of the bot as it is now (after a reload too),
the words of /clock (real, +1h, +1d, the time now) and /operator, and the ids of pending items."""

# At the `model>` prompt (playing the model, in the middle of a turn): what may run there.
READ_ONLY = ("/route", "/stack", "/state", "/memory", "/history", "/usage", "/pending")
MODEL_PROMPT_HELP = """\
At the model> prompt you answer for the model, in the middle of the user's turn:
TEXT or /say TEXT  answer with this text
/call TOOL {JSON}  call a tool with these arguments (the tools offered are listed above the prompt)
/route /stack /state /memory /history /usage /pending
                   look around, as at the user's prompt
/quit              leave (the turn is not kept; Ctrl-D too)
Ctrl-C cancels the turn: the session is as it was before it. Other commands wait for the turn's end."""

REFUSED = (DecisionRefused, NotPending, InvalidDecision, HeldByAnother, UnknownRouteError)  # a decision refused before its turn
ROLES_OFF = ("(no --roles given: role checks are off, every route is open; "
             "--roles a,b or /roles a,b to walk the bot as a principal with those roles)")


def model_is_configured(config: ModelConfig) -> bool:
    """Whether an OpenAI-compatible endpoint can be reached without asking the author."""
    if config.provider != "openai":
        return True
    from chatrun.models.openai_model import has_credentials

    return has_credentials(config)


NO_MODEL = """\
No model is configured, so you play the model's part: after each message, answer
with /say TEXT or /call TOOL {{"arg": "value"}}. To use a real model, set
OPENAI_API_KEY (and OPENAI_BASE_URL for Azure, vLLM, Ollama, llama.cpp...) or
model.base_url in {file}."""


# A terminal in canonical mode (no readline) keeps at most 4,095 bytes of a line.
TTY_LINE_LIMIT = 4094


def history_path() -> Path:
    """Where the REPL keeps its input history: $XDG_STATE_HOME/chatrun/history."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "chatrun" / "history"


COMMAND_NAMES = command_names(COMMANDS)  # "/save " takes an argument, "/help" does not


def setup_line_editing(names: Callable[[], Names]) -> Path | None:
    """Line editing, history and completion through the stdlib readline (a terminal only):
    `names` gives what Tab completes, asked afresh on each Tab. Readline also lifts the
    terminal's 4,095-byte line limit, so long pastes arrive whole.
    Returns the history file, or None when readline is unavailable."""
    try:
        import readline
    except ImportError:  # e.g. Windows without pyreadline
        return None
    path = history_path()
    try:
        readline.read_history_file(path)
    except OSError:  # no history yet
        pass
    readline.set_history_length(1000)
    readline.set_completer_delims(DELIMITERS)
    readline.set_completer(Completer(readline, names))
    readline.parse_and_bind("tab: complete")
    return path


def escape_undecodable_input() -> None:
    """Bytes that are not text in the input's encoding arrive as lone surrogates (Python's
    `surrogateescape`, the default of a UTF-8 C locale already), so `undecodable` finds the line
    holding them: a strict stdin (a Windows code page, PYTHONIOENCODING=ascii) would end the REPL
    with a UnicodeDecodeError traceback, and the lines read ahead with it would be lost."""
    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None and getattr(sys.stdin, "errors", None) == "strict":
        reconfigure(errors="surrogateescape")


def undecodable(line: str | None) -> str | None:
    """"byte 0xe9 at column 4" for the first byte of `line` that was not text, else None."""
    for column, char in enumerate(line or "", 1):
        if "\udc80" <= char <= "\udcff":
            return f"byte 0x{ord(char) - 0xdc00:02x} at column {column}"
    return None


def typed_so_far() -> str:
    """The line being edited at the prompt ("" without readline, where the terminal holds it)."""
    readline = sys.modules.get("readline")
    return readline.get_line_buffer() if readline is not None else ""


def save_history(path: Path | None) -> None:
    if path is None:
        return
    import readline

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        readline.write_history_file(path)
    except OSError as exc:
        click.secho(f"could not save the input history to {path}: {exc}", dim=True, err=True)


class Completer:
    """readline's completer: it asks for candidate `state` of the word before the cursor."""

    def __init__(self, readline: Any, names: Callable[[], Names]):
        self.readline = readline
        self.names = names
        self.matches: list[str] = []

    def __call__(self, text: str, state: int) -> str | None:
        if state == 0:
            line = self.readline.get_line_buffer()[: self.readline.get_endidx()]
            self.matches = completions(line, self.names())
        return self.matches[state] if state < len(self.matches) else None


def run_to_completion(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> None:
    """Run one turn on the REPL's loop. Ctrl-C raises KeyboardInterrupt wherever the main thread
    is (in input() at the `model>` prompt too: input is read on this thread, never on a helper
    thread that would outlive the turn and swallow the next line); the turn is then cancelled
    and awaited, so the session rolls back, and KeyboardInterrupt is re-raised."""
    task = loop.create_task(coro)
    try:
        loop.run_until_complete(task)
    except KeyboardInterrupt:
        if not task.done():
            task.cancel()
            try:
                loop.run_until_complete(task)
            except BaseException:  # the cancellation itself, as expected  # noqa: B036
                pass
        raise


def quiet_about_interrupts(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Ctrl-C during a turn raises KeyboardInterrupt inside the engine's turn task, which
    run_to_completion() handles (the turn is rolled back and reported as cancelled); the task
    keeps that exception, and asyncio would print its 25-line traceback ("Task exception was
    never retrieved") when the task is collected. That is no error: say nothing."""
    if isinstance(context.get("exception"), KeyboardInterrupt):
        return
    loop.default_exception_handler(context)


class Repl:
    def __init__(self, bot: Any, store: Any, session_id: str | None, route: str | None, play_model: bool,
                 roles: set[str] | None = None):
        self.bot = bot
        self.store = store
        self.route = route
        self.roles = roles
        self.principal: dict[str, Any] | None = None  # who is signed in (/principal): what `bind:` reads
        self.wanted_locale: str | None = None  # the locale /locale asked for (docs/i18n.md)
        self.interactive = sys.stdin.isatty()
        self.lines_read = 0  # of a pipe: a line that is not text is named by its number
        escape_undecodable_input()
        self.human = HumanModel(self.read_line, self.note, self.command_while_answering) if play_model else None
        self.leaving = False  # /quit at the `model>` prompt: leave once its turn has ended
        self.waiting_at: str | None = None  # the prompt input() shows now, if it is waiting
        self.reloader = ReplReloader(bot, echo=self.notice_while_reading)
        # One loop for the REPL's life: the bot's MCP servers and HTTP connections belong to the
        # loop that opened them, so they serve every turn and are closed here (close()).
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(quiet_about_interrupts)
        self.models = ModelPool()  # the real model's clients, on that loop too, closed on exit
        self.model: Any = self.human or self.models.model()
        self.session = bot.session(route=route, store=store, model=self.model, session_id=session_id, roles=roles)
        self.clock: Clock = SystemClock()  # kept across /reset: a pinned clock stays pinned
        self.streamed = ""
        self.records: list[dict[str, Any]] = []  # per turn, for /save
        self.choices: list[tuple[str, str]] = []  # (value, label) of the last Choices event (picked_choice)
        self.shown_items: set[str] = set()  # the pending items shown in this turn (each went to several audiences)

    # -- input and output ----------------------------------------------------------------

    async def read_line(self, prompt: str) -> str | None:
        # Read on the event loop's thread on purpose: the turn has nothing else to do while it
        # waits for the author's answer, and Ctrl-C then interrupts this very read.
        return self._read_line(prompt)

    def _read_line(self, prompt: str) -> str | None:
        """The next line typed or piped in; a line that is not text in the input's encoding is
        said and left out (the lines after it are read as usual)."""
        while True:
            line = self._next_line(prompt)
            bad = undecodable(line)
            if bad is None:
                return line
            where = "that line" if self.interactive else f"input line {self.lines_read}"
            encoding = sys.stdin.encoding or "utf-8"
            hint = "save the input as UTF-8" if codecs.lookup(encoding).name == "utf-8" \
                else "for UTF-8 input set PYTHONIOENCODING=utf-8"
            click.secho(f"error: {where} is not {encoding} text ({bad}); it was left out ({hint})", fg="red", err=True)

    def _next_line(self, prompt: str) -> str | None:
        if self.interactive:
            self.waiting_at = prompt
            try:
                line = input(prompt)
            except EOFError:
                return None
            finally:
                self.waiting_at = None
            if len(line) >= TTY_LINE_LIMIT and "readline" not in sys.modules:
                click.secho(f"warning: the terminal cut this line at {TTY_LINE_LIMIT} characters (no readline "
                            "here); pipe long text in instead: chatrun repl BOT < file", fg="yellow", err=True)
            return line
        line = sys.stdin.readline()
        self.lines_read += 1
        return line.rstrip("\n") if line else None

    def note(self, text: str) -> None:
        click.secho(text, dim=True)

    def notice_while_reading(self, text: str) -> None:
        """A notice from another thread (--reload's watcher): printed on a line of its own, then,
        if input() is waiting, its prompt and what was typed so far drawn again below it (else
        the author types on after the notice, with no prompt)."""
        prompt = self.waiting_at
        if prompt is None:
            click.secho(text, fg="yellow")
            return
        click.echo("\r\x1b[K", nl=False)  # the start of the prompt's line, cleared
        click.secho(text, fg="yellow")
        click.echo(prompt + typed_so_far(), nl=False)

    def prompt(self) -> str:
        return " > ".join(self.session.stack) + "> "

    def show(self, event: Event) -> None:
        kind, data = event.type, event.data
        if kind in (ev.PENDING, ev.RESOLVED, ev.USER_MESSAGE) and isinstance(data, dict):
            self.show_pending(event)
            return
        if kind == ev.MESSAGE and event.meta.get("from") == "operator":
            click.secho(f"[operator {event.meta.get('name') or ''}] {data}", fg="blue")
            return
        if event.audience == ev.BACKEND:  # never a chat's: shown dimmed, delivered only by `chatrun serve`
            self.show_backend(event)
            return
        if not event.for_user:  # the author sees every audience; a user's chat never gets these
            text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
            click.secho(f"[{event.audience}] {kind} {text}", dim=True)
            return
        if kind == ev.STREAM:
            if self.interactive:
                click.echo(data, nl=False)
                self.streamed += data
            return
        if kind == ev.MESSAGE:
            if self.streamed and self.streamed == data:
                click.echo()
            else:
                click.echo(data)
            self.streamed = ""
        elif kind == ev.THINKING:
            click.secho(f"… {data}", fg="cyan", italic=True)
        elif kind == ev.CONSOLE:
            click.secho(f"[console] {data}", dim=True)
        elif kind == ev.ERROR:  # the REPL is the author's: the detail, not the text users get
            click.secho(f"error: {event.meta.get('detail') or data}", fg="red")
        elif kind == ev.CHOICES:
            self.choices = [(str(c["value"]), str(c["label"])) for c in data.get("choices", [])]
            for i, choice in enumerate(data.get("choices", []), start=1):
                click.secho(f"  {i}) {choice['label']}", fg="green")
        elif kind == ev.ROUTE_CHANGED:
            click.secho(f"→ {' > '.join(data['stack'])}", fg="yellow")
        elif kind == ev.ENDED:
            click.secho(f"■ the conversation has ended (tool {data.get('tool')} on route {data.get('route')}); "
                        "/reset starts a new one", fg="yellow")
        else:
            text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
            click.secho(f"[{kind}] {text}", fg="magenta")

    def show_pending(self, event: Event) -> None:
        """Humans in the loop, one dim line each: an item when it appears (once, whichever
        audiences it went to), its resolution, and a user's message the operators got."""
        data = event.data
        if event.type == ev.USER_MESSAGE:
            click.secho(f"[to operators] user: {data.get('text') or json.dumps(data.get('data'))}", dim=True)
        elif event.type == ev.RESOLVED:
            extra = "".join(f"; {k} {json.dumps(data[k], ensure_ascii=False)}" for k in ("case", "args", "answer", "reason")
                            if data.get(k) is not None)
            click.secho(f"✓ {data['id']} {data['kind']} {data['outcome']} by {data.get('by') or 'nobody'}{extra}",
                        dim=True)
        elif data.get("id") not in self.shown_items:
            self.shown_items.add(data.get("id"))
            # The deciders' view (its question); the user's copy says what the user is told instead.
            item = next((i for i in self.session.pending if i.id == data.get("id")), None)
            shown = item.public() if item is not None else data
            click.secho(pending_line(shown), dim=True)
            told = data.get("tell")
            if event.audience == ev.USER and told and told != shown.get("ask"):
                click.secho(f"  the user is told: {told}", dim=True)

    def show_backend(self, event: Event) -> None:
        text = event.data if isinstance(event.data, str) else json.dumps(event.data, ensure_ascii=False)
        sinks = ", ".join(sink.name for sink in self.session.bot.config.sinks_for(event.type)) or "no sink"
        click.secho(f"[backend] {event.type} {text} (for {sinks}; the REPL sends nothing, `chatrun serve` delivers)",
                    dim=True)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        click.secho(f"{self.bot.name}: session {self.session.id} on {' > '.join(self.session.stack)}"
                    " (/help for commands)", dim=True)
        history = setup_line_editing(self.completion_names) if self.interactive else None
        self.log_mcp_stderr()
        if self.interactive and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # Started with SIGINT ignored (a script's background job, some IDE consoles), Python
            # never turns Ctrl-C into KeyboardInterrupt; at a terminal it is the REPL's cancel key.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return self.read_eval_loop()
        finally:
            save_history(history)
            self.close()

    def log_mcp_stderr(self) -> None:
        """Stdio MCP servers write their stderr to log files, never over the prompt; say where."""
        from chatrun.cli._mcp_log import send_mcp_stderr_to_logs, where_mcp_logs_go

        send_mcp_stderr_to_logs(history_path().parent)
        where = where_mcp_logs_go(self.bot.config, history_path().parent)
        if where:
            click.secho(where, dim=True)

    def close(self) -> None:
        """Leaving: stop the watcher, and close the tools the bot opened (MCP servers, HTTP
        connections) and the loop. The session stays in the store (--session resumes it)."""
        self.reloader.stop()
        from chatrun.toolkinds.mcp_servers import send_stderr_to

        send_stderr_to(None)
        if self.loop.is_closed():
            return
        try:
            self.loop.run_until_complete(self.bot.tools.aclose())
            self.close_model()
            self.loop.run_until_complete(self.models.aclose())
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def close_model(self) -> None:
        """The clients the session's model opened for itself (a played model has none)."""
        aclose = getattr(self.model, "aclose", None)
        if aclose is not None and self.model is not self.human:
            self.loop.run_until_complete(aclose())

    def completion_names(self) -> Names:
        """What Tab completes: the bot the next turn runs on (an edit's, once reloaded), plus
        the tools a played model call offers now (those of MCP servers too)."""
        config = self.reloader.newest_bot().config
        offered = self.human.offered if self.human else []
        return Names(COMMAND_NAMES, tools=[*config.tools, *offered], routes=list(config.routes),
                     roles=sorted({role for route in config.routes.values() for role in route.roles}),
                     clock=["real", "+1h", "+1d", self.session.now().strftime("%Y-%m-%dT%H:%M")],
                     items=[item.id for item in self.session.pending])

    def read_eval_loop(self) -> int:
        interrupted = False
        while True:
            try:
                line = self._read_line(self.prompt())
            except KeyboardInterrupt:
                # As shells do: Ctrl-C drops the line being typed; twice in a row leaves.
                if interrupted:
                    click.echo()
                    return 0
                interrupted = True
                click.secho("\n(Ctrl-C again or Ctrl-D to quit)", dim=True)
                continue
            interrupted = False
            if line is None:
                if self.interactive:
                    click.echo()
                return 0
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if self.command(line) == "quit" or self.leaving:
                    return 0
                continue
            picked = picked_choice(line, self.choices)
            if picked != line:
                line = picked
                click.secho(f"→ {line}", dim=True)
            self.choices = []
            self.turn(line)
            if self.leaving:
                return 0

    def turn(self, text: Any, step: dict[str, Any] | None = None, backend: bool = False) -> None:
        """Run one turn: the user's `text`, or a decision (`step` is how /save writes it,
        `backend`: answered with the item's token, as the backend)."""
        self.take_reloaded_bot()
        self.shown_items = set()
        before = len(self.human.responses) if self.human else 0
        # /save writes a pinned clock's instant on the turn, so the transcript replays at it
        pinned = self.session.now().isoformat() if isinstance(self.clock, FixedClock) else None
        tools = self.record_tools()
        events: list[Event] = []

        async def consume() -> None:
            async for event in self.session.stream(text):
                events.append(event)
                self.show(event)

        try:
            run_to_completion(self.loop, consume())
        except KeyboardInterrupt:
            click.secho("\nturn cancelled; the session is as it was before it", fg="yellow")
            self.streamed = ""
            return
        except ChatrunError as exc:  # e.g. the store failed while recording the turn
            click.secho(f"error: {exc}", fg="red")
            if step is not None and isinstance(exc, REFUSED) and self.human:  # /save writes it, expecting the refusal
                self.records.append({"decision": step, "model": [], "events": [], "principal": self.session.principal,
                                     "roles": sorted(self.session.roles) if self.session.roles is not None else None,
                                     **({"as": "backend"} if backend else {}),
                                     **({"clock": pinned} if pinned else {})})
            return
        if self.streamed:
            click.echo()
            self.streamed = ""
        self.show_what_the_model_sees_next()
        if self.human:
            self.records.append({
                **({"decision": step} if step is not None else {"user": text}),
                "principal": self.session.principal,
                "roles": sorted(self.session.roles) if self.session.roles is not None else None,
                **({"as": "backend"} if backend else {}),
                "at": self.session.now().replace(microsecond=0).isoformat(),  # /save pins the clock at it when items fall due
                "model": self.human.responses[before:],
                "events": events,
                "route": self.session.route,
                "stack": self.session.stack,
                "mocks": tools.recorded if tools is not None else [],
                **({"clock": pinned} if pinned else {}),
            })

    def record_tools(self) -> Any:
        """When /save may write this turn (the author plays the model), keep what its tools that
        reach outside the bot (HTTP APIs, MCP servers) really gave, so the saved transcript
        replays offline to what happened. The tools still run for real."""
        if self.human is None:
            return None
        from chatrun.transcripts.mocks import TranscriptMocks

        recorder = TranscriptMocks([], live=True)
        self.session.tool_mocks = recorder
        return recorder

    def command_while_answering(self, line: str) -> str | None:
        """A slash command at the `model>` prompt, mid-turn: the read-only ones run (on the bot and
        session of the running turn: no reload is taken here), /quit leaves once the turn is undone."""
        name = line.partition(" ")[0]
        if name in ("/quit", "/exit"):
            self.leaving = True
            return "quit"
        if name == "/help":
            click.echo(MODEL_PROMPT_HELP)
        elif name in READ_ONLY:
            self.run_command(line)
        else:
            click.secho(f"({name} waits for the end of the turn: answer for the model first, or Ctrl-C cancels "
                        "the turn; /help lists what works here)", dim=True)
        return None

    def command(self, line: str) -> str | None:
        self.take_reloaded_bot()
        return self.run_command(line)

    def run_command(self, line: str) -> str | None:
        name, _, arg = line.partition(" ")
        s = self.session
        if name in ("/quit", "/exit"):
            return "quit"
        if name == "/help":
            click.echo(COMMANDS.format(history=history_path()))
        elif name == "/route":
            click.echo(s.route)
        elif name == "/stack":
            for depth, scope in enumerate(s.scopes):
                click.echo(f"{'  ' * depth}{scope.route} [{scope.id}] local={json.dumps(scope.local)} shared={json.dumps(scope.shared)}")
        elif name == "/state":
            click.echo(json.dumps(s.visible_state(), indent=2, ensure_ascii=False, default=str))
        elif name == "/memory":
            self.show_memory()
        elif name == "/history":
            for entry in s.history:
                click.echo(json.dumps(entry, ensure_ascii=False, default=str))
        elif name == "/usage":
            self.show_usage()
        elif name == "/reset":
            self.reset(arg.strip() or None)
        elif name == "/roles":
            self.set_roles(arg.strip())
        elif name == "/principal":
            self.set_principal(arg.strip())
        elif name == "/clock":
            self.set_clock(arg.strip())
        elif name == "/locale":
            self.set_locale(arg.strip())
        elif name == "/reload":
            self.reloader.reload_now()
            self.take_reloaded_bot()
        elif name == "/save":
            self.save(os.path.expanduser(arg.strip()))
        elif name in ("/pending", "/approve", "/reject", "/answer", "/operator", "/expire"):
            self.pending_command(name, arg.strip())
        elif name in ("/say", "/call"):
            click.secho("(/say and /call answer for the model while a turn waits for it)", dim=True)
        else:
            click.secho(f"unknown command {name}; /help lists them", fg="red")
        return None

    def pending_command(self, name: str, arg: str) -> None:
        """/pending lists what waits; the others decide as the principal (/principal), each a turn."""
        if name == "/pending":
            for item in self.session.pending:
                click.secho(pending_line(item.public()), dim=True)
            taken = self.session.taken_over
            click.secho(f"taken over by {(taken['by'] or {}).get('name')}" if taken else
                        "" if self.session.pending else "(nothing is pending)", dim=True)
            return
        try:
            decision, step, backend = parse_decision(name, arg, self.session.pending)
        except ValueError as exc:
            click.secho(f"error: {exc}", fg="red")
            return
        self.turn(decision, step, backend)

    def show_memory(self) -> None:
        """The current route's memory as the model will see it (led by the system message,
        rendered as it is now), one JSON line per message with its token count, then the total
        and the counter: a token window's own, else the route model's encoding."""
        s = self.session
        messages = s.preview_messages()
        window = s.token_window()
        counter = window[0] if window else s.token_counter()
        counts = [counter(m) for m in messages]
        for message, tokens in zip(messages, counts, strict=True):
            click.echo(json.dumps({**message.to_dict(), "tokens": tokens}, ensure_ascii=False))
        limit = f" of max_tokens {window[1]}" if window else ""
        click.echo(f"{len(messages)} messages, {sum(counts)} tokens{limit}, counted with {counter_label(counter)}")

    def show_usage(self) -> None:
        from chatrun.cli._usage import session_usage_line, turn_usage_lines

        for line in turn_usage_lines(self.session.last_turn):
            click.echo(line)
        click.echo(session_usage_line(self.session.usage))

    def reset(self, route: str | None = None) -> None:
        self.session.close()
        self.close_model()
        self.model = self.human or self.models.model()
        try:
            self.session = self.bot.session(route=route or self.route, store=self.store, model=self.model,
                                            roles=self.roles)
        except ChatrunError as exc:  # e.g. --route names a route the roles may not enter
            click.secho(f"error: {exc}; starting on the default route", fg="red")
            self.session = self.bot.session(store=self.store, model=self.model, roles=self.roles)
        self.session.principal = self.principal
        self.session.clock = self.clock
        if self.wanted_locale:
            self.session.ask_locale(self.wanted_locale)
        self.records.clear()
        if self.human:
            self.human.last_route = self.human.last_system = None
        click.secho(f"new session {self.session.id} on {' > '.join(self.session.stack)}", dim=True)

    def set_locale(self, arg: str) -> None:
        """/locale shows the locale the session speaks (docs/i18n.md); /locale TAG asks for TAG, as
        a client would, for this session and the next (a bot's `state.locale` still wins)."""
        catalogs = self.bot.config.catalogs
        if catalogs is None:
            click.secho("(this bot declares no `locales:`: it speaks one language; docs/i18n.md)", dim=True)
            return
        if arg:
            self.wanted_locale = arg
            self.session.ask_locale(arg)
        click.echo(f"locale: {self.session.locale} (the bot's locales: {', '.join(catalogs.locales)}; "
                   f"default {catalogs.default})")

    def set_roles(self, arg: str) -> None:
        """/roles shows the roles; /roles a,b starts a new session with them (roles belong to
        the principal a session starts with); /roles - turns role checks off."""
        if arg:
            self.roles = None if arg == "-" else parse_roles(arg)
            self.reset()
        if self.roles is None:
            click.secho(ROLES_OFF, dim=True)
        else:
            click.echo(f"roles: {', '.join(sorted(self.roles)) or '(none)'}")

    def set_principal(self, arg: str) -> None:
        """/principal shows who is signed in; /principal NAME k=v ... signs NAME in with those
        claims (`principal.k` in templates; its roles are --roles / /roles), for this session
        and the next; /principal - signs out. Like a server's, it is the session's, not stored."""
        if arg == "-":
            self.principal = None
        elif arg:
            name, *claims = arg.split()
            pairs = [claim.partition("=") for claim in claims]
            bad = [claim for claim, (_, eq, _) in zip(claims, pairs, strict=True) if not eq]
            if bad:
                click.secho(f"error: {bad[0]!r} is not a claim; write NAME=VALUE (e.g. email=ana@example.com)",
                            fg="red")
                return
            given: dict[str, str] = {k: v for k, _, v in pairs}
            if "roles" in given:  # a principal with roles of its own: the next turns are theirs
                self.roles = parse_roles(given.pop("roles"))
                self.session.roles = self.roles
            self.principal = {**given, "name": name, "roles": sorted(self.roles or ())}
        self.session.principal = self.principal
        who = self.session.principal
        if who is None:
            click.secho("(no one is signed in: `principal` is none in templates)", dim=True)
        else:
            click.echo("principal: " + json.dumps(who, ensure_ascii=False))

    def set_clock(self, arg: str) -> None:
        """/clock shows `now`; /clock WHEN pins it, /clock +DURATION moves a pinned clock on
        (pinning the real time first), /clock real goes back to the system clock."""
        try:
            if arg == "real":
                self.clock = SystemClock()
            elif arg.startswith("-") and arg[1:2].isdigit():  # (a date never starts with "-")
                raise ValueError(f"{arg}: the clock moves on only (what waits is due by it); to go back, pin an "
                                 "earlier instant")
            elif arg.startswith("+"):
                pinned = self.clock if isinstance(self.clock, FixedClock) else FixedClock(self.session.now())
                pinned.advance(parse_duration(arg[1:]))
                self.clock = pinned
            elif arg:
                self.clock = FixedClock(parse_instant(arg, self.session.now().tzinfo))
            self.session.clock = self.clock
            now = self.session.now()
        except (ValueError, ChatrunError) as exc:
            click.secho(f"error: {exc} (e.g. /clock 2026-12-24T18:00, /clock +1d, /clock real)", fg="red")
            return
        kind = "pinned" if isinstance(self.clock, FixedClock) else "system clock"
        click.echo(f"{now.replace(microsecond=0).isoformat()} ({now.strftime('%A')}, {now.tzinfo}; {kind})")

    def take_reloaded_bot(self) -> None:
        """Between turns: run the next turns on the bot an edit produced, keeping the session."""
        bot = self.reloader.take_new_bot()
        if bot is None:
            return
        old, self.bot = self.bot, bot
        self.session.use_bot(bot)
        # No session runs on the old bot now: its MCP servers and HTTP connections go.
        self.loop.run_until_complete(old.tools.aclose())
        if self.session.stale:
            click.secho(f"error: {self.session.stale} (/reset)", fg="red")

    def show_what_the_model_sees_next(self) -> None:
        """Playing the model: after a turn, the tool results it ended with and the next
        system prompt, if changed (before each call the played model shows them itself)."""
        if self.human is None or self.session.closed:
            return
        self.human.show_what_the_model_sees(self.session.preview_messages(), self.session.route)

    def save(self, path: str) -> None:
        if not path:
            click.secho("usage: /save FILE", fg="red")
            return
        try:
            from chatrun.transcripts.save import save_transcript
        except ImportError:
            click.secho("/save needs the transcripts module, which this install lacks", fg="red")
            return
        if self.human is None:
            click.secho("/save records what the model answered; it works when you play the model "
                        "(use `chatrun test --record` to record a real model)", fg="red")
            return
        try:
            replay = save_transcript(path, bot_path=self.bot.config.path, route=self.route, records=self.records,
                                     session=self.session)
        except (ChatrunError, OSError) as exc:
            click.secho(f"could not save: {exc}", fg="red")
            return
        saved = f"saved {plural(len(self.records), 'turn')} to {path}"
        if not replay.passed:  # a handler that reads the world, a bot edited since a turn ran: say so now
            click.secho(f"{saved}, but its replay does not do what this session did, so `chatrun test` fails "
                        f"it:\n{replay.report()}", fg="yellow")
            return
        click.secho(f"{saved}; run it with: chatrun test {shlex.quote(path)}", dim=True)


@click.command()
@click.argument("bot_path", metavar="BOT", type=BotPath())
@click.option("--route", help="Start route (default: the bot's default route).")
@click.option("--session", "session_id", help="Resume this session from the store (or start it with this id).")
@click.option("--store", default=None, help="Where sessions live: memory:// (default) or sqlite:///path/to.db "
              "(relative to the current folder; sqlite:////abs/path.db for an absolute path).")
@click.option("--play-model", is_flag=True, help="Answer for the model yourself (/say, /call), even with credentials.")
@click.option("--roles", default=None, metavar="A,B", help="The principal's roles, so routes with `roles:` can be walked "
              "(default: role checks off).")
@click.option("--reload", "reload", is_flag=True, help="Watch the bot's files; the next turn uses the edited bot.")
@click.option("--version", "version", default=None, metavar="V", help="For a bot with versions/ folders: the "
              "version to talk to (default: the primary, as `chatrun serve` would start new sessions on).")
def repl(bot_path: str, route: str | None, session_id: str | None, store: str | None, play_model: bool,
         roles: str | None, reload: bool, version: str | None) -> None:
    """Talk to a bot. Type messages; /help lists the slash commands.

    Reads one user message per line from a pipe too, printing events to stdout.

    \b
    Examples:
      chatrun repl bots/travel
      chatrun repl bots/travel --store sqlite:///chat.db --session 1f2e3d
      printf 'hello\\n/say Hi there!\\n' | chatrun repl bots/hello --play-model
      chatrun repl bots/travel --roles staff --reload
      chatrun repl bots/shop --version 1
    """
    from chatrun.cli._output import describe_store, fail
    from chatrun.definition.versions import bot_folder
    from chatrun.engine.bot import load_bot
    from chatrun.store import open_store

    try:
        bot = load_bot(bot_folder(bot_path, version))
        play = play_model or not model_is_configured(bot.config.model)
        opened = open_store(store)
        if store:
            click.secho(f"store: {describe_store(opened)}", dim=True)
        session = Repl(bot, opened, session_id, route, play, parse_roles(roles))
        if play and not play_model:
            click.secho(NO_MODEL.format(file=bot.config.path), fg="yellow")
        if roles is None and any(r.roles for r in bot.config.routes.values()):
            click.secho(ROLES_OFF, dim=True)
        if reload:
            session.reloader.start()
        code = session.run()
    except ChatrunError as exc:
        fail(exc)
        return
    sys.exit(code)


def parse_roles(text: str | None) -> set[str] | None:
    """"a, b" -> {"a", "b"}; None -> None (role checks off)."""
    if text is None:
        return None
    return {r.strip() for r in text.split(",") if r.strip()}


def parse_decision(name: str, arg: str, pending: list[Any]) -> tuple[Any, dict[str, Any], bool]:
    """A decision command as (the input for the session, the transcript step /save writes,
    whether it answers as the backend). Raises ValueError with the command's usage."""
    item, _, rest = arg.partition(" ")
    rest = rest.strip()
    if name == "/expire":
        return Expire(), {"expire": True}, False
    if name == "/operator":
        return operator_decision(item, rest)
    if not item:
        raise ValueError(f"usage: {name} ID ...; /pending lists the ids")
    if name == "/reject":
        return Reject(item, reason=rest or None), {"reject": {"item": item, "reason": rest} if rest else item}, False
    if name == "/answer":
        if not rest:
            raise ValueError("usage: /answer ID VALUE (JSON, else text)")
        try:
            value: Any = json.loads(rest)
        except json.JSONDecodeError:
            value = rest
        token = next((i.token for i in pending if i.id == item and i.token), None)  # the REPL plays the backend
        return Answer(item, value, token=token), {"answer": {"item": item, "value": value}}, token is not None
    args = None
    if rest.startswith("{"):
        try:
            args, end = json.JSONDecoder().raw_decode(rest)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the edited arguments are not JSON: {exc.msg} (e.g. /approve p1 {{\"amount\": 80}})") from None
        if not isinstance(args, dict):
            raise ValueError("the edited arguments must be a JSON object, e.g. {\"amount\": 80}")
        rest = rest[end:].strip()
    body = {"item": item, **({"args": args} if args is not None else {}), **({"reason": rest} if rest else {})}
    return Approve(item, args=args, reason=rest or None), {"approve": body if len(body) > 1 else item}, False


def operator_decision(word: str, rest: str) -> tuple[Any, dict[str, Any], bool]:
    if word == "take":
        return TakeOver(rest or None), {"operator": {"take": rest} if rest else "take"}, False
    if word == "force":  # from the operator who holds it (the user reads them leave, this one join)
        return TakeOver(rest or None, force=True), {"operator": {"force": rest} if rest else "force"}, False
    if word == "say" and rest:
        return OperatorSay(rest), {"operator": {"say": rest}}, False
    if word == "release":
        return Release(rest or None), {"operator": {"release": rest} if rest else "release"}, False
    raise ValueError("usage: /operator take [NOTE] | /operator force [NOTE] | /operator say TEXT | "
                     "/operator release [ROUTE]")


def pending_line(item: dict[str, Any]) -> str:
    """An item that waits, in one line: its id, kind and text, who decides, and the command."""
    what = f"{item['tool']} {json.dumps(item.get('args') or {}, ensure_ascii=False)}; " if item.get("tool") else ""
    edit = f"; may edit {', '.join(item['edit'])}" if item.get("edit") else ""
    due = f"; due {item['due']}" if item.get("due") else ""
    how = {"approval": f"/approve {item['id']} or /reject {item['id']}",
           "question": f"/answer {item['id']} VALUE", "takeover": "/operator take"}.get(item.get("kind", ""), "")
    return (f"⏸ {item['id']} {item.get('kind')}: {item.get('ask')} ({what}by {', '.join(item.get('by') or [])}"
            f"{edit}{due}) — {how}")


def picked_choice(line: str, choices: list[tuple[str, str]]) -> str:
    """What a typed line sends while choices (value, label) are shown: a line that is itself a
    choice's value or label is that choice (with choices 0 to 10, typing 9 sends 9); else a
    number N from 1 sends the Nth choice's value; anything else is sent as typed."""
    for value, label in choices:
        if line in (value, label):
            return value
    if line.isdigit() and 1 <= int(line) <= len(choices):
        return choices[int(line) - 1][0]
    return line
