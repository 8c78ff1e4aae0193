"""A process pool whose hand-over needs no thread of the calling process.

CPython's ProcessPoolExecutor hands a call to its processes with a feeder thread and
takes results back with a manager thread, both in the calling process and both needing
its GIL. The pipeline's calling thread holds the GIL for milliseconds at a time (it
indexes, and does pool work itself: an HTML parse holds it throughout), so calls waited
in the executor, and results in a full pipe, while the pool's process sat idle
(``tests/bench/pool_timeline.py``).

Here the calling thread writes each call into the task pipe itself, at submit, and reads
the results itself when it asks whether a call is done or waits for one. A call larger
than 32 KB (a chunk of HTML pages) goes into a file in memory (/dev/shm) that its message
names, so the pipe does not fill while the calling thread is busy (what does not fit
waits in an outbox, written at its next call into the pool); a worker does the same with
every result larger than PIPE_BUF, so its messages are written whole at once and it never
waits for the calling process. Those files are written over again, each the slot of one
message at a time (``_SlotFiles``): a file made anew costs the allocation and zeroing of
its pages in /dev/shm (200 µs of CPU for a 200 KB message, written, read and removed,
against 40 µs written over; a sketch chunk from llvm text is 210 KB). A worker reads the
next call as soon as it is free. Every call submitted stays cancellable until a worker
starts it: a slot per call in shared memory, claimed under a lock by the worker that runs
it or by the caller that takes it back (``Call.cancel``).

A worker ends when the calling process is gone, killed too (SIGKILL, the OOM killer):
it reads the end of the task pipe once the call it runs is done.

Only the thread that submits may use a pool's calls (``done``, ``cancel``, ``result``);
``close(wait=False)`` leaves a thread that delivers the rest of the calls and results.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import multiprocessing
import os
import pickle
import select
import signal
import struct
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from dupalign.runtime.owned_dir import OwnedTempDir

_HEADER = struct.Struct("<qqq")  # a message: (call id, payload bytes, slot), then the
# payload; -bytes: the payload is in a file of the pool's spill directory: the slot's file
# (``_SlotFiles``), or with slot -1 the file named by the call id (removed once read)
_STOP = -1  # the call id that ends a worker
_QUEUED, _RUNNING, _TAKEN = 0, 1, 2  # a slot holds id * 4 + state (ids of older calls
# that used the slot do not match: their messages may still be in the pipe)
_SLOTS = 1 << 12  # calls in flight at most (the pipeline has ~2 * depth)
_PIPE_BYTES = 1 << 20  # Linux's default limit for an unprivileged F_SETPIPE_SZ
# A call larger than this goes through a file (in memory: /dev/shm) and its message only
# names it: a few HTML pages fill a pipe, and the rest would wait in the outbox while the
# calling thread works (the pool idle meanwhile: most of its idle time, from HTML)
_SPILL_BYTES = 32 << 10
SPILL_PREFIX = "dupalign-pool-calls-"
_INLINE_RESULT = select.PIPE_BUF - _HEADER.size  # a result message is written whole
# slot files: a call's (freed when its result comes in, or when it is taken back) and each
# worker's results' (freed by the caller once read); a message larger than _SLOT_BYTES, or
# one with no slot free, gets a file of its own, so /dev/shm holds at most the slots'
_CALL_SLOTS, _RESULT_SLOTS, _SLOT_BYTES = 64, 8, 1 << 20
_F_SETPIPE_SZ = 1031
_CHECK_S = 0.5  # how often a wait checks that the workers live


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    with contextlib.suppress(OSError):  # (a lower limit here: the default size works too)
        fcntl.fcntl(w, _F_SETPIPE_SZ, _PIPE_BYTES)
    return r, w


def _read_exact(fd: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        part = os.read(fd, left)
        if not part:
            raise EOFError("the pool's pipe closed")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _spill_parent() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def _message(spill: str, name: str, call_id: int, data: bytes, inline: int,
             slots: _SlotFiles | None = None, slot: int = -1) -> list[bytes]:
    """The message of ``data``: inline, or, above ``inline`` bytes, in the file of
    ``slot`` (if any: ``slots``), else in the file ``name`` of the directory ``spill``
    (the pipe's, if the file cannot be written: a full /dev/shm)."""
    if len(data) > inline:
        if slots is not None and slot >= 0:
            if slots.write(slot, data):
                return [_HEADER.pack(call_id, -len(data), slot)]
            return [_HEADER.pack(call_id, len(data), -1), data]
        path = os.path.join(spill, name)
        try:
            with open(path, "wb") as fh:
                fh.write(data)
            return [_HEADER.pack(call_id, -len(data), -1)]
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return [_HEADER.pack(call_id, len(data), -1), data]


def _unspill(spill: str, name: str, keep: bool = True) -> bytes:
    """The data of a message in a file, which is removed (read only if ``keep``)."""
    path = os.path.join(spill, name)
    data = b""
    if keep:
        with open(path, "rb") as fh:
            data = fh.read()
    os.unlink(path)
    return data


class _SlotFiles:
    """The slot files of a spill directory that this process opened, each written over
    from its start by the message that holds the slot (a reader knows the size from the
    message)."""

    def __init__(self, spill: str) -> None:
        self.spill = spill
        self.fds: dict[int, int] = {}
        _OPENED.add(self)

    def _fd(self, slot: int) -> int:
        fd = self.fds.get(slot)
        if fd is None:
            fd = self.fds[slot] = os.open(os.path.join(self.spill, f"s{slot}"),
                                          os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        return fd

    def write(self, slot: int, data: bytes) -> bool:
        """False: not written (a full /dev/shm)."""
        try:
            fd, view, at = self._fd(slot), memoryview(data), 0
            while at < len(view):
                at += os.pwrite(fd, view[at:], at)
            return True
        except OSError:
            return False

    def read(self, slot: int, n: int) -> bytearray:
        data, at = bytearray(n), 0
        with memoryview(data) as view:
            while at < n:
                got = os.preadv(self._fd(slot), [view[at:]], at)
                if not got:
                    raise EOFError(f"the pool's slot file {slot} is short")
                at += got
        return data

    def close(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


# every process's open slot files: a process forked later (a new pool's worker) closes
# them, so that a removed spill directory's files do not live on in it
_OPENED: weakref.WeakSet[_SlotFiles] = weakref.WeakSet()


def _close_inherited() -> None:
    for files in list(_OPENED):
        files.close()


os.register_at_fork(after_in_child=_close_inherited)


class _Shared:
    """What the calling process and its workers share: the pipes, the slots, the locks,
    the directory of the calls too large for the pipe."""

    def __init__(self, ctx: Any, spill: str, workers: int) -> None:
        self.spill = spill
        # 1: a worker's result slot holds a result the caller has not read yet
        self.results_held = ctx.RawArray(ctypes.c_int8, workers * _RESULT_SLOTS)
        self.tasks_r, self.tasks_w = _pipe()
        self.results_r, self.results_w = _pipe()
        self.slots = ctx.RawArray(ctypes.c_int64, _SLOTS)
        self.claim = ctx.Lock()  # a slot's state changes under it
        self.reading = ctx.Lock()  # one worker reads a whole message at a time
        self.writing = ctx.Lock()  # one worker writes a whole result at a time

    def take(self, call_id: int, state: int) -> bool:
        """Move call ``call_id`` from queued to ``state``; False if it was not queued."""
        slot = call_id % _SLOTS
        with self.claim:
            if self.slots[slot] != call_id * 4 + _QUEUED:
                return False
            self.slots[slot] = call_id * 4 + state
            return True


def _result_slot(shared: _Shared, index: int, size: int) -> int:
    """A free result slot of worker ``index``, now held, for a result of ``size`` bytes
    (-1: none, or too large for one)."""
    if size > _SLOT_BYTES:
        return -1
    held = shared.results_held
    for x in range(index * _RESULT_SLOTS, (index + 1) * _RESULT_SLOTS):
        if not held[x]:
            held[x] = 1
            return x
    return -1


def _serve(shared: _Shared, index: int, initializer: Callable[..., None] | None,
           initargs: tuple[Any, ...]) -> None:
    """Worker ``index``: run the calls it claims, until told to stop."""
    # Ctrl-C reaches the terminal's whole process group: the calling process handles it
    # (it stops submitting, then closes the pool, or it dies and the pipe ends); a worker
    # interrupted mid-answer only broke that pipe (BrokenPipeError in the caller).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.close(shared.tasks_w)
    os.close(shared.results_r)
    if initializer is not None:
        initializer(*initargs)
    files = _SlotFiles(shared.spill)
    while True:
        try:
            with shared.reading:
                call_id, n, slot = _HEADER.unpack(_read_exact(shared.tasks_r, _HEADER.size))
                payload: bytes | bytearray = _read_exact(shared.tasks_r, n) if n >= 0 else b""
        except EOFError:  # the calling process is gone (killed): nothing to answer
            return
        if call_id == _STOP:
            return
        mine = shared.take(call_id, _RUNNING)
        try:
            if n < 0 and slot >= 0:  # (taken back: the caller has its slot again)
                payload = files.read(slot, -n) if mine else b""
            elif n < 0:
                payload = _unspill(shared.spill, f"c{call_id}", keep=mine)
            if not mine:
                continue  # taken back by the caller
            fn, arg = pickle.loads(payload)
            result: tuple[bool, Any] = (True, fn(arg))
        except BaseException as exc:  # the caller gets it, as from any executor
            result = (False, exc)
        try:
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            data = pickle.dumps((False, RuntimeError(
                f"the pool could not send a result back: {exc!r}")))
        # a message of at most PIPE_BUF bytes is written whole at once, and one that big
        # waits on a full pipe only if the caller has not read thousands of them: the
        # worker never waits for the calling process (a larger result goes into a file)
        slot = _result_slot(shared, index, len(data)) if len(data) > _INLINE_RESULT else -1
        message = _message(shared.spill, f"r{call_id}", call_id, data, _INLINE_RESULT, files,
                           slot)
        if slot >= 0 and len(message) > 1:  # (not written: through the pipe after all)
            shared.results_held[slot] = 0
        with shared.writing:
            try:
                _write_all(shared.results_w, b"".join(message))
            except BrokenPipeError:  # the calling process is gone
                return


class Call:
    """A call submitted to a ``ProcessPool``: a Future's ``done``, ``cancel`` and
    ``result`` for the thread that submitted it."""

    __slots__ = ("_pool", "_state", "_value", "id")

    def __init__(self, pool: ProcessPool, call_id: int) -> None:
        self.id, self._pool = call_id, pool
        self._state = _QUEUED  # _QUEUED (not answered yet), _TAKEN (cancelled), or done
        self._value: tuple[bool, Any] | None = None

    def done(self) -> bool:
        if self._value is None and self._state == _QUEUED:
            self._pool._pump(0.0)
        return self._value is not None or self._state == _TAKEN

    def cancel(self) -> bool:
        """Take the call back if no worker has started it (it never runs then)."""
        if self._value is not None:
            return False
        if self._state == _TAKEN:
            return True
        if not self._pool._shared.take(self.id, _TAKEN):
            return False
        self._state = _TAKEN
        self._pool._calls.pop(self.id, None)
        self._pool._free_call_slot(self.id)
        return True

    def result(self, timeout: float | None = None) -> Any:
        if self._state == _TAKEN:
            raise RuntimeError("the call was cancelled")
        if self._value is None:
            self._pool._wait_for(self, timeout)
        assert self._value is not None
        ok, value = self._value
        if ok:
            return value
        raise value

    def _set(self, value: tuple[bool, Any]) -> None:
        self._value = value


class ProcessPool:
    """``workers`` processes (forked) that each run ``initializer(*initargs)`` once, then
    the calls submitted to them."""

    def __init__(self, workers: int, initializer: Callable[..., None] | None = None,
                 initargs: tuple[Any, ...] = ()) -> None:
        ctx = multiprocessing.get_context("fork")
        self._spill = OwnedTempDir(SPILL_PREFIX, _spill_parent())
        self._shared = _Shared(ctx, str(self._spill.path), workers)
        self.processes = [ctx.Process(target=_serve,
                                      args=(self._shared, x, initializer, initargs),
                                      daemon=True, name=f"dupalign-pool-{x}")
                          for x in range(workers)]
        for p in self.processes:
            p.start()
        os.close(self._shared.tasks_r)
        os.close(self._shared.results_w)
        os.set_blocking(self._shared.tasks_w, False)
        os.set_blocking(self._shared.results_r, False)
        self._next = 0
        self._calls: dict[int, Call] = {}  # submitted, not answered nor taken back
        self._outbox: deque[memoryview] = deque()  # messages not in the task pipe yet
        self._inbox = bytearray()  # results read, not whole yet
        self._chunk = bytearray(_PIPE_BYTES)  # (os.read would allocate this much per call)
        self._lock = threading.Lock()  # the pipes' parent ends, once a closer runs too
        # the call slots' files (after the workers' result slots), those free, and the
        # slot of each call that holds one
        self._files = _SlotFiles(self._shared.spill)
        first = workers * _RESULT_SLOTS
        self._free_slots = list(range(first + _CALL_SLOTS - 1, first - 1, -1))
        self._call_slots: dict[int, int] = {}
        self._broken: str | None = None
        self._closed = False

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Call:
        """``fn(arg)`` in a worker (``fn`` a module's function: it is pickled by name)."""
        if self._broken is not None:
            raise BrokenProcessPool(self._broken)
        if self._closed:
            raise RuntimeError("submit to a closed pool")
        call_id = self._next
        if call_id - _SLOTS in self._calls:
            raise RuntimeError(f"more than {_SLOTS} calls in flight")
        self._next += 1
        payload = pickle.dumps((fn, arg), protocol=pickle.HIGHEST_PROTOCOL)
        self._shared.slots[call_id % _SLOTS] = call_id * 4 + _QUEUED  # (before its message)
        call = self._calls[call_id] = Call(self, call_id)
        slot = -1
        if _SPILL_BYTES < len(payload) <= _SLOT_BYTES and self._free_slots:
            slot = self._call_slots[call_id] = self._free_slots.pop()
        message = _message(self._shared.spill, f"c{call_id}", call_id, payload, _SPILL_BYTES,
                           self._files, slot)
        if slot >= 0 and len(message) > 1:  # (not written: through the pipe after all)
            self._free_call_slot(call_id)
        with self._lock:
            self._outbox.extend(memoryview(part) for part in message)
            self._flush()
            self._read()
        return call

    def _free_call_slot(self, call_id: int) -> None:
        """The slot of call ``call_id`` is free again: its worker read it, or none will."""
        slot = self._call_slots.pop(call_id, None)
        if slot is not None:
            self._free_slots.append(slot)

    def _flush(self) -> None:
        """Write what the task pipe takes now."""
        box = self._outbox
        while box:
            try:
                n = os.write(self._shared.tasks_w, box[0])
            except BlockingIOError:
                return
            if n == len(box[0]):
                box.popleft()
            else:
                box[0] = box[0][n:]

    def _read(self) -> None:
        """Read the results the result pipe holds now, and answer their calls."""
        while True:
            try:
                n = os.readv(self._shared.results_r, [self._chunk])
            except BlockingIOError:
                break
            if not n:
                break
            self._inbox += memoryview(self._chunk)[:n]
        inbox, at = self._inbox, 0
        while len(inbox) - at >= _HEADER.size:
            call_id, n, slot = _HEADER.unpack_from(inbox, at)
            end = at + _HEADER.size + max(n, 0)
            if len(inbox) < end:
                break
            self._free_call_slot(call_id)  # (its worker read it before it answered)
            if n < 0 and slot >= 0:  # (in a result slot's file, free again once read)
                data = self._files.read(slot, -n)
                self._shared.results_held[slot] = 0
                value = pickle.loads(data)
            elif n < 0:  # (in a file of its own)
                value = pickle.loads(_unspill(self._shared.spill, f"r{call_id}"))
            else:
                with memoryview(inbox) as view:
                    value = pickle.loads(view[at + _HEADER.size:end])
            call = self._calls.pop(call_id, None)
            if call is not None:
                call._set(value)
            at = end
        if at:
            del inbox[:at]

    def _pump(self, timeout: float) -> None:
        """Hand over what waits in the outbox and take in results, waiting up to
        ``timeout`` seconds for one when none is there."""
        results, tasks = self._shared.results_r, self._shared.tasks_w
        if timeout > 0 and results >= 0:
            poll = select.poll()
            with contextlib.suppress(ValueError):  # (-1: released meanwhile; see below)
                poll.register(results, select.POLLIN)
                if self._outbox:
                    poll.register(tasks, select.POLLOUT)
            poll.poll(timeout * 1000)
        with self._lock:
            if self._shared.results_r < 0:  # released by the closer thread: all answered
                return
            self._flush()
            self._read()

    def _wait_for(self, call: Call, timeout: float | None) -> None:
        """Until ``call`` is answered; FutureTimeout after ``timeout`` seconds; the pool
        broken (BrokenProcessPool) if a worker process dies meanwhile."""
        end = None if timeout is None else time.monotonic() + timeout
        checked = time.monotonic()
        while call._value is None:
            if self._broken is not None:
                raise BrokenProcessPool(self._broken)
            now = time.monotonic()
            left = _CHECK_S if end is None else min(_CHECK_S, end - now)
            if left <= 0:
                raise FutureTimeout()
            self._pump(left)
            if call._value is not None or time.monotonic() - checked < _CHECK_S:
                continue
            checked = time.monotonic()
            if any(p.exitcode not in (None, 0) for p in self.processes):
                self._pump(0.0)  # (what it sent before it died)
                if call._value is None:
                    self._condemn("a worker process died (killed or crashed) while the "
                                 "pipeline waited on it")

    def _condemn(self, why: str) -> None:
        """Mark the pool broken and end its workers: every call not answered fails."""
        self._broken = why
        for p in self.processes:
            if p.exitcode is None:
                p.kill()
        for p in self.processes:
            p.join(10)
        self._release(why)

    def _release(self, why: str) -> None:
        """Fail the calls still unanswered with ``why``, close the pipes and remove the
        spill directory (the workers have exited)."""
        for call in list(self._calls.values()):
            call._set((False, BrokenProcessPool(why)))
        self._calls.clear()
        with self._lock:
            for fd in (self._shared.tasks_w, self._shared.results_r):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._shared.tasks_w = self._shared.results_r = -1
            self._files.close()
        self._spill.remove()

    def close(self, wait: bool = True) -> None:
        """End the workers once they have run every call not taken back. ``wait=False``:
        a thread of this process hands over the rest and reads the results (answering
        the calls), and closes the pipes when the workers have exited."""
        if self._closed or self._broken is not None:
            return
        self._closed = True
        with self._lock:
            for _ in self.processes:
                self._outbox.append(memoryview(_HEADER.pack(_STOP, 0, -1)))
        if wait:
            self._finish()
        else:
            threading.Thread(target=self._finish, daemon=True,
                             name="dupalign-pool-closer").start()

    def _finish(self) -> None:
        while any(p.is_alive() for p in self.processes):
            self._pump(0.05)
        self._pump(0.0)
        for p in self.processes:
            p.join()
        self._release("the pool ended before answering")  # (none left, unless one died)
