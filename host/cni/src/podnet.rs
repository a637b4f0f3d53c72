//! Changes inside the pod's network namespace that no delegate makes: default-route selection (spec 4.1.2.1.9).

use std::io::Read as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use plexus_core::cni::{CniResult, IpNet, Route};

use serde_json::Value;

use crate::error::PlexusError;

/// Route changes in a pod's network namespace, behind a trait so orchestration tests need no namespaces.
pub trait PodNetwork {
    /// Removes every default route on the interfaces in `clear` (the target included), then adds a default
    /// route via each gateway on `target`, in gateway order (the first gets the lowest metric).
    fn set_default_route(
        &self,
        netns: &str,
        target: &str,
        gateways: &[IpAddr],
        clear: &[String],
    ) -> Result<(), PlexusError>;
}

/// How long one `ip` command may take. Its output is bounded as a delegate's is ([`crate::exec::STDOUT_CAP`]; a
/// pod's addresses and routes take a few KiB).
const IP_TIMEOUT: Duration = Duration::from_secs(10);
/// The search path for `nsenter` and `ip` when the process has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Uses `nsenter --net=<netns> ip ...`, which works for named namespaces and `/proc/<pid>/ns/net` alike.
#[derive(Debug, Default)]
pub struct IpRoute;

impl IpRoute {
    /// `ip ARGS` in `netns`: its stdout, within [`IP_TIMEOUT`] and [`crate::exec::STDOUT_CAP`] bytes of output
    /// (a hung `ip` is killed with its process group, and one that prints more fails), run as a delegate is.
    fn ip(&self, netns: &str, args: &[&str]) -> Result<String, PlexusError> {
        use crate::exec::{Exec as _, ExecRequest, ProcessExec};
        let fail = |why: String| PlexusError::Io {
            path: netns.into(),
            source: std::io::Error::other(format!("ip {}: {why}", args.join(" "))),
        };
        // `nsenter` runs `ip` by its name, from the PATH it is given: the daemon's own.
        let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.into());
        let dirs: Vec<_> = std::env::split_paths(&path).collect();
        let nsenter = ProcessExec
            .find("nsenter", &dirs)
            .ok_or_else(|| PlexusError::Io {
                path: "nsenter".into(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no executable nsenter in {path}"),
                ),
            })?;
        let argv: Vec<String> = [format!("--net={netns}"), "ip".into()]
            .into_iter()
            .chain(args.iter().map(|a| a.to_string()))
            .collect();
        let out = ProcessExec
            .run(&ExecRequest {
                plugin: &nsenter,
                args: &argv,
                env: &[("PATH".into(), path)],
                stdin: &[],
                timeout: IP_TIMEOUT,
            })
            .map_err(|source| PlexusError::Io {
                path: nsenter.display().to_string(),
                source,
            })?;
        if out.timed_out {
            return Err(fail(format!("no answer within {IP_TIMEOUT:?}")));
        }
        if out.overflowed {
            return Err(fail(format!(
                "over {} bytes of output",
                crate::exec::STDOUT_CAP
            )));
        }
        if out.code != Some(0) {
            return Err(fail(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl PodNetwork for IpRoute {
    fn set_default_route(
        &self,
        netns: &str,
        target: &str,
        gateways: &[IpAddr],
        clear: &[String],
    ) -> Result<(), PlexusError> {
        for family in ["-4", "-6"] {
            let json = self.ip(netns, &[family, "-j", "route", "show", "default"])?;
            let routes: Vec<Value> = serde_json::from_str(json.trim()).unwrap_or_default();
            for r in routes {
                let dev = r.get("dev").and_then(Value::as_str).unwrap_or_default();
                if !clear.iter().any(|c| c == dev) {
                    continue;
                }
                let mut args = vec![family, "route", "del", "default", "dev", dev];
                let gw = r.get("gateway").and_then(Value::as_str).map(str::to_string);
                let metric = r
                    .get("metric")
                    .and_then(Value::as_u64)
                    .map(|m| m.to_string());
                if let Some(gw) = gw.as_deref() {
                    args.extend(["via", gw]);
                }
                if let Some(m) = metric.as_deref() {
                    args.extend(["metric", m]);
                }
                self.ip(netns, &args)?;
            }
        }
        for (i, gw) in gateways.iter().enumerate() {
            let family = if gw.is_ipv4() { "-4" } else { "-6" };
            let (gw_s, metric) = (gw.to_string(), (i + 1).to_string());
            self.ip(
                netns,
                &[
                    family, "route", "add", "default", "via", &gw_s, "dev", target, "metric",
                    &metric,
                ],
            )
            .map_err(|e| {
                PlexusError::config(format!("default-route gateway {gw} on {target}"), e)
            })?;
        }
        Ok(())
    }
}

/// The most bytes of a routing table read from `/proc` (a pod's tables hold a few routes).
const ROUTES_CAP: u64 = 1 << 20;

/// The CNI result (in `cni_version`) of interface `ifname` that someone else attached in `netns`: the runtime's own
/// CNI, in the node daemon's NRI mode. The interface with its MAC and the namespace as its sandbox; its addresses
/// with their prefix lengths, but for loopback and IPv6 link-local ones (those of link or host scope); each with
/// the gateway of the interface's default route of its family, if it has one.
///
/// Read in-process, on a thread of its own that enters the namespace and ends with the read: the interface and its
/// addresses from `getifaddrs` (netlink, in the thread's namespace), its default routes from the thread's
/// `/proc/thread-self/net/route` and `ipv6_route`. No process is started: this runs once per pod, while the runtime
/// waits.
pub fn interface_result(
    netns: &str,
    ifname: &str,
    cni_version: &str,
) -> Result<Value, PlexusError> {
    let fail = |e: String| PlexusError::Io {
        path: netns.into(),
        source: std::io::Error::other(format!("interface {ifname}: {e}")),
    };
    let ns = std::fs::File::open(netns).map_err(|source| PlexusError::Io {
        path: netns.into(),
        source,
    })?;
    let name = ifname.to_string();
    let reader = std::thread::Builder::new()
        .name("plexus-netns".into())
        .spawn(move || {
            enter_netns(&ns).map_err(|e| format!("entering the network namespace: {e}"))?;
            read_interface(&name)
        })
        .map_err(|e| fail(format!("starting the reader thread: {e}")))?;
    let interface = reader
        .join()
        .map_err(|_| fail("the reader thread panicked".into()))?
        .map_err(fail)?;
    Ok(interface.result(ifname, netns, cni_version))
}

/// The most network namespaces [`namespace_holding`] looks into.
pub const MAX_SCANNED: usize = 4096;

/// The network namespace pinned in `dir` (a runtime's, `/var/run/netns`) whose interface `ifname` holds one of
/// `ips`, if one does. For a sandbox whose runtime reports its addresses but not its namespace: containerd,
/// restarted while it made the sandbox, keeps the sandbox and its address but not its spec, where the namespace's
/// path is. Read in-process, on one thread of its own that enters each namespace in turn (at most [`MAX_SCANNED`]);
/// one that cannot be entered, or has no `ifname`, is skipped.
pub fn namespace_holding(dir: &Path, ifname: &str, ips: &[IpAddr]) -> Option<PathBuf> {
    if ips.is_empty() {
        return None;
    }
    let paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .take(MAX_SCANNED)
        .map(|e| e.path())
        .collect();
    let (name, ips) = (ifname.to_string(), ips.to_vec());
    std::thread::Builder::new()
        .name("plexus-netns".into())
        .spawn(move || {
            paths.into_iter().find(|path| {
                std::fs::File::open(path).is_ok_and(|ns| enter_netns(&ns).is_ok())
                    && read_interface(&name)
                        .is_ok_and(|i| i.addrs.iter().any(|(ip, _)| ips.contains(ip)))
            })
        })
        .ok()?
        .join()
        .ok()?
}

/// Moves the calling thread into the network namespace `ns` (a namespace file: `/proc/<pid>/ns/net`, or one
/// pinned in `/run/netns`). Only for a thread of its own that ends with its work.
fn enter_netns(ns: &std::fs::File) -> rustix::io::Result<()> {
    use std::os::fd::AsFd as _;
    rustix::thread::move_into_link_name_space(
        ns.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
}

/// What the kernel says of one interface: what [`interface_result`] reports.
#[derive(Debug, Default, PartialEq)]
struct Interface {
    mac: Option<[u8; 6]>,
    /// Its addresses with their prefix lengths, in the kernel's order.
    addrs: Vec<(IpAddr, u8)>,
    /// The gateways of its default routes, IPv4's first.
    gateways: Vec<IpAddr>,
}

impl Interface {
    fn result(&self, name: &str, netns: &str, cni_version: &str) -> Value {
        let local = |ip: &IpAddr| match ip {
            IpAddr::V4(v4) => v4.is_loopback(),
            IpAddr::V6(v6) => v6.is_loopback() || v6.is_unicast_link_local(),
        };
        let ips: Vec<Value> = self
            .addrs
            .iter()
            .filter(|(ip, _)| !local(ip))
            .map(|(ip, prefix)| {
                let mut entry =
                    serde_json::json!({"address": format!("{ip}/{prefix}"), "interface": 0});
                if let Some(gw) = self.gateways.iter().find(|g| g.is_ipv4() == ip.is_ipv4()) {
                    entry["gateway"] = gw.to_string().into();
                }
                entry
            })
            .collect();
        let mut interface = serde_json::json!({"name": name, "sandbox": netns});
        if let Some(mac) = self.mac {
            let hex: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
            interface["mac"] = hex.join(":").into();
        }
        serde_json::json!({"cniVersion": cni_version, "interfaces": [interface], "ips": ips})
    }
}

/// [`Interface`] `ifname` of the calling thread's network namespace.
fn read_interface(ifname: &str) -> Result<Interface, String> {
    let mut found = false;
    let mut interface = Interface::default();
    let all = nix::ifaddrs::getifaddrs().map_err(|e| format!("getifaddrs: {e}"))?;
    for a in all.filter(|a| a.interface_name == ifname) {
        found = true;
        let Some(addr) = a.address else { continue };
        if let Some(link) = addr.as_link_addr() {
            interface.mac = link.addr().filter(|m| m != &[0; 6]);
            continue;
        }
        let mask = a.netmask.as_ref();
        let (ip, prefix) = match (addr.as_sockaddr_in(), addr.as_sockaddr_in6()) {
            (Some(v4), _) => (
                IpAddr::V4(v4.ip()),
                mask.and_then(|m| m.as_sockaddr_in())
                    .map_or(32, |m| u32::from(m.ip()).count_ones()),
            ),
            (_, Some(v6)) => (
                IpAddr::V6(v6.ip()),
                mask.and_then(|m| m.as_sockaddr_in6())
                    .map_or(128, |m| u128::from(m.ip()).count_ones()),
            ),
            _ => continue,
        };
        interface.addrs.push((ip, prefix as u8));
    }
    if !found {
        return Err("no such interface in the network namespace".into());
    }
    let table = |file: &str| {
        let path = format!("/proc/thread-self/net/{file}");
        let mut text = String::new();
        std::fs::File::open(&path)
            .and_then(|f| f.take(ROUTES_CAP).read_to_string(&mut text))
            .map(|_| text)
            .map_err(|e| format!("{path}: {e}"))
    };
    interface.gateways = default_gateways_v4(&table("route")?, ifname);
    // A kernel without IPv6 has no ipv6_route.
    interface.gateways.extend(default_gateways_v6(
        &table("ipv6_route").unwrap_or_default(),
        ifname,
    ));
    Ok(interface)
}

/// The gateways of `ifname`'s IPv4 default routes, from `/proc/net/route` (a header line, then `Iface Destination
/// Gateway Flags RefCnt Use Metric Mask ...`, the addresses as the kernel's 32-bit words in hex).
fn default_gateways_v4(table: &str, ifname: &str) -> Vec<IpAddr> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (iface, dst, gw, mask) = (f.first()?, f.get(1)?, f.get(2)?, f.get(7)?);
            let word = u32::from_str_radix(gw, 16).ok()?;
            (*iface == ifname && *dst == "00000000" && *mask == "00000000" && word != 0)
                .then(|| IpAddr::from(word.to_ne_bytes()))
        })
        .collect()
}

/// The gateways of `ifname`'s IPv6 default routes, from `/proc/net/ipv6_route` (`dest dest_len src src_len
/// next_hop metric refcnt use flags device`, the addresses in hex).
fn default_gateways_v6(table: &str, ifname: &str) -> Vec<IpAddr> {
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (dst, dst_len, hop, dev) = (f.first()?, f.get(1)?, f.get(4)?, f.get(9)?);
            let hop = u128::from_str_radix(hop, 16).ok()?;
            let default = u128::from_str_radix(dst, 16).ok()? == 0 && *dst_len == "00";
            (*dev == ifname && default && hop != 0).then(|| IpAddr::from(hop.to_be_bytes()))
        })
        .collect()
}

