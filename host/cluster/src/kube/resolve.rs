//! Where an operator's command finds its cluster: kubectl's rules, with kube's own kubeconfig reading, merging
//! and context selection.
//!
//! In order: `--kubeconfig`; else the files `KUBECONFIG` lists (those that exist, merged: the first file to set
//! a value wins); else `~/.kube/config`; else the in-cluster service account. `--context` picks a context of the
//! kubeconfig chosen. The node's processes do not use this: they take an explicit kubeconfig or run in-cluster.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Config;

use super::{error_chain, SERVICE_HOST_ENV};
use crate::ClusterError;

/// What a person's command line says about the cluster (`--kubeconfig`, `--context`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubectlSelection {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
}

/// Where the configuration came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// `--kubeconfig FILE`.
    Flag(PathBuf),
    /// The files of `KUBECONFIG` that exist, in its order.
    Env(Vec<PathBuf>),
    /// `~/.kube/config`.
    Home(PathBuf),
    /// The pod's service account (`KUBERNETES_SERVICE_HOST`, the projected token and CA).
    InCluster,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSource::Flag(p) => write!(f, "kubeconfig {} (--kubeconfig)", p.display()),
            ConfigSource::Env(ps) => {
                let files: Vec<_> = ps.iter().map(|p| p.display().to_string()).collect();
                write!(f, "kubeconfig {} (KUBECONFIG)", files.join(", "))
            }
            ConfigSource::Home(p) => write!(f, "kubeconfig {} (the default)", p.display()),
            ConfigSource::InCluster => f.write_str("the in-cluster service account"),
        }
    }
}

/// The parts of the process's environment the rules read.
#[derive(Debug, Clone, Default)]
pub(crate) struct Environment {
    pub kubeconfig: Option<OsString>,
    pub home: Option<PathBuf>,
    pub in_cluster: bool,
}

impl Environment {
    pub fn of_process() -> Environment {
        Environment {
            kubeconfig: std::env::var_os("KUBECONFIG"),
            // The home directory kube itself uses for ~/.kube/config.
            home: std::env::home_dir(),
            in_cluster: std::env::var_os(SERVICE_HOST_ENV).is_some(),
        }
    }
}

/// Which source the rules pick; when none is there, an error naming each place looked at.
pub(crate) fn choose(
    selection: &KubectlSelection,
    env: &Environment,
) -> Result<ConfigSource, ClusterError> {
    if let Some(path) = &selection.kubeconfig {
        return Ok(ConfigSource::Flag(path.clone()));
    }
    let mut looked = vec!["no --kubeconfig given".to_string()];
    match env.kubeconfig.as_ref().filter(|v| !v.is_empty()) {
        Some(value) => {
            let listed: Vec<PathBuf> = std::env::split_paths(value)
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
            // As kubectl: a listed file that does not exist is skipped.
            let existing: Vec<PathBuf> = listed.iter().filter(|p| p.exists()).cloned().collect();
            if !existing.is_empty() {
                return Ok(ConfigSource::Env(existing));
            }
            looked.push(format!(
                "no file KUBECONFIG lists exists ({})",
                value.to_string_lossy()
            ));
        }
        None => match &env.home {
            Some(home) => {
                let path = home.join(".kube").join("config");
                if path.exists() {
                    return Ok(ConfigSource::Home(path));
                }
                looked.push(format!(
                    "KUBECONFIG is not set, {} does not exist",
                    path.display()
                ));
            }
            None => looked.push("KUBECONFIG is not set and there is no home directory".into()),
        },
    }
    if env.in_cluster {
        return Ok(ConfigSource::InCluster);
    }
    looked.push(format!("not in a pod ({SERVICE_HOST_ENV} is not set)"));
    Err(ClusterError::Invalid {
        what: "cluster settings".into(),
        reason: format!("no cluster found: {}", looked.join("; ")),
    })
}

