"""`chatrun simulate [PATH...]`: scenarios played by a simulated user, N trials each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from chatrun.cli._output import fail


@click.command("simulate")
@click.argument("paths", nargs=-1, type=click.Path(exists=True))
@click.option("--trials", type=click.IntRange(min=1), default=None,
              help="Trials per scenario (default: each scenario's `trials`).")
@click.option("--junit", "junit", type=click.Path(dir_okay=False), default=None,
              help="Write a JUnit XML report here (one test case per scenario).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the verdicts as JSON here (`-`: stdout, which then holds the JSON alone; "
                   "the progress goes to stderr).")
@click.option("--record", "record_dir", type=click.Path(file_okay=False), default=None,
              help="Write each trial as a golden transcript into this folder: it replays the trial offline and keeps "
                   "the scenario's criteria, so a failed trial's recording fails under `chatrun test`.")
def simulate(paths: tuple[str, ...], trials: int | None, junit: str | None, json_path: str | None,
             record_dir: str | None) -> None:
    """Play scenarios with a simulated user and report each one's pass rate.

    PATH is a scenario file, a folder of them, or a bot's folder holding scenarios/ (default:
    bots/*/scenarios/). Each trial is a conversation between the scenario's simulated user (its
    persona and goal, answered by `user_model`) and the bot (its own model; for a bot in
    versions, the scenario's `version:` or the primary); a scenario's `script:` plays either side from a
    list instead, so it can run with no model. A trial passes when the conversation meets the
    scenario's `success` criteria. A scenario passes when its pass rate reaches its
    `threshold`; the rate is shown with its 95% Wilson interval. Exit status 0 when every
    scenario passes, 1 otherwise.

    \b
    Examples:
      chatrun simulate bots/travel/scenarios --trials 20 --junit simulate.xml
      chatrun simulate book_flight.yaml --record recorded/
    """
    from chatrun.transcripts.scenario import junit_xml
    from chatrun.transcripts.scenario import simulate as run_scenario

    # With `--json -` stdout is the JSON alone (a pipe into jq reads it): the rest goes to stderr.
    aside = json_path == "-"
    try:
        files = _scenario_files(paths)
        outcomes = []
        for file in files:
            outcome = run_scenario(file, trials, on_trial=lambda trial: _progress(trial, aside),
                                   keep=_recorder(Path(record_dir)) if record_dir else None)
            click.echo("", err=aside)
            click.echo(_line(outcome), err=aside)
            outcomes.append(outcome)
        if junit:
            Path(junit).write_text(junit_xml(outcomes), encoding="utf-8")
        if json_path:
            data = json.dumps({"ok": all(o.ok for o in outcomes), "scenarios": [o.to_dict() for o in outcomes]},
                              indent=2, ensure_ascii=False)
            click.echo(data) if json_path == "-" else Path(json_path).write_text(data + "\n", encoding="utf-8")
    except Exception as exc:  # never a traceback from the CLI
        fail(exc)
    failed = sum(not o.ok for o in outcomes)
    click.echo(f"{len(outcomes) - failed} scenario{'s' if len(outcomes) - failed != 1 else ''} passed, {failed} failed",
               err=aside)
    if failed:
        raise click.exceptions.Exit(1)


def _scenario_files(paths: tuple[str, ...]) -> list[str]:
    from chatrun.errors import ChatrunError

    roots = [Path(p) for p in paths] or sorted(Path("bots").glob("*/scenarios"))
    files = []
    for root in roots:
        if root.is_dir() and not any(root.glob("*.yaml")) and (root / "scenarios").is_dir():
            root = root / "scenarios"  # a bot's folder (one in versions too): its scenarios
        files += sorted(str(f) for f in root.glob("*.yaml")) if root.is_dir() else [str(root)]
    if not files:
        raise ChatrunError("no scenarios found (give files or folders, or put them in bots/*/scenarios/)")
    return files


def _progress(trial: Any, aside: bool) -> None:
    click.echo("." if trial.passed else "F", nl=False, err=aside)


def _line(outcome: Any) -> str:
    if outcome.error is not None:
        return f"{outcome.error}\n{outcome.scenario}: could not run"
    low, high = outcome.interval
    verdict = "ok" if outcome.ok else "FAILED"
    lines = [f"{outcome.scenario}: {outcome.passed_trials}/{len(outcome.trials)} trials passed "
             f"({outcome.rate:.0%}, 95% CI {low:.0%}-{high:.0%}), threshold {outcome.threshold:.0%}: {verdict}"]
    lines += [f"  trial {t.number}: {p}" for t in outcome.trials for p in t.problems]
    return "\n".join(lines)


def _recorder(folder: Path) -> Any:
    """Keeps each trial (one that said anything) as a transcript in `folder`."""
    from chatrun.transcripts.from_session import write_transcript
    from chatrun.transcripts.scenario import trial_transcript

    def keep(scenario: Any, bot: Any, trial: Any) -> None:
        if not trial.history:
            return
        path = folder / f"{Path(scenario.file).stem}.trial{trial.number}.yaml"
        write_transcript(trial_transcript(scenario, bot, trial, folder), path, trial.session_id,
                         f"scenario {scenario.file}")

    return keep
