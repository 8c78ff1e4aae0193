"""The kernels whose cache entries tell a command that this is a first run are kernels an
engine run calls: one that no run calls is never cached, and every start would then say
that it compiles for two minutes (it did, once `_psm_batch_kernel` gave way to the one-query
kernel in the index)."""

from __future__ import annotations

from pathlib import Path

from dupalign.runtime.kernel_status import costliest_kernels
from tests.warm_kernels import warm


def test_an_engine_run_calls_every_kernel_the_first_run_check_reads(tmp_path: Path) -> None:
    warm("oph", tmp_path)  # the default mode's pages, revisit, delete and sweep
    uncalled = [k.py_func.__qualname__ for k in costliest_kernels() if not k.signatures]
    assert uncalled == []