/// The client configuration of `source`, with `selection`'s context.
pub(crate) async fn load(
    source: &ConfigSource,
    selection: &KubectlSelection,
) -> Result<Config, ClusterError> {
    let invalid = |reason: String| ClusterError::Invalid {
        what: format!("cluster settings from {source}"),
        reason,
    };
    let files = match source {
        ConfigSource::Flag(p) | ConfigSource::Home(p) => std::slice::from_ref(p),
        ConfigSource::Env(ps) => ps.as_slice(),
        ConfigSource::InCluster => {
            if let Some(context) = &selection.context {
                return Err(invalid(format!(
                    "--context {context} needs a kubeconfig, and none was found"
                )));
            }
            return Config::incluster().map_err(|e| invalid(error_chain(&e)));
        }
    };
    let mut merged = Kubeconfig::default();
    for file in files {
        let one = Kubeconfig::read_from(file).map_err(|e| invalid(error_chain(&e)))?;
        merged = merged.merge(one).map_err(|e| invalid(error_chain(&e)))?;
    }
    if let Some(context) = &selection.context {
        if !merged.contexts.iter().any(|c| &c.name == context) {
            let known: Vec<_> = merged.contexts.iter().map(|c| c.name.as_str()).collect();
            return Err(invalid(format!(
                "context {context:?} does not exist (contexts: {})",
                known.join(", ")
            )));
        }
    }
    let options = KubeConfigOptions {
        context: selection.context.clone(),
        ..KubeConfigOptions::default()
    };
    Config::from_custom_kubeconfig(merged, &options)
        .await
        .map_err(|e| invalid(error_chain(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(server: &str, context: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {context}\n  cluster: {{server: \"{server}\"}}\n\
             users:\n- name: {context}\n  user: {{token: t}}\ncontexts:\n- name: {context}\n  context: \
             {{cluster: {context}, user: {context}, namespace: ns-{context}}}\ncurrent-context: {context}\n"
        )
    }

    #[test]
    fn the_flag_wins_then_kubeconfig_then_home_then_in_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".kube")).unwrap();
        std::fs::write(home.join(".kube/config"), kubeconfig("https://h:1", "h")).unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, kubeconfig("https://a:1", "a")).unwrap();
        let env = Environment {
            kubeconfig: Some(
                format!("{}:{}", dir.path().join("gone").display(), a.display()).into(),
            ),
            home: Some(home.clone()),
            in_cluster: true,
        };
        let flag = KubectlSelection {
            kubeconfig: Some("/x".into()),
            ..Default::default()
        };
        assert_eq!(
            choose(&flag, &env).unwrap(),
            ConfigSource::Flag("/x".into())
        );
        let none = KubectlSelection::default();
        assert_eq!(
            choose(&none, &env).unwrap(),
            ConfigSource::Env(vec![a.clone()])
        );
        let env = Environment {
            kubeconfig: None,
            ..env
        };
        assert_eq!(
            choose(&none, &env).unwrap(),
            ConfigSource::Home(home.join(".kube/config"))
        );
        let env = Environment {
            home: Some(dir.path().join("nobody")),
            ..env
        };
        assert_eq!(choose(&none, &env).unwrap(), ConfigSource::InCluster);
    }

    #[test]
    fn nothing_found_names_each_place_looked_at() {
        let dir = tempfile::tempdir().unwrap();
        let env = Environment {
            kubeconfig: Some(dir.path().join("gone").into_os_string()),
            home: Some(dir.path().into()),
            in_cluster: false,
        };
        let err = choose(&KubectlSelection::default(), &env)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no --kubeconfig given"), "{err}");
        assert!(err.contains("no file KUBECONFIG lists exists"), "{err}");
        assert!(err.contains("KUBERNETES_SERVICE_HOST is not set"), "{err}");
        // KUBECONFIG set: the home directory is not looked at (kubectl's rule).
        assert!(!err.contains(".kube"), "{err}");

        let env = Environment {
            kubeconfig: None,
            ..env
        };
        let err = choose(&KubectlSelection::default(), &env)
            .unwrap_err()
            .to_string();
        assert!(err.contains(".kube/config does not exist"), "{err}");
    }

    #[tokio::test]
    async fn files_merge_first_wins_and_a_context_is_picked() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, kubeconfig("https://a:1", "a")).unwrap();
        std::fs::write(&b, kubeconfig("https://b:2", "b")).unwrap();
        let source = ConfigSource::Env(vec![a, b]);
        let current = load(&source, &KubectlSelection::default()).await.unwrap();
        assert_eq!(current.cluster_url.to_string(), "https://a:1/");
        let picked = KubectlSelection {
            context: Some("b".into()),
            ..Default::default()
        };
        let second = load(&source, &picked).await.unwrap();
        assert_eq!(second.cluster_url.to_string(), "https://b:2/");
        assert_eq!(second.default_namespace, "ns-b");

        let unknown = KubectlSelection {
            context: Some("c".into()),
            ..Default::default()
        };
        let err = load(&source, &unknown).await.unwrap_err().to_string();
        assert!(
            err.contains(r#"context "c" does not exist (contexts: a, b)"#),
            "{err}"
        );
        assert!(err.contains("(KUBECONFIG)"), "{err}");
    }

    #[tokio::test]
    async fn a_broken_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad");
        std::fs::write(&bad, "clusters: [oops").unwrap();
        let err = load(
            &ConfigSource::Flag(bad.clone()),
            &KubectlSelection::default(),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(err.contains(&bad.display().to_string()), "{err}");
        assert!(err.contains("--kubeconfig"), "{err}");
    }
}
