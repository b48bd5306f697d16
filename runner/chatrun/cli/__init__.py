"""The `chatrun` command line. Each command lives in a module of its own."""

from __future__ import annotations

import warnings

import click

from chatrun import __version__


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001 (warnings.showwarning signature)
    """chatrun's own warnings as one line, without Python's source line: they are for users."""
    if getattr(category, "__module__", "").startswith("chatrun"):
        click.secho(f"warning: {message}", fg="yellow", err=True)
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning

COMMANDS = {
    "validate": "chatrun.cli.validate:validate",
    "graph": "chatrun.cli.graph:graph",
    "repl": "chatrun.cli.repl:repl",
    "test": "chatrun.cli.test:test",
    "serve": "chatrun.cli.serve:serve",
    "init": "chatrun.cli.init:init",
    "schema": "chatrun.cli.schema:schema",
}


class LazyGroup(click.Group):
    """Imports a command's module only when it runs, so `chatrun --help` stays fast
    and a missing optional extra (e.g. `serve`) breaks only its own command."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

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


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="chatrun")
def main() -> None:
    """chatrun: run declarative LLM chatbots described in YAML.

    \b
    Examples:
      chatrun init mybot --template wizard
      chatrun validate bots/travel
      chatrun graph bots/travel --format mermaid
      chatrun repl bots/hello
      chatrun test
    """
    warnings.showwarning = _show_warning
