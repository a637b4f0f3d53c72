//! The ADD success result (spec section 5), in one typed model that reads and writes every version's
//! shape.
//!
//! Conversion follows libcni (`pkg/types/{020,040,100}`):
//! * up from 0.1.0/0.2.0: `ip4` then `ip6` become `ips` (no `interface` index, no interfaces); their
//!   `routes` are concatenated (ip4's first) into the top-level `routes`.
//! * 0.3.x/0.4.0 `ips[].version` is dropped going to 1.x and derived from the address going from 1.x
//!   down to 0.3.x/0.4.0 (on input it may be omitted; if present it must be "4" or "6" and match the
//!   address).
//! * down to 0.1.0/0.2.0: interfaces and `interface` indices are dropped; only the FIRST address of
//!   each family is kept (as `ip4`/`ip6`, with its gateway); each route goes (dst and gw only) under
//!   the `ip4`/`ip6` of its destination's family, and is dropped if that family has no address. A
//!   result from 0.3.0 or later with no address at all cannot be converted (libcni: "no valid IP
//!   addresses") — [`ResultError::NoIpAddresses`].
//! * Empty lists, empty strings, a zero `mtu`/`advmss`/`priority` and an all-empty `dns` are omitted, as
//!   libcni's `omitempty` does.
//!
//! Deliberate difference: each target version gets exactly the fields its specification defines.
//! libcni shares one Go `Route` type (and one `Interface` type for 1.0.0/1.1.0) across versions, so it
//! also writes the 1.1.0-only fields (interface `mtu`/`socketPath`/`pciID`; route
//! `mtu`/`advmss`/`priority`/`table`/`scope`) into 1.0.0 results, and the route ones into 0.3.x/0.4.0
//! results; here they are emitted only for 1.1.0. Unknown keys in the input are ignored (as libcni's
//! decoding does).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::error::{kind, CniErrorCode, ErrorCode};
use super::version::{CniVersion, UnsupportedVersion};

/// An address with a prefix length, written in CIDR notation (`"10.1.2.3/24"`). The host bits are kept
/// (as libcni's `types.ParseCIDR` keeps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpNet {
    pub addr: IpAddr,
    pub prefix_len: u8,
}

/// A string that is not `address/prefix`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR address {0:?}")]
pub struct IpNetParseError(pub String);

impl IpNet {
    /// `None` if the prefix is longer than the address.
    pub fn new(addr: IpAddr, prefix_len: u8) -> Option<IpNet> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix_len <= max).then_some(IpNet { addr, prefix_len })
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }
}

impl FromStr for IpNet {
    type Err = IpNetParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || IpNetParseError(s.to_owned());
        let (addr, prefix) = s.split_once('/').ok_or_else(err)?;
        if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let addr: IpAddr = addr.parse().map_err(|_| err())?;
        IpNet::new(addr, prefix.parse().map_err(|_| err())?).ok_or_else(err)
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl Serialize for IpNet {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IpNet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// An interface created by the attachment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub mac: Option<String>,
    /// 1.1.0 only.
    pub mtu: Option<u32>,
    pub sandbox: Option<String>,
    /// 1.1.0 only.
    pub socket_path: Option<String>,
    /// 1.1.0 only.
    pub pci_id: Option<String>,
}

/// An address assigned by the attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    pub address: IpNet,
    pub gateway: Option<IpAddr>,
    /// Index into [`CniResult::interfaces`] (0.3.0 and later).
    pub interface: Option<u32>,
}

/// A route created by the attachment. Fields after `gw` are 1.1.0 only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    pub priority: Option<u32>,
    pub table: Option<u32>,
    pub scope: Option<u32>,
}

impl Route {
    /// A route with only a destination and an optional gateway.
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Route {
        Route {
            dst,
            gw,
            mtu: None,
            advmss: None,
            priority: None,
            table: None,
            scope: None,
        }
    }
}

/// DNS information.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// An ADD result, version-independent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniResult {
    /// The version the result was parsed from (or built for).
    pub cni_version: CniVersion,
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

