//! Fleet: one explicit state machine per HAProxy pod (Unknown, Validating, Syncing,
//! RuntimePatching, InSync, Drifted), keyed by pod UID.
//!
//! The transition table is data in the pure [`machine`] module; [`driver`] runs one machine
//! per pod, journaling each transition before performing its actions through [`PodActions`]
//! (the Dataplane adapter joins with deployment, issue #4, blocked on the Dataplane API here).

pub mod dataplane_actions;
pub mod driver;
pub mod machine;
pub mod supervisor;

pub use dataplane_actions::DataplaneActions;
pub use driver::{Desired, DriverSettings, PodActions, PodDriver, PodTarget, Validation, deployed_checksums};
