"""Scenarios (`chatrun simulate`): a simulated user with a persona and a goal talks to a bot,
N trials; each trial passes when the conversation meets the scenario's success criteria.

Exact criteria are checked on what the conversation did: the route and stack it ended on, its
state, and — as subsequences (these items in this order, others may come between) — the
routes it went through (`path`), its tool calls (`calls`) and the user's events (`events`).
Judged criteria (`judge`) are scored by the transcripts' judge on the whole conversation.
Either side can be scripted (`script: {bot, user}`), so a scenario runs with no model at all.
A trial recorded as a transcript (`trial_transcript`) replays to what happened and keeps the
criteria (`success:`, `judge: conversation:`), so a failed trial's recording fails too.
The pass rate of the trials is reported with a Wilson score interval; a scenario passes when
its rate reaches its `threshold`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from chatrun import events as ev
from chatrun.definition.schemas import load_schema
from chatrun.definition.sources import wrong_file
from chatrun.definition.yamlpos import read_yaml_file
from chatrun.errors import BotError, ChatrunError, Diagnostic
from chatrun.messages import AssistantMessage, Message, SystemMessage, UserMessage
from chatrun.models.base import ModelRequest
from chatrun.transcripts.expect import _shaped_call, match, resolve
from chatrun.transcripts.judge import criteria, reply_text
from chatrun.transcripts.mocks import TranscriptMocks

SCHEMA = "scenario.schema.json"
DONE = "DONE"
USER_PROMPT = """\
You are role-playing a user talking to a chatbot, to test it. Stay in character.

Who you are: {persona}
What you want: {goal}

Write only what this user would type next: one short message, no quotes, no narration.
When your goal is reached, or the bot clearly cannot help, answer with exactly {done}."""


@dataclass
class Scenario:
    file: str
    bot: str
    persona: str
    goal: str
    success: dict[str, Any]
    route: str | None = None
    state: dict[str, Any] | None = None
    opening: str | None = None
    user_model: dict[str, Any] = field(default_factory=dict)
    max_turns: int = 8
    trials: int = 5
    threshold: float = 1.0
    mocks: list[dict[str, Any]] = field(default_factory=list)
    judge: dict[str, Any] | None = None
    script: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # scripted sides: bot, user
    principal: dict[str, Any] | None = None  # who is signed in, as a transcript's `principal:`
    clock: str | dict[str, Any] | None = None  # `clock:`: the pinned instant, or {at, advance}
    locale: str | None = None  # `locale:`: what the simulated user's client asks for
    version: str | None = None  # `version:`: the bot version the trials talk to (None: the primary)
    lines: dict[str, int] = field(default_factory=dict)

    @property
    def bot_path(self) -> Path:
        return Path(os.path.abspath(Path(self.file).parent / self.bot))


def _json_kind(value: Any) -> str:
    return "a list" if isinstance(value, list) else "a string" if isinstance(value, str) else f"`{value}`"


def load_scenario(path: str | Path) -> Scenario:
    """A scenario file, checked against schemas/scenario.schema.json; BotError naming each
    problem's file:line otherwise."""
    doc = read_yaml_file(Path(path))  # not UTF-8: named by its line, as a bot's file is
    if doc.diagnostics:
        raise BotError(doc.diagnostics)
    other = wrong_file(str(path), doc.data, "scenario")
    if other is not None:  # a bot or transcript given for a scenario: not its schema errors
        raise BotError([other])
    if not isinstance(doc.data, dict):  # the schema's words would call it "the transcript"
        raise BotError([Diagnostic(str(path), 1, 1, "error", "the scenario is empty; it needs `bot:`, `persona:`, "
                                   "`goal:` and `success:`" if doc.data is None else "the scenario must be a mapping "
                                   f"(`bot:`, `persona:`, `goal:`, `success:`), not {_json_kind(doc.data)}")])
    from chatrun.transcripts.format import clock_diagnostics, schema_diagnostics, version_label

    problems = schema_diagnostics(doc, Draft202012Validator(load_schema(SCHEMA)))
    problems = problems or clock_diagnostics(doc)  # its instants and durations, read as transcripts read them
    if problems:
        raise BotError(problems)
    data = doc.data
    return Scenario(
        file=str(path), bot=data["bot"], persona=data["persona"], goal=data["goal"], success=data["success"],
        route=data.get("route"), state=data.get("state"), opening=data.get("opening"),
        user_model=dict(data.get("user_model") or {}), max_turns=int(data.get("max_turns", 8)),
        trials=int(data.get("trials", 5)), threshold=float(data.get("threshold", 1.0)),
        mocks=list(data.get("mocks") or []), judge=data.get("judge"), script=dict(data.get("script") or {}),
        principal=data.get("principal"), clock=data.get("clock"), locale=data.get("locale"),
        version=version_label(data.get("version")), lines={key: doc.pos((key,)).line for key in data},
    )


