"""`chatrun diff OLD NEW`: what changed between two versions of a bot, which changes break live
sessions, and (with --store) how many stored sessions each one touches."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from chatrun.definition.diff import Change

if TYPE_CHECKING:
    from chatrun.engine.migrate import Footprint


@click.command("diff")
@click.argument("old")
@click.argument("new")
@click.option("--store", "store_url", metavar="URL",
              help="Count the stored sessions of the bot each change touches (sqlite:///path/to.db, redis://host:port/db, postgresql://user@host/db); "
                   "OLD and NEW may then name versions kept in it.")
@click.option("--bot", "bot", metavar="FOLDER|NAME",
              help="Where OLD and NEW that are not paths are versions of: a bot folder with versions/<label>/, or "
                   "the bot's name in --store.")
@click.option("--bundle-key", "bundle_key", metavar="FILE", type=click.Path(dir_okay=False),
              help="With --store: the servers' bundle key (else $CHATRUN_BUNDLE_KEY); a stored version with code "
                   "(.py files) is read only when signed with it (docs/security.md).")
@click.option("--json", "as_json", is_flag=True, help="Print the changes as one JSON object.")
def diff(old: str, new: str, store_url: str | None, bot: str | None, as_json: bool,
         bundle_key: str | None = None) -> None:
    """Compare two versions of a bot: what changed, and which changes break live sessions.

    OLD and NEW are bot folders (or files), or versions named by a label or a content
    hash: of the bot folder --bot names (its versions/<label>/), else kept in --store
    (every `chatrun serve` puts the versions it serves there).

    A breaking change is one a session started on OLD meets on NEW: a removed or renamed
    route, state key or scope field, a removed or renamed tool, a tool parameter removed,
    retyped or newly required, newly required state. One that a migration of NEW handles
    says which.

    Exit status: 0 when no breaking change is left unhandled, 1 when one is, 2 on errors
    (a bot that does not load, a version not found, a store that does not open).

    \b
    Examples:
      chatrun diff bots/shop/versions/1 bots/shop/versions/2
      chatrun diff 1 2 --bot bots/shop
      chatrun diff 1 2 --store sqlite:///sessions.db --bot shop
      chatrun diff OLD NEW --store sqlite:///sessions.db --json
    """
    from chatrun.definition.diff import diff_bots

    with tempfile.TemporaryDirectory(prefix="chatrun-diff-") as scratch:
        found = Versions(store_url, bot, Path(scratch), bundle_key)
        old_config, new_config = found.config(old), found.config(new)
    changes = diff_bots(old_config, new_config)
    stored = None
    if store_url:
        stored = _count(changes, store_url, old_config.name, old_config.content_version)
    if as_json:
        click.echo(json.dumps({"old": old, "new": new, "old_version": old_config.content_version,
                               "new_version": new_config.content_version,
                               "sessions": len(stored.old) if stored else None,
                               "stored": stored.to_json() if stored else None,
                               "changes": [c.to_json() for c in changes],
                               "breaking": sum(c.breaking for c in changes),
                               "unhandled": sum(c.unhandled for c in changes)}, indent=2))
    else:
        _print(changes, stored, old_config)
    if any(c.unhandled for c in changes):
        raise click.exceptions.Exit(1)


@dataclass
class Versions:
    """Where OLD and NEW are found: a path, else a version of the `--bot` folder's versions/,
    else one kept in the store (fetched as the server fetches it, chatrun.server.versions,
    into `scratch`)."""

    store_url: str | None
    bot: str | None
    scratch: Path
    bundle_key: str | None = None  # --bundle-key: a stored version with code is read only when signed with it

    def config(self, spec: str) -> Any:
        if Path(spec).exists():
            return _load(spec)
        folder = self._in_folder(spec)
        if folder is not None:
            return _load(str(folder))
        if self.store_url:
            return _load(str(self._from_store(spec)))
        raise _fail(spec, "no such bot folder or file; to name a version, give --bot FOLDER (a bot with "
                    "versions/<label>/) or --store URL (the versions `chatrun serve` kept there)")

    def _in_folder(self, spec: str) -> Path | None:
        from chatrun.definition.loader import load_config
        from chatrun.definition.versions import version_layout
        from chatrun.errors import ChatrunError

        if self.bot is None or not Path(self.bot).exists():
            return None
        try:
            layout = version_layout(self.bot)
        except ChatrunError as exc:
            raise _fail(self.bot, str(exc)) from None
        if layout is None:
            raise _fail(self.bot, "--bot names a folder without versions/<label>/bot.yaml")
        for label, folder in layout.versions:
            if spec == label or (len(spec) >= 4 and load_config(folder)[0].content_version.startswith(spec)):
                return folder
        if self.store_url:
            return None  # perhaps a version the folder no longer has, kept in the store
        raise _fail(self.bot, f"no version {spec!r} in versions/ (there are: "
                    f"{', '.join(label for label, _ in layout.versions)})")

    def _from_store(self, spec: str) -> Path:
        import asyncio

        try:
            return asyncio.run(self._fetch(spec))
        except (OSError, ValueError) as exc:
            raise _fail(str(self.store_url), str(exc)) from None

    async def _fetch(self, spec: str) -> Path:
        from chatrun.errors import ChatrunError
        from chatrun.server.versions import stored_version, stored_versions
        from chatrun.store.aio import open_existing_store

        assert self.store_url is not None
        try:
            store = await open_existing_store(self.store_url)
        except ChatrunError as exc:
            raise _fail(str(self.store_url), str(exc)) from None
        try:
            name = await self._bot_name(store)
            kept = await stored_versions(store, name)
            wanted = next((v[0] for v in kept if len(spec) >= 4 and v[0].startswith(spec)), spec)
            found = await stored_version(store, name, wanted)
            if found is None:
                listed = ", ".join(f"{label} ({content})" for content, label, _, _ in kept) or "none"
                raise _fail(self.store_url, f"bot {name} has no version {spec!r} kept in the store "
                            f"(it keeps: {listed})")
            self._check_trusted(found)
            return found.write(self.scratch / name)
        finally:
            await store.close()

    def _check_trusted(self, found: Any) -> None:
        """Loading a version runs its handler modules' imports (the checks import them): a stored
        version with code is read only when signed with the servers' bundle key (a data-only one
        is only parsed). Exit 2 naming the version and why otherwise."""
        from chatrun.errors import ChatrunError
        from chatrun.server.bundles import HOW_TO_CONFIGURE, BundlePolicy

        try:
            policy = BundlePolicy.from_env(self.bundle_key, allow_unsigned_data=True)
        except ChatrunError as exc:
            raise _fail("--bundle-key", str(exc)) from None
        refused = policy.refusal(found.signed_part())
        if refused is not None:
            raise _fail(str(self.store_url), f"version {found.content_version} of bot {found.bot} is not read: "
                        f"{refused[1]}; its code is never imported unless signed. For versions your servers "
                        f"published, {HOW_TO_CONFIGURE.replace('chatrun serve', 'chatrun diff')}")

    async def _bot_name(self, store: Any) -> str:
        """The bot whose versions are wanted: --bot's (a name, or the folder's bot), else the
        one bot the store keeps versions of."""
        from chatrun.server.versions import stored_versions

        if self.bot is not None and not Path(self.bot).exists():
            return self.bot
        if self.bot is not None:
            from chatrun.definition.versions import bot_folder

            return str(_load(str(bot_folder(self.bot))).name)
        names = sorted({v[3] for v in await stored_versions(store)})
        if len(names) != 1:
            raise _fail(str(self.store_url), f"keeps versions of {', '.join(names) or 'no bot'}; name one with --bot NAME")
        return names[0]


def _fail(where: str, message: str) -> click.exceptions.Exit:
    """`where: error: message` on stderr; the exit (status 2) to raise. `where` is a file or a
    store's URL, shown without its password (a file's path is shown as given)."""
    from chatrun.store.urls import shown_url

    click.echo(f"{shown_url(where)}: error: {message}", err=True)
    return click.exceptions.Exit(2)


def _load(path: str) -> Any:
    """A loaded bot, or `file:line: message` lines and exit 2."""
    from chatrun.cli._output import print_diagnostics
    from chatrun.definition.loader import load_config
    from chatrun.errors import BotError, ChatrunError

    try:
        config, _warnings = load_config(path)
        return config
    except BotError as exc:
        print_diagnostics([d for d in exc.diagnostics if d.severity == "error"])
    except ChatrunError as exc:
        click.echo(f"{path}: error: {exc}", err=True)
    raise click.exceptions.Exit(2)


@dataclass
class Stored:
    """The stored sessions of the bot, by the version each records (`SessionRecord.bot_version`):
    those on OLD (what `--store` counts), those from before versions were recorded (no
    version: counted apart, as they may run OLD or not), and how many run other versions."""

    old: list[Footprint] = field(default_factory=list)
    unversioned: list[Footprint] = field(default_factory=list)
    other: int = 0

    def to_json(self) -> dict[str, int]:
        return {"old_version": len(self.old), "unversioned": len(self.unversioned), "other_versions": self.other}


def _count(changes: list[Change], url: str, bot: str, version: str) -> Stored:
    """Set each change's `sessions` (the stored sessions of `bot` on content version `version`
    it touches) and `unversioned` (those with no version recorded it touches)."""
    import asyncio

    from chatrun.errors import ChatrunError

    try:
        stored = asyncio.run(_footprints(url, bot, version))
    except (ChatrunError, OSError) as exc:
        raise _fail(url, str(exc)) from None
    for change in changes:
        change.sessions = _touched(change, stored.old)
        change.unversioned = _touched(change, stored.unversioned)
    return stored


def _touched(change: Change, found: list[Footprint]) -> int:
    t = change.touch
    return sum(1 for h in found if t.every or h.routes & t.routes or h.state & t.state
               or h.scope & t.scope or h.tools & t.tools)


async def _footprints(url: str, bot: str, version: str) -> Stored:
    """What each stored session of `bot` holds, by its version, read through the server's store
    (any URL it takes: sqlite:///, redis://)."""
    from chatrun.engine.migrate import footprint
    from chatrun.store.aio import open_existing_store

    store = await open_existing_store(url)
    stored = Stored()
    try:
        for sid in await store.list_sessions():
            record = await store.load_session(sid)
            if record is None or record.bot not in (None, bot):
                continue
            if record.bot_version is None:
                stored.unversioned.append(footprint(record.snapshot, record.memories))
            elif record.bot_version == version:
                stored.old.append(footprint(record.snapshot, record.memories))
            else:
                stored.other += 1
        return stored
    finally:
        await store.close()


def _print(changes: list[Change], stored: Stored | None, old: Any) -> None:
    if not changes:
        click.echo("no changes a session can meet")
    for c in changes:
        mark = "BREAKING" if c.unhandled else ("migrated" if c.breaking else "        ")
        line = f"{mark}  {c.label}: {c.what}"
        if c.breaking:
            line += f" ({c.why})" if c.migrated is None else f" (by {c.migrated})"
        if c.sessions is not None:
            line += f" [{_sessions(c.sessions)}" + (f", {c.unversioned} unversioned" if c.unversioned else "") + "]"
        click.echo(line)
    breaking, unhandled = sum(c.breaking for c in changes), sum(c.unhandled for c in changes)
    click.echo(f"{len(changes)} change(s), {breaking} breaking, {unhandled} not handled by a migration"
               + (_stored_tail(stored, old) if stored is not None else ""))


def _sessions(n: int) -> str:
    return f"{n} session{'s' if n != 1 else ''}"


def _stored_tail(stored: Stored, old: Any) -> str:
    """What the counts cover: the sessions on OLD; those from before versions, apart."""
    label = f"{old.version} ({old.content_version})" if old.version else old.content_version
    tail = f"; {_sessions(len(stored.old))} stored on version {label}"
    if stored.unversioned:
        tail += (f"; {_sessions(len(stored.unversioned))} with no version recorded (stored before versions), "
                 "counted apart as `unversioned`")
    if stored.other:
        tail += f"; {_sessions(stored.other)} on other versions, not counted"
    return tail
