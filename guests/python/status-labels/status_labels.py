"""A status hook: adds `"io.plexus.pod-labels": {label: value}` to every network-status entry, for the pod labels
named in `labels` that the pod has (merged into the map an earlier hook left there). The Python build of
guests/status-labels, answering as it does."""

from typing import List

import plexus_sdk as plexus
from plexus_sdk import Pod, StatusEntry

KEY = "io.plexus.pod-labels"


def shape(pod: Pod, entries: List[StatusEntry]) -> List[StatusEntry]:
    wanted = plexus.settings(known=["labels"]).get("labels", [])
    if not isinstance(wanted, list) or not all(isinstance(l, str) for l in wanted):
        raise plexus.HookError("invalid settings: labels is not a list of strings")
    pod_labels = plexus.labels(pod)
    picked = {l: pod_labels[l] for l in wanted if l in pod_labels}
    # Merged into what an earlier hook put there, so several of these hooks can each add their labels.
    for e in entries:
        slot = plexus.extras(e).get(KEY)
        merged = {**slot, **picked} if isinstance(slot, dict) else dict(picked)
        plexus.set_extra(e, KEY, merged)
    return entries


plexus.export(status=shape)
