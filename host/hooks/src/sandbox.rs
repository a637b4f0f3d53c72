//! The per-call store: a WASI context that grants nothing, memory limits, captured output and the
//! host imports (log, settings).

use crate::bindings::plexus::hooks::host::{self, Level};
use crate::bindings::plexus::hooks::types;
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wasmtime::component::ResourceTable;
use wasmtime::component::{Linker, Resource};
use wasmtime::ResourceLimiter;
use wasmtime::StoreContextMut;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::clocks::HostMonotonicClock;
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// Bytes of guest stdout, and separately of stderr, kept per call; the rest is dropped.
pub(crate) const OUTPUT_CAP: usize = 16 * 1024;
/// Bytes of log-import messages kept per call.
pub(crate) const LOG_CAP: usize = 64 * 1024;
/// Longest single log-import message kept.
const LOG_LINE_CAP: usize = 4096;
/// Table elements a guest may grow to (function tables of ordinary programs are far smaller).
const TABLE_ELEMENTS_CAP: usize = 100_000;

/// What a call's store knows about its hook.
pub(crate) struct HookInfo {
    pub name: String,
    pub settings: String,
    pub memory_bytes: usize,
}

/// Guest stdout or stderr: kept up to a cap, silently dropped beyond it (a guest that prints too much
/// must not fail because of it).
#[derive(Clone)]
pub(crate) struct CappedPipe {
    buf: Arc<Mutex<Vec<u8>>>,
    dropped: Arc<AtomicUsize>,
    cap: usize,
}

impl CappedPipe {
    fn new(cap: usize) -> Self {
        CappedPipe {
            buf: Arc::default(),
            dropped: Arc::default(),
            cap,
        }
    }

    fn push(&self, bytes: &[u8]) {
        let mut buf = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.cap.saturating_sub(buf.len());
        let keep = bytes.len().min(room);
        buf.extend_from_slice(&bytes[..keep]);
        self.dropped
            .fetch_add(bytes.len() - keep, Ordering::Relaxed);
    }

