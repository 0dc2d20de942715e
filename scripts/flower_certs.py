"""TLS certificates and SuperNode keys for a Flower deployment (docs/FEDERATED.md).

    python scripts/flower_certs.py --out certs --host server.example.org --host 10.0.0.5 \
        --nodes 3

Writes into ``--out``: ``ca.crt``/``ca.key`` (a certificate authority of this federation),
``server.pem``/``server.key`` (the SuperLink's certificate for every ``--host``, a DNS name or
an IP address, signed by the CA) and, with ``--nodes n``, one key pair per SuperNode,
``node<i>`` (OpenSSH private key) and ``node<i>.pub`` (its public key), for Flower's node
authentication (``flower-superlink --enable-supernode-auth``, ``flwr supernode register
node<i>.pub``, ``flower-supernode --auth-supernode-private-key node<i>``). Uses the
``cryptography`` library (installed with the ``flower`` extra). Keys are written readable by
their owner only; an existing file is not overwritten.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write(path: Path, data: bytes, secret: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make(out: Path, hosts: list[str], nodes: int = 0, days: int = 365) -> list[Path]:
    """The CA, the SuperLink's certificate for ``hosts`` and ``nodes`` SuperNode key pairs in
    folder ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    names = ["ca.crt", "ca.key", "server.pem", "server.key"]
    names += [f"node{i}{ext}" for i in range(nodes) for ext in ("", ".pub")]
    taken = [n for n in names if (out / n).exists()]
    if taken:
        raise SystemExit(f"flower_certs: {out} holds {', '.join(taken)} already; "
                         "allowed: a folder without them (nothing was written)")
    now = dt.datetime.now(dt.timezone.utc)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(_name("fnsysid federation CA"))
          .issuer_name(_name("fnsysid federation CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start)
          .not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    _write(out / "ca.crt", ca.public_bytes(pem))
    _write(out / "ca.key", _pem_key(ca_key), secret=True)
    _write(out / "server.pem", cert.public_bytes(pem))
    _write(out / "server.key", _pem_key(key), secret=True)
    for i in range(nodes):
        node = ec.generate_private_key(ec.SECP384R1())
        _write(out / f"node{i}", node.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption()), secret=True)
        _write(out / f"node{i}.pub", node.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n")
    return [out / n for n in names]


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="certs", help="folder for the files (default: certs)")
    ap.add_argument("--host", action="append", required=True,
                    help="the SuperLink's DNS name or IP address as SuperNodes and flwr reach "
                         "it (repeat for several)")
    ap.add_argument("--nodes", type=int, default=0,
                    help="SuperNode key pairs for node authentication (default 0)")
    ap.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    args = ap.parse_args(argv)
    if args.nodes < 0 or args.days < 1:
        ap.error("--nodes must be >= 0 and --days >= 1")
    files = make(Path(args.out), args.host, args.nodes, args.days)
    print(f"wrote {', '.join(f.name for f in files)} to {Path(args.out).resolve()}")
    return files


if __name__ == "__main__":
    main()
