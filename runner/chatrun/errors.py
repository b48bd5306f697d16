"""Every error chatrun raises on purpose, and the diagnostics of invalid files.

    ChatrunError                 every error below; the message names the place and says what to do
    ├── BotError                 a bot (or transcript) is invalid; carries every Diagnostic found
    ├── ModelError               the model could not be reached, or answered something unusable
    │   └── ModelUnavailable     ... its endpoint cannot answer now (quota, overload, timeout, outage): a fallback may
    ├── SessionError             a session API call was misused
    │   ├── UnknownRouteError    a route name the bot does not define
    │   ├── ForbiddenRouteError  the principal may not enter a route with `roles:`
    │   └── AttachmentRefused    a file the current route does not take (its `attachments:` limits), or no such upload
    ├── TurnFailed               a turn cannot complete: it is rolled back, its message becomes an Error event
    ├── ToolRefusal              a tool call that cannot run: its message is the tool result the model reads
    ├── StaleVersion             a store refused a commit: the session is not at the version the turn started from
    │   └── LeaseLost            ... because the turn's lease on the session expired (another replica may hold it)
    ├── SessionQuota             a store refused a new session: its owner has --max-sessions-per-principal already
    ├── SessionBusy              the session is running a turn and the request would not (or could no longer) wait
    ├── DecisionRefused          a decision on a pending item by someone who may not make it (role, self rule)
    ├── NotPending               a decision on an item that is not pending (unknown, or resolved already)
    ├── InvalidDecision          a decision whose edited arguments or answer do not validate (item stays pending)
    └── RequestFailed            a server request that cannot be served (reason + message)
        └── FrameError           a malformed WebSocket frame

A turn never lets one of these escape: `Session.stream()` turns them into an Error event
and rolls the turn back. They reach callers from loading (`BotError`), from starting or
resuming a session (`SessionError`), and from the server's request handling.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class ChatrunError(Exception):
    """Base class of every error chatrun raises on purpose.

    The message is written for a bot author: it names the place and says what to do.
    """


@dataclass(frozen=True)
class Diagnostic:
    """One problem found in a bot or transcript file.

    `path` is the JSON path of the node at fault ("routes.flight.system"), `line`
    and `col` are 1-based positions in `file` (0 when unknown).
    """

    file: str
    line: int
    col: int
    severity: str  # "error" | "warning"
    message: str
    path: str = ""

    def format(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}:{self.col or 1}"
        return f"{where}: {self.severity}: {self.message}"

    def to_dict(self) -> dict:
        return asdict(self)


class BotError(ChatrunError):
    """A bot (or transcript) is invalid. Carries every diagnostic found, not just the first."""

    def __init__(self, diagnostics: list[Diagnostic]):
        self.diagnostics = list(diagnostics)
        errors = [d for d in self.diagnostics if d.severity == "error"]
        shown = errors or self.diagnostics
        head = "\n".join(d.format() for d in shown)
        super().__init__(head)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]


class ModelError(ChatrunError):
    """The model could not be reached or answered something unusable (after retries)."""


class ModelUnavailable(ModelError):
    """The model's endpoint could not answer now, through no fault of the request: `reason` is
    "quota" (HTTP 429), "overload" (503, 529), "timeout" or "outage" (cannot connect, other 5xx).
    A route's `model.fallback:` answers instead, while nothing of the answer has been shown
    (chatrun.models.fallback)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class SessionError(ChatrunError):
    """A session API call was misused: unknown route, unknown or closed session, a refused attachment."""


class AttachmentRefused(SessionError):
    """A file the current route does not take (kind, size, count: its `attachments:`), a
    reference to no upload of the session, or a store without a blob area. Nothing is kept."""


class UnknownRouteError(SessionError):
    """A route name that the bot does not define."""

    def __init__(self, route: str, known: list[str]):
        self.route = route
        self.known = sorted(known)
        super().__init__(f"unknown route {route!r}; the bot defines: {', '.join(self.known)}")


class ForbiddenRouteError(SessionError):
    """The principal may not enter a route that declares `roles:`."""


class TurnFailed(ChatrunError):
    """The turn cannot complete; the session is restored and the message becomes an Error event."""


class MessageTooLong(TurnFailed):
    """The user's message alone is more than the route's memory holds: the window would evict it and
    send the model the conversation without it. It is sent nowhere; the user reads the page text
    `page_text` (in the session's locale), the author the message naming the route and the sizes."""

    page_text = "message_too_long"


class UserBudgetSpent(TurnFailed):
    """A model call would pass the budget of the session's user over the current window
    (`limits.max_user_tokens`, `max_user_cost`): the turn ends before it is sent. The user reads
    the page text `page_text` (in the session's locale) with `page_args` (`renews`: when the
    budget renews); the author the message naming the limit."""

    page_text = "user_budget_spent"
    spent = "user"  # the failed turn's history entry says so: another try of its message cannot run

    def __init__(self, message: str, renews: str):
        super().__init__(message)
        self.page_args = {"renews": renews}


