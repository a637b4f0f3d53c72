//! The integration suite: every area's tests in one binary, a module each, over the one harness
//! (`plexus_tests`, tests/util). Run one area with `cargo test --release --test suite AREA::`.

mod cli;
mod compat;
mod conformance;
mod critest;
mod daemon;
mod deploy_manifests;
mod device_info;
mod dra;
mod e2e_containerd;
mod e2e_daemonset;
mod e2e_hooks;
mod e2e_kubelet;
mod e2e_libcni;
mod e2e_netns;
mod hook_agent;
mod hook_processes;
mod image;
mod install;
mod kube_cluster;
mod libcni_driver;
mod node_authority;
mod operator_cli;
mod robustness;
mod runtime;
mod teardown;
