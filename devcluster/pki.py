"""Certificates and kubeconfigs for a local control plane, generated once per state directory.

One CA signs the API server's serving certificate (for 127.0.0.1 and the in-cluster names) and
one client certificate per identity; the service-account signing key is separate.  Keys are EC
P-256 (fast to make), written with mode 0600.  Nothing here leaves the state directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class Identity:
    """A client identity: certificate CN is the user, O entries are its groups."""

    name: str
    user: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("admin", "nodelock-admin", ("system:masters",))
SCHEDULER = Identity("kube-scheduler", "system:kube-scheduler")
CONTROLLER_MANAGER = Identity("kube-controller-manager", "system:kube-controller-manager")
APISERVER_KUBELET_CLIENT = Identity("apiserver-kubelet-client", "kube-apiserver-kubelet-client")


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class PKI:
    """The certificates of one devcluster state directory (``<state>/pki``)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"

    def client_cert(self, ident: Identity) -> Path:
        return self.dir / f"{ident.name}.crt"

    def client_key(self, ident: Identity) -> Path:
        return self.dir / f"{ident.name}.key"

    def ensure(self) -> None:
        """Create the CA, serving cert, SA key and the standard client certs if missing."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not (self.ca_cert.exists() and self.ca_key.exists()):
            key = ec.generate_private_key(ec.SECP256R1())
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodelock-devcluster-ca")])
            now = dt.datetime.now(dt.UTC)
            cert = (
                x509.CertificateBuilder()
                .subject_name(name)
                .issuer_name(name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + VALIDITY * 5)
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
                .sign(key, hashes.SHA256())
            )
            _write_key(self.ca_key, key)
            _write_cert(self.ca_cert, cert)
        if not self.serving_cert.exists():
            self.issue(
                self.serving_cert,
                self.serving_key,
                common_name="kube-apiserver",
                dns=[
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
                ips=["127.0.0.1", "10.0.0.1"],
                server=True,
            )
        if not self.sa_key.exists():
            sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            _write_key(self.sa_key, sa)
            self.sa_pub.write_bytes(
                sa.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )
        for ident in (ADMIN, SCHEDULER, CONTROLLER_MANAGER, APISERVER_KUBELET_CLIENT):
            self.ensure_client(ident)

    def ensure_client(self, ident: Identity) -> None:
        """Issue a client certificate for ``ident`` if it does not exist yet."""
        if self.client_cert(ident).exists():
            return
        self.issue(
            self.client_cert(ident),
            self.client_key(ident),
            common_name=ident.user,
            organizations=ident.groups,
        )

    def issue(
        self,
        cert_path: Path,
        key_path: Path,
        *,
        common_name: str,
        organizations: tuple[str, ...] = (),
        dns: list[str] | None = None,
        ips: list[str] | None = None,
        server: bool = False,
    ) -> None:
        """Issue a certificate signed by the CA (client auth, or server auth with SANs)."""
        ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                    if server
                    else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if dns or ips:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns or []]
            sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips or []]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        _write_key(key_path, key)
        _write_cert(cert_path, cert)

    def kubeconfig(self, path: Path, ident: Identity, server: str) -> Path:
        """Write a kubeconfig for ``ident`` against ``server`` (certificate auth)."""
        self.ensure_client(ident)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "devcluster",
                    "cluster": {"server": server, "certificate-authority": str(self.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": ident.user,
                    "user": {
                        "client-certificate": str(self.client_cert(ident)),
                        "client-key": str(self.client_key(ident)),
                    },
                }
            ],
            "contexts": [
                {"name": "devcluster", "context": {"cluster": "devcluster", "user": ident.user}}
            ],
            "current-context": "devcluster",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        os.chmod(path, 0o600)
        return path
