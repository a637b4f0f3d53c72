//! The one loop for everything the node process keeps converged (the hook set, dynamic networks): keys are
//! scheduled by whatever notices a change, and a reconcile function brings each key's world in line.
//!
//! What it guarantees, for every user alike: a key scheduled many times before it runs runs once (dedup); a key
//! scheduled while it runs runs once more after (never twice at once); at most `concurrency` keys run at once; a
//! reconcile that fails is tried again after a delay that doubles with each failure, jittered (reset by a
//! success); a reconcile may ask to run again after a delay of its own; and every key seen (until a reconcile
//! says to forget it) is reconciled again every `resync`, so a missed trigger is never missed for long.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use plexus_cluster::backoff::Backoff;

/// What a reconcile of one key came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Converged: nothing to do until the key is scheduled again (or the resync).
    Settled,
    /// Converged for now; run again after this long (a retry the reconcile times itself).
    RequeueAfter(Duration),
    /// Failed: try again with backoff.
    Retry,
    /// The key's object is gone: drop it from the resync.
    Forget,
}

/// How a [`Controller`] runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Keys reconciled at once at most.
    pub concurrency: usize,
    /// The first and the longest delay of a failing key's retries.
    pub retry_first: Duration,
    pub retry_max: Duration,
    /// How often every known key is reconciled again (`None`: never).
    pub resync: Option<Duration>,
}

struct Queue<K> {
    /// Keys waiting, with when each is due.
    due: HashMap<K, Instant>,
    running: HashSet<K>,
    /// Every key scheduled and not forgotten, for the resync (kept only when there is one).
    known: HashSet<K>,
    failing: HashMap<K, Backoff>,
}

/// A keyed work queue and the loop that drains it (see the module docs). Cheap to clone: clones share the queue.
pub struct Controller<K> {
    queue: Arc<Mutex<Queue<K>>>,
    wake: Arc<tokio::sync::Notify>,
    settings: Settings,
}

