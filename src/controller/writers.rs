//! The one shape of every status writer (the configuration's, the Ingresses', the Gateway
//! API's): the loop offers what it owes and never waits for the API server; a task of its own
//! takes what is owed in passes and writes it, so a slow API server delays a status, never a
//! render. What is owed merges offers (a newer status replaces an unwritten one), so memory stays
//! bounded however often the loop offers.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::tasks::{OwnedTask, TaskTree};

/// How soon a pass that left something to retry runs again when nothing new is offered.
const RETRY: Duration = Duration::from_secs(1);

/// What a writer owes the API server: offers merge in, a pass takes them out.
pub(super) trait Owed: Default + Send + 'static {
    /// What the loop offers.
    type Offer: Send;
    /// Merges an offer in; whether anything new is owed (a pass is then due).
    fn merge(&mut self, offer: Self::Offer) -> bool;
}

/// The writes of one kind of status.
pub(super) trait StatusWrites: Send + 'static {
    /// What it owes.
    type Owed: Owed;
    /// One pass: takes what is owed from `owed` (locked briefly, never across a write) and
    /// writes it when `may_write`; whether something is left to try again.
    fn pass(&mut self, owed: &SharedOwed<Self::Owed>, may_write: bool) -> impl Future<Output = bool> + Send;
}

/// What is owed, shared by the loop that offers and the task that writes.
pub(super) struct SharedOwed<O>(Mutex<O>);

impl<O> SharedOwed<O> {
    /// The owed state, for a moment.
    pub(super) fn lock(&self) -> MutexGuard<'_, O> {
        // Merges and takes leave the state whole even when a panic interrupts them.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A status writer on its task: [`Self::offer`] from the loop, passes on the task.
pub(super) struct StatusTask<W: StatusWrites> {
    owed: Arc<SharedOwed<W::Owed>>,
    wake: Arc<Notify>,
    _task: OwnedTask,
}

impl<W: StatusWrites> StatusTask<W> {
    /// Starts `writes` on a task of `tasks`; each pass asks `may_write` (a replica that lost the
    /// lease writes nothing).
    pub(super) fn start(
        tasks: &TaskTree,
        name: &'static str,
        mut writes: W,
        may_write: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Self {
        let owed = Arc::new(SharedOwed(Mutex::new(W::Owed::default())));
        let wake = Arc::new(Notify::new());
        let (shared, woken) = (owed.clone(), wake.clone());
        let task = tasks.spawn(name, async move {
            let mut retry = false;
            loop {
                tokio::select! {
                    () = woken.notified() => {}
                    () = tokio::time::sleep(RETRY), if retry => {}
                }
                retry = writes.pass(&shared, may_write()).await;
            }
        });
        Self { owed, wake, _task: task }
    }

    /// Owes `offer` (merged with what is owed already); a pass follows when it owes something new.
    pub(super) fn offer(&self, offer: <W::Owed as Owed>::Offer) {
        let due = self.owed.lock().merge(offer);
        // Notify keeps one wake-up for a pass running now: it takes this at its end.
        if due {
            self.wake.notify_one();
        }
    }
}

/// A write to the API server, given up after `limit` (the kube client waits minutes for a
/// silent peer); the error in words.
pub(super) async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, WriteFailed> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result.map_err(WriteFailed::Refused),
        Err(_) => Err(WriteFailed::NoAnswer(limit)),
    }
}

/// Why a status write did not land.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteFailed {
    /// The API server answered with an error.
    #[error(transparent)]
    Refused(kube::Error),
    /// It did not answer in time.
    #[error("no answer within {}s", .0.as_secs())]
    NoAnswer(Duration),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Owes the latest number offered.
    #[derive(Default)]
    struct Latest(Option<u32>);

    impl Owed for Latest {
        type Offer = u32;
        fn merge(&mut self, offer: u32) -> bool {
            self.0 = Some(offer);
            true
        }
    }

    /// Records what each pass wrote; fails its first `failures` passes.
    struct Recorder {
        written: Arc<Mutex<Vec<u32>>>,
        failures: Arc<AtomicUsize>,
    }

    impl StatusWrites for Recorder {
        type Owed = Latest;
        async fn pass(&mut self, owed: &SharedOwed<Latest>, may_write: bool) -> bool {
            let Some(value) = owed.lock().0 else { return false };
            if !may_write {
                owed.lock().0 = None;
                return false;
            }
            if self.failures.load(Ordering::SeqCst) > 0 {
                self.failures.fetch_sub(1, Ordering::SeqCst);
                return true;
            }
            owed.lock().0 = None;
            self.written.lock().unwrap().push(value);
            false
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_offer_replaces_an_unwritten_one_and_a_failure_is_retried() {
        let tree = TaskTree::default();
        let written = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(AtomicUsize::new(1));
        let writer = StatusTask::start(
            &tree,
            "test writer",
            Recorder { written: written.clone(), failures: failures.clone() },
            || true,
        );
        writer.offer(1);
        writer.offer(2);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(written.lock().unwrap().is_empty(), "the first pass failed");
        tokio::time::sleep(RETRY).await;
        assert_eq!(*written.lock().unwrap(), vec![2], "retried with the latest, written once");
    }

    #[tokio::test(start_paused = true)]
    async fn a_writer_that_may_not_write_drops_what_it_owed() {
        let tree = TaskTree::default();
        let written = Arc::new(Mutex::new(Vec::new()));
        let writer = StatusTask::start(
            &tree,
            "test writer",
            Recorder { written: written.clone(), failures: Arc::default() },
            || false,
        );
        writer.offer(7);
        tokio::time::sleep(RETRY * 3).await;
        assert!(written.lock().unwrap().is_empty());
    }
}
