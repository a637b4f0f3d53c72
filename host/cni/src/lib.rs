//! `plexus-cni`: everything the container runtime execs — the CNI entry point, delegate execution, locks, the
//! attachment cache, the hooks an ADD runs — and the client side of the node daemon's wire. No wasm compiler,
//! no OCI client, no watch runtime: the node's long-running parts are `plexus-node`.
//!
//! Everything here is driven by an [`invocation::Invocation`] value: no process-global state, no exit, no
//! reading of the environment or stdin below the entry point in `main.rs`.
//!
//! Public are the modules the node (`plexus-node`), the command line and the tests use: the entry point, the
//! conf, the daemon's wire, the cache, hooks, plans, change sets, errors, logging, uninstall. The rest (the
//! orchestration of a verb, delegate runs, locks, the DEL record, teardown) is this crate's own.

mod attach;
pub mod cache;
pub mod change;
pub mod cli;
mod compat;
pub mod conf;
pub mod daemon;
mod deleted;
mod device_info;
mod devices;
pub mod effects;
pub mod entry;
pub mod error;
pub mod exec;
pub mod hooks;
pub mod invocation;
mod lock;
pub mod logging;
pub mod orchestrate;
pub mod plan;
pub mod podnet;
pub mod podresources;
mod publish;
mod runner;
mod spawn;
mod teardown;
pub mod uninstall;

#[cfg(test)]
mod orchestrate_tests;

/// Defines the C `main` of a plexus binary around `$real_main: fn() -> u8`.
///
/// The C `main` is defined by the binary rather than by std's runtime (`#![no_main]`): a runtime execs plexus
/// once per ADD and once per DEL, and std's start-up reads `/proc/self/maps` to place a stack guard for the
/// main thread and sets up an alternate signal stack, which together cost a tenth of a no-op invocation's CPU.
/// What of it plexus needs is done here: SIGPIPE ignored (a delegate that exits without reading its stdin must
/// not kill plexus) and file descriptors 0-2 kept open (so no file plexus opens becomes stdout or stderr).
/// Arguments still reach `std::env::args` (glibc hands them to std's initializer). A stack overflow is then a
/// plain SIGSEGV instead of std's message.
#[macro_export]
macro_rules! c_main {
    ($real_main:path) => {
        #[cfg(not(test))]
        #[allow(unsafe_code)]
        #[no_mangle]
        extern "C" fn main(
            _argc: ::libc::c_int,
            _argv: *const *const ::libc::c_char,
        ) -> ::libc::c_int {
            // SAFETY: single-threaded at this point; plain libc calls on fds 0-2 and the SIGPIPE disposition.
            unsafe {
                for fd in 0..=2 {
                    if ::libc::fcntl(fd, ::libc::F_GETFD) == -1
                        && ::std::io::Error::last_os_error().raw_os_error() == Some(::libc::EBADF)
                        && ::libc::open(c"/dev/null".as_ptr(), ::libc::O_RDWR) == -1
                    {
                        return 127;
                    }
                }
                ::libc::signal(::libc::SIGPIPE, ::libc::SIG_IGN);
            }
            let code = $real_main();
            // std's runtime would flush stdout after main; this main has to.
            let _ = ::std::io::Write::flush(&mut ::std::io::stdout());
            ::libc::c_int::from(code)
        }
    };
}
