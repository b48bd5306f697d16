"""Files cut into passages along their headings, each with its title trail and its anchor.

    Markdown   at each `#`..`######` heading (outside code fences); the anchor is the heading's
               slug as GitHub makes it (`## Refund window` -> `refund-window`), or its `{#id}`
    HTML       at each <h1>..<h6>; the anchor is the heading's `id` (else its slug); scripts,
               styles, navigation and footers left out
    text       in paragraphs; no anchor
    PDF        a passage per page (pypdf, the `pdf` extra); the anchor is `page=N`

A section longer than MAX_CHARS is cut further at paragraph ends, each piece keeping the
section's title and anchor. A passage's title is its document's title, then its headings
("Returns › Refund window"), so a search on either finds it and a citation reads well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

MAX_CHARS = 1500  # a passage's text at most (a few paragraphs): what a model reads per hit
SEPARATOR = " › "


@dataclass(frozen=True)
class Chunk:
    """One passage of a file: where it is (`anchor`, "" for the top), its title trail, its text,
    and its own heading (what the index weighs as its title: a trail would repeat the
    document's title in every passage, and BM25 would then count its words as common)."""

    anchor: str
    title: str
    text: str
    heading: str = ""


def chunk_file(path: Path, data: bytes) -> list[Chunk]:
    """The passages of one file, by its suffix."""
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        return chunk_pdf(path, data)
    text = data.decode("utf-8-sig")  # a byte order mark (as Windows editors save) is not text
    if suffix in (".html", ".htm"):
        return chunk_html(text, path.stem)
    if suffix in (".md", ".markdown"):
        return chunk_markdown(text, path.stem)
    return _split(Chunk("", _humane(path.stem), text.strip(), _humane(path.stem)))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
BOM = "\ufeff"
_EXPLICIT_ID = re.compile(r"\s*\{#([\w-]+)\}\s*$")


def chunk_markdown(text: str, stem: str) -> list[Chunk]:
    """Markdown cut at its headings; the first `#` heading is the document's title."""
    sections: list[tuple[int, str, str, list[str]]] = [(0, "", "", [])]  # (level, heading, anchor, lines)
    fence = ""  # the open code fence's marker ("" outside one)
    for line in text.removeprefix(BOM).splitlines():
        fence = _fence_after(fence, line)
        found = None if fence or _FENCE.match(line) else _HEADING.match(line)
        if found is None:
            sections[-1][3].append(line)
            continue
        heading = found.group(2)
        explicit = _EXPLICIT_ID.search(heading)
        if explicit:
            heading = heading[:explicit.start()]
        sections.append((len(found.group(1)), heading.strip(), explicit.group(1) if explicit else slug(heading), []))
    doc_title = next((h for level, h, _, _ in sections if level == 1), "") or _humane(stem)
    return _titled(sections, doc_title)


def _fence_after(fence: str, line: str) -> str:
    """The open fence after `line` (CommonMark): a fence closes only at a run of its own
    character at least as long, with nothing after it (a ``` fence may hold ~~~ lines)."""
    found = _FENCE.match(line)
    if found is None:
        return fence
    marker, rest = found.groups()
    if not fence:
        return marker
    closes = marker[0] == fence[0] and len(marker) >= len(fence) and not rest.strip()
    return "" if closes else fence


def _titled(sections: list[tuple[int, str, str, list[str]]], doc_title: str) -> list[Chunk]:
    """Sections with their title trails (the document's title, then the headings above each)."""
    out: list[Chunk] = []
    trail: list[tuple[int, str]] = []
    for level, heading, anchor, lines in sections:
        if level:
            trail = [(lv, h) for lv, h in trail if lv < level] + [(level, heading)]
        names = [h for lv, h in trail if not (lv == 1 and h == doc_title)]
        title = SEPARATOR.join([doc_title, *names])
        body = "\n".join(lines).strip()
        if body:
            out += _split(Chunk(anchor, title, body, heading or doc_title))
    return out


def _split(chunk: Chunk) -> list[Chunk]:
    """A long passage cut at paragraph ends (a paragraph longer than MAX_CHARS, at sentence ends)."""
    if len(chunk.text) <= MAX_CHARS:
        return [chunk] if chunk.text else []
    pieces: list[str] = []
    current = ""
    for paragraph in re.split(r"\n\s*\n", chunk.text):
        for part in _sentences(paragraph) if len(paragraph) > MAX_CHARS else [paragraph]:
            if current and len(current) + len(part) + 2 > MAX_CHARS:
                pieces.append(current)
                current = ""
            current = f"{current}\n\n{part}" if current else part
    if current:
        pieces.append(current)
    return [Chunk(chunk.anchor, chunk.title, piece.strip(), chunk.heading) for piece in pieces if piece.strip()]


def _sentences(paragraph: str) -> list[str]:
    parts = re.split(r"(?<=[.!?])\s+", paragraph)
    return [p[i:i + MAX_CHARS] for p in parts for i in range(0, len(p), MAX_CHARS)]


def _humane(stem: str) -> str:
    """A file's name as a title: `refund-policy` -> `Refund policy`."""
    words = re.sub(r"[-_]+", " ", stem).strip()
    return words[:1].upper() + words[1:] if words else stem


class _HtmlSections(HTMLParser):
    """An HTML page's sections: the text under each heading, with the heading's id."""

    SKIPPED = {"script", "style", "nav", "footer", "header", "noscript", "template", "svg"}
    BLOCKS = {"p", "div", "li", "br", "tr", "section", "article", "pre", "blockquote", "dd", "dt", "table"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: list[tuple[int, str, str, list[str]]] = [(0, "", "", [])]
        self.title = ""
        self._skip = 0
        self._in_title = False
        self._heading: tuple[int, str] | None = None  # (level, id) while inside <hN>
        self._heading_text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIPPED:
            self._skip += 1
        elif tag == "title":
            self._in_title = True
        elif re.fullmatch(r"h[1-6]", tag) and not self._skip:
            self._end_heading()  # a heading left open ends where the next begins, as a browser ends it
            self._heading = (int(tag[1]), dict(attrs).get("id") or "")
            self._heading_text = []
        elif tag == "br" and self._heading is not None:  # a line break in a heading: a space in its text
            self._heading_text.append(" ")
        elif tag in self.BLOCKS:
            self._end_heading()  # `<h2>Title<p>text`: the text is the section's, not lost in its heading
            self.sections[-1][3].append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIPPED:
            self._skip = max(0, self._skip - 1)
        elif tag == "title":
            self._in_title = False
        elif re.fullmatch(r"h[1-6]", tag):  # any heading's end tag ends the open one (`<h2>..</h3>`)
            self._end_heading()
        elif tag in self.BLOCKS:
            self.sections[-1][3].append("\n")

    def _end_heading(self) -> None:
        """The open heading, if any, becomes a section."""
        if self._heading is not None:
            level, anchor = self._heading
            heading = " ".join("".join(self._heading_text).split())
            self.sections.append((level, heading, anchor or slug(heading), []))
            self._heading = None

    def close(self) -> None:
        super().close()
        self._end_heading()  # a heading never closed: its text is kept

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif self._skip:
            return
        elif self._heading is not None:
            self._heading_text.append(data)
        else:
            self.sections[-1][3].append(data)


def chunk_html(text: str, stem: str) -> list[Chunk]:
    """An HTML page cut at its headings; its <title> (else its first <h1>) is the document's title."""
    parser = _HtmlSections()
    parser.feed(text.removeprefix(BOM))
    parser.close()
    sections = [(level, heading, anchor, [_tidy("".join(parts))]) for level, heading, anchor, parts in parser.sections]
    first_h1 = next((h for level, h, _, _ in sections if level == 1), "")
    doc_title = " ".join(parser.title.split()) or first_h1 or _humane(stem)
    return _titled(sections, doc_title)


def _tidy(text: str) -> str:
    """Runs of spaces folded, blank lines kept as paragraph ends."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def chunk_pdf(path: Path, data: bytes) -> list[Chunk]:
    """A passage (or a few) per page; the document's title is its metadata title, else its name."""
    import io

    from pypdf import PdfReader  # the `pdf` extra; validate says when it is missing

    reader = PdfReader(io.BytesIO(data))
    meta_title = (reader.metadata.title if reader.metadata else None) or ""
    doc_title = meta_title.strip() or _humane(path.stem)
    out: list[Chunk] = []
    for number, page in enumerate(reader.pages, start=1):
        text = _tidy(page.extract_text() or "")
        out += _split(Chunk(f"page={number}", f"{doc_title}{SEPARATOR}page {number}", text, doc_title))
    return out
