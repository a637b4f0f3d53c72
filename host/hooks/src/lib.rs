//! WebAssembly hooks: the wasmtime engine, component cache, limits and the deny-by-default sandbox.
