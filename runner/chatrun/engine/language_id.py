"""Which language a text is in, offline, for the `languages:` guardrail (engine/guardrails.py,
docs/guardrails.md).

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

# py3langid's languages (ISO 639-1 where there is one); tests/test_guardrails_kinds.py checks the
# installed model has these, so the validator need not load it.
KNOWN = frozenset(
    "ace af am an ar ary arz as az ba bcl be bg bn br bs ca crh cs cy da de dz el en eo es et eu ext fa fi fo "
    "fr fuv fy ga gcf gcr gd gl gom grc gu gug guw ha hbo he hi hr ht hu hy id ig is it ja jv ka kab kik kk km "
    "kn ko ku ky la lb lg lij ln lo lt ltg lv mg mk ml mn mr ms mt my ne nl nn no nso oc om or pa pcm pl ps pt "
    "qu ro ru rw sa sdh se si sk sl sn so sq sr st sv sw ta te tg th tk tl tr tt ug uk ur uz uzs vec vi vo wa "
    "wuu xh yo yue zh zu".split())

# How a refusal names a language: in that language (a user writing in another one may not read the
# bot's locale; the name of their own language, and of the ones allowed in theirs, they do).
ENDONYMS = {
    "ar": "العربية", "bg": "български", "bn": "বাংলা", "ca": "català", "cs": "čeština", "da": "dansk",
    "de": "Deutsch", "el": "Ελληνικά", "en": "English", "es": "español", "et": "eesti", "fa": "فارسی",
    "fi": "suomi", "fr": "français", "he": "עברית", "hi": "हिन्दी", "hr": "hrvatski", "hu": "magyar",
    "id": "Bahasa Indonesia", "it": "italiano", "ja": "日本語", "ko": "한국어", "lt": "lietuvių",
    "lv": "latviešu", "ms": "Bahasa Melayu", "nl": "Nederlands", "no": "norsk", "pl": "polski",
    "pt": "português", "ro": "română", "ru": "русский", "sk": "slovenčina", "sl": "slovenščina",
    "sr": "српски", "sv": "svenska", "sw": "Kiswahili", "th": "ไทย", "tr": "Türkçe", "uk": "українська",
    "ur": "اردو", "vi": "Tiếng Việt", "zh": "中文"}


def available() -> bool:
    """Whether py3langid is installed (`pip install chatrun[language]`)."""
    import importlib.util

    return importlib.util.find_spec("py3langid") is not None


def names(codes: tuple[str, ...]) -> str:
    """The allowed languages as a refusal names them: "English, Deutsch"."""
    return ", ".join(ENDONYMS.get(code, code) for code in codes)


_lock = threading.Lock()
_identifier: Any = None


def _load() -> Any:
    global _identifier
    with _lock:
        if _identifier is None:
            from py3langid.langid import MODEL_FILE, LanguageIdentifier  # type: ignore[import-untyped]

            _identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    return _identifier


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
