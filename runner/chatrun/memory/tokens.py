"""Token counting for token-window memories.

A `TokenCounter` is any callable `Message -> int` (LangChain4j's TokenCountEstimator,
one message at a time). `tiktoken_counter()` builds the default one:

    tokens(message.text()) + MESSAGE_OVERHEAD

- The encoding is the one named (policy `encoding`), else the model's
  (`tiktoken.encoding_for_model`), else `o200k_base` (gpt-4o, gpt-4o-mini, o-series) when
  no model is given or tiktoken does not know the model.
- `message.text()` of an assistant message already includes each tool call as
  `name(arguments)`, so tool calls are counted.
- An attached file counts what the model spends on it, not the line that describes it (a
  window sized to the model's context must hold the request it is sent): an image
  IMAGE_TOKENS, a PDF PDF_PAGE_TOKENS a page, audio AUDIO_TOKENS_PER_SECOND (`attached_tokens`).
- MESSAGE_OVERHEAD = 4: OpenAI's chat format spends 3-4 tokens per message on role and
  separators; we take the upper value so the window errs on the safe side. The 3 tokens
  that prime the reply are not counted (they belong to the request, not to a message).

tiktoken downloads its encoding files at first use. Without network that fails: we warn
once per process (naming TIKTOKEN_CACHE_DIR) and count with `estimate_tokens` instead,
ceil(len(text) / 4) + MESSAGE_OVERHEAD, the usual ~4 characters per token of English text.
Counting never raises into a turn. Encodings are loaded once per process.

A transcript may pin its counter (`tokenizer: estimate` or an encoding name, see
`pinned_counter`): the window it was written against is then the same on every machine.
`counter_label` names a counter for people (`/memory`, the inspector, transcript diffs).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

from chatrun.errors import ChatrunError
from chatrun.messages import Attachment, Message

TokenCounter = Callable[[Message], int]

MESSAGE_OVERHEAD = 4
# What one attached image costs the model, whatever its size (a counter sees its reference, not
# its pixels), so the upper value: gpt-4o spends at most 1,445 at `detail: high` (85 + 8 tiles of
# 170: 768 x 2048 once scaled), Claude about 1,600 (its largest image, width x height / 750).
IMAGE_TOKENS = 1600
# A PDF is sent as each page's text and an image of each page (OpenAI's and Claude's file input):
# Claude's documents say 1,500 to 3,000 text tokens a page, so the upper value, plus a page image.
PDF_PAGE_TOKENS = 3000 + IMAGE_TOKENS
# Audio costs by its length: gpt-4o's audio input about 10 tokens a second, Gemini's 32: the upper.
AUDIO_TOKENS_PER_SECOND = 32
# Where a file's pages or length could not be read from its bytes (a URL, an encrypted PDF, an
# MP3, whose length a header does not say): its size read as the most pages or seconds it can
# hold: a PDF page of plain text takes about 1,000 bytes or more, audio at 8 kbit/s (MP3's lowest
# rate) 1,000 bytes a second; WAV is at least 8,000.
BYTES_PER_PDF_PAGE = 1000
# ...but no more pages than the providers take in one PDF (OpenAI's and Claude's limit: 100): a
# scanned PDF whose pages cannot be read would otherwise count a page per kilobyte of its images.
MOST_PDF_PAGES = 100
BYTES_PER_AUDIO_SECOND = 1000
DEFAULT_ENCODING = "o200k_base"
CHARS_PER_TOKEN = 4
ESTIMATE = "estimate"  # the name of the offline counter (a transcript's `tokenizer: estimate`)
COUNT_ATTRIBUTE = "_token_count"  # on a message: (encoding name, tokens), see remember_count

_lock = threading.Lock()
# encoding name -> tiktoken.Encoding, or None when it could not be loaded (we never retry:
# a download attempt per message would make every add slow on an offline machine).
_encodings: dict[str, Any] = {}
_warned = False


class TokenizerUnavailableWarning(UserWarning):
    """tiktoken could not load an encoding; token counts are estimated."""


def estimate_tokens(text: str) -> int:
    """The fallback estimate of the tokens in `text`: ~4 characters per token."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def encoding_name(encoding: str | None = None, model_name: str | None = None) -> str:
    """The tiktoken encoding to use: `encoding` if given, else the model's, else o200k_base."""
    import tiktoken

    if encoding:
        if encoding not in tiktoken.list_encoding_names():
            known = ", ".join(sorted(tiktoken.list_encoding_names()))
            raise ChatrunError(f"unknown tiktoken encoding {encoding!r}; use one of: {known}")
        return encoding
    if model_name:
        try:
            return tiktoken.encoding_name_for_model(model_name)
        except KeyError:  # a model tiktoken does not know (local models, new names)
            pass
    return DEFAULT_ENCODING


def load_encoding(name: str) -> Any | None:
    """The tiktoken Encoding `name`, loaded once per process; None if it cannot be loaded."""
    global _warned
    if name in _encodings:
        return _encodings[name]
    with _lock:
        if name in _encodings:
            return _encodings[name]
        import tiktoken

        try:
            enc = tiktoken.get_encoding(name)
        except Exception as exc:  # requests ConnectionError offline, a hash mismatch, a bad cache dir
            enc = None
            if not _warned:
                _warned = True
                _warn_offline(name, exc)
        _encodings[name] = enc
        return enc


