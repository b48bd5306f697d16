"""LangChain4j's MessageWindowChatMemoryTest and TokenWindowChatMemoryTest, ported.

Every Java test is here under its Java name, with every expected list unchanged. Where chatrun
differs on purpose, the test checks chatrun's documented behaviour and names the sentence of
docs/memory.md ("Differences from LangChain4j") that states it; the Java expectation stays
beside it as LANGCHAIN4J.

Token windows: the Java tests count with OpenAiTokenCountEstimator(gpt-4o-mini) and assert the
count of each message; JavaEstimates gives each message exactly that count, so the windows
see the same numbers. The Java window also holds the 3 tokens a request adds
(EXTRA_TOKENS_PER_REQUEST); chatrun's does not, so a Java maximum of N is chatrun's N - 3.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chatrun.errors import ChatrunError
from chatrun.memory import MessageWindowMemory, TokenWindowMemory
from chatrun.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.store.memory import InMemoryStore

MEMORY_DOC = (Path(__file__).resolve().parents[1] / "docs" / "memory.md").read_text()

SYSTEM_FIRST = "chatrun always keeps the system message first; there is no `alwaysKeepSystemMessageFirst(false)`."
NO_REQUEST_TOKENS = ("A token window counts the messages only: the 3 tokens a request adds to prime the reply are not "
                     "part of it, so chatrun's window of N tokens keeps what LangChain4j's window of N + 3 keeps.")
STORE_READ_ONCE = ("The store is read once, when the memory is built, and written once per change: `messages()` never "
                   "reads it (LangChain4j reads the store on every `add` and every `messages()`).")
ONE_AT_A_TIME = "`add` takes one message and `set` takes a list (LangChain4j's are varargs)."


def deliberate(sentence: str) -> None:
    """A deliberate difference: the sentence must be in docs/memory.md, word for word."""
    assert sentence in MEMORY_DOC, f"docs/memory.md no longer says: {sentence}"


def test_every_deliberate_difference_is_documented():
    for sentence in (SYSTEM_FIRST, NO_REQUEST_TOKENS, STORE_READ_ONCE, ONE_AT_A_TIME):
        deliberate(sentence)


# -- helpers: LangChain4j's constructors --------------------------------------------------------


def user_message(text: str) -> UserMessage:
    return UserMessage(text)


def ai_message(text: str) -> AssistantMessage:
    return AssistantMessage(text)


def system_message(text: str) -> SystemMessage:
    return SystemMessage(text)


def calculator(id: str, arguments: str) -> ToolCall:
    return ToolCall(id, "calculator", arguments)


def add_all(memory, *messages: Message) -> None:
    for message in messages:  # ONE_AT_A_TIME
        memory.add(message)


class HitCountStore(InMemoryStore):
    """LangChain4j's HitCountChatMemoryStore: counts get/update/delete calls."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = [0, 0, 0]

    def get_messages(self, memory_id):
        self.hits[0] += 1
        return super().get_messages(memory_id)

    def update_messages(self, memory_id, messages):
        self.hits[1] += 1
        super().update_messages(memory_id, messages)

    def delete_messages(self, memory_id):
        self.hits[2] += 1
        super().delete_messages(memory_id)

    def measure(self, action) -> tuple[int, int, int]:
        before = list(self.hits)
        action()
        return tuple(after - was for after, was in zip(self.hits, before, strict=True))


# ============================================================================================
# MessageWindowChatMemoryTest
# ============================================================================================


