"""Where the host imports go: the component's imports, or a test harness standing in for the host."""

from __future__ import annotations

from typing import Optional

from wit_world.imports import host as _host


class Host:
    """The host's imports as the component calls them."""

    def log(self, level: _host.Level, message: str) -> None:
        _host.log(level, message)

    def settings(self) -> str:
        return _host.settings()

    def pod_running(self) -> bool:
        return _host.pod_running()

    def selection_device(self, namespace: str, name: str) -> Optional[_host.ClaimDevice]:
        return _host.selection_device(namespace, name)


class _Current:
    """Forwards to the active host; `plexus_sdk.testing.Harness` swaps in its own for the length of a call."""

    def __init__(self) -> None:
        self.active: Host = Host()

    def log(self, level: _host.Level, message: str) -> None:
        self.active.log(level, message)

    def settings(self) -> str:
        return self.active.settings()

    def pod_running(self) -> bool:
        return self.active.pod_running()

    def selection_device(self, namespace: str, name: str) -> Optional[_host.ClaimDevice]:
        return self.active.selection_device(namespace, name)


backend = _Current()
