"""A policy hook: a pod may select NetworkAttachmentDefinitions in its own namespace and in the namespaces listed
in `globalNamespaces` (default `["default"]`); anything else is denied. The Python build of
guests/namespace-isolation, answering as it does."""

from typing import List

import plexus_sdk as plexus
from plexus_sdk import Admit, Decision, Deny, Pod, Selection


def check(pod: Pod, selections: List[Selection]) -> Decision:
    settings = plexus.settings(known=["globalNamespaces"])
    global_namespaces = settings.get("globalNamespaces", ["default"])
    if not isinstance(global_namespaces, list) or not all(isinstance(n, str) for n in global_namespaces):
        raise plexus.HookError("invalid settings: globalNamespaces is not a list of strings")
    for s in selections:
        if s.namespace != pod.namespace and s.namespace not in global_namespaces:
            return Deny(
                f"pod {pod.namespace}/{pod.name} may not select network {s.namespace}/{s.name}: "
                f"only its own namespace and {', '.join(global_namespaces)} are allowed"
            )
    return Admit()


plexus.export(policy=check)
