"""A temporary directory owned by a live process, removed by the next one if its owner dies.

A process killed by SIGKILL or the OOM killer cannot remove its temporary directories, and
a restarted one makes new ones: over a crawl that never stops they would pile up (an align
process's copy of its forward records, gigabytes; a pool process's secondary instance of
the store). So each directory is locked (``flock``) while its process lives, and making
one first removes the others of its kind whose lock is free. A lock, not a process id:
ids are per PID namespace (containers sharing /tmp) and are reused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO

_OWNER = "owner.lock"


class OwnedTempDir:
    """A new directory ``parent/prefix*`` (the system's temporary directory by default),
    locked until ``remove`` or the process's end."""

    def __init__(self, prefix: str, parent: str | Path | None = None) -> None:
        parent = Path(parent or tempfile.gettempdir())
        remove_orphaned(parent, prefix)
        self.path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        # locked before it has its name, so no other process ever finds it free
        fd, name = tempfile.mkstemp(dir=self.path)
        self._lock: IO[bytes] | None = os.fdopen(fd, "wb")
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(name, self.path / _OWNER)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def remove_orphaned(parent: Path, prefix: str) -> list[Path]:
    """Remove the directories ``parent/prefix*`` whose process is gone (their lock is free);
    the ones removed. A directory without a lock file is left alone (one being made, or
    not ours)."""
    removed = []
    for path in parent.glob(prefix + "*"):
        # no lock file, or its lock held (its process lives): left
        with contextlib.suppress(OSError), open(path / _OWNER, "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(path)
            removed.append(path)
    return removed
