//! `plexus status [--json]`: what this node has, from the node alone: the daemon's health and sync state (over
//! its socket), the hooks (the node's published hook set, with each NetworkHook's state from the daemon),
//! the network-status writes kept and not yet sent, and every sandbox in the attachment cache with its
//! interfaces. It never asks the API server, so it answers while the API is down, which is when it is needed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plexus_cni::cache::AttachmentCache;
use plexus_cni::daemon::proto::{Answer, DaemonHealth, Request};
use plexus_cni::hooks::HookSet;
use serde::Serialize;
use serde_json::Value;

/// `plexus status`'s flags.
#[derive(Debug, Clone, clap::Args)]
#[command(
    about = "Show what this node has: the daemon's health, the hooks, pending status writes, every sandbox's \
             interfaces",
    long_about = "Reads the node's own files (the attachment cache, the hook set, the status queue) and asks the \
                  node daemon over its socket; never the API server. Run it on the node, or with kubectl exec in \
                  the DaemonSet's pod."
)]
pub struct StatusArgs {
    /// Print one JSON document instead of text
    #[arg(long)]
    pub json: bool,
    /// The daemon's socket (its directory holds the status queue unless --status-queue-dir says otherwise)
    #[arg(long, value_name = "PATH", default_value = plexus_cni::daemon::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// The plexus cacheDir: the attachment cache and the node's hook set
    #[arg(long, value_name = "DIR", default_value = plexus_cni::conf::DEFAULT_CACHE_DIR)]
    pub cache_dir: PathBuf,
    /// Where the daemon keeps status writes until sent [default: status-queue beside the socket]
    #[arg(long, value_name = "DIR")]
    pub status_queue_dir: Option<PathBuf>,
}

