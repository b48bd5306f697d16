"""The bot's `knowledge:` sources as the definition stage sees them: which files a source reads,
and what `chatrun validate` says about them — a folder that is missing, holds nothing to read,
or a file that cannot be read — so that no source fails silently at run time.

The files are read, cut into passages and indexed by chatrun.knowledge (a layer above); the
one rule of which files a source holds is here, so validate and the index agree.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from chatrun.definition.config import BotConfig, KnowledgeSource
from chatrun.definition.sources import suggest

if TYPE_CHECKING:
    from chatrun.definition.kinds import Checks

# The files a source reads when it declares no `include:`, by suffix.
SUPPORTED = (".md", ".markdown", ".html", ".htm", ".txt", ".pdf")
URL_FIELDS = ("path", "anchor")  # what a source's `url:` may fill in
# A knowledge file, a web page or a sitemap larger than this is not read: left out, and said.
MAX_BYTES = 10_000_000
# A source's `language:`: PostgreSQL's built-in text search configurations (pg_ts_config of
# PostgreSQL 13 to 17; tests/test_knowledge_postgres.py compares this list with the server's).
TEXT_SEARCH_CONFIGS = ("arabic", "armenian", "basque", "catalan", "danish", "dutch", "english", "finnish", "french",
                       "german", "greek", "hindi", "hungarian", "indonesian", "irish", "italian", "lithuanian",
                       "nepali", "norwegian", "portuguese", "romanian", "russian", "serbian", "simple", "spanish",
                       "swedish", "tamil", "turkish", "yiddish")


def source_folder(root: str | Path, source: KnowledgeSource) -> Path:
    """The source's folder (relative to the bot's directory)."""
    return (Path(root) / source.path).resolve()


def source_files(root: str | Path, source: KnowledgeSource) -> list[Path]:
    """The files the source reads, sorted: those its `include:` globs match, else every file of
    a supported kind, subfolders included (hidden files and folders left out), and only those
    inside its folder (`source_listing`: a link out of it is left out)."""
    return source_listing(root, source)[0]


def source_listing(root: str | Path, source: KnowledgeSource) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """(the files the source reads, the (file, target) of each it leaves out because it leads
    out of the folder: a symbolic link to a file elsewhere, or through a linked folder). What a
    bot's model is given is what its folder holds, never a file a link reaches (`/etc/...`)."""
    folder = source_folder(root, source)
    if source.web or not folder.is_dir():  # web pages are fetched by `chatrun index` (chatrun.knowledge.web)
        return [], []
    if source.include:
        found = {p for pattern in source.include if not escaping_pattern(pattern) for p in folder.glob(pattern)}
    else:
        found = {p for p in folder.rglob("*") if p.suffix.lower() in SUPPORTED}
    inside: list[Path] = []
    outside: list[tuple[Path, Path]] = []
    for path in sorted(p for p in found if p.is_file() and not _hidden(p.relative_to(folder))):
        target = path.resolve()
        if target.is_relative_to(folder):
            inside.append(path)
        else:
            outside.append((path, target))
    return inside, outside


def escaping_pattern(pattern: str) -> bool:
    """An `include:` pattern that names files outside the folder: absolute, or with a `..` part."""
    return pattern.startswith(("/", "\\")) or bool(re.match(r"^[A-Za-z]:", pattern)) or ".." in re.split(r"[/\\]", pattern)


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def too_large(size: int) -> str | None:
    """Why a file or page of `size` bytes is not read (None: it is): larger than MAX_BYTES."""
    return f"is larger than {MAX_BYTES // 1_000_000} MB" if size > MAX_BYTES else None


def unreadable(path: Path) -> str | None:
    """Why the file cannot be read as text (None: it can): bad UTF-8, a PDF that is not one,
    or PDF support not installed."""
    try:
        data = path.read_bytes()
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return unreadable_bytes(path, data)


def unreadable_bytes(path: Path, data: bytes) -> str | None:
    """Why `data`, read from `path`, cannot be read as text (None: it can); `unreadable`'s rule
    for bytes already read (a refresh reads each file once, so its hash and passages agree)."""
    if path.suffix.lower() == ".pdf":
        if not data.startswith(b"%PDF-"):
            return "is not a PDF file (it does not start with %PDF-)"
        try:
            import pypdf  # noqa: F401  (only whether it is installed)
        except ImportError:
            return "is a PDF, and reading PDFs needs the `pdf` extra: pip install 'chatrun[pdf]'"
        return None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"is not UTF-8 text (byte {e.start}); save it as UTF-8"
    return None


