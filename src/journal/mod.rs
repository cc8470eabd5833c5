//! Journal: the sled store of per-pod state, last-pushed checksums and file contents,
//! behind one small storage interface, with versioned bincode records and schema upgrades
//! (see `migrations/`).
//!
//! Owns the only disk IO of the controller. Built in the fleet issue (#4).
