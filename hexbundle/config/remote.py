"""The remote cache's settings (build.toml's remote_* keys, config.build RemoteSettings) read as
the server will be called: its target, the TLS files and the header.

`check_remote_settings` runs when the config loads, so a bad setting fails every command at
once, naming the key, rather than the first step that calls the server; remote/cas.py opens the
channel with the same functions.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from hexbundle.config.schema import PORT
from hexbundle.support.errors import ConfigError


def parse_target(url: str, key: str = "remote_cache") -> tuple:
    """grpc://HOST:PORT -> ("HOST:PORT", False); grpcs:// -> (..., True)."""
    scheme, _, rest = url.partition("://")
    if scheme not in ("grpc", "grpcs") or not rest:
        raise ConfigError(f"{key} = {url!r}: expected grpc://HOST:PORT or grpcs://HOST:PORT")
    port = rest.rpartition(":")[2]
    if not port.isdigit() or not PORT[0] <= int(port) <= PORT[1]:
        # gRPC would take 99999 modulo 65536 and call another port
        raise ConfigError(f"{key} = {url!r}: port {port!r} is not a TCP port "
                          f"({PORT[0]}-{PORT[1]})")
    return rest, scheme == "grpcs"


def read_pem(root: Path, value: str, key: str) -> Optional[bytes]:
    """A PEM file a remote_tls_* key names, relative to the project; None when not set."""
    if not value:
        return None
    path = Path(root, value)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key} = {value!r}: cannot read {path} ({exc.strerror}); give a PEM "
                          "file, relative to the project") from None


def header_metadata(header: str, environ=None) -> list:
    """remote_header NAME=VALUE as gRPC metadata; a VALUE $VAR is read from the environment."""
    environ = os.environ if environ is None else environ
    if not header:
        return []
    name, _, value = header.partition("=")
    if value.startswith("$"):
        var = value[1:]
        if var not in environ:
            raise ConfigError(f"remote_header = {name}=${var}: the environment variable {var} "
                              "is not set; set it to the header's value")
        value = environ[var]
    return [(name.lower(), value)]


def tls_files(settings, root: Path) -> Optional[tuple]:
    """(CA, cert, key) PEM bytes (each None when not set) for a grpcs:// cache; None for grpc://.
    TLS files with a plain grpc:// target, or a cert without its key, are refused."""
    _, tls = parse_target(settings.cache)
    if not tls:
        if settings.tls_ca or settings.tls_cert or settings.tls_key:
            raise ConfigError(f"remote_tls_ca / remote_tls_cert / remote_tls_key are set but "
                              f"remote_cache = {settings.cache!r} is not TLS; use grpcs://")
        return None
    cert = read_pem(root, settings.tls_cert, "remote_tls_cert")
    key = read_pem(root, settings.tls_key, "remote_tls_key")
    if bool(cert) != bool(key):
        raise ConfigError("remote_tls_cert and remote_tls_key go together (mutual TLS): set both")
    return read_pem(root, settings.tls_ca, "remote_tls_ca"), cert, key


def check_remote_settings(settings, root: Path) -> None:
    """Every remote_* setting, checked as the first call to the server would use it."""
    if settings.executor:
        parse_target(settings.executor, "remote_executor")
        tls_files(executor_settings(settings), root)
    if not settings.cache and not settings.executor:
        return
    if settings.cache:
        tls_files(settings, root)
    header_metadata(settings.header)


def executor_settings(settings):
    """The remote settings as the Execution server is called: its URL where the cache's goes
    (instance, TLS files, header and timeout are shared: one server usually serves both)."""
    import dataclasses
    return dataclasses.replace(settings, cache=settings.executor)
