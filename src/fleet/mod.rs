//! Fleet: one explicit state machine per HAProxy pod (Unknown, Validating, Syncing,
//! RuntimePatching, InSync, Drifted), keyed by pod UID.
//!
//! The transition table is data in a pure module; a thin async driver executes its actions
//! through the Dataplane client and commits each transition to the journal before acting on it.
//! Built in the fleet issue (#4).
