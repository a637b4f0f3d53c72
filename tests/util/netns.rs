//! Real-network fixtures: network namespaces, host bridges and veth pairs that are torn down on drop, readers for
//! what the kernel holds inside and outside a namespace, and host-local IPAM state under a per-test dataDir.
//!
//! Everything here shells out to iproute2 so that tests see the machine exactly as an operator would. Fixture
//! names embed the creating process's pid, so leftovers of a run that was killed before its destructors ran are
//! recognised and removed by the next run (see [`sweep_stale`]).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once};

use serde::Deserialize;
use serde_json::{json, Value};
use tempfile::TempDir;

/// The CNI reference plugins the tests run: release v1.10.0, of the build of `tests/parts.sh`.
pub fn cni_bin_dir() -> &'static str {
    static DIR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DIR.get_or_init(|| crate::parts::cni_plugins().display().to_string())
}

/// Where `ip netns add` mounts named namespaces.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// Linux's IFNAMSIZ minus the terminating NUL.
pub const MAX_IFNAME_LEN: usize = 15;

const NETNS_PREFIX: &str = "plx-";
const IFNAME_PREFIX: &str = "px";

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn next_counter() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// Fails the calling test unless it can do real networking: root, iproute2 and the reference plugins.
///
/// These tests are meant to run as root in CI; skipping silently would report green for tests that never ran.
pub fn require_root_and_plugins() {
    let status = fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .unwrap_or("?");
    assert!(
        euid == "0",
        "real-network tests need root (effective uid is {euid}); run them as root (`cargo test --release -p plexus-tests` in a root shell)"
    );
    // Fails naming the build script when the plugins are not built.
    cni_bin_dir();
    let ip = Command::new("ip").arg("-V").output();
    assert!(
        matches!(&ip, Ok(o) if o.status.success()),
        "the `ip` command (iproute2) is not usable: {ip:?}; tests/setup.sh installs it"
    );
    sweep_stale();
}

/// Runs a command to completion and returns its stdout, failing the test with the command's stderr otherwise.
pub fn run_ok<I, S>(program: &str, args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(program);
    cmd.args(args);
    output_ok(&mut cmd)
}

fn output_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    String::from_utf8(out.stdout)
        .unwrap_or_else(|e| panic!("{cmd:?} printed non-UTF-8 output: {e}"))
}

fn ip_json<T: for<'de> Deserialize<'de>>(args: &[&str]) -> T {
    let out = run_ok("ip", args);
    // iproute2 prints nothing at all (not `[]`) for some empty tables.
    let text = if out.trim().is_empty() {
        "[]"
    } else {
        out.as_str()
    };
    serde_json::from_str(text).unwrap_or_else(|e| {
        panic!(
            "`ip {}` printed unexpected JSON ({e}): {out}",
            args.join(" ")
        )
    })
}

/// Deletes a host interface if it exists; used by destructors, so it reports instead of panicking.
fn delete_host_link(name: &str) {
    if !Path::new("/sys/class/net").join(name).exists() {
        return;
    }
    match Command::new("ip").args(["link", "del", name]).output() {
        Ok(o) if o.status.success() => {}
        // It may have vanished in between (a veth goes when its peer's namespace does).
        Ok(_) if !Path::new("/sys/class/net").join(name).exists() => {}
        Ok(o) => eprintln!(
            "cleanup: ip link del {name}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => eprintln!("cleanup: ip link del {name}: {e}"),
    }
}

fn delete_netns(name: &str) {
    if !Path::new(NETNS_RUN_DIR).join(name).exists() {
        return;
    }
    match Command::new("ip").args(["netns", "del", name]).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => eprintln!(
            "cleanup: ip netns del {name}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => eprintln!("cleanup: ip netns del {name}: {e}"),
    }
}

fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// The pid that created a fixture name of ours, if `name` is one.
fn owner_pid(name: &str) -> Option<u32> {
    if let Some(rest) = name.strip_prefix(NETNS_PREFIX) {
        // plx-<tag>-<pid>-<counter>; the tag never contains '-'.
        let mut parts = rest.rsplitn(3, '-');
        let _counter = parts.next()?.parse::<u32>().ok()?;
        let pid = parts.next()?.parse().ok()?;
        parts.next()?;
        return Some(pid);
    }
    // px<tag>-<pid base36>-<counter base36>
    let rest = name.strip_prefix(IFNAME_PREFIX)?;
    let parts: Vec<&str> = rest.split('-').collect();
    match parts.as_slice() {
        [tag, pid, counter] if !tag.is_empty() && !counter.is_empty() => {
            u32::from_str_radix(pid, 36).ok()
        }
        _ => None,
    }
}

/// Removes namespaces and host interfaces that fixtures of a process which no longer exists left behind (a test
/// binary killed with SIGKILL runs no destructors). Runs at most once per process; names of live processes are
/// never touched.
pub fn sweep_stale() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Ok(entries) = fs::read_dir(NETNS_RUN_DIR) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if owner_pid(&name).is_some_and(|pid| !pid_alive(pid)) {
                    eprintln!("cleanup: removing stale namespace {name}");
                    delete_netns(&name);
                }
            }
        }
        if let Ok(entries) = fs::read_dir("/sys/class/net") {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if owner_pid(&name).is_some_and(|pid| !pid_alive(pid)) {
                    eprintln!("cleanup: removing stale host interface {name}");
                    delete_host_link(&name);
                }
            }
        }
    });
}

