"""One log format for a gateway process: once its config is loaded, every line it writes on stderr
is one JSON object (a refusal to start before that is the command line's one error line,
``kvgate serve: error: ...``, as for every subcommand).

The access log already writes JSON lines (``access_log.format: json``, its default:
``{"event": "access", ..., "timestamp": <epoch seconds>}``); ``configure`` makes every other line
the same shape: kvgate's own loggers, uvicorn's and any library's, through one handler on the
root logger whose formatter writes ``{"event": <message>, "level", "logger", "timestamp"}``
(and ``exception`` with the traceback as text when there is one). uvicorn configures its own
loggers when it starts (its ``LOGGING_CONFIG``); its formatters are pointed at the same JSON
formatter here, so its start-up and shutdown lines come out alike. ``text`` keeps uvicorn's and
a plain ``time level logger: message`` for a terminal.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import orjson

LogFormat = Literal["json", "text"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "event": record.getMessage(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "timestamp": record.created,
        }
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(event).decode()


def configure(log_format: LogFormat, level: str) -> None:
    """Route every logger of the process to stderr in ``log_format`` at ``level`` and up."""
    import uvicorn.config

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    if log_format == "json":
        formatters = uvicorn.config.LOGGING_CONFIG["formatters"]
        for name in formatters:
            formatters[name] = {"()": f"{__name__}.JsonFormatter"}
