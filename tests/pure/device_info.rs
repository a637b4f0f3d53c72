//! Device information (multi-net spec 5.3.8, Device Information Specification 4.2, 5.1, 6.1).

use plexus_tests::plexus::Sandbox;
use serde_json::json;

#[test]
fn s5_3_8_device_info_file_offered_read_into_status_and_removed_on_del() {
    let sb = Sandbox::new();
    sb.cluster_net("1.0.0");
    sb.fakes(&["sriov-ish", "plain"]);
    let info = json!({"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:18:02.5"}});
    sb.nad(
        "ns",
        "vf",
        Some(json!({"cniVersion": "1.0.0", "type": "sriov-ish",
        "capabilities": {"CNIDeviceInfoFile": true}, "fakeDeviceInfo": info})),
    );
    sb.nad(
        "ns",
        "plain",
        Some(json!({"cniVersion": "1.0.0", "type": "plain"})),
    );
    sb.pod("ns", "p", Some("vf,plain"));
    let devinfo = sb.path("devinfo");
    let conf = sb.conf(json!({"deviceInfoDir": devinfo}));
    sb.run("ADD", "c1", &Sandbox::pod_args("ns", "p"), &conf)
        .ok();

    let calls = sb.calls();
    let vf = calls.iter().find(|c| c.plugin == "sriov-ish").unwrap();
    let file = vf.stdin["runtimeConfig"]["CNIDeviceInfoFile"]
        .as_str()
        .expect("offered to the declaring plugin");
    assert!(file.starts_with(devinfo.to_str().unwrap()), "{file}");
    assert!(
        file.contains("c1") && file.contains("net1"),
        "unique per attachment: {file}"
    );
    let plain = calls.iter().find(|c| c.plugin == "plain").unwrap();
    assert!(
        plain.stdin.get("runtimeConfig").is_none(),
        "not offered without the capability"
    );

    let status = sb.status("ns", "p").unwrap();
    assert_eq!(status[1]["device-info"], info);
    assert!(status[0].get("device-info").is_none() && status[2].get("device-info").is_none());

    sb.run("DEL", "c1", &Sandbox::pod_args("ns", "p"), &conf)
        .ok();
    assert!(
        !std::path::Path::new(file).exists(),
        "the implementation deletes the file on DEL"
    );
}

// Devices from device plugins (Device Information Specification 4.1, 4.2.1): the pod's devices come from the
// kubelet PodResources API. There is no kubelet here: `PodResourcesServer` is a stand-in that speaks the real
// v1 protocol over a unix socket.

mod device_plugins {
    use plexus_tests::plexus::Sandbox;
    use plexus_tests::podresources::{PodDevices, PodResourcesServer};
    use serde_json::{json, Value};

    const RESOURCE: &str = "example.com/sriov_vf";

