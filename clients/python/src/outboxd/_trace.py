"""W3C trace context in message headers, when OpenTelemetry is installed (extra `otel`).

`enqueue` records the current span's context in the `traceparent` (and `tracestate`) header,
unless the producer set one; the Subscriber runs each handler in a span `outbox.handle` whose
parent is the context its delivery carries. Without `opentelemetry-api` both do nothing; with
the API but no SDK configured, spans are no-ops and nothing is recorded.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any

TRACEPARENT = "traceparent"

try:
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace

    _tracer: Any = _trace.get_tracer("outboxd-client")
    # What get_tracer_provider() returns before an application sets one.
    _NOT_RECORDING: tuple[type, ...] = (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)
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


_NOTHING: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
_provider_seen = False
_checked_at = -1.0


def _recording() -> bool:
    """Whether the application has set a tracer provider. It can be set only once, so a yes is
    final; a no is asked again after a second (get_tracer_provider reads the environment)."""
    global _provider_seen, _checked_at
    if _provider_seen:
        return True
    now = time.monotonic()
    if now - _checked_at >= 1.0:
        _checked_at = now
        _provider_seen = not isinstance(_trace.get_tracer_provider(), _NOT_RECORDING)
    return _provider_seen


def handling(
    consumer: str, delivery_attrs: Mapping[str, str | int], headers: Mapping[str, str],
) -> contextlib.AbstractContextManager[Any]:
    """The span a handler runs in, continuing the producer's trace. Nothing (not even a no-op
    span) until the application has installed a tracer provider: spans cost tens of
    microseconds a delivery even when nothing records them."""
    if not AVAILABLE or not _recording():
        return _NOTHING
    parent = _propagate.extract(headers) if TRACEPARENT in headers else None
    attributes = {"messaging.system": "outboxd", "messaging.consumer.group.name": consumer, **delivery_attrs}
    span: contextlib.AbstractContextManager[Any] = _tracer.start_as_current_span(
        "outbox.handle", context=parent, kind=_trace.SpanKind.CONSUMER, attributes=attributes,
    )
    return span
