//! Pacing the bodies of routes with `[routes.rate_limit]`: each response at its own rate, after
//! a fast start, and within the rates its client's responses and its route's share.
//!
//! A rate is a schedule: sending `n` bytes reserves the next `n / rate` seconds of it, starting
//! no earlier than now (an idle response earns no burst), and a response waits for the latest
//! of the reservations its limits give it. Responses sharing a rate reserve turns in the order
//! they ask, so with steps of the same size each gets an equal share. Steps are 50 ms of the
//! slowest rate that applies, so no 100 ms carries more than twice it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::routes::RateLimit;

/// The smallest and largest step a paced body is written in.
const STEP_BYTES: std::ops::RangeInclusive<u64> = 1024..=256 * 1024;
/// A step lasts this much of the slowest rate.
const STEPS_PER_SECOND: u64 = 20;

/// A rate's schedule: where its reserved time ends.
#[derive(Debug, Clone, Copy)]
struct Schedule {
    per_second: u64,
    next: Instant,
}

impl Schedule {
    fn new(per_second: u64) -> Self {
        Self { per_second, next: Instant::now() }
    }

    /// When `bytes` may start, having reserved the time they take; never earlier than `now`, so
    /// an idle rate earns no burst.
    fn reserve(&mut self, bytes: u64, now: Instant) -> Instant {
        let start = self.next.max(now);
        self.next = start + Duration::from_secs_f64(bytes as f64 / self.per_second.max(1) as f64);
        start
    }
}

/// A rate several responses share: a client's on a route, or a route's.
#[derive(Debug)]
pub(crate) struct SharedRate {
    per_second: u64,
    schedule: Mutex<Schedule>,
}

impl SharedRate {
    fn new(per_second: u64) -> Self {
        Self { per_second, schedule: Mutex::new(Schedule::new(per_second)) }
    }

    fn reserve(&self, bytes: u64, now: Instant) -> Instant {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner).reserve(bytes, now)
    }
}

/// Whose a shared rate is: a route's (no client) or a client's on a route.
type RateOwner = (String, Option<IpAddr>);

/// The shared rates in use, by owner; a rate lives as long as a response uses it.
#[derive(Debug, Default)]
pub(crate) struct SharedRates(Mutex<HashMap<RateOwner, Weak<SharedRate>>>);

impl SharedRates {
    /// The rates a response of `route` to `client` shares under `limit`.
    pub(crate) fn of(
        &self,
        route: &str,
        client: Option<IpAddr>,
        limit: &RateLimit,
    ) -> Vec<Arc<SharedRate>> {
        let mut rates = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut take = |key: RateOwner, per_second: u64| {
            if let Some(rate) = rates.get(&key).and_then(Weak::upgrade)
                && rate.per_second == per_second
            {
                return rate;
            }
            let rate = Arc::new(SharedRate::new(per_second));
            rates.insert(key, Arc::downgrade(&rate));
            rate
        };
        let mut shared = Vec::new();
        if let Some(per_second) = limit.per_route {
            shared.push(take((route.to_owned(), None), per_second));
        }
        if let (Some(per_second), Some(ip)) = (limit.per_client, client) {
            shared.push(take((route.to_owned(), Some(ip)), per_second));
        }
        // Forget the rates no response uses any more.
        rates.retain(|_, rate| rate.strong_count() > 0);
        shared
    }
}

/// One response's pacing.
#[derive(Debug)]
pub(crate) struct Pacer {
    /// Bytes of the fast start still to go unshaped.
    unshaped: u64,
    /// Its own rate.
    own: Option<Schedule>,
    shared: Vec<Arc<SharedRate>>,
    step: usize,
    /// What the pacing cost: bytes shaped, time waited.
    pub(crate) shaped: u64,
    pub(crate) waited: Duration,
}

impl Pacer {
    /// The pacing of a response under `limit`, its own rate lowered to `origin_rate` when the
    /// origin asked for less; `None` when no rate applies to it.
    pub(crate) fn new(
        limit: &RateLimit,
        origin_rate: Option<u64>,
        shared: Vec<Arc<SharedRate>>,
    ) -> Option<Self> {
        let own = match (limit.rate, origin_rate) {
            (Some(route), Some(origin)) => Some(route.min(origin)),
            (rate, origin) => rate.or(origin),
        };
        let slowest = own.into_iter().chain(shared.iter().map(|s| s.per_second)).min()?;
        let step = (slowest / STEPS_PER_SECOND).clamp(*STEP_BYTES.start(), *STEP_BYTES.end());
        Some(Self {
            unshaped: limit.after,
            own: own.map(Schedule::new),
            shared,
            step: usize::try_from(step).unwrap_or(usize::MAX),
            shaped: 0,
            waited: Duration::ZERO,
        })
    }