def check_knowledge(config: BotConfig, checks: Checks) -> None:
    """Each source's folder exists and holds readable files with text in them; each route reads
    declared sources; a `url:` fills in only `{path}` and `{anchor}`."""
    root = config.root or "."
    for source in config.knowledge.values():
        _check_source(root, source, checks)
        if source.language is not None and source.language not in TEXT_SEARCH_CONFIGS:
            hint = suggest(source.language, TEXT_SEARCH_CONFIGS) or f"; write one of {', '.join(TEXT_SEARCH_CONFIGS)}"
            checks.add("error", f"knowledge source `{source.name}`: `language: {source.language}` is not one of "
                       f"PostgreSQL's text search configurations{hint}", "knowledge", source.name, "language")
        if source.embeddings and config.model.provider != "openai":
            checks.add("warning", f"knowledge source `{source.name}`: `embeddings: {source.embeddings}` needs an "
                       f"OpenAI-compatible endpoint, and the bot's model is `{config.model.provider}`; its searches "
                       "use BM25 alone (set the bot's `model:` to an openai provider, or remove `embeddings:`)",
                       "knowledge", source.name, "embeddings")
    for route in config.routes.values():
        if route.knowledge is None:
            continue
        for name in route.knowledge.sources:
            if name not in config.knowledge:
                checks.add("error", f"route `{route.name}` reads knowledge source `{name}`, which the bot does not "
                           f"declare{suggest(name, config.knowledge)}; declare it under the top-level `knowledge:`",
                           "routes", route.name, "knowledge")


def _check_source(root: str, source: KnowledgeSource, checks: Checks) -> None:
    at = ("knowledge", source.name)
    if _check_kind(source, checks):
        return
    for field in re.findall(r"\{([^{}]*)\}", source.url or ""):
        if field not in URL_FIELDS:
            checks.add("error", f"knowledge source `{source.name}`: `url` fills in `{{{field}}}`, which is not known"
                       f"{suggest(field, URL_FIELDS)}; it may use {{path}} and {{anchor}}", *at, "url")
    folder = source_folder(root, source)
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        checks.add("error", f"knowledge source `{source.name}`: its folder `{source.path}` ({folder}) {what}",
                   *at, "path")
        return
    for pattern in source.include or ():
        if escaping_pattern(pattern):
            checks.add("error", f"knowledge source `{source.name}`: `include` pattern `{pattern}` reaches out of its "
                       f"folder `{source.path}`; a pattern is relative to the folder (move the files into it, or "
                       "point `path` at the folder that holds them)", *at, "include")
    files, outside = source_listing(root, source)
    for path, target in outside:
        checks.add("warning", f"knowledge source `{source.name}`: file `{path.relative_to(folder).as_posix()}` "
                   f"leads out of its folder (to {target}) and is left out; copy the file into the folder, or "
                   "point `path` at the folder that holds it", *at, "path")
    if not files:
        kinds = ", ".join(source.include) if source.include else ", ".join(SUPPORTED)
        checks.add("error", f"knowledge source `{source.name}` is empty: its folder `{source.path}` holds no file "
                   f"matching {kinds}", *at, "path")
        return
    _check_files(source, folder, files, checks)


def _check_files(source: KnowledgeSource, folder: Path, files: list[Path], checks: Checks) -> None:
    """Each file is readable (an error), not too large (left out: a warning) and not empty (a
    warning); a source whose every file is empty is an error."""
    at = ("knowledge", source.name, "path")
    empty = 0
    for path in files:
        name = path.relative_to(folder).as_posix()
        size = path.stat().st_size
        big = too_large(size)
        problem = None if big else unreadable(path)
        if big:
            checks.add("warning", f"knowledge source `{source.name}`: file `{name}` {big} and is left out; "
                       "split it into smaller files", *at)
        elif problem is not None:
            checks.add("error", f"knowledge source `{source.name}`: file `{name}` {problem}", *at)
        elif size == 0:
            empty += 1
            checks.add("warning", f"knowledge source `{source.name}`: file `{name}` is empty", *at)
    if empty == len(files):
        checks.add("error", f"knowledge source `{source.name}` is empty: every file in `{source.path}` is empty", *at)


def _check_kind(source: KnowledgeSource, checks: Checks) -> bool:
    """A source is a folder (`path`), a list of pages (`urls`) or a sitemap, never two; the keys
    of one kind are not given to another. True: a web source (checked here; nothing is fetched)."""
    at = ("knowledge", source.name)
    kinds = [key for key, given in (("path", source.path), ("urls", source.urls), ("sitemap", source.sitemap)) if given]
    if not kinds:
        checks.add("error", f"knowledge source `{source.name}` has no `path` (a folder), `urls` or `sitemap`: "
                   "declare one of them", *at)
        return True
    if len(kinds) > 1:
        checks.add("error", f"knowledge source `{source.name}` has both `{kinds[0]}` and `{kinds[1]}`: a source is a "
                   "folder (`path`), web pages (`urls`) or a `sitemap`; declare each as a source of its own",
                   *at, kinds[1])
        return True
    if not source.web:
        for key, given in (("exclude", source.exclude), ("max_pages", source.max_pages is not None)):
            if given:
                checks.add("error", f"knowledge source `{source.name}`: `{key}` is for a `sitemap`'s pages; a folder "
                           "chooses its files with `include`", *at, key)
        return False
    if source.url:
        checks.add("error", f"knowledge source `{source.name}`: a web page's passages link to the page itself "
                   "(its URL and #anchor); remove `url`", *at, "url")
    if source.urls:
        for key, given in (("include", source.include), ("exclude", source.exclude),
                           ("max_pages", source.max_pages is not None)):
            if given:
                checks.add("error", f"knowledge source `{source.name}`: `{key}` is for a `sitemap`'s pages; `urls` "
                           "lists the pages themselves (remove the ones not wanted)", *at, key)
    return True
