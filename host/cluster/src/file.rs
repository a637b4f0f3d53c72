//! FileCluster: pods and NetworkAttachmentDefinitions read from a directory of Kubernetes manifests.
//!
//! Every `.yaml`, `.yml` and `.json` file directly in the directory is read (multi-document YAML and
//! `kind: List` are understood); objects of other kinds are skipped. The network-status annotation value
//! is written to `status/<namespace>/<pod>.json` below the same directory, atomically.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, PodRef};
use serde::Deserialize;
use serde_json::Value;

use crate::{Cluster, ClusterError, ObjectKind};

const NAD_API_GROUP: &str = "k8s.cni.cncf.io/";

/// A cluster source backed by a directory of manifests.
#[derive(Debug)]
pub struct FileCluster {
    root: PathBuf,
    dir: Dir,
    /// Every object of the directory, read on first use: one invocation looks up the pod and each NAD, and
    /// must not re-read and re-parse every manifest for each of them.
    objects: std::sync::OnceLock<Vec<(String, Value)>>,
}

#[derive(Deserialize)]
struct Meta {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

impl FileCluster {
    /// Opens the manifest directory. It must exist; nothing is read until a lookup.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, ClusterError> {
        let root = root.as_ref().to_path_buf();
        let dir = Dir::open_ambient_dir(&root, ambient_authority())
            .map_err(|e| ClusterError::io(root.display().to_string(), &e))?;
        Ok(Self {
            root,
            dir,
            objects: std::sync::OnceLock::new(),
        })
    }

    fn io_err(&self, rel: &str, source: std::io::Error) -> ClusterError {
        ClusterError::io(self.root.join(rel).display().to_string(), &source)
    }

    /// Every object in every manifest file, in file-name order, with the file it came from.
    fn objects(&self) -> Result<&[(String, Value)], ClusterError> {
        if let Some(objects) = self.objects.get() {
            return Ok(objects);
        }
        let read = self.read_objects()?;
        Ok(self.objects.get_or_init(|| read))
    }

