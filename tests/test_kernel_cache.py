"""numba's on-disk cache stays right when many processes compile the engine's kernels at once
(dupalign/kernel_cache.py): the interleaving that once named one signature's machine code
for another, forced here step by step, and a cache already written that way."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from numba.core import caching

import dupalign.kernel_cache  # noqa: F401  (installs the guards)

REPO = Path(__file__).resolve().parent.parent


def test_two_processes_saving_two_signatures_at_once_never_share_a_data_file(
    tmp_path: Path,
) -> None:
    """A saves signature X while B saves Y into one kernel's cache. Without a lock, both read
    an empty index and take data file 1; B's index ({Y: 1}) lands after A's, A's data after
    B's: Y's name held X's code. Each step waits (at most a second) for the other to pass
    the point where it broke: with the lock, B cannot start before A is done."""
    def cache_file() -> Any:
        return caching.IndexDataCacheFile(cache_path=str(tmp_path), filename_base="k",
                                          source_stamp=(1.0, 1))

    a, b = cache_file(), cache_file()
    a_loaded, b_loaded, b_done = threading.Event(), threading.Event(), threading.Event()
    a_load, a_save_data, b_load = a._load_index, a._save_data, b._load_index

    def a_loads() -> Any:
        index = a_load()
        a_loaded.set()
        b_loaded.wait(1.0)  # (unlocked) B reads the same empty index now
        return index

    def a_saves_data(name: str, data: Any) -> None:
        b_done.wait(1.0)  # (unlocked) B writes its index and data now
        a_save_data(name, data)

    def b_loads() -> Any:
        index = b_load()
        b_loaded.set()
        return index

    a._load_index, a._save_data, b._load_index = a_loads, a_saves_data, b_loads

    def b_saves() -> None:
        b.save("Y", "code of Y")
        b_done.set()

    save_a = threading.Thread(target=a.save, args=("X", "code of X"))
    save_b = threading.Thread(target=b_saves)
    save_a.start()
    a_loaded.wait()  # B starts once A is inside its save
    save_b.start()
    save_a.join()
    save_b.join()

    reader = cache_file()
    assert reader.load("Y") == "code of Y"  # unlocked: "code of X"
    assert reader.load("X") == "code of X"


def test_a_cache_that_names_one_signature_s_code_for_another_is_compiled_again(
    tmp_path: Path,
) -> None:
    """A cache left by the race (or by a numba without the lock): the two data files of a
    kernel swapped. The code loaded for int64 was built for float64; it is refused and
    compiled again, and both calls answer right."""
    (tmp_path / "kernel.py").write_text(
        "from dupalign.kernel_cache import njit\n\n"
        "@njit(cache=True)\n"
        "def twice(x):\n"
        "    return x * 2\n")
    code = "import kernel; print(kernel.twice(3), kernel.twice(1.25))"
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}",
               NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.split("\n")[0]

    assert run() == "6 2.5"
    data = sorted((tmp_path / "cache").rglob("kernel.twice-*.nbc"))
    assert len(data) == 2  # one per signature
    first, second = (f.read_bytes() for f in data)
    data[0].write_bytes(second)
    data[1].write_bytes(first)
    assert run() == "6 2.5"
    assert run() == "6 2.5"  # and from the cache written again


def test_a_change_to_a_kernel_s_callee_alone_compiles_the_caller_again(tmp_path: Path) -> None:
    """numba keys a kernel's cache by its own file; its machine code also holds the kernel
    it calls from another file. Change only that file: the caller runs the new code."""
    (tmp_path / "caller.py").write_text(
        "from dupalign.kernel_cache import njit\nfrom callee import part\n\n"
        "@njit(cache=True)\ndef whole(x):\n    return part(x) + 1\n")
    callee = tmp_path / "callee.py"
    callee.write_text("from dupalign.kernel_cache import njit\n\n"
                      "@njit(cache=True)\ndef part(x):\n    return x * 2\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}",
               NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", "import caller; print(caller.whole(5))"],
                              capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "11"
    assert run() == "11"  # from the cache
    callee.write_text(callee.read_text().replace("x * 2", "x * 3"))
    assert run() == "16"
