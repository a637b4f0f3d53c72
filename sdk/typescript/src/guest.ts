/**
 * The component's exports: the three interfaces' functions, each calling the function `exportHook` named for its
 * kind, or passing through (admit / unchanged / unchanged) when none was. The test harness calls hooks through the
 * same functions, so a hook behaves natively as it does in the host.
 *
 * A hook's fault leaves these functions as a thrown string, which the component returns as the `result`'s error.
 */

import {
    _exports,
    HookError,
    type Decision,
    type Json,
    type Pod,
    type PolicyFn,
    type ResolverFn,
    type Selection,
    type StatusEntry,
    type StatusFn,
} from "./index.ts";

/** The text the host reports for what a hook function threw. */
export function faultMessage(e: unknown): string {
    if (e instanceof HookError) {
        return e.message;
    }
    if (e instanceof Error) {
        return `${e.name}: ${e.message}`;
    }
    return String(e);
}

function fault(e: unknown): never {
    throw faultMessage(e);
}

function isObject(v: unknown): v is Record<string, unknown> {
    return typeof v === "object" && v !== null && !Array.isArray(v);
}

// What the component could not lower would be a trap without a word about which part was wrong, so the shape of a
// result is checked first; the fields inside the records are left to the type checker.
function checkDecision(out: unknown): Decision {
    if (!isObject(out) || !["admit", "deny", "rewrite"].includes(out.tag as string)) {
        throw new HookError(`the decision: expected admit(), deny(reason) or rewrite(selections), got ${JSON.stringify(out)}`);
    }
    if (out.tag === "deny" && typeof out.val !== "string") {
        throw new HookError("the decision: deny needs a reason (a string)");
    }
    if (out.tag === "rewrite") {
        checkRecords(out.val, "the decision's selections", ["name", "namespace"]);
    }
    return out as unknown as Decision;
}

function checkRecords(out: unknown, where: string, strings: string[]): void {
    if (!Array.isArray(out)) {
        throw new HookError(`${where}: expected an array, got ${typeof out}`);
    }
    out.forEach((r: unknown, i) => {
        if (!isObject(r)) {
            throw new HookError(`${where}[${i}]: expected a record, got ${JSON.stringify(r)}`);
        }
        for (const f of strings) {
            if (typeof r[f] !== "string") {
                throw new HookError(`${where}[${i}].${f}: expected a string, got ${JSON.stringify(r[f])}`);
            }
        }
        if (!Array.isArray(r.extras)) {
            throw new HookError(`${where}[${i}].extras: expected an array of [key, JSON text]`);
        }
    });
}

export function callPolicy(fn: PolicyFn | undefined, pod: Pod, selections: Selection[]): Decision {
    try {
        return checkDecision(fn === undefined ? { tag: "admit" } : fn(pod, selections));
    } catch (e) {
        return fault(e);
    }
}

export function callResolver(
    fn: ResolverFn | undefined,
    pod: Pod,
    selection: Selection,
    nad: string | undefined,
    config: string | undefined,
): string | undefined {
    try {
        if (fn === undefined) {
            return undefined;
        }
        const out = fn(
            pod,
            selection,
            nad === undefined ? undefined : (JSON.parse(nad) as Json),
            config === undefined ? undefined : (JSON.parse(config) as Json),
        );
        return out === undefined || out === null ? undefined : JSON.stringify(out);
    } catch (e) {
        return fault(e);
    }
}

export function callStatus(fn: StatusFn | undefined, pod: Pod, entries: StatusEntry[]): StatusEntry[] {
    try {
        const out: unknown = fn === undefined ? entries : fn(pod, entries);
        checkRecords(out, "the entries", ["name"]);
        (out as Record<string, unknown>[]).forEach((e, i) => {
            if (typeof e.isDefault !== "boolean") {
                throw new HookError(`the entries[${i}].isDefault: expected a boolean, got ${JSON.stringify(e.isDefault)}`);
            }
        });
        return out as StatusEntry[];
    } catch (e) {
        return fault(e);
    }
}

/** The exported interfaces as the component's entry exports them. */
export const policy = {
    check: (pod: Pod, selections: Selection[]): Decision => callPolicy(_exports.policy, pod, selections),
};
export const resolver = {
    resolve: (pod: Pod, selection: Selection, nad: string | undefined, config: string | undefined): string | undefined =>
        callResolver(_exports.resolver, pod, selection, nad, config),
};
export const status = {
    shape: (pod: Pod, entries: StatusEntry[]): StatusEntry[] => callStatus(_exports.status, pod, entries),
};
