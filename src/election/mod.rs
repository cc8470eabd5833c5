//! Leader election on a `coordination.k8s.io` Lease: only the leader deploys.
//!
//! kube-lease-manager acquires and renews the Lease (`grace` before it expires). It does not
//! say when a renewal fails, so a leader cut off from the API server would believe itself
//! leader until it hears otherwise. This module therefore also reads the Lease on its own and
//! judges leadership from what it last saw ([`judge`], pure): leader only while the Lease names
//! this replica and its last renewal, plus the lease duration, minus half the grace, is still
//! ahead (the renewal is due at minus the whole grace, so a renewal that took is seen before
//! then). A partitioned leader so steps down `grace / 2` before any other replica may take the
//! Lease over. Writes to pods do not wait for the step-down to be heard: the [`Fence`] they ask
//! runs out at that same instant by itself. The leader term is the Lease's `leaseTransitions`
//! when it was taken.

pub mod fence;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use thiserror::Error;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::pod::LeaderTerm;
pub use fence::{Fence, Fenced};

/// Where this replica stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// Another replica leads, or nobody is known to: watch, render, serve, but never deploy.
    Follower,
    /// This replica leads, in this term.
    Leader(LeaderTerm),
}

impl Leadership {
    /// Whether this replica may deploy.
    pub fn is_leader(self) -> bool {
        matches!(self, Self::Leader(_))
    }
}

/// How to elect.
#[derive(Clone, Debug)]
pub struct ElectionSettings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity in the Lease (its pod name, say).
    pub identity: String,
    /// How long a Lease holds without renewal.
    pub duration: Duration,
    /// How long before expiry the holder renews; also the margin by which a leader that
    /// cannot renew steps down before the Lease could be taken.
    pub grace: Duration,
}

/// Settings that cannot work.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ElectionError {
    /// The grace margin must be shorter than the lease, both whole seconds above zero.
    #[error(
        "leader election: the lease duration ({duration}s) must be longer than the renewal grace ({grace}s), both at least 1s"
    )]
    Durations {
        /// Lease duration in seconds.
        duration: u64,
        /// Grace in seconds.
        grace: u64,
    },
}

impl ElectionSettings {
    /// Checks the durations (kube-lease-manager panics on bad ones; we say why instead).
    pub fn check(&self) -> Result<(), ElectionError> {
        let (duration, grace) = (self.duration.as_secs(), self.grace.as_secs());
        if grace == 0 || grace >= duration {
            return Err(ElectionError::Durations { duration, grace });
        }
        Ok(())
    }
}

/// What a read of the Lease showed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSeen {
    /// Who holds it.
    pub holder: Option<String>,
    /// When the holder last renewed it (by the holder's clock).
    pub renewed: Option<SystemTime>,
    /// For how long a renewal holds.
    pub duration: Option<Duration>,
    /// How many times it changed hands.
    pub transitions: u64,
}

impl LeaseSeen {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity,
            renewed: spec.renew_time.map(|time| SystemTime::from(time.0)),
            duration: spec.lease_duration_seconds.map(|s| Duration::from_secs(s.max(0) as u64)),
            transitions: spec.lease_transitions.unwrap_or(0).max(0) as u64,
        }
    }
}

/// How long before the Lease could be taken over a leader stops: half the grace. The holder
/// renews a whole grace before expiry, so a renewal that took is seen well before this.
pub fn step_down_margin(grace: Duration) -> Duration {
    grace / 2
}

/// Whether this replica leads: the lease manager must believe it holds the lock, and the last
/// read of the Lease must name it with a renewal still good for more than the step-down margin.
pub fn judge(
    lock_held: bool,
    seen: Option<&LeaseSeen>,
    identity: &str,
    now: SystemTime,
    grace: Duration,
) -> Leadership {
    let Some(seen) = seen else { return Leadership::Follower };
    let safe_until = lead_until(seen, grace);
    if lock_held && seen.holder.as_deref() == Some(identity) && safe_until.is_some_and(|until| now < until) {
        Leadership::Leader(LeaderTerm(seen.transitions))
    } else {
        Leadership::Follower
    }
}

