"""The errors this package raises of its own (gRPC failures stay `grpc.aio.AioRpcError`)."""

from __future__ import annotations


class OutboxdError(Exception):
    """Base class of this package's own errors."""


class InvalidMessage(OutboxdError, ValueError):
    """A message that outboxd would refuse, caught before anything was written: the caller's
    transaction is untouched. The text names the field and the limit it broke."""


class ConfigError(OutboxdError, ValueError):
    """A server address, TLS option or token that cannot be used; the text says which."""
