"""The SDK's own behaviour, natively: what the harness (and so the component's export code) makes of what a hook
function returns or raises, and what the host imports answer."""

import unittest

import plexus_sdk as plexus
from plexus_sdk import (
    Admit,
    ClaimDevice,
    Deny,
    HookError,
    Level,
    Rewrite,
    extras,
    new_pod,
    new_selection,
    new_status_entry,
    set_extra,
)
from plexus_sdk.testing import Harness, HookFault


def device(name: str) -> ClaimDevice:
    return ClaimDevice(
        claim="nic", request="vf", driver="example.com", pool="node-1", device=name, device_id=None, resource_name=None
    )


class PassThroughs(unittest.TestCase):
    """A kind without a function answers as the host's default: admit, nothing supplied, entries unchanged."""

    def test_each_kind(self):
        h = Harness()
        self.assertEqual(h.check(None, [new_selection("a", "n")]), Admit())
        self.assertIsNone(h.resolve(None, new_selection("a", "n"), {"kind": "NetworkAttachmentDefinition"}))
        entries = [new_status_entry("a/n", True)]
        self.assertEqual(h.shape(None, entries), entries)


class Faults(unittest.TestCase):
    def test_hook_error_is_the_fault_message(self):
        def fails(pod, selections):
            raise HookError("cannot decide")

        with self.assertRaises(HookFault) as e:
            Harness().check(fails, [])
        self.assertEqual(e.exception.message, "cannot decide")

    def test_any_other_exception_is_a_fault_naming_its_type(self):
        with self.assertRaises(HookFault) as e:
            Harness().shape(lambda pod, entries: entries[3], [])
        self.assertEqual(e.exception.message, "IndexError: list index out of range")

    def test_a_result_of_the_wrong_type_is_a_fault_naming_the_field(self):
        with self.assertRaises(HookFault) as e:
            Harness().check(lambda pod, s: True, [])
        self.assertIn("the decision: expected", e.exception.message)
        bad = new_status_entry("a/n")
        bad.mtu = -1
        with self.assertRaises(HookFault) as e:
            Harness().shape(lambda pod, entries: [bad], [])
        self.assertEqual(e.exception.message, "the entries[0].mtu: expected int, got -1")
        with self.assertRaises(HookFault) as e:
            Harness().check(lambda pod, s: Rewrite([("a", "n")]), [])
        self.assertIn("the decision.value[0]: expected Selection", e.exception.message)

    def test_settings_must_be_an_object_of_known_keys(self):
        read = lambda pod, s: Deny(repr(plexus.settings(known=["a"])))  # noqa: E731
        self.assertEqual(Harness().check(read, []), Deny("{}"))
        self.assertEqual(Harness().settings({"a": 1}).check(read, []), Deny("{'a': 1}"))
        with self.assertRaises(HookFault) as e:
            Harness().settings({"b": 1}).check(read, [])
        self.assertEqual(e.exception.message, "invalid settings: unknown field `b`, expected `a`")
        with self.assertRaises(HookFault) as e:
            Harness().settings([1]).check(read, [])
        self.assertEqual(e.exception.message, "invalid settings: expected a JSON object, got list")


class HostImports(unittest.TestCase):
    def test_logs_pod_running_and_devices_answer_from_the_harness(self):
        def policy(pod, selections):
            plexus.log.warn(f"running={plexus.pod_running()}")
            for s in selections:
                d = plexus.selection_device(s)
                plexus.log.debug(f"{s.name}: {d.device if d else None}")
            return Rewrite(selections[:1])

        h = Harness().running().device("team-a", "sriov", device("vf-3"))
        sel = [new_selection("team-a", "sriov"), new_selection("team-a", "lab")]
        self.assertEqual(h.check(policy, sel), Rewrite(sel[:1]))
        self.assertEqual(
            h.logs(), [(Level.WARN, "running=True"), (Level.DEBUG, "sriov: vf-3"), (Level.DEBUG, "lab: None")]
        )

    def test_outside_a_call_the_imports_are_the_components(self):
        with self.assertRaises(NotImplementedError):
            plexus.pod_running()


class Records(unittest.TestCase):
    def test_json_views_and_constructors(self):
        pod = new_pod("ns", "p", labels={"app": "web"}, annotations={"a": "b"})
        self.assertEqual((plexus.labels(pod), plexus.annotations(pod)), ({"app": "web"}, {"a": "b"}))
        s = new_selection("ns", "net", interface="net1", extras=[("org.example.vlan", "7")])
        self.assertEqual(extras(s), {"org.example.vlan": 7})
        set_extra(s, "org.example.vlan", {"id": 8})
        set_extra(s, "org.example.mtu", 9000)
        self.assertEqual(s.extras, [("org.example.vlan", '{"id":8}'), ("org.example.mtu", "9000")])

    def test_the_resolver_sees_and_returns_json_values(self):
        seen = []

        def resolver(pod, selection, nad, config):
            seen.append((nad, config))
            return {"cniVersion": "1.0.0", "type": "bridge"}

        out = Harness().resolve(resolver, new_selection("ns", "lab"), {"metadata": {"name": "lab"}})
        self.assertEqual(out, {"cniVersion": "1.0.0", "type": "bridge"})
        self.assertEqual(seen, [({"metadata": {"name": "lab"}}, None)])


class Export(unittest.TestCase):
    def test_export_needs_a_kind_and_names_them_in_order(self):
        with self.assertRaises(TypeError):
            plexus.export()
        plexus.export(status=lambda p, e: e, policy=lambda p, s: Admit())
        self.assertEqual(plexus.exported_kinds(), ["policy", "status"])


if __name__ == "__main__":
    unittest.main()
