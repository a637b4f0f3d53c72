//! The attachment cache: the full plan of a pod's attachments, persisted before the first delegate runs.
//!
//! DEL and CHECK run from it, so they work when the pod, a NAD or the API server is gone. Per container, under
//! `cacheDir/attachments/` (container ids are checked to be one path component, CNI spec section 3):
//!
//! - `<id>.json`, the plan: written once per ADD, before the first delegate runs ([`AttachmentCache::store`]),
//!   atomically: a temp file `.<id>.json.XXXXXX` renamed over the plan. A process killed before the rename
//!   leaves the temp file, which the next GC removes under the container's lock;
//! - `<id>.results`, the results journal: one line `{"index": i, "result": {..}}` appended as each attachment
//!   succeeds, and again for any result the end of the ADD rewrites (default-route moves); the last line for an
//!   index wins ([`Journal::record`]).
//!
//! The plan is never rewritten during an ADD: replacing it after every delegate cost a file replace each (a
//! replacing rename makes the filesystem write the new file out), where an append costs a write. Each record is
//! a single `write` of one line, so a process killed mid-ADD leaves whole lines and at most one torn last line,
//! which [`AttachmentCache::load`] ignores.
//!
//! Nothing here is synced to the disk. What the cache must survive is plexus being killed (the runtime's
//! timeout) or crashing, and the page cache survives both. A power loss also removes every pod network
//! namespace, and the files survive it unless it comes within the kernel's writeback delay (seconds) after the
//! write; syncing the plan (file and directory) cost 0.3-0.6 ms of every ADD here and 1.3 ms on another ext4
//! machine (docs/benchmarks.md), and libcni's result cache and Multus's cache are not synced either. For the
//! power-loss case: an empty plan file (a name that reached the disk before its data) counts as no plan, so DEL
//! re-plans from the cluster instead of failing.

use std::io::Write;
use std::path::{Path, PathBuf};

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use plexus_core::cni::NetworkConfigList;
use plexus_core::spec::{PodRef, Selection};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::PlexusError;

const FORMAT: u32 = 1;

/// The most bytes of a plan or a results journal the cache reads (a plan of many attachments with their results
/// is tens of KiB).
const FILE_CAP: usize = 16 << 20;

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
    /// What the runtime gave the ADD that made the plan (absent in plans of earlier versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeContext>,
}

/// What the runtime gave the ADD that made a plan, kept so that the node daemon can change the sandbox's
/// attachments later (networks that follow the annotation) with the conf and delegate environment that ADD had.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeContext {
    /// The plexus configuration the runtime passed on stdin.
    pub conf: Value,
    /// `CNI_IFNAME`, `CNI_ARGS` and `CNI_PATH` as the runtime set them.
    pub ifname: String,
    pub args: String,
    pub cni_path: String,
    /// The pod's `k8s.v1.cni.cncf.io/networks` annotation the plan's selections were made from (`None`: the
    /// pod had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networks: Option<String>,
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
            runtime: None,
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
    /// The delegate configuration list (cached in its `.conflist` form).
    #[serde(with = "conflist")]
    pub config: NetworkConfigList,
    /// Capability arguments offered to the list's plugins as runtimeConfig.
    pub capability_args: Map<String, Value>,
    /// The selection element this attachment came from (cached in the spec's JSON form), if any.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "selection")]
    pub selection: Option<Selection>,
    /// The device-plugin device this attachment uses, if its NAD names a resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Device>,
    /// The list's ADD result, once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Attached by the runtime itself, not by Plexus (the cluster network in the node daemon's NRI mode): its
    /// result is recorded for the status, and Plexus runs none of its delegates, for ADD or CHECK, nor for DEL
    /// while the runtime's own CNI runs the cluster network (a DEL in CNI mode, on a node moved back from NRI
    /// mode, deletes it: the runtime calls only Plexus then).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub external: bool,
}

/// A device allocated to the pod (by a device plugin, or through one of its ResourceClaims), as one attachment
/// uses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The resource (`k8s.v1.cni.cncf.io/resourceName` of the NAD), e.g. `intel.com/sriov_netdevice`; empty for
    /// the device of a network a claim asks for without one.
    pub resource: String,
    /// The device ID kubelet or the device's ResourceSlice reported (a PCI address for SR-IOV); empty when a
    /// claim's device has none (no `deviceID` is passed then).
    pub id: String,
    /// The claim the device came from (Dynamic Resource Allocation); none for a device plugin's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<plexus_core::spec::dra::ClaimDevice>,
}

