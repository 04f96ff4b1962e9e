"""One JSON object per log line, with any ``extra=`` fields the caller passed, and the
``trace_id`` and ``span_id`` of the span it was written in (when tracing is on), so a log
line leads to its trace and back."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from opentelemetry import trace

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                payload[key] = value
        # The formatter runs where the record was written (a StreamHandler), so the current
        # span is the one the line was written in.
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            payload["trace_id"] = f"{context.trace_id:032x}"
            payload["span_id"] = f"{context.span_id:016x}"
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)
