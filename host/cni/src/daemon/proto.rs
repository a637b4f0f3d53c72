//! The node daemon's wire protocol: JSON requests, each answered in turn on the same connection, every message
//! a single line.
//!
//! An answer is either authoritative (the object, or an error the thin path would also have met) or says that
//! the daemon cannot serve now (`unsynced`, `busy`); the CNI process then plans without it.

use std::io::{BufRead, Read, Write};

use plexus_cluster::{CacheHealth, ClusterError};
use plexus_core::spec::dra::{ClaimName, DeviceNetworkData, PodClaims};
use plexus_core::spec::{NetworkAttachmentDefinition, Pod, PodRef};
use serde::{Deserialize, Serialize};

/// The largest request the daemon reads (a status write carries the network-status list).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// The largest answer the CNI process reads (a pod or a NAD; the API responses they come from share the bound).
pub const MAX_ANSWER_BYTES: usize = plexus_cluster::MAX_RESPONSE_BYTES;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// The pod, for an ADD (with what its claims give its networks where the daemon can tell).
    Pod {
        pod: PodRef,
        /// How long the CNI process waits for this answer: the daemon answers before then with what it has, rather
        /// than let an API read of what it had not cached run past it (absent: [`crate::conf::DAEMON_TIMEOUT_MS`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        within_ms: Option<u64>,
    },
    Nad {
        namespace: String,
        name: String,
        /// As for [`Request::Pod`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        within_ms: Option<u64>,
    },
    /// Write the network-status annotation value; answered once accepted, sent by the daemon with retries.
    Status {
        pod: PodRef,
        network_status: String,
    },
    /// Post an event on the pod; answered at once, posted best effort.
    Event {
        pod: PodRef,
        warning: bool,
        reason: String,
        message: String,
    },
    Health,
    /// What the pod's ResourceClaims give its networks: sent by CNI processes of the version before the pod's
    /// answer carried them (the daemon answers from the pod it has; `claimNames` is not read).
    Claims {
        pod: PodRef,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        claim_names: Vec<String>,
    },
    /// Write Plexus's entries of a claim's `status.devices[]` (all of them; none takes them back); answered once
    /// accepted, sent by the daemon with retries.
    ClaimStatus {
        pod: PodRef,
        claim: ClaimName,
        devices: Vec<DeviceNetworkData>,
    },
    /// What one CNI invocation did, for the daemon's metrics. Sent after the runtime has its answer and never
    /// waited for: the CNI process reads no answer.
    Report {
        report: Report,
    },
}

/// One CNI invocation as the daemon's metrics count it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// `ADD`, `DEL`, `CHECK`, `GC` or `STATUS`.
    pub command: String,
    /// `success`, or the CNI error code the invocation answered with.
    pub result: String,
    /// From the process's start to its answer.
    pub seconds: f64,
    /// Every delegate plugin it ran, in order.
    #[serde(default)]
    pub delegates: Vec<DelegateCall>,
    /// Every hook call it made, in order.
    #[serde(default)]
    pub hooks: Vec<HookCall>,
}

/// One hook call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookCall {
    pub hook: String,
    /// `policy`, `resolver` or `status`.
    pub kind: String,
    /// `allow`, `deny`, `error` or `timeout`.
    pub outcome: String,
}

/// One delegate plugin execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DelegateCall {
    /// The plugin's type (its executable's name).
    pub plugin: String,
    pub command: String,
    /// `success`, the CNI error code the plugin answered with, `timeout` (killed at `delegateTimeoutMs`),
    /// `overflow` (killed for printing too much) or `error` (it did not start, or exited without a CNI error).
    pub result: String,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "camelCase")]
pub enum Answer {
    /// The pod, with what its ResourceClaims give its networks where the daemon can tell (one round trip).
    Pod {
        pod: Pod,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        claims: Option<PodClaims>,
    },
    Nad {
        nad: NetworkAttachmentDefinition,
    },
    Claims {
        claims: PodClaims,
    },
    Done,
    Health(DaemonHealth),
    /// The request failed the way it would have without the daemon.
    Failed {
        error: ClusterError,
    },
    /// The daemon cannot answer from its caches now: they have not completed their first list, or the object was
    /// not cached and the API server did not give it in time.
    Unsynced,
    /// The daemon is at its concurrency bound.
    Busy,
}

