"""The service's log lines: plain text or one JSON object a line (``worker.log_format``), with
the start-up lines and repeated lines folded (dupalign/service/log_repeats.py)."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from dupalign.service.log_repeats import STARTUP, RepeatFolder


class JsonFormatter(logging.Formatter):
    _skip = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3), "level": record.levelname, "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._skip})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(STARTUP)  # first: the folding counts the lines as they go out
    handler.addFilter(RepeatFolder())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLevelName(level)))
