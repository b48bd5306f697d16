"""What decides a model's cost of an attached file, read from its bytes: a PDF's pages, an audio
file's seconds (`measured`). The engine measures each file a message attaches once, where it holds
the bytes (`Session._attachments_of`); the token counters read the result off the `Attachment`
(memory/tokens.py, `attached_tokens`). What cannot be read is left 0: the counter then estimates
from the byte size."""

from __future__ import annotations

import dataclasses
import io
import re
import wave
import zlib

from chatrun.messages import AUDIO_FORMATS, Attachment

_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")  # a page object (not /Pages)
_COUNT = re.compile(rb"/Type\s*/Pages\b[^>]*?/Count\s+(\d+)|/Count\s+(\d+)[^>]*?/Type\s*/Pages\b", re.S)
_STREAM = re.compile(rb"stream\r?\n(.*?)endstream", re.S)
_MOST_INFLATED = 1 << 20  # per stream: object streams are small; an image's pixels are not read


def measured(attachment: Attachment, data: bytes) -> Attachment:
    """`attachment` with its pages (a PDF) or seconds (WAV audio) read from `data`."""
    if attachment.media_type == "application/pdf":
        return dataclasses.replace(attachment, pages=pdf_pages(data))
    if AUDIO_FORMATS.get(attachment.media_type) == "wav":
        return dataclasses.replace(attachment, seconds=wav_seconds(data))
    return attachment


def pdf_pages(data: bytes) -> int:
    """A PDF's pages: its page objects, or its page tree's /Count if that says more, also inside
    compressed object streams (PDF 1.5). 0 when none is found (not a PDF, encrypted)."""
    texts = [data, *_inflated_streams(data)]
    objects = sum(len(_PAGE.findall(text)) for text in texts)
    counted = max((int(a or b) for text in texts for a, b in _COUNT.findall(text)), default=0)
    return max(objects, counted)


def _inflated_streams(data: bytes) -> list[bytes]:
    out = []
    for match in _STREAM.finditer(data):
        try:
            out.append(zlib.decompressobj().decompress(match.group(1), _MOST_INFLATED))
        except zlib.error:  # not Flate (an image's DCT), or damaged
            continue
    return out


def wav_seconds(data: bytes) -> float:
    """A WAV file's length in seconds, from its header; 0.0 when it cannot be read."""
    try:
        with wave.open(io.BytesIO(data)) as audio:
            rate, frame = audio.getframerate(), audio.getsampwidth() * audio.getnchannels()
            frames = min(audio.getnframes(), len(data) // frame) if frame else 0  # a header may claim more
            return frames / rate if rate else 0.0
    except (wave.Error, EOFError, ValueError):
        return 0.0