    fn nad_with_resource(sb: &Sandbox, name: &str, config: Value) {
        let doc = json!({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": "ns",
                         "annotations": {"k8s.v1.cni.cncf.io/resourceName": RESOURCE}},
            "spec": {"config": config.to_string()}});
        sb.manifest(&format!("nad-ns-{name}.json"), &doc.to_string());
    }

    fn pod_devices(ids: &[&str]) -> Vec<PodDevices> {
        vec![(
            "ns".into(),
            "p".into(),
            vec![
                (
                    "app".into(),
                    RESOURCE.into(),
                    ids.iter().take(1).map(|s| s.to_string()).collect(),
                ),
                (
                    "sidecar".into(),
                    RESOURCE.into(),
                    ids.iter().skip(1).map(|s| s.to_string()).collect(),
                ),
            ],
        )]
    }

    /// Two NADs on one resource, a plain one, the device plugin's device-info files, and the conf.
    fn world(sb: &Sandbox) -> Value {
        sb.cluster_net("1.0.0");
        sb.fakes(&["vf-plugin", "plain"]);
        nad_with_resource(
            sb,
            "vf-a",
            json!({"cniVersion": "1.0.0", "type": "vf-plugin"}),
        );
        nad_with_resource(
            sb,
            "vf-b",
            json!({"cniVersion": "1.0.0", "type": "vf-plugin",
                   "capabilities": {"deviceID": true, "CNIDeviceInfoFile": true}}),
        );
        sb.nad(
            "ns",
            "plain",
            Some(json!({"cniVersion": "1.0.0", "type": "plain"})),
        );
        sb.pod("ns", "p", Some("vf-a,plain,vf-b"));
        let dp = sb.path("devinfo-dp");
        std::fs::create_dir_all(&dp).unwrap();
        for id in ["0000:01:00.1", "0000:01:00.2"] {
            std::fs::write(
                dp.join(format!("example.com-sriov_vf-{id}-device.json")),
                json!({"type": "pci", "version": "1.1.0", "pci": {"pci-address": id}}).to_string(),
            )
            .unwrap();
        }
        sb.conf(json!({
            "deviceInfoDir": sb.path("devinfo-cni"),
            "devicePluginInfoDir": dp,
            "podResourcesSocket": sb.path("kubelet/pod-resources.sock"),
        }))
    }

    fn adds_of(sb: &Sandbox, plugin: &str) -> Vec<Value> {
        sb.calls()
            .into_iter()
            .filter(|c| c.plugin == plugin && c.command == "ADD")
            .map(|c| c.stdin)
            .collect()
    }

    #[test]
    fn device_ids_from_kubelet_reach_the_delegates_and_the_status() {
        let sb = Sandbox::new();
        let conf = world(&sb);
        let kubelet = PodResourcesServer::start(
            &sb.path("kubelet/pod-resources.sock"),
            pod_devices(&["0000:01:00.1", "0000:01:00.2"]),
            true,
        );
        sb.run("ADD", "c1", &Sandbox::pod_args("ns", "p"), &conf)
            .ok();
        assert_eq!(kubelet.calls(), vec!["Get"], "one question per ADD");

        // Each network of the resource gets its own device, in the order of the selection.
        let vf = adds_of(&sb, "vf-plugin");
        assert_eq!(vf.len(), 2);
        assert_eq!(vf[0]["deviceID"], "0000:01:00.1");
        assert!(
            vf[0].get("runtimeConfig").is_none(),
            "runtimeConfig only for the deviceID capability: {}",
            vf[0]
        );
        assert_eq!(vf[1]["deviceID"], "0000:01:00.2");
        assert_eq!(vf[1]["runtimeConfig"]["deviceID"], "0000:01:00.2");
        assert!(adds_of(&sb, "plain")[0].get("deviceID").is_none());

        // The device plugin's information: offered in the plugin's device-info file (vf-b declares it) and
        // read from the device plugin's file otherwise (vf-a); the plain network has none.
        let status = sb.status("ns", "p").unwrap();
        let names: Vec<_> = status
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].clone())
            .collect();
        assert_eq!(
            names,
            vec![
                json!("cluster-net"),
                json!("ns/vf-a"),
                json!("ns/plain"),
                json!("ns/vf-b")
            ]
        );
        assert_eq!(
            status[1]["device-info"]["pci"]["pci-address"],
            "0000:01:00.1"
        );
        assert!(status[2].get("device-info").is_none());
        assert_eq!(
            status[3]["device-info"]["pci"]["pci-address"],
            "0000:01:00.2"
        );
        let offered = vf[1]["runtimeConfig"]["CNIDeviceInfoFile"]
            .as_str()
            .unwrap();
        let copied: Value =
            serde_json::from_str(&std::fs::read_to_string(offered).unwrap()).unwrap();
        assert_eq!(copied["pci"]["pci-address"], "0000:01:00.2");

        // DEL runs from the cache, without kubelet, and the delegates get their devices again.
        drop(kubelet);
        sb.run("DEL", "c1", &Sandbox::pod_args("ns", "p"), &conf)
            .ok();
        let dels: Vec<_> = sb
            .calls()
            .into_iter()
            .filter(|c| c.plugin == "vf-plugin" && c.command == "DEL")
            .map(|c| c.stdin["deviceID"].clone())
            .collect();
        assert_eq!(dels, vec![json!("0000:01:00.2"), json!("0000:01:00.1")]);
        assert!(sb.cached().is_empty());
    }

    #[test]
    fn a_kubelet_without_get_is_asked_with_list() {
        let sb = Sandbox::new();
        let conf = world(&sb);
        let mut pods = pod_devices(&["0000:01:00.1", "0000:01:00.2"]);
        // Another pod's devices are not this pod's.
        pods.push((
            "ns".into(),
            "other".into(),
            vec![("c".into(), RESOURCE.into(), vec!["0000:09:00.1".into()])],
        ));
        let kubelet =
            PodResourcesServer::start(&sb.path("kubelet/pod-resources.sock"), pods, false);
        sb.run("ADD", "c1", &Sandbox::pod_args("ns", "p"), &conf)
            .ok();
        assert_eq!(kubelet.calls(), vec!["Get", "List"]);
        let vf = adds_of(&sb, "vf-plugin");
        assert_eq!(
            (vf[0]["deviceID"].clone(), vf[1]["deviceID"].clone()),
            (json!("0000:01:00.1"), json!("0000:01:00.2"))
        );
    }

    #[test]
    fn too_few_devices_or_no_kubelet_fail_the_add_before_any_delegate_runs() {
        let sb = Sandbox::new();
        let conf = world(&sb);
        // One device for two networks of the resource.
        let kubelet = PodResourcesServer::start(
            &sb.path("kubelet/pod-resources.sock"),
            pod_devices(&["0000:01:00.1"]),
            true,
        );
        let run = sb.run("ADD", "c1", &Sandbox::pod_args("ns", "p"), &conf);
        assert_eq!(run.code(), 7, "{}", run.stdout);
        assert!(
            run.msg().contains("ns/vf-b")
                && run
                    .msg()
                    .contains("1 device(s) of resource example.com/sriov_vf"),
            "{}",
            run.msg()
        );
        assert!(sb.calls().is_empty(), "nothing attached");
        assert!(sb.cached().is_empty());
        drop(kubelet);

        // No kubelet answering: "try again later", naming the socket.
        let run = sb.run("ADD", "c2", &Sandbox::pod_args("ns", "p"), &conf);
        assert_eq!(run.code(), 11, "{}", run.stdout);
        assert!(
            run.msg().contains("kubelet PodResources API at")
                && run.msg().contains("pod-resources.sock"),
            "{}",
            run.msg()
        );
        assert!(sb.calls().is_empty());
        assert!(sb.cached().is_empty());
    }
}