/// Makes cached ADD results say what [`PodNetwork::set_default_route`] did: the default routes leave the results
/// of the attachments on the cleared interfaces, and the target's result gains one per gateway. CHECK holds the
/// namespace against these results (bridge verifies every route a result lists), and the runtime receives the
/// cluster network's result, which must not claim a default route the pod no longer has.
///
/// Each result is edited as core's typed result and written back in its own version, as libcni hands results
/// on (fields the CNI spec does not define are not kept). A result that does not parse is left alone.
pub fn reroute_results<'a>(
    results: impl IntoIterator<Item = (&'a str, &'a mut Value)>,
    target: &str,
    gateways: &[IpAddr],
    clear: &[String],
) {
    for (ifname, result) in results {
        let clearing = clear.iter().any(|c| c == ifname);
        if !clearing && ifname != target {
            continue;
        }
        let Ok(mut typed) = CniResult::parse(result) else {
            continue;
        };
        if clearing {
            typed.routes.retain(|r| r.dst.prefix_len != 0);
        }
        if ifname == target {
            for gw in gateways {
                let any = if gw.is_ipv4() {
                    IpAddr::from([0u8; 4])
                } else {
                    IpAddr::from([0u8; 16])
                };
                let dst = IpNet {
                    addr: any,
                    prefix_len: 0,
                };
                typed.routes.push(Route::new(dst, Some(*gw)));
            }
        }
        if let Ok(rewritten) = typed.to_json(typed.source_version()) {
            *result = rewritten;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_interface_the_runtime_attached_reads_as_a_result_of_its_global_addresses_with_their_gateways(
    ) {
        let interface = Interface {
            mac: Some([0x0a, 0x58, 0x0a, 0xf4, 0x00, 0x05]),
            addrs: vec![
                ("10.244.0.5".parse().unwrap(), 24),
                ("fd00::5".parse().unwrap(), 64),
                ("fe80::1".parse().unwrap(), 64),
                ("127.0.0.2".parse().unwrap(), 8),
            ],
            gateways: vec!["10.244.0.1".parse().unwrap()],
        };
        assert_eq!(
            interface.result("eth0", "/run/netns/p", "1.0.0"),
            json!({"cniVersion": "1.0.0",
                "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/run/netns/p"}],
                "ips": [{"address": "10.244.0.5/24", "interface": 0, "gateway": "10.244.0.1"},
                        {"address": "fd00::5/64", "interface": 0}]})
        );
        let bare = Interface::default().result("eth0", "/p", "0.4.0");
        assert_eq!(
            bare["interfaces"],
            json!([{"name": "eth0", "sandbox": "/p"}])
        );
        assert_eq!(bare["ips"], json!([]));
    }

    #[test]
    fn default_routes_are_read_from_the_kernels_tables_for_the_interface_alone() {
        let v4 =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t0100F40A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
            eth0\t0000F40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
            net1\t00000000\t0101A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        let gw = u32::from_ne_bytes([10, 244, 0, 1]);
        let v4 = v4.replace("0100F40A", &format!("{gw:08X}"));
        assert_eq!(
            default_gateways_v4(&v4, "eth0"),
            vec!["10.244.0.1".parse::<IpAddr>().unwrap()]
        );
        assert!(default_gateways_v4(&v4, "net2").is_empty());
        let v6 = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
            fd000000000000000000000000000001 00000400 00000001 00000000 00000003     eth0\n\
            fd000000000000000000000000000000 40 00000000000000000000000000000000 00 \
            00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
            00000000000000000000000000000000 00 00000000000000000000000000000000 00 \
            00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";
        assert_eq!(
            default_gateways_v6(v6, "eth0"),
            vec!["fd00::1".parse::<IpAddr>().unwrap()]
        );
        assert!(default_gateways_v6(v6, "lo").is_empty());
    }

    #[test]
    fn default_routes_move_to_the_target_result() {
        let mut cluster = json!({"cniVersion": "1.0.0", "routes": [
            {"dst": "0.0.0.0/0", "gw": "10.0.0.1"}, {"dst": "::/0", "gw": "fd00::1"}, {"dst": "10.96.0.0/12", "gw": "10.0.0.1"}]});
        let mut side = json!({"cniVersion": "1.0.0", "ips": []});
        let mut untouched =
            json!({"cniVersion": "1.0.0", "routes": [{"dst": "0.0.0.0/0", "gw": "10.2.0.1"}]});
        let gws: Vec<IpAddr> = vec!["10.1.0.1".parse().unwrap(), "fd01::1".parse().unwrap()];
        let clear = vec!["eth0".to_string(), "net1".to_string()];
        reroute_results(
            [
                ("eth0", &mut cluster),
                ("net1", &mut side),
                ("net9", &mut untouched),
            ],
            "net1",
            &gws,
            &clear,
        );
        assert_eq!(
            cluster["routes"],
            json!([{"dst": "10.96.0.0/12", "gw": "10.0.0.1"}])
        );
        assert_eq!(
            side["routes"],
            json!([{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}, {"dst": "::/0", "gw": "fd01::1"}])
        );
        assert_eq!(
            untouched["routes"],
            json!([{"dst": "0.0.0.0/0", "gw": "10.2.0.1"}])
        );
    }

    #[test]
    fn pre_0_3_results_keep_routes_per_family() {
        let mut old = json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.5/24", "routes": [{"dst": "0.0.0.0/0"}]}});
        let gws: Vec<IpAddr> = vec!["10.1.0.1".parse().unwrap()];
        reroute_results([("net1", &mut old)], "net1", &gws, &["net1".to_string()]);
        assert_eq!(
            old["ip4"]["routes"],
            json!([{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}])
        );
        assert!(old.get("routes").is_none());
    }
}