# -- one trial -----------------------------------------------------------------------------------


@dataclass
class Trial:
    """One simulated conversation: what was said, what the bot did, and what failed."""

    number: int
    said: list[tuple[str, str]] = field(default_factory=list)  # (user, bot's reply) per turn
    turn_events: list[list[dict[str, Any]]] = field(default_factory=list)  # the user's events, per turn
    path: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    route: str = ""
    stack: list[str] = field(default_factory=list)
    visible: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    session_id: str = ""
    problems: list[str] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)  # the judge's, as a transcript's `judged:`
    mocked: set[str] = field(default_factory=set)  # the tools a scenario mock answered

    @property
    def passed(self) -> bool:
        return not self.problems

    def text(self) -> str:
        """What the judge reads: the same text as a transcript's conversation criteria, so a
        recorded trial's verdicts replay (their digests match)."""
        return "\n".join(reply_text(user, events) for (user, _), events in zip(self.said, self.turn_events, strict=True))


async def play(scenario: Scenario, bot: Any, number: int) -> Trial:
    """One trial: the simulated user and the bot take turns until the user says DONE, the
    conversation ends, or `max_turns` turns have run."""
    from chatrun.models import ModelPool
    from chatrun.models.scripted import ScriptedModel
    from chatrun.store.memory import InMemoryStore
    from chatrun.transcripts.setting import advance_clock, pin_clock

    pool = ModelPool()  # the bot's model and the simulated user's, closed on this loop
    scripted = {side: ScriptedModel(scenario.script[side]) for side in ("bot", "user") if side in scenario.script}
    answers, user = scripted.get("bot") or pool.model(), scripted.get("user") or pool.model()
    session = bot.session(route=scenario.route, store=InMemoryStore(), state=scenario.state, model=answers,
                          principal=scenario.principal,
                          meta={"locale": scenario.locale} if scenario.locale else None)
    if scenario.clock is not None:
        pin_clock(session, scenario.clock)  # from `at` again in every trial
    mocks = ScenarioMocks(scenario.mocks, live=True, file=scenario.file)
    session.tool_mocks = mocks
    config = bot.config.model.merged({**scenario.user_model, "stream": False})
    trial = Trial(number, session_id=session.id)
    trial.path = [session.route]
    try:
        for turn in range(scenario.max_turns):
            said = scenario.opening if turn == 0 and scenario.opening else \
                await _user_says(user, config, scenario, trial.said)
            if said.strip() == DONE:
                break
            try:
                events = await session.achat(said)
            finally:
                advance_clock(session)  # a pinned clock's `advance`, as between a transcript's turns
            trial.turn_events.append(_take(trial, events))
            trial.said.append((said, _reply(events)))
            if session.ended is not None:
                break
        trial.route, trial.stack = session.route, list(session.stack)
        trial.visible = json.loads(json.dumps(session.visible_state(), default=str))
        trial.history = list(session.history)
        trial.mocked = mocks.answered
    finally:
        session.close()
        await bot.tools.aclose()  # this loop's HTTP connections and MCP servers
        for model in (answers, user, pool):
            if hasattr(model, "aclose"):
                await model.aclose()
    return trial