/// Why a result could not be read or converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResultError {
    #[error("CNI result: {0}")]
    UnsupportedVersion(#[from] UnsupportedVersion),
    /// A field of the wrong type or with an invalid value; `path` names it (e.g. `ips[1].address`).
    #[error("invalid CNI result: {path}: {reason}")]
    Invalid { path: String, reason: String },
    /// A 0.3.0-or-later result without any address cannot be expressed as a 0.1.0/0.2.0 result.
    #[error("cannot convert CNI result to version {target}: it has no IP addresses, which {target} requires")]
    NoIpAddresses { target: CniVersion },
}

impl CniErrorCode for ResultError {
    fn cni_code(&self) -> u32 {
        match self {
            ResultError::UnsupportedVersion(_) | ResultError::NoIpAddresses { .. } => {
                ErrorCode::IncompatibleVersion.code()
            }
            ResultError::Invalid { .. } => ErrorCode::Decoding.code(),
        }
    }
}

fn invalid(path: impl Into<String>, reason: impl Into<String>) -> ResultError {
    ResultError::Invalid {
        path: path.into(),
        reason: reason.into(),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// Reading helpers: missing and `null` are "absent" (Go's decoding treats `null` as the zero value).
struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: String,
}

impl<'a> Obj<'a> {
    fn new(v: &'a Value, path: String) -> Result<Obj<'a>, ResultError> {
        match v {
            Value::Object(map) => Ok(Obj { map, path }),
            other => Err(invalid(
                if path.is_empty() {
                    "result".into()
                } else {
                    path
                },
                format!("expected an object, got {}", kind(other)),
            )),
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn at(&self, key: &str) -> String {
        join(&self.path, key)
    }

    fn string(&self, key: &str) -> Result<Option<String>, ResultError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(invalid(
                self.at(key),
                format!("expected a string, got {}", kind(other)),
            )),
        }
    }

    fn uint(&self, key: &str) -> Result<Option<u32>, ResultError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    invalid(
                        self.at(key),
                        format!("expected an unsigned 32-bit integer, got {v}"),
                    )
                }),
        }
    }

    /// `omitempty` integers: 0 means unset.
    fn nonzero_uint(&self, key: &str) -> Result<Option<u32>, ResultError> {
        Ok(self.uint(key)?.filter(|n| *n != 0))
    }

    fn ipnet(&self, key: &str) -> Result<IpNet, ResultError> {
        match self.get(key) {
            None => Err(invalid(self.at(key), "missing")),
            Some(Value::String(s)) => s
                .parse()
                .map_err(|e: IpNetParseError| invalid(self.at(key), e.to_string())),
            Some(other) => Err(invalid(
                self.at(key),
                format!("expected a CIDR string, got {}", kind(other)),
            )),
        }
    }

    /// An IP address; `""` is absent (as Go's `net.IP` text decoding treats it).
    fn ip(&self, key: &str) -> Result<Option<IpAddr>, ResultError> {
        match self.string(key)? {
            None => Ok(None),
            Some(s) => s
                .parse()
                .map(Some)
                .map_err(|_| invalid(self.at(key), format!("invalid IP address {s:?}"))),
        }
    }

    fn array(&self, key: &str) -> Result<&'a [Value], ResultError> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(a)) => Ok(a),
            Some(other) => Err(invalid(
                self.at(key),
                format!("expected an array, got {}", kind(other)),
            )),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, ResultError> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(invalid(
                    format!("{}[{i}]", self.at(key)),
                    format!("expected a string, got {}", kind(other)),
                )),
            })
            .collect()
    }

    fn objects(&self, key: &str) -> Result<Vec<Obj<'a>>, ResultError> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| Obj::new(v, format!("{}[{i}]", self.at(key))))
            .collect()
    }
}

fn parse_route(o: &Obj<'_>) -> Result<Route, ResultError> {
    Ok(Route {
        dst: o.ipnet("dst")?,
        gw: o.ip("gw")?,
        mtu: o.nonzero_uint("mtu")?,
        advmss: o.nonzero_uint("advmss")?,
        priority: o.nonzero_uint("priority")?,
        table: o.uint("table")?,
        scope: o.uint("scope")?,
    })
}

