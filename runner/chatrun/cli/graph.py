"""`chatrun graph PATH`: how a conversation can move between a bot's routes."""

from __future__ import annotations

import contextlib
import sys

import click

from chatrun.cli._output import BotPath, fail, for_the_terminal, print_diagnostics, summary
from chatrun.definition.graph import FORMATS, RouteGraph
from chatrun.errors import BotError, Diagnostic


@click.command("graph")
@click.argument("path", type=BotPath())
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="text: a list for the terminal; mermaid: a flowchart for Markdown (GitHub renders it "
                   "in a ```mermaid block); dot: Graphviz input (pipe it to `dot -Tsvg`).")
def graph(path: str, fmt: str) -> None:
    """Show a bot's route graph: routes are nodes (the default route marked), edges are
    the tools that push a route (nested scope), change route, or pop back to the parent.

    The bot is validated first; its problems are printed on stderr as by `chatrun
    validate` (stdout is left to the graph). If it is invalid the exit status is 1.

    \b
    Examples:
      chatrun graph bots/travel
      chatrun graph bots/travel --format mermaid > docs/travel-graph.md
      chatrun graph bots/travel --format dot | dot -Tsvg > travel.svg
    """
    from chatrun.definition.loader import load_config

    try:
        try:
            config, warnings = load_config(path)
        except BotError as exc:
            _report(exc.diagnostics, path)
            raise click.exceptions.Exit(1) from None
        if warnings:  # shown, not fatal: the graph of a bot with warnings is still useful
            _report(warnings, path)
        text = _shown(RouteGraph.from_config(config), fmt)
    except click.exceptions.Exit:
        raise
    except Exception as exc:  # never a traceback from the CLI
        fail(exc)
    click.echo(text, nl=False)


def _shown(route_graph: RouteGraph, fmt: str) -> str:
    """The graph as the terminal can show it: on one that is not UTF-8, the tree and arrows in
    ASCII and what is left that it cannot show (a description's `é`) as escapes, said on stderr."""
    text, escaped = for_the_terminal(route_graph.render(fmt))
    if escaped and fmt == "text":
        text, escaped = for_the_terminal(route_graph.render(fmt, ascii_lines=True))
    if escaped:
        encoding = getattr(sys.stdout, "encoding", None)
        click.echo(f"note: this terminal's encoding ({encoding}) cannot show some characters of the bot's "
                   "descriptions or conditions; they are written as backslash escapes (such as \\xe9). "
                   "Use a UTF-8 locale or PYTHONIOENCODING=utf-8 to see them.", err=True)
    return text


def _report(diagnostics: list[Diagnostic], path: str) -> None:
    """The diagnostics and verdict exactly as `chatrun validate` prints them, on stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        print_diagnostics(diagnostics)
        click.echo(summary(diagnostics, path))
