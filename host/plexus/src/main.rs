//! The `plexus` binary: a CNI plugin when exec'd by a runtime, plus the node's long-running process and the
//! operator subcommands. (The CNI plugin alone, without the compiler and the node's parts, is `plexus-cni`.)

// The test harness brings its own main.
#![cfg_attr(not(test), no_main)]

plexus_cni::c_main!(real_main);

const USAGE: &str = "\
usage: plexus                  a CNI plugin: run by a container runtime, with CNI_COMMAND set
       plexus install ...      put plexus on a node (plexus install --help)
       plexus hook ...         inspect, compile, run, push and verify WebAssembly hooks (plexus hook --help)
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
            "hook" => return plexus_node::hook_cli::main(&args[2..]),
            "install" => return plexus_node::install::main(&args[2..]),
            "daemon" => return plexus_node::daemon::main(&args[2..]),
            other => {
                eprintln!("plexus: unknown subcommand {other:?}\n{USAGE}");
                return 2;
            }
        }
    }
    plexus_cni::entry::cni_process()
}