async def _user_says(user: Any, config: Any, scenario: Scenario, said: list[tuple[str, str]]) -> str:
    """The simulated user's next message: the bot's replies are its `user` messages, its own
    lines its `assistant` ones (it is the model here). A scripted user that has said all its
    lines is done."""
    if getattr(user, "remaining", None) == 0:
        return DONE
    messages: list[Message] = [SystemMessage(USER_PROMPT.format(persona=scenario.persona, goal=scenario.goal,
                                                                 done=DONE))]
    if not said:
        messages.append(UserMessage("(The conversation starts. Write your first message.)"))
    for mine, reply in said:
        messages += [AssistantMessage(mine), UserMessage(reply or "(the bot said nothing)")]
    response = await user.complete(ModelRequest(messages, [], config, "simulated-user"))
    return (response.text or DONE).strip()


class ScenarioMocks(TranscriptMocks):
    """A scenario's `mocks:`, noting which tools a mock answered: their calls become mocks
    of the recorded transcript whatever their kind, so its replay gets what the trial got."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answered: set[str] = set()

    def lookup(self, tool: Any, args: dict[str, Any]) -> Any:
        mocked = super().lookup(tool, args)
        if mocked is not None:
            self.answered.add(tool.name)
        return mocked


def _take(trial: Trial, events: list[Any]) -> list[dict[str, Any]]:
    """The turn's events the user receives (kept in `trial.events` too), as transcripts show them."""
    taken = []
    for e in events:
        if e.type == ev.STREAM or e.audience != ev.USER:
            continue
        taken.append({e.type: e.data})
        if e.type == ev.ROUTE_CHANGED and isinstance(e.data, dict):
            trial.path.append(e.data["route"])
    trial.events += taken
    return taken


def _reply(events: list[Any]) -> str:
    parts = [e.data if isinstance(e.data, str) else json.dumps(e.data, ensure_ascii=False)
             for e in events if e.type in (ev.MESSAGE, ev.OBJECT)]
    return "\n".join(parts)


# -- success criteria ----------------------------------------------------------------------------


def check(scenario: Scenario, trial: Trial, judge: Any) -> None:
    """Fill `trial.problems` with each success criterion the trial does not meet (and
    `trial.verdicts` with the judge's verdicts)."""
    trial.calls = [c for entry in trial.history for c in entry.get("calls") or []]
    trial.problems += [problem for _key, problem in exact_problems(scenario.success, trial)]
    for criterion in criteria(scenario.success.get("judge")):
        judged = judge.judge(criterion, trial.text(), [], 0)
        if judged.verdict is not None:
            trial.verdicts.append(judged.verdict.to_dict())
        if not judged.passed:
            trial.problems.append(judged.problem)


def exact_problems(success: dict[str, Any], trial: Trial) -> list[tuple[str, str]]:
    """(criterion, problem) for each exact criterion of `success` the conversation does not
    meet: the one rule for scenarios and for a transcript's `success:`."""
    problems: list[tuple[str, str]] = []
    for key in ("route", "stack"):
        if key in success and not match(success[key], getattr(trial, key)):
            problems.append((key, f"{key}: expected {_shown(success[key])}, ended with {_shown(getattr(trial, key))}"))
    for path, wanted in (success.get("state") or {}).items():
        actual = resolve(trial.visible, path)
        if not match(wanted, actual):
            problems.append(("state", f"state {path}: expected {_shown(wanted)}, got {_shown(actual)}"))
    shape: dict[str, Callable[[Any, Any], Any]] = {
        "path": lambda actual, wanted: actual,
        "events": lambda actual, wanted: actual,
        "calls": _shaped_call,
    }
    for key, shaped in shape.items():
        if key in success:
            missing = first_missing(success[key], getattr(trial, key), shaped)
            if missing is not None:
                problems.append((key, f"{key}: no {_shown(missing)} after the ones before it "
                                      f"(the conversation's {key}: {_shown(_summary(key, getattr(trial, key)))})"))
    return problems


