//! Misbehaves on purpose: every call spins forever (the host's epoch deadline must stop it).

use plexus_sdk::{Decision, Error, Pod, Policy, Resolver, Selection, Status, StatusEntry, Value};

pub struct EndlessLoop;

fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
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

plexus_sdk::export!(policy: EndlessLoop, resolver: EndlessLoop, status: EndlessLoop);
