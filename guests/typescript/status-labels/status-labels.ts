/**
 * A status hook: adds `"io.plexus.pod-labels": {label: value}` to every network-status entry, for the pod labels
 * named in `labels` that the pod has (merged into the map an earlier hook left there). The TypeScript build of
 * guests/status-labels, answering as it does.
 */

import { exportHook, extras, HookError, labels, setExtra, settings, type Pod, type StatusEntry } from "plexus-hooks-sdk";

export const KEY = "io.plexus.pod-labels";

export function shape(pod: Pod, entries: StatusEntry[]): StatusEntry[] {
    const wanted = settings(["labels"]).labels ?? [];
    if (!Array.isArray(wanted) || !wanted.every((l) => typeof l === "string")) {
        throw new HookError("invalid settings: labels is not a list of strings");
    }
    const podLabels = labels(pod);
    const picked = Object.fromEntries(wanted.filter((l) => l in podLabels).map((l) => [l, podLabels[l]]));
    // Merged into what an earlier hook put there, so several of these hooks can each add their labels.
    for (const e of entries) {
        const slot = extras(e)[KEY];
        const earlier = typeof slot === "object" && slot !== null && !Array.isArray(slot) ? slot : {};
        setExtra(e, KEY, { ...earlier, ...picked });
    }
    return entries;
}

exportHook({ status: shape });
