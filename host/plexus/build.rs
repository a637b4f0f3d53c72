//! Link the `plexus` executable at a fixed address (not position-independent).
//!
//! The runtime execs plexus once per ADD and once per DEL, so its start-up is paid by every pod. As a PIE, the
//! dynamic loader first applies ~50,000 relative relocations (the vtables and constant tables of wasmtime,
//! cranelift and the rest), touching every page that holds one; linked at a fixed address those are resolved
//! by the linker and start-up only maps the file. The objects stay position-independent code, which links
//! into a fixed-address executable unchanged. ASLR of the executable image is given up (libraries, stack and
//! heap stay randomized); docs/benchmarks.md has the measurement.
fn main() {
    println!("cargo:rustc-link-arg-bin=plexus=-no-pie");
}
