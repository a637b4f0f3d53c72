//! The attachment cache: the full plan of a pod's attachments, persisted before the first delegate runs.
//!
//! DEL and CHECK run from it, so they work when the pod, a NAD or the API server is gone. One JSON file per
//! container under `cacheDir/attachments/`, written atomically (temp file, rename) and reached only through a
//! cap-std directory handle. [`AttachmentCache::store`] also syncs (the file, and the directory when the name is
//! new); the per-attachment [`AttachmentCache::update`]s of an ADD do not, because on a busy disk every sync costs
//! milliseconds of the pod's wait.

use std::io::Write;
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use plexus_core::spec::PodRef;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::PlexusError;

const FORMAT: u32 = 1;

/// Everything needed to repeat an operation on each attachment of one container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentPlan {
    pub format: u32,
    pub container_id: String,
    pub netns: Option<String>,
    /// The cniVersion the runtime asked for.
    pub cni_version: String,
    pub pod: Option<PodRef>,
    pub attachments: Vec<Attachment>,
}

impl AttachmentPlan {
    pub fn new(
        container_id: &str,
        netns: Option<&str>,
        cni_version: &str,
        pod: Option<PodRef>,
    ) -> Self {
        Self {
            format: FORMAT,
            container_id: container_id.into(),
            netns: netns.map(Into::into),
            cni_version: cni_version.into(),
            pod,
            attachments: Vec::new(),
        }
    }
}

/// One network attachment: the unique [container, network, ifname] tuple (spec 4.2.1) and how to run it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// The status name: `namespace/name` of the NAD, or the cluster network's name.
    pub network: String,
    pub ifname: String,
    /// The cluster-wide default network (spec 6).
    pub is_default: bool,
    /// The delegate configuration list, normalized (name and cniVersion at list level).
    pub config: Value,
    /// Capability arguments offered to the list's plugins as runtimeConfig.
    pub capability_args: Map<String, Value>,
    /// The selection element this attachment came from (spec JSON form), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<Value>,
    /// The list's ADD result, once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// The cache directory.
#[derive(Debug)]
pub struct AttachmentCache {
    root: PathBuf,
    dir: Dir,
}

impl AttachmentCache {
    pub fn open(cache_dir: &Path) -> Result<Self, PlexusError> {
        let root = cache_dir.join("attachments");
        std::fs::create_dir_all(&root).map_err(|source| PlexusError::Io {
            path: root.display().to_string(),
            source,
        })?;
        let dir = Dir::open_ambient_dir(&root, ambient_authority()).map_err(|source| {
            PlexusError::Io {
                path: root.display().to_string(),
                source,
            }
        })?;
        Ok(Self { root, dir })
    }

    fn file_name(container_id: &str) -> String {
        format!("{container_id}.json")
    }

    pub fn path_of(&self, container_id: &str) -> PathBuf {
        self.root.join(Self::file_name(container_id))
    }

