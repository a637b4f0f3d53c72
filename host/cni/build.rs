//! Link the `plexus-cni` executable at a fixed address (not position-independent), as `plexus` is (see
//! host/plexus/build.rs): a runtime execs it once per ADD and once per DEL, and as a PIE the dynamic loader
//! would first apply the relative relocations of wasmtime's and kube's tables on every start. ASLR of the
//! executable image is given up; libraries, stack and heap stay randomized.
fn main() {
    println!("cargo:rustc-link-arg-bin=plexus-cni=-no-pie");
}
