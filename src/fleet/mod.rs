//! Fleet: one explicit state machine per HAProxy pod (Unknown, Validating, Syncing,
//! RuntimePatching, InSync, Drifted), keyed by pod UID.
//!
//! The transition table is data in the pure [`machine`] module; the async driver that executes
//! its actions through the Dataplane client, journaling each transition before acting on it,
//! joins with deployment (issue #4, blocked on the Dataplane API here).

pub mod machine;
