import unittest

from plexus_sdk import Admit, Deny, new_pod, new_selection
from plexus_sdk.testing import Harness, HookFault

from namespace_isolation import check


def harness() -> Harness:
    return Harness().pod(new_pod("team-a", "web"))


class NamespaceIsolation(unittest.TestCase):
    def test_own_namespace_and_default_are_admitted(self):
        out = harness().check(
            check, [new_selection("team-a", "net1"), new_selection("default", "shared")]
        )
        self.assertEqual(out, Admit())

    def test_other_namespace_is_denied_with_a_reason(self):
        out = harness().check(
            check, [new_selection("team-a", "net1"), new_selection("team-b", "secret")]
        )
        self.assertIsInstance(out, Deny)
        self.assertIn("team-b/secret", out.value)

    def test_listed_global_namespaces_replace_the_default(self):
        h = harness().settings({"globalNamespaces": ["infra"]})
        self.assertEqual(h.check(check, [new_selection("infra", "storage")]), Admit())
        self.assertIsInstance(h.check(check, [new_selection("default", "shared")]), Deny)

    def test_unknown_settings_are_a_fault_not_a_decision(self):
        h = harness().settings({"globalNamespace": ["typo"]})
        with self.assertRaises(HookFault) as e:
            h.check(check, [])
        self.assertIn("globalNamespace", e.exception.message)


if __name__ == "__main__":
    unittest.main()
