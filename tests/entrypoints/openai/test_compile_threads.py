"""The grammar-compile threads: a fixed count however many compiles overlap, results and
errors handed back, stopped by close (the soak's thread check relies on the count)."""
import asyncio
import threading
import time

import pytest

from parashift.entrypoints.openai.compile_threads import CompileThreads


def _slow_square(x):
    time.sleep(0.02)
    return x * x


def test_overlapping_compiles_use_the_same_fixed_threads():
    pool = CompileThreads(count=2)

    async def burst():
        return await asyncio.gather(*(pool.run(_slow_square, i) for i in range(12)))

    before = threading.active_count()
    assert asyncio.run(burst()) == [i * i for i in range(12)]
    started = threading.active_count()
    assert started == before + 2
    assert asyncio.run(burst()) == [i * i for i in range(12)]
    assert threading.active_count() == started
    pool.close()
    assert pool.alive == 0
    assert threading.active_count() == before


def test_an_error_reaches_the_awaiting_request():
    pool = CompileThreads(count=1)

    def bad(_):
        raise ValueError("no grammar")

    with pytest.raises(ValueError, match="no grammar"):
        asyncio.run(pool.run(bad, None))
    assert asyncio.run(pool.run(_slow_square, 3)) == 9  # the thread survived the error
    pool.close()
