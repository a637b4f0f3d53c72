import unittest

from plexus_sdk import Admit, Deny, new_pod, new_selection
from plexus_sdk.testing import Harness

from pod_prefix import check


class PodPrefix(unittest.TestCase):
    def test_only_prefixed_networks_pass(self):
        h = Harness().pod(new_pod("team-a", "web")).settings({"allowedPrefixes": ["lab-"]})
        self.assertEqual(h.check(check, [new_selection("team-a", "lab-1")]), Admit())
        self.assertIsInstance(h.check(check, [new_selection("team-a", "prod")]), Deny)
        self.assertEqual(len(h.logs()), 1)


if __name__ == "__main__":
    unittest.main()
