//! The integration suite: every area's tests in one binary, over the one harness (`plexus_tests`, tests/util),
//! grouped by what a test starts besides plexus (tests/README.md). Run one group or area with
//! `cargo test --release -p plexus-tests --test suite -- GROUP::` or `-- GROUP::AREA::`.

/// The real binaries with recording fake delegates, the reference plugins in network namespaces, the in-process
/// API server emulator and PodResources stand-in, the libcni driver: no cluster part runs.
mod pure {
    mod cli;
    mod compat;
    mod conformance;
    mod deploy_manifests;
    mod device_info;
    mod e2e_hooks;
    mod e2e_libcni;
    mod e2e_netns;
    mod hook_processes;
    mod install;
    mod kube_cluster;
    mod libcni_driver;
    mod robustness;
    mod runtime;
    mod teardown;
}

/// A real kube-apiserver over etcd (`plexus_tests::kubeapi`), some with the controllers beside it or an OCI registry.
mod kubeapi {
    mod compat;
    mod daemon;
    mod dra;
    mod hook_agent;
    mod node_authority;
    mod operator_cli;
}

/// A node: a private container runtime (containerd or CRI-O, each test on both), driven through CRI or by a real
/// kubelet (then with a real API server).
mod node {
    mod critest;
    mod e2e_cri;
    mod e2e_daemonset;
    mod e2e_kubelet;
    mod image;
    mod nri;
    mod restarts;
}