def first_missing(wanted: list[Any], actual: list[Any], shaped: Callable[[Any, Any], Any]) -> Any:
    """The first item of `wanted` not found, in order, in `actual` (None: all were)."""
    at = 0
    for item in wanted:
        while at < len(actual) and not match(item, shaped(actual[at], item)):
            at += 1
        if at == len(actual):
            return item
        at += 1
    return None


def _summary(key: str, items: list[Any]) -> Any:
    return [c.get("tool") for c in items] if key == "calls" else items


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


# -- a trial as a transcript ----------------------------------------------------------------------


def trial_transcript(scenario: Scenario, bot: Any, trial: Trial, folder: Path) -> dict[str, Any]:
    """A trial as a golden transcript (plain data) for `folder`: its turns replay to what
    happened — the simulated user's messages, the bot's model answers, every call an outside
    tool or a scenario mock answered as a mock, what happened as each turn's expectations — and
    the scenario's criteria are kept (`success:`, judged ones as `judge: conversation:` with
    the trial's verdicts), so the recording of a failed trial fails where the trial did."""
    from chatrun.toolkinds import outside
    from chatrun.transcripts.from_session import StoredSession, bot_reference, transcript_of

    def replayed_as_mock(name: str) -> bool:
        tool = bot.config.tools.get(name)
        return tool is None or outside(tool) is not None or name in trial.mocked

    stored = StoredSession(trial.session_id, bot.name, trial.history)
    doc = transcript_of(stored, bot.config, bot_reference(scenario.bot_path, folder), replayed_as_mock)
    outcome = "passed" if trial.passed else "failed: " + "; ".join(trial.problems)
    doc["description"] = f"Trial {trial.number} of scenario {scenario.file} ({outcome})."
    turns = doc.pop("turns")
    doc.update(_session_settings(scenario, turns))
    exact = {key: value for key, value in scenario.success.items() if key != "judge"}
    if exact:
        doc["success"] = exact
    judged = criteria(scenario.success.get("judge"))
    if judged:
        doc["judge"] = {**(scenario.judge or {}), "conversation": judged}
        turns[-1]["judged"] = trial.verdicts
    doc["turns"] = turns
    return doc


def _session_settings(scenario: Scenario, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """What the trial's session started with, as the transcript's keys: who is signed in, the
    locale, the version, and the pinned clock (then the turns' own wall-clock instants go: the
    replay runs on the scenario's clock, moved on after every turn as the trial's was)."""
    settings = {key: getattr(scenario, key) for key in ("principal", "locale", "version", "clock")
                if getattr(scenario, key) is not None}
    if scenario.clock is not None:
        for turn in turns:
            turn.pop("clock", None)
    return settings


# -- many trials ---------------------------------------------------------------------------------


def wilson(passed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a pass rate (95% with z = 1.96): honest for few trials
    and for rates near 0 or 1, where the normal approximation is not."""
    if n == 0:
        return 0.0, 1.0
    p = passed / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class Outcome:
    """A scenario's trials and verdict (`error`: it could not run)."""

    scenario: str
    trials: list[Trial] = field(default_factory=list)
    threshold: float = 1.0
    error: str | None = None

    @property
    def passed_trials(self) -> int:
        return sum(t.passed for t in self.trials)

    @property
    def rate(self) -> float:
        return self.passed_trials / len(self.trials) if self.trials else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.passed_trials, len(self.trials))

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.trials) and self.rate >= self.threshold - 1e-9

    def to_dict(self) -> dict[str, Any]:
        low, high = self.interval
        return {"scenario": self.scenario, "ok": self.ok, "trials": len(self.trials), "passed": self.passed_trials,
                "pass_rate": round(self.rate, 4), "interval": [round(low, 4), round(high, 4)],
                "confidence": 0.95, "threshold": self.threshold, "error": self.error,
                "failures": [{"trial": t.number, "problems": t.problems, "turns": len(t.said)}
                             for t in self.trials if not t.passed]}


