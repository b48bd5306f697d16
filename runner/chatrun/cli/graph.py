"""`chatrun graph PATH`: how a conversation can move between a bot's routes."""

from __future__ import annotations

import click

from chatrun.cli._output import fail
from chatrun.graph import FORMATS


@click.command("graph")
@click.argument("path", type=click.Path(exists=True))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="text", show_default=True,
              help="text: a list for the terminal; mermaid: a flowchart for Markdown (GitHub renders it "
                   "in a ```mermaid block); dot: Graphviz input (pipe it to `dot -Tsvg`).")
def graph(path: str, fmt: str) -> None:
    """Show a bot's route graph: routes are nodes (the default route marked), edges are
    the tools that push a route (nested scope), change route, or pop back to the parent.

    The bot is validated first; if it is invalid the problems are printed as by
    `chatrun validate` and the exit status is 1.

    \b
    Examples:
      chatrun graph bots/travel
      chatrun graph bots/travel --format mermaid > docs/travel-graph.md
      chatrun graph bots/travel --format dot | dot -Tsvg > travel.svg
    """
    from chatrun.graph import RouteGraph
    from chatrun.loader import load_config

    try:
        config, warnings = load_config(path)
        for d in warnings:  # shown, not fatal: the graph of a bot with warnings is still useful
            click.echo(d.format(), err=True)
        text = RouteGraph.from_config(config).render(fmt)
    except Exception as exc:  # noqa: BLE001 - never a traceback from the CLI
        fail(exc)
    click.echo(text, nl=False)
