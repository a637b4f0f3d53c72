"""Plexus hooks in Python: a typed layer over the bindings componentize-py generates from wit/plexus-hooks.wit.

The records (Pod, Selection, StatusEntry, ...) and the decision variants are the generated classes themselves;
this module adds what a hook needs around them: constructors with defaults, JSON views of the fields that carry
JSON text, the host imports, the error that makes a call a fault of the hook, and `export`, which names the
functions a component serves. The contract and the walkthrough are in docs/hooks.md.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

from wit_world.exports import policy as _policy
from wit_world.imports import host as _host
from wit_world.imports import types as _types

from . import log
from ._backend import backend as _current

__all__ = [
    "Admit",
    "Bandwidth",
    "ClaimDevice",
    "Decision",
    "Deny",
    "Dns",
    "HookError",
    "Level",
    "Pod",
    "PortMapping",
    "Rewrite",
    "Selection",
    "StatusEntry",
    "annotations",
    "export",
    "extras",
    "labels",
    "log",
    "new_pod",
    "new_selection",
    "new_status_entry",
    "pod_running",
    "selection_device",
    "set_extra",
    "settings",
]

Pod = _types.Pod
Selection = _types.Selection
StatusEntry = _types.StatusEntry
PortMapping = _types.PortMapping
Bandwidth = _types.Bandwidth
Dns = _types.Dns
ClaimDevice = _host.ClaimDevice
Level = _host.Level

#: Keep the selections as they are: ``Admit()``.
Admit = _policy.Decision_Admit
#: Fail the pod's network operation; the reason becomes the CNI error message: ``Deny("reason")``.
Deny = _policy.Decision_Deny
#: Replace the selection list (later policies see the rewritten one): ``Rewrite([selection, ...])``.
Rewrite = _policy.Decision_Rewrite
Decision = _policy.Decision

#: What a policy, resolver and status function look like.
PolicyFn = Callable[[Pod, List[Selection]], Decision]
ResolverFn = Callable[[Pod, Selection, Optional[Any], Optional[Any]], Optional[Any]]
StatusFn = Callable[[Pod, List[StatusEntry]], List[StatusEntry]]


class HookError(Exception):
    """A fault of the hook, not a decision: the host applies the hook's failurePolicy. Any other exception a hook
    function raises is a fault too, reported with its type's name; to refuse a pod, return ``Deny``."""


def new_pod(
    namespace: str,
    name: str,
    *,
    uid: Optional[str] = None,
    labels: Optional[Mapping[str, str]] = None,
    annotations: Optional[Mapping[str, str]] = None,
) -> Pod:
    """A pod record (tests build them; the host passes them)."""
    return Pod(
        namespace=namespace,
        name=name,
        uid=uid,
        labels=list((labels or {}).items()),
        annotations=list((annotations or {}).items()),
    )


def new_selection(namespace: str, name: str, **fields: Any) -> Selection:
    """A selection of network ``namespace/name``; every other field of the record may be given by name."""
    values: Dict[str, Any] = dict(
        ips=None,
        mac=None,
        interface=None,
        cni_args=None,
        port_mappings=None,
        bandwidth=None,
        default_route=None,
        infiniband_guid=None,
        ipam_claim_reference=None,
        extras=[],
    )
    values.update(fields)
    return Selection(name=name, namespace=namespace, **values)


def new_status_entry(name: str, is_default: bool = False, **fields: Any) -> StatusEntry:
    """A network-status entry for network ``name`` (``namespace/name``); other fields may be given by name."""
    values: Dict[str, Any] = dict(
        interface=None,
        ips=None,
        mac=None,
        mtu=None,
        dns=None,
        default_route=None,
        device_info=None,
        infiniband_guid=None,
        extras=[],
    )
    values.update(fields)
    return StatusEntry(name=name, is_default=is_default, **values)


def labels(pod: Pod) -> Dict[str, str]:
    """The pod's labels as a dict."""
    return dict(pod.labels)


def annotations(pod: Pod) -> Dict[str, str]:
    """The pod's annotations as a dict."""
    return dict(pod.annotations)


HasExtras = Union[Selection, StatusEntry]


def extras(record: HasExtras) -> Dict[str, Any]:
    """The keys outside the spec of a selection or status entry, their JSON values decoded."""
    return {k: json.loads(v) for k, v in record.extras}


def set_extra(record: HasExtras, key: str, value: Any) -> None:
    """Sets (or replaces) one key outside the spec; ``value`` is encoded as JSON."""
    text = json.dumps(value, separators=(",", ":"))
    kept = [(k, v) for k, v in record.extras if k != key]
    record.extras = kept + [(key, text)]


def settings(known: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    """The hook's ``settings`` from the plexus configuration: a dict, empty when there are none.

    With ``known``, a key outside it is a fault (``HookError``), so that a typo in a node's configuration does not
    silently fall back to a default.
    """
    text = _current.settings()
    try:
        value = json.loads(text)
    except ValueError as e:
        raise HookError(f"invalid settings: {e}") from None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise HookError(f"invalid settings: expected a JSON object, got {type(value).__name__}")
    if known is not None:
        allowed = list(known)
        unknown = sorted(k for k in value if k not in allowed)
        if unknown:
            # Worded as serde words it for the Rust SDK's settings, so both builds of a hook fail alike.
            names = ", ".join(f"`{k}`" for k in allowed)
            expected = names if len(allowed) == 1 else f"one of {names}"
            raise HookError(f"invalid settings: unknown field `{unknown[0]}`, expected {expected}")
    return value


def pod_running() -> bool:
    """True when this call changes a running pod's networks, false during the ADD that makes the sandbox."""
    return bool(_current.pod_running())


def selection_device(selection: Selection) -> Optional[ClaimDevice]:
    """The device of one of the pod's ResourceClaims that this selection's network uses, if any."""
    return _current.selection_device(selection.namespace, selection.name)


class _Exports:
    policy: Optional[PolicyFn] = None
    resolver: Optional[ResolverFn] = None
    status: Optional[StatusFn] = None


_exports = _Exports()


def export(
    *,
    policy: Optional[PolicyFn] = None,
    resolver: Optional[ResolverFn] = None,
    status: Optional[StatusFn] = None,
) -> None:
    """Names the functions this component serves, once, at the top level of the hook's module.

    The component declares exactly these kinds (its ``plexus:hooks/kinds`` section, written by the build); the
    other interfaces are exported as pass-throughs the host never calls.
    """
    if policy is None and resolver is None and status is None:
        raise TypeError("export() needs at least one of policy=, resolver=, status=")
    _exports.policy = policy
    _exports.resolver = resolver
    _exports.status = status


def exported_kinds() -> List[str]:
    """The kinds named by ``export``, in the contract's order (the build reads them)."""
    return [k for k in ("policy", "resolver", "status") if getattr(_exports, k) is not None]
