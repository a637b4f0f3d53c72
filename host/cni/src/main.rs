//! `plexus-cni`: the plexus CNI plugin and nothing else, for the node's CNI bin directory (installed there as
//! `plexus`). It loads only precompiled hooks (the node agent compiles them; `plexus hook compile` does it for a
//! conf's own hooks) and never compiles one, whatever it is linked with. Built alone, as the image builds it, it
//! carries no compiler, no daemon server, no OCI client: what kubelet's runtime execs on every ADD and DEL stays
//! small.

// The test harness brings its own main.
#![cfg_attr(not(test), no_main)]

plexus_cni::c_main!(real_main);

#[cfg_attr(test, allow(dead_code))]
fn real_main() -> u8 {
    // A runtime execs the plugin with no arguments; only an operator's command line is parsed.
    if std::env::args_os().len() <= 1 {
        return plexus_cni::entry::cni_process(plexus_cni::entry::Compile::Never);
    }
    plexus_cni::cli::main(std::env::args_os())
}
