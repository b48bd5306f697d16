"""Bot versions, as the definition stage knows them: a bot's content version (a stable hash
of its files), the files themselves as one bundle (what a store keeps, content-addressed, so
a replica can load a version it was not started with), the `on_change:` policies, and the
layout of a bot served in several versions:

    bots/shop/versions/1/bot.yaml      one directory per version (any names; sorted oldest
    bots/shop/versions/2/bot.yaml      first: numbers numerically, then names)
    bots/shop/versions.yaml            optional: `weights: {"2": 90, "3": 10}` (canary split)

See docs/versions.md.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from chatrun.definition.yamlpos import read_yaml_file
from chatrun.errors import BotError, ChatrunError, Diagnostic

# What a bot's content version covers: the files an edit of which can change the bot
# (the same suffixes `--reload` watches), outside transcripts, caches and hidden folders.
BOT_SUFFIXES = (".yaml", ".yml", ".py", ".j2", ".jinja", ".json")
SKIPPED_FOLDERS = {"transcripts", "__pycache__", "node_modules", "versions"}
HASH_LENGTH = 12  # hex digits of sha256 kept: enough to never meet twice among one bot's versions

PIN = "pin"
MIGRATE = "migrate"
RESTART_SCOPE = "restart_scope"
POLICIES = (PIN, MIGRATE, RESTART_SCOPE)  # anything else names a route
DEFAULT_POLICY = RESTART_SCOPE

VERSIONS_DIR = "versions"
VERSIONS_FILE = "versions.yaml"


def bot_files(root: str | Path) -> dict[str, str]:
    """The bot's files under `root` as {relative path: text}, sorted by path."""
    base = Path(root)
    files: dict[str, str] = {}
    for path in sorted(base.rglob("*")):
        relative = path.relative_to(base)
        if not path.is_file() or path.suffix not in BOT_SUFFIXES:
            continue
        if any(part in SKIPPED_FOLDERS or part.startswith(".") for part in relative.parts[:-1]):
            continue
        files[relative.as_posix()] = path.read_text(encoding="utf-8", errors="replace")
    return files


def content_version(files: dict[str, str]) -> str:
    """A stable hash of a bot's files (their paths and texts): the same files, the same
    version, on any machine."""
    digest = hashlib.sha256()
    for name in sorted(files):
        for part in (name, files[name]):
            data = part.encode("utf-8", "surrogateescape")  # a file name that is no UTF-8: its bytes as on disk
            digest.update(len(data).to_bytes(8, "big"))
            digest.update(data)
    return digest.hexdigest()[:HASH_LENGTH]


def write_bundle(files: dict[str, str], into: Path) -> Path:
    """The files of a stored version written under `into` (made once; kept as a cache).
    Returns the directory to load the bot from."""
    into.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        target = (into / name).resolve()
        if not target.is_relative_to(into.resolve()):  # a stored bundle never writes outside its folder
            raise BotError([Diagnostic(str(into), 1, 1, "error", f"a stored bot version names a file outside it: {name}")])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return into


# -- a bot served in several versions ---------------------------------------------------------


@dataclass
class VersionLayout:
    """Where the versions of one bot live: (label, directory) oldest first, and the weights
    new sessions are split by (label -> weight; empty: all on the newest)."""

    root: Path
    versions: list[tuple[str, Path]]
    weights: dict[str, int] = field(default_factory=dict)


    @property
    def primary(self) -> str:
        """The label of the version new sessions go to as the files say: the largest weight,
        a tie to the newest (no weights: the newest). The server's rule (server/versions.py)."""
        weights = self.weights or {self.versions[-1][0]: 100}
        return max(reversed([label for label, _ in self.versions]), key=lambda label: weights.get(label, 0))

    def folder(self, label: str | None) -> Path:
        """The folder of version `label` (None: the primary); a ChatrunError names the others."""
        wanted = self.primary if label is None else label
        for name, path in self.versions:
            if name == wanted:
                return path
        raise ChatrunError(f"{self.root}: no version {wanted!r} in {VERSIONS_DIR}/ "
                           f"(there are: {', '.join(name for name, _ in self.versions)})")


