"""Whether a test card's digits leaked into what a client, a store or a log holds.

The guardrail tests stream or send the card 4111 1111 1111 1111. What they search also holds
random hex ids (sessions, chatcmpl- ids, spans) and timestamps, which hold "4111" by chance (a
24-digit hex id about once in 2,700; the store's records many times more often): a leak is
searched as the card's own digit groups, two of them side by side, which chance does not make."""

from __future__ import annotations

import re

_GROUPS = r"(?:4111|1111)[ -]?1111"
_TEXT = re.compile(_GROUPS)
_BYTES = re.compile(_GROUPS.encode())


def card_leaked(seen: str | bytes) -> bool:
    """True when two of the test card's digit groups stand together in `seen` (spaced, dashed or not)."""
    if isinstance(seen, bytes):
        return _BYTES.search(seen) is not None
    return _TEXT.search(seen) is not None