    fn read_objects(&self) -> Result<Vec<(String, Value)>, ClusterError> {
        let mut names = Vec::new();
        for entry in self.dir.entries().map_err(|e| self.io_err(".", e))? {
            let entry = entry.map_err(|e| self.io_err(".", e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_manifest = [".yaml", ".yml", ".json"]
                .iter()
                .any(|ext| name.ends_with(ext));
            if is_manifest
                && entry
                    .file_type()
                    .map_err(|e| self.io_err(&name, e))?
                    .is_file()
            {
                names.push(name);
            }
        }
        names.sort();
        let mut out = Vec::new();
        for name in names {
            let text = self.read_manifest(&name)?;
            for doc in parse_documents(&text, name.ends_with(".json")).map_err(|reason| {
                ClusterError::Invalid {
                    what: format!("manifest {}", self.root.join(&name).display()),
                    reason,
                }
            })? {
                flatten_list(doc, &mut |obj| out.push((name.clone(), obj)));
            }
        }
        Ok(out)
    }

    /// One manifest's text, at most [`MAX_MANIFEST_BYTES`].
    fn read_manifest(&self, name: &str) -> Result<String, ClusterError> {
        use std::io::Read;
        let invalid = |reason: String| ClusterError::Invalid {
            what: format!("manifest {}", self.root.join(name).display()),
            reason,
        };
        let file = self.dir.open(name).map_err(|e| self.io_err(name, e))?;
        let mut text = String::new();
        file.take(MAX_MANIFEST_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| self.io_err(name, e))?;
        if text.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(invalid(format!("larger than {MAX_MANIFEST_BYTES} bytes")));
        }
        Ok(text)
    }

    fn find(
        &self,
        kind: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Option<(String, Value, Meta)>, ClusterError> {
        for (file, obj) in self.objects()? {
            if obj.get("kind").and_then(Value::as_str) != Some(kind) {
                continue;
            }
            let meta =
                Meta::deserialize(obj.get("metadata").unwrap_or(&Value::Null)).map_err(|e| {
                    ClusterError::Invalid {
                        what: format!("{kind} metadata in {}", self.root.join(file).display()),
                        reason: e.to_string(),
                    }
                })?;
            let ns = meta.namespace.as_deref().unwrap_or("default");
            if ns == namespace && meta.name == name {
                return Ok(Some((file.clone(), obj.clone(), meta)));
            }
        }
        Ok(None)
    }
}

/// The largest manifest file read.
pub const MAX_MANIFEST_BYTES: u64 = 8 << 20;

/// The deepest nesting a manifest may have (Kubernetes objects need about ten levels).
pub const MAX_NESTING: usize = 64;

/// The YAML parser's budget, with its depth at [`MAX_NESTING`]: a document nested deeper is refused as the parser
/// reaches that depth, before its cost (which grows with the square of the depth) does. JSON files are bounded by
/// serde_json's own recursion limit (128).
fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_NESTING;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// The YAML parser's error in words; a breach of its depth budget as the limit it is.
fn yaml_error(error: &serde_saphyr::Error) -> String {
    use serde_saphyr::budget::BudgetBreach;
    let mut inner = error;
    loop {
        match inner {
            serde_saphyr::Error::WithSnippet { error, .. }
            | serde_saphyr::Error::AliasError { error, .. } => inner = error,
            serde_saphyr::Error::Budget {
                breach: BudgetBreach::Depth { .. },
                ..
            } => {
                return format!("nested deeper than {MAX_NESTING} levels, the most a manifest may")
            }
            _ => return error.to_string(),
        }
    }
}

/// The documents of one manifest file. A `.json` file is read with the JSON parser (several times faster than
/// the YAML one, and this runs on every CNI call); one it rejects gets the YAML parser and its error.
fn parse_documents(text: &str, json: bool) -> Result<Vec<Value>, String> {
    if json {
        if let Ok(value) = serde_json::from_str::<Value>(text) {
            return Ok(if value.is_null() { vec![] } else { vec![value] });
        }
    }
    let docs: Vec<Value> = serde_saphyr::from_multiple_with_options(text, yaml_options())
        .map_err(|e| yaml_error(&e))?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

fn flatten_list(obj: Value, sink: &mut dyn FnMut(Value)) {
    if obj.get("kind").and_then(Value::as_str) == Some("List") {
        if let Some(Value::Array(items)) = obj.get("items") {
            for item in items.clone() {
                flatten_list(item, sink);
            }
        }
        return;
    }
    sink(obj);
}

impl Cluster for FileCluster {
    fn pod(&self, pod: &PodRef) -> Result<Pod, ClusterError> {
        let Some((_, _, meta)) = self.find("Pod", &pod.namespace, &pod.name)? else {
            return Err(ClusterError::NotFound {
                object: ObjectKind::Pod,
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
            });
        };
        if let (Some(expected), Some(actual)) = (&pod.uid, &meta.uid) {
            if expected != actual {
                return Err(ClusterError::UidMismatch {
                    pod: pod.to_string(),
                    expected: expected.clone(),
                    actual: actual.clone(),
                });
            }
        }
        Ok(Pod {
            namespace: pod.namespace.clone(),
            name: meta.name,
            uid: meta.uid,
            labels: meta.labels,
            annotations: meta.annotations,
            ..Pod::default()
        })
    }

    fn nad(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<NetworkAttachmentDefinition, ClusterError> {
        let Some((file, obj, meta)) = self.find("NetworkAttachmentDefinition", namespace, name)?
        else {
            return Err(ClusterError::NotFound {
                object: ObjectKind::NetworkAttachmentDefinition,
                namespace: namespace.into(),
                name: name.into(),
            });
        };
        let api = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !api.starts_with(NAD_API_GROUP) {
            return Err(ClusterError::Invalid {
                what: format!(
                    "NetworkAttachmentDefinition {namespace}/{name} in {}",
                    self.root.join(file).display()
                ),
                reason: format!("apiVersion {api:?} is not in group k8s.cni.cncf.io"),
            });
        }
        let config = match obj.pointer("/spec/config") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.trim().is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(ClusterError::Invalid {
                    what: format!("NetworkAttachmentDefinition {namespace}/{name}"),
                    reason: format!("spec.config must be a string, found {other}"),
                })
            }
        };
        Ok(NetworkAttachmentDefinition {
            namespace: namespace.into(),
            name: name.into(),
            config,
            annotations: meta.annotations,
        })
    }

    /// Replaces the status file atomically: a reader sees the previous status or the new one, whole.
    fn write_status(&self, pod: &PodRef, network_status: &str) -> Result<(), ClusterError> {
        // Names become path components below the directory, and nothing may climb out of it.
        for part in [&pod.namespace, &pod.name] {
            if part.is_empty() || part.contains('/') || part.starts_with('.') {
                return Err(ClusterError::Invalid {
                    what: format!("pod {pod}"),
                    reason: format!("{part:?} cannot name a status file"),
                });
            }
        }
        let ns_dir = format!("status/{}", pod.namespace);
        self.dir
            .create_dir_all(&ns_dir)
            .map_err(|e| self.io_err(&ns_dir, e))?;
        let rel = format!("{ns_dir}/{}.json", pod.name);
        // Not synced: this is the development source, and the next ADD writes the status again.
        let write = || -> std::io::Result<()> {
            let mut f = tempfile::Builder::new()
                .prefix(".status.")
                .tempfile_in(self.root.join(&ns_dir))?;
            f.write_all(network_status.as_bytes())?;
            f.write_all(b"\n")?;
            f.persist(self.root.join(&rel))
                .map(drop)
                .map_err(|e| e.error)
        };
        write().map_err(|e| self.io_err(&rel, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(files: &[(&str, &str)]) -> (tempfile::TempDir, FileCluster) {
        let tmp = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(tmp.path().join(name), text).unwrap();
        }
        let c = FileCluster::open(tmp.path()).unwrap();
        (tmp, c)
    }

    const MANIFESTS: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: team-a
  uid: "1111"
  labels: {app: web}
  annotations:
    k8s.v1.cni.cncf.io/networks: net-a
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: net-a
  namespace: team-a
spec:
  config: '{"cniVersion":"1.0.0","type":"bridge"}'
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata:
  name: bare
"#;

    #[test]
    fn reads_pod_and_nads_from_multi_document_yaml() {
        let (_t, c) = cluster(&[("all.yaml", MANIFESTS)]);
        let pod = c
            .pod(&PodRef {
                namespace: "team-a".into(),
                name: "web".into(),
                uid: None,
            })
            .unwrap();
        assert_eq!(pod.networks_annotation(), Some("net-a"));
        assert_eq!(pod.labels["app"], "web");
        assert_eq!(pod.uid.as_deref(), Some("1111"));
        let nad = c.nad("team-a", "net-a").unwrap();
        assert!(nad.config.unwrap().contains("bridge"));
        // No namespace in metadata means "default"; no spec means no config (spec 3.2.4).
        assert_eq!(c.nad("default", "bare").unwrap().config, None);
    }

    #[test]
    fn missing_objects_name_namespace_and_name() {
        let (_t, c) = cluster(&[("all.yaml", MANIFESTS)]);
        let err = c.nad("team-b", "net-a").unwrap_err();
        assert_eq!(
            err.to_string(),
            "NetworkAttachmentDefinition team-b/net-a not found"
        );
        let err = c
            .pod(&PodRef {
                namespace: "team-a".into(),
                name: "nope".into(),
                uid: None,
            })
            .unwrap_err();
        assert_eq!(err.to_string(), "pod team-a/nope not found");
    }

    #[test]
    fn uid_mismatch_is_an_error() {
        let (_t, c) = cluster(&[("all.yaml", MANIFESTS)]);
        let err = c.pod(&PodRef {
            namespace: "team-a".into(),
            name: "web".into(),
            uid: Some("2222".into()),
        });
        assert!(matches!(err, Err(ClusterError::UidMismatch { .. })));
    }

    #[test]
    fn json_list_and_broken_yaml() {
        let list = r#"{"kind":"List","items":[{"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition","metadata":{"name":"x","namespace":"n"},"spec":{"config":"{}"}}]}"#;
        let (_t, c) = cluster(&[("list.json", list)]);
        assert_eq!(c.nad("n", "x").unwrap().config.as_deref(), Some("{}"));
        let (_t2, c2) = cluster(&[("bad.yaml", "kind: [unclosed")]);
        let err = c2.nad("n", "x").unwrap_err().to_string();
        assert!(err.contains("bad.yaml"), "{err}");
    }

    /// Nested past the YAML parser's depth budget: refused as the parser reaches it, naming the file; within it, or
    /// with brackets only in quotes and comments, read.
    #[test]
    fn deeply_nested_or_oversized_manifests_are_refused() {
        let nested = |levels: usize| {
            let mut block = String::from("kind: Pod\nx:\n");
            for level in 1..=levels {
                block.push_str(&" ".repeat(level));
                block.push_str("a:\n");
            }
            block
        };
        let flow = format!("kind: Pod\nx: {}1{}\n", "[".repeat(5000), "]".repeat(5000));
        let dashes = format!("kind: Pod\nx:\n{}1\n", "- ".repeat(2000));
        for (file, text) in [
            ("flow.yaml", flow),
            ("block.yaml", nested(300)),
            ("just-past.yaml", nested(MAX_NESTING)),
            ("dash.yaml", dashes),
        ] {
            let (_t, c) = cluster(&[(file, text.as_str())]);
            let err = c.nad("ns", "n").unwrap_err().to_string();
            // The parser's own limit on flow collections (255) can come first.
            let deep = err.contains(&format!("nested deeper than {MAX_NESTING} levels"))
                || err.contains("recursion limit exceeded");
            assert!(err.contains(file) && deep, "{err}");
        }
        // Within the budget, and brackets in quotes and comments: read (the NAD is just not there).
        let quoted = format!(
            "kind: Pod\na: \"{}\" # {}\n",
            "[".repeat(500),
            "{".repeat(500)
        );
        for (file, text) in [
            ("within.yaml", nested(MAX_NESTING - 4)),
            ("quoted.yaml", quoted),
        ] {
            let (_t, c) = cluster(&[(file, text.as_str())]);
            assert!(
                matches!(c.nad("ns", "n"), Err(ClusterError::NotFound { .. })),
                "{file}: {:?}",
                c.nad("ns", "n")
            );
        }
        let big = format!("# {}\n", "x".repeat(MAX_MANIFEST_BYTES as usize));
        let (_t, c) = cluster(&[("big.yaml", big.as_str())]);
        let err = c.nad("ns", "n").unwrap_err().to_string();
        assert!(
            err.contains("big.yaml") && err.contains("larger than"),
            "{err}"
        );
    }

    #[test]
    fn nad_with_wrong_api_group_is_rejected() {
        let (_t, c) = cluster(&[(
            "n.yaml",
            "apiVersion: example.com/v1\nkind: NetworkAttachmentDefinition\nmetadata: {name: x}\n",
        )]);
        assert!(c
            .nad("default", "x")
            .unwrap_err()
            .to_string()
            .contains("k8s.cni.cncf.io"));
    }

    #[test]
    fn write_status_lands_in_status_dir() {
        let (t, c) = cluster(&[]);
        let pod = PodRef {
            namespace: "ns".into(),
            name: "p".into(),
            uid: None,
        };
        c.write_status(&pod, r#"[{"name":"x"}]"#).unwrap();
        let text = std::fs::read_to_string(t.path().join("status/ns/p.json")).unwrap();
        assert_eq!(text.trim(), r#"[{"name":"x"}]"#);
        let leftovers: Vec<_> = std::fs::read_dir(t.path().join("status/ns"))
            .unwrap()
            .collect();
        assert_eq!(leftovers.len(), 1, "no temp file left behind");

        for (namespace, name) in [("..", "p"), ("ns", "../../escape"), ("ns", ".hidden")] {
            let pod = PodRef {
                namespace: namespace.into(),
                name: name.into(),
                uid: None,
            };
            let err = c.write_status(&pod, "[]").unwrap_err().to_string();
            assert!(err.contains("cannot name a status file"), "{err}");
        }
        assert!(!t.path().join("escape.json").exists());
    }

    #[test]
    fn the_directory_is_read_once_per_source() {
        let (t, c) = cluster(&[("all.yaml", MANIFESTS)]);
        c.pod(&PodRef {
            namespace: "team-a".into(),
            name: "web".into(),
            uid: None,
        })
        .unwrap();
        // One invocation sees one snapshot: later lookups do not re-read (or re-parse) the manifests.
        std::fs::remove_file(t.path().join("all.yaml")).unwrap();
        assert!(c.nad("team-a", "net-a").is_ok());
        assert!(
            FileCluster::open(t.path())
                .unwrap()
                .nad("team-a", "net-a")
                .is_err(),
            "a new source reads again"
        );
    }
}