fn parse_dns(o: &Obj<'_>) -> Result<Dns, ResultError> {
    match o.get("dns") {
        None => Ok(Dns::default()),
        Some(v) => {
            let d = Obj::new(v, o.at("dns"))?;
            Ok(Dns {
                nameservers: d.strings("nameservers")?,
                domain: d.string("domain")?,
                search: d.strings("search")?,
                options: d.strings("options")?,
            })
        }
    }
}

impl CniResult {
    /// An empty result of `version`.
    pub fn new(cni_version: CniVersion) -> CniResult {
        CniResult {
            cni_version,
            interfaces: Vec::new(),
            ips: Vec::new(),
            routes: Vec::new(),
            dns: Dns::default(),
        }
    }

    /// The version the result was parsed from.
    pub fn source_version(&self) -> CniVersion {
        self.cni_version
    }

    /// Reads a result of any supported version; its `cniVersion` selects the shape (missing or `""`
    /// means 0.1.0, as in libcni).
    pub fn parse(value: &Value) -> Result<CniResult, ResultError> {
        let o = Obj::new(value, String::new())?;
        let version = match o.get("cniVersion") {
            None => CniVersion::V0_1_0,
            Some(Value::String(s)) if s.is_empty() => CniVersion::V0_1_0,
            Some(Value::String(s)) => s.parse()?,
            Some(other) => {
                return Err(invalid(
                    "cniVersion",
                    format!("expected a string, got {}", kind(other)),
                ))
            }
        };
        let mut result = CniResult::new(version);
        result.dns = parse_dns(&o)?;

        if version.legacy_result() {
            for key in ["ip4", "ip6"] {
                let Some(v) = o.get(key) else { continue };
                let ipc = Obj::new(v, key.to_owned())?;
                let address = ipc.ipnet("ip")?;
                if address.is_ipv4() != (key == "ip4") {
                    return Err(invalid(
                        ipc.at("ip"),
                        format!(
                            "{address} is not an {} address",
                            if key == "ip4" { "IPv4" } else { "IPv6" }
                        ),
                    ));
                }
                result.ips.push(IpConfig {
                    address,
                    gateway: ipc.ip("gateway")?,
                    interface: None,
                });
                for r in ipc.objects("routes")? {
                    result.routes.push(parse_route(&r)?);
                }
            }
            return Ok(result);
        }

        for i in o.objects("interfaces")? {
            result.interfaces.push(Interface {
                name: i.string("name")?.unwrap_or_default(),
                mac: i.string("mac")?,
                mtu: i.nonzero_uint("mtu")?,
                sandbox: i.string("sandbox")?,
                socket_path: i.string("socketPath")?,
                pci_id: i.string("pciID")?,
            });
        }
        for ipc in o.objects("ips")? {
            let address = ipc.ipnet("address")?;
            if version < CniVersion::V1_0_0 {
                match ipc.get("version") {
                    None => {}
                    Some(Value::String(s)) if s == "4" || s == "6" => {}
                    Some(other) => {
                        return Err(invalid(
                            ipc.at("version"),
                            format!("expected \"4\" or \"6\", got {other}"),
                        ))
                    }
                }
                if let Some(Value::String(s)) = ipc.get("version") {
                    if (s == "4") != address.is_ipv4() {
                        return Err(invalid(
                            ipc.at("version"),
                            format!("{s:?} does not match address {address}"),
                        ));
                    }
                }
            }
            result.ips.push(IpConfig {
                address,
                gateway: ipc.ip("gateway")?,
                interface: ipc.uint("interface")?,
            });
        }
        for r in o.objects("routes")? {
            result.routes.push(parse_route(&r)?);
        }
        Ok(result)
    }

    /// Parses `value` and writes it as `target` (see [`CniResult::to_json`]).
    pub fn convert(value: &Value, target: CniVersion) -> Result<Value, ResultError> {
        CniResult::parse(value)?.to_json(target)
    }

