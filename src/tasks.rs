//! Every background task of the controller has one owner: a [`TaskTree`] spawns it and, when the
//! controller stops, stops and awaits whatever still runs, so no task outlives the controller or
//! panics unseen. The part of the program that uses a task holds its [`OwnedTask`], which stops
//! the task when dropped (a configuration version replaced takes its watches with it).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::{AbortHandle, Id, JoinError, JoinSet};
use tracing::{error, warn};

/// The owner of every background task: spawned through it, stopped and awaited by [`Self::close`].
#[derive(Clone, Default)]
pub struct TaskTree {
    inner: Arc<Mutex<Tasks>>,
}

/// The tasks themselves, with their names for the log.
#[derive(Default)]
struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
    closed: bool,
}

impl Tasks {
    /// Collects the tasks that ended, saying which panicked.
    fn reap(&mut self) {
        while let Some(ended) = self.set.try_join_next_with_id() {
            self.ended(ended);
        }
    }

    fn ended(&mut self, ended: Result<(Id, ()), JoinError>) {
        match ended {
            Ok((id, ())) => {
                self.names.remove(&id);
            }
            Err(failure) => {
                let name = self.names.remove(&failure.id()).unwrap_or("a task");
                if failure.is_panic() {
                    error!(task = name, %failure, "a background task panicked");
                }
            }
        }
    }
}

impl TaskTree {
    fn tasks(&self) -> MutexGuard<'_, Tasks> {
        // A panic while the lock was held left nothing half-done: the set is still whole.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts `task` under the tree; it stops when the returned handle is dropped. A closed tree
    /// starts nothing.
    pub fn spawn(&self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) -> OwnedTask {
        let mut tasks = self.tasks();
        tasks.reap();
        if tasks.closed {
            return OwnedTask { handle: None };
        }
        let handle = tasks.set.spawn(task);
        tasks.names.insert(handle.id(), name);
        OwnedTask { handle: Some(handle) }
    }

    /// Starts `task` under the tree and hands back what it returns; the receiver errs when the
    /// task was stopped (or panicked) before returning.
    pub fn spawn_returning<T: Send + 'static>(
        &self,
        name: &'static str,
        task: impl Future<Output = T> + Send + 'static,
    ) -> (OwnedTask, oneshot::Receiver<T>) {
        let (result, returned) = oneshot::channel();
        let owned = self.spawn(name, async move {
            let _ = result.send(task.await);
        });
        (owned, returned)
    }

    /// The names of the tasks still running.
    pub fn running(&self) -> Vec<&'static str> {
        let mut tasks = self.tasks();
        tasks.reap();
        let mut names: Vec<&'static str> = tasks.names.values().copied().collect();
        names.sort_unstable();
        names
    }

    /// Stops every task still running and waits, up to `grace`, for all to end. Those that
    /// should end gracefully are asked to first, by their owners.
    pub async fn close(&self, grace: Duration) {
        let mut set = {
            let mut tasks = self.tasks();
            tasks.closed = true;
            tasks.reap();
            std::mem::take(&mut tasks.set)
        };
        set.abort_all();
        let drained = tokio::time::timeout(grace, async {
            while let Some(ended) = set.join_next_with_id().await {
                self.tasks().ended(ended);
            }
        });
        if drained.await.is_err() {
            warn!(still_running = ?self.running(), "background tasks did not stop within {grace:?}");
        }
    }
}

/// A task of the tree, stopped when this handle is dropped.
#[derive(Debug)]
pub struct OwnedTask {
    handle: Option<AbortHandle>,
}

impl OwnedTask {
    /// Whether the task has ended (a task the closed tree never started has).
    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(AbortHandle::is_finished)
    }
}

impl Drop for OwnedTask {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_handle_stops_its_task_and_closing_stops_the_rest() {
        let tree = TaskTree::default();
        let first = tree.spawn("first", std::future::pending());
        let _second = tree.spawn("second", std::future::pending());
        assert_eq!(tree.running(), vec!["first", "second"]);
        drop(first);
        tokio::task::yield_now().await;
        assert_eq!(tree.running(), vec!["second"]);
        tree.close(Duration::from_secs(1)).await;
        assert!(tree.running().is_empty());
        let late = tree.spawn("late", std::future::pending());
        assert!(late.is_finished(), "a closed tree starts nothing");
    }

    #[tokio::test]
    async fn a_returning_task_hands_back_its_value_or_says_it_was_stopped() {
        let tree = TaskTree::default();
        let (_owned, returned) = tree.spawn_returning("answer", async { 42 });
        assert_eq!(returned.await.ok(), Some(42));
        let (owned, returned) = tree.spawn_returning("stopped", std::future::pending::<u8>());
        drop(owned);
        assert!(returned.await.is_err());
    }
}
