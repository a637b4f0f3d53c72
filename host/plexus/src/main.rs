//! The `plexus` binary: a CNI plugin when exec'd by a runtime, plus a few operator subcommands.
//!
//! The C `main` is defined here rather than by std's runtime (`#![no_main]`): a runtime execs plexus once per ADD
//! and once per DEL, and std's start-up reads `/proc/self/maps` to place a stack guard for the main thread and
//! sets up an alternate signal stack, which together cost a tenth of a no-op invocation's CPU. What of it
//! plexus needs is done here: SIGPIPE ignored (a delegate that exits without reading its stdin must not kill
//! plexus) and file descriptors 0-2 kept open (so no file plexus opens becomes stdout or stderr). Arguments
//! still reach `std::env::args` (glibc hands them to std's initializer). A stack overflow is then a plain
//! SIGSEGV instead of std's message.

// The test harness brings its own main.
#![cfg_attr(not(test), no_main)]

use std::io::{Read, Write};

#[cfg(not(test))]
#[allow(unsafe_code)]
#[no_mangle]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: single-threaded at this point; plain libc calls on fds 0-2 and the SIGPIPE disposition.
    unsafe {
        for fd in 0..=2 {
            if libc::fcntl(fd, libc::F_GETFD) == -1
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
                && libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) == -1
            {
                return 127;
            }
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let code = real_main();
    // std's runtime would flush stdout after main; this main has to.
    let _ = std::io::stdout().flush();
    libc::c_int::from(code)
}

const USAGE: &str = "\
usage: plexus                  a CNI plugin: run by a container runtime, with CNI_COMMAND set
       plexus install ...      put plexus on a node (plexus install --help)
       plexus hook ...         inspect, compile and run WebAssembly hooks (plexus hook --help)
       plexus daemon ...       the node's long-running process (plexus daemon --help)
       plexus --version";

#[cfg_attr(test, allow(dead_code))]
fn real_main() -> u8 {
    let args: Vec<String> = std::env::args().collect();
    if let Some(sub) = args.get(1) {
        match sub.as_str() {
            "--version" | "version" => {
                println!("plexus {}", env!("CARGO_PKG_VERSION"));
                return 0;
            }
            "-h" | "--help" | "help" => {
                println!("{USAGE}");
                return 0;
            }
            "hook" => return plexus::hook_cli::main(&args[2..]),
            "install" => return plexus::install::main(&args[2..]),
            "daemon" => return plexus::daemon::main(&args[2..]),
            other => {
                eprintln!("plexus: unknown subcommand {other:?}\n{USAGE}");
                return 2;
            }
        }
    }
    let env = std::env::vars().collect();
    let mut stdin = Vec::new();
    // VERSION may come with no stdin at all; a read error is treated as empty input.
    // Read one byte past the cap, so an oversized conf is refused rather than cut.
    let _ = std::io::stdin()
        .take(plexus::conf::STDIN_CAP as u64 + 1)
        .read_to_end(&mut stdin);
    let outcome = plexus::entry::run(&env, &stdin);
    if let Some(text) = outcome.stdout {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
    u8::from(!outcome.success)
}