    /// The most bytes to write at once.
    pub(crate) fn step(&self) -> usize {
        self.step
    }

    /// Waits until `bytes` may go out.
    pub(crate) async fn wait(&mut self, bytes: usize) {
        let mut bytes = bytes as u64;
        let fast = bytes.min(self.unshaped);
        self.unshaped -= fast;
        bytes -= fast;
        if bytes == 0 {
            return;
        }
        let now = Instant::now();
        let mut at = now;
        if let Some(own) = &mut self.own {
            at = at.max(own.reserve(bytes, now));
        }
        for shared in &self.shared {
            at = at.max(shared.reserve(bytes, now));
        }
        self.shaped += bytes;
        if at > now {
            self.waited += at - now;
            tokio::time::sleep_until(at).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(
        rate: Option<u64>,
        after: u64,
        per_client: Option<u64>,
        per_route: Option<u64>,
    ) -> RateLimit {
        RateLimit { rate, after, per_client, per_route, origin_header: None }
    }

    #[test]
    fn the_origin_lowers_a_rate_and_never_raises_it() {
        let route = limit(Some(1 << 20), 0, None, None);
        let lowered = Pacer::new(&route, Some(1 << 19), Vec::new()).expect("paced");
        assert_eq!(lowered.own.map(|s| s.per_second), Some(1 << 19));
        let raised = Pacer::new(&route, Some(1 << 22), Vec::new()).expect("paced");
        assert_eq!(raised.own.map(|s| s.per_second), Some(1 << 20));
        // A route that names only the header: the origin's rate is the one.
        let header_only = limit(None, 0, None, None);
        assert!(Pacer::new(&header_only, None, Vec::new()).is_none());
        assert_eq!(Pacer::new(&header_only, Some(4096), Vec::new()).map(|p| p.step), Some(1024));
        // 50 ms of the slowest rate, within bounds.
        assert_eq!(lowered.step, (1 << 19) / 20);
        assert_eq!(
            Pacer::new(&limit(Some(1 << 30), 0, None, None), None, Vec::new()).map(|p| p.step),
            Some(256 * 1024)
        );
    }

    #[test]
    fn shared_rates_are_shared_while_used() {
        let rates = SharedRates::default();
        let both = limit(None, 0, Some(1000), Some(5000));
        let ip = Some(IpAddr::from([192, 0, 2, 1]));
        let first = rates.of("/", ip, &both);
        let second = rates.of("/", ip, &both);
        assert_eq!(first.len(), 2);
        assert!(Arc::ptr_eq(&first[0], &second[0]) && Arc::ptr_eq(&first[1], &second[1]));
        let other = rates.of("/", Some(IpAddr::from([192, 0, 2, 2])), &both);
        assert!(Arc::ptr_eq(&first[0], &other[0]), "the route's rate");
        assert!(!Arc::ptr_eq(&first[1], &other[1]), "each client's own");
        drop((first, second, other));
        let _ = rates.of("/x/", None, &limit(None, 0, None, Some(1)));
        assert_eq!(rates.0.lock().expect("lock").len(), 1, "unused rates forgotten");
    }

    #[test]
    fn reservations_take_turns() {
        let shared = SharedRate::new(1000);
        let now = Instant::now();
        // Two responses asking in turn for 100 bytes each at 1000 B/s: 100 ms apart.
        let times: Vec<_> = (0..4).map(|_| shared.reserve(100, now)).collect();
        let gaps: Vec<_> = times.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|gap| *gap == Duration::from_millis(100)), "{gaps:?}");
        assert_eq!(times[0], now, "an idle rate starts now");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_start_then_the_rate() {
        let mut pacer =
            Pacer::new(&limit(Some(1000), 500, None, None), None, Vec::new()).expect("paced");
        let start = tokio::time::Instant::now();
        pacer.wait(500).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "the fast start");
        for _ in 0..10 {
            pacer.wait(100).await;
        }
        // 1000 bytes at 1000 B/s: the first step at once, the tenth after 900 ms.
        assert_eq!(start.elapsed(), Duration::from_millis(900));
        assert_eq!(pacer.shaped, 1000);
    }
}