def _warn_offline(name: str, exc: Exception) -> None:
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or "unset"
    text = (
        f"tiktoken could not load the {name} encoding ({type(exc).__name__}), so token counts "
        "are estimated at 4 characters per token; to count exactly, set TIKTOKEN_CACHE_DIR "
        f"to a folder holding tiktoken's encoding files (it is now {cache})."
    )
    try:
        warnings.warn(text, TokenizerUnavailableWarning, stacklevel=4)
    except Warning:  # warnings turned into errors (-W error): still never fail a turn
        logging.getLogger("chatrun.memory").warning(text)


def remember_count(message: Message, encoding: str, tokens: int) -> None:
    """Keep a message's count with the message: messages are immutable, so the count of one
    message object never changes, and a turn that estimates its usage (a model that reports
    none) sends the same messages call after call (measured: 63% of a turn at 1,000 messages
    went to counting them again). One (encoding, count) pair, not a dict: a process almost
    always counts with one encoding, and an idle session holds many messages."""
    object.__setattr__(message, COUNT_ATTRIBUTE, (encoding, tokens))  # frozen: not a field, not compared


def attached_tokens(message: Message) -> int:
    """The tokens of the files attached to `message`, beyond their description in
    `message.text()`: sent as content parts, they cost the model far more (`file_tokens`)."""
    attachments = getattr(message, "attachments", ())
    return sum(map(file_tokens, attachments)) if attachments else 0


def file_tokens(attachment: Attachment) -> int:
    """What one attached file costs the model at most: an image IMAGE_TOKENS; a PDF
    PDF_PAGE_TOKENS a page; audio AUDIO_TOKENS_PER_SECOND. Pages and seconds as measured from
    its bytes (memory/files.py), else the most its size can hold (BYTES_PER_PDF_PAGE,
    BYTES_PER_AUDIO_SECOND; at most MOST_PDF_PAGES pages so). A PDF or audio sent by URL is sent as its description: 0 more."""
    kind = attachment.kind
    if kind == "image":
        return IMAGE_TOKENS
    if kind == "file" and not attachment.is_url:
        pages = attachment.pages or min(math.ceil(attachment.size / BYTES_PER_PDF_PAGE), MOST_PDF_PAGES)
        return PDF_PAGE_TOKENS * pages
    if kind == "audio" and not attachment.is_url:
        seconds = attachment.seconds or attachment.size / BYTES_PER_AUDIO_SECOND
        return math.ceil(AUDIO_TOKENS_PER_SECOND * seconds)
    return 0


def estimate_counter(message: Message) -> int:
    """The fallback counter: ceil(len(text) / 4) + MESSAGE_OVERHEAD, plus attached files."""
    return estimate_tokens(message.text()) + MESSAGE_OVERHEAD + attached_tokens(message)


# Why the ignore: mypy has no attributes on functions; which counter counts is worth showing.
estimate_counter.encoding = ESTIMATE  # type: ignore[attr-defined]


def counter_name(counter: TokenCounter) -> str:
    """What counts with `counter`: a tiktoken encoding's name, `estimate`, or `custom`."""
    return str(getattr(counter, "encoding", "custom"))


def counter_label(counter: TokenCounter) -> str:
    """`counter_name` saying whether the counts are exact: "o200k_base (exact)", "estimate"."""
    name = counter_name(counter)
    return name if name in (ESTIMATE, "custom") else f"{name} (exact)"


def known_tokenizers() -> list[str]:
    """What a transcript's `tokenizer:` may name: `estimate` or a tiktoken encoding."""
    import tiktoken

    return [ESTIMATE, *sorted(tiktoken.list_encoding_names())]


def pinned_counter(tokenizer: str) -> TokenCounter:
    """The counter a transcript pinned (`tokenizer: estimate` or an encoding name), whatever the
    policy or the model would pick, so a replay gives the same window on every machine.

    Raises ChatrunError for an unknown name, or for an encoding tiktoken cannot load here
    (counting otherwise would silently give another window than the one the file was written with).
    """
    if tokenizer == ESTIMATE:
        return estimate_counter
    name = encoding_name(tokenizer)
    if load_encoding(name) is None:
        cache = os.environ.get("TIKTOKEN_CACHE_DIR") or "unset"
        raise ChatrunError(f"tokenizer {name} is pinned but tiktoken cannot load its encoding file here "
                           f"(TIKTOKEN_CACHE_DIR is {cache}); point TIKTOKEN_CACHE_DIR at a folder holding it, "
                           "or pin `tokenizer: estimate`, which counts the same on every machine")
    return tiktoken_counter(name)


def tiktoken_counter(encoding: str | None = None, model_name: str | None = None) -> TokenCounter:
    """A counter using tiktoken (see the module doc), or the estimate when tiktoken cannot load.

    Raises ChatrunError only for an encoding name tiktoken does not define (a bot error).
    """
    enc = load_encoding(encoding_name(encoding, model_name))
    if enc is None:
        return estimate_counter
    encode = enc.encode_ordinary  # ordinary: text like "<|endoftext|>" in a message is just text
    name = enc.name

    def count(message: Message) -> int:
        known = getattr(message, COUNT_ATTRIBUTE, None)  # a message with slots: the field (messages.py)
        if known is not None and known[0] == name:
            return known[1]
        text = message.text()
        try:
            tokens = len(encode(text)) + MESSAGE_OVERHEAD + attached_tokens(message)
        except Exception:  # never fail a turn over a count
            return estimate_tokens(text) + MESSAGE_OVERHEAD + attached_tokens(message)
        remember_count(message, name, tokens)
        return tokens

    # Why the ignore: mypy has no attributes on functions; which encoding counts is worth showing.
    count.encoding = enc.name  # type: ignore[attr-defined]
    return count
