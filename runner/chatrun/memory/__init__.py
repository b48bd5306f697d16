"""Chat memories: what the model sees of the conversation.

Python counterparts of LangChain4j's ChatMemory: `MessageWindowMemory`,
`TokenWindowMemory`, and `TurnOnlyMemory` (policy `none`: kept for one turn only).
Each has `id`, `add(message)`, `messages()`, `clear()`, `set(messages)`.
"""

from chatrun.memory.window import (
    ChatMemory,
    MessageWindowMemory,
    TokenWindowMemory,
    TurnOnlyMemory,
    make_memory,
)

__all__ = ["ChatMemory", "MessageWindowMemory", "TurnOnlyMemory", "TokenWindowMemory", "make_memory"]
