import assert from "node:assert/strict";
import { test } from "node:test";

import { extras, newPod, newStatusEntry, setExtra } from "plexus-hooks-sdk";
import { Harness } from "plexus-hooks-sdk/testing";

import { KEY, shape } from "./status-labels.ts";

test("chosen labels are added to every entry", () => {
    const pod = newPod("default", "web", { labels: { app: "web", tier: "front", secret: "x" } });
    const out = new Harness()
        .pod(pod)
        .settings({ labels: ["app", "tier", "missing"] })
        .shape(shape, [newStatusEntry("kube-system/pod-net", true), newStatusEntry("default/lab")]);
    assert.equal(out.length, 2);
    for (const e of out) {
        assert.deepEqual(extras(e)[KEY], { app: "web", tier: "front" });
    }
    assert.ok(out[0].isDefault && !out[1].isDefault);
});

test("labels merge with those an earlier hook added", () => {
    const pod = newPod("default", "web", { labels: { app: "web", tier: "front" } });
    const earlier = newStatusEntry("kube-system/pod-net", true);
    setExtra(earlier, KEY, { tier: "old", zone: "a" });
    const out = new Harness().pod(pod).settings({ labels: ["tier"] }).shape(shape, [earlier]);
    assert.deepEqual(extras(out[0])[KEY], { tier: "front", zone: "a" });
});
