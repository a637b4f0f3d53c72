//! Plexus driven by the real libcni.
