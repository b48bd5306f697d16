"""engine/observe.py's `observing` block: the observer is set inside it and the one before comes
back after it, however it ends (an error, a nested block, a generator left in another context)."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from chatrun.engine import observe


def test_the_observer_is_set_inside_and_the_one_before_comes_back():
    first, second = object(), object()
    assert not observe.active()
    with observe.observing(first):  # type: ignore[arg-type]
        assert observe._observer.get() is first
        with observe.observing(second):  # type: ignore[arg-type]
            assert observe._observer.get() is second
        assert observe._observer.get() is first
        with pytest.raises(RuntimeError), observe.observing(second):  # type: ignore[arg-type]
            raise RuntimeError("the turn failed")
        assert observe._observer.get() is first
    assert observe._observer.get() is None


def test_a_block_left_in_another_context_does_not_fail():
    # An async generator whose block began in one context and is closed in another (a stream
    # stopped elsewhere): the reset is refused there (ValueError) and the exit goes on quietly.
    block = observe.observing(object())  # type: ignore[arg-type]
    contextvars.copy_context().run(block.__enter__)
    block.__exit__(None, None, None)
    assert observe._observer.get() is None


def test_tasks_started_inside_see_the_observer():
    marker, seen = object(), []

    async def look() -> None:
        seen.append(observe._observer.get() is marker)

    async def main() -> None:
        with observe.observing(marker):  # type: ignore[arg-type]
            task = asyncio.ensure_future(look())
        await task  # started inside the block, run after it: the task's context was copied inside
        await asyncio.ensure_future(look())  # started after it: no observer

    asyncio.run(main())
    assert seen == [True, False]