class TestMessageWindowChatMemoryTest:
    def test_id(self):
        assert MessageWindowMemory(max_messages=1).id == "default"
        assert MessageWindowMemory("abc", max_messages=1).id == "abc"

    def test_store_and_clear(self):
        memory = MessageWindowMemory(max_messages=2)
        memory.add(user_message("hello"))
        memory.add(user_message("world"))
        assert memory.messages() == [user_message("hello"), user_message("world")]
        memory.add(user_message("banana"))
        assert memory.messages() == [user_message("world"), user_message("banana")]
        memory.clear()
        memory.clear()  # idempotent
        assert memory.messages() == []

    def test_should_keep_specified_number_of_messages_in_chat_memory(self):
        memory = MessageWindowMemory(max_messages=3)
        first_user = user_message("hello")
        memory.add(first_user)
        assert memory.messages() == [first_user]
        first_ai = ai_message("hi")
        memory.add(first_ai)
        assert memory.messages() == [first_user, first_ai]
        second_user = user_message("sup")
        memory.add(second_user)
        assert memory.messages() == [first_user, first_ai, second_user]
        second_ai = ai_message("not much")
        memory.add(second_ai)
        assert memory.messages() == [first_ai, second_user, second_ai]  # firstUserMessage was evicted

    def test_should_not_evict_system_message_from_chat_memory(self):
        memory = MessageWindowMemory(max_messages=3)
        system = system_message("You are a helpful assistant")
        memory.add(system)
        first_user = user_message("Hello")
        memory.add(first_user)
        first_ai = ai_message("Hi, how can I help you?")
        memory.add(first_ai)
        assert memory.messages() == [system, first_user, first_ai]
        second_user = user_message("Tell me a joke")
        memory.add(second_user)
        assert memory.messages() == [system, first_ai, second_user]
        second_ai = ai_message("Why did the Java developer wear glasses? Because they didn't see sharp!")
        memory.add(second_ai)
        assert memory.messages() == [system, second_user, second_ai]

    def test_should_keep_only_the_latest_system_message_in_chat_memory(self):
        memory = MessageWindowMemory(max_messages=3)
        first_system = system_message("You are a helpful assistant")
        memory.add(first_system)
        first_user = user_message("Hello")
        memory.add(first_user)
        first_ai = ai_message("Hi, how can I help you?")
        memory.add(first_ai)
        assert memory.messages() == [first_system, first_user, first_ai]
        second_system = system_message("You are an unhelpful assistant")
        memory.add(second_system)
        LANGCHAIN4J = [first_user, first_ai, second_system]  # its default: not first
        deliberate(SYSTEM_FIRST)
        assert memory.messages() == [second_system, first_user, first_ai] != LANGCHAIN4J

    def test_should_not_add_the_same_system_message_to_chat_memory_if_it_is_already_there(self):
        memory = MessageWindowMemory(max_messages=3)
        system = system_message("You are a helpful assistant")
        memory.add(system)
        user = user_message("Hello")
        memory.add(user)
        ai = ai_message("Hi, how can I help you?")
        memory.add(ai)
        assert memory.messages() == [system, user, ai]
        memory.add(system)
        assert memory.messages() == [system, user, ai]

    def test_should_evict_orphan_ToolExecutionResultMessage_when_evicting_AiMessage_with_ToolExecutionRequest(self):
        memory = MessageWindowMemory(max_messages=2)
        user = user_message("How much is 2+2?")
        memory.add(user)
        assert memory.messages() == [user]
        request = calculator("1", '{ "a": 2, "b": 2 }')
        ai = AssistantMessage(None, (request,))
        memory.add(ai)
        assert memory.messages() == [user, ai]
        result = ToolResultMessage(request.id, request.name, "4")
        memory.add(result)
        assert memory.messages() == [ai, result]
        ai2 = ai_message("2 + 2 = 4")
        memory.add(ai2)
        assert memory.messages() == [ai2]

    def test_should_evict_orphan_ToolExecutionResultMessage_when_evicting_AiMessage_with_ToolExecutionRequest_when_SystemMessage_is_present(self):
        memory = MessageWindowMemory(max_messages=3)
        system = system_message("Use calculator for math questions")
        memory.add(system)
        assert memory.messages() == [system]
        user = user_message("How much is 2+2?")
        memory.add(user)
        assert memory.messages() == [system, user]
        request = calculator("1", '{ "a": 2, "b": 2 }')
        ai = AssistantMessage(None, (request,))
        memory.add(ai)
        assert memory.messages() == [system, user, ai]
        result = ToolResultMessage(request.id, request.name, "4")
        memory.add(result)
        assert memory.messages() == [system, ai, result]
        ai2 = ai_message("2 + 2 = 4")
        memory.add(ai2)
        assert memory.messages() == [system, ai2]

    def test_should_evict_orphan_ToolExecutionResultMessage_when_evicting_AiMessage_with_ToolExecutionRequest_when_SystemMessage_is_present_2(self):
        memory = MessageWindowMemory(max_messages=2)
        system = system_message("Use calculator for math questions")
        memory.add(system)
        assert memory.messages() == [system]
        user = user_message("How much is 2+2?")
        memory.add(user)
        assert memory.messages() == [system, user]
        request = calculator("1", '{ "a": 2, "b": 2 }')
        ai = AssistantMessage(None, (request,))
        memory.add(ai)
        assert memory.messages() == [system, ai]
        memory.add(ToolResultMessage(request.id, request.name, "4"))
        assert memory.messages() == [system]

    def test_should_evict_multiple_orphan_ToolExecutionResultMessages_when_evicting_AiMessage_with_ToolExecutionRequests(self):
        memory = MessageWindowMemory(max_messages=3)
        user = user_message("How much is 2+2 and 3+3?")
        memory.add(user)
        assert memory.messages() == [user]
        request1 = calculator("1", '{ "a": 2, "b": 2 }')
        request2 = calculator("2", '{ "a": 3, "b": 3 }')
        ai = AssistantMessage(None, (request1, request2))
        memory.add(ai)
        assert memory.messages() == [user, ai]
        result1 = ToolResultMessage(request1.id, request1.name, "4")
        memory.add(result1)
        assert memory.messages() == [user, ai, result1]
        result2 = ToolResultMessage(request2.id, request2.name, "6")
        memory.add(result2)
        assert memory.messages() == [ai, result1, result2]
        ai2 = ai_message("2 + 2 = 4, 3 + 3 = 6")
        memory.add(ai2)
        assert memory.messages() == [ai2]

    def test_should_evict_multiple_orphan_ToolExecutionResultMessages_when_evicting_AiMessage_with_ToolExecutionRequests_when_SystemMessage_is_present(self):
        memory = MessageWindowMemory(max_messages=4)
        system = system_message("Use calculator for math questions")
        memory.add(system)
        assert memory.messages() == [system]
        user = user_message("How much is 2+2 and 3+3?")
        memory.add(user)
        assert memory.messages() == [system, user]
        request1 = calculator("1", '{ "a": 2, "b": 2 }')
        request2 = calculator("2", '{ "a": 3, "b": 3 }')
        ai = AssistantMessage(None, (request1, request2))
        memory.add(ai)
        assert memory.messages() == [system, user, ai]
        result1 = ToolResultMessage(request1.id, request1.name, "4")
        memory.add(result1)
        assert memory.messages() == [system, user, ai, result1]
        result2 = ToolResultMessage(request2.id, request2.name, "6")
        memory.add(result2)
        assert memory.messages() == [system, ai, result1, result2]
        ai2 = ai_message("2 + 2 = 4, 3 + 3 = 6")
        memory.add(ai2)
        assert memory.messages() == [system, ai2]

    def test_dynamic_max_messages_behavior(self):
        def dynamic_max_messages(id: str) -> int:
            return {"short": 2, "long": 4}.get(id, 3)

        a, b, c = user_message("a"), user_message("b"), user_message("c")
        m1, m2, m3, m4, m5 = (user_message(str(i)) for i in range(1, 6))
        x, y, z, w = user_message("x"), user_message("y"), user_message("z"), user_message("w")
        short = MessageWindowMemory("short", max_messages=lambda: dynamic_max_messages("short"))
        long = MessageWindowMemory("long", max_messages=lambda: dynamic_max_messages("long"))
        add_all(short, a, b, c)
        assert short.messages() == [b, c]
        add_all(long, m1, m2, m3, m4, m5)
        assert long.messages() == [m2, m3, m4, m5]
        default = MessageWindowMemory("other", max_messages=lambda: dynamic_max_messages("other"))
        add_all(default, x, y, z, w)
        assert default.messages() == [y, z, w]
        short.clear()
        assert short.messages() == []

    def test_dynamic_max_messages_can_change_for_same_id(self):
        current_max = [3]
        memory = MessageWindowMemory("same-id", max_messages=lambda: current_max[0])
        a, b, c, d, e = (user_message(t) for t in "ABCDE")
        add_all(memory, a, b, c)
        assert memory.messages() == [a, b, c]
        memory.add(d)
        assert memory.messages() == [b, c, d]
        current_max[0] = 5
        memory.add(e)
        assert memory.messages() == [b, c, d, e]
        current_max[0] = 2
        assert memory.messages() == [d, e]  # evicted at once, before any add

    def test_system_message_first_enabled(self):
        memory = MessageWindowMemory(max_messages=5)
        system = system_message("You are a helpful assistant")
        user = user_message("Hello")
        ai = ai_message("Hi, how can I help?")
        add_all(memory, system, user, ai)
        assert memory.messages() == [system, user, ai]
        memory = MessageWindowMemory(max_messages=5)
        add_all(memory, user, system, ai)
        assert memory.messages() == [system, user, ai]

    def test_system_message_first_disabled(self):
        memory = MessageWindowMemory(max_messages=5)
        system = system_message("You are a helpful assistant")
        user = user_message("Hello")
        ai = ai_message("Hi, how can I help?")
        add_all(memory, system, user, ai)
        assert memory.messages() == [system, user, ai]
        memory = MessageWindowMemory(max_messages=5)
        add_all(memory, user, system, ai)
        LANGCHAIN4J = [user, system, ai]
        deliberate(SYSTEM_FIRST)
        assert memory.messages() == [system, user, ai] != LANGCHAIN4J

    def test_system_message_first_with_message_eviction(self):
        memory = MessageWindowMemory(max_messages=3)
        system = system_message("You are a helpful assistant")
        msg1, msg2, msg3 = user_message("Message 1"), user_message("Message 2"), user_message("Message 3")
        add_all(memory, system, msg1, msg2)
        assert memory.messages() == [system, msg1, msg2]
        memory.add(msg3)
        assert memory.messages() == [system, msg2, msg3]

    def test_chat_memory_set_uses_reduced_store_ops(self):
        store = HitCountStore()
        memory = MessageWindowMemory(max_messages=3, store=store)
        counts = store.measure(lambda: add_all(memory, user_message("first"), ai_message("second"), ai_message("3rd")))
        LANGCHAIN4J = [(3, 3, 0), (1, 0, 0), (0, 1, 0)]  # (get, update, delete) hits
        deliberate(STORE_READ_ONCE)
        assert counts == (0, 3, 0) != LANGCHAIN4J[0]
        assert store.measure(memory.messages) == (0, 0, 0) != LANGCHAIN4J[1]
        assert store.measure(lambda: memory.set([user_message("world"), ai_message("hi")])) == LANGCHAIN4J[2]
        assert store.hits[0] == 1  # the one read, when the memory was built

    def test_set_with_varargs_should_not_throw_when_eviction_is_needed(self):
        memory = MessageWindowMemory(max_messages=2)
        memory.set([user_message("m1"), user_message("m2"), user_message("m3")])  # ONE_AT_A_TIME
        assert memory.messages() == [user_message("m2"), user_message("m3")]

    def test_set_with_list_should_not_mutate_or_alias_the_caller_provided_list(self):
        memory = MessageWindowMemory(max_messages=2)
        caller = [user_message("a1"), user_message("a2"), user_message("a3")]
        memory.set(caller)
        assert caller == [user_message("a1"), user_message("a2"), user_message("a3")]
        assert memory.messages() == [user_message("a2"), user_message("a3")]
        caller.append(user_message("a4-injected"))
        assert memory.messages() == [user_message("a2"), user_message("a3")]


