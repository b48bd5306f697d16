"""chatrun: a declarative LLM chatbot runner.

A bot is YAML: routes (prompt templates, tools, memory policy, scope behaviour)
and tools that may act on the conversation (push, pop, route, set state, emit).

    >>> import chatrun
    >>> bot = chatrun.load_bot("bots/hello")
    >>> session = bot.session()
    >>> events = session.chat("hi")
"""

from chatrun.errors import BotError, ChatrunError, Diagnostic
from chatrun.events import Event

__version__ = "0.1.0"

__all__ = ["BotError", "ChatrunError", "Diagnostic", "Event", "load_bot", "__version__"]


def load_bot(path, store=None):  # noqa: ANN001, ANN201 - documented in chatrun.engine.bot.load_bot
    """Load and validate a bot (a directory holding bot.yaml, or one YAML file).

    Raises BotError carrying every diagnostic when the bot is invalid.
    """
    from chatrun.engine.bot import load_bot as _load_bot

    return _load_bot(path, store)
