"""Who is calling: bearer tokens or mutual-TLS client certificates, each with a role.

Off by default. ``--auth FILE`` turns it on; the file has one ``CREDENTIAL ROLE`` pair per line
(``#`` starts a comment). A credential is a bearer token, sent by clients as
``authorization: Bearer TOKEN`` metadata, or ``cert:NAME``, the subject common name of a client
certificate the TLS layer verified (``--tls-client-ca``). Roles: ``client`` (inference, its own
requests) and ``admin`` (also pause/resume, cache flush, abort of all or any request).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from grpclib import GRPCError, Status

Role = Literal["client", "admin"]
ROLES: tuple[Role, ...] = ("client", "admin")
CERT_PREFIX = "cert:"


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. ``name`` is stable per credential and never holds a secret."""

    name: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


#: Every caller when authentication is off: no identity to own requests by, every RPC allowed.
ANONYMOUS = Principal("anonymous", "admin")


class CredentialsError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Credentials:
    tokens: Mapping[bytes, Principal]  # sha256(token) -> principal
    certificates: Mapping[str, Principal]  # subject common name -> principal

    @classmethod
    def load(cls, path: str) -> Credentials:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise CredentialsError(f"cannot read the auth file {path}: {exc.strerror}") from None
        tokens: dict[bytes, Principal] = {}
        certificates: dict[str, Principal] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or parts[1] not in ROLES:
                raise CredentialsError(
                    f"{path}:{number}: expected 'CREDENTIAL ROLE' with ROLE client or admin"
                )
            credential, role = parts[0], _role(parts[1])
            if credential.startswith(CERT_PREFIX):
                common_name = credential.removeprefix(CERT_PREFIX)
                certificates[common_name] = Principal(f"cert:{common_name}", role)
            else:
                digest = _digest(credential)
                tokens[digest] = Principal(f"token:{digest.hex()[:16]}", role)
        if not tokens and not certificates:
            raise CredentialsError(f"{path}: no credentials")
        return cls(tokens, certificates)

    def authenticate(self, metadata: Mapping[str, Any] | None, peer_certificate: Any) -> Principal:
        """The caller's principal; UNAUTHENTICATED if it presents no known credential."""
        header = (metadata or {}).get("authorization")
        if header is not None:
            scheme, _, token = str(header).partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise GRPCError(Status.UNAUTHENTICATED, "authorization metadata must be 'Bearer TOKEN'")
            principal = self.tokens.get(_digest(token.strip()))
            if principal is None:
                raise GRPCError(Status.UNAUTHENTICATED, "unknown bearer token")
            return principal
        common_name = _common_name(peer_certificate)
        if common_name is not None and common_name in self.certificates:
            return self.certificates[common_name]
        raise GRPCError(
            Status.UNAUTHENTICATED, "this server requires credentials: authorization: Bearer TOKEN metadata"
        )


def _role(text: str) -> Role:
    return "admin" if text == "admin" else "client"


def _digest(token: str) -> bytes:
    # Tokens are looked up by digest, so the comparison takes the same time whatever the guess.
    return hashlib.sha256(token.encode()).digest()


def _common_name(certificate: Any) -> str | None:
    """The subject CN of a certificate as ``ssl.SSLSocket.getpeercert()`` returns it."""
    if not isinstance(certificate, dict):
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
