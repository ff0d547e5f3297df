"""W3C trace context in message headers, when OpenTelemetry is installed (extra `otel`).

`enqueue` records the current span's context in the `traceparent` (and `tracestate`) header,
unless the producer set one; the Subscriber runs each handler in a span `outbox.handle` whose
parent is the context its delivery carries. Without `opentelemetry-api` both do nothing; with
the API but no SDK configured, spans are no-ops and nothing is recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

TRACEPARENT = "traceparent"

try:
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace

    _tracer: Any = _trace.get_tracer("outboxd-client")
    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    AVAILABLE = False


def inject(headers: dict[str, str]) -> None:
    """Adds the current trace context to `headers`, unless they carry a `traceparent`."""
    if not AVAILABLE or TRACEPARENT in headers:
        return
    if not _trace.get_current_span().get_span_context().is_valid:
        return
    _propagate.inject(headers)


@contextlib.contextmanager
def handling(consumer: str, delivery_attrs: Mapping[str, str | int], headers: Mapping[str, str]) -> Iterator[None]:
    """The span a handler runs in, continuing the producer's trace."""
    if not AVAILABLE:
        yield
        return
    parent = _propagate.extract(dict(headers)) if TRACEPARENT in headers else None
    attributes = {"messaging.system": "outboxd", "messaging.consumer.group.name": consumer, **delivery_attrs}
    with _tracer.start_as_current_span(
        "outbox.handle", context=parent, kind=_trace.SpanKind.CONSUMER, attributes=attributes,
    ):
        yield
