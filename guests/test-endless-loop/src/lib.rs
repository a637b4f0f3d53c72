//! Misbehaves on purpose: every call spins forever, or with settings `{"mode": "sleep"}` sleeps for an
//! hour at a time, forever (the host's deadline must stop both: a spin in wasm code, a sleep in the
//! host's clock wait).

use plexus_sdk::{Decision, Error, Pod, Policy, Resolver, Selection, Status, StatusEntry, Value};
use serde::Deserialize;

#[derive(Deserialize)]
struct Settings {
    #[serde(default)]
    mode: Option<String>,
}

pub struct EndlessLoop;

fn spin() -> ! {
    let sleep = plexus_sdk::settings::<Settings>()
        .ok()
        .and_then(|s| s.mode)
        .is_some_and(|m| m == "sleep");
    let mut n: u64 = 0;
    loop {
        if sleep {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
        n = std::hint::black_box(n.wrapping_add(1));
    }
}

impl Policy for EndlessLoop {
    fn check(_pod: &Pod, _s: Vec<Selection>) -> Result<Decision, Error> {
        spin()
    }
}

impl Resolver for EndlessLoop {
    fn resolve(
        _: &Pod,
        _: &Selection,
        _: Option<&Value>,
        _: Option<&Value>,
    ) -> Result<Option<Value>, Error> {
        spin()
    }
}

impl Status for EndlessLoop {
    fn shape(_pod: &Pod, _e: Vec<StatusEntry>) -> Result<Vec<StatusEntry>, Error> {
        spin()
    }
}

plexus_sdk::export!(
    policy: EndlessLoop,
    resolver: EndlessLoop,
    status: EndlessLoop
);
