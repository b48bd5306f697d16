"""`chatrun test [PATH...]`: replay golden transcripts offline and report like pytest."""

from __future__ import annotations

import re
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import click

from chatrun.cli._output import how_to_get_a_bot
from chatrun.errors import BotError, ChatrunError

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, EXIT_NONE = 0, 1, 2, 4, 5


@dataclass
class Outcome:
    """What the CLI needs of one transcript's run (small and picklable, for -n)."""

    name: str
    passed: bool
    report: str = ""
    updated: bool = False
    invalid: bool = False
    warnings: list[str] = field(default_factory=list)
    roles_off: bool = False  # the transcript declares no `roles:`, so role checks are off in it
    usage: dict[str, Any] | None = None  # its session's model calls, summed (shown with -v)
    notes: list[str] = field(default_factory=list)  # --update: each turn's `error:` it added, dropped or changed


_BOTS: dict[str, Any] = {}  # per process: each bot is loaded once per run


def run_one(path: str, update: bool = False, record: bool = False, live: bool = False,
            locale: str | None = None) -> Outcome:
    """One transcript's outcome. Never raises: an unexpected exception (a chatrun bug, a
    handler calling sys.exit) is a failed outcome naming the file, so the run goes on."""
    try:
        return _run_one(path, update, record, live, locale)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported as this transcript's failure
        return crashed(path, exc)


def crashed(path: str, exc: BaseException) -> Outcome:
    return Outcome(path, False, f"{path}: running the transcript raised {type(exc).__name__}: {exc}")


def _run_one(path: str, update: bool, record: bool, live: bool = False, locale: str | None = None) -> Outcome:
    from chatrun.transcripts.format import load_transcript
    from chatrun.transcripts.judge import LIVE
    from chatrun.transcripts.run import run_transcript

    try:
        transcript = load_transcript(path)
    except BotError as exc:
        return Outcome(path, False, "\n".join(d.format() for d in exc.diagnostics), invalid=True)
    if locale is not None:  # `--locale`: the session speaks this locale, whatever the file's `locale:`
        transcript.locale = locale
    changed = False
    notes: list[str] = []
    roles_off = _roles_off(transcript)
    if live:
        try:
            result = run_transcript(transcript, _BOTS, LIVE)
        except ChatrunError as exc:  # the judge model failed
            return Outcome(path, False, f"{path}: {exc}", roles_off=roles_off)
        return Outcome(path, result.passed, result.report(), roles_off=roles_off, usage=result.usage)
    try:
        if record:
            from chatrun.transcripts.record import record_transcript, record_verdicts

            changed = record_transcript(transcript)
            changed = record_verdicts(load_transcript(path), _BOTS) or changed
            transcript = load_transcript(path)
        result = run_transcript(transcript, _BOTS)
        if update and result.error is None:
            from chatrun.transcripts.update import update_from_result

            if update_from_result(result, notes=notes):
                changed = True
                result = run_transcript(load_transcript(path), _BOTS)
    except BotError as exc:
        return Outcome(path, False, "\n".join(d.format() for d in exc.diagnostics), changed, invalid=True)
    except ChatrunError as exc:  # named at its place (`FILE:LINE: ...`), else at the file
        said = str(exc) if str(exc).startswith(f"{path}:") else f"{path}: {exc}"
        return Outcome(path, False, said, changed, roles_off=roles_off)
    return Outcome(path, result.passed, result.report(), changed, warnings=result.warnings, roles_off=roles_off,
                   usage=result.usage, notes=notes)


def _roles_off(transcript: Any) -> bool:
    from chatrun.transcripts.roles import roles_off

    return roles_off(transcript, _BOTS)


# -- -k expressions -------------------------------------------------------------------------------

_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def keyword_filter(expr: str) -> Any:
    """A predicate on transcript names from a pytest-like -k expression: words match as
    case-insensitive substrings, combined with and, or, not and parentheses."""
    tokens = _TOKEN.findall(expr)
    if not tokens:
        raise click.UsageError("-k needs an expression")

    def predicate(name: str) -> bool:
        lowered = name.lower()
        code = []
        for tok in tokens:
            if tok in ("and", "or", "not", "(", ")"):
                code.append(tok)
            else:
                code.append(str(tok.lower() in lowered))
        return bool(eval(" ".join(code), {"__builtins__": {}}, {}))  # only True/False/and/or/not/()

    try:
        predicate("")
    except SyntaxError:
        raise click.UsageError(f"-k: invalid expression {expr!r}") from None
    return predicate


# -- the command -----------------------------------------------------------------------------------


class _UsageError(click.UsageError):
    exit_code = EXIT_USAGE


