"""docs/configuration.md from the configuration dataclasses: every key once, with its type,
default and allowed values taken from the code, and a one-line meaning kept in the file.

``python -m tests.config_reference --write`` rewrites the file (meanings it already holds are
kept; a new key gets ``TODO``); tests/test_docs.py fails while the file differs from what this
renders, or while a meaning is ``TODO``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dupalign import config as engine_config

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
TODO = "TODO"


def service_config() -> ModuleType:
    """The service's configuration module (the Kafka side's [kafka], [worker], [metrics])."""
    return importlib.import_module("dupalign.service.config")


def _engine_checks() -> dict[str, str]:
    """key -> allowed values, read from the _check_range/_check_choice calls of the engine's
    validate() methods (the engine keeps its ranges in code, not in field metadata)."""
    tree = ast.parse(inspect.getsource(engine_config))
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id not in ("_check_range", "_check_choice") or not node.args:
            continue
        key = node.args[0]
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            continue
        if node.func.id == "_check_range":
            lo, hi = (_value(a) for a in node.args[2:4])
            out[key.value] = f"{lo} – {hi}"
        else:
            out[key.value] = ", ".join(map(str, _value(node.args[2])))
    return out


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and hasattr(engine_config, node.id):
        return getattr(engine_config, node.id)
    try:
        return ast.literal_eval(node)
    except ValueError:
        text = ast.unparse(node)
        if text.startswith("self."):
            return f"`passage.{text[5:]}`"
        return eval(text, {})  # constant expressions such as 1 << 30 or (1 << 32) - 1


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"' if value else '""'
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, tuple):
        return "list of int"
    return type(value).__name__


def rows() -> dict[str, list[tuple[str, str, str, str]]]:
    """table heading -> (key, type, default, allowed) per key, in the code's order."""
    checks = _engine_checks()
    frozen = {(sec, key) for sec, key in engine_config.FROZEN_FIELDS.values()}
    tables: dict[str, list[tuple[str, str, str, str]]] = {}
    eng = engine_config.EngineConfig()
    tables["[engine]"] = [("engine.seed", "int", str(eng.seed), checks["seed"] + "; frozen")]
    for section, cls in engine_config.SECTIONS.items():
        assert is_dataclass(cls)
        items = []
        for f in fields(cls):
            default = getattr(getattr(eng, section), f.name)
            allowed = checks.get(f"{section}.{f.name}", "")
            if section == "passage" and f.name == "theta":
                allowed = "a fraction in (0, 1], e.g. 3/10 or 0.3"
            if section == "near" and f.name == "idf_freeze_at":
                allowed = "increasing positive page counts"
            if (section, f.name) in frozen:
                allowed = f"{allowed}; frozen" if allowed else "frozen"
            items.append((f"engine.{section}.{f.name}", _type(default), _show(default),
                          allowed or "any"))
        tables[f"[engine.{section}]"] = items
    svc = service_config()
    for table, cls in svc.TABLES.items():
        defaults = cls()
        items = []
        for f in fields(cls):
            default = getattr(defaults, f.name)
            meta = f.metadata
            if "range" in meta:
                allowed = f"{meta['range'][0]} – {meta['range'][1]}"
            elif "choices" in meta:
                allowed = ", ".join(meta["choices"])
            elif meta.get("nonempty"):
                allowed = "non-empty"
            else:
                allowed = "any"
            items.append((f"{table}.{f.name}", _type(default), _show(default), allowed))
        tables[f"[{table}]"] = items
    return tables


ROW = re.compile(r"^\| `([\w.]+)` \|.*\| ([^|]*) \|$")


def meanings(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2).strip() for m in map(ROW.match, text.splitlines()) if m}


HEAD = """# Configuration reference

Every key once. One TOML file (`--config FILE`): the engine reads its `[engine]` table (and the
sub-tables below); the worker and the roles also read `[kafka]`, `[worker]` and `[metrics]`.
`dupalign scan`, `query`, `delete` and `compact` read `[engine]` only. An example file:
[deploy/dupalign.toml](../deploy/dupalign.toml).

**Precedence**: defaults < the TOML file < environment variables < command-line flags.

**Environment**: `DUPALIGN_<TABLE>_<KEY>` overrides a key, e.g.
`DUPALIGN_KAFKA_BOOTSTRAP_SERVERS=broker:9092`, `DUPALIGN_WORKER_BATCH_SIZE=128`; engine keys take
their section: `DUPALIGN_ENGINE_NEAR_HAMMING=4` is `[engine.near] hamming`,
`DUPALIGN_ENGINE_SEED=7` is `[engine] seed`. String keys take the value verbatim (a password may
look like a number); other keys parse it as a TOML value. An unknown key, in the file or the
environment, stops start-up.

**Checks**: every value is checked at start-up; a bad one stops it with one line naming the key
and what is allowed (exit code 2). "Frozen" keys are recorded in the store when it is made:
opening it with other values fails with a message listing them (exit code 4), and readers
(`query`, `stats`) take them from the store. Other keys may change between runs. Cache sizes
change speed only, never results.

This file is checked against the code by `tests/test_docs.py`; after changing a key, run `python
-m tests.config_reference --write` and fill in the meaning of any new key."""


def render(old: str) -> str:
    known = meanings(old)
    out = [HEAD]
    for table, items in rows().items():
        out.append(f"## {table}\n")
        out.append("| key | type | default | allowed | meaning |")
        out.append("|---|---|---|---|---|")
        for key, typ, default, allowed in items:
            out.append(f"| `{key}` | {typ} | {default} | {allowed} | {known.get(key, TODO)} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/configuration.md")
    args = parser.parse_args()
    old = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    new = render(old)
    if args.write:
        DOC.write_text(new, encoding="utf-8")
    else:
        print(new, end="")


if __name__ == "__main__":
    main()
