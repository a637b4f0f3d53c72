import unittest

from plexus_sdk import extras, new_pod, new_status_entry, set_extra
from plexus_sdk.testing import Harness

from status_labels import KEY, shape


class StatusLabels(unittest.TestCase):
    def test_chosen_labels_are_added_to_every_entry(self):
        pod = new_pod("default", "web", labels={"app": "web", "tier": "front", "secret": "x"})
        out = (
            Harness()
            .pod(pod)
            .settings({"labels": ["app", "tier", "missing"]})
            .shape(shape, [new_status_entry("kube-system/pod-net", True), new_status_entry("default/lab")])
        )
        self.assertEqual(len(out), 2)
        for e in out:
            self.assertEqual(extras(e)[KEY], {"app": "web", "tier": "front"})
        self.assertTrue(out[0].is_default and not out[1].is_default)

    def test_labels_merge_with_those_an_earlier_hook_added(self):
        pod = new_pod("default", "web", labels={"app": "web", "tier": "front"})
        earlier = new_status_entry("kube-system/pod-net", True)
        set_extra(earlier, KEY, {"tier": "old", "zone": "a"})
        out = Harness().pod(pod).settings({"labels": ["tier"]}).shape(shape, [earlier])
        self.assertEqual(extras(out[0])[KEY], {"tier": "front", "zone": "a"})


if __name__ == "__main__":
    unittest.main()
