"""The ``dupalign`` commands over a store that exists: query, delete, compact, stats, audit;
and the engine config and the engine's open that ``scan`` shares with them."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dupalign.service.exits import CliError, Exit

if TYPE_CHECKING:
    from dupalign.config import EngineConfig
    from dupalign.runtime.engine import Engine


def load_engine_config(path: str | None) -> EngineConfig:
    """The ``[engine]`` table of a TOML config file (or the whole file if it has none)."""
    import tomllib

    from dupalign.config import EngineConfig
    from dupalign.errors import ConfigError

    if path is None:
        return EngineConfig().validate()
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("<file>", f"cannot read {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("<file>", f"{path} is not valid TOML: {exc}") from exc
    section = data.get("engine", {}) if any(k in data for k in ("engine", "kafka")) else data
    return EngineConfig.from_dict(section)


def open_engine(store: str, config: EngineConfig, read_only: bool = False,
                 removal_only: bool = False) -> Engine:
    """The engine over ``store`` (a reader's store must exist: said as a store error)."""
    if read_only:  # said before the engine's import (numba: about 2 s of CPU)
        existing_store(store)
    from dupalign.runtime.engine import Engine

    return Engine.open(store, config, read_only=read_only, removal_only=removal_only)


def cmd_query(args: argparse.Namespace) -> int:
    config = load_engine_config(args.config)
    if args.file:
        try:
            text = Path(args.file).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise CliError(f"cannot read input {args.file}: {exc.strerror}", Exit.INPUT) from None
    elif args.text is not None:
        text = args.text
    else:
        text = sys.stdin.read()
    with open_engine(args.store, config, read_only=True) as engine:
        for match in engine.query_text(text):
            print(json.dumps(match.to_dict(), ensure_ascii=False))
    return 0


def existing_store(store: str) -> str:
    """``store``, or a CliError (exit 4) saying why it is not a store."""
    from dupalign.store.failures import missing_store

    if (missing := missing_store(store)) is not None:
        raise CliError(missing, Exit.STORE)
    return store


def _check_committed(engine: Engine, store: str, force: bool) -> None:
    """A Kafka worker's store may hold pages past its group's commit (a crash, a failed
    commit): the restarted worker reads their records again and answers them from the
    store, so removing pages now would index them again as new pages (wrong matches)."""
    if force or not (ahead := engine.ahead_of_checkpoints()):
        return
    (topic, partition), (noted, stored) = min(ahead.items())
    more = f" (and {len(ahead) - 1} more partition(s))" if len(ahead) > 1 else ""
    raise CliError(
        f"store {store} holds pages of {topic}:{partition} at offsets {noted} to {stored - 1}"
        f"{more} that a Kafka worker stored but has not recorded as committed; restarted, it "
        "reads them again and answers them from the store: run the worker until it has "
        "caught up, then retry (--force removes pages anyway: wrong matches for those)",
        Exit.UNCOMMITTED)


def cmd_delete(args: argparse.Namespace) -> int:
    config = load_engine_config(args.config)
    ids = list(dict.fromkeys(args.ids))
    # removal only: an open that does not read the whole store (the near index's table)
    with open_engine(existing_store(args.store), config, removal_only=True) as engine:
        _check_committed(engine, args.store, args.force)
        # like `rm -f`: an id not stored is already where delete would put it, so it is
        # said, not an error (a retried or repeated removal succeeds)
        absent = [i for i in ids if not engine.has_page(i)]
        removed = engine.delete(ids)
    print(f"{removed} of {len(ids)} pages deleted", file=sys.stderr)
    if absent:
        shown = ", ".join(map(repr, absent[:20]))
        more = f" and {len(absent) - 20} more" if len(absent) > 20 else ""
        print(f"not in the store {args.store} (nothing to delete): {shown}{more}",
              file=sys.stderr)
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    config = load_engine_config(args.config)
    retention = {k: v for k, v in (("max_pages", args.max_pages), ("max_age", args.max_age))
                 if v is not None}
    if retention:
        config = replace(config, retention=replace(config.retention, **retention)).validate()
    with open_engine(existing_store(args.store), config) as engine:
        if config.retention.max_pages or config.retention.max_age:  # (else: files only)
            _check_committed(engine, args.store, args.force)
        before = engine.store.size_bytes()
        removed = engine.compact()
        engine.store.compact()
        after = engine.store.size_bytes()
        alive = engine.alive
    print(f"{removed} pages removed by retention, {alive} left; store {before >> 20} MB -> "
          f"{after >> 20} MB", file=sys.stderr)
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    config = load_engine_config(args.config)
    with open_engine(args.store, config, read_only=True) as engine:
        stats = {k: v for k, v in engine.stats().items() if k in _STORE_FIGURES}
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        print(stats_table(args.store, stats))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    config = load_engine_config(args.config)
    with open_engine(args.store, config, read_only=True) as engine:
        tally = engine.audit_store(args.pages, args.reservoir)
    estimates = tally.estimates()
    if args.json:
        print(json.dumps(estimates, indent=2, sort_keys=True))
    else:
        print("\n".join([f"store {args.store}", *audit_lines(estimates)]))
    return 0


# The store's figures, what `dupalign stats --json` prints. Engine.stats() also counts what
# the engine did since it was opened (deletes, lookups): nothing, in a process that only
# opens the store to read these, so those counters would read as store figures of zero.
_STORE_FIGURES = ("pages", "ordinals", "store_bytes", "near_table_size", "near_table_bytes",
                  "idf_version", "params", "audit")
# What `dupalign stats` shows as a table
_STORE_ROWS = (
    ("pages", "pages"),
    ("store_bytes", "store size"),
    ("near_table_size", "simhash table entries"),
    ("near_table_bytes", "simhash table in memory"),
    ("idf_version", "idf version in force"),
)


def stats_table(store: str, stats: dict[str, Any]) -> str:
    def human(key: str, value: Any) -> str:
        if key.endswith("_bytes") and isinstance(value, int):
            return f"{value / 2**20:,.1f} MiB" if value >= 2**20 else f"{value:,} B"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return str(value)

    store_rows = [(label, human(key, stats[key])) for key, label in _STORE_ROWS if key in stats]
    param_rows = [(key, str(value)) for key, value in sorted(stats["params"].items())]
    width = max(len(label) for label, _ in store_rows + param_rows)
    lines = [f"store {store}"] + [f"  {label:<{width}}  {v}" for label, v in store_rows]
    lines += ["frozen parameters"] + [f"  {label:<{width}}  {v}" for label, v in param_rows]
    return "\n".join(lines + audit_lines(stats.get("audit", {})))


def audit_lines(estimates: dict[str, dict[str, Any]]) -> list[str]:
    """The recall audit's estimates (dupalign.audit.recall), one line per kind."""
    out = ["recall audit (95 % interval; sampled pages, true pairs; misses by cause)"]
    for kind, e in sorted(estimates.items()):
        if e["recall"] is None:
            out.append(f"  {kind:<8} no true pair audited yet ({e['pages']} pages)")
            continue
        causes = ", ".join(f"{c} {n}" for c, n in sorted(e["misses"].items())) or "none"
        out.append(f"  {kind:<8} {e['recall']:.3f} [{e['low']:.3f}, {e['high']:.3f}]  "
                   f"{e['pages']} pages, {e['pairs']} pairs; misses: {causes}")
    return out
