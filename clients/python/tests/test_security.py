"""TLS, mTLS and bearer tokens against outboxd started with --tls-cert/--tls-key, --tls-client-ca
and --auth-file; and the checks on addresses, TLS options and tokens."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import ipaddress
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import outboxd
from outboxd._connection import parse_target
from outboxd._subscriber import error_text
from support import Outboxd, acked, commit_enqueue, eventually, running, topic_for, unique


class Pki:
    """A CA, and certificates it signs, as PEM files in `dir`."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "outboxd test CA")])
        self.name = name
        self.cert = (
            self._builder(name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca = dir / "ca.pem"
        self.ca.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _builder(self, subject: x509.Name, public_key: Any) -> x509.CertificateBuilder:
        now = dt.datetime.now(dt.timezone.utc)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(getattr(self, "name", subject))
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1)))

    def issue(self, stem: str, cn: str, *, server: bool) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = self._builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]), key.public_key())
        if server:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        cert = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False).sign(self.key, hashes.SHA256())
        cert_path, key_path = self.dir / f"{stem}.pem", self.dir / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path


def token_line(token: str) -> str:
    return f'"sha256:{hashlib.sha256(token.encode()).hexdigest()}"'


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_server(pki: Pki, database_url: str) -> Any:
    cert, key = pki.issue("server", "outboxd", server=True)
    auth = pki.dir / "auth.toml"
    auth.write_text(
        f'[[principal]]\nname = "operator"\ntokens = [{token_line("admin-token")}]\npermissions = ["*"]\n\n'
        f'[[principal]]\nname = "worker"\ntokens = [{token_line("worker-token")}]\n'
        'permissions = ["consume:sec-*", "admin:read"]\n'
    )
    s = Outboxd(database_url, ["--tls-cert", str(cert), "--tls-key", str(key), "--auth-file", str(auth)]).start()
    yield s
    s.stop()


async def test_tls_and_a_token_on_every_call(pki: Pki, tls_server: Outboxd, database_url: str) -> None:
    url = f"https://localhost:{tls_server.port}"
    consumer = unique("sec")
    topic = topic_for(consumer)
    async with outboxd.AdminClient(url, token="admin-token", tls={"ca": pki.ca}) as admin:
        await admin.create_consumer(consumer, [topic])
        # The worker token may consume and read, over TLS.
        seen: list[str] = []

        async def handler(d: outboxd.Delivery) -> None:
            seen.append(d.message_id)

        token_file = pki.dir / "worker.token"
        token_file.write_text("worker-token\n")
        sub = outboxd.Subscriber(url, consumer, handler, token_file=token_file, tls=outboxd.TLSConfig(ca=pki.ca))
        async with running(sub):
            ids = commit_enqueue(database_url, topic, 3)
            await eventually("three handled and acked", lambda: acked(admin, consumer, 3))
        assert sorted(seen) == sorted(ids)

        # The worker may read but not write.
        async with outboxd.AdminClient(f"localhost:{tls_server.port}", token="worker-token",
                                       tls={"ca": str(pki.ca)}) as worker:
            assert (await worker.get_consumer(consumer)).name == consumer
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await worker.delete_consumer(consumer)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "admin:write" in (e.value.details() or "")

        async def never(d: outboxd.Delivery) -> None:
            raise AssertionError("not permitted")

        # Errors that retrying cannot fix end run(): no permission, no or a wrong token.
        other = unique("other")
        await admin.create_consumer(other, [topic_for(other)])
        cases = [("worker-token", other, grpc.StatusCode.PERMISSION_DENIED),
                 (None, consumer, grpc.StatusCode.UNAUTHENTICATED),
                 ("wrong-token", consumer, grpc.StatusCode.UNAUTHENTICATED)]
        for token, name, code in cases:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await asyncio.wait_for(outboxd.Subscriber(url, name, never, token=token, tls={"ca": pki.ca}).run(), 10)
            assert e.value.code() == code, (token, name, e.value)

    # Without the CA, the server's certificate is not trusted (the system's roots do not know it).
    async with outboxd.AdminClient(url, token="admin-token", tls=True, timeout=5) as untrusted:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await untrusted.list_consumers()
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_mtls_identity_authenticates_without_a_token(pki: Pki, database_url: str) -> None:
    cert, key = pki.issue("mtls-server", "outboxd", server=True)
    client_cert, client_key = pki.issue("client", "py-client", server=False)
    auth = pki.dir / "mtls-auth.toml"
    auth.write_text('[[principal]]\nname = "py"\nsubjects = ["CN=py-client"]\npermissions = ["admin:read"]\n')
    s = Outboxd(database_url, ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(pki.ca),
                               "--auth-file", str(auth)]).start()
    try:
        url = f"https://127.0.0.1:{s.port}"
        tls = outboxd.TLSConfig(ca=pki.ca, cert=client_cert, key=client_key)
        async with outboxd.AdminClient(url, tls=tls) as admin:
            assert isinstance(await admin.list_consumers(), list)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await admin.prune()
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # No client certificate: the handshake fails.
        async with outboxd.AdminClient(url, tls={"ca": pki.ca}, timeout=5) as anonymous:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await anonymous.list_consumers()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        s.stop()


