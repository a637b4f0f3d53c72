//! The control plane's controllers beside the API server, from the same build (`tests/parts.sh`): the
//! kube-controller-manager with the controllers a test names (the garbage collector for what a Node's deletion takes
//! with it, the resourceclaim controller for claims made from templates) and the kube-scheduler (which allocates
//! ResourceClaims as it binds a pod). Each logs to a file of the test's directory and is killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::kubeapi::KubeApiServer;

/// A running control-plane process.
pub struct Component {
    child: Child,
}

impl Component {
    /// The process's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn spawn(name: &str, api: &KubeApiServer, dir: &Path, args: &[String]) -> Component {
        let kubeconfig = dir.join(format!("{name}.kubeconfig"));
        api.write_kubeconfig(&kubeconfig, "admin-token");
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new(crate::parts::bin(name))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--leader-elect=false", "--secure-port=0", "--v=1"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Component { child }
    }

    /// kube-controller-manager running `controllers` only (its names, e.g. `garbage-collector-controller`) against
    /// `api` as admin, logging to `dir/kube-controller-manager.log`.
    pub fn controller_manager(api: &KubeApiServer, dir: &Path, controllers: &[&str]) -> Component {
        Component::spawn(
            "kube-controller-manager",
            api,
            dir,
            &[
                format!("--controllers={}", controllers.join(",")),
                "--use-service-account-credentials=false".to_string(),
            ],
        )
    }

    /// The garbage collector alone.
    pub fn garbage_collector(api: &KubeApiServer, dir: &Path) -> Component {
        Component::controller_manager(api, dir, &["garbage-collector-controller"])
    }

    /// kube-scheduler against `api` as admin, logging to `dir/kube-scheduler.log`.
    pub fn scheduler(api: &KubeApiServer, dir: &Path) -> Component {
        Component::spawn("kube-scheduler", api, dir, &[])
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
