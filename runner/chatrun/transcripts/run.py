"""Running a transcript against its bot, offline: each turn's `model:` list answers the
model calls of that turn (a scripted model), the session lives in a fresh in-memory
store, and what the turn did is compared with its `expect:` block."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chatrun.definition.config import ModelConfig
from chatrun.engine.clock import FixedClock, parse_duration, parse_instant
from chatrun.engine.pending import Answer, Approve, Expire, OperatorSay, Reject, Release, TakeOver
from chatrun.errors import (
    AttachmentRefused,
    BotError,
    ChatrunError,
    DecisionRefused,
    HeldByAnother,
    InvalidDecision,
    NotPending,
    SessionError,
    UnknownRouteError,
)
from chatrun.models import ModelPool
from chatrun.models.base import ChunkCallback, ModelRequest, ModelResponse, ModerationResult
from chatrun.models.fallback import Breakers
from chatrun.models.scripted import ScriptedModel
from chatrun.testing.unruly import Unruly
from chatrun.transcripts.expect import Mismatch, Observed, compare, compare_live, observe
from chatrun.transcripts.format import Transcript, TurnSpec, load_transcript
from chatrun.transcripts.judge import LIVE, REPLAY, Judge, criteria, reply_text
from chatrun.transcripts.mocks import TranscriptMocks
from chatrun.transcripts.setting import (
    VersionProblem,
    advance_clock,
    load_bot_cached,
    pin_clock,
    version_index,
    versions_at,
)


class TurnScript:
    """The session's model: answers from the current turn's script, which is swapped per turn
    so that leftovers and shortfalls are counted per turn."""

    def __init__(self) -> None:
        self.current = ScriptedModel()
        self.breakers = Breakers()  # `model.breaker:` across the transcript's turns (models/fallback.py)

    def next_turn(self, turn: TurnSpec) -> None:
        self.current = ScriptedModel(scripted_responses(turn))

    async def complete(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> ModelResponse:
        return await self.current.complete(request, on_chunk)


class LiveModel:
    """`chatrun test --live`: the bot's real model answers; the requests are kept per turn."""

    def __init__(self) -> None:
        self._pool = ModelPool()
        self._model = self._pool.model()
        self.breakers = self._pool.breakers
        self.requests: list[ModelRequest] = []
        self.remaining = 0

    @property
    def current(self) -> LiveModel:
        return self

    def next_turn(self, turn: TurnSpec) -> None:
        self.requests = []

    async def complete(self, request: ModelRequest, on_chunk: ChunkCallback | None = None) -> ModelResponse:
        self.requests.append(request)
        return await self._model.complete(request, on_chunk)

    async def moderate(self, config: ModelConfig, model: str, text: str) -> ModerationResult | None:
        """A `moderation` guardrail asks the real endpoint too (a replay's script has none)."""
        return await self._model.moderate(config, model, text)

    async def aclose(self) -> None:
        await self._model.aclose()
        await self._pool.aclose()


def scripted_responses(turn: TurnSpec) -> list[dict[str, Any] | Unruly]:
    """The turn's `model:` list, with tool call ids the transcript leaves out made unique
    across the whole conversation (call_<turn>_<n>), as a real model's are. An `unruly:`
    answer is made when the model is called, from its request; its calls are
    call_<turn>_u<item>_<n>."""
    out: list[dict[str, Any] | Unruly] = []
    n = 0
    for item, response in enumerate(turn.model, start=1):
        if "unruly" in response:
            out.append(Unruly.from_item(response, id_prefix=f"call_{turn.index}_u{item}_"))
            continue
        response = dict(response)
        if response.get("tool_calls"):
            calls = []
            for call in response["tool_calls"]:
                n += 1
                calls.append(call if call.get("id") else {**call, "id": f"call_{turn.index}_{n}"})
            response["tool_calls"] = calls
        out.append(response)
    return out


