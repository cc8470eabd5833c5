//! Coalescing of watched changes into renders.
//!
//! The first change after a quiet period renders at once (leading edge); changes that follow
//! within `window` of the last activity are batched and render when `window` passes without
//! another change (trailing edge), but never later than `max_delay` after the first of them.
//! [`Debouncer`] is the pure rule over instants; [`run`] drives it with tokio's clock.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

/// Coalescing settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DebounceSettings {
    /// Quiet time that ends a burst.
    pub window: Duration,
    /// Longest a change waits for its render.
    pub max_delay: Duration,
}

/// What the debouncer wants after an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Render now.
    Fire,
    /// Render at this instant unless another change moves it.
    WaitUntil(Instant),
}

/// The coalescing rule, over plain instants.
#[derive(Clone, Debug)]
pub struct Debouncer {
    settings: DebounceSettings,
    /// The last change or render; the quiet period is measured from it.
    last_activity: Option<Instant>,
    /// The first change not yet rendered.
    pending_since: Option<Instant>,
}

impl Debouncer {
    /// A debouncer that has seen nothing yet.
    pub fn new(settings: DebounceSettings) -> Self {
        Self { settings, last_activity: None, pending_since: None }
    }

    /// A change happened at `now`.
    pub fn on_change(&mut self, now: Instant) -> Decision {
        let quiet = self.last_activity.is_none_or(|last| now.saturating_duration_since(last) >= self.settings.window);
        self.last_activity = Some(now);
        if self.pending_since.is_none() && quiet {
            return Decision::Fire;
        }
        self.pending_since.get_or_insert(now);
        match self.deadline() {
            Some(deadline) if deadline <= now => self.fire(now),
            Some(deadline) => Decision::WaitUntil(deadline),
            None => self.fire(now),
        }
    }

    /// When batched changes are due, if any are pending.
    pub fn deadline(&self) -> Option<Instant> {
        let first = self.pending_since?;
        let trailing = self.last_activity.unwrap_or(first) + self.settings.window;
        Some(trailing.min(first + self.settings.max_delay))
    }

    /// The clock reached `now`: true when the pending changes should render now.
    pub fn on_timer(&mut self, now: Instant) -> bool {
        match self.deadline() {
            Some(deadline) if deadline <= now => self.fire(now) == Decision::Fire,
            _ => false,
        }
    }

    fn fire(&mut self, now: Instant) -> Decision {
        self.pending_since = None;
        self.last_activity = Some(now);
        Decision::Fire
    }
}

/// Turns a stream of change notifications (each carrying what changed) into render requests,
/// each carrying every change it covers. Ends when the change channel closes, after flushing.
pub async fn run<T: Send>(settings: DebounceSettings, mut changes: mpsc::Receiver<T>, renders: mpsc::Sender<Vec<T>>) {
    let mut debouncer = Debouncer::new(settings);
    let mut batch: Vec<T> = Vec::new();
    loop {
        let deadline = debouncer.deadline();
        tokio::select! {
            change = changes.recv() => {
                let Some(change) = change else { break };
                batch.push(change);
                if debouncer.on_change(Instant::now()) == Decision::Fire
                    && renders.send(std::mem::take(&mut batch)).await.is_err()
                {
                    return;
                }
            }
            _ = sleep_until_opt(deadline), if deadline.is_some() => {
                if debouncer.on_timer(Instant::now()) && renders.send(std::mem::take(&mut batch)).await.is_err() {
                    return;
                }
            }
        }
    }
    if !batch.is_empty() {
        let _ = renders.send(batch).await;
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    if let Some(deadline) = deadline {
        tokio::time::sleep_until(deadline).await;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    use super::*;

    const SETTINGS: DebounceSettings =
        DebounceSettings { window: Duration::from_millis(100), max_delay: Duration::from_millis(1000) };

    fn ms(start: Instant, n: u64) -> Instant {
        start + Duration::from_millis(n)
    }

    #[test]
    fn first_change_after_quiet_fires_at_once_and_a_burst_fires_once_more_at_its_end() {
        let start = Instant::now();
        let mut d = Debouncer::new(SETTINGS);
        assert_eq!(d.on_change(ms(start, 0)), Decision::Fire);
        assert_eq!(d.on_change(ms(start, 10)), Decision::WaitUntil(ms(start, 110)));
        assert_eq!(d.on_change(ms(start, 50)), Decision::WaitUntil(ms(start, 150)));
        assert!(!d.on_timer(ms(start, 149)));
        assert!(d.on_timer(ms(start, 150)));
        assert_eq!(d.deadline(), None);
        // Quiet again for a window: the next change is a leading edge.
        assert_eq!(d.on_change(ms(start, 300)), Decision::Fire);
    }

    #[test]
    fn a_continuous_stream_still_renders_every_max_delay() {
        let start = Instant::now();
        let mut d = Debouncer::new(SETTINGS);
        assert_eq!(d.on_change(ms(start, 0)), Decision::Fire);
        let mut fired = Vec::new();
        for t in (20..3000).step_by(20) {
            if d.on_timer(ms(start, t)) {
                fired.push(t);
            }
            if d.on_change(ms(start, t)) == Decision::Fire {
                fired.push(t);
            }
        }
        assert_eq!(fired, [1020, 2020], "one render per max_delay while changes never pause");
    }

    proptest! {
    #![proptest_config(ProptestConfig {
        // Regressions live beside the source, not in a directory at the top of the project.
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::with_cases(256)
    })]

        /// Whatever the change times, every change is rendered within max_delay of happening.
        #[test]
        fn no_change_waits_longer_than_max_delay(gaps in proptest::collection::vec(0u64..400, 1..60)) {
            let start = Instant::now();
            let mut d = Debouncer::new(SETTINGS);
            let mut now = start;
            let mut oldest_unrendered: Option<Instant> = None;
            for gap in gaps {
                let next = now + Duration::from_millis(gap);
                // Let due timers fire before the next change.
                while let Some(deadline) = d.deadline() {
                    if deadline > next { break; }
                    prop_assert!(d.on_timer(deadline));
                    let waited = deadline.duration_since(oldest_unrendered.take().unwrap());
                    prop_assert!(waited <= SETTINGS.max_delay);
                }
                now = next;
                match d.on_change(now) {
                    Decision::Fire => { oldest_unrendered = None; }
                    Decision::WaitUntil(at) => {
                        prop_assert!(at > now);
                        oldest_unrendered.get_or_insert(now);
                    }
                }
            }
            if let Some(deadline) = d.deadline() {
                prop_assert!(deadline.duration_since(oldest_unrendered.unwrap()) <= SETTINGS.max_delay);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_driver_batches_a_burst_into_two_renders() {
        let (change_tx, change_rx) = mpsc::channel(100);
        let (render_tx, mut render_rx) = mpsc::channel(100);
        let driver = tokio::spawn(run(SETTINGS, change_rx, render_tx));
        let start = Instant::now();
        for i in 0..20 {
            change_tx.send(i).await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(render_rx.recv().await.unwrap(), vec![0], "leading edge: the first change alone, at once");
        let trailing = render_rx.recv().await.unwrap();
        assert_eq!(trailing, (1..20).collect::<Vec<_>>());
        // Last change at 190 ms; quiet for the 100 ms window.
        assert_eq!(Instant::now().duration_since(start), Duration::from_millis(290));
        drop(change_tx);
        driver.await.unwrap();
        assert!(render_rx.recv().await.is_none());
    }
}
