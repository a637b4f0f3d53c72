//! The one backoff: the delays between tries of something that failed, doubling from a first delay up to a cap.
//!
//! Used by the request layer for a request's retries within its deadline (exact delays), and by the node for
//! everything it retries on its own, its durable writers and its controller's keys (each delay spread by ±25%,
//! so that nodes or pods failing together do not come back together).
//!
//! The doubling is backon's exponential backoff. Its own jitter is not used: it adds up to one more delay (`d`
//! becomes `d`..`2d`), which moves every retry later; a spread either side of the nominal delay keeps the mean
//! where the doubling puts it.

use std::time::Duration;

use backon::BackoffBuilder;

/// The delays of one thing being retried: `first`, then twice the last, at most `max`.
#[derive(Debug)]
pub struct Backoff {
    delays: backon::ExponentialBackoff,
    max: Duration,
    jitter: bool,
}

impl Backoff {
    /// Exact delays (a request's retries, bounded by its deadline).
    pub fn new(first: Duration, max: Duration) -> Backoff {
        let delays = backon::ExponentialBuilder::new()
            .with_min_delay(first.min(max))
            .with_max_delay(max)
            .with_factor(2.0)
            .without_max_times()
            .build();
        Backoff {
            delays,
            max,
            jitter: false,
        }
    }

    /// Delays spread by ±25% each (what a node retries on its own).
    pub fn jittered(first: Duration, max: Duration) -> Backoff {
        Backoff {
            jitter: true,
            ..Backoff::new(first, max)
        }
    }

    /// How long to wait before the next try.
    pub fn next_delay(&mut self) -> Duration {
        // Without a bound on the number of tries the sequence does not end.
        let delay = self.delays.next().unwrap_or(self.max);
        if self.jitter {
            jitter(delay)
        } else {
            delay
        }
    }
}

/// `delay` spread by ±25%.
pub fn jitter(delay: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // A fresh RandomState is randomly keyed: enough randomness for spreading retries.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    delay.mul_f64(0.75 + (r % 1000) as f64 / 2000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) < Duration::from_micros(1)
    }

    #[test]
    fn exact_delays_double_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_millis(3000));
        for nominal in [200, 400, 800, 1600, 3000, 3000] {
            let d = b.next_delay();
            assert!(
                close(d, Duration::from_millis(nominal)),
                "{d:?} for {nominal} ms"
            );
        }
        let mut over = Backoff::new(Duration::from_secs(9), Duration::from_secs(5));
        assert!(
            close(over.next_delay(), Duration::from_secs(5)),
            "the first delay is capped too"
        );
    }

    #[test]
    fn jittered_delays_double_up_to_the_cap_within_a_quarter_either_side() {
        let mut b = Backoff::jittered(Duration::from_secs(1), Duration::from_secs(5));
        for nominal in [1, 2, 4, 5, 5, 5] {
            let nominal = Duration::from_secs(nominal);
            let d = b.next_delay();
            assert!(
                d >= nominal.mul_f64(0.75) && d <= nominal.mul_f64(1.25),
                "{d:?} for {nominal:?}"
            );
        }
    }

    #[test]
    fn jitter_spreads_retries() {
        let delays: std::collections::BTreeSet<Duration> =
            (0..50).map(|_| jitter(Duration::from_secs(8))).collect();
        assert!(delays.len() > 10, "{delays:?}");
        assert!(delays
            .iter()
            .all(|d| *d >= Duration::from_secs(6) && *d <= Duration::from_secs(10)));
    }
}