def test_addresses_tls_options_and_tokens_are_checked(tmp_path: Path) -> None:
    assert parse_target("127.0.0.1:50051") == parse_target("http://127.0.0.1:50051/")
    assert parse_target("127.0.0.1:50051").tls is None
    t = parse_target("https://outboxd.example:443")
    assert t.address == "outboxd.example:443" and t.tls == outboxd.TLSConfig()
    assert parse_target("[::1]:50051", tls=True).tls == outboxd.TLSConfig()
    assert parse_target("h:1", tls={"ca": "ca.pem"}).tls == outboxd.TLSConfig(ca="ca.pem")
    bad: list[tuple[str, Any, str]] = [
        ("", None, "expected 'host:port'"),
        ("localhost", None, "port from 1 to 65535"),
        ("localhost:0", None, "port from 1 to 65535"),
        ("localhost:http", None, "port from 1 to 65535"),
        ("::1:50051", None, r"IPv6 host is written \[addr\]:port"),
        ("grpc://h:1", None, "http:// or https://"),
        ("http://h:1", {"ca": "ca.pem"}, "plaintext http:// address"),
        ("https://h:1", False, "tls=False"),
        ("h:1", {"cafile": "x"}, "unknown option 'cafile'"),
        ("h:1", {"cert": "c.pem"}, "needs both cert and key"),
        ("h:1", "yes", "expected True, a TLSConfig"),
    ]
    for server, tls, error in bad:
        with pytest.raises(outboxd.ConfigError, match=error):
            parse_target(server, tls)

    async def h(d: outboxd.Delivery) -> None:
        pass

    with pytest.raises(outboxd.ConfigError, match="header cannot carry"):
        outboxd.Subscriber("h:1", "c", h, token="abc\ndef")
    with pytest.raises(outboxd.ConfigError, match="is empty"):
        outboxd.AdminClient("h:1", token="  ")
    with pytest.raises(outboxd.ConfigError, match="cannot read the token file"):
        outboxd.AdminClient("h:1", token_file=tmp_path / "missing")
    with pytest.raises(ValueError, match="concurrency must be from 1 to 10000"):
        outboxd.Subscriber("h:1", "c", h, concurrency=0)
    with pytest.raises(ValueError, match="max_in_flight must be from 1 to 10000"):
        outboxd.Subscriber("h:1", "c", h, max_in_flight=10_001)
    with pytest.raises(ValueError, match="ack_deadline must be from 0.1 s to 24 h"):
        outboxd.Subscriber("h:1", "c", h, ack_deadline=0.01)
    assert error_text(ValueError()) == "ValueError"
    cut = error_text(ValueError("é" * 3000))
    assert len(cut.encode()) == 4096 and cut == "é" * 2048
    u = outboxd.uuid7()
    assert u.version == 7 and u.variant == uuid.RFC_4122
    assert abs((u.int >> 80) - time.time() * 1000) < 5_000, "the first 48 bits are the time in ms"


async def test_unreadable_tls_files_end_run_with_the_file_named(tmp_path: Path) -> None:
    async def h(d: outboxd.Delivery) -> None:
        pass

    sub = outboxd.Subscriber("https://localhost:1", "c", h, tls={"ca": tmp_path / "nope.pem"})
    with pytest.raises(outboxd.ConfigError, match="cannot read the CA file .*nope.pem"):
        await asyncio.wait_for(sub.run(), 5)
