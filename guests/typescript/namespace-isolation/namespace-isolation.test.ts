import assert from "node:assert/strict";
import { test } from "node:test";

import { admit, newPod, newSelection } from "plexus-hooks-sdk";
import { Harness, HookFault } from "plexus-hooks-sdk/testing";

import { check } from "./namespace-isolation.ts";

const harness = () => new Harness().pod(newPod("team-a", "web"));

test("own namespace and default are admitted", () => {
    const out = harness().check(check, [newSelection("team-a", "net1"), newSelection("default", "shared")]);
    assert.deepEqual(out, admit());
});

test("other namespace is denied with a reason", () => {
    const out = harness().check(check, [newSelection("team-a", "net1"), newSelection("team-b", "secret")]);
    assert.equal(out.tag, "deny");
    assert.match(out.tag === "deny" ? out.val : "", /team-b\/secret/);
});

test("listed global namespaces replace the default", () => {
    const h = harness().settings({ globalNamespaces: ["infra"] });
    assert.deepEqual(h.check(check, [newSelection("infra", "storage")]), admit());
    assert.equal(h.check(check, [newSelection("default", "shared")]).tag, "deny");
});

test("unknown settings are a fault, not a decision", () => {
    const h = harness().settings({ globalNamespace: ["typo"] });
    assert.throws(() => h.check(check, []), (e: unknown) => e instanceof HookFault && /globalNamespace/.test(e.message));
});