    pub(crate) fn take(&self) -> (Vec<u8>, usize) {
        let buf = std::mem::take(&mut *self.buf.lock().unwrap_or_else(|e| e.into_inner()));
        (buf, self.dropped.swap(0, Ordering::Relaxed))
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl tokio::io::AsyncWrite for CappedPipe {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.push(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Memory and table limits of one call; remembers whether the memory limit was what stopped it.
pub(crate) struct Limits {
    memory_bytes: usize,
    pub(crate) memory_denied: bool,
}

impl ResourceLimiter for Limits {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            self.memory_denied = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= TABLE_ELEMENTS_CAP)
    }
}

/// The guest's monotonic clock: nanoseconds since its call began.
struct CallClock(Instant);

impl HostMonotonicClock for CallClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock pollable that is ready at its time or at the call's deadline, whichever comes first.
struct BoundedSleep(tokio::time::Instant);

#[async_trait::async_trait]
impl Pollable for BoundedSleep {
    async fn ready(&mut self) {
        tokio::time::sleep_until(self.0).await;
    }
}

/// The version of `wasi:clocks` that wasmtime-wasi defines (shadowed below).
const WASI_MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Replaces the monotonic clock's `subscribe-*` functions. The epoch deadline only interrupts wasm
/// code; a guest blocked in the host (a `sleep` waiting on a clock pollable) would not notice it. With
/// these, every clock wait ends at the call's deadline at the latest, the guest runs again and the
/// epoch check stops it.
pub(crate) fn shadow_clock_waits(linker: &mut Linker<State>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut clock = linker.instance(WASI_MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |mut store: StoreContextMut<'_, State>, (nanos,): (u64,)| {
            let state = store.data_mut();
            let until = state.bounded(Duration::from_nanos(nanos));
            Ok((state.subscribe_sleep(until)?,))
        },
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |mut store: StoreContextMut<'_, State>, (when,): (u64,)| {
            let state = store.data_mut();
            let now = u64::try_from(state.clock_base.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let until = state.bounded(Duration::from_nanos(when.saturating_sub(now)));
            Ok((state.subscribe_sleep(until)?,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The store data of one call.
pub(crate) struct State {
    clock_base: Instant,
    deadline: Instant,
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: Limits,
    pub(crate) stdout: CappedPipe,
    pub(crate) stderr: CappedPipe,
    info: Arc<HookInfo>,
    log_bytes: usize,
    pub(crate) log_dropped: usize,
    pod_running: bool,
    devices: Arc<crate::SelectionDevices>,
}

impl State {
    pub(crate) fn new(
        info: Arc<HookInfo>,
        timeout: Duration,
        pod_running: bool,
        devices: Arc<crate::SelectionDevices>,
    ) -> Self {
        let clock_base = Instant::now();
        let stdout = CappedPipe::new(OUTPUT_CAP);
        let stderr = CappedPipe::new(OUTPUT_CAP);
        // Deny by default: no preopened directories, no environment, no arguments, stdin closed, no
        // network (sockets and name lookup off). Clocks and randomness stay: they reveal nothing.
        let wasi = WasiCtxBuilder::new()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .monotonic_clock(CallClock(clock_base))
            .build();
        State {
            clock_base,
            deadline: clock_base + timeout,
            wasi,
            table: ResourceTable::new(),
            limits: Limits {
                memory_bytes: info.memory_bytes,
                memory_denied: false,
            },
            stdout,
            stderr,
            info,
            log_bytes: 0,
            log_dropped: 0,
            pod_running,
            devices,
        }
    }
}

impl State {
    fn bounded(&self, wait: Duration) -> Instant {
        let until = Instant::now().checked_add(wait).unwrap_or(self.deadline);
        until.min(self.deadline)
    }

    fn subscribe_sleep(&mut self, until: Instant) -> wasmtime::Result<Resource<DynPollable>> {
        let sleep = self
            .table
            .push(BoundedSleep(tokio::time::Instant::from_std(until)))?;
        wasmtime_wasi::p2::subscribe(&mut self.table, sleep)
    }
}

impl WasiView for State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl types::Host for State {}

impl host::Host for State {
    fn log(&mut self, level: Level, message: String) {
        if self.log_bytes >= LOG_CAP {
            self.log_dropped += 1;
            return;
        }
        let mut message = message;
        if message.len() > LOG_LINE_CAP {
            let mut end = LOG_LINE_CAP;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push_str("...");
        }
        self.log_bytes += message.len();
        let hook = self.info.name.as_str();
        match level {
            Level::Error => tracing::error!(hook, "{message}"),
            Level::Warn => tracing::warn!(hook, "{message}"),
            Level::Info => tracing::info!(hook, "{message}"),
            Level::Debug => tracing::debug!(hook, "{message}"),
            Level::Trace => tracing::trace!(hook, "{message}"),
        }
    }

    fn settings(&mut self) -> String {
        self.info.settings.clone()
    }

    fn pod_running(&mut self) -> bool {
        self.pod_running
    }

    fn selection_device(&mut self, namespace: String, name: String) -> Option<host::ClaimDevice> {
        let d = self.devices.get(&(namespace, name))?;
        Some(host::ClaimDevice {
            claim: d.claim.name.clone(),
            request: d.request.clone(),
            driver: d.key.driver.clone(),
            pool: d.key.pool.clone(),
            device: d.key.device.clone(),
            device_id: d.device_id.clone(),
            resource_name: d.resource_name.clone(),
        })
    }
}

/// Writes what the guest printed to the plexus log, line by line.
pub(crate) fn flush_output(state: &State) {
    let hook = state.info.name.as_str();
    for (stream, pipe) in [("stdout", &state.stdout), ("stderr", &state.stderr)] {
        let (bytes, dropped) = pipe.take();
        for line in String::from_utf8_lossy(&bytes).lines() {
            if !line.trim().is_empty() {
                tracing::info!(hook, stream, "{line}");
            }
        }
        if dropped > 0 {
            tracing::warn!(
                hook,
                stream,
                "guest output truncated: {dropped} bytes dropped"
            );
        }
    }
    if state.log_dropped > 0 {
        tracing::warn!(
            hook,
            "guest log truncated: {} messages dropped",
            state.log_dropped
        );
    }
}

/// The last meaningful line the guest wrote to stderr (a Rust panic message, typically).
pub(crate) fn last_stderr_line(state: &State) -> Option<String> {
    let buf = state.stderr.buf.lock().unwrap_or_else(|e| e.into_inner());
    let text = String::from_utf8_lossy(&buf);
    text.lines()
        .rev()
        // Skip Rust's "note: run with RUST_BACKTRACE=1" hint that follows a panic message.
        .find(|l| !l.trim().is_empty() && !l.starts_with("note: "))
        .map(|l| l.chars().take(300).collect())
}