fn sanitize_tag(tag: &str) -> String {
    let t: String = tag
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if t.is_empty() {
        "t".to_owned()
    } else {
        t
    }
}

fn base36(mut n: u32) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii digits")
}

/// A host interface name that is unique on this machine for the life of this process and fits in IFNAMSIZ:
/// `px<tag>-<pid>-<counter>` with pid and counter in base 36. `tag` is 1–3 lowercase letters or digits.
pub fn unique_ifname(tag: &str) -> String {
    assert!(
        (1..=3).contains(&tag.len())
            && tag
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
        "interface tag {tag:?} must be 1-3 lowercase letters or digits"
    );
    let name = format!(
        "{IFNAME_PREFIX}{tag}-{}-{}",
        base36(std::process::id()),
        base36(next_counter())
    );
    assert!(
        name.len() <= MAX_IFNAME_LEN,
        "interface name {name} is longer than {MAX_IFNAME_LEN}"
    );
    name
}

/// An IPv4 /24 under 10.199.0.0/16 for one test network, e.g. `10.199.37.0/24`.
///
/// Spread by pid and a counter so that concurrent tests rarely share one; a clash is harmless anyway, because each
/// test's traffic stays on its own bridge between namespaces it created.
pub fn unique_subnet24() -> Subnet24 {
    let n = (std::process::id()
        .wrapping_mul(7)
        .wrapping_add(next_counter().wrapping_mul(31)))
        % 254
        + 1;
    Subnet24 {
        third_octet: n as u8,
    }
}

/// A test IPv4 /24 (`10.199.<n>.0/24`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet24 {
    pub third_octet: u8,
}

impl Subnet24 {
    /// `10.199.<n>.0/24`.
    pub fn cidr(&self) -> String {
        format!("10.199.{}.0/24", self.third_octet)
    }

    /// The address with host part `host`, without prefix length, e.g. `host(1)` is the usual gateway.
    pub fn host(&self, host: u8) -> String {
        format!("10.199.{}.{host}", self.third_octet)
    }

    /// Whether `addr` (with or without `/len`) lies in this subnet.
    pub fn contains(&self, addr: &str) -> bool {
        let ip = addr.split('/').next().unwrap_or(addr);
        matches!(ip.parse::<IpAddr>(), Ok(IpAddr::V4(v4)) if v4.octets()[..3] == [10, 199, self.third_octet])
    }
}

