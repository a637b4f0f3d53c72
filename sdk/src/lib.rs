//! The Plexus guest SDK.
