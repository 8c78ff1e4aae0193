"""numba's on-disk cache stays right when many processes compile the engine's kernels at once
(dupalign/kernel_cache.py): the interleaving that once named one signature's machine code
for another, forced here step by step, and a cache already written that way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from numba.core import caching

import dupalign.kernel_cache  # noqa: F401  (installs the guards)

REPO = Path(__file__).resolve().parents[2]


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


def test_a_change_to_a_callee_in_a_sibling_subpackage_compiles_the_caller_again(
    tmp_path: Path,
) -> None:
    """The kernel in ``pkg/a`` calls a kernel of ``pkg/b``: a change to that callee alone
    must reach the caller's cached machine code, wherever in the package it lives (a key
    over the kernel's own folder kept the old code)."""
    for sub in ("", "a", "b"):
        (tmp_path / "pkg" / sub).mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / sub / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a" / "kern.py").write_text(
        "from dupalign.kernel_cache import njit\nfrom pkg.b.callee import part\n\n"
        "@njit(cache=True)\ndef whole(x):\n    return part(x) + 1\n")
    callee = tmp_path / "pkg" / "b" / "callee.py"
    callee.write_text("from dupalign.kernel_cache import njit\n\n"
                      "@njit(cache=True)\ndef part(x):\n    return x * 2\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}",
               NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", "from pkg.a import kern; print(kern.whole(5))"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert run() == "11"
    assert run() == "11"  # from the cache
    assert list((tmp_path / "cache").rglob("kern.whole-*.nbc"))  # (it was cached)
    callee.write_text(callee.read_text().replace("x * 2", "x * 3"))
    assert run() == "16"



_SORTS = {  # two kernels whose machine code calls numba's quicksort of an int64 array
    "sorting": "def run(x):\n    y = x.copy()\n    y.sort()\n    return y\n",
    "ordering": "def run(x):\n    return np.argsort(x)\n",
}
_X = [4, 3, 9, 1, 7, 2, 8, 0, 5, 6, 11, 10, 13, 12, 15, 14, 17, 16, 19, 18]
_COUNTED = f"""
import itertools, json, re, sys
from numba.core import bytecode
bytecode.FunctionIdentity._unique_ids = itertools.count(int(sys.argv[1]))
import numpy as np
for name in sys.argv[2].split(","):
    run = __import__(name).run
    found = run(np.array({_X}))
    numbers = sorted({{int(n) for ll in run.inspect_llvm().values()
                      for n in re.findall(r"run_quicksortB\\d+v(\\d+)", ll)}})
    print(json.dumps([found.tolist(), numbers]))
"""


def test_kernels_cached_by_two_processes_never_call_each_other_s_code(tmp_path: Path) -> None:
    """numba names compiled code by function name, argument types and a number each
    process counts from 1, and the cache keeps the names: numba's quicksort of an int64
    array in a sort and in an argsort are two closures of one factory, so two processes
    can name them alike, and a process that loads both from the cache linked the sort to
    the argsort's code (CI saw ``keys.sort()`` leave keys unsorted). Here two processes
    count so that their quicksorts would take one name; a third loads the argsort, then
    the sort, which must still sort."""
    for name, body in _SORTS.items():
        (tmp_path / f"plain_{name}.py").write_text(
            f"import numpy as np\nfrom numba import njit\n\n@njit\n{body}")
        (tmp_path / f"{name}.py").write_text(
            "import numpy as np\nfrom dupalign.kernel_cache import njit\n\n"
            f"@njit(cache=True)\n{body}")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}",
               NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run(start: int, modules: str) -> list[tuple[list[int], list[int]]]:
        done = subprocess.run([sys.executable, "-c", _COUNTED, str(start), modules],
                              capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return [tuple(json.loads(line)) for line in done.stdout.splitlines()]

    # numba's numbering from 1, as in every process: the number each quicksort gets
    [(_, [sort_n])] = run(1, "plain_sorting")
    [(_, [order_n])] = run(1, "plain_ordering")
    run(1, "sorting")  # compiled and cached by one process,
    run(1 + sort_n - order_n, "ordering")  # the argsort by another, counting to that number
    [(order, _), (ordered, _)] = run(1, "ordering,sorting")  # both loaded by a third
    assert order == sorted(range(len(_X)), key=_X.__getitem__)
    assert ordered == sorted(_X)