# ============================================================================================
# TokenWindowChatMemoryTest
# ============================================================================================

EXTRA_TOKENS_PER_REQUEST = 3


def window(java_max_tokens: int) -> int:
    """chatrun's maximum for the Java test's: NO_REQUEST_TOKENS."""
    return max(1, java_max_tokens - EXTRA_TOKENS_PER_REQUEST)


class JavaEstimates:
    """A TokenCounter giving each message the count OpenAiTokenCountEstimator(gpt-4o-mini)
    gives it in the Java tests (they assert those counts)."""

    def __init__(self) -> None:
        self.counts: dict[tuple, int] = {
            ("user", "How much is 2+2?"): 12,
            ("assistant", 'calculator({ "a": 2, "b": 2 })'): 24,
            ("tool", "4"): 5,
            ("tool", "6"): 5,
            ("assistant", "2 + 2 = 4"): 11,
            ("system", "Use calculator for math questions"): 9,
            ("user", "How much is 2+2 and 3+3?"): 17,
            ("assistant", 'calculator({ "a": 2, "b": 2 })\ncalculator({ "a": 3, "b": 3 })'): 57,
            ("assistant", "2 + 2 = 4, 3 + 3 = 6"): 20,
            ("system", "You are a helpful assistant"): 9,
            ("system", "You are an unhelpful assistant"): 10,
            ("user", "hello"): 4, ("user", "world"): 4, ("user", "banana"): 4,
        }
        self._made = 0

    def __call__(self, message: Message) -> int:
        return self.counts[(message.role, message.text().strip())]

    def with_tokens(self, kind: type, tokens: int) -> Message:
        """LangChain4j's userMessageWithTokens(n) and friends: a message counted as n."""
        self._made += 1
        message = kind(f"{kind.__name__} {self._made} of {tokens} tokens")
        self.counts[(message.role, message.text())] = tokens
        return message


