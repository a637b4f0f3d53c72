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
