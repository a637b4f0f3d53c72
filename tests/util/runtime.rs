//! The container runtime of a node test: containerd 2 ([`crate::containerd`]) or CRI-O ([`crate::crio`]). A node
//! test takes a [`RuntimeKind`] and runs the same steps on either; each has one `#[test]` per runtime.

use std::path::{Path, PathBuf};

use crate::containerd::Containerd;
use crate::cri::{Cri, CriError};
use crate::crio::CriO;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeKind {
    Containerd,
    CriO,
}

impl RuntimeKind {
    pub fn name(self) -> &'static str {
        match self {
            RuntimeKind::Containerd => "containerd",
            RuntimeKind::CriO => "cri-o",
        }
    }
}

/// How long a test's runtime waits for an NRI plugin's answer (both default to 2 s). The tests share two cores with
/// API servers, kubelets and builds, where a plugin's ADD can pass 2 s; the plugin then fails the sandbox as late
/// (which is right on a node, and not what those tests are about). The tests of that
/// deadline start their runtime with its default ([`Runtime::start_with_default_nri_timeout`]); the benchmarks
/// use the defaults too.
pub const TEST_NRI_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub enum Runtime {
    Containerd(Containerd),
    CriO(CriO),
}

impl Runtime {
    /// Starts `kind` with `cni_bin` (plexus and the reference plugins) and `cni_conf` as its CNI directories, ready
    /// to run sandboxes (its sandbox image in place).
    pub fn start(kind: RuntimeKind, cni_bin: &Path, cni_conf: &Path) -> Runtime {
        Runtime::start_with(kind, cni_bin, cni_conf, None)
    }

    /// [`Runtime::start`], pulling images from `registry` (`127.0.0.1:PORT`, plain HTTP) too.
    pub fn start_with(
        kind: RuntimeKind,
        cni_bin: &Path,
        cni_conf: &Path,
        registry: Option<&str>,
    ) -> Runtime {
        match kind {
            RuntimeKind::Containerd => {
                Runtime::Containerd(Containerd::start_with(cni_bin, cni_conf, registry))
            }
            RuntimeKind::CriO => Runtime::CriO(CriO::start(
                cni_bin,
                cni_conf,
                registry,
                Some(TEST_NRI_TIMEOUT),
            )),
        }
    }

    /// [`Runtime::start`] with the runtime's own NRI request timeout (2 s in both), for the tests of what happens
    /// at it.
    pub fn start_with_default_nri_timeout(
        kind: RuntimeKind,
        cni_bin: &Path,
        cni_conf: &Path,
    ) -> Runtime {
        match kind {
            RuntimeKind::Containerd => {
                Runtime::Containerd(Containerd::start_nri(cni_bin, cni_conf, None, None))
            }
            RuntimeKind::CriO => Runtime::CriO(CriO::start(cni_bin, cni_conf, None, None)),
        }
    }

    pub fn kind(&self) -> RuntimeKind {
        match self {
            Runtime::Containerd(_) => RuntimeKind::Containerd,
            Runtime::CriO(_) => RuntimeKind::CriO,
        }
    }

    /// The runtime's pid while it runs.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Runtime::Containerd(c) => c.pid(),
            Runtime::CriO(c) => c.pid(),
        }
    }

    /// The CRI socket (kubelet's `containerRuntimeEndpoint`, critest's endpoints).
    pub fn socket(&self) -> PathBuf {
        match self {
            Runtime::Containerd(c) => c.socket(),
            Runtime::CriO(c) => c.socket(),
        }
    }

    /// The runtime's own NRI socket.
    pub fn nri_socket(&self) -> PathBuf {
        match self {
            Runtime::Containerd(c) => c.nri_socket(),
            Runtime::CriO(c) => c.nri_socket(),
        }
    }

    /// The runtime's own log, for failure messages and for what it says about CNI calls.
    pub fn log(&self) -> String {
        match self {
            Runtime::Containerd(c) => c.log(),
            Runtime::CriO(c) => c.log(),
        }
    }

    pub fn cri(&self) -> Cri {
        match self {
            Runtime::Containerd(c) => c.cri(),
            Runtime::CriO(c) => c.cri(),
        }
    }

    /// RunPodSandbox, remembered so that drop removes it if the test does not.
    pub fn run_pod_sandbox(
        &mut self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<String, CriError> {
        match self {
            Runtime::Containerd(c) => c.run_pod_sandbox(namespace, name, uid),
            Runtime::CriO(c) => c.run_pod_sandbox(namespace, name, uid),
        }
    }

    /// kill -9 of the runtime (its shims or conmons and sandboxes live on), then a fresh start on the same state.
    pub fn restart(&self) {
        match self {
            Runtime::Containerd(c) => c.restart(),
            Runtime::CriO(c) => c.restart(),
        }
    }

    /// The node powered off, as far as the runtime goes: it, its shims or conmons and its containers killed, its
    /// state in `/run` gone; its root stays. [`Runtime::power_on`] starts it again.
    pub fn power_off(&self) {
        match self {
            Runtime::Containerd(c) => c.power_off(),
            Runtime::CriO(c) => c.power_off(),
        }
    }

    pub fn power_on(&self) {
        match self {
            Runtime::Containerd(c) => c.power_on(),
            Runtime::CriO(c) => c.power_on(),
        }
    }

    /// Puts the image of an OCI layout tar (named `name` inside) into the runtime's store as `name`.
    pub fn load_image(&self, layout_tar: &Path, name: &str) {
        match self {
            Runtime::Containerd(c) => crate::image::import_as(c, layout_tar, name),
            Runtime::CriO(c) => c.load_image(layout_tar, name),
        }
    }
}

/// For each `name`, a module `name` of two tests, `containerd` and `crio`, calling `name(RuntimeKind::...)`: a node
/// test written once runs on both runtimes (`node::critest::critests_networking_cases::crio`).
#[macro_export]
macro_rules! on_each_runtime {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn containerd() {
                super::$name($crate::runtime::RuntimeKind::Containerd)
            }
            #[test]
            fn crio() {
                super::$name($crate::runtime::RuntimeKind::CriO)
            }
        }
    )*};
}

/// The tests named, each run on containerd only (as `<name>::containerd`): where the suite's time is better spent
/// than on a second runtime (each says where its CRI-O run is).
#[macro_export]
macro_rules! on_containerd {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn containerd() {
                super::$name($crate::runtime::RuntimeKind::Containerd)
            }
        }
    )*};
}
