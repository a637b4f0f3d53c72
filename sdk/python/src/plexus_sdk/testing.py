"""Runs a hook's functions natively (plain CPython, no wasm), as the host calls them in the component.

Calls go through the component's own export code (the pass-through defaults, the check of what the function
returns against the WIT types, exceptions turned into the error the host sees); the host imports answer from the
harness: the settings, the pod, `pod_running`, the claim devices, and the log lines are collected.

    h = Harness().pod(new_pod("team-a", "web")).settings({"globalNamespaces": ["infra"]})
    assert h.check(app.check, [new_selection("infra", "storage")]) == Admit()

A call that would be a fault of the hook in the host raises `HookFault` with the host's message.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Tuple

from componentize_py_types import Err

from . import ClaimDevice, Decision, Level, Pod, Selection, StatusEntry, new_pod
from . import _backend, _guest


class HookFault(Exception):
    """The call failed as a fault of the hook: the host would apply its failurePolicy. ``message`` is what the
    host reports."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Host(_backend.Host):
    """The host imports, answered from a harness."""

    def __init__(self, harness: "Harness") -> None:
        self.h = harness

    def log(self, level: Level, message: str) -> None:
        self.h._logs.append((level, message))

    def settings(self) -> str:
        return json.dumps(self.h._settings)

    def pod_running(self) -> bool:
        return self.h._running

    def selection_device(self, namespace: str, name: str) -> Optional[ClaimDevice]:
        return self.h._devices.get((namespace, name))


class Harness:
    """Settings ``null``, pod ``default/test-pod``, not running, no devices, until told otherwise."""

    def __init__(self) -> None:
        self._settings: Any = None
        self._pod: Pod = new_pod("default", "test-pod")
        self._running = False
        self._devices: Dict[Tuple[str, str], ClaimDevice] = {}
        self._logs: List[Tuple[Level, str]] = []

    # What the host would hold (each returns the harness, to chain).

    def settings(self, value: Any) -> "Harness":
        """The hook's settings as in the plexus configuration (any JSON value; ``None``: absent)."""
        self._settings = value
        return self

    def pod(self, pod: Pod) -> "Harness":
        self._pod = pod
        return self

    def running(self, running: bool = True) -> "Harness":
        """What ``pod_running()`` answers (``False``: the ADD that makes the sandbox)."""
        self._running = running
        return self

    def device(self, namespace: str, name: str, device: ClaimDevice) -> "Harness":
        """What ``selection_device()`` answers for the selection of network ``namespace/name``."""
        self._devices[(namespace, name)] = device
        return self

    def logs(self) -> List[Tuple[Level, str]]:
        """Every line logged through this harness so far."""
        return list(self._logs)

    # The calls.

    def _call(self, f: Callable[[], Any]) -> Any:
        previous = _backend.backend.active
        _backend.backend.active = _Host(self)
        try:
            return f()
        except Err as e:
            raise HookFault(str(e.value)) from None
        finally:
            _backend.backend.active = previous

    def check(self, policy: Optional[Callable[..., Decision]], selections: List[Selection]) -> Decision:
        """Calls a policy function (``None``: the pass-through of a component that exports no policy)."""
        return self._call(lambda: _guest.call_policy(policy, self._pod, selections))

    def resolve(
        self,
        resolver: Optional[Callable[..., Any]],
        selection: Selection,
        nad: Any = None,
        config: Any = None,
    ) -> Any:
        """Calls a resolver function with the NAD and the configuration so far (JSON values, or None); returns
        the configuration it supplies, decoded, or None."""
        nad_text = None if nad is None else json.dumps(nad)
        config_text = None if config is None else json.dumps(config)
        out = self._call(
            lambda: _guest.call_resolver(resolver, self._pod, selection, nad_text, config_text)
        )
        return None if out is None else json.loads(out)

    def shape(
        self, status: Optional[Callable[..., List[StatusEntry]]], entries: List[StatusEntry]
    ) -> List[StatusEntry]:
        """Calls a status function."""
        return self._call(lambda: _guest.call_status(status, self._pod, entries))
