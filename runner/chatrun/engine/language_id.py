"""Which language a text is in, offline, for the `languages:` guardrail (engine/guardrails.py,
docs/guardrails.md); the languages it knows are definition/languages.py's.

py3langid (the maintained fork of langid.py: BSD, a 4.6 MB wheel with its model, numpy) is a
naive Bayes classifier over byte n-grams: about 0.1 ms a sentence, 97 languages, and it tells
apart languages that share a script (English from German), which script ranges cannot.
lingua-language-detector is more accurate on short texts but its wheel is 96 MB; langdetect is
slower, unmaintained since 2021 and random unless seeded; fastText's models are downloaded at
run time. The model loads in about a second, once per process, off the event loop.

A short or ambiguous text ("ok", "thanks!") is in no language for sure: it passes. Only a text of
at least MIN_LETTERS letters that is, with a probability of at least MIN_CONFIDENCE, in none of
the allowed languages is refused.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

MIN_LETTERS = 12  # fewer letters: too short to tell ("ok", "merci", a name)
MIN_CONFIDENCE = 0.8  # how sure a refusal must be that the text is in no allowed language
_lock = threading.Lock()
_identifier: Any = None


def _load() -> Any:
    global _identifier
    with _lock:
        if _identifier is None:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier  # type: ignore[import-untyped]

            _identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _identifier


def detector_languages() -> set[str]:
    """The languages the installed model tells apart (a test checks definition/languages.py's list)."""
    return set(_load().labels) - {"zxx"}  # zxx: "no linguistic content"


async def ready() -> None:
    """Load the model (once per process) without stopping the event loop for a second."""
    if _identifier is None:
        await asyncio.to_thread(_load)


def refused(text: str, allowed: tuple[str, ...]) -> str | None:
    """The language `text` is in, if it is surely none of `allowed`; else None."""
    if sum(ch.isalpha() for ch in text) < MIN_LETTERS:
        return None
    ranked = _load().rank(text)  # [(language, probability)], most likely first; they sum to 1
    if ranked[0][0] == "zxx" or sum(p for lang, p in ranked if lang in allowed) > 1 - MIN_CONFIDENCE:
        return None
    return str(ranked[0][0])
