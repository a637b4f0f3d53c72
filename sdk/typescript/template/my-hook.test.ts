import assert from "node:assert/strict";
import { test } from "node:test";

import { admit, deny, extras, newPod, newSelection, newStatusEntry } from "plexus-hooks-sdk";
import { Harness } from "plexus-hooks-sdk/testing";

import { check, resolve, shape } from "./my-hook.ts";

test("allowed prefixes are admitted, others denied and logged", () => {
    const h = new Harness().pod(newPod("team-a", "web")).settings({ allowedPrefixes: ["lab-"] });
    assert.deepEqual(h.check(check, [newSelection("team-a", "lab-1")]), admit());
    assert.deepEqual(h.check(check, [newSelection("team-a", "prod")]), deny("network prod is not allowed"));
    assert.deepEqual(h.logs(), [["info", "team-a/web: refusing prod"]]);
});

test("the resolver changes nothing", () => {
    assert.equal(new Harness().resolve(resolve, newSelection("team-a", "lab-1"), undefined, { type: "bridge" }), undefined);
});

test("status entries get the pod uid", () => {
    const out = new Harness().pod(newPod("team-a", "web", { uid: "u-1" })).shape(shape, [newStatusEntry("team-a/lab-1")]);
    assert.deepEqual(extras(out[0]), { "org.example.pod-uid": "u-1" });
});
