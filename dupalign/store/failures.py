"""Why a store call failed, in the words an operator searches for: the StoreError for
rocksdict's plain exceptions, why a store cannot be opened, and who holds its lock. Cheap to
import (no RocksDB): a command says that there is no store before it imports the engine."""

from __future__ import annotations

from pathlib import Path

from dupalign.errors import StoreError


def missing_store(path: str | Path) -> str | None:
    """Why there is no store at ``path`` to open read-only (None: there is one): cheap,
    so that a command says it before it imports the engine."""
    path = Path(path)
    if (path / "CURRENT").exists():
        return None
    return f"no store at {path}" + (
        " (the directory exists but holds no dupalign store)" if path.is_dir() else "")


# What RocksDB's messages say, in the words an operator searches for (the message itself,
# e.g. "IO error: No space left on device: While appending to file: .../000004.log: No
# space left on device", stays chained to the StoreError).
_CAUSES = (
    ("no space left on device", "no space left on device"),
    ("read-only file system", "read-only file system"),
    ("input/output error", "input/output error"),
    ("while lock file", "locked by another process"),
    ("lock hold by current process", "already open in this process"),
    ("permission denied", "permission denied"),
)


def store_error(operation: str, path: Path, exc: BaseException) -> StoreError:
    """The StoreError for rocksdict's exception ``exc`` during ``operation``."""
    if isinstance(exc, StoreError):
        return exc
    text = str(exc).strip() or type(exc).__name__
    lowered = text.lower()
    cause = next((short for needle, short in _CAUSES if needle in lowered), text)
    return StoreError(operation, path, cause)


def open_failure(path: Path, error: str) -> str:
    """One line saying why RocksDB could not open ``path`` (and who holds its lock)."""
    if "lock" in error.lower():
        holder = lock_holder(path / "LOCK")
        who = f" by {holder}" if holder else " by another process"
        if "current process" in error:
            who = " by this process (it is already open)"
        return (f"store {path} is locked{who}: one process at a time can write a store "
                "(stop it, or use another --store)")
    if "Permission denied" in error or "Read-only file system" in error:
        return f"store {path} is not writable: {error}"
    return f"cannot open store {path}: {error}"


def lock_holder(lock_file: Path) -> str | None:
    """'pid N (command)' of the process holding a POSIX lock on ``lock_file``, from
    /proc/locks (Linux); None if unknown."""
    try:
        inode = lock_file.stat().st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:  # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        fields = line.split()
        if len(fields) > 5 and fields[5].rsplit(":", 1)[-1] == str(inode):
            pid = fields[4]
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = " ".join(fh.read().decode(errors="replace").replace("\0", " ").split())
            except OSError:
                cmd = ""
            return f"pid {pid}" + (f" ({cmd[:120]})" if cmd else "")
    return None
