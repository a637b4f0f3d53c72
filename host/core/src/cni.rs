//! CNI specification types: versions, error objects, network configurations and results.
//!
//! The CNI specification 1.1.0 is the authority; where it is silent, libcni's behaviour is followed
//! (each module says where, and where it deliberately differs).

pub mod args;
pub mod conf;
pub mod error;
pub mod result;
pub mod version;

pub use args::{ArgsError, CniArgs};
pub use conf::{is_delegating_plugin_type, ConfError, NetworkConfigList, DELEGATING_PLUGIN_TYPES};
pub use error::{CniError, CniErrorCode, ErrorCode, ErrorParseError};
pub use result::{CniResult, Dns, Interface, IpConfig, IpNet, ResultError, Route};
pub use version::{CniVersion, UnsupportedVersion};