/// One interface as `ip -d -j addr` reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct Link {
    pub ifindex: u32,
    pub ifname: String,
    #[serde(default)]
    pub flags: Vec<String>,
    #[serde(default)]
    pub mtu: u32,
    #[serde(default)]
    pub operstate: String,
    #[serde(default)]
    pub link_type: String,
    /// The MAC address for Ethernet-like links.
    #[serde(default)]
    pub address: Option<String>,
    /// The bridge (or bond) this link is enslaved to.
    #[serde(default)]
    pub master: Option<String>,
    #[serde(default)]
    pub linkinfo: Option<LinkInfo>,
    #[serde(default)]
    pub addr_info: Vec<AddrInfo>,
    /// Whatever else iproute2 printed (link_netnsid, qdisc, ...).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Link {
    /// The link kind (`veth`, `bridge`, `macvlan`, ...); `None` for plain devices such as `lo`.
    pub fn kind(&self) -> Option<&str> {
        self.linkinfo.as_ref()?.info_kind.as_deref()
    }

    pub fn is_up(&self) -> bool {
        self.flags.iter().any(|f| f == "UP")
    }

    /// Addresses as `ip/prefixlen`, e.g. `10.199.3.2/24`.
    pub fn cidrs(&self) -> Vec<String> {
        self.addr_info
            .iter()
            .map(|a| format!("{}/{}", a.local, a.prefixlen))
            .collect()
    }

    /// Whether the link carries `cidr` (`ip/prefixlen`; compared as addresses, so IPv6 spelling does not matter).
    pub fn has_addr(&self, cidr: &str) -> bool {
        let Some((ip, len)) = cidr.split_once('/') else {
            return false;
        };
        let (Ok(ip), Ok(len)) = (ip.parse::<IpAddr>(), len.parse::<u8>()) else {
            return false;
        };
        self.addr_info
            .iter()
            .any(|a| a.local.parse::<IpAddr>().ok() == Some(ip) && a.prefixlen == len)
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct LinkInfo {
    #[serde(default)]
    pub info_kind: Option<String>,
    #[serde(default)]
    pub info_data: serde_json::Value,
    #[serde(default)]
    pub info_slave_kind: Option<String>,
}

/// One address of a link.
#[derive(Debug, Clone, Deserialize)]
pub struct AddrInfo {
    /// `inet` or `inet6`.
    pub family: String,
    pub local: String,
    pub prefixlen: u8,
    #[serde(default)]
    pub scope: String,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// One route as `ip -j route` reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct Route {
    /// `default` or a prefix; iproute2 omits `/32` and `/128` for host routes.
    pub dst: String,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub dev: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub prefsrc: Option<String>,
    #[serde(default)]
    pub metric: Option<u32>,
    #[serde(default)]
    pub flags: Vec<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Route {
    pub fn is_default(&self) -> bool {
        self.dst == "default"
    }
}

/// A named network namespace (`/run/netns/plx-<tag>-<pid>-<counter>`), deleted on drop together with every host
/// interface registered through [`NetNs::cleanup_host_link`]. Drop runs during unwinding too, so a failing test
/// leaves nothing behind.
#[derive(Debug)]
pub struct NetNs {
    name: String,
    path: PathBuf,
    host_links: Mutex<Vec<String>>,
}

impl NetNs {
    /// Creates a fresh namespace with its loopback up. `tag` names the test (non-alphanumerics become `_`).
    pub fn new(tag: &str) -> NetNs {
        sweep_stale();
        let name = format!(
            "{NETNS_PREFIX}{}-{}-{}",
            sanitize_tag(tag),
            std::process::id(),
            next_counter()
        );
        run_ok("ip", ["netns", "add", name.as_str()]);
        let ns = NetNs {
            path: Path::new(NETNS_RUN_DIR).join(&name),
            name,
            host_links: Mutex::new(Vec::new()),
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// The name `ip netns` knows it by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path runtimes pass as `CNI_NETNS`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Deletes host interface `name` (if it exists then) when this namespace is dropped, e.g. the bridge a
    /// bridge-plugin network created, which outlives every attachment.
    pub fn cleanup_host_link(&self, name: &str) {
        self.host_links
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.to_owned());
    }

    /// Runs `program args...` inside the namespace (`ip netns exec`) and returns its output, whatever the status.
    pub fn exec<I, S>(&self, program: &str, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.name.as_str(), program])
            .args(args);
        cmd.output()
            .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
    }

    /// Runs `program args...` inside the namespace, failing the test unless it succeeds; returns stdout.
    pub fn exec_ok<I, S>(&self, program: &str, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.name.as_str(), program])
            .args(args);
        output_ok(&mut cmd)
    }

    /// Runs `ip -n <ns> args...`, failing the test unless it succeeds; returns stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run_ok("ip", all)
    }

    /// Every interface inside the namespace, with its addresses and link details.
    pub fn links(&self) -> Vec<Link> {
        ip_json(&["-n", self.name.as_str(), "-d", "-j", "addr", "show"])
    }

    /// The interface called `ifname` inside the namespace, if any.
    pub fn link(&self, ifname: &str) -> Option<Link> {
        self.links().into_iter().find(|l| l.ifname == ifname)
    }

    /// The IPv4 main routing table inside the namespace.
    pub fn routes(&self) -> Vec<Route> {
        ip_json(&["-n", self.name.as_str(), "-j", "route", "show"])
    }

    /// The IPv6 main routing table inside the namespace.
    pub fn routes6(&self) -> Vec<Route> {
        ip_json(&["-n", self.name.as_str(), "-6", "-j", "route", "show"])
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // The namespace first: that destroys the container ends of veths and with them their host peers.
        delete_netns(&self.name);
        let links = std::mem::take(&mut *self.host_links.lock().unwrap_or_else(|e| e.into_inner()));
        for name in links.iter().rev() {
            delete_host_link(name);
        }
    }
}

