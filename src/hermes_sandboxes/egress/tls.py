"""The per-store certificate authority the proxy uses to read (and broker) HTTPS requests.

The CA's private key lives in the store's home (``egress-ca/ca.key``, mode 0600), which every
sandbox sees masked; only its certificate enters a sandbox, as a trust bundle. The proxy makes a
short-lived leaf certificate per host on demand (one key per proxy process, kept in memory) and
keeps the TLS contexts of the hosts used last: a bounded cache, keyed by the host's normal form (lower
case, no trailing dot, an address in its canonical spelling), so a sandbox that names one host in
thousands of spellings, or thousands of hosts, costs the host a bounded amount of memory; new
certificates are issued at a bounded rate, so it costs a bounded share of the host's CPU too. The
certificate work is the ``cryptography`` package's; nothing here does cryptography by hand.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
import threading
import time
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hermes_sandboxes.allowlist import canonical_host

_CA_DAYS = 3650
_LEAF_DAYS = 7
CACHE_SIZE = 128  # TLS contexts kept (~20 KB each); past that the least recently used goes
# New leaf certificates (a signature each, milliseconds of host CPU outside the sandbox's limits): a
# burst, then this many per second; a sandbox cycling through host names waits for its turn.
ISSUE_BURST = 64
ISSUE_RATE = 16.0


class _Bucket:
    """A token bucket: ``take`` returns once a token is there (sleeping meanwhile)."""

    def __init__(self, burst: int, rate: float) -> None:
        self.burst, self.rate = burst, rate
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def take(self) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                wait = (1 - self.tokens) / self.rate
            time.sleep(wait)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "hermes-sandboxes"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def create_ca(directory: Path) -> None:
    """Write a new CA key and certificate into ``directory`` (made private first)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("hermes-sandboxes egress proxy CA")
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(hours=1))
        .not_valid_after(_now() + datetime.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_bytes = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    fd = os.open(directory / "ca.key.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key_bytes)
    (directory / "ca.pem.tmp").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(directory / "ca.pem.tmp", directory / "ca.pem")
    os.replace(directory / "ca.key.tmp", directory / "ca.key")  # last: its presence means "complete"


def ensure_ca(directory: Path) -> bytes:
    """The CA certificate (PEM) of the store, creating the CA on first use."""
    if not (directory / "ca.key").exists() or not (directory / "ca.pem").exists():
        create_ca(directory)
    return (directory / "ca.pem").read_bytes()


class Authority:
    """Issues leaf certificates from the CA in ``directory``; thread-safe, cached per normal host name
    (at most ``CACHE_SIZE``)."""

    def __init__(self, directory: Path, *, burst: int = ISSUE_BURST, rate: float = ISSUE_RATE) -> None:
        self._issue = _Bucket(burst, rate)
        self._ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        self._ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._contexts: OrderedDict[str, ssl.SSLContext] = OrderedDict()
        self._lock = threading.Lock()

    def context_for(self, host: str) -> ssl.SSLContext:
        name = canonical_host(host)
        with self._lock:
            context = self._contexts.get(name)
            if context is not None:
                self._contexts.move_to_end(name)
                return context
        self._issue.take()
        context = self._make_context(name)  # outside the lock: one slow signature blocks no other host
        with self._lock:
            self._contexts[name] = context
            self._contexts.move_to_end(name)
            while len(self._contexts) > CACHE_SIZE:
                self._contexts.popitem(last=False)
            return context

    def __len__(self) -> int:
        with self._lock:
            return len(self._contexts)

    def _leaf(self, host: str) -> x509.Certificate:
        try:
            alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            alt = x509.DNSName(host)
        ca_key = self._ca_key
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        return (
            x509.CertificateBuilder().subject_name(_name(host[:64])).issuer_name(self._ca_cert.subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(_now() - datetime.timedelta(hours=1))
            .not_valid_after(_now() + datetime.timedelta(days=_LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([alt]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256())
        )

    def _make_context(self, host: str) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        pem = self._leaf(host).public_bytes(serialization.Encoding.PEM)
        key = self._key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
        # ssl loads certificates from files only: a private temporary file, gone right after
        with tempfile.NamedTemporaryFile(prefix="leaf-", suffix=".pem") as f:
            f.write(key + pem)
            f.flush()
            context.load_cert_chain(f.name)
        return context
