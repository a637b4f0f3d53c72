// The SDK's own behaviour, natively: what the host would get from each kind, faults, settings, the imports.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
    _exports,
    admit,
    annotations,
    deny,
    exportedKinds,
    exportHook,
    extras,
    HookError,
    labels,
    log,
    newPod,
    newSelection,
    newStatusEntry,
    podRunning,
    rewrite,
    selectionDevice,
    setExtra,
    settings,
    type ClaimDevice,
    type Decision,
    type StatusEntry,
} from "plexus-hooks-sdk";
import { Harness, HookFault } from "plexus-hooks-sdk/testing";

const faultOf = (f: () => unknown): string => {
    try {
        f();
    } catch (e) {
        assert.ok(e instanceof HookFault, `not a HookFault: ${String(e)}`);
        return e.message;
    }
    assert.fail("no fault");
};

test("each kind, and the pass-through of a kind not implemented", () => {
    const h = new Harness();
    const sel = newSelection("default", "net");
    assert.deepEqual(h.check(undefined, [sel]), admit());
    assert.deepEqual(h.check(() => rewrite([]), [sel]), rewrite([]));
    assert.equal(h.resolve(undefined, sel, { kind: "NetworkAttachmentDefinition" }), undefined);
    const entries = [newStatusEntry("default/net", true)];
    assert.deepEqual(h.shape(undefined, entries), entries);
});

test("a HookError is the fault's message; anything else thrown names its type", () => {
    const h = new Harness();
    assert.equal(faultOf(() => h.check(() => { throw new HookError("no way"); }, [])), "no way");
    assert.equal(faultOf(() => h.check(() => { throw new RangeError("too far"); }, [])), "RangeError: too far");
    assert.equal(faultOf(() => h.shape(() => { throw "plain"; }, [])), "plain");
});

test("a result of the wrong shape is a fault naming it", () => {
    const h = new Harness();
    assert.match(faultOf(() => h.check(() => ({ tag: "maybe" }) as unknown as Decision, [])), /^the decision: /);
    assert.match(faultOf(() => h.shape(() => [{ name: 1 }] as unknown as StatusEntry[], [])), /^the entries\[0\]\.name: /);
    assert.match(faultOf(() => h.shape(() => [newStatusEntry("a"), { ...newStatusEntry("b"), isDefault: "no" }] as unknown as StatusEntry[], [])), /isDefault/);
});

test("settings must be an object of known keys", () => {
    const read = (value: unknown, known?: string[]) => new Harness().settings(value as never).check(() => (settings(known), admit()), []);
    assert.deepEqual(read(null), admit());
    assert.equal(faultOf(() => read([1])), "invalid settings: expected a JSON object, got array");
    assert.equal(faultOf(() => read({ a: 1, b: 2 }, ["a"])), "invalid settings: unknown field `b`, expected `a`");
    assert.equal(faultOf(() => read({ c: 1 }, ["a", "b"])), "invalid settings: unknown field `c`, expected one of `a`, `b`");
});

test("logs, podRunning and devices answer from the harness", () => {
    const device: ClaimDevice = { claim: "c", request: "r", driver: "d", pool: "p", device: "dev0", deviceId: "0000:01:00.0" };
    const h = new Harness().running().device("team-a", "sriov", device);
    const out = h.check((_pod, selections) => {
        log.warn(`running=${podRunning()}`);
        return selections.every((s) => selectionDevice(s)?.device === "dev0") ? admit() : deny("no device");
    }, [newSelection("team-a", "sriov")]);
    assert.deepEqual(out, admit());
    assert.deepEqual(h.check((_p, s) => (selectionDevice(s[0]) ? admit() : deny("none")), [newSelection("team-a", "other")]), deny("none"));
    assert.deepEqual(h.logs(), [["warn", "running=true"]]);
});

test("outside a call the imports are not answered", () => {
    assert.throws(() => settings(), HookError);
    assert.throws(() => podRunning(), HookError);
});

test("JSON views and constructors", () => {
    const pod = newPod("a", "p", { labels: { app: "web" }, annotations: { note: "x" } });
    assert.deepEqual(labels(pod), { app: "web" });
    assert.deepEqual(annotations(pod), { note: "x" });
    const s = newSelection("a", "n", { mac: "02:00:00:00:00:01", extras: [["org.example.vlan", "7"]] });
    setExtra(s, "org.example.vlan", 8);
    setExtra(s, "org.example.tag", { a: [1] });
    assert.deepEqual(s.extras, [["org.example.vlan", "8"], ["org.example.tag", '{"a":[1]}']]);
    assert.deepEqual(extras(s), { "org.example.vlan": 8, "org.example.tag": { a: [1] } });
    assert.equal(s.mac, "02:00:00:00:00:01");
});

test("the resolver sees and returns JSON values", () => {
    const h = new Harness();
    const out = h.resolve(
        (_pod, _s, nad, config) => ({ cniVersion: "1.0.0", type: "bridge", from: [nad ?? null, config ?? null] }),
        newSelection("a", "n"),
        { kind: "NetworkAttachmentDefinition" },
    );
    assert.deepEqual(out, { cniVersion: "1.0.0", type: "bridge", from: [{ kind: "NetworkAttachmentDefinition" }, null] });
    assert.equal(h.resolve(() => null, newSelection("a", "n")), undefined);
});

test("exportHook needs a kind and names them in order", () => {
    assert.throws(() => exportHook({}), TypeError);
    exportHook({ status: (_p, e) => e, policy: () => admit() });
    assert.deepEqual(exportedKinds(), ["policy", "status"]);
    delete _exports.policy;
    delete _exports.status;
});
