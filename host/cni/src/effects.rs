//! What orchestration does to the world, each effect behind its trait: the bundle the verbs, the planner and
//! teardown share. Its own module, so that those three import it rather than each other.

use plexus_cluster::Cluster;

use crate::exec::Exec;
use crate::hooks::HookRunner;
use crate::podnet::PodNetwork;
use crate::podresources::DeviceSource;

/// Every outside effect orchestration has, behind its trait (a real implementation, and an in-memory fake in the
/// unit tests).
pub struct Effects<'a> {
    pub exec: &'a dyn Exec,
    pub cluster: Option<&'a dyn Cluster>,
    pub podnet: &'a dyn PodNetwork,
    pub hooks: &'a dyn HookRunner,
    /// The devices kubelet allocated to the pod, for NADs that name a device-plugin resource.
    pub devices: &'a dyn DeviceSource,
}