    /// The plan for `container_id`; `None` when there is none. A corrupt file is an error naming it.
    pub fn load(&self, container_id: &str) -> Result<Option<AttachmentPlan>, PlexusError> {
        let name = Self::file_name(container_id);
        let bytes = match self.dir.read(&name) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(PlexusError::Io {
                    path: self.path_of(container_id).display().to_string(),
                    source,
                })
            }
        };
        let plan: AttachmentPlan = serde_json::from_slice(&bytes).map_err(|e| {
            PlexusError::Decode(format!(
                "corrupt attachment cache file {}: {e}",
                self.path_of(container_id).display()
            ))
        })?;
        if plan.format != FORMAT || plan.container_id != container_id {
            return Err(PlexusError::Decode(format!(
                "attachment cache file {} is for container {:?} in format {}, expected {:?} in format {FORMAT}",
                self.path_of(container_id).display(),
                plan.container_id,
                plan.format,
                container_id
            )));
        }
        Ok(Some(plan))
    }

    /// Writes the plan atomically and durably: readers see the old or the new file, never a torn one. After a
    /// crash the file is there, holding this plan or (when this replaced a plan stored before) that one.
    pub fn store(&self, plan: &AttachmentPlan) -> Result<(), PlexusError> {
        self.write(plan, true)
    }

    /// Writes the plan atomically without waiting for the disk: for recording results between two
    /// [`store`](Self::store)s of one ADD. A crash may lose the update (the plan synced before stays), and
    /// on filesystems that do not flush data before a replacing rename (ext4 does) may leave an empty file.
    pub fn update(&self, plan: &AttachmentPlan) -> Result<(), PlexusError> {
        self.write(plan, false)
    }

    fn write(&self, plan: &AttachmentPlan, durable: bool) -> Result<(), PlexusError> {
        let name = Self::file_name(&plan.container_id);
        let tmp = format!(".{name}.{}.tmp", std::process::id());
        let bytes =
            serde_json::to_vec_pretty(plan).map_err(|e| PlexusError::Decode(e.to_string()))?;
        let write = || -> std::io::Result<()> {
            // Only a new name needs the directory synced: a lost replacement leaves the synced plan before it.
            let sync_dir = durable && !self.dir.exists(&name);
            let mut f = self.dir.create(&tmp)?;
            f.write_all(&bytes)?;
            if durable {
                f.sync_all()?;
            }
            self.dir.rename(&tmp, &self.dir, &name)?;
            if sync_dir {
                // Make the new name itself durable.
                self.dir.open(".")?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|source| {
            let _ = self.dir.remove_file(&tmp);
            PlexusError::Io {
                path: self.path_of(&plan.container_id).display().to_string(),
                source,
            }
        })
    }

    pub fn remove(&self, container_id: &str) -> Result<(), PlexusError> {
        match self.dir.remove_file(Self::file_name(container_id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(PlexusError::Io {
                path: self.path_of(container_id).display().to_string(),
                source,
            }),
        }
    }

    /// The container ids that have a plan (for GC).
    pub fn container_ids(&self) -> Result<Vec<String>, PlexusError> {
        let io = |source| PlexusError::Io {
            path: self.root.display().to_string(),
            source,
        };
        let mut ids = Vec::new();
        for entry in self.dir.entries().map_err(io)? {
            let name = entry
                .map_err(io)?
                .file_name()
                .to_string_lossy()
                .into_owned();
            if let Some(id) = name.strip_suffix(".json") {
                if !name.starts_with('.') {
                    ids.push(id.to_string());
                }
            }
        }
        ids.sort();
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> AttachmentPlan {
        let mut p = AttachmentPlan::new("c1", Some("/run/netns/x"), "1.0.0", None);
        p.attachments.push(Attachment {
            network: "cluster".into(),
            ifname: "eth0".into(),
            is_default: true,
            config: serde_json::json!({"cniVersion":"1.0.0","name":"cluster","plugins":[{"type":"bridge"}]}),
            capability_args: Map::new(),
            selection: None,
            result: None,
        });
        p
    }

    #[test]
    fn round_trip_remove_and_list() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = AttachmentCache::open(tmp.path()).unwrap();
        assert_eq!(cache.load("c1").unwrap(), None);
        cache.store(&plan()).unwrap();
        assert_eq!(cache.load("c1").unwrap(), Some(plan()));
        let mut updated = plan();
        updated.attachments[0].result = Some(serde_json::json!({"cniVersion": "1.0.0"}));
        cache.update(&updated).unwrap();
        assert_eq!(cache.load("c1").unwrap(), Some(updated));
        assert_eq!(cache.container_ids().unwrap(), vec!["c1".to_string()]);
        cache.remove("c1").unwrap();
        cache.remove("c1").unwrap();
        assert_eq!(cache.load("c1").unwrap(), None);
        assert!(
            std::fs::read_dir(tmp.path().join("attachments"))
                .unwrap()
                .next()
                .is_none(),
            "nothing left"
        );
    }

    #[test]
    fn corrupt_file_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = AttachmentCache::open(tmp.path()).unwrap();
        std::fs::write(tmp.path().join("attachments/c1.json"), "{ not json").unwrap();
        let err = cache.load("c1").unwrap_err().to_string();
        assert!(
            err.contains("attachments/c1.json") && err.contains("corrupt"),
            "{err}"
        );
    }

    #[test]
    fn a_plan_for_another_container_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = AttachmentCache::open(tmp.path()).unwrap();
        cache.store(&plan()).unwrap();
        std::fs::rename(
            tmp.path().join("attachments/c1.json"),
            tmp.path().join("attachments/c2.json"),
        )
        .unwrap();
        assert!(cache.load("c2").is_err());
    }
}
