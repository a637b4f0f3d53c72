//! The Device Information Specification's files for an attachment's device: the device plugin's file offered to
//! the delegate (4.2.1), and the information the status publishes (spec 5.3.8), read back after the delegate ran.

use std::path::Path;

use serde_json::Value;

use crate::cache::Attachment;
use crate::conf::read_capped;
use crate::invocation::Invocation;
use crate::podresources::device_plugin_info_file;

/// The most bytes of a device-info file plexus reads (the spec's objects are a few hundred bytes).
const DEVICE_INFO_CAP: usize = 64 << 10;

/// The device plugin's device-info file of the attachment's device, if it has one.
fn device_plugin_file(inv: &Invocation, att: &Attachment) -> Option<std::path::PathBuf> {
    let d = att.device.as_ref().filter(|d| d.claim.is_none())?;
    Some(device_plugin_info_file(
        &inv.conf.device_plugin_info_dir,
        &d.resource,
        &d.id,
    ))
}

/// Device Information Specification 4.2.1: a plugin offered a device-info file, whose device came from a
/// device plugin, finds the device plugin's information in it (it may add to it or replace it).
pub(crate) fn offer_device_plugin_info(inv: &Invocation, att: &Attachment) {
    let (Some(cni_file), Some(dp_file)) = (att.device_info_file(), device_plugin_file(inv, att))
    else {
        return;
    };
    let Ok(text) = read_capped(&dp_file, DEVICE_INFO_CAP) else {
        return;
    };
    let cni_file = Path::new(cni_file);
    if let Some(dir) = cni_file.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(cni_file, text) {
        tracing::warn!(file = %cni_file.display(), "cannot offer the device plugin's device-info: {e}");
    }
}

/// The attachment's device information (spec 5.3.8): what the plugin wrote into its device-info file, else
/// what the device plugin wrote for its device; only a valid object.
pub(crate) fn read_device_info(inv: &Invocation, att: &Attachment) -> Option<Value> {
    let parse = |path: &Path| {
        let text = read_capped(path, DEVICE_INFO_CAP).ok()?;
        let info: Value = serde_json::from_slice(&text).ok()?;
        info.get("type")
            .and_then(Value::as_str)
            .is_some()
            .then_some(info)
    };
    att.device_info_file()
        .and_then(|f| parse(Path::new(f)))
        .or_else(|| parse(&device_plugin_file(inv, att)?))
}
