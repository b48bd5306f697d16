"""A token window sized to the model's context (`max_tokens: {context_size, reply_reserve}`) keeps
the request the model is sent within that context, whatever the conversation holds: an image a
user attached costs the model far more tokens than the line describing it. Through a real
session and the real `openai` SDK against the fake OpenAI server; the images are real PNGs whose
cost is computed from their size by OpenAI's rule for `detail: high` (what `auto` gives a large
image)."""

from __future__ import annotations

import io
import json
import math
import struct
import wave
import zlib

import pytest
import tiktoken

import chatrun
from chatrun.memory.files import measured
from chatrun.memory.tokens import (
    IMAGE_TOKENS,
    MOST_PDF_PAGES,
    PDF_PAGE_TOKENS,
    estimate_counter,
    file_tokens,
    tiktoken_counter,
)
from chatrun.messages import Attachment, UserMessage, message_from_dict
from chatrun.store.blobs import MemoryBlobs

pytestmark = pytest.mark.needs_encodings

CONTEXT, RESERVE = 8000, 1000

BOT = f"""
name: gallery
model: {{provider: openai, name: gpt-4o, max_retries: 0}}
routes:
  main:
    default: true
    system: Describe the pictures.
    attachments: {{kinds: [image/*], max_bytes: 100000, max_count: 3}}
    memory: {{type: token_window, max_tokens: {{context_size: {CONTEXT}, reply_reserve: {RESERVE}}}}}
"""


def png(width: int, height: int, grey: int) -> bytes:
    """A real PNG of that size, one shade of grey (small once compressed)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes([grey]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b"")


def openai_image_tokens(width: int, height: int) -> int:
    """What gpt-4o spends on an image at `detail: high`: fit in 2048x2048, shortest side scaled to
    768, then 170 per 512-pixel tile plus 85."""
    scale = min(1.0, 2048 / max(width, height))
    width, height = width * scale, height * scale
    scale = 768 / min(width, height)
    width, height = width * scale, height * scale
    return 85 + 170 * math.ceil(width / 512) * math.ceil(height / 512)


def request_tokens(request: dict, image_tokens: int) -> int:
    """The tokens of a Chat Completions request's messages: their text (o200k_base, 4 a message),
    each image part at `image_tokens`."""
    enc = tiktoken.get_encoding("o200k_base")
    total = 0
    for message in request["messages"]:
        content = message.get("content") or ""
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        for part in parts:
            total += image_tokens if part["type"] == "image_url" else len(enc.encode(part.get("text", "")))
        total += 4
    return total


def test_a_context_sized_window_keeps_a_conversation_of_images_within_the_context(fake, write_bot):
    session = chatrun.load_bot(write_bot(BOT)).session(blobs=MemoryBlobs())
    cost = openai_image_tokens(768, 2048)  # 2 x 4 tiles: the most one image costs gpt-4o
    assert (cost, openai_image_tokens(1024, 1024), openai_image_tokens(2048, 4096)) == (1445, 765, 1105)  # OpenAI's examples
    for turn in range(6):
        fake.queue({"text": f"Three grey pictures, turn {turn}."})
        refs = [session.attach(png(768, 2048, 3 * turn + i), "image/png", f"p{turn}{i}.png") for i in range(3)]
        session.chat({"userMessage": f"What is in these, turn {turn}?", "attachments": [a.to_dict() for a in refs]})
    sent = fake.requests[-1]
    assert sum(part["type"] == "image_url" for m in sent["messages"] if isinstance(m["content"], list)
               for part in m["content"]) >= 3  # the last turn's pictures are sent
    assert request_tokens(sent, cost) <= CONTEXT - RESERVE


def pdf(pages: int, compressed: bool = False) -> bytes:
    """A real PDF of `pages` pages, a line of text each, written by hand; `compressed`: its page
    objects inside a Flate-compressed object stream (PDF 1.5), where they cannot be read plainly."""
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(pages))
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>"]
    for i in range(pages):
        text = f"BT /F1 12 Tf 20 100 Td (Page {i + 1} of the menu) Tj ET"
        objects += [f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 400 144] /Contents {4 + 2 * i} 0 R >>",
                    f"<< /Length {len(text)} >>\nstream\n{text}\nendstream"]
    if compressed:  # the page tree and pages in one object stream
        packed = zlib.compress(" ".join(objects[1:]).encode())
        objects = [objects[0], f"<< /Type /ObjStm /Filter /FlateDecode /Length {len(packed)} >>\nstream\n"]
    out, offsets = b"%PDF-1.5\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}".encode() + (packed + b"\nendstream" if compressed and number == 2 else b"")
        out += b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    return out + f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()


def wav(seconds: float, rate: int = 8000) -> bytes:
    """A real WAV file (16-bit mono) of that length: a quiet saw tooth."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(b"".join(struct.pack("<h", (i % 100) * 50) for i in range(int(seconds * rate))))
    return buffer.getvalue()


def beyond_text(count, *files: Attachment) -> int:
    """What `count` counts for a message with `files` beyond its text (the files' descriptions are text)."""
    message = UserMessage("look", files)
    return count(message) - count(UserMessage(message.text()))


