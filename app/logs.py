"""Logs: JSON lines on stderr, one object per line."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per log line, with any `extra` mapping merged in."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("batch", "settings", "summary"):
            if hasattr(record, key):
                entry[key] = getattr(record, key)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLinesFormatter())
    root = logging.getLogger("geoingest")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    # kafka-python reports every reconnect attempt at ERROR; the service reports what matters.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
