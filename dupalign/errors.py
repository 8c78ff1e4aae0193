"""Errors the engine raises for input it refuses; callers route them (stderr, dead letters)."""

from __future__ import annotations


class PageRejected(Exception):
    """A page the engine cannot process. ``reason`` is a short machine code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class ConfigError(ValueError):
    """An invalid configuration value; names the key and what is allowed."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config key '{key}': {message}")
        self.key = key
        self.message = message


class StoreMismatch(RuntimeError):
    """The store was created with engine parameters that differ from the requested ones."""


class StoreError(RuntimeError):
    """RocksDB failed (disk full, I/O error, read-only file system, corruption, lock): a
    failure of the machine, not of the page being processed. rocksdict raises plain
    ``Exception`` for these; the store turns every one into this type so that callers can
    stop instead of blaming the page."""

    def __init__(self, operation: str, path: object, cause: str) -> None:
        super().__init__(f"store {operation} failed: {cause} at {path}")
        self.operation = operation
        self.path = path
        self.cause = cause


class StoreUnavailable(StoreError):
    """The store directory cannot be opened: missing (for a reader), not a directory, not
    writable, or locked by another process. The message says which, in one line."""

    def __init__(self, message: str) -> None:
        RuntimeError.__init__(self, message)
        self.operation, self.path, self.cause = "open", None, message
