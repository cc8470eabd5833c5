//! The fence: the right to write to pods, granted for one leader term and bounded in time.
//!
//! Stepping down by message is not enough: the controller's loop may be busy (an activation
//! waiting for watches, a status write to an API server that stopped answering) when the
//! message comes. So every write to a pod asks the fence first, and the fence answers from
//! the clock: a grant runs out by itself at the instant the election last computed, the last
//! renewal this replica saw plus the lease duration minus the grace margin, measured on the
//! monotonic clock of the process. An election loop that stalls stops extending it; writes stop
//! on time anyway. A write also gets no more time than the grant has left.

use std::sync::Mutex;
use std::time::Duration;

use thiserror::Error;
use tokio::time::Instant;

use crate::pod::LeaderTerm;

/// Why a write may not go out.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Fenced {
    /// This replica does not lead (or has not yet).
    #[error("not the leader: writes to pods are fenced off")]
    NotLeader,
    /// This replica leads in another term than the write was planned in.
    #[error("the write was planned in leader term {planned}, the lease is now held in term {current}")]
    OtherTerm {
        /// The term of the write.
        planned: LeaderTerm,
        /// The term now.
        current: LeaderTerm,
    },
    /// The grant ran out: the lease may be taken by another replica soon.
    #[error("the lease was not seen renewed in time: writes to pods stopped {0:?} ago")]
    Expired(Duration),
}

#[derive(Clone, Copy, Debug)]
struct Grant {
    term: LeaderTerm,
    until: Option<Instant>,
}

/// The right to write to pods; shared by the election (which grants it) and every writer.
#[derive(Debug, Default)]
pub struct Fence {
    grant: Mutex<Option<Grant>>,
}

impl Fence {
    /// A fence that grants term `term` for ever: a replica that deploys alone, without election.
    pub fn unbounded(term: LeaderTerm) -> Self {
        Self { grant: Mutex::new(Some(Grant { term, until: None })) }
    }

    /// Grants `term` until `until` (a later grant of the same term may move it either way).
    pub fn grant(&self, term: LeaderTerm, until: Instant) {
        if let Ok(mut grant) = self.grant.lock() {
            *grant = Some(Grant { term, until: Some(until) });
        }
    }

    /// Takes the grant back at once.
    pub fn revoke(&self) {
        if let Ok(mut grant) = self.grant.lock() {
            *grant = None;
        }
    }

    /// How long a write planned in `term` may still take, if it may go out at all.
    pub fn remaining(&self, term: LeaderTerm) -> Result<Option<Duration>, Fenced> {
        let grant = self.grant.lock().map_err(|_| Fenced::NotLeader)?.as_ref().copied();
        remaining(grant, term, Instant::now())
    }
}

/// The pure decision: `None` means without limit.
fn remaining(grant: Option<Grant>, term: LeaderTerm, now: Instant) -> Result<Option<Duration>, Fenced> {
    let grant = grant.ok_or(Fenced::NotLeader)?;
    if grant.term != term {
        return Err(Fenced::OtherTerm { planned: term, current: grant.term });
    }
    match grant.until {
        None => Ok(None),
        Some(until) if now < until => Ok(Some(until - now)),
        Some(until) => Err(Fenced::Expired(now - until)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_runs_out_by_itself_and_only_its_term_may_write() {
        let now = Instant::now();
        let grant = Some(Grant { term: LeaderTerm(3), until: Some(now + Duration::from_secs(2)) });
        assert_eq!(remaining(grant, LeaderTerm(3), now), Ok(Some(Duration::from_secs(2))));
        assert_eq!(
            remaining(grant, LeaderTerm(3), now + Duration::from_secs(3)),
            Err(Fenced::Expired(Duration::from_secs(1)))
        );
        assert_eq!(
            remaining(grant, LeaderTerm(2), now),
            Err(Fenced::OtherTerm { planned: LeaderTerm(2), current: LeaderTerm(3) })
        );
        assert_eq!(remaining(None, LeaderTerm(3), now), Err(Fenced::NotLeader));
        let alone = Some(Grant { term: LeaderTerm(0), until: None });
        assert_eq!(remaining(alone, LeaderTerm(0), now + Duration::from_secs(1_000_000)), Ok(None));
    }

    #[test]
    fn revoking_stops_writes_at_once() {
        let fence = Fence::default();
        fence.grant(LeaderTerm(1), Instant::now() + Duration::from_secs(60));
        assert!(fence.remaining(LeaderTerm(1)).is_ok());
        fence.revoke();
        assert_eq!(fence.remaining(LeaderTerm(1)), Err(Fenced::NotLeader));
    }
}
