/**
 * Plexus hooks in TypeScript: a typed layer over the types jco generates from wit/plexus-hooks.wit.
 *
 * The records (Pod, Selection, StatusEntry, ...) and the decision variant are the generated types themselves; this
 * module adds what a hook needs around them: constructors with defaults, JSON views of the fields that carry JSON
 * text, the host imports, the error that makes a call a fault of the hook, and `exportHook`, which names the
 * functions a component serves. The contract and the walkthrough are in docs/hooks.md.
 */

import type * as types from "plexus:hooks/types@0.1.2";
import type * as host from "plexus:hooks/host@0.1.2";
import type * as policy from "plexus:hooks/policy@0.1.2";

export type Pod = types.Pod;
export type Selection = types.Selection;
export type StatusEntry = types.StatusEntry;
export type PortMapping = types.PortMapping;
export type Bandwidth = types.Bandwidth;
export type Dns = types.Dns;
export type ClaimDevice = host.ClaimDevice;
export type Level = host.Level;
export type Decision = policy.Decision;

/** A JSON value, as the resolver sees the NAD and the configuration and as settings are. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** What a policy, resolver and status function look like. */
export type PolicyFn = (pod: Pod, selections: Selection[]) => Decision;
export type ResolverFn = (pod: Pod, selection: Selection, nad: Json | undefined, config: Json | undefined) => Json | undefined;
export type StatusFn = (pod: Pod, entries: StatusEntry[]) => StatusEntry[];

/** Keep the selections as they are. */
export function admit(): Decision {
    return { tag: "admit" };
}

/** Fail the pod's network operation; the reason becomes the CNI error message. */
export function deny(reason: string): Decision {
    return { tag: "deny", val: reason };
}

/** Replace the selection list (later policies see the rewritten one). */
export function rewrite(selections: Selection[]): Decision {
    return { tag: "rewrite", val: selections };
}

/**
 * A fault of the hook, not a decision: the host applies the hook's failurePolicy. Anything else a hook function
 * throws is a fault too, reported as `Name: message`; to refuse a pod, return `deny(...)`.
 */
export class HookError extends Error {
    constructor(message: string) {
        super(message);
        this.name = "HookError";
    }
}

/** The host's imports, as the component's `plexus:hooks/host` offers them. */
export interface Host {
    log(level: Level, message: string): void;
    settings(): string;
    podRunning(): boolean;
    selectionDevice(namespace: string, name: string): ClaimDevice | undefined;
}

const noHost: Host = {
    log: () => missingHost(),
    settings: () => missingHost(),
    podRunning: () => missingHost(),
    selectionDevice: () => missingHost(),
};

function missingHost(): never {
    throw new HookError("no host: the host imports are answered only during a call (in the component, or a Harness)");
}

let active: Host = noHost;

/** @internal Swaps the host the imports go to (the component's entry, or a test harness); returns the previous. */
export function _useHost(next: Host | undefined): Host {
    const previous = active;
    active = next ?? noHost;
    return previous;
}

/** A pod record (tests build them; the host passes them). */
export function newPod(
    namespace: string,
    name: string,
    fields: { uid?: string; labels?: Record<string, string>; annotations?: Record<string, string> } = {},
): Pod {
    return {
        namespace,
        name,
        uid: fields.uid,
        labels: Object.entries(fields.labels ?? {}),
        annotations: Object.entries(fields.annotations ?? {}),
    };
}

/** A selection of network `namespace/name`; every other field of the record may be given. */
export function newSelection(namespace: string, name: string, fields: Partial<Selection> = {}): Selection {
    return { extras: [], ...fields, name, namespace };
}

/** A network-status entry for network `name` (`namespace/name`); other fields may be given. */
export function newStatusEntry(name: string, isDefault = false, fields: Partial<StatusEntry> = {}): StatusEntry {
    return { extras: [], ...fields, name, isDefault };
}

/** The pod's labels as an object. */
export function labels(pod: Pod): Record<string, string> {
    return Object.fromEntries(pod.labels);
}

/** The pod's annotations as an object. */
export function annotations(pod: Pod): Record<string, string> {
    return Object.fromEntries(pod.annotations);
}

/** The keys outside the spec of a selection or status entry, their JSON values decoded. */
export function extras(record: Selection | StatusEntry): Record<string, Json> {
    return Object.fromEntries(record.extras.map(([k, v]) => [k, JSON.parse(v) as Json]));
}

/** Sets (or replaces) one key outside the spec; `value` is encoded as JSON. */
export function setExtra(record: Selection | StatusEntry, key: string, value: Json): void {
    record.extras = [...record.extras.filter(([k]) => k !== key), [key, JSON.stringify(value)]];
}

/**
 * The hook's `settings` from the plexus configuration: an object, empty when there are none.
 *
 * With `known`, a key outside it is a fault (`HookError`), so that a typo in a node's configuration does not
 * silently fall back to a default.
 */
export function settings(known?: string[]): Record<string, Json> {
    let value: Json;
    try {
        value = JSON.parse(active.settings()) as Json;
    } catch (e) {
        throw new HookError(`invalid settings: ${(e as Error).message}`);
    }
    if (value === null) {
        return {};
    }
    if (typeof value !== "object" || Array.isArray(value)) {
        throw new HookError(`invalid settings: expected a JSON object, got ${Array.isArray(value) ? "array" : typeof value}`);
    }
    if (known !== undefined) {
        const unknown = Object.keys(value).filter((k) => !known.includes(k)).sort();
        if (unknown.length > 0) {
            // Worded as serde words it for the Rust SDK's settings, so every build of a hook fails alike.
            const names = known.map((k) => `\`${k}\``).join(", ");
            const expected = known.length === 1 ? names : `one of ${names}`;
            throw new HookError(`invalid settings: unknown field \`${unknown[0]}\`, expected ${expected}`);
        }
    }
    return value;
}

/** Writes lines to the plexus log, attributed to the calling hook. */
export const log = {
    error: (message: string): void => active.log("error", message),
    warn: (message: string): void => active.log("warn", message),
    info: (message: string): void => active.log("info", message),
    debug: (message: string): void => active.log("debug", message),
    trace: (message: string): void => active.log("trace", message),
};

/** True when this call changes a running pod's networks, false during the ADD that makes the sandbox. */
export function podRunning(): boolean {
    return active.podRunning();
}

/** The device of one of the pod's ResourceClaims that this selection's network uses, if any. */
export function selectionDevice(selection: Selection): ClaimDevice | undefined {
    return active.selectionDevice(selection.namespace, selection.name) ?? undefined;
}

/** The functions a component serves, by kind. */
export interface Exports {
    policy?: PolicyFn;
    resolver?: ResolverFn;
    status?: StatusFn;
}

export const KINDS = ["policy", "resolver", "status"] as const;
export type Kind = (typeof KINDS)[number];

/** @internal What `exportHook` named. */
export const _exports: Exports = {};

/**
 * Names the functions this component serves, once, at the top level of the hook's module.
 *
 * The component declares exactly these kinds (its `plexus:hooks/kinds` section, written by the build); the other
 * interfaces are exported as pass-throughs the host never calls.
 */
export function exportHook(fns: Exports): void {
    if (!fns.policy && !fns.resolver && !fns.status) {
        throw new TypeError("exportHook() needs at least one of policy, resolver, status");
    }
    _exports.policy = fns.policy;
    _exports.resolver = fns.resolver;
    _exports.status = fns.status;
}

/** The kinds named by `exportHook`, in the contract's order (the build reads them). */
export function exportedKinds(): Kind[] {
    return KINDS.filter((k) => _exports[k] !== undefined);
}
