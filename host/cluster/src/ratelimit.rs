//! A client-side bound on the requests one client sends: a token bucket (`qps` tokens a second, at most `burst`
//! saved up), as kubelet's `--kube-api-qps`/`--kube-api-burst`, in a tower layer under kube's client. A request
//! waits for its token before it is sent; reservations are taken in order, so waiting requests go out in the
//! order they asked, each `1/qps` after the one before. A request given up while it waits (its caller's timeout)
//! gives its token back: requests that time out in the queue must not use up the bucket for those behind them
//! (a daemon starting with hundreds of kept writes would otherwise starve its own watches).
//!
//! Hand-written rather than taken from a crate (tower's `RateLimit`, governor) for those two properties:
//! requests go in the order they asked, and a request dropped while it waits gives its token back.
//!
//! The daemon's [`crate::KubeApi`] has three budgets ([`Rates`]), each its own bucket: one for the writes of a
//! pod's network-status, which a person or a controller waits for (a hot-plugged network, a pod's networks shown)
//! and which must not queue behind the background work (reports, claim writes, reads) that the per-node bound is
//! for; one for events; and one for everything else. There is one status write per ADD or change of a pod of the
//! node, as kubelet writes one status per change of a pod. Reads of single ResourceClaims (a node reads its pods'
//! claims by name as they start) share that budget. Events come in proportion to pods started (one per
//! attachment), as kubelet's own do, which have their own budget (`--event-qps`) for the same reason: a node that
//! starts pods faster than the background budget allows would otherwise fall behind with them for as long as it
//! does, and lose what its in-memory bound or a restart drops. An event waits for its token before its attempt
//! starts, so that the wait does not count against the request's timeout (a burst of events waits its turn
//! instead of timing out in the queue).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

/// Requests a second and the burst a client may send.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub qps: f64,
    pub burst: u32,
}

/// A client's budgets: network-status writes, events, and everything else.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rates {
    pub background: RateLimit,
    pub status: RateLimit,
    pub events: RateLimit,
}

/// The bucket: tokens refill at `qps`, up to `burst`; a request takes one, or reserves the next one to come.
#[derive(Debug)]
pub struct TokenBucket {
    limit: RateLimit,
    /// Tokens now (negative: reserved ahead) and when they were counted.
    state: Mutex<(f64, Instant)>,
}

impl TokenBucket {
    pub fn new(limit: RateLimit) -> TokenBucket {
        TokenBucket {
            limit,
            state: Mutex::new((f64::from(limit.burst.max(1)), Instant::now())),
        }
    }

    /// The tokens in `state` now, refilled since it was counted, at most `burst`; and now.
    fn refilled(&self, state: &(f64, Instant)) -> (f64, Instant) {
        let now = Instant::now();
        let burst = f64::from(self.limit.burst.max(1));
        let tokens = state.0 + now.duration_since(state.1).as_secs_f64() * self.limit.qps;
        (tokens.min(burst), now)
    }

    /// How long the caller must wait for its token (zero when one is there); the token is taken either way.
    pub fn reserve(&self) -> Duration {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (refilled, now) = self.refilled(&s);
        let tokens = refilled - 1.0;
        *s = (tokens, now);
        if tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-tokens / self.limit.qps)
        }
    }

    /// Takes a token if one is there now; reserves none otherwise.
    pub fn try_take(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (refilled, now) = self.refilled(&s);
        if refilled < 1.0 {
            *s = (refilled, now);
            return false;
        }
        *s = (refilled - 1.0, now);
        true
    }

    /// Gives back a token reserved and not used.
    fn give_back(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 += 1.0;
    }

    /// Waits for a token; dropped while it waits, it gives the token back.
    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            struct Reserved<'a>(Option<&'a TokenBucket>);
            impl Drop for Reserved<'_> {
                fn drop(&mut self) {
                    if let Some(bucket) = self.0 {
                        bucket.give_back();
                    }
                }
            }
            let mut reserved = Reserved(Some(self));
            tokio::time::sleep(wait).await;
            reserved.0 = None;
        }
    }
}

/// The layer that makes every request of a client wait for a token of its bucket.
#[derive(Clone)]
pub struct RateLimitLayer {
    bucket: Arc<TokenBucket>,
}

impl RateLimitLayer {
    pub fn new(limit: RateLimit) -> RateLimitLayer {
        RateLimitLayer {
            bucket: Arc::new(TokenBucket::new(limit)),
        }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner,
            bucket: self.bucket.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RateLimited<S> {
    inner: S,
    bucket: Arc<TokenBucket>,
}

impl<S, B> tower::Service<http::Request<B>> for RateLimited<S>
where
    S: tower::Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The instance that was polled ready makes the call, after the token; a clone stays for the next one.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let bucket = self.bucket.clone();
        Box::pin(async move {
            bucket.acquire().await;
            ready.call(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_goes_at_once_then_requests_go_at_qps_in_order() {
        let bucket = Arc::new(TokenBucket::new(RateLimit {
            qps: 10.0,
            burst: 5,
        }));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..25 {
            let b = bucket.clone();
            tasks.push(tokio::spawn(async move {
                b.acquire().await;
                (i, start.elapsed())
            }));
        }
        let mut sent = Vec::new();
        for t in tasks {
            sent.push(t.await.unwrap());
        }
        for (i, at) in sent {
            // The first five at once, then one every 100 ms.
            let due = Duration::from_millis(100 * (i as u64).saturating_sub(4));
            assert!(
                at + Duration::from_millis(1) >= due && at < due + Duration::from_millis(5),
                "request {i} went at {at:?}, due {due:?}"
            );
        }
        // A waiter given up gives its token back: the next request waits no longer than if it had never asked.
        tokio::time::sleep(Duration::from_secs(60)).await;
        for _ in 0..5 {
            assert_eq!(bucket.reserve(), Duration::ZERO);
        }
        let given_up = tokio::time::timeout(Duration::from_millis(10), bucket.acquire()).await;
        assert!(given_up.is_err(), "it had to wait");
        let next = bucket.reserve();
        assert!(
            next <= Duration::from_millis(95),
            "waits {next:?}: the abandoned token was not given back"
        );
        // Idle, the bucket fills up to its burst again, not beyond.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let waits: Vec<Duration> = (0..7).map(|_| bucket.reserve()).collect();
        assert_eq!(&waits[..5], &[Duration::ZERO; 5]);
        assert!(
            waits[5] > Duration::ZERO && waits[6] > waits[5],
            "{waits:?}"
        );
    }
}