/// What `plexus daemon` reports about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonHealth {
    pub node: String,
    #[serde(flatten)]
    pub cache: CacheHealth,
    /// Requests being served now, and the bound.
    pub in_flight: usize,
    pub max_in_flight: usize,
    /// Requests answered `busy` since start.
    pub shed: u64,
    /// Reads the daemon made from the API because its cache could not answer (pods not yet seen, NADs missing).
    pub api_reads: u64,
    /// Network-status writes sent, and those accepted and not yet sent.
    pub status_writes: u64,
    pub pending_writes: usize,
    /// Each NetworkHook's state on this node, as the node agent last knew it (absent from older daemons).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookHealth>,
    /// Why the node agent cannot decide which NetworkHooks this node runs, while it cannot (its Node object
    /// is missing or unreadable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_agent_waiting: Option<String>,
    /// Why the node's authority is not enforced, when the daemon's self-check found the API server admitting a
    /// write the node-authority admission policy must refuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority_not_enforced: Option<String>,
}

/// One NetworkHook's state on the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookHealth {
    /// The NetworkHook's name.
    pub name: String,
    pub active: bool,
    /// `Active`, or why not (`PullFailed`, `SignatureInvalid`, ...).
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

impl DaemonHealth {
    pub fn new(node: &str, cache: CacheHealth) -> DaemonHealth {
        DaemonHealth {
            node: node.into(),
            cache,
            in_flight: 0,
            max_in_flight: 0,
            shed: 0,
            api_reads: 0,
            status_writes: 0,
            pending_writes: 0,
            hooks: Vec::new(),
            hook_agent_waiting: None,
            authority_not_enforced: None,
        }
    }

    pub fn synced(&self) -> bool {
        self.cache.pods_synced && self.cache.nads_synced
    }

