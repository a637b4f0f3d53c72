import unittest

from plexus_sdk import Admit, Deny, Level, extras, new_pod, new_selection, new_status_entry
from plexus_sdk.testing import Harness

from my_hook import check, resolve, shape


class MyHook(unittest.TestCase):
    def test_allowed_prefixes_are_admitted_others_denied_and_logged(self):
        h = Harness().pod(new_pod("team-a", "web")).settings({"allowedPrefixes": ["lab-"]})
        self.assertEqual(h.check(check, [new_selection("team-a", "lab-1")]), Admit())
        self.assertEqual(h.check(check, [new_selection("team-a", "prod")]), Deny("network prod is not allowed"))
        self.assertEqual(h.logs(), [(Level.INFO, "team-a/web: refusing prod")])

    def test_the_resolver_changes_nothing(self):
        self.assertIsNone(Harness().resolve(resolve, new_selection("team-a", "lab-1"), config={"type": "bridge"}))

    def test_status_entries_get_the_pod_uid(self):
        out = Harness().pod(new_pod("team-a", "web", uid="u-1")).shape(shape, [new_status_entry("team-a/lab-1")])
        self.assertEqual(extras(out[0]), {"org.example.pod-uid": "u-1"})


if __name__ == "__main__":
    unittest.main()
