import { admit, deny, exportHook, HookError, log, settings, type Decision, type Pod, type Selection } from "plexus-hooks-sdk";

export function check(pod: Pod, selections: Selection[]): Decision {
    const prefixes = settings(["allowedPrefixes"]).allowedPrefixes ?? [];
    if (!Array.isArray(prefixes) || !prefixes.every((p) => typeof p === "string")) {
        throw new HookError("invalid settings: allowedPrefixes is not a list of strings");
    }
    for (const s of selections) {
        if (!prefixes.some((p: string) => s.name.startsWith(p))) {
            log.info(`${pod.namespace}/${pod.name}: refusing ${s.name}`);
            return deny(`network ${s.name} is not allowed`);
        }
    }
    return admit();
}

exportHook({ policy: check });