    /// Why the daemon should not be sent new ADDs now, if it should not: caches not synced, or every slot taken.
    pub fn unready(&self) -> Option<String> {
        if !self.synced() {
            return Some(format!(
                "the node daemon has not synced its caches yet (pods: {}, NADs: {}; watch errors: {})",
                if self.cache.pods_synced { "listed" } else { "not listed" },
                if self.cache.nads_synced { "listed" } else { "not listed" },
                self.cache.watch_errors
            ));
        }
        if self.max_in_flight > 0 && self.in_flight >= self.max_in_flight {
            return Some(format!(
                "the node daemon is at its concurrency bound ({} requests in flight)",
                self.in_flight
            ));
        }
        None
    }
}

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("message longer than {0} bytes")]
    TooLong(usize),
    #[error("connection closed before a complete message")]
    Truncated,
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Reads one line-terminated JSON message of at most `cap` bytes (from a buffered reader, so that a connection
/// can carry several).
pub fn read_message<T: serde::de::DeserializeOwned>(
    reader: &mut impl BufRead,
    cap: usize,
) -> Result<T, ReadError> {
    let mut line = Vec::new();
    reader.take(cap as u64 + 1).read_until(b'\n', &mut line)?;
    decode_line(&line, cap)?.ok_or(ReadError::Truncated)
}

/// The message in `line`, as read up to a newline with at most `cap + 1` bytes: `None` for an empty read (the
/// peer closed the connection between messages).
pub fn decode_line<T: serde::de::DeserializeOwned>(
    line: &[u8],
    cap: usize,
) -> Result<Option<T>, ReadError> {
    if line.is_empty() {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(if line.len() > cap {
            ReadError::TooLong(cap)
        } else {
            ReadError::Truncated
        });
    }
    Ok(Some(serde_json::from_slice(line)?))
}

/// One message as a single line (serde_json never puts a raw newline inside a document).
pub fn encode<T: Serialize>(message: &T) -> std::io::Result<Vec<u8>> {
    let mut bytes = serde_json::to_vec(message).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Writes one message as a single line.
pub fn write_message<T: Serialize>(mut writer: impl Write, message: &T) -> std::io::Result<()> {
    writer.write_all(&encode(message)?)?;
    writer.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use plexus_cluster::ObjectKind;

    #[test]
    fn messages_round_trip_as_one_line() {
        let req = Request::Status {
            pod: PodRef {
                namespace: "ns".into(),
                name: "p".into(),
                uid: Some("u".into()),
            },
            network_status: "[\n{\"name\":\"x\"}]".into(),
        };
        let mut buf = Vec::new();
        write_message(&mut buf, &req).unwrap();
        assert_eq!(buf.iter().filter(|b| **b == b'\n').count(), 1);
        let back: Request = read_message(&mut &buf[..], MAX_REQUEST_BYTES).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn one_connection_carries_messages_one_after_another() {
        let mut buf = Vec::new();
        write_message(&mut buf, &Request::Health).unwrap();
        let nad = Request::Nad {
            namespace: "ns".into(),
            name: "n".into(),
            within_ms: Some(1500),
        };
        write_message(&mut buf, &nad).unwrap();
        let mut reader = std::io::BufReader::new(&buf[..]);
        assert_eq!(
            read_message::<Request>(&mut reader, 100).unwrap(),
            Request::Health
        );
        assert_eq!(read_message::<Request>(&mut reader, 100).unwrap(), nad);
        assert!(matches!(
            read_message::<Request>(&mut reader, 100),
            Err(ReadError::Truncated)
        ));
    }

    /// A request of a CNI process from before `within_ms` reads as one without it, and a daemon from before reads
    /// a new one (it ignores fields it does not know).
    #[test]
    fn a_request_without_its_wait_reads_as_before() {
        let old = br#"{"op":"pod","pod":{"namespace":"ns","name":"p"}}"#;
        let read: Request = serde_json::from_slice(old).unwrap();
        assert!(
            matches!(
                read,
                Request::Pod {
                    within_ms: None,
                    ..
                }
            ),
            "{read:?}"
        );
        let new = serde_json::to_value(Request::Pod {
            pod: PodRef {
                namespace: "ns".into(),
                name: "p".into(),
                uid: None,
            },
            within_ms: Some(2000),
        })
        .unwrap();
        assert_eq!(new["within_ms"], 2000);
        #[derive(Deserialize)]
        #[serde(tag = "op", rename_all = "camelCase")]
        enum Before {
            Pod { pod: PodRef },
        }
        let Before::Pod { pod } = serde_json::from_value(new).unwrap();
        assert_eq!(pod.name, "p");
    }

    #[test]
    fn reads_are_bounded_and_complete() {
        let long = format!("{{\"op\":\"health\",\"pad\":\"{}\"}}\n", "x".repeat(100));
        let err = read_message::<Request>(&mut long.as_bytes(), 50).unwrap_err();
        assert!(matches!(err, ReadError::TooLong(50)), "{err}");
        let err = read_message::<Request>(&mut &b"{\"op\":\"health\"}"[..], 50).unwrap_err();
        assert!(matches!(err, ReadError::Truncated), "{err}");
        let err = read_message::<Request>(&mut &b"{\"op\":\"drop\"}\n"[..], 50).unwrap_err();
        assert!(matches!(err, ReadError::Malformed(_)), "{err}");
    }

    #[test]
    fn errors_keep_their_meaning_across_the_wire() {
        for e in [
            ClusterError::NotFound {
                object: ObjectKind::NetworkAttachmentDefinition,
                namespace: "a".into(),
                name: "b".into(),
            },
            ClusterError::UidMismatch {
                pod: "a/b".into(),
                expected: "1".into(),
                actual: "2".into(),
            },
            ClusterError::forbidden("no"),
            ClusterError::unavailable("down"),
            ClusterError::Invalid {
                what: "w".into(),
                reason: "r".into(),
            },
        ] {
            let line = serde_json::to_string(&Answer::Failed { error: e.clone() }).unwrap();
            let back: Answer = serde_json::from_str(&line).unwrap();
            assert_eq!(back, Answer::Failed { error: e.clone() });
        }
        // The wire form is pinned: a CNI process and a daemon of neighbouring versions meet during an upgrade.
        let line = serde_json::to_value(Answer::Failed {
            error: ClusterError::NotFound {
                object: ObjectKind::NetworkAttachmentDefinition,
                namespace: "a".into(),
                name: "b".into(),
            },
        })
        .unwrap();
        assert_eq!(
            line,
            serde_json::json!({"answer": "failed", "error": {"kind": "notFound",
                "object": "NetworkAttachmentDefinition", "namespace": "a", "name": "b"}})
        );
        let back: Answer = serde_json::from_str(
            r#"{"answer":"failed","error":{"kind":"unavailable","message":"down"}}"#,
        )
        .unwrap();
        assert_eq!(
            back,
            Answer::Failed {
                error: ClusterError::unavailable("down")
            }
        );
    }
}
