from typing import List

import plexus_sdk as plexus
from plexus_sdk import Admit, Decision, Deny, Pod, Selection


def check(pod: Pod, selections: List[Selection]) -> Decision:
    settings = plexus.settings(known=["allowedPrefixes"])
    prefixes = settings.get("allowedPrefixes", [])
    for s in selections:
        if not any(s.name.startswith(p) for p in prefixes):
            plexus.log.info(f"{pod.namespace}/{pod.name}: refusing {s.name}")
            return Deny(f"network {s.name} is not allowed")
    return Admit()


plexus.export(policy=check)
