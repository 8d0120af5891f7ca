"""The log as JSON lines (`bertforge serve --json-output`, text-embeddings-inference's flag): one object per record,
for the log collectors of a cluster, which split a plain multi-line traceback into unrelated records."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone


class JsonLines(logging.Formatter):
    """A record as one line: {"timestamp", "level", "target" (the logger), "message"} and, for a failure, "error"
    (the traceback as one string)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"timestamp": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                "level": record.levelname, "target": record.name, "message": record.getMessage()}
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def log_as_json() -> None:
    """Every handler of the root logger writes JSON lines, Python's warnings included; a server's framework logs
    through them where its own logging configuration is off (app.serve's json_logs)."""
    for handler in logging.getLogger().handlers:
        handler.setFormatter(JsonLines())
    logging.captureWarnings(True)


def logging_json() -> bool:
    return any(isinstance(handler.formatter, JsonLines) for handler in logging.getLogger().handlers)