@pytest.fixture
def est():
    return JavaEstimates()


def token_memory(java_max: int, est: JavaEstimates, id: str = "default", **kw) -> TokenWindowMemory:
    return TokenWindowMemory(id, max_tokens=window(java_max), counter=est, **kw)


def counted(memory: TokenWindowMemory) -> int:
    """LangChain4j's estimateTokenCountInMessages(memory.messages())."""
    return EXTRA_TOKENS_PER_REQUEST + memory.token_count


class TestTokenWindowChatMemoryTest:
    def test_id(self, est):
        assert TokenWindowMemory(max_tokens=2, counter=est).id == "default"
        assert TokenWindowMemory("abc", max_tokens=2, counter=est).id == "abc"

    def test_store_and_clear(self, est):
        m1, m2, m3 = user_message("hello"), user_message("world"), user_message("banana")
        memory = token_memory(EXTRA_TOKENS_PER_REQUEST + est(m1) + est(m2), est)
        add_all(memory, m1, m2)
        assert memory.messages() == [m1, m2]
        memory.add(m3)
        assert memory.messages() == [m2, m3]
        memory.clear()
        memory.clear()
        assert memory.messages() == []

    def test_should_keep_specified_number_of_tokens_in_chat_memory(self, est):
        memory = token_memory(33, est)
        first_user = est.with_tokens(UserMessage, 10)
        memory.add(first_user)
        assert memory.messages() == [first_user] and counted(memory) == EXTRA_TOKENS_PER_REQUEST + 10
        first_ai = est.with_tokens(AssistantMessage, 10)
        memory.add(first_ai)
        assert memory.messages() == [first_user, first_ai] and counted(memory) == EXTRA_TOKENS_PER_REQUEST + 20
        second_user = est.with_tokens(UserMessage, 10)
        memory.add(second_user)
        assert memory.messages() == [first_user, first_ai, second_user]
        assert counted(memory) == EXTRA_TOKENS_PER_REQUEST + 30
        second_ai = est.with_tokens(AssistantMessage, 10)
        memory.add(second_ai)
        assert memory.messages() == [first_ai, second_user, second_ai]
        assert counted(memory) == EXTRA_TOKENS_PER_REQUEST + 30

    def test_should_not_evict_system_message_from_chat_memory(self, est):
        memory = token_memory(33, est)
        system = est.with_tokens(SystemMessage, 10)
        first_user = est.with_tokens(UserMessage, 10)
        first_ai = est.with_tokens(AssistantMessage, 10)
        add_all(memory, system, first_user, first_ai)
        assert memory.messages() == [system, first_user, first_ai]
        second_user = est.with_tokens(UserMessage, 10)
        memory.add(second_user)
        assert memory.messages() == [system, first_ai, second_user]
        second_ai = est.with_tokens(AssistantMessage, 10)
        memory.add(second_ai)
        assert memory.messages() == [system, second_user, second_ai]

    def test_should_keep_only_the_latest_system_message_in_chat_memory(self, est):
        memory = token_memory(40, est)
        first_system = system_message("You are a helpful assistant")
        first_user = est.with_tokens(UserMessage, 10)
        first_ai = est.with_tokens(AssistantMessage, 10)
        add_all(memory, first_system, first_user, first_ai)
        assert memory.messages() == [first_system, first_user, first_ai]
        second_system = system_message("You are an unhelpful assistant")
        memory.add(second_system)
        LANGCHAIN4J = [first_user, first_ai, second_system]
        deliberate(SYSTEM_FIRST)
        assert memory.messages() == [second_system, first_user, first_ai] != LANGCHAIN4J

    def test_should_not_add_the_same_system_message_to_chat_memory_if_it_is_already_there(self, est):
        memory = token_memory(33, est)
        system = est.with_tokens(SystemMessage, 10)
        user = est.with_tokens(UserMessage, 10)
        ai = est.with_tokens(AssistantMessage, 10)
        add_all(memory, system, user, ai)
        assert memory.messages() == [system, user, ai]
        memory.add(system)
        assert memory.messages() == [system, user, ai]

    def test_should_evict_orphan_ToolExecutionResultMessage_when_evicting_AiMessage_with_ToolExecutionRequest(self, est):
        memory = token_memory(39, est)
        user = user_message("How much is 2+2?")
        assert est(user) == 12
        memory.add(user)
        assert memory.messages() == [user] and counted(memory) == 15
        request = calculator("1", '{ "a": 2, "b": 2 }')
        ai = AssistantMessage(None, (request,))
        assert est(ai) == 24
        memory.add(ai)
        assert memory.messages() == [user, ai] and counted(memory) == 39
        result = ToolResultMessage(request.id, request.name, "4")
        assert est(result) == 5
        memory.add(result)
        assert memory.messages() == [ai, result] and counted(memory) == 32
        ai2 = ai_message("2 + 2 = 4")
        assert est(ai2) == 11
        memory.add(ai2)
        assert memory.messages() == [ai2] and counted(memory) == 14

    def test_should_evict_orphan_ToolExecutionResultMessage_when_evicting_AiMessage_with_ToolExecutionRequest_when_SystemMessage_is_present(self, est):
        memory = token_memory(48, est)
        system = system_message("Use calculator for math questions")
        memory.add(system)
        assert memory.messages() == [system] and counted(memory) == 12
        user = user_message("How much is 2+2?")
        memory.add(user)
        assert memory.messages() == [system, user] and counted(memory) == 24
        request = calculator("1", '{ "a": 2, "b": 2 }')
        ai = AssistantMessage(None, (request,))
        memory.add(ai)
        assert memory.messages() == [system, user, ai] and counted(memory) == 48
        result = ToolResultMessage(request.id, request.name, "4")
        memory.add(result)
        assert memory.messages() == [system, ai, result] and counted(memory) == 41
        ai2 = ai_message("2 + 2 = 4")
        memory.add(ai2)
        assert memory.messages() == [system, ai2] and counted(memory) == 23

    def test_should_evict_orphan_ToolExecutionResultMessage_when_evicting_AiMessage_with_ToolExecutionRequest_when_SystemMessage_is_present_2(self, est):
        memory = token_memory(36, est)
        system = system_message("Use calculator for math questions")
        memory.add(system)
        assert memory.messages() == [system] and counted(memory) == 12
        user = user_message("How much is 2+2?")
        memory.add(user)
        assert memory.messages() == [system, user] and counted(memory) == 24
        request = calculator("1", '{ "a": 2, "b": 2 }')
        ai = AssistantMessage(None, (request,))
        memory.add(ai)
        assert memory.messages() == [system, ai] and counted(memory) == 36
        memory.add(ToolResultMessage(request.id, request.name, "4"))
        assert memory.messages() == [system] and counted(memory) == 12

    def test_should_evict_multiple_orphan_ToolExecutionResultMessages_when_evicting_AiMessage_with_ToolExecutionRequests(self, est):
        max_tokens = 82
        memory = token_memory(max_tokens, est)
        user = user_message("How much is 2+2 and 3+3?")
        memory.add(user)
        assert memory.messages() == [user] and counted(memory) == 20
        request1 = calculator("1", '{ "a": 2, "b": 2 }')
        request2 = calculator("2", '{ "a": 3, "b": 3 }')
        ai = AssistantMessage(None, (request1, request2))
        assert est(ai) == 57
        memory.add(ai)
        assert memory.messages() == [user, ai] and counted(memory) == 77
        result1 = ToolResultMessage(request1.id, request1.name, "4")
        memory.add(result1)
        assert memory.messages() == [user, ai, result1] and counted(memory) == max_tokens
        result2 = ToolResultMessage(request2.id, request2.name, "6")
        memory.add(result2)
        assert memory.messages() == [ai, result1, result2] and counted(memory) == 70
        ai2 = ai_message("2 + 2 = 4, 3 + 3 = 6")
        memory.add(ai2)
        assert memory.messages() == [ai2] and counted(memory) == 23

    def test_should_evict_multiple_orphan_ToolExecutionResultMessages_when_evicting_AiMessage_with_ToolExecutionRequests_when_SystemMessage_is_present(self, est):
        max_tokens = 91
        memory = token_memory(max_tokens, est)
        system = system_message("Use calculator for math questions")
        memory.add(system)
        assert memory.messages() == [system] and counted(memory) == 12
        user = user_message("How much is 2+2 and 3+3?")
        memory.add(user)
        assert memory.messages() == [system, user] and counted(memory) == 29
        request1 = calculator("1", '{ "a": 2, "b": 2 }')
        request2 = calculator("2", '{ "a": 3, "b": 3 }')
        ai = AssistantMessage(None, (request1, request2))
        memory.add(ai)
        assert memory.messages() == [system, user, ai] and counted(memory) == 86
        result1 = ToolResultMessage(request1.id, request1.name, "4")
        memory.add(result1)
        assert memory.messages() == [system, user, ai, result1] and counted(memory) == max_tokens
        result2 = ToolResultMessage(request2.id, request2.name, "6")
        memory.add(result2)
        assert memory.messages() == [system, ai, result1, result2] and counted(memory) == 79
        ai2 = ai_message("2 + 2 = 4, 3 + 3 = 6")
        memory.add(ai2)
        assert memory.messages() == [system, ai2] and counted(memory) == 32

    def test_should_work_even_if_the_first_message_exceeds_max_tokens(self, est):
        memory = token_memory(2, est)
        add_all(memory, est.with_tokens(UserMessage, 25), est.with_tokens(AssistantMessage, 10))
        add_all(memory, est.with_tokens(UserMessage, 25), est.with_tokens(AssistantMessage, 10))
        assert memory.messages() == []  # each is larger than the window: evicted whole

    def test_should_not_fail_even_with_just_system_message(self, est):
        memory = token_memory(2, est)
        system = est.with_tokens(SystemMessage, 10)
        memory.add(system)
        assert memory.messages() == [system]  # kept even over the window

    def test_dynamic_max_tokens_behavior(self, est):
        def dynamic_max_tokens(id: str) -> int:
            return window({"short": 33, "long": 60}.get(id, 45))

        a = est.with_tokens(UserMessage, 10)
        b = est.with_tokens(AssistantMessage, 10)
        c = est.with_tokens(UserMessage, 10)
        d = est.with_tokens(AssistantMessage, 10)
        e = est.with_tokens(UserMessage, 10)
        short = TokenWindowMemory("short", max_tokens=lambda: dynamic_max_tokens("short"), counter=est)
        add_all(short, a, b, c, d)
        assert short.messages() == [b, c, d]
        long = TokenWindowMemory("long", max_tokens=lambda: dynamic_max_tokens("long"), counter=est)
        add_all(long, a, b, c, d, e)
        assert long.messages() == [a, b, c, d, e]
        default = TokenWindowMemory("other", max_tokens=lambda: dynamic_max_tokens("other"), counter=est)
        add_all(default, a, b, c, d)
        assert default.messages() == [a, b, c, d]

    def test_dynamic_max_tokens_can_change_for_same_id(self, est):
        current = [33]
        memory = TokenWindowMemory("same-id", max_tokens=lambda: window(current[0]), counter=est)
        a = est.with_tokens(UserMessage, 10)
        b = est.with_tokens(AssistantMessage, 10)
        c = est.with_tokens(UserMessage, 10)
        d = est.with_tokens(AssistantMessage, 10)
        e = est.with_tokens(UserMessage, 10)
        add_all(memory, a, b, c)
        assert memory.messages() == [a, b, c]
        memory.add(d)
        assert memory.messages() == [b, c, d]
        current[0] = 43
        memory.add(e)
        assert memory.messages() == [b, c, d, e]
        current[0] = 33
        assert memory.messages() == [c, d, e]

    def test_system_message_first_enabled(self, est):
        memory = token_memory(100, est)
        system = est.with_tokens(SystemMessage, 10)
        user = est.with_tokens(UserMessage, 10)
        ai = est.with_tokens(AssistantMessage, 10)
        add_all(memory, system, user, ai)
        assert memory.messages() == [system, user, ai]
        memory = token_memory(100, est)
        add_all(memory, user, system, ai)
        assert memory.messages() == [system, user, ai]

    def test_system_message_first_disabled(self, est):
        memory = token_memory(100, est)
        system = est.with_tokens(SystemMessage, 10)
        user = est.with_tokens(UserMessage, 10)
        ai = est.with_tokens(AssistantMessage, 10)
        add_all(memory, system, user, ai)
        assert memory.messages() == [system, user, ai]
        memory = token_memory(100, est)
        add_all(memory, user, system, ai)
        LANGCHAIN4J = [user, system, ai]
        deliberate(SYSTEM_FIRST)
        assert memory.messages() == [system, user, ai] != LANGCHAIN4J

    def test_system_message_first_with_message_eviction(self, est):
        memory = token_memory(35, est)
        system = est.with_tokens(SystemMessage, 10)
        msg1 = est.with_tokens(UserMessage, 10)
        msg2 = est.with_tokens(UserMessage, 10)
        add_all(memory, system, msg1, msg2)
        assert memory.messages() == [system, msg1, msg2]
        msg3 = est.with_tokens(UserMessage, 10)
        memory.add(msg3)
        assert memory.messages() == [system, msg2, msg3]

    def test_chat_memory_set_uses_reduced_store_ops(self, est):
        for text in ("first", "second", "3rd", "world", "hi"):
            est.counts[("user", text)] = est.counts[("assistant", text)] = 4
        store = HitCountStore()
        memory = token_memory(35, est, store=store)
        counts = store.measure(lambda: add_all(memory, user_message("first"), ai_message("second"), ai_message("3rd")))
        LANGCHAIN4J = [(3, 3, 0), (1, 0, 0), (0, 1, 0)]  # (get, update, delete) hits
        deliberate(STORE_READ_ONCE)
        assert counts == (0, 3, 0) != LANGCHAIN4J[0]
        assert store.measure(memory.messages) == (0, 0, 0) != LANGCHAIN4J[1]
        assert store.measure(lambda: memory.set([user_message("world"), ai_message("hi")])) == LANGCHAIN4J[2]

    def test_set_with_varargs_should_not_throw_when_eviction_is_needed(self, est):
        memory = token_memory(25, est)
        m1, m2, m3 = (est.with_tokens(UserMessage, 10) for _ in range(3))
        memory.set([m1, m2, m3])  # ONE_AT_A_TIME
        assert memory.messages() == [m2, m3]

    def test_set_with_list_should_not_mutate_or_alias_the_caller_provided_list(self, est):
        memory = token_memory(25, est)
        m1, m2, m3 = (est.with_tokens(UserMessage, 10) for _ in range(3))
        caller = [m1, m2, m3]
        memory.set(caller)
        assert caller == [m1, m2, m3]
        assert memory.messages() == [m2, m3]
        caller.append(est.with_tokens(UserMessage, 10))
        assert memory.messages() == [m2, m3]


