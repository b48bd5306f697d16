"""Expectations a model judges: `judge: "the reply asks for the departure date and nothing else"`.

A judge model scores the turn's reply (its Message events; or, for `judge.conversation`,
the whole conversation) against each criterion from 0 to 1, with a reason; the judgement
passes at the transcript's threshold (`judge.threshold`, default 0.7).

Three modes, like the model's answers:
- replay (`chatrun test`): the verdicts recorded in the turn's `judged:` list are used,
  offline and deterministic. Each carries a digest of the text it judged: if the text has
  changed since, the judgement fails and asks for a new recording.
- record (`chatrun test --record`): the judge is asked and its verdicts written to `judged:`.
- live (`chatrun test --live`): the judge is asked; a failed judgement is asked once more
  (judges are models too) and reported with the judge's reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from chatrun.definition.config import ModelConfig
from chatrun.errors import ChatrunError, ModelError
from chatrun.messages import SystemMessage, UserMessage
from chatrun.models import ModelPool
from chatrun.models.base import ChatModel, ModelRequest

REPLAY, RECORD, LIVE = "replay", "record", "live"
DEFAULT_THRESHOLD = 0.7

JUDGE_PROMPT = """\
You judge a chatbot's replies for an automated test. Given a criterion and the text to
judge, decide how well the text meets the criterion. Answer with one JSON object and
nothing else: {"score": S, "reason": "R"} where S is a number from 0 (does not meet it at
all) to 1 (meets it fully) and R is one sentence saying why."""


@dataclass
class Verdict:
    criterion: str
    score: float
    reason: str = ""
    digest: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"criterion": self.criterion, "score": self.score}
        if self.reason:
            out["reason"] = self.reason
        if self.digest:
            out["digest"] = self.digest
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Verdict:
        return cls(d["criterion"], float(d["score"]), d.get("reason", ""), d.get("digest", ""))


@dataclass
class Judgement:
    """One criterion judged: the verdict (None when replay has none to use) and whether it passed."""

    criterion: str
    passed: bool
    verdict: Verdict | None
    problem: str = ""  # why it failed, in words for the report
    asked: int = 0  # how many times the judge was asked (live: 2 after a re-ask)


def criteria(value: Any) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def parse_verdict(criterion: str, text: str, subject_digest: str) -> Verdict:
    """The judge's answer as a Verdict; an answer that is not the JSON asked for scores 0."""
    found = re.search(r"\{.*\}", text or "", re.DOTALL)
    try:
        data = json.loads(found.group(0)) if found else {}
        score = float(data["score"])
    except (ValueError, TypeError, KeyError, json.JSONDecodeError):
        return Verdict(criterion, 0.0, f"the judge did not answer with {{\"score\", \"reason\"}} JSON: {text!r}",
                       subject_digest)
    return Verdict(criterion, min(max(score, 0.0), 1.0), str(data.get("reason", "")), subject_digest)


class Judge:
    """Judges criteria for one transcript run, in one mode."""

    def __init__(self, settings: dict[str, Any] | None, bot_model: ModelConfig, mode: str = REPLAY,
                 model: ChatModel | None = None):
        settings = settings or {}
        self.mode = mode
        self.threshold = float(settings.get("threshold", DEFAULT_THRESHOLD))
        self.config = bot_model.merged({**(settings.get("model") or {}), "stream": False})
        self.conversation = criteria(settings.get("conversation"))
        self._pool: ModelPool | None = None
        self._model = model
        self._loop: asyncio.AbstractEventLoop | None = None
        self.recorded: dict[int, list[dict[str, Any]]] = {}  # turn index (0-based) -> verdicts, for --record

    def judge(self, criterion: str, subject: str, recorded: list[dict[str, Any]], turn_index: int) -> Judgement:
        """One criterion against `subject` (the text judged, with what led to it)."""
        subject_digest = digest(subject)
        if self.mode == REPLAY:
            return self._replay(criterion, subject_digest, recorded)
        verdict = self._ask(criterion, subject, subject_digest)
        asked = 1
        if self.mode == LIVE and verdict.score < self.threshold:
            verdict = self._ask(criterion, subject, subject_digest)  # a judge can be wrong once
            asked = 2
        if self.mode == RECORD:
            self.recorded.setdefault(turn_index, []).append(verdict.to_dict())
        return self._outcome(verdict, asked)

    def _replay(self, criterion: str, subject_digest: str, recorded: list[dict[str, Any]]) -> Judgement:
        found = next((Verdict.from_dict(v) for v in recorded if v.get("criterion") == criterion), None)
        if found is None:
            return Judgement(criterion, False, None, f"judge {criterion!r}: no recorded verdict; record one with "
                                                     "`chatrun test --record` (or judge live with `--live`)")
        if found.digest and found.digest != subject_digest:
            return Judgement(criterion, False, found, f"judge {criterion!r}: the text judged has changed since the "
                                                      "verdict was recorded; record again with `chatrun test --record`")
        return self._outcome(found, 0)

    def _outcome(self, verdict: Verdict, asked: int) -> Judgement:
        if verdict.score >= self.threshold:
            return Judgement(verdict.criterion, True, verdict, asked=asked)
        again = " (asked twice)" if asked == 2 else ""
        return Judgement(verdict.criterion, False, verdict,
                         f"judge {verdict.criterion!r}: scored {verdict.score:g}, below the threshold "
                         f"{self.threshold:g}{again}; the judge's reason: {verdict.reason or '(none given)'}", asked)

    def _ask(self, criterion: str, subject: str, subject_digest: str) -> Verdict:
        request = ModelRequest(
            messages=[SystemMessage(JUDGE_PROMPT),
                      UserMessage(f"Criterion: {criterion}\n\nText to judge:\n{subject}")],
            tools=[], config=self.config, route="judge")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        if self._model is None:
            self._pool = ModelPool()
            self._model = self._pool.model()
        try:
            response = self._loop.run_until_complete(self._model.complete(request))
        except ModelError as exc:
            raise ChatrunError(f"the judge model failed: {exc}") from exc
        return parse_verdict(criterion, response.text or "", subject_digest)

    def close(self) -> None:
        if self._loop is None:
            return
        for closable in (self._model, self._pool):
            aclose = getattr(closable, "aclose", None)
            if aclose is not None:
                self._loop.run_until_complete(aclose())
        self._loop.close()
        self._loop = None


def reply_text(user: Any, events: list[dict[str, Any]]) -> str:
    """What a turn's judgement reads: the user's input, then the bot's reply (its Message events)."""
    said = user if isinstance(user, str) else json.dumps(user, ensure_ascii=False)
    reply = "\n".join(str(data) for e in events for kind, data in e.items() if kind == "Message")
    return f"User: {said}\nAssistant: {reply or '(no message)'}"