class SessionBudgetSpent(TurnFailed):
    """A model call would pass the session's budget (`limits.max_session_tokens`,
    `max_session_cost`): the turn ends before it is sent, and no later turn of the session can
    call the model. The user reads the page text `page_text` (in the session's locale): the
    conversation cannot go on, not "please try again"; the author the message naming the limit."""

    page_text = "session_budget_spent"
    spent = "session"  # the failed turn's history entry says so: another try of its message cannot run


class KnowledgeUnavailable(TurnFailed):
    """A route's knowledge index could not be built or read (a file where `.chatrun/` goes, a
    disk full, the shared PostgreSQL index down): the turn fails rather than letting the model
    answer without retrieval. The user reads the page text `page_text`; the author the message,
    naming the index and what to do (chatrun.knowledge.Library)."""

    page_text = "knowledge_unavailable"


class ToolRefusal(ChatrunError):
    """A tool call that cannot run; the message is the tool result the model reads."""


class StaleVersion(ChatrunError):
    """A commit refused by the store (fencing): the stored session is not at the version the
    turn started from (another request committed, or deleted it, meanwhile). Nothing was written."""

    def __init__(self, session_id: str, expected: str | None, found: str | None, why: str = ""):
        self.session_id, self.expected, self.found = session_id, expected, found
        if why:
            text = why
        elif expected == "":  # chatrun.store.versions.CREATE
            text = f"session {session_id} already exists (version {found})"
        elif found is None:
            text = f"session {session_id} was deleted meanwhile"
        else:
            text = f"session {session_id} is at version {found}, not {expected}: another request committed first"
        super().__init__(text)


class SessionQuota(ChatrunError):
    """A new session refused by the store: its owner already has `limit` sessions
    (--max-sessions-per-principal). Checked and counted in the store's one atomic step with the
    session's write, so replicas creating at once never overshoot. Nothing was written."""

    def __init__(self, owner: str, owned: int, limit: int):
        self.owner, self.owned, self.limit = owner, owned, limit
        super().__init__(f"principal {owner} already has {owned} sessions (limit {limit}, "
                         "--max-sessions-per-principal); delete one first")


class LeaseLost(StaleVersion):
    """A commit refused: the turn's lease on the session expired and may be someone else's now."""

    def __init__(self, session_id: str):
        super().__init__(
            session_id, None, None,
            f"the lease on session {session_id} expired during the turn (the turn outlived the lease "
            "or could not renew it), so another request may hold the session",
        )


class SessionBusy(ChatrunError):
    """The session is running a turn and the request asked not to wait (or waited too long)."""


class DecisionRefused(ChatrunError):
    """A decision on a pending item by a principal who may not make it: it lacks the item's roles,
    or it caused the call and the bot does not allow self-approval. Nothing was committed."""

    def __init__(self, item: str, needed: list[str], caller: list[str], why: str = ""):
        self.item, self.needed, self.caller = item, list(needed), list(caller)
        text = why or (f"pending item {item} may be decided only by one of the roles {', '.join(needed) or '(none)'}; "
                       f"the caller has {', '.join(caller) or 'no roles'}")
        super().__init__(text)


class NotPending(ChatrunError):
    """A decision on an item that is not pending: unknown, or already resolved (`outcome` says how)."""

    def __init__(self, session_id: str, item: str, outcome: str | None = None):
        self.session_id, self.item, self.outcome = session_id, item, outcome
        done = f"it was resolved already ({outcome})" if outcome else "no open item has that id"
        super().__init__(f"session {session_id}: item {item} is not pending: {done}")


class HeldByAnother(ChatrunError):
    """A takeover, an operator's message or a release by an operator who does not hold the
    conversation: another operator took it over and holds it until their release (the server
    answers 409). Nothing was committed; the holder taking over again is not refused, nor a
    takeover with `force` (it moves the hold, announced to the user)."""

    def __init__(self, session_id: str, action: str, holder: str):
        self.session_id, self.action, self.holder = session_id, action, holder
        super().__init__(f"session {session_id}: {action} refused: the operator {holder} holds the conversation "
                         f"(only they may speak and release it; take it over once they release it, "
                         f"or take it from them with force)")


class InvalidDecision(ChatrunError):
    """A decision whose edited arguments or answer do not match the declared schema: nothing was
    committed and the item stays pending (the server answers 422)."""

    def __init__(self, item: str, problems: str):
        self.item, self.problems = item, problems
        super().__init__(f"item {item}: {problems}")


class RequestFailed(ChatrunError):
    """A server request that cannot be served: `reason` is the Failed frame's data (a protocol
    reason such as "BadRequest"), `message` the Error text."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


class FrameError(RequestFailed):
    """A WebSocket frame that cannot be read; carries what could be read of its chat and request ids."""

    def __init__(self, reason: str, message: str, chat_id: str | None = None, request_id: Any = None,
                 extensions: bool = False):
        super().__init__(reason, message)
        self.chat_id = chat_id
        self.request_id = request_id
        self.extensions = extensions  # a Connect that asked for the extended dialect: answered in it