    /// Writes the result in exactly `target`'s shape, with `cniVersion` set to `target`.
    pub fn to_json(&self, target: CniVersion) -> Result<Value, ResultError> {
        let mut out = Map::new();
        out.insert("cniVersion".into(), target.as_str().into());
        if target.legacy_result() {
            self.write_legacy(target, &mut out)?;
        } else {
            let full = target >= CniVersion::V1_1_0;
            let with_version = target < CniVersion::V1_0_0;
            if !self.interfaces.is_empty() {
                let list = self
                    .interfaces
                    .iter()
                    .map(|i| interface_json(i, full))
                    .collect();
                out.insert("interfaces".into(), Value::Array(list));
            }
            if !self.ips.is_empty() {
                let list = self
                    .ips
                    .iter()
                    .map(|ip| ip_json(ip, with_version))
                    .collect();
                out.insert("ips".into(), Value::Array(list));
            }
            if !self.routes.is_empty() {
                let list = self.routes.iter().map(|r| route_json(r, full)).collect();
                out.insert("routes".into(), Value::Array(list));
            }
        }
        if !self.dns.is_empty() {
            out.insert("dns".into(), dns_json(&self.dns));
        }
        Ok(Value::Object(out))
    }

    fn write_legacy(
        &self,
        target: CniVersion,
        out: &mut Map<String, Value>,
    ) -> Result<(), ResultError> {
        let ip4 = self.ips.iter().find(|ip| ip.address.is_ipv4());
        let ip6 = self.ips.iter().find(|ip| !ip.address.is_ipv4());
        if ip4.is_none() && ip6.is_none() && !self.cni_version.legacy_result() {
            return Err(ResultError::NoIpAddresses { target });
        }
        for (key, ip, v4) in [("ip4", ip4, true), ("ip6", ip6, false)] {
            let Some(ip) = ip else { continue };
            let mut o = Map::new();
            o.insert("ip".into(), ip.address.to_string().into());
            if let Some(gw) = ip.gateway {
                o.insert("gateway".into(), gw.to_string().into());
            }
            let routes: Vec<Value> = self
                .routes
                .iter()
                .filter(|r| r.dst.is_ipv4() == v4)
                .map(|r| route_json(&Route::new(r.dst, r.gw), false))
                .collect();
            if !routes.is_empty() {
                o.insert("routes".into(), Value::Array(routes));
            }
            out.insert(key.into(), Value::Object(o));
        }
        Ok(())
    }
}

fn put_str(o: &mut Map<String, Value>, key: &str, v: &Option<String>) {
    if let Some(s) = v {
        o.insert(key.into(), s.clone().into());
    }
}

fn put_u32(o: &mut Map<String, Value>, key: &str, v: Option<u32>) {
    if let Some(n) = v {
        o.insert(key.into(), n.into());
    }
}

fn interface_json(i: &Interface, full: bool) -> Value {
    let mut o = Map::new();
    o.insert("name".into(), i.name.clone().into());
    put_str(&mut o, "mac", &i.mac);
    if full {
        put_u32(&mut o, "mtu", i.mtu);
    }
    put_str(&mut o, "sandbox", &i.sandbox);
    if full {
        put_str(&mut o, "socketPath", &i.socket_path);
        put_str(&mut o, "pciID", &i.pci_id);
    }
    Value::Object(o)
}

fn ip_json(ip: &IpConfig, with_version: bool) -> Value {
    let mut o = Map::new();
    if with_version {
        o.insert(
            "version".into(),
            if ip.address.is_ipv4() { "4" } else { "6" }.into(),
        );
    }
    put_u32(&mut o, "interface", ip.interface);
    o.insert("address".into(), ip.address.to_string().into());
    if let Some(gw) = ip.gateway {
        o.insert("gateway".into(), gw.to_string().into());
    }
    Value::Object(o)
}

fn route_json(r: &Route, full: bool) -> Value {
    let mut o = Map::new();
    o.insert("dst".into(), r.dst.to_string().into());
    if let Some(gw) = r.gw {
        o.insert("gw".into(), gw.to_string().into());
    }
    if full {
        put_u32(&mut o, "mtu", r.mtu);
        put_u32(&mut o, "advmss", r.advmss);
        put_u32(&mut o, "priority", r.priority);
        put_u32(&mut o, "table", r.table);
        put_u32(&mut o, "scope", r.scope);
    }
    Value::Object(o)
}

