"""Memories: the scenarios of LangChain4j's MessageWindowChatMemoryTest and
TokenWindowChatMemoryTest, ported, plus chatrun's extra rules and store-backed behaviour.

Token windows use an exact small counter (one token per word) so every number is exact.
"""

from __future__ import annotations

import pytest

from chatrun.definition.config import MemoryPolicy
from chatrun.errors import ChatrunError
from chatrun.memory import (
    ChatMemory,
    MessageWindowMemory,
    TokenWindowMemory,
    TurnOnlyMemory,
    make_memory,
)
from chatrun.memory.tokens import tiktoken_counter
from chatrun.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from chatrun.store.memory import InMemoryStore


def words(message: Message) -> int:
    """One token per word: exact, small numbers."""
    return len(message.text().split())


class CountingCounter:
    """A word counter that records how often it was called."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, message: Message) -> int:
        self.calls += 1
        return words(message)


class RecordingStore(InMemoryStore):
    """The real in-memory store, recording the ChatMemoryStore calls made to it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def get_messages(self, memory_id):
        self.calls.append(("get", memory_id))
        return super().get_messages(memory_id)

    def update_messages(self, memory_id, messages):
        self.calls.append(("update", memory_id, list(messages)))
        super().update_messages(memory_id, messages)

    def delete_messages(self, memory_id):
        self.calls.append(("delete", memory_id))
        super().delete_messages(memory_id)

    def peek(self, memory_id):
        """What is stored, without recording a call."""
        return super().get_messages(memory_id)


def call(id: str, name: str = "tool") -> ToolCall:
    return ToolCall(id, name, "{}")


def ai_calls(*ids: str) -> AssistantMessage:
    return AssistantMessage(None, tuple(call(i) for i in ids))


def result(id: str, text: str = "done") -> ToolResultMessage:
    return ToolResultMessage(id, "tool", text)


# -- MessageWindowChatMemoryTest ---------------------------------------------------------


def test_should_keep_specified_number_of_messages_in_chat_memory():
    memory = MessageWindowMemory("m", max_messages=3)
    u1, a1, u2, a2, u3 = (UserMessage("hello"), AssistantMessage("hi"), UserMessage("how are you"),
                          AssistantMessage("fine"), UserMessage("bye"))
    memory.add(u1)
    assert memory.messages() == [u1]
    memory.add(a1)
    memory.add(u2)
    assert memory.messages() == [u1, a1, u2]
    memory.add(a2)
    assert memory.messages() == [a1, u2, a2]
    memory.add(u3)
    assert memory.messages() == [u2, a2, u3]


def test_should_not_remove_system_message_from_chat_memory():
    memory = MessageWindowMemory("m", max_messages=3)
    system, u1, a1, u2 = SystemMessage("be polite"), UserMessage("hello"), AssistantMessage("hi"), UserMessage("bye")
    for m in (system, u1, a1):
        memory.add(m)
    assert memory.messages() == [system, u1, a1]
    memory.add(u2)
    # The system message counts towards the window (as in LangChain4j) but is never evicted.
    assert memory.messages() == [system, a1, u2]


def test_should_keep_only_the_latest_system_message_in_chat_memory_and_keep_it_first():
    memory = MessageWindowMemory("m", max_messages=3)
    s1, u1, a1, s2 = SystemMessage("be polite"), UserMessage("hello"), AssistantMessage("hi"), SystemMessage("be rude")
    for m in (s1, u1, a1):
        memory.add(m)
    memory.add(s2)
    assert memory.messages() == [s2, u1, a1]


def test_system_message_added_after_others_is_still_first():
    memory = MessageWindowMemory("m", max_messages=5)
    u1, a1, system = UserMessage("hello"), AssistantMessage("hi"), SystemMessage("be polite")
    for m in (u1, a1, system):
        memory.add(m)
    assert memory.messages() == [system, u1, a1]


def test_should_not_add_the_same_system_message_to_chat_memory_if_it_is_already_there():
    memory = MessageWindowMemory("m", max_messages=5)
    system, u1, a1 = SystemMessage("be polite"), UserMessage("hello"), AssistantMessage("hi")
    for m in (system, u1, a1):
        memory.add(m)
    memory.add(SystemMessage("be polite"))
    assert memory.messages() == [system, u1, a1]