/// The whole report (`--json` prints it as is).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub daemon: DaemonState,
    pub hooks: Vec<HookEntry>,
    pub pending_writes: Vec<PendingWrite>,
    pub sandboxes: Vec<SandboxEntry>,
    /// What could not be read (a file, the cache), each with why; the rest of the report stands.
    pub problems: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonState {
    pub socket: PathBuf,
    /// The daemon answered its health request.
    pub answering: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<DaemonHealth>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HookEntry {
    pub name: String,
    /// `policy`, `resolver` or `status`; empty for a hook the daemon reports that is not in the set.
    pub kind: String,
    /// The component's sha256, when the hook is in the published set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// In the node's published hook set (so it runs in this node's ADDs).
    pub published: bool,
    /// The node agent's state for it (`Active`, or why not), when the daemon answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingWrite {
    pub pod: String,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxEntry {
    pub container_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
    pub interfaces: Vec<InterfaceEntry>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceEntry {
    pub name: String,
    pub network: String,
    pub default: bool,
    /// The delegate's ADD finished (a plan interrupted by a kill has attachments without a result).
    pub attached: bool,
    pub ips: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// The most sandboxes listed (a node runs far fewer).
const MAX_SANDBOXES: usize = 10_000;

/// Gathers the report.
pub fn gather(args: &StatusArgs) -> NodeStatus {
    let mut problems = Vec::new();
    let daemon = match plexus_cni::daemon::client::ask(
        &args.socket,
        &Request::Health,
        Duration::from_secs(2),
    ) {
        Ok(Answer::Health(h)) => DaemonState {
            socket: args.socket.clone(),
            answering: true,
            health: Some(h),
            error: None,
        },
        Ok(other) => DaemonState {
            socket: args.socket.clone(),
            answering: false,
            health: None,
            error: Some(format!("unexpected answer {other:?}")),
        },
        Err(e) => DaemonState {
            socket: args.socket.clone(),
            answering: false,
            health: None,
            error: Some(e.to_string()),
        },
    };
    let hooks = hooks(args, daemon.health.as_ref(), &mut problems);
    let queue = args.status_queue_dir.clone().unwrap_or_else(|| {
        args.socket
            .parent()
            .unwrap_or(Path::new("/"))
            .join("status-queue")
    });
    let pending_writes = pending(&queue, &mut problems);
    let sandboxes = sandboxes(&args.cache_dir, &mut problems);
    NodeStatus {
        daemon,
        hooks,
        pending_writes,
        sandboxes,
        problems,
    }
}

fn hooks(
    args: &StatusArgs,
    health: Option<&DaemonHealth>,
    problems: &mut Vec<String>,
) -> Vec<HookEntry> {
    let mut out: Vec<HookEntry> = match HookSet::read(&args.cache_dir) {
        Ok(Some(set)) => set
            .hooks
            .iter()
            .map(|h| {
                // As an ADD's logs and errors name it.
                let name = format!("{}{}", plexus_cni::hooks::CLUSTER_HOOK_PREFIX, h.name);
                if let Some(why) = &h.unready {
                    problems.push(format!(
                        "{name} ({}) is not ready on this node: {why}",
                        h.kind.as_str()
                    ));
                }
                HookEntry {
                    name,
                    kind: h.kind.as_str().to_string(),
                    digest: h.sha256.clone(),
                    published: true,
                    state: h.unready.as_ref().map(|why| {
                        why.split_once(':')
                            .map_or(why.as_str(), |(r, _)| r)
                            .to_string()
                    }),
                    message: h.unready.clone(),
                }
            })
            .collect(),
        Ok(None) => Vec::new(),
        Err(e) => {
            problems.push(format!("hook set: {e}"));
            Vec::new()
        }
    };
    if let Some(why) = health.and_then(|h| h.hook_agent_waiting.as_ref()) {
        problems.push(format!("hook agent: {why}"));
    }
    if let Some(why) = health.and_then(|h| h.authority_not_enforced.as_ref()) {
        problems.push(format!("node authority: {why}"));
    }
    for h in health.map(|h| h.hooks.as_slice()).unwrap_or_default() {
        // The set names cluster hooks after their resource, with a prefix.
        let set_name = format!("{}{}", plexus_cni::hooks::CLUSTER_HOOK_PREFIX, h.name);
        match out.iter_mut().find(|e| e.name == set_name) {
            Some(e) => {
                e.state = Some(h.reason.clone());
                e.message = (!h.message.is_empty()).then(|| h.message.clone());
            }
            None => out.push(HookEntry {
                name: set_name,
                kind: String::new(),
                digest: None,
                published: false,
                state: Some(h.reason.clone()),
                message: (!h.message.is_empty()).then(|| h.message.clone()),
            }),
        }
    }
    out
}

fn pending(queue: &Path, problems: &mut Vec<String>) -> Vec<PendingWrite> {
    let entries = match std::fs::read_dir(queue) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            problems.push(format!("{}: {e}", queue.display()));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for entry in entries.flatten().take(MAX_SANDBOXES) {
        let path = entry.path();
        let read =
            plexus_node::daemon::status_queue::read_kept(queue, &path).map(|(kept, size)| {
                PendingWrite {
                    pod: format!("{}/{}", kept.pod.namespace, kept.pod.name),
                    bytes: size as u64,
                }
            });
        match read {
            Ok(w) => out.push(w),
            // A temp file being written, or a file that is not a write: the daemon ignores those too.
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    out.sort_by(|a, b| a.pod.cmp(&b.pod));
    out
}

fn sandboxes(cache_dir: &Path, problems: &mut Vec<String>) -> Vec<SandboxEntry> {
    let cache = match AttachmentCache::open_existing(cache_dir) {
        Ok(Some(c)) => c,
        Ok(None) => return Vec::new(),
        Err(e) => {
            problems.push(format!("attachment cache: {e}"));
            return Vec::new();
        }
    };
    let ids = match cache.container_ids() {
        Ok(ids) => ids,
        Err(e) => {
            problems.push(format!("attachment cache: {e}"));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for id in ids.into_iter().take(MAX_SANDBOXES) {
        match cache.load(&id) {
            Ok(Some(plan)) => out.push(SandboxEntry {
                container_id: plan.container_id.clone(),
                pod: plan
                    .pod
                    .as_ref()
                    .map(|p| format!("{}/{}", p.namespace, p.name)),
                netns: plan.netns.clone(),
                interfaces: plan
                    .attachments
                    .iter()
                    .map(|a| interface(&a.ifname, &a.network, a.is_default, a.result.as_ref()))
                    .collect(),
            }),
            // Removed by a DEL between the listing and the read.
            Ok(None) => {}
            Err(e) => problems.push(format!("sandbox {id}: {e}")),
        }
    }
    out.sort_by(|a, b| (&a.pod, &a.container_id).cmp(&(&b.pod, &b.container_id)));
    out
}

/// An attachment's interface from its CNI result: the addresses of the interface named `ifname` in the
/// sandbox (or of every interface when the result names none), and its MAC.
fn interface(ifname: &str, network: &str, default: bool, result: Option<&Value>) -> InterfaceEntry {
    let mut entry = InterfaceEntry {
        name: ifname.to_string(),
        network: network.to_string(),
        default,
        attached: result.is_some(),
        ips: Vec::new(),
        mac: None,
    };
    let Some(result) = result else {
        return entry;
    };
    let interfaces = result["interfaces"].as_array().cloned().unwrap_or_default();
    let index = interfaces.iter().position(|i| {
        i["name"].as_str() == Some(ifname) && i.get("sandbox").is_some_and(|s| !s.is_null())
    });
    entry.mac = index
        .and_then(|i| interfaces[i]["mac"].as_str())
        .map(String::from);
    for ip in result["ips"].as_array().into_iter().flatten() {
        let on = ip["interface"].as_u64().map(|n| n as usize);
        if index.is_none() || on.is_none() || on == index {
            if let Some(a) = ip["address"].as_str() {
                entry.ips.push(a.to_string());
            }
        }
    }
    entry
}

/// The report as text. Its strings come from the daemon, the hook set, the cache: names, messages and results
/// that pods, hooks, registries and delegates had a hand in, each shown with its control characters escaped
/// ([`printable`]).
pub fn render(s: &NodeStatus) -> String {
    use plexus_node::terminal::printable as p;
    use std::fmt::Write;
    let mut o = String::new();
    match &s.daemon.health {
        Some(h) => {
            let _ = writeln!(
                o,
                "daemon: {} ({}: {} pods, {} NADs; {} watch errors), {}/{} requests in flight, {} shed, {} status writes sent, {} pending",
                if h.synced() { "synced" } else { "NOT synced" },
                p(&h.node),
                h.cache.pods,
                h.cache.nads,
                h.cache.watch_errors,
                h.in_flight,
                h.max_in_flight,
                h.shed,
                h.status_writes,
                h.pending_writes
            );
        }
        None => {
            let _ = writeln!(
                o,
                "daemon: not answering at {} ({}): ADDs run in thin mode",
                p(&s.daemon.socket.to_string_lossy()),
                p(s.daemon.error.as_deref().unwrap_or("no answer"))
            );
        }
    }
    let _ = writeln!(o, "hooks: {}", s.hooks.len());
    for h in &s.hooks {
        let _ = writeln!(
            o,
            "  {:<32} {:<9} {:<10} {}{}",
            p(&h.name),
            p(if h.kind.is_empty() { "-" } else { &h.kind }),
            if h.published { "published" } else { "-" },
            p(h.state.as_deref().unwrap_or("-")),
            h.message
                .as_deref()
                .map(|m| format!(": {}", p(m)))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(o, "pending status writes: {}", s.pending_writes.len());
    for w in &s.pending_writes {
        let _ = writeln!(o, "  {} ({} bytes)", p(&w.pod), w.bytes);
    }
    let _ = writeln!(o, "sandboxes: {}", s.sandboxes.len());
    for sb in &s.sandboxes {
        let _ = writeln!(
            o,
            "  {} {} {}",
            p(sb.pod.as_deref().unwrap_or("(no pod)")),
            p(&sb.container_id),
            p(sb.netns.as_deref().unwrap_or(""))
        );
        for i in &sb.interfaces {
            let _ = writeln!(
                o,
                "    {:<10} {:<40} {}{}{}",
                p(&i.name),
                p(&i.network),
                if i.ips.is_empty() {
                    "-".to_string()
                } else {
                    p(&i.ips.join(",")).into_owned()
                },
                i.mac
                    .as_deref()
                    .map(|m| format!(" {}", p(m)))
                    .unwrap_or_default(),
                if i.attached { "" } else { " (not attached)" }
            );
        }
    }
    for problem in &s.problems {
        let _ = writeln!(o, "problem: {}", p(problem));
    }
    o
}

/// `plexus status ARGS...`: prints the report; 0 when it was printed (the daemon's state is in it).
pub fn main(args: &StatusArgs) -> u8 {
    let status = gather(args);
    if args.json {
        match plexus_node::terminal::json(&status) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("plexus status: {e}");
                return 1;
            }
        }
    } else {
        print!("{}", render(&status));
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_interface_gets_the_addresses_and_mac_of_its_sandbox_interface() {
        let result = json!({"cniVersion": "1.0.0",
            "interfaces": [{"name": "br0", "mac": "aa:aa:aa:aa:aa:aa"},
                           {"name": "net1", "mac": "02:00:00:00:00:01", "sandbox": "/run/netns/x"}],
            "ips": [{"address": "10.1.0.5/24", "interface": 1}, {"address": "10.9.0.1/24", "interface": 0}]});
        let i = interface("net1", "team-a/net-a", false, Some(&result));
        assert_eq!(i.ips, vec!["10.1.0.5/24"]);
        assert_eq!(i.mac.as_deref(), Some("02:00:00:00:00:01"));
        assert!(i.attached);
        // A result naming no interfaces: every address is the attachment's.
        let i = interface(
            "eth0",
            "cluster",
            true,
            Some(&json!({"ips": [{"address": "10.0.0.2/16"}]})),
        );
        assert_eq!(i.ips, vec!["10.0.0.2/16"]);
        assert_eq!(i.mac, None);
        let i = interface("net2", "team-a/b", false, None);
        assert!(!i.attached && i.ips.is_empty());
    }

    #[test]
    fn what_others_wrote_is_rendered_escaped() {
        let hostile = "x\u{1b}]0;t\u{7}\n\u{9b}2J";
        let status = NodeStatus {
            daemon: DaemonState {
                socket: "/run/plexus/daemon.sock".into(),
                answering: false,
                health: None,
                error: Some(hostile.into()),
            },
            hooks: vec![HookEntry {
                name: format!("cluster:{hostile}"),
                kind: "policy".into(),
                digest: None,
                published: true,
                state: Some(hostile.into()),
                message: Some(hostile.into()),
            }],
            pending_writes: vec![PendingWrite {
                pod: hostile.into(),
                bytes: 1,
            }],
            sandboxes: vec![SandboxEntry {
                container_id: hostile.into(),
                pod: Some(hostile.into()),
                netns: Some(hostile.into()),
                interfaces: vec![InterfaceEntry {
                    name: hostile.into(),
                    network: hostile.into(),
                    default: false,
                    attached: true,
                    ips: vec![hostile.into()],
                    mac: Some(hostile.into()),
                }],
            }],
            problems: vec![hostile.into()],
        };
        let text = render(&status);
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        // daemon, hooks and one, writes and one, sandboxes, one and its interface, one problem.
        assert_eq!(text.lines().count(), 9, "{text}");
        assert_eq!(
            text.matches(r"x\u{1b}]0;t\u{7}\n\u{9b}2J").count(),
            13,
            "{text}"
        );
    }
}
