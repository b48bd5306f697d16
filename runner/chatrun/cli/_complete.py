"""Tab completion in `chatrun repl`: slash commands, then their arguments from the running bot
(`/call TOOL`, `/reset ROUTE`, `/roles A,B`, `/clock real`, `/approve ID`, `/operator take`). Pure functions over the text before the cursor,
so they are tested without a terminal; repl.py hands them to the stdlib readline."""

from __future__ import annotations

from dataclasses import dataclass, field

# Where readline starts the word it completes: a space, or a comma between roles.
DELIMITERS = " \t\n,"


@dataclass
class Names:
    """What can be completed: command names (with a trailing space when they take an
    argument), and the current bot's tools, routes and roles."""

    commands: list[str]
    tools: list[str] = field(default_factory=list)
    routes: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    clock: list[str] = field(default_factory=list)  # /clock's words: real, +1h, +1d, the time now
    items: list[str] = field(default_factory=list)  # the ids of the pending items (/approve, /reject, /answer)


OPERATOR_WORDS = ["take", "force", "say", "release"]
DECIDING = ("/approve", "/reject", "/answer")


def command_names(help_text: str) -> list[str]:
    """The commands a /help text lists, one per line ("/save FILE  write..." -> "/save ")."""
    names = []
    for line in help_text.splitlines():
        if line.startswith("/"):
            words = line.split()
            takes_argument = len(words) > 1 and (words[1].isupper() or words[1].startswith("["))
            names.append(words[0] + (" " if takes_argument else ""))
    return names


def completions(before_cursor: str, names: Names) -> list[str]:
    """The candidates for the word being typed at the end of `before_cursor`, each a whole
    word to put in its place (a trailing space when another word follows it)."""
    word = _last_word(before_cursor)
    head = before_cursor[: len(before_cursor) - len(word)]
    if not head.strip():
        return [c for c in names.commands if c.startswith(word)] if word.startswith("/") else []
    command, _, args = head.lstrip().partition(" ")
    # How many arguments come before this word ("/roles a," is still in its first one).
    position = len(args.split()) - (1 if args.endswith(",") else 0)
    if command == "/roles" and position == 0:
        return _starting_with(names.roles, word, "")
    if position != 0:
        return []
    if command == "/call":
        return _starting_with(names.tools, word, " ")
    if command == "/reset":
        return _starting_with(names.routes, word, "")
    if command == "/clock":
        return _starting_with(names.clock, word, "")
    if command in DECIDING:
        return _starting_with(names.items, word, " ")
    if command == "/operator":
        return _starting_with(OPERATOR_WORDS, word, " ")
    return []


def _last_word(text: str) -> str:
    start = max(text.rfind(d) for d in DELIMITERS) + 1
    return text[start:]


def _starting_with(candidates: list[str], word: str, suffix: str) -> list[str]:
    return [c + suffix for c in sorted(set(candidates)) if c.startswith(word)]
