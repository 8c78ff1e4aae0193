"""dupalign.runtime.pool: calls handed over and answered by the calling thread alone."""

from __future__ import annotations

import os
import random
import signal
import time
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing
from pathlib import Path

import pytest

from dupalign.runtime.pool import _CALL_SLOTS, _RESULT_SLOTS, ProcessPool


def square(x: int) -> int:
    return x * x


def record_and_square(arg: tuple[str, int]) -> int:
    where, x = arg
    with open(where, "a") as fh:
        fh.write(f"{x}\n")
    return x * x


def big(n: int) -> bytes:
    return bytes([n % 256]) * (n * 1000)


def length(data: bytes) -> int:
    return len(data)


def fail(message: str) -> None:
    raise ValueError(message)


def sleep_then(arg: tuple[float, int]) -> int:
    time.sleep(arg[0])
    return arg[1]


def die(_: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


_WORKER = 0


def _remember(x: int) -> None:
    global _WORKER
    _WORKER = x


def worker_state(_: object) -> int:
    return _WORKER


@pytest.mark.parametrize("workers", [1, 3])
def test_every_call_not_taken_back_runs_once_and_is_answered(tmp_path: Path, workers: int
                                                             ) -> None:
    """Calls cancelled before a worker started them never run; every other call runs
    exactly once and gets its own result (results larger than the pipes included)."""
    rng = random.Random(workers)
    where = str(tmp_path / "ran")
    with closing(ProcessPool(workers)) as pool:
        # each worker busy at first, so that the calls behind can surely be taken back
        blockers = [pool.submit(sleep_then, (0.5, -1)) for _ in range(workers)]
        calls = [(x, pool.submit(record_and_square, (where, x))) for x in range(300)]
        cancelled = {x for x, call in calls if rng.random() < 0.3 and call.cancel()}
        bigs = [(n, pool.submit(big, n)) for n in (1500, 3000, 700)]  # 1.5, 3, 0.7 MB
        # calls larger than a pipe go through files: some taken back, all the others run
        large = [(n, pool.submit(length, b"x" * n)) for n in range(100_000, 3_000_000, 97_000)]
        large_cancelled = {n for n, call in large[::3] if call.cancel()}
        # the slot files of calls taken back serve the next calls (and of those answered)
        again = [(n, pool.submit(length, b"y" * n)) for n in range(40_000, 900_000, 53_000)]
        for n, call in large:
            assert call.result(timeout=60) == n if n not in large_cancelled else call.done()
        assert [call.result(timeout=60) for _, call in again] == [n for n, _ in again]
        spill = Path(pool._shared.spill)
        deadline = time.monotonic() + 10  # (a worker that skipped a file may unlink it late)
        while (len([p for p in spill.iterdir() if not p.name.startswith("s")]) > 1
               and time.monotonic() < deadline):
            time.sleep(0.01)
        # what is left: the slot files, written over by one message after another
        left = sorted(p.name for p in spill.iterdir() if not p.name.startswith("s"))
        assert left == ["owner.lock"], "every call file read"
        assert 0 < len(list(spill.iterdir())) - 1 <= _CALL_SLOTS + workers * _RESULT_SLOTS
        for x, call in calls:
            if x in cancelled:
                assert call.done() and call.cancel()  # (taken back: stays so)
            else:
                assert call.result(timeout=60) == x * x
        for n, call in bigs:
            assert call.result(timeout=60) == bytes([n % 256]) * (n * 1000)
        assert [b.result(timeout=60) for b in blockers] == [-1] * workers
    assert not spill.exists()
    ran = [int(x) for x in Path(where).read_text().split()]
    assert sorted(ran) == sorted(set(range(300)) - cancelled)
    assert cancelled, "some calls were taken back before a worker started them"


def test_a_call_started_cannot_be_taken_back() -> None:
    with closing(ProcessPool(1)) as pool:
        running = pool.submit(sleep_then, (0.5, 7))
        deadline = time.monotonic() + 10
        while not running.done() and time.monotonic() < deadline:
            time.sleep(0.05)
            if not running.cancel():
                break
        assert not running.cancel()
        assert running.result(timeout=10) == 7


def test_an_exception_is_the_callers_and_the_pool_goes_on() -> None:
    with closing(ProcessPool(2)) as pool:
        failed = pool.submit(fail, "page 7 is bad")
        with pytest.raises(ValueError, match="page 7 is bad"):
            failed.result(timeout=10)
        assert pool.submit(square, 9).result(timeout=10) == 81


def test_a_wait_times_out_without_losing_the_call() -> None:
    with closing(ProcessPool(1)) as pool:
        slow = pool.submit(sleep_then, (1.0, 3))
        with pytest.raises(FutureTimeout):
            slow.result(timeout=0.1)
        assert slow.result(timeout=10) == 3


def test_each_worker_runs_the_initializer() -> None:
    with closing(ProcessPool(2, initializer=_remember, initargs=(42,))) as pool:
        assert {pool.submit(worker_state, None).result(timeout=10) for _ in range(8)} == {42}


def test_a_worker_killed_breaks_the_pool_and_fails_the_calls_in_flight() -> None:
    with closing(ProcessPool(2)) as pool:
        waiting = pool.submit(sleep_then, (30.0, 1))
        dying = pool.submit(die, None)
        with pytest.raises(BrokenProcessPool):
            dying.result(timeout=30)
        assert pool.broken
        with pytest.raises(BrokenProcessPool):
            waiting.result(timeout=1)
        with pytest.raises(BrokenProcessPool):
            pool.submit(square, 2)
    assert all(p.exitcode is not None for p in pool.processes)


def test_closed_without_waiting_the_pool_still_answers_its_calls() -> None:
    """``close(wait=False)`` (the pipeline's idf freeze): the calls in flight still run
    and are answered, then the workers exit."""
    pool = ProcessPool(1)
    calls = [pool.submit(sleep_then, (0.05, x)) for x in range(10)]
    pool.close(wait=False)
    assert [c.result(timeout=30) for c in calls] == list(range(10))
    deadline = time.monotonic() + 20  # (the pool's closer thread reaps them)
    while any(p.exitcode is None for p in pool.processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(p.exitcode == 0 for p in pool.processes)


def test_a_call_that_cannot_go_into_a_file_goes_through_the_pipe(tmp_path: Path) -> None:
    """A full /dev/shm (a container's 64 MB, say): the message carries the data itself."""
    from dupalign.runtime.pool import _HEADER, _message, _unspill

    data = b"x" * 100_000
    full = _message(str(tmp_path / "missing"), "c1", 1, data, 1000)  # cannot be written
    assert full == [_HEADER.pack(1, len(data), -1), data]
    spilled = _message(str(tmp_path), "c2", 2, data, 1000)
    assert spilled == [_HEADER.pack(2, -len(data), -1)]
    assert _unspill(str(tmp_path), "c2") == data and not (tmp_path / "c2").exists()
    assert _message(str(tmp_path), "c3", 3, b"small", 1000) == [_HEADER.pack(3, 5, -1), b"small"]


def test_a_later_pool_s_workers_hold_no_file_of_an_earlier_pool() -> None:
    """The slot files the calling process holds open are closed in every process it
    forks later, so an earlier pool's removed files do not live on in /dev/shm."""
    with closing(ProcessPool(1)) as first:
        assert first.submit(length, b"x" * 100_000).result(timeout=60) == 100_000
        assert first._files.fds, "the call went through a slot file"
        with closing(ProcessPool(1)) as later:
            assert later.submit(square, 3).result(timeout=60) == 9  # (serving: forked)
            fds = Path(f"/proc/{later.processes[0].pid}/fd")
            held = [os.readlink(fd) for fd in fds.iterdir() if fd.is_symlink()]
            slots = [h for h in held if h.startswith(first._shared.spill)
                     and Path(h).name.startswith("s")]
            assert not slots