impl<K> Clone for Controller<K> {
    fn clone(&self) -> Self {
        Controller {
            queue: self.queue.clone(),
            wake: self.wake.clone(),
            settings: self.settings.clone(),
        }
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> Controller<K> {
    pub fn new(settings: Settings) -> Controller<K> {
        Controller {
            queue: Arc::new(Mutex::new(Queue {
                due: HashMap::new(),
                running: HashSet::new(),
                known: HashSet::new(),
                failing: HashMap::new(),
            })),
            wake: Arc::new(tokio::sync::Notify::new()),
            settings,
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue<K>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reconcile `key` as soon as a slot is free (once, however often it is scheduled before it runs).
    pub fn schedule(&self, key: K) {
        self.schedule_at(key, Instant::now());
    }

    /// Reconcile `key` after `delay`, unless it is due sooner already.
    pub fn schedule_after(&self, key: K, delay: Duration) {
        self.schedule_at(key, Instant::now() + delay);
    }

    fn schedule_at(&self, key: K, at: Instant) {
        let mut q = self.queue();
        if self.settings.resync.is_some() {
            q.known.insert(key.clone());
        }
        let due = q.due.entry(key).or_insert(at);
        *due = (*due).min(at);
        drop(q);
        self.wake.notify_one();
    }

    /// Keys running now.
    pub fn running(&self) -> usize {
        self.queue().running.len()
    }

    /// Runs until the future is dropped: every due key is handed to `reconcile`, within the concurrency bound.
    pub async fn run<F, Fut>(&self, reconcile: F)
    where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let reconcile = Arc::new(reconcile);
        let mut next_resync = self.settings.resync.map(|every| Instant::now() + every);
        loop {
            let now = Instant::now();
            if next_resync.is_some_and(|at| at <= now) {
                let mut q = self.queue();
                let keys: Vec<K> = q.known.iter().cloned().collect();
                for key in keys {
                    q.due.entry(key).or_insert(now);
                }
                next_resync = self.settings.resync.map(|every| now + every);
            }
            for key in self.take_due(now) {
                let (this, reconcile) = (self.clone(), reconcile.clone());
                tokio::spawn(async move {
                    let outcome = reconcile(key.clone()).await;
                    this.finished(key, outcome);
                });
            }
            let next_due = self.next_due();
            let wake_at = match (next_due, next_resync) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// The due keys that may start now (earliest first, up to the free slots), marked running.
    fn take_due(&self, now: Instant) -> Vec<K> {
        let mut q = self.queue();
        let free = self
            .settings
            .concurrency
            .max(1)
            .saturating_sub(q.running.len());
        let mut ready: Vec<(Instant, K)> = q
            .due
            .iter()
            .filter(|(k, at)| **at <= now && !q.running.contains(*k))
            .map(|(k, at)| (*at, k.clone()))
            .collect();
        ready.sort_by_key(|(at, _)| *at);
        ready.truncate(free);
        ready
            .into_iter()
            .map(|(_, key)| {
                q.due.remove(&key);
                q.running.insert(key.clone());
                key
            })
            .collect()
    }

    /// When the next waiting key that is not running is due.
    fn next_due(&self) -> Option<Instant> {
        let q = self.queue();
        if q.running.len() >= self.settings.concurrency.max(1) {
            // A finishing key wakes the loop.
            return None;
        }
        q.due
            .iter()
            .filter(|(k, _)| !q.running.contains(*k))
            .map(|(_, at)| *at)
            .min()
    }

    fn finished(&self, key: K, outcome: Outcome) {
        let mut q = self.queue();
        q.running.remove(&key);
        let now = Instant::now();
        let again = match outcome {
            Outcome::Settled => {
                q.failing.remove(&key);
                None
            }
            Outcome::RequeueAfter(delay) => {
                q.failing.remove(&key);
                Some(now + delay)
            }
            Outcome::Retry => {
                let (first, max) = (self.settings.retry_first, self.settings.retry_max);
                let delay = q
                    .failing
                    .entry(key.clone())
                    .or_insert_with(|| Backoff::jittered(first, max))
                    .next_delay();
                Some(now + delay)
            }
            Outcome::Forget => {
                q.failing.remove(&key);
                q.known.remove(&key);
                None
            }
        };
        if let Some(at) = again {
            let due = q.due.entry(key).or_insert(at);
            *due = (*due).min(at);
        }
        drop(q);
        self.wake.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn settings(concurrency: usize, resync: Option<Duration>) -> Settings {
        Settings {
            concurrency,
            retry_first: Duration::from_secs(1),
            retry_max: Duration::from_secs(8),
            resync,
        }
    }

    /// Each reconcile's key and start time, in order.
    type Log = Arc<Mutex<Vec<(&'static str, Instant)>>>;

    /// Starts the controller with a reconcile that logs, takes `work`, and answers `outcome(key, nth call)`.
    fn start(
        c: &Controller<&'static str>,
        work: Duration,
        outcome: impl Fn(&str, usize) -> Outcome + Send + Sync + 'static,
    ) -> Log {
        let log: Log = Arc::default();
        let (seen, outcome) = (log.clone(), Arc::new(outcome));
        let runner = c.clone();
        tokio::spawn(async move {
            runner
                .run(move |key| {
                    let (seen, outcome) = (seen.clone(), outcome.clone());
                    async move {
                        let n = {
                            let mut s = seen.lock().unwrap();
                            s.push((key, Instant::now()));
                            s.iter().filter(|(k, _)| *k == key).count()
                        };
                        tokio::time::sleep(work).await;
                        outcome(key, n)
                    }
                })
                .await
        });
        log
    }

    fn calls(log: &Log, key: &str) -> Vec<Instant> {
        log.lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, t)| *t)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_scheduled_many_times_before_it_runs_runs_once() {
        let c = Controller::new(settings(4, None));
        for _ in 0..5 {
            c.schedule("a");
        }
        c.schedule_after("a", Duration::from_secs(1));
        let log = start(&c, Duration::from_millis(10), |_, _| Outcome::Settled);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(calls(&log, "a").len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_scheduled_while_it_runs_runs_once_more_after_never_alongside() {
        let c = Controller::new(settings(4, None));
        let log = start(&c, Duration::from_secs(2), |_, _| Outcome::Settled);
        c.schedule("a");
        tokio::time::sleep(Duration::from_millis(500)).await;
        for _ in 0..3 {
            c.schedule("a");
            assert_eq!(c.running(), 1);
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let starts = calls(&log, "a");
        assert_eq!(starts.len(), 2, "{starts:?}");
        assert!(
            starts[1] - starts[0] >= Duration::from_secs(2),
            "overlapped"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_the_concurrency_run_at_once() {
        let c = Controller::new(settings(2, None));
        let peak = Arc::new(AtomicUsize::new(0));
        let log = start(&c, Duration::from_secs(1), |_, _| Outcome::Settled);
        for key in ["a", "b", "c", "d", "e"] {
            c.schedule(key);
        }
        let watcher = {
            let (c, peak) = (c.clone(), peak.clone());
            tokio::spawn(async move {
                loop {
                    peak.fetch_max(c.running(), Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(3500)).await;
        watcher.abort();
        assert_eq!(peak.load(Ordering::SeqCst), 2);
        let starts: Vec<Instant> = log.lock().unwrap().iter().map(|(_, t)| *t).collect();
        assert_eq!(starts.len(), 5, "all ran within three rounds");
        let first = starts[0];
        assert!(starts[4] - first >= Duration::from_secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_key_is_retried_with_doubling_jittered_delays_until_it_succeeds() {
        let c = Controller::new(settings(4, None));
        let log = start(&c, Duration::ZERO, |_, n| {
            if n <= 5 {
                Outcome::Retry
            } else {
                Outcome::Settled
            }
        });
        c.schedule("a");
        tokio::time::sleep(Duration::from_secs(120)).await;
        let starts = calls(&log, "a");
        assert_eq!(
            starts.len(),
            6,
            "retried until it succeeded, then left alone"
        );
        for (i, gap) in starts.windows(2).map(|w| w[1] - w[0]).enumerate() {
            let nominal = Duration::from_secs(1 << i).min(Duration::from_secs(8));
            assert!(
                gap >= nominal.mul_f64(0.75) && gap <= nominal.mul_f64(1.25),
                "retry {i}: {gap:?} for {nominal:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_resets_the_backoff_and_a_reconcile_may_time_its_own_requeue() {
        let c = Controller::new(settings(4, None));
        // Fails, succeeds asking to run again in 20 s, fails: the backoff starts over at 1 s.
        let log = start(&c, Duration::ZERO, |_, n| match n {
            1 | 2 | 4 => Outcome::Retry,
            3 => Outcome::RequeueAfter(Duration::from_secs(20)),
            _ => Outcome::Settled,
        });
        c.schedule("a");
        tokio::time::sleep(Duration::from_secs(60)).await;
        let s = calls(&log, "a");
        assert_eq!(s.len(), 5, "{s:?}");
        let timed = s[3] - s[2];
        assert!(
            timed >= Duration::from_secs(20) && timed < Duration::from_millis(20_005),
            "{timed:?}"
        );
        let reset = s[4] - s[3];
        assert!(
            reset >= Duration::from_millis(750) && reset <= Duration::from_millis(1250),
            "{reset:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn known_keys_are_resynced_until_forgotten() {
        let c = Controller::new(settings(4, Some(Duration::from_secs(30))));
        let log = start(&c, Duration::ZERO, |key, n| {
            if key == "gone" && n >= 2 {
                Outcome::Forget
            } else {
                Outcome::Settled
            }
        });
        c.schedule("kept");
        c.schedule("gone");
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(calls(&log, "kept").len(), 4, "at 0, 30, 60 and 90 s");
        assert_eq!(calls(&log, "gone").len(), 2, "forgotten at its second run");
    }
}
