//! The CNI error object (spec section 5, "Error") and the well-known error codes.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::version::{CniVersion, UnsupportedVersion};

/// The well-known error codes of the specification (0-99 are reserved; 100+ are plugin specific).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    /// 1: Incompatible CNI version.
    IncompatibleVersion = 1,
    /// 2: Unsupported field in network configuration.
    UnsupportedField = 2,
    /// 3: Container unknown or does not exist.
    UnknownContainer = 3,
    /// 4: Invalid necessary environment variables (CNI_COMMAND, CNI_ARGS, ...).
    InvalidEnvironment = 4,
    /// 5: I/O failure.
    Io = 5,
    /// 6: Failed to decode content.
    Decoding = 6,
    /// 7: Invalid network config.
    InvalidConfig = 7,
    /// 11: Try again later.
    TryAgainLater = 11,
    /// 50: The plugin is not available.
    PluginNotAvailable = 50,
    /// 51: The plugin is not available, and existing containers may have limited connectivity.
    LimitedConnectivity = 51,
}

impl ErrorCode {
    /// Every well-known code.
    pub const ALL: [ErrorCode; 10] = [
        ErrorCode::IncompatibleVersion,
        ErrorCode::UnsupportedField,
        ErrorCode::UnknownContainer,
        ErrorCode::InvalidEnvironment,
        ErrorCode::Io,
        ErrorCode::Decoding,
        ErrorCode::InvalidConfig,
        ErrorCode::TryAgainLater,
        ErrorCode::PluginNotAvailable,
        ErrorCode::LimitedConnectivity,
    ];

    /// The numeric code.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// The well-known code with this number, if any.
    pub fn from_code(code: u32) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.code() == code)
    }

    /// The specification's short description.
    pub const fn description(self) -> &'static str {
        match self {
            ErrorCode::IncompatibleVersion => "Incompatible CNI version",
            ErrorCode::UnsupportedField => "Unsupported field in network configuration",
            ErrorCode::UnknownContainer => "Container unknown or does not exist",
            ErrorCode::InvalidEnvironment => "Invalid necessary environment variables",
            ErrorCode::Io => "I/O failure",
            ErrorCode::Decoding => "Failed to decode content",
            ErrorCode::InvalidConfig => "Invalid network config",
            ErrorCode::TryAgainLater => "Try again later",
            ErrorCode::PluginNotAvailable => "The plugin is not available",
            ErrorCode::LimitedConnectivity => {
                "The plugin is not available, and existing containers may have limited connectivity"
            }
        }
    }
}

impl From<ErrorCode> for u32 {
    fn from(c: ErrorCode) -> u32 {
        c.code()
    }
}

/// Implemented by every error type that can end a CNI invocation, so that the binary maps errors to
/// codes in one place: `CniError::from_error(version, &err)`.
pub trait CniErrorCode {
    /// The CNI error code for this error (see [`ErrorCode`]; 100+ for Plexus-specific ones).
    fn cni_code(&self) -> u32;
}

/// The CNI error object, as written to stdout by a failing plugin:
/// `{"cniVersion": "1.1.0", "code": 7, "msg": "...", "details": "..."}` (`details` omitted when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniError {
    #[serde(rename = "cniVersion", default)]
    pub cni_version: String,
    pub code: u32,
    #[serde(default)]
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

/// A delegate's stdout that is not a CNI error object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a CNI error object: {0}")]
pub struct ErrorParseError(pub String);

impl CniErrorCode for ErrorParseError {
    fn cni_code(&self) -> u32 {
        ErrorCode::Decoding.code()
    }
}

impl CniError {
    /// An error object for `version`.
    pub fn new(
        version: CniVersion,
        code: impl Into<u32>,
        msg: impl Into<String>,
        details: impl Into<String>,
    ) -> CniError {
        CniError {
            cni_version: version.to_string(),
            code: code.into(),
            msg: msg.into(),
            details: details.into(),
        }
    }

    /// The error object for any error that knows its code; `msg` is its `Display`.
    pub fn from_error<E: CniErrorCode + fmt::Display + ?Sized>(
        version: CniVersion,
        err: &E,
    ) -> CniError {
        CniError::new(version, err.cni_code(), err.to_string(), "")
    }

    /// The well-known code, if this error's code is one.
    pub fn well_known(&self) -> Option<ErrorCode> {
        ErrorCode::from_code(self.code)
    }

    /// Serializes as the CNI error object.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).expect("CniError always serializes")
    }

    /// Parses an error object (e.g. a failing delegate's stdout, already decoded as JSON).
    /// `code` is required and must be a non-negative integer; `cniVersion`, `msg` and `details`
    /// default to empty (old plugins omit `cniVersion`). Unknown keys are ignored.
    pub fn parse(value: &Value) -> Result<CniError, ErrorParseError> {
        let obj = value.as_object().ok_or_else(|| {
            ErrorParseError(format!("expected a JSON object, got {}", kind(value)))
        })?;
        let code = match obj.get("code") {
            None => return Err(ErrorParseError("missing \"code\"".into())),
            Some(c) => c
                .as_u64()
                .and_then(|c| u32::try_from(c).ok())
                .ok_or_else(|| {
                    ErrorParseError(format!("\"code\" is not a non-negative integer: {c}"))
                })?,
        };
        let string = |key: &str| -> Result<String, ErrorParseError> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(other) => Err(ErrorParseError(format!("{key:?} is not a string: {other}"))),
            }
        };
        Ok(CniError {
            cni_version: string("cniVersion")?,
            code,
            msg: string("msg")?,
            details: string("details")?,
        })
    }

    /// Parses a delegate's raw stdout.
    pub fn parse_bytes(stdout: &[u8]) -> Result<CniError, ErrorParseError> {
        let value: Value = serde_json::from_slice(stdout)
            .map_err(|e| ErrorParseError(format!("invalid JSON: {e}")))?;
        CniError::parse(&value)
    }
}

