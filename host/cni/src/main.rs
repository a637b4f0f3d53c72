//! `plexus-cni`: the plexus CNI plugin and nothing else, for the node's CNI bin directory (installed there as
//! `plexus`). It loads only precompiled hooks (the node agent compiles them; `plexus hook compile` does it for a
//! conf's own hooks), so it carries no compiler, no daemon server, no OCI client: what kubelet's runtime execs
//! on every ADD and DEL stays small.

// The test harness brings its own main.
#![cfg_attr(not(test), no_main)]

plexus::c_main!(real_main);

#[cfg_attr(test, allow(dead_code))]
fn real_main() -> u8 {
    match std::env::args().nth(1).as_deref() {
        Some("--version" | "version") => {
            println!("plexus {} (CNI plugin only)", env!("CARGO_PKG_VERSION"));
            0
        }
        Some(other) => {
            eprintln!(
                "plexus-cni: {other:?}: this is the CNI plugin alone (run by a container runtime, with \
                 CNI_COMMAND set); install, daemon and hook are commands of the full plexus binary"
            );
            2
        }
        None => plexus::entry::cni_process(),
    }
}
