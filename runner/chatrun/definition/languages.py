"""The languages a `languages:` guardrail may name, and how its refusal names them (the
validator reads these without loading the detector; engine/language_id.py detects)."""

from __future__ import annotations

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