impl fmt::Display for CniError {
    /// Like libcni: `msg`, then `; details` when there are details.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)?;
        if !self.details.is_empty() {
            write!(f, "; {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

// Here rather than beside the type, so that version.rs (which error objects need) does not import this module.
impl CniErrorCode for UnsupportedVersion {
    fn cni_code(&self) -> u32 {
        ErrorCode::IncompatibleVersion.code()
    }
}

impl CniErrorCode for CniError {
    fn cni_code(&self) -> u32 {
        self.code
    }
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cni::args::ArgsError;
    use crate::cni::conf::ConfError;
    use crate::cni::result::ResultError;
    use crate::cni::version::UnsupportedVersion;
    use serde_json::json;

    #[test]
    fn codes_match_the_spec_table() {
        let expected = [
            (ErrorCode::IncompatibleVersion, 1),
            (ErrorCode::UnsupportedField, 2),
            (ErrorCode::UnknownContainer, 3),
            (ErrorCode::InvalidEnvironment, 4),
            (ErrorCode::Io, 5),
            (ErrorCode::Decoding, 6),
            (ErrorCode::InvalidConfig, 7),
            (ErrorCode::TryAgainLater, 11),
            (ErrorCode::PluginNotAvailable, 50),
            (ErrorCode::LimitedConnectivity, 51),
        ];
        assert_eq!(ErrorCode::ALL.len(), expected.len());
        for (c, n) in expected {
            assert_eq!(c.code(), n);
            assert_eq!(u32::from(c), n);
            assert_eq!(ErrorCode::from_code(n), Some(c));
            assert!(!c.description().is_empty());
        }
        for n in [0, 8, 9, 10, 12, 49, 52, 100, 999] {
            assert_eq!(ErrorCode::from_code(n), None, "{n}");
        }
    }

    #[test]
    fn serializes_exactly_as_the_spec_object() {
        let e = CniError::new(
            CniVersion::V1_1_0,
            ErrorCode::InvalidConfig,
            "Invalid Configuration",
            "too small",
        );
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"cniVersion":"1.1.0","code":7,"msg":"Invalid Configuration","details":"too small"}"#
        );
        let e = CniError::new(CniVersion::V0_4_0, 11u32, "busy", "");
        assert_eq!(
            e.to_json(),
            json!({"cniVersion": "0.4.0", "code": 11, "msg": "busy"})
        );
        assert!(!e.to_json().as_object().unwrap().contains_key("details"));
    }

    #[test]
    fn parses_delegate_stdout() {
        let e = CniError::parse_bytes(
            br#"{"cniVersion":"1.0.0","code":7,"msg":"Invalid Configuration","details":"Network 192.168.0.0/31 too small to allocate from.","extra":1}"#,
        )
        .unwrap();
        assert_eq!(e.cni_version, "1.0.0");
        assert_eq!(e.code, 7);
        assert_eq!(e.well_known(), Some(ErrorCode::InvalidConfig));
        assert_eq!(
            e.to_string(),
            "Invalid Configuration; Network 192.168.0.0/31 too small to allocate from."
        );
        // Old plugins omit cniVersion and details.
        let e = CniError::parse(&json!({"code": 100, "msg": "plugin specific"})).unwrap();
        assert_eq!(
            e,
            CniError {
                cni_version: String::new(),
                code: 100,
                msg: "plugin specific".into(),
                details: String::new()
            }
        );
        assert_eq!(e.well_known(), None);
        assert_eq!(e.to_string(), "plugin specific");
    }

    #[test]
    fn rejects_non_error_objects() {
        for (v, needle) in [
            (json!([1]), "object"),
            (json!({"msg": "x"}), "missing \"code\""),
            (json!({"code": -1}), "non-negative"),
            (json!({"code": "7"}), "non-negative"),
            (json!({"code": 7, "msg": 3}), "\"msg\""),
            (json!({"code": 7, "details": {}}), "\"details\""),
        ] {
            let err = CniError::parse(&v).unwrap_err();
            assert!(err.to_string().contains(needle), "{v}: {err}");
            assert_eq!(err.cni_code(), 6);
        }
        assert!(CniError::parse_bytes(b"not json")
            .unwrap_err()
            .to_string()
            .contains("invalid JSON"));
    }

    #[test]
    fn core_errors_map_to_codes() {
        let v = UnsupportedVersion("9.0.0".into());
        assert_eq!(v.cni_code(), 1);
        let e = CniError::from_error(CniVersion::V1_0_0, &v);
        assert_eq!(e.code, 1);
        assert!(e.msg.contains("9.0.0"));
        assert_eq!(e.cni_version, "1.0.0");

        assert_eq!(ConfError::MissingName.cni_code(), 7);
        assert_eq!(ConfError::MissingType { index: 0 }.cni_code(), 7);
        assert_eq!(ConfError::UnsupportedCniVersion(v.clone()).cni_code(), 1);
        assert_eq!(ConfError::NotAnObject("an array").cni_code(), 6);

        assert_eq!(ResultError::UnsupportedVersion(v.clone()).cni_code(), 1);
        assert_eq!(
            ResultError::Invalid {
                path: "ips[0].address".into(),
                reason: "bad".into()
            }
            .cni_code(),
            6
        );
        assert_eq!(
            ResultError::NoIpAddresses {
                target: CniVersion::V0_2_0
            }
            .cni_code(),
            1
        );

        assert_eq!(ArgsError::InvalidPair("x".into()).cni_code(), 4);
        let delegate = CniError::new(CniVersion::V1_1_0, 123u32, "m", "");
        assert_eq!(delegate.cni_code(), 123);
    }
}
