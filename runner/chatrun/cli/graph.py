"""`chatrun graph PATH`: how a conversation can move between a bot's routes."""

from __future__ import annotations

import contextlib
import sys

import click

from chatrun.cli._output import BotPath, fail, print_diagnostics, summary
from chatrun.definition.graph import FORMATS
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
    from chatrun.definition.graph import RouteGraph
    from chatrun.definition.loader import load_config

    try:
        try:
            config, warnings = load_config(path)
        except BotError as exc:
            _report(exc.diagnostics, path)
            raise click.exceptions.Exit(1) from None
        if warnings:  # shown, not fatal: the graph of a bot with warnings is still useful
            _report(warnings, path)
        text = RouteGraph.from_config(config).render(fmt)
    except click.exceptions.Exit:
        raise
    except Exception as exc:  # never a traceback from the CLI
        fail(exc)
    click.echo(text, nl=False)


def _report(diagnostics: list[Diagnostic], path: str) -> None:
    """The diagnostics and verdict exactly as `chatrun validate` prints them, on stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        print_diagnostics(diagnostics)
        click.echo(summary(diagnostics, path))