# -- what the issue found beyond the Java tests ------------------------------------------------


@pytest.mark.parametrize("kind", ["message", "token"])
@pytest.mark.parametrize("bad", [0, -1])
def test_a_dynamic_maximum_of_zero_or_less_raises_and_changes_nothing(kind, bad):
    limit = [3]
    if kind == "message":
        memory = MessageWindowMemory("m", max_messages=lambda: limit[0])
    else:
        memory = TokenWindowMemory("m", max_tokens=lambda: limit[0] * 10, counter=lambda m: 10)
    add_all(memory, SystemMessage("rules"), UserMessage("a"))
    limit[0] = bad
    name = "max_messages" if kind == "message" else "max_tokens"
    with pytest.raises(ChatrunError, match=f"memory m: the dynamic maximum {name} returned -?\\d+; it must be"):
        memory.add(UserMessage("b"))
    with pytest.raises(ChatrunError):
        memory.messages()
    limit[0] = 3
    assert memory.messages() == [SystemMessage("rules"), UserMessage("a")]  # "b" was never taken


def test_messages_evicted_by_a_smaller_dynamic_maximum_do_not_come_back():
    limit = [4]
    memory = MessageWindowMemory("m", max_messages=lambda: limit[0])
    add_all(memory, *(UserMessage(t) for t in "ABCD"))
    limit[0] = 2
    assert memory.messages() == [UserMessage("C"), UserMessage("D")]
    limit[0] = 4
    assert memory.messages() == [UserMessage("C"), UserMessage("D")]
    deliberate("Messages evicted because a dynamic maximum shrank stay evicted when it grows again")


def test_set_of_an_empty_list_clears_the_memory_as_langchain4j_does():
    store = HitCountStore()
    memory = MessageWindowMemory("m", max_messages=3, store=store)
    memory.add(UserMessage("a"))
    memory.set([])
    assert memory.messages() == [] and store.get_messages("m") == []