/// Until when, by the renewing replica's clock, the Lease as `seen` lets its holder lead: the
/// last renewal plus the lease duration minus the step-down margin.
fn lead_until(seen: &LeaseSeen, grace: Duration) -> Option<SystemTime> {
    (seen.renewed? + seen.duration?).checked_sub(step_down_margin(grace))
}

/// Until when, on the monotonic clock, a leader that saw the Lease as `seen` (at `wall_now`
/// and `mono_now`, read together) may write: the last renewal plus the lease duration minus
/// the step-down margin. `None` when that has passed.
pub fn writable_until(
    seen: &LeaseSeen,
    grace: Duration,
    wall_now: SystemTime,
    mono_now: tokio::time::Instant,
) -> Option<tokio::time::Instant> {
    let left = lead_until(seen, grace)?.duration_since(wall_now).ok()?;
    Some(mono_now + left)
}

/// Runs the election until `leadership`'s receivers are all gone or `stop` fires, publishing
/// every change and granting `fence` only while this replica leads, until its lease could
/// lapse; on `stop` it hands the Lease back before returning.
pub async fn run(
    client: kube::Client,
    settings: ElectionSettings,
    leadership: watch::Sender<Leadership>,
    fence: Arc<Fence>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let Some(mut manager) = Manager::start(&client, &settings, &leadership, &mut stop).await else { return };
    // Read often enough that a lost renewal is noticed well within the grace margin.
    let period = (settings.grace / 4).clamp(Duration::from_millis(200), Duration::from_secs(1));
    let mut seen: Option<LeaseSeen> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            changed = manager.held.changed() => if changed.is_err() { return },
            _ = leadership.closed() => return,
            _ = &mut stop => {
                fence.revoke();
                leadership.send_replace(Leadership::Follower);
                crate::telemetry::metrics::metrics().leader.set(0);
                manager.hand_back(&settings).await;
                return;
            }
        }
        // Unreachable or slow: what was last seen ages, and with it the leadership.
        if let Ok(Ok(lease)) = tokio::time::timeout(period, leases.get_opt(&settings.lease_name)).await {
            seen = lease.as_ref().map(LeaseSeen::of);
        }
        let held = *manager.held.borrow();
        // kube-lease-manager's followers look again only when the holder's lease would expire;
        // a Lease handed back (no holder) is taken at once by starting a fresh manager.
        if !held && seen.as_ref().is_some_and(|lease| lease.holder.is_none()) {
            tracing::debug!(lease = %settings.lease_name, "the Lease is free: taking it");
            manager.hand_back(&settings).await;
            tracing::debug!(lease = %settings.lease_name, "old lease manager stopped");
            let Some(fresh) = Manager::start(&client, &settings, &leadership, &mut stop).await else { return };
            manager = fresh;
            continue;
        }
        let (wall_now, mono_now) = (SystemTime::now(), tokio::time::Instant::now());
        let now_leading = judge(held, seen.as_ref(), &settings.identity, wall_now, settings.grace);
        // The grant runs out by itself: if this loop stalls, writes stop on time all the same.
        match (now_leading, seen.as_ref().and_then(|s| writable_until(s, settings.grace, wall_now, mono_now))) {
            (Leadership::Leader(term), Some(until)) => fence.grant(term, until),
            _ => fence.revoke(),
        }
        let before = *leadership.borrow();
        if before != now_leading {
            match now_leading {
                Leadership::Leader(term) => info!(lease = %settings.lease_name, %term, "became the leader"),
                Leadership::Follower => warn!(lease = %settings.lease_name, "not the leader (any more): no pushes"),
            }
            crate::telemetry::metrics::metrics().leader.set(i64::from(now_leading.is_leader()));
            leadership.send_replace(now_leading);
        }
    }
}

/// A running kube-lease-manager: whether it holds the lock, and its task.
struct Manager {
    held: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
}

