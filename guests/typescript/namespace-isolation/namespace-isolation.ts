/**
 * A policy hook: a pod may select NetworkAttachmentDefinitions in its own namespace and in the namespaces listed in
 * `globalNamespaces` (default `["default"]`); anything else is denied. The TypeScript build of
 * guests/namespace-isolation, answering as it does.
 */

import { admit, deny, exportHook, HookError, settings, type Decision, type Pod, type Selection } from "plexus-hooks-sdk";

export function check(pod: Pod, selections: Selection[]): Decision {
    const globalNamespaces = settings(["globalNamespaces"]).globalNamespaces ?? ["default"];
    if (!Array.isArray(globalNamespaces) || !globalNamespaces.every((n) => typeof n === "string")) {
        throw new HookError("invalid settings: globalNamespaces is not a list of strings");
    }
    for (const s of selections) {
        if (s.namespace !== pod.namespace && !globalNamespaces.includes(s.namespace)) {
            return deny(
                `pod ${pod.namespace}/${pod.name} may not select network ${s.namespace}/${s.name}: ` +
                    `only its own namespace and ${globalNamespaces.join(", ")} are allowed`,
            );
        }
    }
    return admit();
}

exportHook({ policy: check });
