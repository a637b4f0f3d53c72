/**
 * A Plexus hook in TypeScript: copy this directory, rename the module, and keep the kinds you implement.
 *
 * Build:  sdk/typescript/plexus-ts build DIR my-hook my-hook.wasm
 * Test:   sdk/typescript/plexus-ts test DIR
 */

import {
    admit,
    deny,
    exportHook,
    log,
    setExtra,
    settings,
    type Decision,
    type Json,
    type Pod,
    type Selection,
    type StatusEntry,
} from "plexus-hooks-sdk";

/** Policy: refuse networks whose name does not start with one of `allowedPrefixes` (settings). */
export function check(pod: Pod, selections: Selection[]): Decision {
    const prefixes = settings(["allowedPrefixes"]).allowedPrefixes ?? [];
    if (!Array.isArray(prefixes)) {
        throw new TypeError("allowedPrefixes is not a list");
    }
    for (const s of selections) {
        if (!prefixes.some((p) => typeof p === "string" && s.name.startsWith(p))) {
            log.info(`${pod.namespace}/${pod.name}: refusing ${s.name}`);
            return deny(`network ${s.name} is not allowed`);
        }
    }
    return admit();
}

/** Resolver: leave every delegate configuration as it is (return a CNI configuration to supply one). */
export function resolve(_pod: Pod, _selection: Selection, _nad: Json | undefined, _config: Json | undefined): Json | undefined {
    return undefined;
}

/** Status: mark every entry with the pod's uid, under a key of our own (spec 5.3: reverse-DNS names). */
export function shape(pod: Pod, entries: StatusEntry[]): StatusEntry[] {
    for (const e of entries) {
        setExtra(e, "org.example.pod-uid", pod.uid ?? null);
    }
    return entries;
}

// The kinds this component serves: drop the ones you do not implement.
exportHook({ policy: check, resolver: resolve, status: shape });
