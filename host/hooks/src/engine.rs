//! The wasmtime engine and the epoch ticker that enforces per-call deadlines.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// One epoch tick. Deadlines are rounded up to whole ticks (plus one, since the first tick of a call
/// may come at once).
pub(crate) const TICK: Duration = Duration::from_millis(2);

/// Instances alive at once in a pooled engine (one per call in flight; a call's store is dropped before the
/// next call).
const POOL_COMPONENT_INSTANCES: u32 = 4;

/// The engine. `pooled` selects wasmtime's pooling allocator, for a long-lived host that makes many calls: it
/// reserves the instances' memories and tables once and reuses the slots, instead of mapping and unmapping a
/// 4 GiB reservation (and the memory's initial image) on every call, which made warm calls 25-40% faster in
/// `hook_bench`. Setting the pool up costs ~150 µs (wasmtime sizes it by the CPUs it may use, which std reads
/// from the cgroup files), more than it saves in a plexus process, which makes a handful of calls; so the CNI
/// binary does not pool. Freed slots are reset with madvise, not kept resident: zeroing a resident megabyte
/// on every free cost more than it saved.
///
/// `parallel_compile` lets cranelift compile on a thread per core: faster, but the threads' working sets add up
/// (an ADD compiling the three example hooks peaked at 31 MiB with it, 26 MiB without, and took 0.7 s instead
/// of 1.1 s). `plexus hook compile` (install time) compiles in parallel; an ADD that finds no cached artifact
/// compiles on its own thread, keeping the CNI process small.
pub(crate) fn new_engine(pooled: bool, parallel_compile: bool) -> Result<Engine, String> {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config.wasm_component_model(true);
    config.parallel_compilation(parallel_compile);
    if pooled {
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(POOL_COMPONENT_INSTANCES)
            .total_core_instances(POOL_COMPONENT_INSTANCES * 4)
            .total_memories(POOL_COMPONENT_INSTANCES * 2)
            .total_tables(POOL_COMPONENT_INSTANCES * 4)
            .total_stacks(0)
            // Per module (docs/hooks.md, "Limits"): what toolchains emit, with room.
            .max_memories_per_module(2)
            .max_tables_per_module(4)
            .table_elements(100_000)
            // A hook's memoryLimitMiB is at most 4096; its limiter enforces the configured value.
            .max_memory_size(4096 << 20);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
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
