/**
 * Runs a hook's functions natively (plain Node, no wasm), as the host calls them in the component.
 *
 * Calls go through the component's own export code (the pass-through defaults, the check of the result's shape,
 * throws turned into the error the host sees); the host imports answer from the harness: the settings, the pod,
 * `podRunning`, the claim devices, and the log lines are collected.
 *
 *     const h = new Harness().pod(newPod("team-a", "web")).settings({ globalNamespaces: ["infra"] });
 *     assert.deepEqual(h.check(check, [newSelection("infra", "storage")]), admit());
 *
 * A call that would be a fault of the hook in the host throws `HookFault` with the host's message.
 */

import {
    _useHost,
    newPod,
    type ClaimDevice,
    type Decision,
    type Json,
    type Level,
    type Pod,
    type PolicyFn,
    type ResolverFn,
    type Selection,
    type StatusEntry,
    type StatusFn,
} from "./index.ts";
import { callPolicy, callResolver, callStatus } from "./guest.ts";

/** The call failed as a fault of the hook: the host would apply its failurePolicy. `message` is what it reports. */
export class HookFault extends Error {
    constructor(message: string) {
        super(message);
        this.name = "HookFault";
    }
}

/** Settings `null`, pod `default/test-pod`, not running, no devices, until told otherwise. */
export class Harness {
    #settings: Json | undefined = null;
    #pod: Pod = newPod("default", "test-pod");
    #running = false;
    #devices = new Map<string, ClaimDevice>();
    #logs: [Level, string][] = [];

    // What the host would hold (each returns the harness, to chain).

    /** The hook's settings as in the plexus configuration (any JSON value; `null`: absent). */
    settings(value: Json): this {
        this.#settings = value;
        return this;
    }

    pod(pod: Pod): this {
        this.#pod = pod;
        return this;
    }

    /** What `podRunning()` answers (`false`: the ADD that makes the sandbox). */
    running(running = true): this {
        this.#running = running;
        return this;
    }

    /** What `selectionDevice()` answers for the selection of network `namespace/name`. */
    device(namespace: string, name: string, device: ClaimDevice): this {
        this.#devices.set(`${namespace}/${name}`, device);
        return this;
    }

    /** Every line logged through this harness so far. */
    logs(): [Level, string][] {
        return [...this.#logs];
    }

    // The calls.

    #call<T>(f: () => T): T {
        const previous = _useHost({
            log: (level, message) => void this.#logs.push([level, message]),
            settings: () => JSON.stringify(this.#settings),
            podRunning: () => this.#running,
            selectionDevice: (namespace, name) => this.#devices.get(`${namespace}/${name}`),
        });
        try {
            return f();
        } catch (e) {
            throw typeof e === "string" ? new HookFault(e) : e;
        } finally {
            _useHost(previous);
        }
    }

    /** Calls a policy function (`undefined`: the pass-through of a component that exports no policy). */
    check(policy: PolicyFn | undefined, selections: Selection[]): Decision {
        return this.#call(() => callPolicy(policy, this.#pod, selections));
    }

    /**
     * Calls a resolver function with the NAD and the configuration so far (JSON values, or undefined); returns the
     * configuration it supplies, or undefined.
     */
    resolve(resolver: ResolverFn | undefined, selection: Selection, nad?: Json, config?: Json): Json | undefined {
        const nadText = nad === undefined ? undefined : JSON.stringify(nad);
        const configText = config === undefined ? undefined : JSON.stringify(config);
        const out = this.#call(() => callResolver(resolver, this.#pod, selection, nadText, configText));
        return out === undefined ? undefined : (JSON.parse(out) as Json);
    }

    /** Calls a status function. */
    shape(status: StatusFn | undefined, entries: StatusEntry[]): StatusEntry[] {
        return this.#call(() => callStatus(status, this.#pod, entries));
    }
}
