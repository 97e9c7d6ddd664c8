"""Certificates and keys for a throw-away control plane on 127.0.0.1 (EC P-256, one CA).

Every component gets a client certificate whose subject is what RBAC's default bindings
expect (``system:kube-controller-manager``, ``system:kube-scheduler``; ``system:masters`` for
the admin), and the API server a serving certificate for 127.0.0.1 and its in-cluster names.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_PEM = serialization.Encoding.PEM
_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as files."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)
    return path


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


class Authority:
    """A CA in ``root`` that signs the control plane's certificates."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(_name("airflow-spot-test-ca"))
            .issuer_name(_name("airflow-spot-test-ca"))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = root / "ca.crt"
        self.cert.write_bytes(self._cert.public_bytes(_PEM))
        _write_key(self._key, root / "ca.key")

    def issue(
        self,
        stem: str,
        cn: str,
        org: str | None = None,
        *,
        server: bool = False,
        ips: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
    ) -> Pair:
        """A client (or, with ``server``, a serving) certificate named ``stem``."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        b = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, org))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + 30 * _DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if ips or dns:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = b.sign(self._key, hashes.SHA256())
        path = self.root / f"{stem}.crt"
        path.write_bytes(cert.public_bytes(_PEM))
        return Pair(path, _write_key(key, self.root / f"{stem}.key"))


def service_account_keys(root: Path) -> tuple[Path, Path]:
    """The key pair that signs service-account tokens: (private, public)."""
    key = _key()
    pub = root / "sa.pub"
    pub.write_bytes(
        key.public_key().public_bytes(_PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return _write_key(key, root / "sa.key"), pub