class _UsageExits4(click.Command):
    """`chatrun test` exits as pytest does: 4 for a usage error, click's own (a bad option) too,
    which would exit 2, this command's "interrupted"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise _UsageError(exc.format_message(), exc.ctx) from None


@click.command("test", cls=_UsageExits4)
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("-k", "keyword", help="Only transcripts whose path matches: substrings with and/or/not, e.g. -k 'travel and not hotel'.")
@click.option("-x", "--exitfirst", is_flag=True, help="Stop at the first failing transcript.")
@click.option("-n", "workers", type=click.IntRange(min=1), default=1, show_default=True, help="Run in N processes.")
@click.option("-v", "--verbose", is_flag=True, help="One line per transcript with its name and its model calls' usage "
              "(tokens, cost with `prices:`), and a total.")
@click.option("--update", is_flag=True, help="Rewrite the expect: blocks from what happened (the rest of the file is kept).")
@click.option("--record", is_flag=True, help="Run against the bot's real model and write its answers into the model: lists "
              "(and the judge's verdicts into judged: lists).")
@click.option("--live", is_flag=True, help="Run against the bot's real model, comparing route, stack, state and events "
              "(not the model's text) and asking the judge; nothing is written.")
@click.option("--locale", "locale", metavar="TAG", help="Run every transcript in this locale (docs/i18n.md), "
              "instead of its own `locale:`.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run each transcript N times and print its pass rate (with --live: how flaky it is); "
              "not with --update or --record, which rewrite a transcript from one run.")
def test(paths: tuple[str, ...], keyword: str | None, exitfirst: bool, workers: int, verbose: bool,
         update: bool, record: bool, live: bool, repeat: int, locale: str | None) -> None:
    """Replay golden transcripts offline and check what each turn did.

    PATH is a transcript file or a directory searched for YAML files with `turns:`;
    without PATH: the bots/*/transcripts folders under the current directory.
    Prints a dot per transcript (F: failed, E: invalid), the failures with diffs, and a
    last line `N passed, N failed`.

    Exit status: 0 all passed, 1 some failed, 2 interrupted, 4 usage error, 5 no transcripts.

    \b
    Examples:
      chatrun test
      chatrun test bots/travel -k booking -v
      chatrun test -n 4
      chatrun test bots/travel/transcripts/flight_booking.yaml --update
      chatrun test -k flight --record
      chatrun test bots/travel --live --repeat 5
    """
    from chatrun.transcripts.format import discover

    _BOTS.clear()  # bots may have changed since an earlier run in this process
    try:
        found = discover(list(paths))
        missing = [p for p in found if not _exists(p)]
        if missing:
            click.echo(f"error: no such transcript: {', '.join(missing)}. {how_to_get_a_bot(missing[0])}", err=True)
            sys.exit(EXIT_USAGE)
        if keyword:
            keep = keyword_filter(keyword)
            found = [p for p in found if keep(p)]
    except click.UsageError as exc:
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(EXIT_USAGE)
    if not found:
        where = " ".join(paths) or "bots/*/transcripts"
        click.echo(f"no transcripts found ({where}{', -k ' + keyword if keyword else ''})")
        if not paths:
            click.echo("(`chatrun examples` lists the example bots, each with its transcripts: "
                       "`chatrun init --example NAME` copies one here)")
        click.echo("0 passed, 0 failed")
        sys.exit(EXIT_NONE)
    if (update or record) and live:
        click.echo("error: --live runs against the real model and writes nothing; drop --update/--record", err=True)
        sys.exit(EXIT_USAGE)
    if (update or record) and repeat > 1:  # N runs of one file would each rewrite it, at once with -n
        click.echo("error: --repeat runs each transcript N times to measure it, and --update/--record rewrite "
                   "it from one run; use one or the other", err=True)
        sys.exit(EXIT_USAGE)
    if locale is not None:
        problems = _locale_problems(found, locale)
        if problems:
            for problem in problems:
                click.echo(f"error: {problem}", err=True)
            sys.exit(EXIT_USAGE)
    if record and workers > 1:
        workers = 1  # recording talks to a real model: one conversation at a time
    found = [path for path in found for _ in range(repeat)]
    outcomes: list[Outcome] = []
    interrupted = False
    try:
        for outcome in _run(found, workers, exitfirst, update, record, live, locale):
            outcomes.append(outcome)
            _progress(outcome, verbose)
    except KeyboardInterrupt:
        interrupted = True
    if not verbose:
        click.echo()
    _roles_note(outcomes)
    if repeat > 1:
        _pass_rates(outcomes)
        outcomes = _first_failure_each(outcomes)
    _summary(outcomes, update or record, verbose)
    if interrupted:
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(EXIT_OK if all(o.passed for o in outcomes) else EXIT_FAILED)


def _locale_problems(found: list[str], locale: str) -> list[str]:
    """`--locale TAG` must name a locale each transcript's bot declares (exactly or by
    language): a tag none matches would quietly run in the default locale. A transcript's own
    `locale:` is what a client asks for, so it may fall back; `--locale` is the author's choice.
    One problem per bot; an invalid transcript or bot is left to the run, which reports it."""
    from chatrun.transcripts.format import load_transcript
    from chatrun.transcripts.run import pick_versions

    problems: dict[str, str] = {}
    for path in dict.fromkeys(found):
        try:
            transcript = load_transcript(path)
            bot, _ = pick_versions(transcript, _BOTS)
        except ChatrunError:
            continue
        shown = _shown_path(transcript.bot_path)
        catalogs = bot.config.catalogs
        if shown in problems or (catalogs is not None and catalogs.matching(locale) is not None):
            continue
        problems[shown] = (f"--locale {locale}: {shown} declares "
                           + (", ".join(catalogs.locales) if catalogs is not None else "no `locales:` (docs/i18n.md)"))
    return list(problems.values())


