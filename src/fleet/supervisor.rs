//! The fleet: one driver per HAProxy pod that can be deployed to, started when such a pod (by
//! UID) appears and stopped when it no longer can be (not Running, its Dataplane API not ready);
//! its journal record is kept until the pod is deleted. A pod recreated under the same name has
//! a new UID and so starts from nothing: verification, then a full sync.
//!
//! Stopping a driver never waits for its action in flight: other pods are not held up by a
//! gone one. A driver that dies (a panic) is logged, counted and started again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{AbortHandle, Id, JoinSet};
use tracing::{error, info, warn};

use super::driver::{ActionSlots, PodActions, PodDriver};
use super::pod::{Desired, PodTarget};
use crate::journal::Journal;
use crate::pod::{LeaderTerm, PodUid};

/// The pods the fleet knows of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetPods {
    /// The pods to deploy to.
    pub targets: Vec<PodTarget>,
    /// Every pod that exists (targets and pods that cannot be deployed to right now): the
    /// journal forgets only pods missing from here.
    pub present: BTreeSet<PodUid>,
}

struct Running {
    stop: watch::Sender<bool>,
    task: AbortHandle,
    target: PodTarget,
    /// When it was started, and how many times in a row its driver had died before.
    started: tokio::time::Instant,
    deaths: u32,
}

/// How long a driver that died waits before it is started again: a second, doubling with each
/// death in a row up to a minute, so a driver that dies at once (a bad record, a bug) does not
/// spin. A driver that ran for [`HEALTHY_RUN`] before dying starts the count again.
fn restart_delay(deaths: u32) -> Duration {
    super::machine::backoff(deaths, Duration::from_secs(60))
}

/// How long a driver must run before its death counts as the first in a row.
const HEALTHY_RUN: Duration = Duration::from_secs(300);

/// How long a stopping fleet waits for its drivers' actions in flight.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Runs the fleet until the pod list's sender is dropped.
pub async fn run<A: PodActions>(
    journal: Arc<Journal>,
    actions: Arc<A>,
    slots: ActionSlots,
    term: LeaderTerm,
    mut pods: watch::Receiver<FleetPods>,
    desired: watch::Receiver<Arc<Desired>>,
) {
    // Every reason is shown from the fleet's start, 0 until it happens: a reader (a dashboard,
    // a test) tells "no reload" from "no such metric".
    for reason in crate::plan::ReloadReason::ALL {
        let _ = crate::telemetry::metrics::metrics()
            .reloads
            .get_or_create(&crate::telemetry::metrics::ReloadLabels { reason: reason.as_str() });
    }
    let mut drivers: JoinSet<()> = JoinSet::new();
    let mut running: BTreeMap<PodUid, Running> = BTreeMap::new();
    let mut tasks: HashMap<Id, PodUid> = HashMap::new();
    let start = |target: PodTarget, drivers: &mut JoinSet<()>, deaths: u32| {
        let (journal, actions, slots) = (journal.clone(), actions.clone(), slots.clone());
        let (desired, pod) = (desired.clone(), target.clone());
        let delay = if deaths == 0 { Duration::ZERO } else { restart_delay(deaths) };
        let (stop, stop_rx) = watch::channel(false);
        // Made when it starts, not before its delay: it reads its journal record then.
        let task = drivers.spawn(async move {
            tokio::time::sleep(delay).await;
            let first = desired.borrow().clone();
            PodDriver::new(pod, journal, actions, slots, term, first).run(desired, stop_rx).await;
        });
        Running { stop, task, target, started: tokio::time::Instant::now() + delay, deaths }
    };
    loop {
        let current = pods.borrow_and_update().clone();
        let wanted: BTreeMap<PodUid, PodTarget> =
            current.targets.into_iter().map(|pod| (pod.uid.clone(), pod)).collect();
        let leaving: Vec<PodUid> = running
            .iter()
            .filter(|(uid, driver)| wanted.get(*uid) != Some(&driver.target))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in leaving {
            if let Some(driver) = running.remove(&uid) {
                // Its action in flight ends at its next step; a new driver for the pod waits
                // for that (below): two drivers never work one pod at once.
                let _ = driver.stop.send(true);
                actions.forget_pod(&driver.target);
                info!(pod = %driver.target.name, %uid, "pod cannot be deployed to now: driver stopped");
            }
        }
        forget_deleted(&journal, &current.present).await;
        for (uid, target) in wanted {
            // A stopped driver of this pod may still finish its action: started when it ends.
            if running.contains_key(&uid) || tasks.values().any(|stopping| *stopping == uid) {
                continue;
            }
            info!(pod = %target.name, %uid, "pod found: starting its driver");
            let driver = start(target, &mut drivers, 0);
            tasks.insert(driver.task.id(), uid.clone());
            running.insert(uid, driver);
        }
        tokio::select! {
            changed = pods.changed() => if changed.is_err() { break },
            Some(ended) = drivers.join_next_with_id() => {
                let (id, panic) = match ended {
                    Ok((id, ())) => (id, None),
                    Err(error) => (error.id(), error.is_panic().then(|| error.to_string())),
                };
                let Some(uid) = tasks.remove(&id) else { continue };
                let still_current = running.get(&uid).is_some_and(|driver| driver.task.id() == id);
                if let Some(panic) = panic {
                    error!(%uid, %panic, "pod driver died");
                    crate::telemetry::metrics::metrics().driver_restarts.inc();
                }
                if still_current && let Some(dead) = running.remove(&uid) {
                    // A driver ends by itself only when it died: start it again from the journal,
                    // after a delay that grows while it keeps dying.
                    let deaths = if dead.started.elapsed() > HEALTHY_RUN { 1 } else { dead.deaths + 1 };
                    let delay = restart_delay(deaths);
                    warn!(pod = %dead.target.name, %uid, deaths, ?delay, "restarting the pod's driver");
                    let driver = start(dead.target, &mut drivers, deaths);
                    tasks.insert(driver.task.id(), uid.clone());
                    running.insert(uid, driver);
                }
            }
        }
    }
    for driver in running.values() {
        let _ = driver.stop.send(true);
    }
    let drained = async { while drivers.join_next().await.is_some() {} };
    if tokio::time::timeout(STOP_GRACE, drained).await.is_err() {
        warn!("pod drivers did not stop within {}s: aborted", STOP_GRACE.as_secs());
    }
}

