"""Lines in the plexus log, attributed to the calling hook: ``plexus_sdk.log.info("...")``."""

from __future__ import annotations

from wit_world.imports.host import Level

from ._backend import backend as _backend


def error(message: str) -> None:
    _backend.log(Level.ERROR, str(message))


def warn(message: str) -> None:
    _backend.log(Level.WARN, str(message))


def info(message: str) -> None:
    _backend.log(Level.INFO, str(message))


def debug(message: str) -> None:
    _backend.log(Level.DEBUG, str(message))


def trace(message: str) -> None:
    _backend.log(Level.TRACE, str(message))