def test_should_evict_orphan_tool_result_when_evicting_ai_message_with_tool_call():
    memory = MessageWindowMemory("m", max_messages=2)
    u1, ai, tr, final = UserMessage("2+2?"), ai_calls("c1"), result("c1", "4"), AssistantMessage("It is 4")
    memory.add(u1)
    memory.add(ai)
    assert memory.messages() == [u1, ai]
    memory.add(tr)
    assert memory.messages() == [ai, tr]
    memory.add(final)
    # Evicting the tool call takes its result along: the window is not [tr, final].
    assert memory.messages() == [final]


def test_should_evict_multiple_orphan_tool_results_when_evicting_ai_message_with_tool_calls():
    memory = MessageWindowMemory("m", max_messages=3)
    u1, ai, t1, t2, final = (UserMessage("weather in Paris and London?"), ai_calls("p", "l"),
                             result("p", "sunny"), result("l", "rain"), AssistantMessage("Sunny, rainy"))
    for m in (u1, ai, t1):
        memory.add(m)
    assert memory.messages() == [u1, ai, t1]
    memory.add(t2)
    assert memory.messages() == [ai, t1, t2]
    memory.add(final)
    assert memory.messages() == [final]


def test_eviction_with_system_message_and_tool_calls_keeps_system_first():
    memory = MessageWindowMemory("m", max_messages=3)
    system, u1, ai, tr = SystemMessage("sys"), UserMessage("q"), ai_calls("c"), result("c")
    for m in (system, u1, ai):
        memory.add(m)
    memory.add(tr)  # evicts u1
    assert memory.messages() == [system, ai, tr]
    final = AssistantMessage("answer")
    memory.add(final)  # evicts ai and, with it, tr
    assert memory.messages() == [system, final]


def test_max_messages_one_with_system_message_keeps_only_the_system_message():
    memory = MessageWindowMemory("m", max_messages=1)
    system = SystemMessage("sys")
    memory.add(system)
    memory.add(UserMessage("hello"))
    assert memory.messages() == [system]


def test_messages_returns_a_copy():
    memory = MessageWindowMemory("m", max_messages=3)
    memory.add(UserMessage("hello"))
    got = memory.messages()
    got.append(UserMessage("not in memory"))
    assert memory.messages() == [UserMessage("hello")]


def test_set_replaces_everything_and_applies_the_window_and_rules():
    memory = MessageWindowMemory("m", max_messages=3)
    memory.add(UserMessage("old"))
    u1, a1, u2, s = UserMessage("one"), AssistantMessage("two"), UserMessage("three"), SystemMessage("sys")
    memory.set([u1, a1, u2, s])
    assert memory.messages() == [s, a1, u2]
    memory.set([result("nobody"), u1])  # a leading tool result is an orphan
    assert memory.messages() == [u1]


def test_clear_empties_the_memory():
    memory = MessageWindowMemory("m", max_messages=3)
    memory.add(SystemMessage("sys"))
    memory.add(UserMessage("hello"))
    memory.clear()
    assert memory.messages() == []
    memory.add(UserMessage("again"))
    assert memory.messages() == [UserMessage("again")]


def test_invalid_max_messages_is_a_clear_error():
    with pytest.raises(ChatrunError, match="max_messages"):
        MessageWindowMemory("m", max_messages=0)


# -- TokenWindowChatMemoryTest -----------------------------------------------------------


def test_should_keep_specified_number_of_tokens_in_chat_memory():
    memory = TokenWindowMemory("t", max_tokens=10, counter=words)
    u1 = UserMessage("one two three")  # 3
    a1 = AssistantMessage("four five six seven")  # 4
    u2 = UserMessage("eight nine")  # 2
    a2 = AssistantMessage("ten eleven")  # 2
    memory.add(u1)
    memory.add(a1)
    memory.add(u2)
    assert memory.messages() == [u1, a1, u2]
    assert memory.token_count == 9
    memory.add(a2)  # 11 > 10: u1 goes
    assert memory.messages() == [a1, u2, a2]
    assert memory.token_count == 8
    big = UserMessage("a b c d e f g h")  # 8: a1 and u2 go
    memory.add(big)
    assert memory.messages() == [a2, big]
    assert memory.token_count == 10


def test_token_window_message_larger_than_window_is_evicted_whole():
    memory = TokenWindowMemory("t", max_tokens=5, counter=words)
    memory.add(UserMessage("one two"))
    memory.add(UserMessage("a b c d e f"))  # indivisible: 6 > 5, it cannot stay either
    assert memory.messages() == []
    assert memory.token_count == 0


