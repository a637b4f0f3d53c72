//! CNI specification versions.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A released CNI specification version. Ordered oldest to newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    V0_1_0,
    V0_2_0,
    V0_3_0,
    V0_3_1,
    V0_4_0,
    V1_0_0,
    V1_1_0,
}

impl CniVersion {
    /// Every supported version, oldest first.
    pub const ALL: [CniVersion; 7] = [
        CniVersion::V0_1_0,
        CniVersion::V0_2_0,
        CniVersion::V0_3_0,
        CniVersion::V0_3_1,
        CniVersion::V0_4_0,
        CniVersion::V1_0_0,
        CniVersion::V1_1_0,
    ];

    /// The newest version this crate implements.
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    /// The version string, e.g. `"0.3.1"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_1_0 => "0.1.0",
            CniVersion::V0_2_0 => "0.2.0",
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// `CHECK` exists from 0.4.0 on.
    pub fn supports_check(self) -> bool {
        self >= CniVersion::V0_4_0
    }

    /// `STATUS` and `GC` exist from 1.1.0 on.
    pub fn supports_status_gc(self) -> bool {
        self >= CniVersion::V1_1_0
    }

    /// Results of 0.1.0 and 0.2.0 use the legacy `ip4`/`ip6` shape.
    pub fn legacy_result(self) -> bool {
        self < CniVersion::V0_3_0
    }

    /// The `(major, minor, patch)` triple.
    pub const fn triple(self) -> (u64, u64, u64) {
        match self {
            CniVersion::V0_1_0 => (0, 1, 0),
            CniVersion::V0_2_0 => (0, 2, 0),
            CniVersion::V0_3_0 => (0, 3, 0),
            CniVersion::V0_3_1 => (0, 3, 1),
            CniVersion::V0_4_0 => (0, 4, 0),
            CniVersion::V1_0_0 => (1, 0, 0),
            CniVersion::V1_1_0 => (1, 1, 0),
        }
    }
}

/// Parses a version the way libcni's `version.ParseVersion` does: one to three dot-separated
/// non-negative integers (missing parts are 0). `None` if malformed.
pub(crate) fn parse_triple(s: &str) -> Option<(u64, u64, u64)> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() > 3 {
        return None;
    }
    let mut out = [0u64; 3];
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        out[i] = p.parse().ok()?;
    }
    Some((out[0], out[1], out[2]))
}

impl fmt::Display for CniVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A version string that is not one of [`CniVersion::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsupported CNI version {0:?} (supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)"
)]
pub struct UnsupportedVersion(pub String);

impl FromStr for CniVersion {
    type Err = UnsupportedVersion;

    /// Exact version strings only (`"0.3.1"`, not `"0.3"` or `" 0.3.1"`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CniVersion::ALL
            .iter()
            .copied()
            .find(|v| v.as_str() == s)
            .ok_or_else(|| UnsupportedVersion(s.to_owned()))
    }
}

impl Serialize for CniVersion {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CniVersion {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::error::CniErrorCode;

    #[test]
    fn round_trips_every_version_string() {
        let strings = [
            "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
        ];
        assert_eq!(CniVersion::ALL.len(), strings.len());
        for (v, s) in CniVersion::ALL.iter().zip(strings) {
            assert_eq!(v.to_string(), s);
            assert_eq!(s.parse::<CniVersion>().unwrap(), *v);
            assert_eq!(parse_triple(s), Some(v.triple()));
        }
    }

    #[test]
    fn all_is_sorted_and_ord_matches_semver() {
        for w in CniVersion::ALL.windows(2) {
            assert!(w[0] < w[1], "{} < {}", w[0], w[1]);
            assert!(w[0].triple() < w[1].triple());
        }
        assert_eq!(CniVersion::LATEST, *CniVersion::ALL.last().unwrap());
    }

    #[test]
    fn unsupported_versions_are_named() {
        for bad in [
            "", "0.5.0", "1.2.0", "0.3", "1.0", "v1.0.0", " 1.0.0", "1.0.0 ",
        ] {
            let err = bad.parse::<CniVersion>().unwrap_err();
            assert_eq!(err, UnsupportedVersion(bad.to_owned()));
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
            assert_eq!(err.cni_code(), 1);
        }
    }

    #[test]
    fn feature_predicates() {
        use CniVersion::*;
        let check: Vec<_> = CniVersion::ALL
            .iter()
            .filter(|v| v.supports_check())
            .collect();
        assert_eq!(check, [&V0_4_0, &V1_0_0, &V1_1_0]);
        let gc: Vec<_> = CniVersion::ALL
            .iter()
            .filter(|v| v.supports_status_gc())
            .collect();
        assert_eq!(gc, [&V1_1_0]);
        let legacy: Vec<_> = CniVersion::ALL
            .iter()
            .filter(|v| v.legacy_result())
            .collect();
        assert_eq!(legacy, [&V0_1_0, &V0_2_0]);
    }

    #[test]
    fn serde_as_string() {
        let v: CniVersion = serde_json::from_str("\"0.3.1\"").unwrap();
        assert_eq!(v, CniVersion::V0_3_1);
        assert_eq!(
            serde_json::to_string(&CniVersion::V1_1_0).unwrap(),
            "\"1.1.0\""
        );
        let err = serde_json::from_str::<CniVersion>("\"9.9.9\"").unwrap_err();
        assert!(err.to_string().contains("9.9.9"), "{err}");
        assert!(serde_json::from_str::<CniVersion>("1").is_err());
    }

    #[test]
    fn triple_parsing_like_libcni() {
        assert_eq!(parse_triple("1"), Some((1, 0, 0)));
        assert_eq!(parse_triple("0.3"), Some((0, 3, 0)));
        assert_eq!(parse_triple("10.20.30"), Some((10, 20, 30)));
        for bad in ["", "1.2.3.4", "a.b.c", "1..2", "-1.0.0", "1.0.0-rc1"] {
            assert_eq!(parse_triple(bad), None, "{bad}");
        }
    }
}
