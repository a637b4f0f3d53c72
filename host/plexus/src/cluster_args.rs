//! How a person's command finds the cluster: kubectl's flags (`--kubeconfig`, `--context`) and rules
//! (`KUBECONFIG`, `~/.kube/config`, the in-cluster service account). The node's processes (`plexus daemon`, the
//! CNI plugin) do not use this: they take an explicit kubeconfig or run in-cluster.

use std::path::PathBuf;

use plexus_cluster::{ClusterError, ConfigSource, KubeApi, KubeSettings, KubectlSelection};

/// Shown under each command that uses [`ClusterArgs`].
pub const CLUSTER_HELP: &str = "\
The cluster is found as kubectl finds it: --kubeconfig, else the files KUBECONFIG lists (merged; a file that
does not exist is skipped), else ~/.kube/config, else the in-cluster service account. --context picks a
context of that kubeconfig (default: its current-context).";

/// `--kubeconfig` and `--context`, for commands run from a person's shell.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// The kubeconfig file [default: KUBECONFIG, else ~/.kube/config, else in-cluster]
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use [default: the current-context]
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl ClusterArgs {
    /// The client, and where its configuration came from (for messages).
    pub async fn connect(&self) -> Result<(KubeApi, ConfigSource), ClusterError> {
        let selection = KubectlSelection {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        };
        // A person waits at the prompt: a server that is not there fails within seconds, as kubectl does.
        let settings = KubeSettings {
            retries: 2,
            ..KubeSettings::default()
        };
        KubeApi::connect_as_kubectl(settings, &selection).await
    }
}