def _shown_path(path: Any) -> str:
    """A bot's folder as the author would type it: relative to the current directory when inside it."""
    from pathlib import Path

    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _exists(path: str) -> bool:
    from pathlib import Path

    return Path(path).exists()


def _run(found: list[str], workers: int, exitfirst: bool, update: bool, record: bool, live: bool = False,
         locale: str | None = None) -> Any:
    if workers == 1:
        for path in found:
            outcome = run_one(path, update, record, live, locale)
            yield outcome
            if exitfirst and not outcome.passed:
                return
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        # Submit in chunks so -x stops soon and 10,000 transcripts do not make 10,000 futures at once.
        pending: dict[Future[Outcome], str] = {}
        queue = list(reversed(found))
        stop = False
        while (queue or pending) and not stop:
            while queue and len(pending) < workers * 4:
                path = queue.pop()
                try:
                    pending[pool.submit(run_one, path, update, record, live, locale)] = path
                except BrokenProcessPool as exc:  # a worker died (os._exit, a crash): no more runs
                    yield crashed(path, exc)
            if not pending:
                continue
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                path = pending.pop(future)
                try:
                    outcome = future.result()
                except (Exception, SystemExit) as exc:  # e.g. the worker died (BrokenProcessPool)
                    outcome = crashed(path, exc)
                yield outcome
                if exitfirst and not outcome.passed:
                    stop = True
        for future in pending:
            future.cancel()


def _progress(outcome: Outcome, verbose: bool) -> None:
    mark = "." if outcome.passed else ("E" if outcome.invalid else "F")
    if verbose:
        status = "PASSED" if outcome.passed else ("INVALID" if outcome.invalid else "FAILED")
        click.echo(f"{outcome.name} {status}{' (updated)' if outcome.updated else ''}")
        if outcome.usage is not None:
            from chatrun.cli._usage import calls_text, tokens_text

            click.echo(f"  usage ({calls_text(outcome.usage.get('calls', 0))}): {tokens_text(outcome.usage)}")
    else:
        click.echo(mark, nl=False)


def _usage_total(outcomes: list[Outcome]) -> None:
    """-v: every run's model calls, summed (scripted answers are counted, so estimated)."""
    from chatrun.cli._usage import calls_text, tokens_text
    from chatrun.engine.usage import Usage

    total = Usage()
    for o in outcomes:
        if o.usage is not None:
            total.add(Usage.from_dict(o.usage))
    click.echo(f"usage ({calls_text(total.calls)}): {tokens_text(total.to_dict())}")


def _roles_note(outcomes: list[Outcome]) -> None:
    """Said once: transcripts without `roles:` run with role checks off."""
    from chatrun.transcripts.roles import roles_off_note

    note = roles_off_note([o.name for o in outcomes if o.roles_off])
    if note:
        click.echo(note)


def _pass_rates(outcomes: list[Outcome]) -> None:
    """One line per transcript: how many of its runs passed."""
    runs: dict[str, list[bool]] = {}
    for o in outcomes:
        runs.setdefault(o.name, []).append(o.passed)
    click.echo("pass rates:")
    for name, passed in runs.items():
        click.echo(f"  {name}: {sum(passed)}/{len(passed)} passed ({100 * sum(passed) // len(passed)}%)")


def _first_failure_each(outcomes: list[Outcome]) -> list[Outcome]:
    """One outcome per transcript for the summary: its first failed run, else its first run."""
    chosen: dict[str, Outcome] = {}
    for o in outcomes:
        if o.name not in chosen or (chosen[o.name].passed and not o.passed):
            chosen[o.name] = o
    return list(chosen.values())


def _summary(outcomes: list[Outcome], rewriting: bool, usage: bool = False) -> None:
    failed = [o for o in outcomes if not o.passed]
    if rewriting:
        for o in outcomes:
            if o.updated:
                click.echo(f"updated {o.name}")
                for note in o.notes:  # a turn's expected error changed: a behaviour change, said
                    click.echo(f"  {note}")
    if failed:
        click.echo()
        click.echo("=" * 30 + " FAILURES " + "=" * 30)
        for o in failed:
            click.echo(f"___ {o.name} ___")
            click.echo(o.report)
            click.echo()
    warnings = [w for o in outcomes for w in o.warnings]
    if warnings:
        click.echo()
        for warning in warnings:
            click.echo(warning)
    if usage:
        _usage_total(outcomes)
    passed = len(outcomes) - len(failed)
    click.echo(f"{passed} passed, {len(failed)} failed")  # last, as pytest's
