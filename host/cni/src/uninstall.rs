//! `plexus install --uninstall`: takes Plexus's conf off a node, in both binaries.
//!
//! It lives outside `install` because the node has only the CNI plugin (`plexus-cni`, installed as
//! `/opt/cni/bin/plexus`): the documented uninstall step runs that binary, which has no installer. It removes
//! exactly what the installer wrote into the conf dir, the conflist (only when it is Plexus's own) and the
//! service-account kubeconfig, and nothing else: the binary stays, because pods attached while Plexus was
//! installed still need it for their DEL.

use std::path::{Path, PathBuf};

/// The file Plexus's conf is installed as; `00-` sorts it before the cluster network's own conf.
pub const CONFLIST_NAME: &str = "00-plexus.conflist";
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// Where the kubeconfig goes, relative to the conf dir, unless `--kubeconfig-out` says otherwise.
pub const KUBECONFIG_IN_CONF_DIR: &str = "plexus.d/plexus.kubeconfig";
/// A conflist is read up to this size to tell whether it is Plexus's.
const MAX_CONFLIST_BYTES: usize = 1 << 20;

/// What went wrong uninstalling.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file at the conflist's name that Plexus did not write: left alone.
    #[error("{}: not a plexus conflist ({reason}); left in place", path.display())]
    NotOurs { path: PathBuf, reason: String },
}

/// Where uninstall looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UninstallOptions {
    pub conf_dir: PathBuf,
    pub kubeconfig_out: PathBuf,
}

impl Default for UninstallOptions {
    fn default() -> Self {
        UninstallOptions {
            conf_dir: DEFAULT_CONF_DIR.into(),
            kubeconfig_out: Path::new(DEFAULT_CONF_DIR).join(KUBECONFIG_IN_CONF_DIR),
        }
    }
}

/// Where uninstall looks, on the command line: `plexus install` flattens it, and the CNI-only binary's
/// `install --uninstall` takes it alone.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct UninstallArgs {
    /// The CNI conf dir, where 00-plexus.conflist goes
    #[arg(long, value_name = "DIR", default_value = DEFAULT_CONF_DIR)]
    pub conf_dir: PathBuf,
    /// Where the service-account kubeconfig goes [default: <conf-dir>/plexus.d/plexus.kubeconfig]
    #[arg(long, value_name = "FILE")]
    pub kubeconfig_out: Option<PathBuf>,
}

impl UninstallArgs {
    pub fn options(&self) -> UninstallOptions {
        UninstallOptions {
            kubeconfig_out: self
                .kubeconfig_out
                .clone()
                .unwrap_or_else(|| self.conf_dir.join(KUBECONFIG_IN_CONF_DIR)),
            conf_dir: self.conf_dir.clone(),
        }
    }
}

/// Whether a conflist's text is Plexus's: its first plugin has `"type": "plexus"`.
fn is_plexus_conflist(bytes: &[u8]) -> Result<(), String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    match v["plugins"][0]["type"].as_str() {
        Some("plexus") => Ok(()),
        Some(other) => Err(format!("its first plugin is {other:?}")),
        None => Err("no plugins[0].type".into()),
    }
}

/// Removes the conflist (when it is Plexus's) and the kubeconfig; returns what was there. A missing file is
/// not an error, so uninstalling twice is fine.
pub fn uninstall(conf_dir: &Path, kubeconfig_out: &Path) -> Result<Vec<PathBuf>, UninstallError> {
    let conflist = conf_dir.join(CONFLIST_NAME);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| UninstallError::Io { path, source }
    };
    match crate::conf::read_capped(&conflist, MAX_CONFLIST_BYTES) {
        Ok(bytes) => is_plexus_conflist(&bytes).map_err(|reason| UninstallError::NotOurs {
            path: conflist.clone(),
            reason,
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&conflist)(e)),
    }
    let mut removed = Vec::new();
    for path in [conflist, kubeconfig_out.to_path_buf()] {
        match std::fs::remove_file(&path) {
            Ok(()) => removed.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path)(e)),
        }
    }
    Ok(removed)
}

/// `install --uninstall` as a command: prints what it removed; the exit code.
pub fn main(opts: &UninstallOptions) -> u8 {
    match uninstall(&opts.conf_dir, &opts.kubeconfig_out) {
        Ok(removed) => {
            for path in &removed {
                eprintln!("plexus install: removed {}", path.display());
            }
            if removed.is_empty() {
                eprintln!(
                    "plexus install: nothing to remove in {}",
                    opts.conf_dir.display()
                );
            }
            0
        }
        Err(e) => {
            eprintln!("plexus install: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: UninstallArgs,
    }

    fn parse(a: &[&str]) -> Result<UninstallOptions, clap::Error> {
        use clap::Parser;
        Cli::try_parse_from(std::iter::once("uninstall").chain(a.iter().copied()))
            .map(|c| c.args.options())
    }

    #[test]
    fn the_kubeconfig_follows_the_conf_dir() {
        assert_eq!(parse(&[]).unwrap(), UninstallOptions::default());
        let o = parse(&["--conf-dir=/host/net.d"]).unwrap();
        assert_eq!(
            o.kubeconfig_out,
            Path::new("/host/net.d/plexus.d/plexus.kubeconfig")
        );
        let o = parse(&["--conf-dir", "/c", "--kubeconfig-out", "/k"]).unwrap();
        assert_eq!(
            (o.conf_dir.as_path(), o.kubeconfig_out.as_path()),
            (Path::new("/c"), Path::new("/k"))
        );
        let e = parse(&["--conf-dir"]).unwrap_err().to_string();
        assert!(e.contains("--conf-dir <DIR>"), "{e}");
    }

    #[test]
    fn removes_the_plexus_conflist_and_kubeconfig_only() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path();
        std::fs::create_dir_all(conf.join("plexus.d")).unwrap();
        std::fs::write(
            conf.join(CONFLIST_NAME),
            r#"{"cniVersion":"1.0.0","name":"plexus","plugins":[{"type":"plexus"}]}"#,
        )
        .unwrap();
        std::fs::write(conf.join(KUBECONFIG_IN_CONF_DIR), "k").unwrap();
        std::fs::write(conf.join("10-cluster.conflist"), "{}").unwrap();
        let kubeconfig = conf.join(KUBECONFIG_IN_CONF_DIR);
        let removed = uninstall(conf, &kubeconfig).unwrap();
        assert_eq!(removed, vec![conf.join(CONFLIST_NAME), kubeconfig.clone()]);
        assert!(conf.join("10-cluster.conflist").exists());
        // Twice is fine.
        assert!(uninstall(conf, &kubeconfig).unwrap().is_empty());
    }

    #[test]
    fn a_conflist_plexus_did_not_write_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path();
        let kubeconfig = conf.join("k");
        std::fs::write(&kubeconfig, "k").unwrap();
        std::fs::write(
            conf.join(CONFLIST_NAME),
            r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        let e = uninstall(conf, &kubeconfig).unwrap_err().to_string();
        assert!(
            e.contains("not a plexus conflist") && e.contains("bridge"),
            "{e}"
        );
        assert!(conf.join(CONFLIST_NAME).exists() && kubeconfig.exists());
    }
}
