//! Changes inside the pod's network namespace that no delegate makes: default-route selection (spec 4.1.2.1.9).

use std::net::IpAddr;
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

impl IpRoute {
    /// The CNI result (in `cni_version`) of interface `ifname` that someone else attached in `netns`: the
    /// runtime's own CNI, in the node daemon's NRI mode. Read from the namespace: the interface with its MAC and
    /// the namespace as its sandbox, its addresses of global scope with their prefix lengths, each with the
    /// gateway of the interface's default route of its family, if it has one.
    pub fn interface_result(
        &self,
        netns: &str,
        ifname: &str,
        cni_version: &str,
    ) -> Result<Value, PlexusError> {
        let addr = self.ip(netns, &["-j", "addr", "show", "dev", ifname])?;
        let mut routes = Vec::new();
        for family in ["-4", "-6"] {
            routes.push(self.ip(
                netns,
                &[family, "-j", "route", "show", "default", "dev", ifname],
            )?);
        }
        result_of(&addr, &routes, netns, cni_version).map_err(|e| PlexusError::Io {
            path: netns.into(),
            source: std::io::Error::other(format!("interface {ifname}: {e}")),
        })
    }
}

/// [`IpRoute::interface_result`] from what `ip -j addr show dev IF` and `ip -j route show default dev IF` (one
/// output per family) printed.
fn result_of(
    addr: &str,
    routes: &[String],
    netns: &str,
    cni_version: &str,
) -> Result<Value, String> {
    let links: Vec<Value> =
        serde_json::from_str(addr.trim()).map_err(|e| format!("`ip addr` printed {e}"))?;
    let [link] = links.as_slice() else {
        return Err(format!(
            "`ip addr` described {} interfaces, not one",
            links.len()
        ));
    };
    let name = link["ifname"]
        .as_str()
        .ok_or("`ip addr` gave no interface name")?;
    let gateways: Vec<IpAddr> = routes
        .iter()
        .filter_map(|r| serde_json::from_str::<Vec<Value>>(r.trim()).ok())
        .flatten()
        .filter_map(|r| r["gateway"].as_str()?.parse().ok())
        .collect();
    let mut ips = Vec::new();
    for a in link["addr_info"].as_array().into_iter().flatten() {
        if a["scope"] != "global" {
            continue;
        }
        let (Some(local), Some(prefix)) = (a["local"].as_str(), a["prefixlen"].as_u64()) else {
            continue;
        };
        let Ok(ip) = local.parse::<IpAddr>() else {
            continue;
        };
        let mut entry = serde_json::json!({"address": format!("{ip}/{prefix}"), "interface": 0});
        if let Some(gw) = gateways.iter().find(|g| g.is_ipv4() == ip.is_ipv4()) {
            entry["gateway"] = gw.to_string().into();
        }
        ips.push(entry);
    }
    let mut interface = serde_json::json!({"name": name, "sandbox": netns});
    if let Some(mac) = link["address"].as_str() {
        interface["mac"] = mac.into();
    }
    Ok(serde_json::json!({"cniVersion": cni_version, "interfaces": [interface], "ips": ips}))
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
        let addr = r#"[{"ifindex":2,"ifname":"eth0","address":"0a:58:0a:f4:00:05","addr_info":[
            {"family":"inet","local":"10.244.0.5","prefixlen":24,"scope":"global"},
            {"family":"inet6","local":"fd00::5","prefixlen":64,"scope":"global"},
            {"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"}]}]"#;
        let routes = [
            r#"[{"dst":"default","gateway":"10.244.0.1","dev":"eth0"}]"#.to_string(),
            "[]".to_string(),
        ];
        let r = result_of(addr, &routes, "/run/netns/p", "1.0.0").unwrap();
        assert_eq!(
            r,
            serde_json::json!({"cniVersion": "1.0.0",
                "interfaces": [{"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/run/netns/p"}],
                "ips": [{"address": "10.244.0.5/24", "interface": 0, "gateway": "10.244.0.1"},
                        {"address": "fd00::5/64", "interface": 0}]})
        );
        assert!(result_of("[]", &[], "/p", "1.0.0")
            .unwrap_err()
            .contains("0 interfaces"));
        assert!(result_of("not json", &[], "/p", "1.0.0").is_err());
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
