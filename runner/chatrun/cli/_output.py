"""Printing diagnostics and errors the same way in every command: `file:line:col: severity:
message` lines (or JSON), a summary, and exit codes instead of tracebacks."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Coroutine, Iterable
from typing import Any, NoReturn

import click

from chatrun.errors import BotError, ChatrunError, Diagnostic


def print_diagnostics(diagnostics: Iterable[Diagnostic], fmt: str = "text") -> None:
    """Every diagnostic on stdout: one line each (text) or one JSON list (json)."""
    diagnostics = list(diagnostics)
    if fmt == "json":
        click.echo(json.dumps([d.to_dict() for d in diagnostics], indent=2, ensure_ascii=False))
        return
    for d in diagnostics:
        click.echo(d.format())


def counts(diagnostics: Iterable[Diagnostic]) -> tuple[int, int]:
    """(errors, warnings)."""
    diagnostics = list(diagnostics)
    errors = sum(1 for d in diagnostics if d.severity == "error")
    return errors, len(diagnostics) - errors


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary(diagnostics: Iterable[Diagnostic], what: str) -> str:
    """"bots/travel: valid" / "bots/travel: invalid: 2 errors, 1 warning"."""
    errors, warnings = counts(diagnostics)
    if errors:
        return f"{what}: invalid: {plural(errors, 'error')}, {plural(warnings, 'warning')}"
    return f"{what}: valid" + (f" ({plural(warnings, 'warning')})" if warnings else "")


def fail(exc: BaseException, code: int = 1) -> NoReturn:
    """End a command because of `exc`: its diagnostics (BotError) or its message (ChatrunError)
    on stderr, or one line for an unexpected exception. Never a traceback."""
    if isinstance(exc, BotError):
        for d in exc.diagnostics:
            click.echo(d.format(), err=True)
        errors, warnings = counts(exc.diagnostics)
        click.echo(f"invalid bot: {plural(errors, 'error')}, {plural(warnings, 'warning')}", err=True)
    elif isinstance(exc, ChatrunError):
        click.echo(f"error: {exc}", err=True)
    elif isinstance(exc, BrokenPipeError):  # `chatrun validate ... | head`: the reader left
        pass
    elif isinstance(exc, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        code = 130
    else:
        click.echo(f"error: unexpected {type(exc).__name__}: {exc} (this is a chatrun bug; please report it)", err=True)
    raise click.exceptions.Exit(code)


def for_the_terminal(text: str) -> tuple[str, bool]:
    """`text` as stdout's encoding can show it, each character it cannot as a backslash escape
    (`\\xe9`, `\\u2192`) rather than a `?` that reads as text; and whether any was escaped."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding), True
    except LookupError:  # a codec Python does not know: left to the stream
        pass
    return text, False


def describe_store(store: object) -> str:
    """Where sessions live, for start-up messages: the resolved file of a SQLite store (so
    `sqlite:///tmp/x.db` is seen to be ./tmp/x.db), else the store's kind."""
    path = getattr(store, "path", None)
    if isinstance(path, str) and path != ":memory:":
        from pathlib import Path

        return f"SQLite file {Path(path).expanduser().resolve()}"
    if type(store).__name__ == "InMemoryStore":
        return "in memory (sessions end with the process)"
    return getattr(store, "url", None) or type(store).__name__


def run_on_store(url: str, work: Coroutine[Any, Any, Any]) -> Any:
    """Run a command's work on the store at `url`; a store error is one line naming the store
    and exit status 2, never a traceback."""
    import asyncio  # here: `chatrun validate` imports this module and must start without an event loop's modules

    try:
        return asyncio.run(work)
    except (ChatrunError, OSError, ValueError) as exc:
        from chatrun.store.urls import shown_url  # here: only a failure needs it

        click.echo(f"{shown_url(url)}: error: {exc}", err=True)
        raise click.exceptions.Exit(2) from None


class BotPath(click.Path):
    """A bot's path argument (click.Path(exists=True)): a path that is not there says how to get a
    bot, since a first-time user typing the README's `chatrun repl bots/hello` has no bots/ yet."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(exists=True, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            if os.path.exists(value):
                raise
            self.fail(f"{exc.message.rstrip('.')}. {how_to_get_a_bot(str(value))}", param, ctx)


def how_to_get_a_bot(missing: str) -> str:
    """The hint for a bot path that does not exist: the example of that name if there is one."""
    from chatrun.cli.examples import example_names

    name = os.path.basename(os.path.normpath(missing))
    if name in example_names():
        return f"It is an example bot: `chatrun init --example {name} {missing}` copies it there."
    return ("`chatrun examples` lists the example bots (`chatrun init --example NAME` copies one); "
            "`chatrun init mybot` writes a new bot.")
