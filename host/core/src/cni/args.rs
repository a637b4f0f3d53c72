//! `CNI_ARGS`: `"K=V;K2=V2"` (spec section 2, parameters; libcni `types.LoadArgs`).

use std::fmt;
use std::str::FromStr;

use super::error::{CniErrorCode, ErrorCode};

/// A malformed `CNI_ARGS` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A `;`-separated element that is not exactly `KEY=VALUE` with a non-empty key.
    #[error("CNI_ARGS: invalid pair {0:?} (expected KEY=VALUE)")]
    InvalidPair(String),
    /// A key or value that cannot be written into `CNI_ARGS` (contains `;` or `=`, or an empty key).
    #[error("CNI_ARGS: cannot encode pair {key:?}={value:?}: keys must be non-empty and neither may contain ';' or '='")]
    Unencodable { key: String, value: String },
}

impl CniErrorCode for ArgsError {
    fn cni_code(&self) -> u32 {
        ErrorCode::InvalidEnvironment.code()
    }
}

/// Parsed `CNI_ARGS`, in order. Duplicate keys are kept; [`CniArgs::get`] returns the last one
/// (libcni assigns pairs in order, so the last wins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
}

impl CniArgs {
    /// No arguments.
    pub fn new() -> CniArgs {
        CniArgs::default()
    }

    /// Parses `"K=V;K2=V2"`. The empty string is no arguments. Like libcni, every element must split
    /// on `=` into exactly two parts (so a value may not contain `=`, and `"a=1;"` is malformed); a key
    /// must also be non-empty.
    pub fn parse(s: &str) -> Result<CniArgs, ArgsError> {
        if s.is_empty() {
            return Ok(CniArgs::default());
        }
        let pairs = s
            .split(';')
            .map(|pair| {
                let mut it = pair.split('=');
                match (it.next(), it.next(), it.next()) {
                    (Some(k), Some(v), None) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
                    _ => Err(ArgsError::InvalidPair(pair.to_owned())),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(CniArgs { pairs })
    }

    /// Builds from pairs, checking each can be encoded.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<CniArgs, ArgsError> {
        let mut args = CniArgs::default();
        for (k, v) in pairs {
            args.push(k, v)?;
        }
        Ok(args)
    }

    /// Appends a pair.
    pub fn push(
        &mut self,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<(), ArgsError> {
        let (key, value) = (key.into(), value.into());
        if key.is_empty() || key.contains([';', '=']) || value.contains([';', '=']) {
            return Err(ArgsError::Unencodable { key, value });
        }
        self.pairs.push((key, value));
        Ok(())
    }

    /// The value of the last pair with this key.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The pairs, in order.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.pairs
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }
}

impl fmt::Display for CniArgs {
    /// The `CNI_ARGS` encoding, `"K=V;K2=V2"` (empty for no pairs).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.pairs.iter().enumerate() {
            if i > 0 {
                f.write_str(";")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

impl FromStr for CniArgs {
    type Err = ArgsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CniArgs::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubelet_style_args() {
        let a = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
        )
        .unwrap();
        assert_eq!(a.len(), 5);
        assert_eq!(a.get("K8S_POD_NAMESPACE"), Some("default"));
        assert_eq!(a.get("K8S_POD_NAME"), Some("web-0"));
        assert_eq!(a.get("K8S_POD_UID"), Some("u-1"));
        assert_eq!(a.get("missing"), None);
        assert_eq!(a.pairs()[0], ("IgnoreUnknown".to_owned(), "1".to_owned()));
    }

    #[test]
    fn empty_is_no_args_and_empty_values_are_allowed() {
        assert!(CniArgs::parse("").unwrap().is_empty());
        let a = CniArgs::parse("A=").unwrap();
        assert_eq!(a.get("A"), Some(""));
        assert_eq!(a.to_string(), "A=");
    }

    #[test]
    fn last_duplicate_wins() {
        let a = CniArgs::parse("A=1;B=2;A=3").unwrap();
        assert_eq!(a.get("A"), Some("3"));
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn malformed_pairs_are_named() {
        for (input, pair) in [
            ("A", "A"),
            ("A=1;B", "B"),
            ("A=1;", ""),
            (";A=1", ""),
            ("A=1=2", "A=1=2"),
            ("=1", "=1"),
            ("A=1;;B=2", ""),
        ] {
            let err = CniArgs::parse(input).unwrap_err();
            assert_eq!(err, ArgsError::InvalidPair(pair.to_owned()), "{input}");
            assert!(err.to_string().contains(&format!("{pair:?}")), "{err}");
        }
    }

    #[test]
    fn builds_and_round_trips() {
        let a = CniArgs::from_pairs([("K8S_POD_NAMESPACE", "ns"), ("K8S_POD_NAME", "p")]).unwrap();
        let s = a.to_string();
        assert_eq!(s, "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p");
        assert_eq!(s.parse::<CniArgs>().unwrap(), a);
        assert_eq!(CniArgs::new().to_string(), "");
    }

    #[test]
    fn refuses_to_build_unencodable_pairs() {
        for (k, v) in [
            ("", "x"),
            ("a;b", "x"),
            ("a=b", "x"),
            ("a", "x;y"),
            ("a", "x=y"),
        ] {
            let err = CniArgs::from_pairs([(k, v)]).unwrap_err();
            assert_eq!(
                err,
                ArgsError::Unencodable {
                    key: k.into(),
                    value: v.into()
                }
            );
        }
        let mut a = CniArgs::new();
        assert!(a.push("ok", "fine").is_ok());
        assert!(a.push("bad", "x;y").is_err());
        assert_eq!(a.len(), 1, "a rejected pair is not added");
    }
}
