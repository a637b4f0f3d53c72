//! Retry delays: doubling from a first delay up to a cap, each spread by ±25% so that nodes (or pods) failing
//! together do not come back together.

use std::time::Duration;

/// The delays of one thing being retried: `first`, then twice the last, at most `max`, each jittered.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            next: first.min(max),
            max,
        }
    }

    /// How long to wait before the next try (jittered), and the delay after it doubled.
    pub fn next_delay(&mut self) -> Duration {
        let delay = jitter(self.next);
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
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

    #[test]
    fn delays_double_up_to_the_cap_within_a_quarter_either_side() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
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