/// Every interface inside the network namespace at `path` (one a runtime made, say), with its addresses.
pub fn links_at(path: &Path) -> Vec<Link> {
    let out = output_ok(
        Command::new("nsenter")
            .arg(format!("--net={}", path.display()))
            .args(["ip", "-d", "-j", "addr", "show"]),
    );
    serde_json::from_str(if out.trim().is_empty() { "[]" } else { &out }).unwrap_or_else(|e| {
        panic!(
            "`ip addr` in {} printed unexpected JSON ({e})",
            path.display()
        )
    })
}

/// Every interface in the host (the test process's) namespace, to catch leaked veths.
pub fn host_links() -> Vec<Link> {
    ip_json(&["-d", "-j", "addr", "show"])
}

/// The host interface called `name`, if any.
pub fn host_link(name: &str) -> Option<Link> {
    host_links().into_iter().find(|l| l.ifname == name)
}

/// Host interfaces enslaved to bridge `bridge`: after a bridge network's DEL this must be empty.
pub fn host_links_on_bridge(bridge: &str) -> Vec<Link> {
    host_links()
        .into_iter()
        .filter(|l| l.master.as_deref() == Some(bridge))
        .collect()
}

/// A Linux bridge in the host namespace, deleted on drop.
#[derive(Debug)]
pub struct HostBridge {
    name: String,
}

impl HostBridge {
    /// Creates the bridge (up, no addresses) now.
    pub fn create(tag: &str) -> HostBridge {
        let b = HostBridge::reserve(tag);
        run_ok("ip", ["link", "add", b.name.as_str(), "type", "bridge"]);
        run_ok("ip", ["link", "set", b.name.as_str(), "up"]);
        b
    }

    /// Only picks a unique name, for a bridge the bridge plugin will create; deletes it on drop if it exists then.
    pub fn reserve(tag: &str) -> HostBridge {
        sweep_stale();
        HostBridge {
            name: unique_ifname(tag),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for HostBridge {
    fn drop(&mut self) {
        delete_host_link(&self.name);
    }
}

/// A veth pair with both ends up in the host namespace, deleted on drop. Its ends make macvlan masters (the
/// machines these tests run on cannot create dummy links).
#[derive(Debug)]
pub struct VethPair {
    name: String,
    peer: String,
}

impl VethPair {
    pub fn create(tag: &str) -> VethPair {
        sweep_stale();
        let pair = VethPair {
            name: unique_ifname(tag),
            peer: unique_ifname(tag),
        };
        run_ok(
            "ip",
            [
                "link",
                "add",
                pair.name.as_str(),
                "type",
                "veth",
                "peer",
                "name",
                pair.peer.as_str(),
            ],
        );
        run_ok("ip", ["link", "set", pair.name.as_str(), "up"]);
        run_ok("ip", ["link", "set", pair.peer.as_str(), "up"]);
        pair
    }

    /// The end meant to be used (e.g. as a macvlan `master`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Deleting one end removes both.
        delete_host_link(&self.name);
        delete_host_link(&self.peer);
    }
}

/// One address host-local has handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub ip: IpAddr,
    pub container_id: String,
    /// Recorded by host-local since CNI plugins 0.9; absent in older files.
    pub ifname: Option<String>,
}

/// A private host-local `dataDir`, so tests never read or disturb `/var/lib/cni/networks`. Removed on drop.
#[derive(Debug)]
pub struct IpamDir {
    dir: TempDir,
}

impl IpamDir {
    pub fn new() -> IpamDir {
        IpamDir {
            dir: tempfile::Builder::new()
                .prefix("plx-ipam-")
                .tempdir()
                .expect("create a host-local dataDir"),
        }
    }

