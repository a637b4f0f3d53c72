//! A real kube-controller-manager (1.20.2, from the same build as the API server) running only its garbage
//! collector, for the tests of what a Node's deletion takes with it (objects whose ownerReferences name it).

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::kubeapi::KubeApiServer;

pub struct ControllerManager {
    child: Child,
}

impl ControllerManager {
    /// Starts the garbage collector against `api` (admin credentials written into `dir`), logging to
    /// `dir/kube-controller-manager.log`. No leader election, no serving port.
    pub fn garbage_collector(api: &KubeApiServer, dir: &Path) -> ControllerManager {
        let kubeconfig = dir.join("kcm.kubeconfig");
        api.write_kubeconfig(&kubeconfig, "admin-token");
        let log = std::fs::File::create(dir.join("kube-controller-manager.log")).unwrap();
        let child = Command::new(crate::kubelet::kube_bin("kube-controller-manager"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                "--controllers=garbagecollector",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--port=0",
                "--secure-port=0",
                "--v=1",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start kube-controller-manager (tests/kubernetes.sh builds it)");
        ControllerManager { child }
    }
}

impl Drop for ControllerManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
