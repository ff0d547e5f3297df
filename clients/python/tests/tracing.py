"""A tracer provider for the whole test session (a process can set one only once), set when
conftest imports this, before any Subscriber looks for one: every handler then runs in a
recorded span. Imported once, as `tracing`."""

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

SPANS = InMemorySpanExporter()
PROVIDER = TracerProvider()
PROVIDER.add_span_processor(SimpleSpanProcessor(SPANS))
trace.set_tracer_provider(PROVIDER)
