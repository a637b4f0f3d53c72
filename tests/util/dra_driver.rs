//! The suite's DRA driver (`tests/parts/kubernetes/dra-driver`), run beside a [`crate::kubelet::Kubelet`] as a DRA
//! driver's kubelet plugin runs on a node: it publishes the node's ResourceSlice of network devices and answers the
//! kubelet's NodePrepareResources / NodeUnprepareResources, recording each call. Killed when dropped; the slice it
//! published stays with the API server (which the test drops too).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::kubeapi::KubeApiServer;
use crate::kubelet::{Kubelet, NODE};

/// The request whose devices the driver writes network data for itself when it prepares them (status.devices
/// `networkData`, interface `drv-<device>`), as drivers that configure the interface do.
pub const DRIVER_OWNED_REQUEST: &str = "owned";

/// A device the driver publishes with `allowMultipleAllocations` beside the ones it is given: each allocation of
/// it is a share with its own `shareID` (KEP-5075). (name, PCI address)
pub const SHARED_DEVICE: (&str, &str) = ("pf0", "0000:02:00.0");

pub struct DraDriver {
    child: Child,
    dir: PathBuf,
}

impl DraDriver {
    /// Starts the driver `driver` for [`NODE`] with `devices` (name, PCI address), each with the resource name
    /// `resource`; returns once its ResourceSlice is published and the kubelet has registered the plugin.
    pub fn start(
        api: &KubeApiServer,
        kubelet: &Kubelet,
        driver: &str,
        resource: &str,
        devices: &[(&str, &str)],
        dir: PathBuf,
    ) -> DraDriver {
        std::fs::create_dir_all(&dir).expect("driver dir");
        let kubeconfig = dir.join("driver.kubeconfig");
        api.write_kubeconfig(&kubeconfig, "admin-token");
        let root = kubelet.root_dir();
        let list: Vec<String> = devices
            .iter()
            .map(|(n, pci)| format!("{n}={pci}"))
            .collect();
        let log = std::fs::File::create(dir.join("dra-driver.log")).expect("driver log");
        let child = Command::new(crate::parts::bin("dra-driver"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--node-name={NODE}"))
            .arg(format!("--driver-name={driver}"))
            .arg(format!("--resource-name={resource}"))
            .arg(format!("--devices={}", list.join(",")))
            .arg(format!(
                "--registrar-dir={}",
                root.join("plugins_registry").display()
            ))
            .arg(format!(
                "--plugin-dir={}",
                root.join("plugins").join(driver).display()
            ))
            .arg(format!("--record={}", dir.join("calls").display()))
            .arg(format!("--network-data-request={DRIVER_OWNED_REQUEST}"))
            .arg(format!(
                "--shared-devices={}={}",
                SHARED_DEVICE.0, SHARED_DEVICE.1
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start the DRA driver (tests/parts.sh builds it)");
        let d = DraDriver { child, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let slices = api.must("GET", "/apis/resource.k8s.io/v1/resourceslices", None);
            let published = slices["items"].as_array().into_iter().flatten().any(|s| {
                s["spec"]["driver"] == driver
                    && s["spec"]["nodeName"] == NODE
                    && s["spec"]["devices"].as_array().map(Vec::len) == Some(devices.len() + 1)
            });
            let registered = std::fs::read_to_string(d.dir.join("dra-driver.log"))
                .unwrap_or_default()
                .contains("registered with the kubelet");
            if published && registered {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "the DRA driver's slice ({published}) and registration ({registered}) not within 60 s:\n{}\nkubelet:\n{}",
                d.log(),
                kubelet.log_tail(30)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Each prepare and unprepare call so far: `prepare NS/NAME UID request=pool/device ...`,
    /// `unprepare NS/NAME UID`.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The driver's log, for failure messages.
    pub fn log(&self) -> String {
        crate::tail(&self.dir.join("dra-driver.log"), 30)
    }
}

/// The devices of `claim` (its `status.allocation.devices.results`): (request, device).
pub fn allocated(claim: &Value) -> Vec<(String, String)> {
    claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["request"].as_str().unwrap_or_default().to_string(),
                r["device"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

impl Drop for DraDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