fn dns_json(d: &Dns) -> Value {
    let mut o = Map::new();
    let list = |v: &[String]| Value::Array(v.iter().cloned().map(Value::String).collect());
    if !d.nameservers.is_empty() {
        o.insert("nameservers".into(), list(&d.nameservers));
    }
    put_str(&mut o, "domain", &d.domain);
    if !d.search.is_empty() {
        o.insert("search".into(), list(&d.search));
    }
    if !d.options.is_empty() {
        o.insert("options".into(), list(&d.options));
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn ipnet_parsing() {
        assert_eq!(net("10.1.2.3/24").to_string(), "10.1.2.3/24");
        assert_eq!(net("2001:DB8::1/64").to_string(), "2001:db8::1/64");
        assert_eq!(net("0.0.0.0/0").prefix_len, 0);
        assert!(net("::/0").addr.is_ipv6());
        for bad in [
            "10.1.2.3",
            "10.1.2.3/33",
            "::1/129",
            "10.1.2.3/",
            "x/24",
            "10.1.2.3/+1",
            "10.1.2.3/0024",
            "/24",
        ] {
            assert_eq!(
                bad.parse::<IpNet>(),
                Err(IpNetParseError(bad.into())),
                "{bad}"
            );
        }
        let v: IpNet = serde_json::from_value(json!("192.168.0.1/16")).unwrap();
        assert_eq!(serde_json::to_value(v).unwrap(), json!("192.168.0.1/16"));
    }

    #[test]
    fn parses_a_current_result() {
        let r = CniResult::parse(&json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "mtu": 1450, "sandbox": "/var/run/netns/x",
                            "socketPath": "/run/s.sock", "pciID": "0000:00:1f.6"}],
            "ips": [{"address": "10.1.0.5/16", "gateway": "10.1.0.1", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1", "mtu": 1400, "advmss": 1360, "priority": 10, "table": 0, "scope": 253}],
            "dns": {"nameservers": ["10.1.0.1"], "domain": "d", "search": ["a"], "options": ["ndots:5"]},
            "unknown": true
        }))
        .unwrap();
        assert_eq!(r.source_version(), CniVersion::V1_1_0);
        assert_eq!(r.interfaces[0].mtu, Some(1450));
        assert_eq!(r.interfaces[0].pci_id.as_deref(), Some("0000:00:1f.6"));
        assert_eq!(r.ips[0].interface, Some(0));
        assert_eq!(r.ips[0].gateway, Some("10.1.0.1".parse().unwrap()));
        assert_eq!(
            r.routes[0].table,
            Some(0),
            "table 0 is meaningful (a pointer in libcni)"
        );
        assert_eq!(r.routes[0].scope, Some(253));
        assert_eq!(r.routes[0].advmss, Some(1360));
        assert_eq!(r.dns.options, ["ndots:5"]);
    }

    #[test]
    fn missing_version_means_0_1_0() {
        let r = CniResult::parse(&json!({"ip4": {"ip": "10.0.0.2/8"}})).unwrap();
        assert_eq!(r.source_version(), CniVersion::V0_1_0);
        assert_eq!(r.ips.len(), 1);
        let r = CniResult::parse(&json!({"cniVersion": "", "ip6": {"ip": "fd00::2/64"}})).unwrap();
        assert_eq!(r.source_version(), CniVersion::V0_1_0);
        assert!(r.ips[0].address.addr.is_ipv6());
    }

    #[test]
    fn invalid_results_name_the_field() {
        for (v, path) in [
            (json!([]), "result"),
            (json!({"cniVersion": 1}), "cniVersion"),
            (
                json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1"}]}),
                "ips[0].address",
            ),
            (
                json!({"cniVersion": "1.0.0", "ips": [{}]}),
                "ips[0].address",
            ),
            (
                json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/8", "gateway": "nope"}]}),
                "ips[0].gateway",
            ),
            (
                json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/8", "interface": -1}]}),
                "ips[0].interface",
            ),
            (
                json!({"cniVersion": "1.0.0", "interfaces": {}}),
                "interfaces",
            ),
            (
                json!({"cniVersion": "1.0.0", "interfaces": [{"name": 3}]}),
                "interfaces[0].name",
            ),
            (
                json!({"cniVersion": "1.1.0", "interfaces": [{"name": "a", "mtu": "1500"}]}),
                "interfaces[0].mtu",
            ),
            (
                json!({"cniVersion": "1.1.0", "routes": [{"dst": "0.0.0.0/0", "table": 1.5}]}),
                "routes[0].table",
            ),
            (
                json!({"cniVersion": "1.0.0", "routes": [{"gw": "10.0.0.1"}]}),
                "routes[0].dst",
            ),
            (
                json!({"cniVersion": "1.0.0", "dns": {"nameservers": [1]}}),
                "dns.nameservers[0]",
            ),
            (
                json!({"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "fd00::1/64"}]}),
                "ips[0].version",
            ),
            (
                json!({"cniVersion": "0.3.1", "ips": [{"version": "5", "address": "10.0.0.1/8"}]}),
                "ips[0].version",
            ),
            (
                json!({"cniVersion": "0.3.0", "ips": [{"version": 4, "address": "10.0.0.1/8"}]}),
                "ips[0].version",
            ),
            (
                json!({"cniVersion": "0.2.0", "ip4": {"ip": "fd00::1/64"}}),
                "ip4.ip",
            ),
            (
                json!({"cniVersion": "0.2.0", "ip6": {"ip": "10.0.0.1/8"}}),
                "ip6.ip",
            ),
            (
                json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.1/8", "routes": [{"dst": 1}]}}),
                "ip4.routes[0].dst",
            ),
        ] {
            match CniResult::parse(&v) {
                Err(ResultError::Invalid { path: p, .. }) => assert_eq!(p, path, "{v}"),
                other => panic!("{v}: expected Invalid at {path}, got {other:?}"),
            }
        }
        let err = CniResult::parse(&json!({"cniVersion": "0.5.0"})).unwrap_err();
        assert_eq!(
            err,
            ResultError::UnsupportedVersion(UnsupportedVersion("0.5.0".into()))
        );
        assert!(err.to_string().contains("0.5.0"));
    }

    #[test]
    fn version_field_is_ignored_in_1x_and_optional_in_0x() {
        let r = CniResult::parse(
            &json!({"cniVersion": "1.0.0", "ips": [{"version": "4", "address": "fd00::1/64"}]}),
        )
        .unwrap();
        assert_eq!(r.ips[0].address, net("fd00::1/64"));
        let r =
            CniResult::parse(&json!({"cniVersion": "0.4.0", "ips": [{"address": "fd00::1/64"}]}))
                .unwrap();
        let out = r.to_json(CniVersion::V0_4_0).unwrap();
        assert_eq!(out["ips"][0]["version"], "6", "derived from the address");
    }

    #[test]
    fn null_and_empty_mean_absent() {
        let r = CniResult::parse(&json!({
            "cniVersion": "1.1.0", "interfaces": null,
            "ips": [{"address": "10.0.0.2/24", "gateway": "", "interface": null}],
            "routes": [{"dst": "0.0.0.0/0", "gw": null, "mtu": 0}], "dns": {}
        }))
        .unwrap();
        assert_eq!(r.ips[0].gateway, None);
        assert_eq!(r.ips[0].interface, None);
        assert_eq!(r.routes[0], Route::new(net("0.0.0.0/0"), None));
        assert_eq!(
            r.to_json(CniVersion::V1_1_0).unwrap(),
            json!({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24"}], "routes": [{"dst": "0.0.0.0/0"}]})
        );
    }

    #[test]
    fn empty_result_to_legacy() {
        let ipam_less =
            CniResult::parse(&json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0"}]}))
                .unwrap();
        for t in [CniVersion::V0_1_0, CniVersion::V0_2_0] {
            assert_eq!(
                ipam_less.to_json(t),
                Err(ResultError::NoIpAddresses { target: t })
            );
        }
        assert!(ipam_less.to_json(CniVersion::V0_3_0).is_ok());
        // libcni only refuses when going down from 0.3.0+; a legacy result without IPs stays convertible.
        let legacy =
            CniResult::parse(&json!({"cniVersion": "0.2.0", "dns": {"domain": "x"}})).unwrap();
        assert_eq!(
            legacy.to_json(CniVersion::V0_1_0).unwrap(),
            json!({"cniVersion": "0.1.0", "dns": {"domain": "x"}})
        );
    }
}
