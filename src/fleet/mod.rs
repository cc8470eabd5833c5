//! Fleet: one explicit state machine per HAProxy pod (Unknown, Validating, Syncing,
//! RuntimePatching, InSync, Drifted), keyed by pod UID.
//!
//! The transition table is data in the pure [`machine`] module; [`core`] is the rest of a
//! pod's driver as a pure step (pacing, retries, drift, what each action carries) over the
//! plain types of [`pod`]; [`driver`] is its thin async shell, journaling each transition
//! before performing its actions through [`PodActions`] ([`DataplaneActions`], through the
//! Dataplane API, every write asking the leader's fence).

pub mod core;
pub mod dataplane_actions;
pub mod driver;
pub mod machine;
pub mod pod;
pub mod supervisor;

pub use dataplane_actions::{DataplaneActions, LeaseGuard};
pub use driver::{ActionSlots, PodActions, PodDriver};
pub use pod::{Desired, Pacing, PodTarget, Validation, deployed_checksums};