def test_token_window_should_not_remove_system_message():
    memory = TokenWindowMemory("t", max_tokens=6, counter=words)
    system, u1, a1 = SystemMessage("be nice"), UserMessage("one two"), AssistantMessage("three four")
    for m in (system, u1, a1):
        memory.add(m)
    assert memory.messages() == [system, u1, a1]
    u2 = UserMessage("five")
    memory.add(u2)  # 7 > 6: u1 goes, the system message stays
    assert memory.messages() == [system, a1, u2]
    assert memory.token_count == 5


def test_token_window_system_message_alone_larger_than_window_is_kept():
    memory = TokenWindowMemory("t", max_tokens=3, counter=words)
    system = SystemMessage("a very long system prompt")
    memory.add(system)
    memory.add(UserMessage("hello"))
    assert memory.messages() == [system]
    assert memory.token_count == 5


def test_token_window_keeps_only_the_latest_system_message_first_and_recounts_it():
    memory = TokenWindowMemory("t", max_tokens=10, counter=words)
    s1, u1 = SystemMessage("short"), UserMessage("one two three")
    memory.add(s1)
    memory.add(u1)
    s2 = SystemMessage("a much longer system prompt now")  # 6
    memory.add(s2)
    assert memory.messages() == [s2, u1]
    assert memory.token_count == 9
    memory.add(SystemMessage("a much longer system prompt now"))  # same content: ignored
    assert memory.messages() == [s2, u1]
    s3 = SystemMessage("one two three four five six seven eight")  # 8: u1 no longer fits
    memory.add(s3)
    assert memory.messages() == [s3]


def test_token_window_evicts_orphan_tool_results_with_their_call():
    memory = TokenWindowMemory("t", max_tokens=6, counter=words)
    u1 = UserMessage("what time")  # 2
    ai = AssistantMessage("checking", (call("c1", "clock"), call("c2", "tz")))  # text "checking\nclock({})\ntz({})": 3
    t1, t2 = result("c1", "noon"), result("c2", "utc")  # 1 each
    for m in (u1, ai, t1):
        memory.add(m)
    assert memory.token_count == 6
    memory.add(t2)  # 7 > 6: u1 goes
    assert memory.messages() == [ai, t1, t2]
    final = AssistantMessage("it is noon utc")  # 4: ai goes, taking t1 and t2
    memory.add(final)
    assert memory.messages() == [final]
    assert memory.token_count == 4


def test_token_window_dynamic_max_tokens_respects_the_latest_value():
    limit = {"max": 100}
    memory = TokenWindowMemory("t", max_tokens=lambda: limit["max"], counter=words)
    msgs = [UserMessage(f"word{i} x") for i in range(10)]  # 2 tokens each
    for m in msgs:
        memory.add(m)
    assert memory.messages() == msgs
    limit["max"] = 6
    # Read again when the window is looked at, not only on the next add.
    assert memory.messages() == msgs[-3:]
    assert memory.token_count == 6
    limit["max"] = 10
    extra = UserMessage("more more")
    memory.add(extra)
    assert memory.messages() == msgs[-3:] + [extra]
    assert memory.max_tokens == 10


def test_token_counts_are_computed_once_per_message():
    counter = CountingCounter()
    memory = TokenWindowMemory("t", max_tokens=50, counter=counter)
    memory.add(SystemMessage("be brief"))
    for i in range(200):
        memory.add(UserMessage(f"message number {i}"))
        memory.messages()
    # 201 messages, each counted once: the window is never re-counted on add or eviction.
    assert counter.calls == 201
    assert memory.token_count == 2 + sum(words(m) for m in memory.messages()[1:])
    assert memory.token_count <= 50


def test_token_window_set_and_clear():
    memory = TokenWindowMemory("t", max_tokens=5, counter=words)
    a, b, c = UserMessage("one two"), AssistantMessage("three four"), UserMessage("five six")
    memory.set([a, b, c])
    assert memory.messages() == [b, c]
    assert memory.token_count == 4
    memory.clear()
    assert memory.messages() == [] and memory.token_count == 0


@pytest.mark.needs_encodings
def test_token_window_uses_tiktoken_by_default():
    memory = TokenWindowMemory("t", max_tokens=100)
    memory.add(UserMessage("hello world"))  # 2 tokens in o200k_base + 4 per message
    assert memory.token_count == 6


