//! The wasmtime engine and the epoch ticker that enforces per-call deadlines.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use wasmtime::{Config, Engine};

/// One epoch tick. Deadlines are rounded up to whole ticks (plus one, since the first tick of a call
/// may come at once).
pub(crate) const TICK: Duration = Duration::from_millis(2);

/// The engine. Instances are allocated on demand: wasmtime's pooling allocator made warm calls 25-40% faster
/// in `hook_bench`, but setting the pool up cost ~150 µs, more than it saves in a plexus process, which makes a
/// handful of calls (a long-lived host could use it again).
///
/// `parallel_compile` lets cranelift compile on a thread per core: faster, but the threads' working sets add up
/// (an ADD compiling the three example hooks peaked at 31 MiB with it, 26 MiB without, and took 0.7 s instead
/// of 1.1 s). `plexus hook compile` (install time) compiles in parallel; an ADD that finds no cached artifact
/// compiles on its own thread, keeping the CNI process small.
/// The wasmtime major version this crate is built against (keep it with the dependency in Cargo.toml).
pub(crate) const WASMTIME_MAJOR: u32 = 48;
/// What [`new_engine`] sets that changes compiled code.
pub(crate) const CONFIG_ID: &str = "component-model epoch-interruption";

pub(crate) fn new_engine(parallel_compile: bool) -> Result<Engine, String> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.wasm_component_model(true);
    #[cfg(feature = "compiler")]
    config.parallel_compilation(parallel_compile);
    #[cfg(not(feature = "compiler"))]
    let _ = parallel_compile;
    Engine::new(&config).map_err(|e| format!("{e:#}"))
}

pub(crate) fn deadline_ticks(timeout_ms: u64) -> u64 {
    timeout_ms.div_ceil(TICK.as_millis() as u64) + 1
}

/// Increments the engine's epoch every [`TICK`] while at least one call runs; sleeps otherwise.
pub(crate) struct Ticker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    active: AtomicUsize,
    stop: AtomicBool,
}

/// Keeps the ticker running for the duration of a call.
pub(crate) struct Running<'a>(&'a Ticker);

impl Ticker {
    pub(crate) fn start(engine: Engine) -> Result<Ticker, String> {
        let shared = Arc::new(Shared {
            active: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("plexus-hook-epoch".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Acquire) {
                    if s.active.load(Ordering::Acquire) == 0 {
                        std::thread::park_timeout(Duration::from_secs(1));
                    } else {
                        std::thread::sleep(TICK);
                        engine.increment_epoch();
                    }
                }
            })
            .map_err(|e| format!("cannot start the epoch thread: {e}"))?;
        Ok(Ticker {
            shared,
            thread: Some(thread),
        })
    }

    pub(crate) fn run(&self) -> Running<'_> {
        self.shared.active.fetch_add(1, Ordering::AcqRel);
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
        Running(self)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.shared.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
