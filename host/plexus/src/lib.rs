//! Plexus's orchestration: the CNI entry point, delegate execution, locks, the attachment cache.
