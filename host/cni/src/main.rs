//! `plexus-cni`: the plexus CNI plugin and nothing else, for the node's CNI bin directory (installed there as
//! `plexus`). It loads only precompiled hooks (the node agent compiles them; `plexus hook compile` does it for a
//! conf's own hooks), so it carries no compiler, no daemon server, no OCI client: what kubelet's runtime execs
//! on every ADD and DEL stays small.

// The test harness brings its own main.
#![cfg_attr(not(test), no_main)]

plexus_cni::c_main!(real_main);

#[cfg_attr(test, allow(dead_code))]
fn real_main() -> u8 {
    match std::env::args().nth(1).as_deref() {
        Some("--version" | "version") => {
            println!("plexus {} (CNI plugin only)", env!("CARGO_PKG_VERSION"));
            0
        }
        // The node's documented uninstall step runs the binary that is on the node: this one.
        Some("install") => {
            let args: Vec<String> = std::env::args().skip(1).collect();
            match plexus_cni::uninstall::parse_args(&args) {
                Ok(opts) => plexus_cni::uninstall::main(&opts),
                Err(plexus_cni::uninstall::UninstallError::Help) => {
                    println!("{}", plexus_cni::uninstall::UninstallError::Help);
                    0
                }
                Err(e) => {
                    eprintln!("plexus-cni: {e}");
                    2
                }
            }
        }
        Some(other) => {
            eprintln!(
                "plexus-cni: {other:?}: this is the CNI plugin alone (run by a container runtime, with \
                 CNI_COMMAND set) and its node uninstall (`install --uninstall`); daemon and hook are commands \
                 of the full plexus binary"
            );
            2
        }
        None => plexus_cni::entry::cni_process(),
    }
}