@dataclass
class TurnResult:
    turn: TurnSpec
    observed: Observed | None
    problems: list[Mismatch] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class Result:
    """The outcome of one transcript. `error` is a problem that kept it from running at all."""

    name: str
    turns: list[TurnResult] = field(default_factory=list)
    error: str | None = None
    transcript: Transcript | None = None
    notes: list[str] = field(default_factory=list)  # warnings about the transcript itself
    usage: dict[str, Any] | None = None  # the session's model calls, summed (Session.usage)
    tokenizer: str | None = None  # the token counter its windows counted with (Session.counting_tokenizer)

    @property
    def warnings(self) -> list[str]:
        """What passes but probably does not test what the author meant (`chatrun test` prints them)."""
        return self.notes + [w for t in self.turns for w in t.warnings]
    verdicts: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # judged (record mode), per turn

    @property
    def passed(self) -> bool:
        return self.error is None and not any(t.problems for t in self.turns)

    @property
    def failed_turns(self) -> list[TurnResult]:
        return [t for t in self.turns if t.problems]

    def report(self) -> str:
        """What a failure prints: the first failing turn in full, with diffs."""
        if self.error is not None:
            return self.error
        failed = self.failed_turns
        if not failed:
            return ""
        first = failed[0]
        where = f"turn {first.turn.index} ({self.name}:{first.turn.line})"
        lines = [f"{where}: {p.format()}" for p in first.problems]
        later = [str(t.turn.index) for t in failed[1:]]
        if later:
            lines.append(f"(turn{'s' if len(later) > 1 else ''} {', '.join(later)} failed too; "
                         "they may follow from this one)")
        return "\n".join(lines)


def run_transcript(transcript: Transcript | str, bots: dict[str, Any] | None = None, mode: str = REPLAY) -> Result:
    """Run one transcript (a loaded Transcript or a path). Never raises for a failing or
    invalid transcript: the Result says what went wrong. `bots` caches loaded bots by path.

    mode: "replay" (the transcript's model answers and judge verdicts, offline), "record"
    (replayed answers, the judge asked: Result.verdicts), or "live" (the bot's real model
    and the judge asked; route, stack, state and events compared, not exact text)."""
    if not isinstance(transcript, Transcript):
        try:
            transcript = load_transcript(transcript)
        except BotError as exc:
            return Result(str(transcript), error="invalid transcript:\n" + "\n".join(d.format() for d in exc.diagnostics))
    t = transcript
    result = Result(t.name, transcript=t)
    try:
        bot, upgrades = pick_versions(t, bots)
    except VersionProblem as exc:
        result.error = str(exc)
        return result
    except BotError as exc:
        result.error = f"{t.name}:{t.lines.get('bot', 1)}: bot {t.bot} is invalid:\n" + "\n".join(d.format() for d in exc.diagnostics)
        return result
    except ChatrunError as exc:
        result.error = f"{t.name}:{t.lines.get('bot', 1)}: cannot load bot {t.bot}: {exc}"
        return result
    result.notes = event_type_warnings(bot.config, t)
    result.error = state_problem(bot.config, t)
    if result.error is not None:
        return result
    if t.refused is not None:
        result.error = expect_refused_start(bot, t)
        return result
    live = mode == LIVE
    try:
        session, script = start_session(bot, t, LiveModel() if live else None)
    except ChatrunError as exc:
        key = "route" if "route" in t.lines else "state"
        if "tokenizer" in t.lines and str(exc).startswith("tokenizer "):  # the pinned counter cannot count here
            key = "tokenizer"
        result.error = f"{t.name}:{t.lines.get(key, 1)}: cannot start the conversation: {exc}"
        return result
    judge = Judge(t.judge, bot.config.model, mode)
    try:
        for turn in t.turns:
            upgrade(session, upgrades.get(turn.index))
            played = play_turn(session, script, turn, judge, live)
            if turn.expect is None:
                played.warnings = unoffered_calls(t, turn, script.current.requests)
            played.warnings += unpinned_due(session, t, played)
            result.turns.append(played)
        check_success(result, t)
        judge_conversation(result, judge)
    finally:
        result.usage = session.usage
        result.tokenizer = session.counting_tokenizer()
        session.close()
        judge.close()
    result.verdicts = judge.recorded
    return result