impl Manager {
    /// Builds and starts a lease manager, retrying while the Lease cannot be used; `None`
    /// when asked to stop first.
    async fn start(
        client: &kube::Client,
        settings: &ElectionSettings,
        leadership: &watch::Sender<Leadership>,
        stop: &mut tokio::sync::oneshot::Receiver<()>,
    ) -> Option<Self> {
        loop {
            let built = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &settings.lease_name)
                .with_namespace(&settings.namespace)
                .with_identity(&settings.identity)
                .with_duration(settings.duration.as_secs())
                .with_grace(settings.grace.as_secs())
                .build()
                .await;
            match built {
                Ok(manager) => {
                    let (held, task) = manager.watch().await;
                    return Some(Self { held, task });
                }
                Err(error) => {
                    warn!(lease = %settings.lease_name, %error, "cannot use the election Lease yet; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                        _ = leadership.closed() => return None,
                        _ = &mut *stop => return None,
                    }
                }
            }
        }
    }

    /// Stops the manager; closing its lock channel makes it release the Lease if it holds it.
    async fn hand_back(self, settings: &ElectionSettings) {
        let held = *self.held.borrow();
        drop(self.held);
        match tokio::time::timeout(Duration::from_secs(5), self.task).await {
            Ok(Ok(Ok(_))) if held => info!(lease = %settings.lease_name, "Lease handed back"),
            Ok(Ok(Ok(_))) => {}
            Ok(Ok(Err(error))) => warn!(lease = %settings.lease_name, %error, "could not hand the Lease back"),
            Ok(Err(error)) => warn!(lease = %settings.lease_name, %error, "the lease manager failed"),
            Err(_) => warn!(lease = %settings.lease_name, "the lease manager did not stop within 5s"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(holder: &str, renewed_secs_ago: u64, now: SystemTime) -> LeaseSeen {
        LeaseSeen {
            holder: Some(holder.into()),
            renewed: Some(now - Duration::from_secs(renewed_secs_ago)),
            duration: Some(Duration::from_secs(15)),
            transitions: 4,
        }
    }

    #[test]
    fn leads_only_while_the_lease_names_it_and_a_renewal_is_good_beyond_the_grace() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let grace = Duration::from_secs(5);
        let fresh = seen("a", 2, now);
        assert_eq!(judge(true, Some(&fresh), "a", now, grace), Leadership::Leader(LeaderTerm(4)));
        assert_eq!(judge(false, Some(&fresh), "a", now, grace), Leadership::Follower, "the manager lost the lock");
        assert_eq!(judge(true, Some(&fresh), "b", now, grace), Leadership::Follower, "someone else holds it");
        assert_eq!(judge(true, None, "a", now, grace), Leadership::Follower);
        // Renewed 13 s ago with a 15 s lease: 2 s left, not more than half the grace: step down
        // now, before another replica could take it. At 12 s the renewal (due at 10 s) may just
        // not have been seen yet: still leading.
        assert_eq!(judge(true, Some(&seen("a", 13, now)), "a", now, grace), Leadership::Follower);
        assert_eq!(judge(true, Some(&seen("a", 12, now)), "a", now, grace), Leadership::Leader(LeaderTerm(4)));
        let released = LeaseSeen { renewed: None, ..fresh };
        assert_eq!(judge(true, Some(&released), "a", now, grace), Leadership::Follower);
    }

    #[test]
    fn writes_are_granted_until_the_renewal_plus_the_lease_minus_the_grace() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mono = tokio::time::Instant::now();
        let grace = Duration::from_secs(5);
        // Renewed 2 s ago, 15 s lease: 10.5 s left before the step-down margin (2.5 s).
        assert_eq!(writable_until(&seen("a", 2, wall), grace, wall, mono), Some(mono + Duration::from_millis(10_500)));
        assert_eq!(writable_until(&seen("a", 13, wall), grace, wall, mono), None);
        let unrenewed = LeaseSeen { renewed: None, ..seen("a", 2, wall) };
        assert_eq!(writable_until(&unrenewed, grace, wall, mono), None);
    }

    #[test]
    fn durations_that_cannot_work_are_refused_with_both_values() {
        let settings = |duration, grace| ElectionSettings {
            namespace: "haptic".into(),
            lease_name: "haptic".into(),
            identity: "a".into(),
            duration: Duration::from_secs(duration),
            grace: Duration::from_secs(grace),
        };
        assert_eq!(settings(15, 5).check(), Ok(()));
        assert_eq!(settings(5, 5).check(), Err(ElectionError::Durations { duration: 5, grace: 5 }));
        assert_eq!(settings(5, 0).check(), Err(ElectionError::Durations { duration: 5, grace: 0 }));
    }
}
