//! Fleet: one explicit state machine per HAProxy pod (Unknown, Validating, Syncing,
//! RuntimePatching, InSync, Drifted), keyed by pod UID.
//!
//! The transition table is data in the pure [`machine`] module; [`driver`] runs one machine
//! per pod, journaling each transition before performing its actions through [`PodActions`]
//! ([`DataplaneActions`], through the Dataplane API, every write asking the leader's fence).

pub mod dataplane_actions;
pub mod driver;
pub mod machine;
pub mod supervisor;

pub use dataplane_actions::{DataplaneActions, LeaseGuard};
pub use driver::{Desired, DriverSettings, PodActions, PodDriver, PodTarget, Validation, deployed_checksums};
