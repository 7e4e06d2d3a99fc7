"""TLS for tests: a CA and certificates made on the spot, and HAProxy checking clients' ones.

Certificates come from the ``cryptography`` package (EC P-256 keys, made in
milliseconds). HAProxy is the machine's (``apt-get install haproxy``), run in
the foreground with the configuration docs/security.md documents, its paths,
ports and backend swapped for the test's.
"""

import datetime
import ipaddress
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.processes.base import ROOT, free_port, tails, wait_for_port

HAPROXY_MISSING = (
    "haproxy is not installed (looked on PATH and in /usr/sbin): the client-certificate "
    "tests run the real proxy. Install it: apt-get install haproxy"
)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass
class CA:
    """A certificate authority in ``directory``: ``pem`` is its certificate."""

    directory: Path
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, directory: Path, name: str = "test nodes CA") -> "CA":
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        ca = cls(directory, name, key, cert)
        ca.pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return ca

    @property
    def pem(self) -> Path:
        return self.directory / "ca.pem"

    def issue(self, cn: str, *, server: bool = False) -> tuple[Path, Path]:
        """A certificate for ``cn`` signed by this CA: (certificate file, key file).

        A server certificate is for 127.0.0.1 and localhost; a client one is for
        TLS client authentication, as a site's PKI would issue a node's.
        """
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        stem = re.sub(r"[^A-Za-z0-9.-]", "_", cn)
        cert_file, key_file = self.directory / f"{stem}.pem", self.directory / f"{stem}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(_pem_key(key))
        key_file.chmod(0o600)
        return cert_file, key_file


def haproxy_binary() -> str | None:
    found = shutil.which("haproxy")
    if found:
        return found
    fallback = Path("/usr/sbin/haproxy")
    return str(fallback) if fallback.exists() else None


def documented_config(doc: str = "security.md") -> str:
    """The HAProxy configuration a page of docs/ gives (its ```haproxy block), as written."""
    text = (ROOT / "docs" / doc).read_text()
    found = re.search(r"```haproxy\n(.*?)```", text, re.S)
    assert found, f"docs/{doc} has no ```haproxy block"
    return found.group(1)


def swap(text: str, old: str, new: str, doc: str = "security.md") -> str:
    """``old`` in a documented configuration replaced by the test's own address or path."""
    assert old in text, f"docs/{doc}'s HAProxy configuration no longer has {old!r}"
    return text.replace(old, new)


@dataclass
class HAProxy:
    proc: subprocess.Popen
    port: int
    log: Path
    config: Path

    @property
    def ws_url(self) -> str:
        return f"wss://127.0.0.1:{self.port}/ws/agent/"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_haproxy(
    binary: str,
    directory: Path,
    *,
    server_pem: Path,
    client_ca: Path,
    backend_port: int,
    source: str,
) -> HAProxy:
    """HAProxy with the documented configuration, in front of the web process on ``backend_port``.

    Its connections to it leave from ``source`` (a loopback address of its
    own), so the web process can tell them from a client connecting to it directly.
    """
    port = free_port()
    config = documented_config()
    config = swap(config, "bind :8443", f"bind 127.0.0.1:{port}")
    config = swap(config, "/etc/haproxy/llmgw/proxy.pem", str(server_pem))
    config = swap(config, "/etc/haproxy/llmgw/nodes-ca.pem", str(client_ca))
    config = swap(
        config,
        "server web1 10.0.0.10:8000",
        f"server web1 127.0.0.1:{backend_port} source {source}",
    )
    return run_haproxy(binary, directory, config, port)


def run_haproxy(binary: str, directory: Path, config: str, port: int, name="haproxy") -> HAProxy:
    """HAProxy in the foreground on ``config`` (checked first), waited for on ``port``."""
    path = directory / f"{name}.cfg"
    path.write_text(config)
    check = subprocess.run(
        [binary, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert check.returncode == 0, (
        f"haproxy refused the configuration:\n{check.stdout}{check.stderr}"
    )
    log = directory / f"{name}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [binary, "-db", "-f", str(path)], stdout=fh, stderr=subprocess.STDOUT
        )
    proxy = HAProxy(proc, port, log, path)
    try:
        wait_for_port(port, proc)
    except Exception:
        proxy.stop()
        raise RuntimeError(f"haproxy did not start{tails([log])}") from None
    return proxy