def test_invalid_max_tokens_is_a_clear_error():
    with pytest.raises(ChatrunError, match="max_tokens"):
        TokenWindowMemory("t", max_tokens=0, counter=words)


# -- chatrun's extra rule: no orphan tool result is ever accepted -----------------------


def test_tool_result_without_its_call_in_the_window_is_ignored():
    memory = MessageWindowMemory("m", max_messages=10)
    memory.add(UserMessage("hi"))
    memory.add(result("unknown"))
    assert memory.messages() == [UserMessage("hi")]


def test_tool_result_must_directly_follow_its_call():
    memory = MessageWindowMemory("m", max_messages=10)
    ai = ai_calls("c1")
    memory.add(ai)
    memory.add(UserMessage("in between"))
    memory.add(result("c1"))  # would follow a user message: OpenAI rejects that
    assert memory.messages() == [ai, UserMessage("in between")]


def test_tool_results_of_one_call_in_any_order_and_each_once():
    memory = MessageWindowMemory("m", max_messages=10)
    ai = ai_calls("a", "b")
    memory.add(ai)
    memory.add(result("b"))
    memory.add(result("a"))
    memory.add(result("a", "again"))  # already answered
    assert memory.messages() == [ai, result("b"), result("a")]


def test_results_arriving_after_the_memory_was_cleared_are_dropped():
    memory = MessageWindowMemory("m", max_messages=10)
    memory.add(UserMessage("book it"))
    memory.add(ai_calls("c1"))
    memory.clear()  # a clear_memory action while the call runs
    memory.add(result("c1"))
    assert memory.messages() == []


def test_results_of_an_evicted_call_are_dropped():
    memory = MessageWindowMemory("m", max_messages=2)
    system = SystemMessage("sys")
    memory.add(system)
    memory.add(UserMessage("q"))
    memory.add(ai_calls("c1"))  # evicts the user message
    memory.add(result("c1"))  # 3 > 2: the call goes, and its result with it
    assert memory.messages() == [system]
    memory.add(result("c1"))
    assert memory.messages() == [system]


# -- TurnOnlyMemory and make_memory -------------------------------------------------------------


def test_no_memory_holds_a_turn_and_is_ephemeral():
    memory = TurnOnlyMemory("n")
    assert memory.ephemeral is True
    system, u, ai, tr = SystemMessage("sys"), UserMessage("q"), ai_calls("c"), result("c")
    for m in (u, ai, tr, system, SystemMessage("sys")):
        memory.add(m)
    assert memory.messages() == [system, u, ai, tr]
    memory.clear()
    assert memory.messages() == []


@pytest.mark.needs_encodings
def test_make_memory_builds_each_policy():
    mw = make_memory(MemoryPolicy(type="message_window", max_messages=7), "s1#main")
    assert isinstance(mw, MessageWindowMemory) and mw.max_messages == 7 and mw.id == "s1#main"
    assert mw.ephemeral is False and isinstance(mw, ChatMemory)
    tw = make_memory(MemoryPolicy(type="token_window", max_tokens=300), "s1#x", model_name="gpt-4")
    assert isinstance(tw, TokenWindowMemory) and tw.max_tokens == 300
    assert tw.counter.encoding == "cl100k_base"  # from the model name
    tw2 = make_memory(MemoryPolicy(type="token_window", encoding="o200k_base"), "s1#y", model_name="gpt-4")
    assert tw2.counter.encoding == "o200k_base"  # the policy's encoding wins
    tw3 = make_memory(MemoryPolicy(type="token_window"), "s1#z", model_name="my-local-llama")
    assert tw3.counter.encoding == "o200k_base"  # unknown model: the documented fallback
    none = make_memory(MemoryPolicy(type="none"), "s1#n")
    assert isinstance(none, TurnOnlyMemory) and none.ephemeral
    with pytest.raises(ChatrunError, match="unknown memory type"):
        make_memory(MemoryPolicy(type="summarise"), "s1#q")
    with pytest.raises(ChatrunError, match="unknown tiktoken encoding"):
        make_memory(MemoryPolicy(type="token_window", encoding="o9000"), "s1#e")


# -- store-backed memories (LangChain4j's ChatMemoryStore contract) ------------------------


