//! Writing to the plexus log from a hook (lines are attributed to the hook by the host).

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// Writes one line at `level`.
pub fn log(level: Level, message: impl AsRef<str>) {
    crate::host::log(level, message.as_ref());
}

pub fn error(message: impl AsRef<str>) {
    log(Level::Error, message);
}

pub fn warn(message: impl AsRef<str>) {
    log(Level::Warn, message);
}

pub fn info(message: impl AsRef<str>) {
    log(Level::Info, message);
}

pub fn debug(message: impl AsRef<str>) {
    log(Level::Debug, message);
}

pub fn trace(message: impl AsRef<str>) {
    log(Level::Trace, message);
}
