//! Summaries of latency samples.

use serde_json::{json, Value};

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

/// The median of samples in any order.
pub fn median_of(samples: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = samples.into_iter().collect();
    v.sort_by(f64::total_cmp);
    median(&v)
}

/// Nearest-rank percentile of samples in any order.
pub fn percentile_of(samples: impl IntoIterator<Item = f64>, q: f64) -> f64 {
    let mut v: Vec<f64> = samples.into_iter().collect();
    v.sort_by(f64::total_cmp);
    percentile(&v, q)
}

/// `{median, rounds}` of one value per round, in round order.
pub fn by_round(rounds: Vec<f64>) -> Value {
    json!({"median": median_of(rounds.iter().copied()), "rounds": rounds})
}

/// `{n, median, p95, p99, min, max, mean, samples}` of millisecond samples.
pub fn summary(samples: &[f64]) -> Value {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let mean = if s.is_empty() {
        f64::NAN
    } else {
        s.iter().sum::<f64>() / s.len() as f64
    };
    json!({
        "n": s.len(),
        "median": median(&s),
        "p95": percentile(&s, 0.95),
        "p99": percentile(&s, 0.99),
        "min": s.first().copied().unwrap_or(f64::NAN),
        "max": s.last().copied().unwrap_or(f64::NAN),
        "mean": mean,
        "samples": samples,
    })
}
