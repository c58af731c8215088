"""Logging to stderr as text or JSON lines; secrets are masked wherever they appear."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable

from gateway import adapters


class _Redact(logging.Filter):
    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s and len(s) >= 6]

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            msg = record.getMessage()
            for secret in self.secrets:
                msg = msg.replace(secret, "***")
            record.msg, record.args = msg, None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup_logging(level: str = "info", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(_Redact(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    noisy = ["aiohttp.access", "httpx", "apscheduler"]
    for name in adapters.names():
        noisy += adapters.adapter_class(name).library_loggers
    for library in noisy:
        logging.getLogger(library).setLevel(max(logging.WARNING, root.level))