    /// The value for the `ipam.dataDir` key.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// What host-local holds for network `network` (the conf's `name`), sorted by address. One file per
    /// address, named after it and holding `<container id>\r\n<ifname>`; `last_reserved_ip.*` and `lock` are
    /// bookkeeping.
    pub fn reservations(&self, network: &str) -> Vec<Reservation> {
        let dir = self.dir.path().join(network);
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let Ok(ip) = file_name.parse::<IpAddr>() else {
                continue;
            };
            let text = fs::read_to_string(entry.path())
                .unwrap_or_else(|e| panic!("read {}: {e}", entry.path().display()));
            let mut lines = text.lines().map(str::trim);
            out.push(Reservation {
                ip,
                container_id: lines.next().unwrap_or_default().to_owned(),
                ifname: lines.next().filter(|s| !s.is_empty()).map(str::to_owned),
            });
        }
        out.sort_by_key(|r| r.ip);
        out
    }

    /// The addresses reserved in `network`.
    pub fn reserved_ips(&self, network: &str) -> Vec<IpAddr> {
        self.reservations(network)
            .into_iter()
            .map(|r| r.ip)
            .collect()
    }
}

impl Default for IpamDir {
    fn default() -> Self {
        IpamDir::new()
    }
}

/// The host's iptables nat table (`iptables-save -t nat`), to see what portmap left behind.
pub fn iptables_nat() -> String {
    let out = Command::new("iptables-save")
        .args(["-t", "nat"])
        .output()
        .expect("run iptables-save");
    assert!(
        out.status.success(),
        "iptables-save: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A configuration list `name` of one bridge plugin (`bridge`, the gateway, no masquerade) with host-local in a
/// fresh subnet, its reservations in `ipam`: the network the teardown tests and the reliability report attach.
pub fn bridge_host_local(name: &str, bridge: &HostBridge, ipam: &IpamDir) -> Value {
    let subnet = unique_subnet24();
    json!({"cniVersion": "1.0.0", "name": name, "plugins": [{
        "type": "bridge", "bridge": bridge.name(), "isGateway": true, "ipMasq": false,
        "ipam": {"type": "host-local", "dataDir": ipam.path(),
                 "ranges": [[{"subnet": subnet.cidr(), "gateway": subnet.host(1)}]]}
    }]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_recognises_only_our_names() {
        assert_eq!(owner_pid("plx-add_del-4242-7"), Some(4242));
        assert_eq!(owner_pid("plx-4242-7"), None);
        assert_eq!(owner_pid("plx-a-b-c"), None);
        assert_eq!(
            owner_pid(&format!("pxbr-{}-{}", base36(4242), base36(7))),
            Some(4242)
        );
        assert_eq!(owner_pid("pxbr-zz"), None);
        assert_eq!(owner_pid("eth0"), None);
        assert_eq!(owner_pid("plxman0"), None);
    }

    #[test]
    fn unique_ifnames_fit_and_differ() {
        let a = unique_ifname("abc");
        let b = unique_ifname("abc");
        assert_ne!(a, b);
        assert!(a.len() <= MAX_IFNAME_LEN);
        assert_eq!(owner_pid(&a), Some(std::process::id()));
        // The largest pid Linux allows still fits.
        assert!(format!("pxabc-{}-{}", base36(4_194_304), base36(46_655)).len() <= MAX_IFNAME_LEN);
    }

    #[test]
    fn base36_round_trips() {
        for n in [0, 1, 35, 36, 4_194_304, u32::MAX] {
            assert_eq!(u32::from_str_radix(&base36(n), 36), Ok(n));
        }
    }

    #[test]
    fn subnet_contains_only_its_own_addresses() {
        let s = Subnet24 { third_octet: 37 };
        assert_eq!(s.cidr(), "10.199.37.0/24");
        assert!(s.contains("10.199.37.2/24"));
        assert!(s.contains(&s.host(254)));
        assert!(!s.contains("10.199.38.2/24"));
        assert!(!s.contains("fd00::1/64"));
    }
}