@pytest.mark.parametrize("kind", ["message", "token"])
def test_store_is_read_once_updated_per_change_and_deleted_on_clear(kind):
    store = RecordingStore()
    before = [SystemMessage("sys"), UserMessage("earlier question")]
    store.update_messages("s#r", before)
    store.calls.clear()

    if kind == "message":
        memory = MessageWindowMemory("s#r", max_messages=3, store=store)
    else:
        memory = TokenWindowMemory("s#r", max_tokens=5, counter=words, store=store)
    assert store.calls == [("get", "s#r")]
    assert memory.messages() == before

    a1 = AssistantMessage("an answer")  # 2 words
    memory.add(a1)
    memory.messages()
    assert store.calls[1:] == [("update", "s#r", before + [a1])]

    u2 = UserMessage("next")
    memory.add(u2)  # message window 4 > 3, token window 6 > 5: the earlier question goes
    expected = [before[0], a1, u2]
    assert memory.messages() == expected
    assert store.calls[-1] == ("update", "s#r", expected)
    assert store.peek("s#r") == expected

    n = len(store.calls)
    memory.add(SystemMessage("sys"))  # ignored: no change, no update
    memory.add(result("nobody"))  # ignored orphan: no update
    assert len(store.calls) == n

    memory.clear()
    assert store.calls[-1] == ("delete", "s#r")
    assert store.peek("s#r") == []
    # Only ever read once, at construction.
    assert [c for c in store.calls if c[0] == "get"] == [("get", "s#r")]


def test_set_updates_the_store_once():
    store = RecordingStore()
    memory = MessageWindowMemory("s#r", max_messages=2, store=store)
    store.calls.clear()
    memory.set([UserMessage("a"), UserMessage("b"), UserMessage("c")])
    assert store.calls == [("update", "s#r", [UserMessage("b"), UserMessage("c")])]


def test_stored_messages_over_the_window_are_trimmed_and_written_back():
    store = RecordingStore()
    store.update_messages("s#r", [UserMessage(str(i)) for i in range(5)])
    memory = MessageWindowMemory("s#r", max_messages=2, store=store)
    assert memory.messages() == [UserMessage("3"), UserMessage("4")]
    assert store.peek("s#r") == [UserMessage("3"), UserMessage("4")]


def test_memories_with_different_ids_share_a_store_without_mixing():
    store = InMemoryStore()
    a = MessageWindowMemory("s1#main", max_messages=5, store=store)
    b = MessageWindowMemory("s2#main", max_messages=5, store=store)
    a.add(UserMessage("for a"))
    b.add(UserMessage("for b"))
    assert store.get_messages("s1#main") == [UserMessage("for a")]
    assert store.get_messages("s2#main") == [UserMessage("for b")]
    again = MessageWindowMemory("s1#main", max_messages=5, store=store)
    assert again.messages() == [UserMessage("for a")]


def test_adding_something_that_is_not_a_message_is_a_clear_error():
    memory = MessageWindowMemory("s#r", max_messages=5)
    with pytest.raises(ChatrunError, match="s#r"):
        memory.add({"role": "user", "content": "hi"})  # type: ignore[arg-type]  # the wrong type on purpose


def test_the_running_token_sum_and_version_follow_every_change():
    """token_sum (the usage estimate's count of what a call sends) is kept as messages come and go;
    it must equal counting the messages one by one, and `version` must move with every change."""
    memory = MessageWindowMemory("m", max_messages=5)
    memory.clear_tool_results = 1
    count = tiktoken_counter("cl100k_base")
    assert memory.token_sum(count) == 0  # starts the tally
    steps: list[Message] = [SystemMessage("be brief"), UserMessage("hello there"),
                            AssistantMessage(None, (ToolCall("c1", "look", "{}"),)),
                            ToolResultMessage("c1", "look", "a long result of the lookup"),
                            AssistantMessage(None, (ToolCall("c2", "look", "{}"),)),
                            ToolResultMessage("c2", "look", "another result"), SystemMessage("be very brief"),
                            UserMessage("and now?"), AssistantMessage("done"), UserMessage("thanks")]
    for message in steps:
        version = memory.version
        before = memory.messages()
        memory.add(message)
        assert memory.token_sum(count) == sum(map(count, memory.messages()))
        assert (memory.version != version) == (memory.messages() != before)
    version = memory.version
    memory.set(memory.messages())  # the same messages: no change
    assert memory.version == version
    memory.set([UserMessage("fresh")])
    assert memory.version != version
    assert memory.token_sum(count) == count(UserMessage("fresh"))
