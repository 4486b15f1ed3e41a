"""Channels to a collectived sidecar: plaintext over its Unix socket, TLS over TCP.

A sidecar that serves its TCP listener with mutual TLS accepts only clients that present a
certificate signed by its CA. ``TlsOptions`` says which files to use; by default they come from
the same environment variables the daemon reads (``$COLLECTIVED_TLS_CA``,
``$COLLECTIVED_TLS_CERT``, ``$COLLECTIVED_TLS_KEY``, ``$COLLECTIVED_TLS_PEER_NAME``), so a
trainer (the torch backend included) reaches a TLS sidecar over TCP by environment alone.
"""

from dataclasses import dataclass

import grpc

from collectived import environment
from collectived.address import to_grpc_target
from collectived.errors import InvalidArgumentError

TLS_CA_ENV = "COLLECTIVED_TLS_CA"
TLS_CERT_ENV = "COLLECTIVED_TLS_CERT"
TLS_KEY_ENV = "COLLECTIVED_TLS_KEY"
TLS_PEER_NAME_ENV = "COLLECTIVED_TLS_PEER_NAME"

MAX_MESSAGE_BYTES = 64 << 20


@dataclass(frozen=True)
class TlsOptions:
    """PEM files of a TLS client. All empty: plaintext.

    ``ca``: the CA that signed the sidecar's certificate (empty: the system's roots).
    ``cert``, ``key``: the client certificate and its key (together; needed by mutual TLS).
    ``server_name``: the name expected in the sidecar's certificate (empty: the address's host).
    """

    ca: str = ""
    cert: str = ""
    key: str = ""
    server_name: str = ""

    @property
    def enabled(self):
        return bool(self.ca or self.cert or self.key)

    @classmethod
    def from_environment(cls):
        return cls(ca=environment.get(TLS_CA_ENV, ""), cert=environment.get(TLS_CERT_ENV, ""),
                   key=environment.get(TLS_KEY_ENV, ""),
                   server_name=environment.get(TLS_PEER_NAME_ENV, ""))

    def credentials(self):
        """grpc.ChannelCredentials for these files; raises InvalidArgumentError naming a file
        that cannot be read or a certificate given without its key."""
        if bool(self.cert) != bool(self.key):
            raise InvalidArgumentError("a TLS client certificate and its key come together: "
                                       + ("key" if self.cert else "certificate") + " missing")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "TLS CA file"),
            private_key=_read(self.key, "TLS client key file"),
            certificate_chain=_read(self.cert, "TLS client certificate file"))


def _read(path, what):
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise InvalidArgumentError(f"{what} {path}: cannot read it: {error.strerror}") from None
    if b"-----BEGIN " not in data:
        raise InvalidArgumentError(f"{what} {path}: not PEM (no -----BEGIN line)")
    return data


def is_unix_address(address):
    return address.startswith("unix:")


def open_channel(address, tls=None, options=()):
    """A gRPC channel to the sidecar at ``address`` (``unix:///path`` or ``host:port``).

    ``tls``: a TlsOptions for a TCP address; None = ``TlsOptions.from_environment()``. A Unix
    socket is always plaintext. ``options``: extra gRPC channel options.
    """
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *options]
    target = to_grpc_target(address)
    if is_unix_address(address):
        return grpc.insecure_channel(target, options=options)
    tls = TlsOptions.from_environment() if tls is None else tls
    if not tls.enabled:
        return grpc.insecure_channel(target, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(target, tls.credentials(), options=options)
