"""A self-signed certificate for 127.0.0.1, made with the openssl command line, for tests of ``wss://``."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed_certificate(directory: Path) -> tuple[str, str]:
    """Write ``cert.pem`` and ``key.pem`` (valid one day, for IP 127.0.0.1) into ``directory``; return their
    paths. Raises ``OSError`` without openssl, ``subprocess.CalledProcessError`` if it fails."""
    cert, key = str(directory / "cert.pem"), str(directory / "key.pem")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            key,
            "-out",
            cert,
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
