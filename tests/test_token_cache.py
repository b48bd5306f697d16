"""A message's token count is kept with the message (memory/tokens.py remember_count)."""

from __future__ import annotations

import pytest
import tiktoken

from chatrun.memory.tokens import MESSAGE_OVERHEAD, tiktoken_counter
from chatrun.messages import SystemMessage


@pytest.mark.needs_encodings
def test_a_kept_count_is_only_reused_by_the_same_encoding():
    text = "Réservez un vol pour Dublin en juillet, s'il vous plaît."
    message = SystemMessage(text)
    o200k, cl100k = tiktoken_counter("o200k_base"), tiktoken_counter("cl100k_base")
    assert o200k(message) == len(tiktoken.get_encoding("o200k_base").encode(text)) + MESSAGE_OVERHEAD
    assert cl100k(message) == len(tiktoken.get_encoding("cl100k_base").encode(text)) + MESSAGE_OVERHEAD
    assert o200k(message) != cl100k(message)
    # The kept count is no field: equality, the dict form and the wire form do not change.
    assert message == SystemMessage(text) and message.to_dict() == {"role": "system", "content": text}
