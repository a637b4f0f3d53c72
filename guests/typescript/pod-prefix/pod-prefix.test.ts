import assert from "node:assert/strict";
import { test } from "node:test";

import { admit, newPod, newSelection } from "plexus-hooks-sdk";
import { Harness } from "plexus-hooks-sdk/testing";

import { check } from "./pod-prefix.ts";

test("only prefixed networks pass", () => {
    const h = new Harness().pod(newPod("team-a", "web")).settings({ allowedPrefixes: ["lab-"] });
    assert.deepEqual(h.check(check, [newSelection("team-a", "lab-1")]), admit());
    assert.equal(h.check(check, [newSelection("team-a", "prod")]).tag, "deny");
    assert.equal(h.logs().length, 1);
});
