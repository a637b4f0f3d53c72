"""A Plexus hook in Python: copy this directory, rename the module, and keep the kinds you implement.

Build:  sdk/python/plexus-py build DIR my_hook my-hook.wasm
Test:   sdk/python/plexus-py test DIR
"""

from typing import Any, List, Optional

import plexus_sdk as plexus
from plexus_sdk import Admit, Decision, Deny, Pod, Selection, StatusEntry


def check(pod: Pod, selections: List[Selection]) -> Decision:
    """Policy: refuse networks whose name does not start with one of `allowedPrefixes` (settings)."""
    settings = plexus.settings(known=["allowedPrefixes"])
    prefixes = settings.get("allowedPrefixes", [])
    for s in selections:
        if not any(s.name.startswith(p) for p in prefixes):
            plexus.log.info(f"{pod.namespace}/{pod.name}: refusing {s.name}")
            return Deny(f"network {s.name} is not allowed")
    return Admit()


def resolve(pod: Pod, selection: Selection, nad: Optional[Any], config: Optional[Any]) -> Optional[Any]:
    """Resolver: leave every delegate configuration as it is (return a CNI configuration to supply one)."""
    return None


def shape(pod: Pod, entries: List[StatusEntry]) -> List[StatusEntry]:
    """Status: mark every entry with the pod's uid, under a key of our own (spec 5.3: reverse-DNS names)."""
    for e in entries:
        plexus.set_extra(e, "org.example.pod-uid", pod.uid)
    return entries


# The kinds this component serves: drop the ones you do not implement.
plexus.export(policy=check, resolver=resolve, status=shape)