/// Forgets the journal records of pods that no longer exist (the records are read from the
/// journal's memory; forgetting writes to disk, on the blocking pool).
async fn forget_deleted(journal: &Arc<Journal>, present: &BTreeSet<PodUid>) {
    let known = match journal.pods() {
        Ok(known) => known,
        Err(error) => {
            warn!(%error, "could not read the journal to forget deleted pods");
            return;
        }
    };
    let gone: Vec<_> = known.into_iter().filter(|pod| !present.contains(&pod.uid)).collect();
    if gone.is_empty() {
        return;
    }
    let forgotten = crate::journal::on_blocking_pool(journal, move |journal| {
        for pod in gone {
            match journal.forget(&pod.uid) {
                Ok(()) => info!(pod = %pod.name, uid = %pod.uid, "pod deleted: journal record forgotten"),
                Err(error) => warn!(uid = %pod.uid, %error, "could not forget a deleted pod"),
            }
        }
        Ok(())
    });
    if let Err(failure) = forgotten.await {
        warn!(%failure, "forgetting deleted pods failed");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap as Map, HashSet};
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;
    use crate::dataplane::ConfigVersion;
    use crate::files::{FileSet, RenderedFile};
    use crate::fleet::pod::{ActionError, Patched, Reading, Validation};
    use crate::pod::{FileChecksums, State, StoredCopy};

    /// Scripted pods by UID: each runs what was last pushed to it; some fail, some are slow.
    #[derive(Default)]
    struct FakeFleet {
        runs: Mutex<Map<String, FileChecksums>>,
        pushes: Mutex<Vec<String>>,
        failing: Mutex<HashSet<String>>,
        slow: Mutex<HashSet<String>>,
        panicking: Mutex<HashSet<String>>,
        /// Actions in flight per pod now, and the most ever at once on one pod.
        busy: Mutex<Map<String, usize>>,
        most_at_once: Mutex<usize>,
    }

    impl FakeFleet {
        fn enter(&self, pod: &PodTarget) {
            let mut busy = self.busy.lock().unwrap();
            let now = busy.entry(pod.uid.0.clone()).or_default();
            *now += 1;
            let mut most = self.most_at_once.lock().unwrap();
            *most = (*most).max(*now);
        }

        fn leave(&self, pod: &PodTarget) {
            *self.busy.lock().unwrap().entry(pod.uid.0.clone()).or_default() -= 1;
        }
    }

    impl PodActions for FakeFleet {
        async fn verify(&self, pod: &PodTarget, _: Option<&StoredCopy>, _: bool) -> Result<Reading, ActionError> {
            self.enter(pod);
            tokio::task::yield_now().await;
            self.leave(pod);
            if self.panicking.lock().unwrap().remove(&pod.uid.0) {
                panic!("a bug in a driver");
            }
            if self.failing.lock().unwrap().contains(&pod.uid.0) {
                return Err(ActionError::Failed("connection refused".into()));
            }
            let observed = self.runs.lock().unwrap().get(&pod.uid.0).cloned().unwrap_or_default();
            Ok(Reading {
                observed,
                version: ConfigVersion(1),
                copy: None,
                address_changes: crate::plan::AddressChanges::Followed,
                versions: Default::default(),
            })
        }
        async fn validate(&self, _: &PodTarget, _: &Desired) -> Result<Validation, ActionError> {
            Ok(Validation::Passed)
        }
        async fn push(&self, pod: &PodTarget, desired: &Desired, _: ConfigVersion) -> Result<StoredCopy, ActionError> {
            self.enter(pod);
            if self.slow.lock().unwrap().contains(&pod.uid.0) {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            self.leave(pod);
            self.pushes.lock().unwrap().push(pod.uid.0.clone());
            self.runs.lock().unwrap().insert(pod.uid.0.clone(), desired.checksums.clone());
            let render = desired.files.haproxy_cfg.checksum;
            Ok(StoredCopy { render, stored: render, version: ConfigVersion(2) })
        }
        async fn runtime_patch(
            &self,
            _: &PodTarget,
            _: &Desired,
            _: &[crate::plan::RuntimeAction],
            _: bool,
            _: ConfigVersion,
        ) -> Result<Patched, ActionError> {
            Ok(Patched::NotTaken(None))
        }
        async fn restore_files(&self, _: &PodTarget) -> Result<(), String> {
            Ok(())
        }
    }

    fn pod(uid: &str, name: &str) -> PodTarget {
        PodTarget { uid: PodUid(uid.into()), namespace: "haptic".into(), name: name.into(), endpoint: String::new() }
    }

    fn desired(tag: &str) -> Arc<Desired> {
        Arc::new(Desired::new(FileSet {
            haproxy_cfg: RenderedFile::new(format!("global # {tag}\n")),
            maps: Map::new(),
            files: Map::new(),
            certs: Map::new(),
        }))
    }

    async fn until(journal: &Journal, what: &str, done: impl Fn(&Journal) -> bool) {
        for _ in 0..100_000 {
            if done(journal) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what}: never happened: {:?}", journal.pods().unwrap());
    }

    fn fleet_of(targets: &[PodTarget], others: &[&str]) -> FleetPods {
        let present = targets.iter().map(|pod| pod.uid.clone()).chain(others.iter().map(|u| PodUid((*u).into())));
        FleetPods { targets: targets.to_vec(), present: present.collect() }
    }

    /// The fleet on `fake` pods, two actions of each kind at once.
    fn spawn_fleet(
        journal: &Arc<Journal>,
        fake: &Arc<FakeFleet>,
        pods: watch::Receiver<FleetPods>,
        desired: watch::Receiver<Arc<Desired>>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(run(journal.clone(), fake.clone(), ActionSlots::new(2), LeaderTerm::default(), pods, desired))
    }

    fn state(journal: &Journal, uid: &str) -> Option<State> {
        journal.pod(&PodUid(uid.into())).unwrap().map(|p| p.state)
    }

    #[tokio::test(start_paused = true)]
    async fn slow_and_failing_pods_do_not_hold_up_the_others_and_recreated_pods_start_over() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::open(&dir.path().join("journal"), 100).unwrap().0);
        let fake = Arc::new(FakeFleet::default());
        fake.slow.lock().unwrap().insert("slow".into());
        fake.failing.lock().unwrap().insert("down".into());
        let (pods_tx, pods_rx) = watch::channel(fleet_of(
            &[pod("slow", "haproxy-0"), pod("down", "haproxy-1"), pod("ok", "haproxy-2")],
            &[],
        ));
        let (_desired_tx, desired_rx) = watch::channel(desired("a"));
        let fleet = spawn_fleet(&journal, &fake, pods_rx, desired_rx);

        until(&journal, "the healthy pod in sync", |j| state(j, "ok") == Some(State::InSync)).await;
        assert_ne!(state(&journal, "slow"), Some(State::InSync), "the slow pod is still pushing");
        assert_eq!(state(&journal, "down"), Some(State::Unknown), "the unreachable pod waits, with its error");
        let down = journal.pod(&PodUid("down".into())).unwrap().unwrap();
        assert_eq!(down.last_transition.error.as_deref(), Some("connection refused"));

        fake.failing.lock().unwrap().clear();
        until(&journal, "every pod in sync", |j| {
            ["slow", "down", "ok"].iter().all(|u| state(j, u) == Some(State::InSync))
        })
        .await;

        // haproxy-2 is deleted and recreated under the same name: a new UID, a fresh start.
        pods_tx
            .send(fleet_of(&[pod("slow", "haproxy-0"), pod("down", "haproxy-1"), pod("ok-2", "haproxy-2")], &[]))
            .unwrap();
        until(&journal, "the new pod in sync", |j| state(j, "ok-2") == Some(State::InSync)).await;
        assert_eq!(state(&journal, "ok"), None, "the old UID is forgotten");
        assert_eq!(
            fake.pushes.lock().unwrap().iter().filter(|u| *u == "ok-2").count(),
            1,
            "the new UID got a full sync"
        );

        drop(pods_tx);
        fleet.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_that_cannot_be_deployed_to_keeps_its_record_until_it_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::open(&dir.path().join("journal"), 100).unwrap().0);
        let fake = Arc::new(FakeFleet::default());
        let (pods_tx, pods_rx) = watch::channel(fleet_of(&[pod("a", "haproxy-0"), pod("b", "haproxy-1")], &[]));
        let (_desired_tx, desired_rx) = watch::channel(desired("a"));
        let fleet = spawn_fleet(&journal, &fake, pods_rx, desired_rx);
        until(&journal, "both in sync", |j| {
            state(j, "a") == Some(State::InSync) && state(j, "b") == Some(State::InSync)
        })
        .await;
        // b's Dataplane API turns NotReady: no more work on it, but it is still b.
        pods_tx.send(fleet_of(&[pod("a", "haproxy-0")], &["b"])).unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(state(&journal, "b"), Some(State::InSync), "the record of a NotReady pod is kept");
        // Ready again: verified, found as it was, no push.
        pods_tx.send(fleet_of(&[pod("a", "haproxy-0"), pod("b", "haproxy-1")], &[])).unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(fake.pushes.lock().unwrap().iter().filter(|u| *u == "b").count(), 1, "b was pushed to once");
        // Deleted: forgotten.
        pods_tx.send(fleet_of(&[pod("a", "haproxy-0")], &[])).unwrap();
        until(&journal, "b forgotten", |j| state(j, "b").is_none()).await;
        drop(pods_tx);
        fleet.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_reached_otherwise_gets_its_new_driver_only_after_the_old_one_ends() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::open(&dir.path().join("journal"), 100).unwrap().0);
        let fake = Arc::new(FakeFleet::default());
        fake.slow.lock().unwrap().insert("a".into());
        let (pods_tx, pods_rx) = watch::channel(fleet_of(&[pod("a", "haproxy-0")], &[]));
        let (_desired_tx, desired_rx) = watch::channel(desired("a"));
        let fleet = spawn_fleet(&journal, &fake, pods_rx, desired_rx);
        // The push takes 30 s; meanwhile the pod is reached at another endpoint (a new target).
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut moved = pod("a", "haproxy-0");
        moved.endpoint = "http://10.0.0.9:5555".into();
        pods_tx.send(fleet_of(&[moved], &[])).unwrap();
        until(&journal, "the pod in sync", |j| state(j, "a") == Some(State::InSync)).await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(*fake.most_at_once.lock().unwrap(), 1, "two drivers worked one pod at once");
        drop(pods_tx);
        fleet.await.unwrap();
    }

    #[test]
    fn a_driver_that_keeps_dying_is_started_again_ever_more_slowly() {
        let delays: Vec<u64> = (1..=9).map(|deaths| restart_delay(deaths).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_driver_that_dies_is_counted_and_started_again() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Arc::new(Journal::open(&dir.path().join("journal"), 100).unwrap().0);
        let fake = Arc::new(FakeFleet::default());
        fake.panicking.lock().unwrap().insert("a".into());
        let restarts = crate::telemetry::metrics::metrics().driver_restarts.get();
        let (pods_tx, pods_rx) = watch::channel(fleet_of(&[pod("a", "haproxy-0")], &[]));
        let (_desired_tx, desired_rx) = watch::channel(desired("a"));
        let fleet = spawn_fleet(&journal, &fake, pods_rx, desired_rx);
        until(&journal, "in sync after the restart", |j| state(j, "a") == Some(State::InSync)).await;
        assert!(crate::telemetry::metrics::metrics().driver_restarts.get() > restarts, "the death is counted");
        drop(pods_tx);
        fleet.await.unwrap();
    }
}
