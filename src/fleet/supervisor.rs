//! The fleet: one driver per HAProxy pod, started when a pod (by UID) appears and stopped,
//! with its journal record forgotten, when it goes. A pod recreated under the same name has a
//! new UID and so starts from nothing: verification, then a full sync.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::driver::{Desired, DriverSettings, PodActions, PodDriver, PodTarget};
use crate::journal::{Journal, PodUid};

struct Running {
    stop: watch::Sender<bool>,
    task: DriverTask,
}

/// A driver's task, aborted if the supervisor itself is stopped (aborted) mid-way, so that
/// stopping the fleet stops every pod's work at once.
struct DriverTask(JoinHandle<()>);

impl Drop for DriverTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the fleet until the pod list's sender is dropped.
pub async fn run<A: PodActions>(
    journal: Arc<Journal>,
    actions: Arc<A>,
    max_parallel: usize,
    settings: DriverSettings,
    mut pods: watch::Receiver<Vec<PodTarget>>,
    desired: watch::Receiver<Arc<Desired>>,
) {
    let slots = Arc::new(Semaphore::new(max_parallel.max(1)));
    let mut running: BTreeMap<PodUid, Running> = BTreeMap::new();
    loop {
        let current: Vec<PodTarget> = pods.borrow_and_update().clone();
        let wanted: BTreeMap<PodUid, PodTarget> = current.into_iter().map(|pod| (pod.uid.clone(), pod)).collect();
        let gone: Vec<PodUid> = running.keys().filter(|uid| !wanted.contains_key(*uid)).cloned().collect();
        for uid in gone {
            if let Some(mut driver) = running.remove(&uid) {
                let _ = driver.stop.send(true);
                let _ = (&mut driver.task.0).await;
            }
            if let Err(error) = journal.forget(&uid) {
                warn!(%uid, %error, "could not forget a pod that is gone");
            }
            info!(%uid, "pod gone: driver stopped, journal record forgotten");
        }
        for (uid, target) in wanted {
            if running.contains_key(&uid) {
                continue;
            }
            info!(pod = %target.name, %uid, "pod found: starting its driver");
            let first = desired.borrow().clone();
            let driver =
                PodDriver::new(target, journal.clone(), actions.clone(), slots.clone(), settings.clone(), first);
            let (stop, stop_rx) = watch::channel(false);
            let task = tokio::spawn(driver.run(desired.clone(), stop_rx));
            running.insert(uid, Running { stop, task: DriverTask(task) });
        }
        if pods.changed().await.is_err() {
            break;
        }
    }
    for (_, mut driver) in running {
        let _ = driver.stop.send(true);
        let _ = (&mut driver.task.0).await;
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
    use crate::fleet::driver::{ActionError, Reading, StoredCopy, Validation};
    use crate::fleet::machine::{FileChecksums, State};
    use crate::journal::LeaderTerm;

    /// Scripted pods by UID: each runs what was last pushed to it; some fail, some are slow.
    #[derive(Default)]
    struct FakeFleet {
        runs: Mutex<Map<String, FileChecksums>>,
        pushes: Mutex<Vec<String>>,
        failing: Mutex<HashSet<String>>,
        slow: Mutex<HashSet<String>>,
    }

    impl PodActions for FakeFleet {
        async fn verify(&self, pod: &PodTarget, _: Option<&StoredCopy>) -> Result<Reading, ActionError> {
            if self.failing.lock().unwrap().contains(&pod.uid.0) {
                return Err(ActionError::Failed("connection refused".into()));
            }
            let observed = self.runs.lock().unwrap().get(&pod.uid.0).cloned().unwrap_or_default();
            Ok(Reading { observed, version: ConfigVersion(1), copy: None })
        }
        async fn validate(&self, _: &PodTarget, _: &Desired) -> Result<Validation, ActionError> {
            Ok(Validation::Passed)
        }
        async fn push(&self, pod: &PodTarget, desired: &Desired, _: ConfigVersion) -> Result<StoredCopy, ActionError> {
            if self.slow.lock().unwrap().contains(&pod.uid.0) {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
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
            _: ConfigVersion,
        ) -> Result<Option<StoredCopy>, ActionError> {
            Ok(None)
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
        let (pods_tx, pods_rx) =
            watch::channel(vec![pod("slow", "haproxy-0"), pod("down", "haproxy-1"), pod("ok", "haproxy-2")]);
        let (_desired_tx, desired_rx) = watch::channel(desired("a"));
        let settings = DriverSettings { drift_interval: Duration::from_secs(60), term: LeaderTerm::default() };
        let fleet = tokio::spawn(run(journal.clone(), fake.clone(), 2, settings, pods_rx, desired_rx));

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
        pods_tx.send(vec![pod("slow", "haproxy-0"), pod("down", "haproxy-1"), pod("ok-2", "haproxy-2")]).unwrap();
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
}