def simulate(path: str, trials: int | None = None, on_trial: Callable[[Trial], None] | None = None,
             keep: Callable[[Scenario, Any, Trial], None] | None = None) -> Outcome:
    """Run a scenario file's trials (`trials` overrides its own count). Never raises for a bad
    scenario or bot: the Outcome's `error` says what is wrong, naming file:line."""
    from chatrun.transcripts.judge import LIVE, Judge
    from chatrun.transcripts.setting import VersionProblem

    try:
        scenario = load_scenario(path)
        bot = scenario_bot(scenario)
    except VersionProblem as exc:  # it names the scenario's line
        return Outcome(path, error=str(exc))
    except BotError as exc:
        return Outcome(path, error="\n".join(d.format() for d in exc.diagnostics))
    except ChatrunError as exc:
        return Outcome(path, error=f"{path}:1: {exc}")
    from chatrun.definition.config import initial_state_problem

    problem = initial_state_problem(scenario.state or {}, bot.config.state)
    if problem is not None:  # the HTTP API's rule, as for transcripts
        return Outcome(path, error=f"{path}:{scenario.lines.get('state', 1)}: {problem[1]}")
    outcome = Outcome(path, threshold=scenario.threshold)
    judge = Judge(scenario.judge, bot.config.model, LIVE)
    try:
        for number in range(1, (trials or scenario.trials) + 1):
            try:
                trial = asyncio.run(play(scenario, bot, number))
            except ChatrunError as exc:
                trial = Trial(number, problems=[f"the trial could not run: {exc}"])
            else:
                check(scenario, trial, judge)
                if keep is not None:
                    keep(scenario, bot, trial)
            outcome.trials.append(trial)
            if on_trial is not None:
                on_trial(trial)
    finally:
        judge.close()
    return outcome


def scenario_bot(scenario: Scenario) -> Any:
    """The bot the trials talk to: for a bot in several versions (docs/versions.md) the one
    `version:` names, else the primary (the version new sessions start on); `scenario.version`
    becomes its label, which a recorded trial names so its replay runs on the same version."""
    from chatrun.definition.versions import version_layout
    from chatrun.engine.bot import load_bot
    from chatrun.transcripts.setting import version_index, versions_at

    layout = version_layout(scenario.bot_path)
    if scenario.version is None and layout is None:
        return load_bot(str(scenario.bot_path))
    versions = versions_at(scenario.bot_path)
    if scenario.version is None:
        assert layout is not None
        scenario.version = layout.primary
        return dict(versions)[scenario.version]
    at = version_index(versions, scenario.version, f"{scenario.file}:{scenario.lines.get('version', 1)}: `version:`",
                       scenario.bot)
    scenario.version = versions[at][0]
    return versions[at][1]


def junit_xml(outcomes: list[Outcome]) -> str:
    """One <testsuite>, one <testcase> per scenario; a scenario under its threshold is a failure."""
    from xml.sax.saxutils import escape, quoteattr

    failures = sum(not o.ok for o in outcomes)
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             f'<testsuite name="chatrun simulate" tests="{len(outcomes)}" failures="{failures}">']
    for o in outcomes:
        low, high = o.interval
        lines.append(f'  <testcase classname="scenarios" name={quoteattr(o.scenario)}>')
        summary = (f"{o.passed_trials}/{len(o.trials)} trials passed ({o.rate:.0%}; 95% CI {low:.0%}-{high:.0%}), "
                   f"threshold {o.threshold:.0%}")
        if not o.ok:
            detail = o.error or "\n".join(f"trial {t.number}: {p}" for t in o.trials for p in t.problems)
            lines.append(f"    <failure message={quoteattr(o.error or summary)}>{escape(detail)}</failure>")
        lines.append(f"    <system-out>{escape(summary)}</system-out>")
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    return "\n".join(lines) + "\n"
