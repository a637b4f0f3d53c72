/**
 * Misbehaves on purpose, in the way its settings' `mode` names, so the sandbox tests run each hostile guest of
 * guests/test-* that JavaScript can express from one component (a TypeScript build costs seconds to compile):
 * `loop` spins forever in every kind, `bomb` allocates and touches memory until stopped, `throw` fails with an
 * uncaught error naming the pod, `flood` writes megabytes to stdout and stderr and thousands of lines to the log
 * import, then admits.
 */

import { admit, exportHook, HookError, log, settings, type Decision, type Pod, type StatusEntry } from "plexus-hooks-sdk";

function spin(): never {
    let n = 0;
    for (;;) {
        n = (n + 1) | 0;
    }
}

function bomb(): never {
    const hoard: Uint8Array[] = [];
    for (;;) {
        hoard.push(new Uint8Array(1 << 20).fill(0xa5));
    }
}

function flood(): Decision {
    const line = "flood ".repeat(170);
    for (let i = 0; i < 4096; i++) {
        console.log(line);
        console.error(line);
    }
    const x = "x".repeat(200);
    for (let i = 0; i < 10_000; i++) {
        log.info(`flood line ${i} ${x}`);
    }
    return admit();
}

function mode(): string {
    const m = settings(["mode"]).mode;
    if (typeof m !== "string") {
        throw new HookError("invalid settings: mode is not a string");
    }
    return m;
}

export function check(pod: Pod): Decision {
    switch (mode()) {
        case "loop":
            return spin();
        case "bomb":
            return bomb();
        case "throw":
            throw new Error(`test-hostile deliberately threw for pod ${pod.name}`);
        case "flood":
            return flood();
        default:
            throw new HookError("unknown mode");
    }
}

export function resolve(): undefined {
    return mode() === "loop" ? spin() : undefined;
}

export function shape(_pod: Pod, entries: StatusEntry[]): StatusEntry[] {
    return mode() === "loop" ? spin() : entries;
}

exportHook({ policy: check, resolver: resolve, status: shape });