def test_a_file_counts_what_the_model_spends_on_it_pages_seconds_or_the_most_its_size_holds():
    image = Attachment("a" * 64, "image/png", "p.png", 1234)
    menu, packed, voice = pdf(3), pdf(4, compressed=True), wav(2.5)
    measured_pdf = measured(Attachment("b" * 64, "application/pdf", "menu.pdf", len(menu)), menu)
    measured_wav = measured(Attachment("c" * 64, "audio/wav", "voice.wav", len(voice)), voice)
    assert (measured_pdf.pages, measured_wav.seconds) == (3, 2.5)
    assert measured(Attachment("d" * 64, "application/pdf", "packed.pdf", len(packed)), packed).pages == 4
    unread = Attachment("e" * 64, "application/pdf", "locked.pdf", 2500)  # pages unknown: 3 by its size
    mp3 = Attachment("f" * 64, "audio/mpeg", "voice.mp3", 4000)  # length unknown: 4 s at 8 kbit/s
    by_url = Attachment("https://example.org/menu.pdf", "application/pdf", "menu.pdf")  # sent as its description
    scanned = Attachment("g" * 64, "application/pdf", "scan.pdf", 2_000_000)  # pages unknown, mostly images
    for count in (tiktoken_counter("o200k_base"), estimate_counter):
        assert beyond_text(count, image, image) == 2 * IMAGE_TOKENS
        assert beyond_text(count, measured_pdf, measured_wav) == 3 * PDF_PAGE_TOKENS + 80
        assert file_tokens(measured_pdf) == 3 * (3000 + IMAGE_TOKENS)
        assert file_tokens(measured_wav) == 80 and file_tokens(mp3) == 4 * 32
        assert file_tokens(unread) == 3 * PDF_PAGE_TOKENS and file_tokens(by_url) == 0
        assert file_tokens(scanned) == MOST_PDF_PAGES * PDF_PAGE_TOKENS  # 2 MB of images: not 2,000 pages
    # What is measured is kept with the memory: the count is the same once the session is loaded again.
    again = message_from_dict(json.loads(json.dumps(UserMessage("look", (measured_pdf, measured_wav)).to_dict())))
    assert [(a.pages, a.seconds) for a in again.attachments] == [(3, 0.0), (0, 2.5)]
    assert measured_pdf.to_dict() == {"ref": "b" * 64, "media_type": "application/pdf", "name": "menu.pdf",
                                      "size": len(menu)}  # the reference a client reads back: as before


PDF_BOT = """
name: menus
model: {provider: openai, name: gpt-4o, max_retries: 0, accepts: [text, image, file, audio]}
routes:
  main:
    default: true
    system: Read the menus.
    attachments: {kinds: [application/pdf, audio/wav], max_bytes: 500000, max_count: 3}
    memory: {type: token_window, max_tokens: {context_size: 40000, reply_reserve: 1000}}
"""


def test_a_context_sized_window_keeps_a_conversation_of_pdfs_and_audio_within_the_context(fake, write_bot):
    """Each turn sends a 3-page PDF (13,800 tokens at most) and 10 s of audio: the window keeps the
    ones that fit in 39,000 tokens. A PDF counted by its description, all four were sent."""
    session = chatrun.load_bot(write_bot(PDF_BOT)).session(blobs=MemoryBlobs())
    for turn in range(4):
        fake.queue({"text": f"A menu of three pages, turn {turn}."})
        files = [session.attach(pdf(3) + b"%" + str(turn).encode(), "application/pdf", f"menu{turn}.pdf"),
                 session.attach(wav(10.0 + turn), "audio/wav", f"order{turn}.wav")]
        session.chat({"userMessage": f"What is on this menu, turn {turn}?", "attachments": [a.to_dict() for a in files]})
    sent = fake.requests[-1]
    parts = [part["type"] for m in sent["messages"] if isinstance(m["content"], list) for part in m["content"]]
    assert 1 <= parts.count("file") <= 2 and parts.count("input_audio") == parts.count("file"), parts
    enc = tiktoken.get_encoding("o200k_base")
    spent = sum(len(enc.encode(part.get("text", ""))) if isinstance(part, dict) and part["type"] == "text" else 0
                for m in sent["messages"] for part in (m["content"] if isinstance(m["content"], list)
                                                       else [{"type": "text", "text": m["content"] or ""}]))
    spent += 4 * len(sent["messages"]) + parts.count("file") * 3 * PDF_PAGE_TOKENS + parts.count("input_audio") * 32 * 13
    assert spent <= 40000 - 1000


WORDS = " ".join(f"word{i}" for i in range(400))  # ~1,200 tokens of o200k_base

TOOLS_BOT = f"""
name: helpdesk
model: {{provider: openai, name: gpt-4o, max_retries: 0}}
routes:
  main:
    default: true
    system: Help.
    context: "Reference for this call: {WORDS}"
    tools: [lookup]
    memory: {{type: token_window, max_tokens: {{context_size: {CONTEXT}, reply_reserve: {RESERVE}}}}}
tools:
  lookup:
    description: "Looks a ticket up. {WORDS}"
    parameters: {{type: object, properties: {{ticket: {{type: string, description: "{WORDS}"}}}}}}
    action: {{reply: found}}
"""


def test_a_context_sized_window_leaves_room_for_the_tools_and_the_context_it_is_sent_with(fake, write_bot):
    """The request is the memory and, beside it, the offered tools' schemas and the route's
    `context:`: the window holds what is left of the context once they are counted."""
    session = chatrun.load_bot(write_bot(TOOLS_BOT)).session()
    for turn in range(20):
        fake.queue({"text": f"Answer {turn}: " + " ".join(["fine"] * 300)})
        session.chat(f"Question {turn}: " + " ".join(["why"] * 300))
    sent = fake.requests[-1]
    enc = tiktoken.get_encoding("o200k_base")
    tools = len(enc.encode(json.dumps(sent["tools"])))
    assert tools > 1500  # what the window must leave room for
    assert request_tokens(sent, 0) + tools <= CONTEXT - RESERVE
    assert "Question 19" in sent["messages"][-2]["content"]  # the turn's own message is sent
