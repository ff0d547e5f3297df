"""Server addresses, TLS and the bearer token: how every client here connects.

`https://host:port` is TLS; `http://host:port` and `host:port` are plaintext, unless `tls=` is
given with a bare `host:port` (then TLS). The token goes out as `authorization: Bearer <token>`
metadata on every call, over TLS or not (like the Rust client and outboxctl).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import grpc
import grpc.aio

from outboxd._errors import ConfigError

__version__ = "0.1.0"

StrPath = Union[str, "os.PathLike[str]"]

# Deliveries carry payloads up to the server's limit (at most 64 MiB): room for that and more.
MAX_MESSAGE_BYTES = 80 * 1024 * 1024

CHANNEL_OPTIONS: list[tuple[str, int | str]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.primary_user_agent", f"outboxd-client-python/{__version__}"),
    # Find a dead connection (a server gone without a FIN) within 40 s, idle streams included.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # gRPC's own reconnect backoff grows to 2 minutes by default; keep a long-lived channel
    # (the admin client's) within 10 s of a server that came back.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 10_000),
]


@dataclass(frozen=True)
class TLSConfig:
    """TLS options, all optional: `ca` is a PEM file of the CAs that the server's certificate
    must chain to (default: the system's roots); `cert` and `key` are a client certificate and
    its key for an outboxd that requires one (`--tls-client-ca`); `server_name` overrides the
    name the certificate is checked against (default: the address's host)."""

    ca: StrPath | None = None
    cert: StrPath | None = None
    key: StrPath | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigError("tls: a client certificate needs both cert and key")


# What `tls=` accepts: True (the system's roots), a TLSConfig, or a dict of its fields.
TLSOption = Union[bool, TLSConfig, Mapping[str, "StrPath | None"], None]

_TLS_KEYS = ("ca", "cert", "key", "server_name")


def _tls_config(tls: TLSOption) -> TLSConfig | None:
    if tls is None or tls is False:
        return None
    if tls is True:
        return TLSConfig()
    if isinstance(tls, TLSConfig):
        return tls
    if isinstance(tls, Mapping):
        unknown = sorted(set(tls) - set(_TLS_KEYS))
        if unknown:
            raise ConfigError(f"tls: unknown option {', '.join(map(repr, unknown))}; expected {', '.join(_TLS_KEYS)}")
        name = tls.get("server_name")
        return TLSConfig(ca=tls.get("ca"), cert=tls.get("cert"), key=tls.get("key"),
                         server_name=None if name is None else str(name))
    raise ConfigError(f"tls: expected True, a TLSConfig or a dict with {', '.join(_TLS_KEYS)}, got {type(tls).__name__}")


@dataclass(frozen=True)
class Target:
    """A parsed server address."""

    address: str
    """`host:port`, as gRPC takes it."""
    tls: TLSConfig | None
    """None: plaintext."""


def parse_target(server: str, tls: TLSOption = None) -> Target:
    """`https://host:port` (TLS), `http://host:port` (plaintext) or `host:port` (plaintext,
    or TLS when `tls` is given)."""
    if not isinstance(server, str) or not server.strip():
        raise ConfigError(f"server: expected 'host:port', 'http://host:port' or 'https://host:port', got {server!r}")
    config = _tls_config(tls)
    rest = server.strip()
    scheme, sep, tail = rest.partition("://")
    if sep:
        rest = tail.rstrip("/")
        if scheme == "https":
            if tls is False:
                raise ConfigError(f"server {server!r} is https:// but tls=False")
            config = config or TLSConfig()
        elif scheme == "http":
            if config is not None:
                raise ConfigError(f"TLS options were given but server {server!r} is a plaintext http:// address; use https://")
        else:
            raise ConfigError(f"server {server!r}: the scheme must be http:// or https://, not {scheme}://")
    host, colon, port = rest.rpartition(":")
    if not colon or not host or "/" in rest or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"server {server!r}: expected host:port with a port from 1 to 65535")
    bracketed = host.startswith("[") and host.endswith("]")
    if host.startswith("[") != host.endswith("]") or (":" in host and not bracketed):
        raise ConfigError(f"server {server!r}: an IPv6 host is written [addr]:port")
    return Target(address=f"{host}:{port}", tls=config)


def _read(what: str, path: StrPath) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"tls: cannot read {what} {os.fspath(path)}: {e.strerror or e}") from e


def open_channel(target: Target) -> grpc.aio.Channel:
    """A new channel to `target`; TLS files are read now (so a renewed file is used at the next
    connect). Must be called with an event loop running."""
    if target.tls is None:
        return grpc.aio.insecure_channel(target.address, options=CHANNEL_OPTIONS)
    t = target.tls
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read("the CA file", t.ca) if t.ca is not None else None,
        private_key=_read("the key", t.key) if t.key is not None else None,
        certificate_chain=_read("the certificate", t.cert) if t.cert is not None else None,
    )
    options = list(CHANNEL_OPTIONS)
    if t.server_name:
        options.append(("grpc.ssl_target_name_override", t.server_name))
    return grpc.aio.secure_channel(target.address, creds, options=options)


@dataclass(frozen=True)
class Token:
    """A bearer token given as a string, or a file read at every (re)connect, so that a
    rotated token is picked up."""

    token: str | None = None
    token_file: StrPath | None = None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata: `authorization: Bearer <token>`, or nothing without a token."""
        if self.token is not None:
            value = self.token.strip()
            source = "token"
        elif self.token_file is not None:
            try:
                value = Path(self.token_file).read_text().strip()
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError(f"cannot read the token file {os.fspath(self.token_file)}: {e}") from e
            source = f"the token in {os.fspath(self.token_file)}"
        else:
            return ()
        if not value:
            raise ConfigError(f"{source} is empty")
        if not all(" " <= c <= "~" for c in value):
            # Never repeat the token itself in an error.
            raise ConfigError(f"{source} has characters a header cannot carry (printable ASCII only)")
        return (("authorization", f"Bearer {value}"),)
