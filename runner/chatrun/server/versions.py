"""The versions of each bot a server serves, which one a session runs, and the versions kept
in the store for other replicas (docs/versions.md).

    bots/shop/versions/1/, versions/2/   several versions served at once (definition/versions.py)
    versions.yaml `weights:`             the canary: new sessions split by weight (by session id,
                                         so a retried create lands on the same version), or the
                                         version a tester names in the `Chatrun-Bot-Version` header
    primary                              the version with the largest weight (ties: the newest):
                                         where `migrate` and `restart_scope` sessions move to

A stored session records the content version it runs (`SessionRecord.bot_version`). It runs
that version while the primary's `on_change` is `pin`, and also when its version is newer than
the primary (a canary's session, a replica not yet upgraded): a session never moves to an older
version. A replica that lacks a session's version loads it from the store, where every replica
puts the files of the versions it serves (content-addressed: `bot-version:<bot>:<hash>`), or,
when the store does not have it either, refuses with `Unavailable` (HTTP 503 + Retry-After):
the client sends again and another replica serves it.

A stored version is loaded only when this replica may trust it (server/bundles.py: signed
with the bundle key every replica shares, or data-only and allowed unsigned); one it may not
is never written out nor imported: its session moves to the primary by the primary's
`on_change` as a session of a lost version, or, when the primary or the refused version says
`pin` (the session must finish on its version), the turn is refused naming the session and
why (503: a replica with the bundle key serves it).
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chatrun.definition.versions import (
    DEFAULT_POLICY,
    PIN,
    bot_files,
    content_version,
    version_layout,
    write_bundle,
)
from chatrun.engine.versions import produced_by
from chatrun.errors import ChatrunError
from chatrun.server import wire
from chatrun.server.bundles import HOW_TO_CONFIGURE, STARTS_PROGRAM, BundlePolicy, starts_program

if TYPE_CHECKING:
    from chatrun.engine.bot import Bot
    from chatrun.store.aio import AsyncStore
    from chatrun.store.record import SessionRecord

log = logging.getLogger("chatrun.versions")

VERSION_HEADER = "Chatrun-Bot-Version"  # a tester's pick of the version a new session starts on
RECORD_PREFIX = "bot-version:"
PIN_LINE = re.compile(r"^on_change:[ \t]*[\"']?pin[\"']?[ \t]*(#.*)?$", re.MULTILINE)


@dataclass
class Version:
    """One served version of a bot: where it comes from (`label`: its versions/ folder, else
    its content hash), its canary weight and when it was first published to the store."""

    bot: Bot
    label: str
    weight: int = 0
    published: float = 0.0
    stored: bool = False  # loaded from the store, not from this server's files

    @property
    def content_version(self) -> str:
        return self.bot.config.content_version

    def to_dict(self) -> dict[str, Any]:
        config = self.bot.config
        return {"label": self.label, "version": config.version, "content_version":
                config.content_version, "weight": self.weight, "on_change": config.on_change,
                "published": self.published, "stored": self.stored}


@dataclass
class BotVersions:
    """The versions of one bot this server holds, oldest first."""

    name: str
    versions: list[Version] = field(default_factory=list)

    @property
    def primary(self) -> Version:
        return max(reversed(self.versions), key=lambda v: v.weight)  # reversed: a tie goes to the newest

    def find(self, wanted: str | None) -> Version | None:
        """The version with this content hash or label (None: none such)."""
        return next((v for v in self.versions if wanted in (v.content_version, v.label)), None)

    def origin(self, snapshot: dict[str, Any]) -> Version | None:
        """The oldest version that could have produced a session stored without a version."""
        return next((v for v in self.versions if produced_by(v.bot.config, snapshot)), None)

    def of(self, bot: Bot) -> Version | None:
        return next((v for v in self.versions if v.bot is bot), None)

    def for_new(self, session_id: str, wanted: str | None = None) -> Bot:
        """The version a new session starts on: the one the header names, else by weight."""
        if wanted:
            named = self.find(wanted)
            if named is None:
                labels = ", ".join(f"{v.label} ({v.content_version})" for v in self.versions)
                raise wire.RequestFailed(wire.BAD_REQUEST, f"{VERSION_HEADER}: bot {self.name} has no version "
                                                           f"{wanted!r}; it serves: {labels}")
            if self.target(named.bot) is not named.bot:  # it would move to the primary at once
                primary = self.primary
                kept = ", ".join(v.label for v in self.versions if self.target(v.bot) is v.bot)
                raise wire.RequestFailed(wire.BAD_REQUEST, f"{VERSION_HEADER}: version {named.label} of bot "
                                         f"{self.name} takes no new sessions (weight 0) and its sessions move to "
                                         f"version {primary.label} (on_change: {primary.bot.config.on_change}), so a "
                                         f"session started on it would not stay there; pick {kept}, or give "
                                         f"version {named.label} a weight in versions.yaml")
            return named.bot
        weighted = [v for v in self.versions if v.weight > 0] or [self.primary]
        total = sum(v.weight for v in weighted) or 1
        point = int.from_bytes(hashlib.sha256(session_id.encode()).digest()[:8], "big") % total
        for version in weighted:
            point -= version.weight
            if point < 0:
                return version.bot
        return weighted[-1].bot

    def target(self, current: Bot) -> Bot:
        """The bot a session now on `current` runs next: the primary, unless the primary pins
        sessions to their versions, `current` still takes new sessions (a canary's weight) or
        `current` is newer (never a downgrade)."""
        primary = self.primary
        here = self.of(current)
        if current is primary.bot or primary.bot.config.on_change == PIN:
            return current
        if here is not None and (here.weight > 0 or here.published > primary.published):
            return current
        return primary.bot

    def add(self, version: Version) -> None:
        self.versions = sorted([*self.versions, version], key=lambda v: v.published)

    def replace_primary(self, bot: Bot, published: float) -> Version:
        """A reloaded bot (`serve --reload`) becomes the primary. Older versions are kept only
        while the new one pins sessions to them."""
        kept = self.versions if bot.config.on_change == PIN else []
        for version in kept:
            version.weight = 0
        self.versions = kept
        version = Version(bot, bot.config.content_version, 100, published)
        self.add(version)
        return version


class VersionShelf:
    """Every served bot's versions, and their copies in the store."""

    def __init__(self, versions: dict[str, BotVersions], store: AsyncStore, bundles: BundlePolicy | None = None):
        self.bots = versions
        self.store = store
        self.bundles = bundles or BundlePolicy()  # what this replica signs with and loads (server/bundles.py)
        self.metrics: Any = None  # the app's ServerMetrics (counts refused bundles), set by create_app
        self._cache: Path | None = None
        self._files: dict[int, dict[str, str]] = {}  # id(version) -> its files, read once to publish

    def cache(self) -> Path:
        """Where stored versions are written to be loaded: a directory of this process's own,
        made on first use, that only its user may enter (mode 0700, tempfile.mkdtemp). A
        shared, predictable folder would let another user of the machine put handlers (.py
        files) there for this server to run. Removed by `close()`."""
        if self._cache is None:
            self._cache = Path(tempfile.mkdtemp(prefix="chatrun-versions-"))
        return self._cache

    def close(self) -> None:
        """Remove the stored versions' files (the loaded bots keep running: handlers are imported)."""
        if self._cache is not None:
            shutil.rmtree(self._cache, ignore_errors=True)
            self._cache = None

    def primaries(self) -> dict[str, Bot]:
        return {name: versions.primary.bot for name, versions in self.bots.items()}

    def all_bots(self) -> list[Bot]:
        return [v.bot for versions in self.bots.values() for v in versions.versions]

    def check_bundles(self) -> None:
        """Read every local version's files and refuse (ChatrunError) a bundle over the size
        limit: before the server starts, so the error is the command's, not a failed startup."""
        for name, versions in self.bots.items():
            for version in versions.versions:
                self.bundles.check_size(name, version.label, self._files_of(version))

    def _files_of(self, version: Version) -> dict[str, str]:
        files = self._files.get(id(version))
        if files is None:
            files = self._files[id(version)] = bot_files(version.bot.config.root)
        return files

    def start_note(self) -> str | None:
        """What the server log says at start about loading versions from the store, if anything."""
        if self.bundles.key is not None:
            return None
        data = (" (data-only bundles, with no .py file, are loaded unsigned: --allow-unsigned-data-bundles)"
                if self.bundles.allow_unsigned_data else "")
        return ("chatrun: no bundle key: this replica loads no bot version from the store" + data + ", only "
                "the versions in its own bot folders; sessions of other versions move by their on_change. To share "
                "versions between replicas, " + HOW_TO_CONFIGURE)

    async def publish(self) -> None:
        """Put every local version's files in the store (once: the first publication's time
        orders versions across replicas), signed with the bundle key, and learn when each was
        first published."""
        for name, versions in self.bots.items():
            for version in versions.versions:
                await self.publish_one(name, version)
            versions.versions.sort(key=lambda v: v.published)

    async def publish_one(self, name: str, version: Version) -> None:
        content = version.content_version
        key = record_key(name, content)
        stored = await self.store.get_record(key)
        if stored is None or (self.bundles.key is not None and not self.bundles.signed(signed_part(stored, name, content))):
            files = self._files_of(version)
            self.bundles.check_size(name, version.label, files)
            # A copy of the same files (published before bundles were signed, or by a replica
            # with another key) keeps its first publication time: it orders versions.
            published = first_published(stored, content) or time.time()
            record: dict[str, Any] = {"bot": name, "label": version.label, "files": files, "published": published}
            signature = self.bundles.sign(signed_part(record, name, content))
            if signature is not None:
                record["signature"] = signature
            if stored is not None:
                log.warning("chatrun: the stored copy of version %s of bot %s was not signed with this replica's "
                            "bundle key (signed with another key, or by an older chatrun, or written by someone "
                            "else); published it again, signed", content, name)
            await self.store.put_record(key, record)
            stored = record
        version.published = float(stored.get("published") or 0.0)

    async def bot_for(self, name: str, record: SessionRecord) -> Bot | None:
        """The bot a stored session is opened with: its recorded version, held here, else loaded
        from the store; for a session from before versions, the oldest held version that could
        have produced it. None: the primary (a version no one has, or a session no held version
        produced: the engine moves it by the primary's `on_change`, engine/versions.py). Raises
        RequestFailed(Unavailable) while the store holds a copy this replica cannot load (a
        replica that can answers)."""
        versions = self.bots[name]
        recorded = record.bot_version
        if recorded is None:
            origin = versions.origin(record.snapshot)
            return origin.bot if origin is not None else None
        held = versions.find(recorded)
        if held is not None:
            return held.bot
        loaded = await self._load(name, recorded, record.session_id)
        if loaded is None:
            return None
        held = versions.find(recorded)  # another request may have loaded it meanwhile
        if held is not None:
            return held.bot
        versions.add(loaded)
        return loaded.bot

    async def _load(self, name: str, recorded: str, session_id: str = "") -> Version | None:
        """Version `recorded` from the store's copy; None when there is no (sound) copy, so no
        replica ever will have it (every replica publishes what it serves when it starts), or
        when this replica may not trust the copy (`_refuse`)."""
        from chatrun.engine.bot import load_bot

        stored = await stored_version(self.store, name, recorded)
        if stored is None and getattr(self.store, "records", True) is None:
            # A user's store that keeps no records: the copies other replicas published are in
            # their processes only, so one may still serve it.
            raise unavailable(name, recorded, "this replica does not have it, and the store keeps no copies")
        if stored is None:
            log.info("chatrun: version %s of bot %s is nowhere: its sessions move by on_change", recorded, name)
            return None
        refused = self.bundles.refusal(stored.signed_part())
        if refused is not None:  # checked before a file is written: nothing of it is ever imported
            self._refuse(stored, session_id, *refused)
            return None
        try:
            bot = load_bot(stored.write(self.cache() / name))
        except ChatrunError as exc:
            raise unavailable(name, recorded, f"its stored copy does not load here: {exc}") from None
        program = None if self.bundles.signed(stored.signed_part()) else starts_program(bot.config)
        if program is not None:  # an unsigned data-only bundle that would start a program of its choosing
            self._refuse(stored, session_id, STARTS_PROGRAM,
                         f"it is not signed and its mcp_servers.{program} runs a command")
            return None
        log.info("chatrun: loaded version %s of bot %s from the store", recorded, name)
        return Version(bot, stored.label, 0, stored.published, True)

    def _refuse(self, stored: StoredVersion, session_id: str, reason: str, why: str) -> None:
        """A stored version this replica may not load: logged and counted. Its session then moves
        to the primary by the primary's `on_change` as from a lost version (None), unless the
        primary or the refused version itself says `pin` (a session that must finish on its
        version, which a replica with the key can serve): then its turn is refused
        (RequestFailed naming the session and why)."""
        name, recorded = stored.bot, stored.content_version
        if self.metrics is not None:
            self.metrics.bundle_refused(name, reason)
        served = self.bots.get(name)
        policy = served.primary.bot.config.on_change if served is not None else DEFAULT_POLICY
        pinned = policy == PIN or stored.declares_pin()
        then = ("its on_change is pin, so the session cannot move and its turn is refused" if pinned
                else f"the session moves to the primary version by on_change: {policy}")
        log.warning("chatrun: refused to load version %s of bot %s from the store (session %s): %s; %s; %s",
                    recorded, name, session_id or "-", why, then, HOW_TO_CONFIGURE)
        if pinned:
            raise wire.RequestFailed(wire.UNAVAILABLE, f"session {session_id}: bot {name} version {recorded} is not "
                                     f"loaded on this replica: {why}; on_change is pin, so the session cannot move "
                                     "to another version. Send the request again (a replica with the bundle key "
                                     "answers); the operator should " + HOW_TO_CONFIGURE)


@dataclass
class StoredVersion:
    """A version of a bot kept in the store (`bot-version:<bot>:<content version>`), its files
    checked against its content version."""

    bot: str
    content_version: str
    label: str
    published: float
    files: dict[str, str]
    signature: str | None = None  # the publisher's (server/bundles.py)

    def signed_part(self) -> dict[str, Any]:
        """What its signature covers, as this replica sees it (bot and version from the key asked for)."""
        return {"bot": self.bot, "content_version": self.content_version, "label": self.label,
                "published": self.published, "files": self.files, "signature": self.signature}

    def declares_pin(self) -> bool:
        """Whether its bot.yaml says `on_change: pin` (read as text: a bundle not trusted is never loaded)."""
        return bool(PIN_LINE.search(self.files.get("bot.yaml", "")))

    def write(self, into: Path) -> Path:
        """Its files under `into`/<content version> (a folder the caller owns); the folder."""
        return write_bundle(self.files, into / self.content_version)


async def stored_version(store: AsyncStore, bot: str, wanted: str) -> StoredVersion | None:
    """The stored copy of version `wanted` of `bot`: its content version, or a label when the
    store can list its records (the newest published of that label); None when there is no
    sound copy (none, or files that do not hash to their version: logged)."""
    record = await store.get_record(record_key(bot, wanted))
    content = wanted
    if record is None:
        named = [v for v in await stored_versions(store, bot) if v[1] == wanted]
        if not named:
            return None
        content = max(named, key=lambda v: v[2])[0]
        record = await store.get_record(record_key(bot, content))
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(record, dict) or not isinstance(files, dict) or content_version(files) != content:
        if record is not None:
            log.warning("chatrun: the stored copy of version %s of bot %s does not match its hash", content, bot)
        return None
    signature = record.get("signature")
    return StoredVersion(bot, content, str(record.get("label") or content), float(record.get("published") or 0.0),
                         {str(k): str(v) for k, v in files.items()}, signature if isinstance(signature, str) else None)


async def stored_versions(store: AsyncStore, bot: str | None = None) -> list[tuple[str, str, float, str]]:
    """The versions kept in the store, oldest published first: (content version, label,
    published, bot), of `bot` or of every bot. [] from a store that cannot list its records."""
    out = []
    for key in await store.record_keys(RECORD_PREFIX + (f"{bot}:" if bot is not None else "")):
        name, _, content = key[len(RECORD_PREFIX):].rpartition(":")
        record = await store.get_record(key)
        if isinstance(record, dict):
            out.append((content, str(record.get("label") or content), float(record.get("published") or 0.0), name))
    return sorted(out, key=lambda v: v[2])


def own_label(bot: Bot) -> str:
    """The label of a bot served from its own folder: its `version:`, else its content version."""
    return bot.config.version or bot.config.content_version


def signed_part(record: dict[str, Any], name: str, content: str) -> dict[str, Any]:
    """A stored record as its signature covers it: of bot `name`, version `content` (the key's)."""
    return {**record, "bot": name, "content_version": content}


def first_published(stored: dict[str, Any] | None, content: str) -> float | None:
    """When a stored copy of the same files was first published (None: no such copy)."""
    files = stored.get("files") if isinstance(stored, dict) else None
    published = stored.get("published") if isinstance(stored, dict) else None
    if not isinstance(files, dict) or content_version(files) != content or not isinstance(published, int | float):
        return None
    return float(published)


def record_key(name: str, content: str) -> str:
    return f"{RECORD_PREFIX}{name}:{content}"


def unavailable(name: str, recorded: str, why: str) -> wire.RequestFailed:
    return wire.RequestFailed(wire.UNAVAILABLE, f"bot {name} version {recorded}: {why}; send the request again "
                                                "(a replica that serves that version will answer)")


def versions_of(path_or_bot: Any) -> list[Version]:
    """The versions a `create_app` argument serves: a versions/ layout's, else the one bot."""
    from chatrun.engine.bot import load_bot

    layout = version_layout(path_or_bot) if isinstance(path_or_bot, str | Path) else None
    if layout is None:
        bot = load_bot(path_or_bot) if isinstance(path_or_bot, str | Path) else path_or_bot
        return [Version(bot, own_label(bot), 100)]
    found = [Version(load_bot(folder), label) for label, folder in layout.versions]
    weights = layout.weights or {layout.versions[-1][0]: 100}
    for index, version in enumerate(found):
        version.weight = weights.get(version.label, 0)
        version.published = index * 1e-3  # until the store says when each was first published
    names = {v.bot.name for v in found}
    if len(names) > 1:
        raise ChatrunError(f"{layout.root}: the versions of one bot must keep its name; they are named "
                           f"{', '.join(sorted(names))}")
    return found