impl Device {
    /// A claim's device used for `resource` (a NAD's resourceName, else the device's own, else none): its ID is
    /// the slice's `deviceID` attribute, empty without one.
    pub fn of_claim(
        resource: Option<String>,
        claim: plexus_core::spec::dra::ClaimDevice,
    ) -> Device {
        Device {
            resource: resource
                .or_else(|| claim.resource_name.clone())
                .unwrap_or_default(),
            id: claim.device_id.clone().unwrap_or_default(),
            claim: Some(claim),
        }
    }
}

/// A configuration list in the cache: its `.conflist` object, parsed back by the CNI rules.
mod conflist {
    use plexus_core::cni::NetworkConfigList;
    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(list: &NetworkConfigList, s: S) -> Result<S::Ok, S::Error> {
        list.to_value().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<NetworkConfigList, D::Error> {
        NetworkConfigList::parse(&Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// A selection in the cache: the spec's element form, which always names the namespace.
mod selection {
    use plexus_core::spec::Selection;
    use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(sel: &Option<Selection>, s: S) -> Result<S::Ok, S::Error> {
        sel.as_ref().map(Selection::to_json).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Selection>, D::Error> {
        Option::<Value>::deserialize(d)?
            .map(|v| Selection::from_json(&v, "", 0).map_err(D::Error::custom))
            .transpose()
    }
}

/// The CNI capability carrying the device-info file path (Device Information Specification 5.1).
pub const DEVICE_INFO_CAPABILITY: &str = "CNIDeviceInfoFile";

impl Attachment {
    /// The device-info file of this attachment, if its list asked for one.
    pub fn device_info_file(&self) -> Option<&str> {
        self.capability_args.get(DEVICE_INFO_CAPABILITY)?.as_str()
    }

    /// The gateways of the attachment's `default-route` (4.1.2.1.9), if its selection asked for it.
    pub fn default_route(&self) -> Option<Vec<std::net::IpAddr>> {
        self.selection.as_ref()?.default_route.clone()
    }
}

/// The cache directory.
#[derive(Debug)]
pub struct AttachmentCache {
    root: PathBuf,
    dir: Dir,
}

impl AttachmentCache {
    /// The cache of `cache_dir` when it has one, without creating anything: what DEL needs, which must work on a
    /// read-only or wiped disk.
    pub fn open_existing(cache_dir: &Path) -> Result<Option<Self>, PlexusError> {
        let root = cache_dir.join("attachments");
        match Dir::open_ambient_dir(&root, ambient_authority()) {
            Ok(dir) => Ok(Some(Self { root, dir })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(PlexusError::Io {
                path: root.display().to_string(),
                source,
            }),
        }
    }

    pub fn open(cache_dir: &Path) -> Result<Self, PlexusError> {
        let root = cache_dir.join("attachments");
        let io = |source| PlexusError::Io {
            path: root.display().to_string(),
            source,
        };
        // Root's alone whatever the runtime's umask: the node daemon acts on plans only from such a cache.
        {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&root)
                .map_err(io)?;
        }
        // Made just above; gone again only if something removed it meanwhile.
        Self::open_existing(cache_dir)?.ok_or_else(|| io(std::io::ErrorKind::NotFound.into()))
    }

    fn file_name(container_id: &str) -> String {
        format!("{container_id}.json")
    }

    fn journal_name(container_id: &str) -> String {
        format!("{container_id}.results")
    }

    /// The temp file a plan is written under before its rename. One name per container (its writes are
    /// serialized by the container's lock), so the DEL that follows a `kill -9` inside [`Self::store`] removes
    /// what the killed process left; it also names its container, so GC knows whose lock to take.
    fn temp_name(container_id: &str) -> String {
        format!(".{container_id}.json.tmp")
    }

    /// A file of the cache, at most [`FILE_CAP`] bytes: a larger one is an `InvalidData` error naming the limit.
    /// The node daemon reads every plan at each check, so a runaway file is refused, not read whole.
    fn read_capped(&self, name: &str) -> std::io::Result<Vec<u8>> {
        crate::conf::read_to_cap(self.dir.open(name)?, FILE_CAP)
    }

    pub fn path_of(&self, container_id: &str) -> PathBuf {
        self.root.join(Self::file_name(container_id))
    }

    /// The plan for `container_id`; `None` when there is none. A corrupt file is an error naming it.
    pub fn load(&self, container_id: &str) -> Result<Option<AttachmentPlan>, PlexusError> {
        let name = Self::file_name(container_id);
        let bytes = match self.read_capped(&name) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(PlexusError::Io {
                    path: self.path_of(container_id).display().to_string(),
                    source,
                })
            }
        };
        if bytes.is_empty() {
            // Written atomically, so only a power loss right after an ADD leaves an empty file (see the module docs).
            tracing::warn!(file = %self.path_of(container_id).display(), "empty attachment cache file (its data did not reach the disk): treated as no plan");
            return Ok(None);
        }
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
        let mut plan = plan;
        self.apply_journal(&mut plan)?;
        Ok(Some(plan))
    }

    /// Applies the results journal of `plan`'s container, if there is one.
    fn apply_journal(&self, plan: &mut AttachmentPlan) -> Result<(), PlexusError> {
        let name = Self::journal_name(&plan.container_id);
        let path = || self.root.join(&name).display().to_string();
        let bytes = match self.read_capped(&name) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => {
                return Err(PlexusError::Io {
                    path: path(),
                    source,
                })
            }
        };
        // Only whole lines count: a process killed inside its last append leaves a torn tail.
        let whole = match bytes.iter().rposition(|b| *b == b'\n') {
            Some(end) => &bytes[..=end],
            None => &[][..],
        };
        for (n, line) in whole.split(|b| *b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let rec: Record = serde_json::from_slice(line).map_err(|e| {
                PlexusError::Decode(format!(
                    "corrupt attachment results journal {} at line {}: {e}",
                    path(),
                    n + 1
                ))
            })?;
            let count = plan.attachments.len();
            let att = plan.attachments.get_mut(rec.index).ok_or_else(|| {
                PlexusError::Decode(format!(
                    "attachment results journal {} line {} names attachment {} of a plan with {count}",
                    path(),
                    n + 1,
                    rec.index
                ))
            })?;
            att.result = Some(rec.result);
        }
        Ok(())
    }

    /// The results journal of `container_id`'s ADD; the file is created by the first record.
    pub fn journal(&self, container_id: &str) -> Journal<'_> {
        Journal {
            cache: self,
            container_id: container_id.to_string(),
            file: None,
        }
    }

    /// Writes the plan (with any results it holds) atomically, and drops any results journal left beside an
    /// earlier plan: readers see the old plan or the new one, never a torn one.
    pub fn store(&self, plan: &AttachmentPlan) -> Result<(), PlexusError> {
        let bytes = serde_json::to_vec_pretty(plan).map_err(PlexusError::from)?;
        let path = self.path_of(&plan.container_id);
        let write = || -> std::io::Result<()> {
            match self.dir.remove_file(Self::journal_name(&plan.container_id)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let tmp = Self::temp_name(&plan.container_id);
            let written = (|| {
                let mut opts = cap_std::fs::OpenOptions::new();
                opts.write(true).create(true).truncate(true);
                // root's alone, whatever the runtime's umask: a plan holds NAD configs, addresses and MACs.
                cap_std::fs::OpenOptionsExt::mode(&mut opts, 0o600);
                let mut f = self.dir.open_with(&tmp, &opts)?;
                f.write_all(&bytes)?;
                drop(f);
                self.dir
                    .rename(&tmp, &self.dir, Self::file_name(&plan.container_id))
            })();
            if written.is_err() {
                let _ = self.dir.remove_file(&tmp);
            }
            written
        };
        write().map_err(|source| PlexusError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Removes the plan and its results journal (the journal first: a crash in between leaves a plan that
    /// DEL can still run from, never results without a plan), and a temp file a killed ADD left.
    pub fn remove(&self, container_id: &str) -> Result<(), PlexusError> {
        for name in [
            Self::temp_name(container_id),
            Self::journal_name(container_id),
            Self::file_name(container_id),
        ] {
            self.remove_if_present(&name)?;
        }
        Ok(())
    }

    /// Removes `name` from the cache directory; a name that is not there is fine.
    fn remove_if_present(&self, name: &str) -> Result<(), PlexusError> {
        match self.dir.remove_file(name) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(PlexusError::Io {
                path: self.root.join(name).display().to_string(),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// The names in the cache directory, sorted.
    fn names(&self) -> Result<Vec<String>, PlexusError> {
        let io = |source| PlexusError::Io {
            path: self.root.display().to_string(),
            source,
        };
        let mut names = Vec::new();
        for entry in self.dir.entries().map_err(io)? {
            names.push(
                entry
                    .map_err(io)?
                    .file_name()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        names.sort();
        Ok(names)
    }

    /// The container ids that have a plan (for GC).
    pub fn container_ids(&self) -> Result<Vec<String>, PlexusError> {
        Ok(self
            .names()?
            .into_iter()
            .filter(|name| !name.starts_with('.'))
            .filter_map(|name| name.strip_suffix(".json").map(str::to_string))
            .collect())
    }

    /// Temp files of plans that were never renamed, with the container each belongs to, for GC: a process
    /// killed inside [`AttachmentCache::store`] between writing its temp file and the rename (`.<id>.json.tmp`),
    /// and the names earlier versions used (`.<id>.json.XXXXXX`, `.<id>.json.<pid>.tmp`).
    pub fn temp_files(&self) -> Result<Vec<(String, String)>, PlexusError> {
        Ok(self
            .names()?
            .into_iter()
            .filter_map(|name| {
                let id = name.strip_prefix('.')?.split_once(".json.")?.0.to_string();
                Some((id, name))
            })
            .collect())
    }

    /// Removes one file found by [`AttachmentCache::temp_files`]; the caller holds the container's lock.
    pub fn remove_temp(&self, name: &str) -> Result<(), PlexusError> {
        self.remove_if_present(name)
    }
}

/// One line of the results journal, as read.
#[derive(Deserialize)]
struct Record {
    index: usize,
    result: Value,
}

/// One line of the results journal, as written (borrowing the result).
#[derive(Serialize)]
struct RecordRef<'a> {
    index: usize,
    result: &'a Value,
}

/// Appends the results of one container's ADD to its journal (see the module docs).
#[derive(Debug)]
pub struct Journal<'a> {
    cache: &'a AttachmentCache,
    container_id: String,
    file: Option<cap_std::fs::File>,
}

impl Journal<'_> {
    /// Records `result` as the result of attachment `index`, in one append.
    pub fn record(&mut self, index: usize, result: &Value) -> Result<(), PlexusError> {
        let mut line =
            serde_json::to_vec(&RecordRef { index, result }).map_err(PlexusError::from)?;
        line.push(b'\n');
        let name = AttachmentCache::journal_name(&self.container_id);
        let cache = self.cache;
        let append = |file: &mut Option<cap_std::fs::File>| -> std::io::Result<()> {
            if file.is_none() {
                let mut opts = cap_std::fs::OpenOptions::new();
                opts.append(true).create(true);
                // As the plan it completes.
                cap_std::fs::OpenOptionsExt::mode(&mut opts, 0o600);
                *file = Some(cache.dir.open_with(&name, &opts)?);
            }
            // One write per record: whole lines or a torn last one, never interleaved pieces.
            let n = file.as_mut().expect("opened above").write(&line)?;
            if n != line.len() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    format!("short append ({n} of {} bytes)", line.len()),
                ));
            }
            Ok(())
        };
        append(&mut self.file).map_err(|source| PlexusError::Io {
            path: cache.root.join(&name).display().to_string(),
            source,
        })
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
            config: NetworkConfigList::parse(&serde_json::json!(
                {"cniVersion":"1.0.0","name":"cluster","plugins":[{"type":"bridge"}]}
            ))
            .unwrap(),
            capability_args: Map::new(),
            selection: None,
            device: None,
            result: None,
            external: false,
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
        cache
            .journal("c1")
            .record(0, updated.attachments[0].result.as_ref().unwrap())
            .unwrap();
        assert_eq!(cache.load("c1").unwrap(), Some(updated));
        // The plan and its journal hold NAD configs and addresses: root's alone, whatever the umask.
        for file in std::fs::read_dir(tmp.path().join("attachments")).unwrap() {
            use std::os::unix::fs::PermissionsExt as _;
            let file = file.unwrap();
            let mode = file.metadata().unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", file.path().display());
        }
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

    fn two_attachments() -> AttachmentPlan {
        let mut p = plan();
        let mut second = p.attachments[0].clone();
        second.network = "ns/net1".into();
        second.ifname = "net1".into();
        second.is_default = false;
        p.attachments.push(second);
        p
    }

    #[test]
    fn journal_records_apply_in_order_and_the_last_for_an_index_wins() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = AttachmentCache::open(tmp.path()).unwrap();
        cache.store(&two_attachments()).unwrap();
        let mut j = cache.journal("c1");
        j.record(0, &serde_json::json!({"n": "first"})).unwrap();
        j.record(1, &serde_json::json!({"n": "second"})).unwrap();
        j.record(0, &serde_json::json!({"n": "rewritten"})).unwrap();
        let got = cache.load("c1").unwrap().unwrap();
        assert_eq!(
            got.attachments[0].result,
            Some(serde_json::json!({"n": "rewritten"}))
        );
        assert_eq!(
            got.attachments[1].result,
            Some(serde_json::json!({"n": "second"}))
        );
        // The plan file itself was written once, without results.
        let raw: AttachmentPlan =
            serde_json::from_slice(&std::fs::read(cache.path_of("c1")).unwrap()).unwrap();
        assert_eq!(raw, two_attachments());
        // A new plan for the same container starts without the old results.
        cache.store(&two_attachments()).unwrap();
        assert_eq!(cache.load("c1").unwrap(), Some(two_attachments()));
    }

    #[test]
    fn a_torn_last_record_is_ignored_and_a_corrupt_whole_one_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = AttachmentCache::open(tmp.path()).unwrap();
        cache.store(&two_attachments()).unwrap();
        cache
            .journal("c1")
            .record(0, &serde_json::json!({"n": 1}))
            .unwrap();
        let journal = tmp.path().join("attachments/c1.results");
        // A process killed inside its second append.
        let mut bytes = std::fs::read(&journal).unwrap();
        bytes.extend_from_slice(br#"{"index":1,"result":{"n""#);
        std::fs::write(&journal, &bytes).unwrap();
        let got = cache.load("c1").unwrap().unwrap();
        assert_eq!(got.attachments[0].result, Some(serde_json::json!({"n": 1})));
        assert_eq!(got.attachments[1].result, None);
        // A whole line that is not a record, or names an attachment the plan lacks, is corruption.
        for bad in ["not json\n", "{\"index\":7,\"result\":{}}\n"] {
            std::fs::write(&journal, bad).unwrap();
            let err = cache.load("c1").unwrap_err().to_string();
            assert!(
                err.contains("attachments/c1.results") && err.contains("line 1"),
                "{err}"
            );
        }
        cache.remove("c1").unwrap();
        assert!(!journal.exists() && !cache.path_of("c1").exists());
    }

    #[test]
    fn store_leaves_no_temp_file_and_gc_finds_any_a_killed_store_left() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = AttachmentCache::open(tmp.path()).unwrap();
        let dir = tmp.path().join("attachments");
        // A process killed between writing the temp file and renaming it.
        std::fs::write(dir.join(".c1.json.tmp"), "{").unwrap();
        // An earlier version's per-process name.
        std::fs::write(dir.join(".c2.json.4242.tmp"), "{").unwrap();
        // Killed between naming the unnamed temp file and the rename.
        std::fs::write(dir.join(".c3.json.Xy12Zq"), "{").unwrap();
        assert_eq!(cache.load("c1").unwrap(), None);
        assert_eq!(
            cache.temp_files().unwrap(),
            vec![
                ("c1".to_string(), ".c1.json.tmp".to_string()),
                ("c2".to_string(), ".c2.json.4242.tmp".to_string()),
                ("c3".to_string(), ".c3.json.Xy12Zq".to_string())
            ]
        );
        cache.remove("c1").unwrap();
        cache.remove_temp(".c2.json.4242.tmp").unwrap();
        cache.remove_temp(".c3.json.Xy12Zq").unwrap();
        assert!(std::fs::read_dir(&dir).unwrap().next().is_none());
        cache.store(&plan()).unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["c1.json"]);
        cache.remove("c1").unwrap();
        // open_existing creates nothing.
        let other = tempfile::tempdir().unwrap();
        assert!(AttachmentCache::open_existing(other.path())
            .unwrap()
            .is_none());
        assert!(!other.path().join("attachments").exists());
        assert!(AttachmentCache::open_existing(tmp.path())
            .unwrap()
            .is_some());
    }

    #[test]
    fn an_empty_plan_file_counts_as_no_plan() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = AttachmentCache::open(tmp.path()).unwrap();
        std::fs::write(tmp.path().join("attachments/c1.json"), "").unwrap();
        assert_eq!(cache.load("c1").unwrap(), None);
        cache.store(&plan()).unwrap();
        assert_eq!(cache.load("c1").unwrap(), Some(plan()));
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
    fn a_plan_larger_than_the_cap_is_refused_unread() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = AttachmentCache::open(tmp.path()).unwrap();
        // Sparse: the size is past the cap without writing it.
        let f = std::fs::File::create(tmp.path().join("attachments/c1.json")).unwrap();
        f.set_len(FILE_CAP as u64 + 1).unwrap();
        let err = cache.load("c1").unwrap_err().to_string();
        assert!(
            err.contains("attachments/c1.json") && err.contains("larger than 16777216 bytes"),
            "{err}"
        );
        // At the cap it is read (and here found corrupt: zeros are no JSON).
        f.set_len(FILE_CAP as u64).unwrap();
        let err = cache.load("c1").unwrap_err().to_string();
        assert!(err.contains("corrupt"), "{err}");
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