def bot_folder(path: str | Path, version: str | None = None) -> Path:
    """Where the bot at `path` is: `path` itself, or for a folder with `versions/<v>/bot.yaml`
    (docs/versions.md) the primary version's folder, or version `version`'s."""
    layout = version_layout(path)
    if layout is not None:
        return layout.folder(version)
    if version is not None:
        raise ChatrunError(f"{path}: --version {version}: this bot has no {VERSIONS_DIR}/ folder")
    return Path(path)


def _order(label: str) -> tuple[int, int, str]:
    return (0, int(label), label) if label.isdigit() else (1, 0, label)


def _natural(label: str) -> list[tuple[int, int | str]]:
    """A name as people order it: its runs of digits by value (`1.9` before `1.10`)."""
    return [(0, int(run)) if run.isdigit() else (1, run) for run in re.findall(r"\d+|\D+", label)]


def order_problem(labels: list[str]) -> str | None:
    """Why the order of these version names (oldest first, as served) is not the one their
    numbers suggest, or None: a name that is not a whole number sorts by its text."""
    expected = sorted(labels, key=_natural)
    if expected == labels:
        return None
    wrong = next((a, b) for a, b in zip(labels, expected, strict=True) if a != b)
    return (f"the versions are ordered by folder name, a name that is not a whole number by its text, so "
            f"{wrong[0]!r} is taken to be older than {wrong[1]!r} (the newest, {labels[-1]!r}, takes new "
            f"sessions unless versions.yaml gives weights); name the folders with whole numbers (1, 2, ... 10)")


def version_folders(path: str | Path) -> list[tuple[str, Path]] | None:
    """(label, folder) of each `versions/<label>/bot.yaml` of a bot directory, oldest first;
    None for a directory that is not a bot in versions (it has a bot.yaml of its own, or none)."""
    root = Path(path)
    folder = root / VERSIONS_DIR
    if not root.is_dir() or not folder.is_dir() or (root / "bot.yaml").exists():
        return None
    found = sorted((d.name for d in folder.iterdir() if (d / "bot.yaml").is_file()), key=_order)
    return [(label, folder / label) for label in found] or None


def version_layout(path: str | Path) -> VersionLayout | None:
    """The versions of a bot directory that has `versions/<label>/bot.yaml`, else None."""
    found = version_folders(path)
    if found is None:
        return None
    return VersionLayout(Path(path), found, _weights(Path(path) / VERSIONS_FILE, [label for label, _ in found]))


def _weights(file: Path, labels: list[str]) -> dict[str, int]:
    if not file.is_file():
        return {}
    doc = read_yaml_file(file)  # a syntax error, a file that is not UTF-8: a diagnostic at its line
    errors = [d for d in doc.diagnostics if d.severity == "error"]
    if errors:
        raise BotError(errors)
    text, data = doc.text, doc.data or {}
    weights = data.get("weights") if isinstance(data, dict) else None
    if weights is None:
        return {}
    problem = _weights_problem(weights, labels)
    if problem:
        line = next((i for i, row in enumerate(text.splitlines(), 1) if row.lstrip().startswith("weights")), 1)
        raise BotError([Diagnostic(str(file), line, 1, "error", problem, "weights")])
    return {str(k): int(v) for k, v in weights.items()}


def _weights_problem(weights: object, labels: list[str]) -> str | None:
    if not isinstance(weights, dict) or not weights:
        return "weights must map version names to whole numbers, e.g. weights: {\"2\": 90, \"3\": 10}"
    for label, weight in weights.items():
        if str(label) not in labels:
            return f"weights names version {label!r}, which is not in versions/ (there are: {', '.join(labels)})"
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
            return f"the weight of version {label!r} must be a whole number of 0 or more, not {weight!r}"
    if sum(weights.values()) == 0:
        return "weights must give at least one version a weight above 0"
    return None


_ROUTE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def policy_problem(policy: str, routes: list[str]) -> str | None:
    """Why `on_change: <policy>` is not valid for a bot with these routes, or None."""
    if policy in POLICIES or policy in routes:
        return None
    hint = "" if not _ROUTE_NAME.match(policy) else f" (no route is named {policy!r})"
    return (f"on_change must be one of {', '.join(POLICIES)} or a route name{hint}; "
            f"the routes are: {', '.join(routes)}")