def bot_versions(t: Transcript, bots: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The versions of the transcript's bot, oldest first, as (label, Bot): one per folder of
    a `versions/` layout (docs/versions.md), else the one bot (labelled by its `version:`)."""
    return versions_at(t.bot_path, bots)


def pick_versions(t: Transcript, bots: dict[str, Any] | None) -> tuple[Any, dict[int, Any]]:
    """The bot the conversation starts on (`version:`), and the bot each `upgrade:` turn moves
    to, by turn index. A version the bot lacks, or an upgrade that is not to a newer version
    (a session never moves to an older one, as on the server), is refused at its line."""
    if t.version is None:
        return load_bot_cached(str(t.bot_path), bots), {}
    versions = bot_versions(t, bots)
    at = version_index(versions, t.version, f"{t.name}:{t.lines.get('version', 1)}: `version:`", t.bot)
    start, upgrades = versions[at][1], {}
    for turn in t.turns:
        if turn.upgrade is None:
            continue
        to = version_index(versions, turn.upgrade, f"{t.where(turn)}: `upgrade:`", t.bot)
        if to <= at:
            raise VersionProblem(f"{t.where(turn)}: `upgrade: {turn.upgrade}` is not newer than version "
                                 f"{versions[at][0]}, which the conversation runs by then; a session never "
                                 "moves to an older version")
        at, upgrades[turn.index] = to, versions[to][1]
    return start, upgrades


def upgrade(session: Any, bot: Any) -> None:
    """An `upgrade:` turn: the bot's new version is deployed and the session meets it at this
    turn, as on the server (server/versions.py, `BotVersions.target`, with the new version
    the primary): it stays on its version when the new one pins sessions, else it moves by the
    new version's `on_change:` (Session.use_bot), committed with the turn."""
    from chatrun.definition.versions import PIN

    if bot is None or bot.config.on_change == PIN:
        return
    session.use_bot(bot)


def judge_conversation(result: Result, judge: Judge) -> None:
    """`judge.conversation`: criteria on the whole conversation, reported on the last turn."""
    if not judge.conversation or not result.turns or any(t.observed is None for t in result.turns):
        return
    last = result.turns[-1]
    text = "\n".join(reply_text(t.turn.input, t.observed.events) for t in result.turns)  # type: ignore[union-attr]
    for criterion in judge.conversation:
        judged = judge.judge(criterion, text, last.turn.judged, last.turn.index - 1)
        if not judged.passed:
            last.problems.append(Mismatch("judge", f"(the conversation) {judged.problem}"))


def check_success(result: Result, t: Transcript) -> None:
    """`success:`: a scenario's exact criteria on the whole conversation, reported on the last
    turn, each naming its line."""
    from chatrun.transcripts.scenario import Trial, exact_problems

    observed = [r.observed for r in result.turns]
    if not t.success or not observed or None in observed:
        return
    turns: list[Observed] = observed  # type: ignore[assignment]
    last = turns[-1]
    conversation = Trial(0, route=last.route, stack=list(last.stack), visible=last.visible,
                         path=turns[0].path[:1] + [route for o in turns for route in o.path[1:]],
                         calls=[c for o in turns for c in o.calls], events=[e for o in turns for e in o.events])
    for key, problem in exact_problems(t.success, conversation):
        result.turns[-1].problems.append(
            Mismatch("success", f"success ({t.name}:{t.success_lines.get(key, t.lines.get('success', 1))}) {problem}"))


SESSION_ID = "transcript"  # the id of every transcript's session


def start_session(bot: Any, t: Transcript, model: Any = None) -> tuple[Any, Any]:
    """The transcript's conversation in a fresh in-memory store, its tools mocked as the
    transcript says. Its model is the turn script, unless `model` is given (recording passes
    the real model through, and lets HTTP tools run for real; so does a live run's LiveModel,
    which is then the script too)."""
    from chatrun.store.blobs import MemoryBlobs
    from chatrun.store.memory import InMemoryStore
    from chatrun.store.user_memory import seed as seed_user_memory

    script = model if isinstance(model, LiveModel) else TurnScript()
    roles = set(t.roles) if t.roles is not None else None
    # One session id for every replay: what quotes it (a NotPending refusal) reads the same each run
    store = InMemoryStore()
    if t.user_memory and t.principal:  # a returning user: what an earlier conversation remembered
        seed_user_memory(store, bot.name, str(t.principal.get("name")), t.user_memory)
    session = bot.session(route=t.route, store=store, model=model or script, state=t.state, roles=roles,
                          principal=t.principal, session_id=SESSION_ID,
                          meta={"locale": t.locale} if t.locale else None, blobs=MemoryBlobs())
    session.tool_mocks = TranscriptMocks(t.mocks, live=model is not None, file=t.file, lines=t.mock_lines)
    if model is None:  # a replay: the summary at the conversation's end only when the turn scripts its answer
        session.may_summarize = lambda: script.current.remaining > 0
    if bot.config.knowledge:  # a replay reaches nothing outside the bot: its searches rank with BM25 alone
        from chatrun.knowledge import library_of

        library_of(bot.config).embedder.enabled = model is not None
    if t.tokenizer is not None:
        session.tokenizer = t.tokenizer  # raises when the pinned encoding cannot be loaded here
    if t.clock is not None:
        pin_clock(session, t.clock)
    return session, script


def set_turn_clock(session: Any, turn: TurnSpec) -> None:
    """A turn's `clock:`: the instant it runs at, or how far to move the pinned clock first
    (a transcript without a top-level `clock:` is pinned from here on)."""
    if turn.clock is None:
        return
    setting = turn.clock if isinstance(turn.clock, dict) else {"at": turn.clock}
    clock = session.clock
    if not isinstance(clock, FixedClock):
        clock = session.clock = FixedClock(session.now())
    if "at" in setting:
        clock.set(parse_instant(setting["at"], session.now().tzinfo))
    if "advance" in setting:
        clock.advance(parse_duration(setting["advance"]))


def play_turn(session: Any, script: Any, turn: TurnSpec, judge: Judge | None = None, live: bool = False) -> TurnResult:
    session.tool_mocks.next_turn(turn.mocks, turn.mock_lines)
    set_turn_clock(session, turn)
    try:
        return _play_turn(session, script, turn, judge, live)
    finally:
        advance_clock(session)


def _play_turn(session: Any, script: Any, turn: TurnSpec, judge: Judge | None, live: bool) -> TurnResult:
    try:
        script.next_turn(turn)
    except ChatrunError as exc:  # the schema lets through little a scripted model rejects
        return TurnResult(turn, None, [Mismatch("model", f"bad model response: {exc}")])
    started_on, before = session.route, session.last_turn
    try:
        events = send(session, turn)
    except REFUSED_DECISIONS as exc:  # refused before its turn: nothing ran, nothing was committed
        return message_after_end(session, turn, str(exc), script.current.requests)
    except AttachmentRefused as exc:  # `attach:` files the route does not take: refused before the turn
        return message_after_end(session, turn, str(exc), script.current.requests,
                                 why="the attachments were refused before the turn")
    except SessionError as exc:
        if session.ended is None:
            raise
        return message_after_end(session, turn, str(exc))
    model = script.current
    last = session.last_turn
    ran = last is not None and last != before  # an `expire:` with nothing due runs no turn
    obs = observe(session, events, model.requests, started_on, last.get("calls") if ran and last else [])
    if live:
        return TurnResult(turn, obs, compare_live(turn.expect, obs) + judge_turn(judge, turn, obs))
    given = len(turn.model)
    if len(model.requests) > given:
        return TurnResult(turn, obs, [Mismatch(
            "model", f"the turn needed more model responses than the transcript gives: it gives {given}, "
            f"and model call {len(model.requests)} (route {model.requests[-1].route}) found none left",
        )])
    problems = []
    if model.remaining:
        n = model.remaining
        problems.append(Mismatch("model", f"{n} scripted model response{'s' if n != 1 else ''} left unused"))
    problems += compare(turn.expect, obs)
    problems += judge_turn(judge, turn, obs)
    return TurnResult(turn, obs, problems)


def message_after_end(session: Any, turn: TurnSpec, refusal: str, requests: Any = (), why: str = "") -> TurnResult:
    """A message sent after a tool ended the conversation is refused, as any client is told, and
    so is a decision the engine refuses before its turn (DecisionRefused, NotPending,
    InvalidDecision); the turn expects that like any error (`expect: {error: ...}`), else it
    fails at its line."""
    obs = observe(session, [], list(requests))
    obs.error = refusal
    problems = compare(turn.expect, obs)
    if turn.model:
        why = why or ("the decision was refused before its turn" if turn.decision is not None
                      else "the conversation had ended")
        problems.append(Mismatch("model", f"{why}, so no model was called: the turn's `model:` answers are left unused"))
    return TurnResult(turn, obs, problems)


# What a decision step may meet instead of a turn (the engine raises them before anything runs)
REFUSED_DECISIONS = (DecisionRefused, NotPending, InvalidDecision, HeldByAnother, UnknownRouteError)  # a release to an unknown route too


def send(session: Any, turn: TurnSpec) -> list[Any]:
    """Run the turn's input — the user's message, or a third party's step — as whoever `as:`
    names (the transcript's principal again afterwards)."""
    principal, roles = session.principal, session.roles
    acting = turn.acting
    if acting == BACKEND:
        session.principal, session.roles = None, set()
    elif isinstance(acting, dict):
        session.principal = acting
        if "roles" in acting:  # else the transcript's roles (None: checks off)
            session.roles = set(acting["roles"])
    try:
        return session.chat(step_input(session, turn))
    finally:
        session.principal, session.roles = principal, roles


BACKEND = "backend"  # `as: backend`: no one signed in, answering a backend's question with its token


def step_input(session: Any, turn: TurnSpec) -> Any:
    """The turn's input for Session.chat: its message, or the decision its step describes."""
    if turn.decision is None:
        return with_attachments(session, turn) if turn.attach else turn.input
    (kind, value), = turn.decision.items()
    body = value if isinstance(value, dict) else {"item": value}
    if kind == "approve":
        return Approve(body["item"], args=body.get("args"), reason=body.get("reason"))
    if kind == "reject":
        return Reject(body["item"], reason=body.get("reason"))
    if kind == "answer":
        token = next((i.token for i in session.pending if i.id == body["item"]), None) if turn.acting == BACKEND else None
        return Answer(body["item"], body["value"], token=token)
    if kind == "expire":
        return Expire()
    if value in ("take", "force") or "take" in body or "force" in body:
        note = body.get("force", body.get("take"))
        return TakeOver(note if isinstance(note, str) else None, force=value == "force" or "force" in body)
    if "say" in body:
        return OperatorSay(body["say"])
    route = body.get("release")
    return Release(route if isinstance(route, str) else None)


def with_attachments(session: Any, turn: TurnSpec) -> dict[str, Any]:
    """The turn's message with its `attach:` files, as a client sends them: each kept in the
    session's blob area (Session.attach: the current route's `attachments:` limits, else
    AttachmentRefused) and sent by reference."""
    files = [(spec.path.read_bytes(), spec.media_type, spec.name) for spec in turn.attach]
    session.check_attachments([(media_type, len(data)) for data, media_type, _ in files])  # the count too
    refs = [session.attach(data, media_type, name).to_dict() for data, media_type, name in files]
    given = turn.input if isinstance(turn.input, dict) else {"userMessage": turn.input}
    return {**given, "attachments": [*(given.get("attachments") or []), *refs]}  # after any sent by URL


def state_problem(config: Any, t: Transcript) -> str | None:
    """A `state:` the HTTP API would refuse (an undeclared key, a value of another type) is
    refused here too, at its line: a transcript tests conversations clients can start."""
    from chatrun.definition.config import initial_state_problem

    problem = initial_state_problem(t.state or {}, config.state)
    if problem is None:
        return None
    key, message = problem
    return f"{t.name}:{t.state_lines.get(key, t.lines.get('state', 1))}: {message}"


def expect_refused_start(bot: Any, t: Transcript) -> str | None:
    """None when starting the conversation is refused as `refused:` expects, else what differs."""
    from chatrun.transcripts.expect import match

    where = f"{t.name}:{t.lines.get('refused', 1)}"
    try:
        session, _ = start_session(bot, t)
    except ChatrunError as exc:
        if t.refused is True or match(t.refused, str(exc)):
            return None
        return f"{where}: the start was refused, but the message differs:\n    expected: {t.refused!r}\n    actual: {exc}"
    session.close()
    return f"{where}: expected the start on route {session.route} to be refused, but the conversation started"


def unoffered_calls(t: Transcript, turn: TurnSpec, requests: list[ModelRequest]) -> list[str]:
    """Scripted tool calls the route did not offer. The engine answers them with an error
    result, which a turn without `expect:` lets pass unnoticed: most likely a typo, or a route
    the turn did not reach."""
    out = []
    for request, response in zip(requests, turn.model, strict=False):
        offered = [spec["function"]["name"] for spec in request.tools]
        for call in response.get("tool_calls") or []:
            name = call.get("name")
            if name not in offered:
                out.append(f"{t.where(turn)}: warning: the scripted model calls `{name}`, which route `{request.route}` "
                           f"does not offer (it offers: {', '.join(offered) or 'no tools'}); the turn has no `expect:`, "
                           "so nothing checks what happened")
    return out


def unpinned_due(session: Any, t: Transcript, played: TurnResult) -> list[str]:
    """An item with a timeout on the system clock: its `due` differs on every run, and no
    `expire:` step can reach it reliably. Pinning `clock:` fixes both."""
    obs = played.observed
    if isinstance(session.clock, FixedClock) or obs is None or not any("due" in item for item in obs.pending):
        return []
    return [f"{t.where(played.turn)}: warning: an item with a timeout waits, but the clock is not pinned, so its "
            "due time differs on every run; pin it with `clock:` (docs/transcripts.md, \"The clock\")"]


def event_type_warnings(config: Any, t: Transcript) -> list[str]:
    """Expected event types the bot can never send (a typo such as `Mesage`). A bot with
    handlers may send any type (`ctx.emit`), so it is not judged."""
    from chatrun.toolkinds import may_emit_any_event

    if may_emit_any_event(config):
        return []
    known = config.event_types()
    out = []
    for turn in t.turns:
        expect = turn.expect or {}
        for item in [i for key in ("events", "operators_events", "backend_events") for i in expect.get(key) or []]:
            for kind in item if isinstance(item, dict) else ():
                if kind not in known:
                    out.append(f"{t.where(turn)}: warning: expects a `{kind}` event, but bot {config.name} never "
                               f"sends one (it can send: {', '.join(sorted(known))})")
    return out


def judge_turn(judge: Judge | None, turn: TurnSpec, obs: Observed) -> list[Mismatch]:
    """The turn's `judge:` criteria, scored on its reply."""
    wanted = criteria((turn.expect or {}).get("judge"))
    if judge is None or not wanted:
        return []
    text = reply_text(turn.input, obs.events)
    problems = []
    for criterion in wanted:
        judged = judge.judge(criterion, text, turn.judged, turn.index - 1)
        if not judged.passed:
            problems.append(Mismatch("judge", judged.problem))
    return problems
