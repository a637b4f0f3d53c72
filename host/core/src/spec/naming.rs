//! Name rules: CNI container IDs, interface names and network names (CNI SPEC.md, libcni), DNS-1123 labels
//! (multi-net spec 3.3), and interface-name allocation for attachments (spec 4.1.2.1.5, 4.2.1).

use thiserror::Error;

/// The longest interface name the kernel accepts: `IFNAMSIZ` (16) minus the terminating NUL.
pub const MAX_IFNAME_LEN: usize = 15;

/// A name that breaks one of the rules in this module. Every variant carries the offending value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NamingError {
    /// CNI SPEC.md: the container ID "must not be empty".
    #[error("container ID is empty")]
    EmptyContainerId,
    /// CNI SPEC.md: "must start with an alphanumeric character, optionally followed by any combination of one or
    /// more alphanumeric characters, underscore (_), dot (.) or hyphen (-)".
    #[error("container ID {0:?} is invalid: it must start with an ASCII letter or digit and contain only ASCII letters, digits, '_', '.' and '-'")]
    InvalidContainerId(String),
    /// A name the kernel would refuse for a network interface (`dev_valid_name`).
    #[error("interface name {name:?} is invalid: {reason}")]
    InvalidIfName { name: String, reason: &'static str },
    /// CNI SPEC.md network configuration "name" rule.
    #[error("network name {0:?} is invalid: it must start with an ASCII letter or digit and contain only ASCII letters, digits, '_', '.' and '-'")]
    InvalidNetworkName(String),
    /// Multi-net spec 3.3.
    #[error("{0:?} is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)")]
    NotDns1123Label(String),
    /// Multi-net spec 4.1.2.1.5: "If the requested interface name is already used by a previous network
    /// attachment, the implementation must fail the current network attachment."
    #[error("interface name {name:?} is already used by {used_by}")]
    DuplicateIfName { name: String, used_by: String },
}

fn is_cni_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    match bytes.next() {
        Some(b) if b.is_ascii_alphanumeric() => {}
        _ => return false,
    }
    bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

/// `CNI_CONTAINERID` rule (CNI SPEC.md "Parameters"; libcni `ValidateContainerID`): non-empty, an ASCII
/// alphanumeric first character, then ASCII alphanumerics, `_`, `.` or `-`.
pub fn validate_container_id(id: &str) -> Result<(), NamingError> {
    if id.is_empty() {
        return Err(NamingError::EmptyContainerId);
    }
    if !is_cni_name(id) {
        return Err(NamingError::InvalidContainerId(id.to_owned()));
    }
    Ok(())
}

/// Network configuration `name` rule (CNI SPEC.md "Network configuration format"; libcni
/// `ValidateNetworkName`): same character rule as container IDs; the empty name is invalid.
pub fn validate_network_name(name: &str) -> Result<(), NamingError> {
    if !is_cni_name(name) {
        return Err(NamingError::InvalidNetworkName(name.to_owned()));
    }
    Ok(())
}

/// A valid Linux interface name, as the kernel's `dev_valid_name` checks it (and libcni's
/// `ValidateInterfaceName`): 1 to 15 bytes, not `.` or `..`, and no `/`, `:`, NUL or whitespace.
///
/// Whitespace is the union of what the two check: the kernel's `isspace` (ASCII space, `\t`, `\n`, `\v`,
/// `\f`, `\r`, and the byte 0xA0, which its Latin-1 ctype table classes as a space and which occurs inside
/// many UTF-8 sequences) and libcni's `unicode.IsSpace`.
pub fn validate_ifname(name: &str) -> Result<(), NamingError> {
    let bad = |reason| {
        Err(NamingError::InvalidIfName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("it is empty");
    }
    if name.len() > MAX_IFNAME_LEN {
        return bad("it is longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return bad("\".\" and \"..\" are not allowed");
    }
    if name.contains(['/', ':']) {
        return bad("it contains '/' or ':'");
    }
    if name.contains('\0') {
        return bad("it contains a NUL byte");
    }
    if name.chars().any(char::is_whitespace)
        || name
            .bytes()
            .any(|b| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0xa0))
    {
        return bad("it contains whitespace");
    }
    Ok(())
}

/// Multi-net spec 3.3: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
///
/// The spec only *recommends* 63 characters or less, so length is not checked here (the API server already
/// refuses longer namespaces and object names, so such a reference can never resolve).
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => ok(first) && ok(last) && b.iter().all(|c| ok(c) || *c == b'-'),
        _ => false,
    }
}

/// [`is_dns1123_label`] as a `Result` naming the value.
pub fn validate_dns1123_label(s: &str) -> Result<(), NamingError> {
    if is_dns1123_label(s) {
        Ok(())
    } else {
        Err(NamingError::NotDns1123Label(s.to_owned()))
    }
}

/// A Kubernetes object name (DNS-1123 subdomain): at most 253 characters, dot-separated DNS-1123 labels.
/// Used for `ipam-claim-reference`, which names an IPAMClaim object (spec 4.1.2.1.11, 8.3).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Chooses `CNI_IFNAME` for each attachment of one pod, in selection order (spec 4.1.2.1.5, 4.2.1).
///
/// The k-th selection (1-based, counting after the cluster-wide default network) gets `net{k}` unless it
/// names its interface; an explicit name still consumes its position, as Multus does: `a,b@foo,c` gives
/// `net1`, `foo`, `net3`. A name equal to any earlier one, including the cluster network's, is an error.
#[derive(Debug, Clone)]
pub struct IfNameAllocator {
    /// Names handed out so far with who took them; the cluster network's is first.
    used: Vec<(String, String)>,
    position: usize,
}

impl IfNameAllocator {
    /// Starts allocation after the cluster-wide default network, whose interface is `cluster_ifname`.
    pub fn new(cluster_ifname: &str) -> Self {
        IfNameAllocator {
            used: vec![(
                cluster_ifname.to_owned(),
                "the cluster-wide default network".to_owned(),
            )],
            position: 0,
        }
    }

    /// The interface name for the next selection. `requested` is its `interface` key (or `@ifname`), which
    /// must be a valid interface name. Every call consumes a position, even a failing one.
    pub fn next(&mut self, requested: Option<&str>) -> Result<String, NamingError> {
        self.position += 1;
        let name = match requested {
            Some(r) => {
                validate_ifname(r)?;
                r.to_owned()
            }
            None => format!("net{}", self.position),
        };
        if let Some((_, by)) = self.used.iter().find(|(n, _)| *n == name) {
            return Err(NamingError::DuplicateIfName {
                name,
                used_by: by.clone(),
            });
        }
        self.used.push((
            name.clone(),
            format!("networks annotation element {}", self.position - 1),
        ));
        Ok(name)
    }

    /// The names handed out so far, the cluster network's first.
    pub fn used(&self) -> impl Iterator<Item = &str> {
        self.used.iter().map(|(n, _)| n.as_str())
    }
}
