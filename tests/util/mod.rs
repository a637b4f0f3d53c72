//! The one integration-test harness (see design.md, Style 7).

pub mod apiserver;
pub mod containerd;
pub mod cri;
pub mod kubeapi;
pub mod kubelet;
pub mod libcni;
pub mod netns;
pub mod plexus;
pub mod podresources;
pub mod registry;
