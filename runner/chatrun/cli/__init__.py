"""The `chatrun` command line. Each command lives in a module of its own."""

from __future__ import annotations

import codecs
import sys
import warnings

import click

from chatrun.version import DOCS_URL
from chatrun.version import VERSION as __version__


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 (warnings.showwarning signature)
    """chatrun's own warnings as one line, without Python's source line: they are for users."""
    if getattr(category, "__module__", "").startswith("chatrun"):
        click.secho(f"warning: {message}", fg="yellow", err=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning


def _tolerant_output() -> None:
    """On a terminal that is not UTF-8 (a Latin-1 locale, a Windows code page, PYTHONIOENCODING),
    what it cannot show is printed as `?`: the graph's `├─`, a bot's em dash or emoji would
    otherwise end the command with a UnicodeEncodeError traceback, mid-conversation in the REPL."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if not encoding or getattr(stream, "errors", None) != "strict" or not hasattr(stream, "reconfigure"):
            continue
        try:
            if codecs.lookup(encoding).name != "utf-8":
                stream.reconfigure(errors="replace")
        except (LookupError, ValueError, OSError):  # an unknown codec, a closed stream: left as it is
            continue

COMMANDS = {
    "validate": "chatrun.cli.validate:validate",
    "graph": "chatrun.cli.graph:graph",
    "repl": "chatrun.cli.repl:repl",
    "test": "chatrun.cli.test:test",
    "serve": "chatrun.cli.serve:serve",
    "init": "chatrun.cli.init:init",
    "examples": "chatrun.cli.examples:examples",
    "schema": "chatrun.cli.schema:schema",
    "record": "chatrun.cli.record:record",
    "simulate": "chatrun.cli.simulate:simulate",
    "mcp": "chatrun.cli.mcp_door:mcp",
    "upgrade": "chatrun.cli.upgrade:upgrade",
    "diff": "chatrun.cli.diff:diff",
    "versions": "chatrun.cli.versions:versions",
    "purge": "chatrun.cli.purge:purge",
    "index": "chatrun.cli.index:index",
    "report": "chatrun.cli.report:report",
}

# Each command's one-line summary for `chatrun --help`, so listing the commands imports none of
# them (tests/test_cli_startup.py checks each is its command's own first sentence).
SUMMARIES = {
    "validate": "Check bots (directories holding bot.yaml, or single YAML files) and report every problem "
                "at once: YAML syntax, schema violations, unknown routes and tools, templates, state paths, "
                "handlers, the route graph.",
    "graph": "Show a bot's route graph: routes are nodes (the default route marked), edges are the tools "
             "that push a route (nested scope), change route, or pop back to the parent.",
    "repl": "Talk to a bot.",
    "test": "Replay golden transcripts offline and check what each turn did.",
    "serve": "Serve bots over WebSocket and HTTP, with a web chat page and inspector.",
    "init": "Create a bot directory NAME: bot.yaml, a golden transcript and a README.",
    "examples": "List the example bots this install carries; `chatrun init --example NAME` copies one.",
    "schema": "Print the path of chatrun's JSON Schema for bots (default), transcripts, scenarios or wire frames.",
    "record": "Turn a stored session into a golden transcript whose tool results are mocks.",
    "simulate": "Play scenarios with a simulated user and report each one's pass rate.",
    "mcp": "Serve chatrun's authoring tools to coding assistants over MCP (stdio).",
    "upgrade": "Rewrite bots to the current format (3), keeping comments, order and every untouched line byte for byte, and print what changed.",
    "diff": "Compare two versions of a bot: what changed, and which changes break live sessions.",
    "versions": "List or retire the bot versions kept in a store.",
    "report": "Write a report of the stored conversations as one self-contained HTML file.",
    "purge": "Delete what is past the bots' retention now, or everything stored of one principal.",
    "index": "Build the knowledge index of a bot's `knowledge:` sources, reading only changed files.",
}


class LazyGroup(click.Group):
    """Imports a command's module only when it runs, so `chatrun --help` stays fast
    and a missing optional extra (e.g. `serve`) breaks only its own command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own listing, from SUMMARIES instead of importing every command for its help."""
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        rows = [(name, click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit))
                for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        import importlib

        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.split(".")[0] == "chatrun":
                raise  # a broken import inside chatrun is a bug to see, not "No such command"
            raise click.ClickException(
                f"`chatrun {name}` needs {exc.name}; install it with: pip install 'chatrun[serve]'"
            ) from exc
        return getattr(module, attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=f"Documentation: {DOCS_URL} (a page a message names, docs/format.md, is {DOCS_URL}format.md).")
@click.version_option(__version__, prog_name="chatrun")
def main() -> None:
    """chatrun: run declarative LLM chatbots described in YAML.

    \b
    Examples:
      chatrun examples
      chatrun init --example travel
      chatrun test travel
      chatrun repl travel
      chatrun init mybot --template wizard
    """
    warnings.showwarning = _show_warning
    _tolerant_output()
