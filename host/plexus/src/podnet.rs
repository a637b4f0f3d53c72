//! Changes inside the pod's network namespace that no delegate makes: default-route selection (spec 4.1.2.1.9).

use std::net::IpAddr;
use std::process::Command;

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

/// Uses `nsenter --net=<netns> ip ...`, which works for named namespaces and `/proc/<pid>/ns/net` alike.
#[derive(Debug, Default)]
pub struct IpRoute;

impl IpRoute {
    fn ip(&self, netns: &str, args: &[&str]) -> Result<String, PlexusError> {
        let out = Command::new("nsenter")
            .arg(format!("--net={netns}"))
            .arg("ip")
            .args(args)
            .output()
            .map_err(|source| PlexusError::Io {
                path: "nsenter".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(PlexusError::Io {
                path: netns.into(),
                source: std::io::Error::other(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
            });
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
                PlexusError::Config(format!("default-route gateway {gw} on {target}: {e}"))
            })?;
        }
        Ok(())
    }
}
