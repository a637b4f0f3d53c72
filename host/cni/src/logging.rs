//! One logging set-up for every entry point (the CNI process, `plexus daemon`, `plexus install`,
//! `plexus hook`): the same line format, the same level names, the same file handling.

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::Mutex;

/// The level names every entry point accepts (`logLevel` in the conf, `--log-level` on the command line).
pub const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// Whether `level` is one of [`LEVELS`].
pub fn is_level(level: &str) -> bool {
    LEVELS.contains(&level)
}

/// Sends Plexus's own events at `level` and above (and other crates' warnings and errors) to `file`, appended,
/// or to stderr when there is none or it cannot be opened. Lines carry no ANSI colour and no module path, so
/// a log file and the runtime's capture of stderr read the same. At `debug` and `trace` every [`phase`] also
/// logs its time when it ends. A second call in one process does nothing.
pub fn init(level: &str, file: Option<&Path>) {
    let level = if is_level(level) { level } else { "info" };
    let filter = tracing_subscriber::EnvFilter::new(format!("warn,plexus={level}"));
    let spans = if matches!(level, "debug" | "trace") {
        tracing_subscriber::fmt::format::FmtSpan::CLOSE
    } else {
        tracing_subscriber::fmt::format::FmtSpan::NONE
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(spans)
        .with_target(false)
        .with_ansi(false);
    let file = file.and_then(|p| OpenOptions::new().create(true).append(true).open(p).ok());
    let _ = match file {
        Some(f) => builder.with_writer(Mutex::new(f)).try_init(),
        None => builder.with_writer(std::io::stderr).try_init(),
    };
}

/// A step of an invocation, timed at `debug`: `phase{name="lock"}: close time.busy=.. time.idle=..` when the
/// returned guard drops. Below `debug` the span is disabled and costs a level check.
pub fn phase(name: &'static str) -> tracing::span::EnteredSpan {
    tracing::debug_span!("phase", name).entered()
}

/// `--log-level` and `--log-file`, for every subcommand that logs.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct LogArgs {
    /// Plexus's log level
    #[arg(
        long,
        global = true,
        value_name = "LEVEL",
        default_value = "info",
        value_parser = clap::builder::PossibleValuesParser::new(LEVELS)
    )]
    pub log_level: String,
    /// Append log lines to FILE instead of stderr (as the conf's logFile)
    #[arg(long, global = true, value_name = "FILE")]
    pub log_file: Option<std::path::PathBuf>,
}

impl LogArgs {
    /// [`init`] with these settings.
    pub fn init(&self) {
        init(&self.log_level, self.log_file.as_deref());
    }
}
