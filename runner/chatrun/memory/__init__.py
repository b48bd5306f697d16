"""Chat memories: what the model sees of the conversation.

Python counterparts of LangChain4j's ChatMemory: `MessageWindowMemory`,
`TokenWindowMemory`, and `TurnOnlyMemory` (policy `none`: kept for one turn only); and
`SummaryMemory` (policy `summary`), which folds its oldest messages into a running summary.
Each has `id`, `add(message)`, `messages()`, `clear()`, `set(messages)`.
"""

from chatrun.memory.window import (
    ChatMemory,
    MessageWindowMemory,
    SummaryMemory,
    TokenWindowMemory,
    TurnOnlyMemory,
    make_memory,
)

__all__ = ["ChatMemory", "MessageWindowMemory", "SummaryMemory", "TokenWindowMemory", "TurnOnlyMemory",
           "make_memory"]
