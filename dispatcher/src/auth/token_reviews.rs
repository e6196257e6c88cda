//! What a bearer token costs the API server under `--auth kubernetes`: at most one
//! TokenReview per token per TTL, whoever sends it and however many at once.
//!
//! - Accepted and refused tokens are cached apart ([`TtlCache`]), each bounded: a flood of
//!   bogus tokens fills only the refused cache and never evicts a valid user.
//! - Concurrent requests with the same uncached token share one review (single flight).
//! - A review that has to be made is paid for from its source address's token bucket
//!   ([`SourceLimiter`]); an empty bucket is a 429 without a review.
//!
//! Pure logic with an injected clock; [`super::kubernetes`] supplies the review.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use super::AuthError;

/// How long an accepted token is trusted without asking again: a deleted ServiceAccount
/// or an expired token is refused within this.
pub const POSITIVE_TTL: Duration = Duration::from_secs(10);
/// How long a refused token is remembered: short, since a token the API server did not
/// know yet may become valid, but enough that a client retrying in a loop costs one
/// review per period.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(2);
/// Accepted tokens kept. Only tokens the API server accepted get in, so this is the
/// number of distinct valid callers seen within [`POSITIVE_TTL`]; past it the entry
/// closest to expiry goes, and costs one review the next time.
const MAX_ACCEPTED: usize = 4096;
/// Refused tokens kept. Whatever a flood sends lands here; at the bound the entry closest
/// to expiry goes, which costs one review only if that token comes back, and the rate
/// limit caps those reviews.
const MAX_REFUSED: usize = 4096;
/// Reviews a source may start at once, and per second after that: a client starting up
/// with a few new tokens is never held back, a flood of distinct tokens is.
const BURST: f64 = 20.0;
const PER_SECOND: f64 = 5.0;
/// Sources with a bucket. Each one is a few bytes; past the bound, buckets that have
/// refilled (sources idle for a few seconds, no different from new ones) are dropped,
/// and if none has, new sources share one overflow bucket rather than grow the map.
const MAX_SOURCES: usize = 16_384;

/// What the caller reads the time from: [`Instant::now`] in production.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// A map whose entries expire, holding at most `capacity` of them.
pub struct TtlCache<K, V> {
    entries: HashMap<K, (V, Instant)>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            capacity,
        }
    }

    pub fn get<Q>(&self, key: &Q, now: Instant) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        let (value, until) = self.entries.get(key)?;
        (now < *until).then(|| value.clone())
    }

    /// Keeps `value` until `now + ttl`. When full: expired entries go, and if none has
    /// expired, the one closest to it.
    pub fn put(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= self.capacity {
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(key, _)| key.clone());
                if let Some(soonest) = soonest {
                    self.entries.remove(&soonest);
                }
            }
        }
        self.entries.insert(key, (value, now + ttl));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(now: Instant) -> Self {
        Self {
            tokens: BURST,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * PER_SECOND).min(BURST);
        self.at = now;
    }

    /// Takes one token, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / PER_SECOND))
    }
}

/// A token bucket per source address. IPv6 sources are counted per /64, the block one
/// host usually holds whole, so cycling through its addresses gains nothing.
pub struct SourceLimiter {
    buckets: HashMap<IpAddr, Bucket>,
    overflow: Bucket,
    capacity: usize,
}

impl SourceLimiter {
    pub fn new(capacity: usize, now: Instant) -> Self {
        Self {
            buckets: HashMap::new(),
            overflow: Bucket::full(now),
            capacity,
        }
    }

    /// Pays for one review from `source`'s bucket, or says how long until it may.
    pub fn take(&mut self, source: IpAddr, now: Instant) -> Result<(), Duration> {
        let key = match source {
            IpAddr::V4(_) => source,
            IpAddr::V6(v6) => {
                let mask = !0u128 << 64;
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        };
        if !self.buckets.contains_key(&key) && self.buckets.len() >= self.capacity {
            self.buckets.retain(|_, bucket| {
                bucket.refill(now);
                bucket.tokens < BURST
            });
        }
        if let Some(bucket) = self.buckets.get_mut(&key) {
            return bucket.take(now);
        }
        if self.buckets.len() >= self.capacity {
            return self.overflow.take(now);
        }
        self.buckets
            .entry(key)
            .or_insert_with(|| Bucket::full(now))
            .take(now)
    }
}

type Answer<U> = Result<Option<U>, AuthError>;
type Review<U> = Shared<BoxFuture<'static, Answer<U>>>;

struct State<U> {
    accepted: TtlCache<String, U>,
    refused: TtlCache<String, ()>,
    /// The reviews under way, by token hash. Each is removed by the review itself when it
    /// ends, and reviews start only within the sources' rate limits, so this holds at
    /// most what those allow at once.
    in_flight: HashMap<String, Review<U>>,
    limiter: SourceLimiter,
}

/// The token cache, the reviews under way and the rate limits of one API process.
pub struct TokenReviews<U> {
    state: Arc<Mutex<State<U>>>,
    clock: Clock,
}

impl<U: Clone + Send + Sync + 'static> TokenReviews<U> {
    pub fn new(clock: Clock) -> Self {
        let now = clock();
        Self {
            state: Arc::new(Mutex::new(State {
                accepted: TtlCache::new(MAX_ACCEPTED),
                refused: TtlCache::new(MAX_REFUSED),
                in_flight: HashMap::new(),
                limiter: SourceLimiter::new(MAX_SOURCES, now),
            })),
            clock,
        }
    }

    /// The user the token (`key`: its hash) belongs to, `None` if refused: from the
    /// cache, from a review under way, or from `review`, which runs to its end (and
    /// fills the cache) even if every request waiting for it goes away. `source` is the
    /// peer's address; `None` (no address known) is not rate-limited.
    pub async fn user<F>(&self, key: &str, source: Option<IpAddr>, review: F) -> Answer<U>
    where
        F: Future<Output = Answer<U>> + Send + 'static,
    {
        let shared = {
            let mut state = self.state.lock().expect("token reviews lock");
            let now = (self.clock)();
            if let Some(user) = state.accepted.get(key, now) {
                return Ok(Some(user));
            }
            if state.refused.get(key, now).is_some() {
                return Ok(None);
            }
            match state.in_flight.get(key) {
                Some(under_way) => under_way.clone(),
                None => {
                    if let Some(source) = source {
                        state
                            .limiter
                            .take(source, now)
                            .map_err(|_| AuthError::RateLimited(source))?;
                    }
                    let shared = self.record(key.to_string(), review).shared();
                    state.in_flight.insert(key.to_string(), shared.clone());
                    // Driven by a task of its own, so that it ends and leaves `in_flight`
                    // even when every waiting request is dropped.
                    tokio::spawn(shared.clone());
                    shared
                }
            }
        };
        shared.await
    }

    /// `review`, then its answer cached (an error is not: the next request asks again)
    /// and the review no longer under way.
    fn record<F>(&self, key: String, review: F) -> BoxFuture<'static, Answer<U>>
    where
        F: Future<Output = Answer<U>> + Send + 'static,
    {
        let state = self.state.clone();
        let clock = self.clock.clone();
        async move {
            let answer = review.await;
            let mut state = state.lock().expect("token reviews lock");
            let now = clock();
            match &answer {
                Ok(Some(user)) => state
                    .accepted
                    .put(key.clone(), user.clone(), POSITIVE_TTL, now),
                Ok(None) => state.refused.put(key.clone(), (), NEGATIVE_TTL, now),
                Err(_) => {}
            }
            state.in_flight.remove(&key);
            answer
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A clock the test moves by hand.
    fn manual_clock() -> (Clock, Arc<Mutex<Instant>>) {
        let now = Arc::new(Mutex::new(Instant::now()));
        let read = now.clone();
        (Arc::new(move || *read.lock().unwrap()), now)
    }

    fn advance(now: &Mutex<Instant>, by: Duration) {
        *now.lock().unwrap() += by;
    }

    #[test]
    fn the_cache_expires_and_evicts_the_entry_closest_to_expiry() {
        let t0 = Instant::now();
        let mut cache: TtlCache<u32, &str> = TtlCache::new(2);
        cache.put(1, "long", Duration::from_secs(60), t0);
        cache.put(2, "short", Duration::from_secs(5), t0);
        assert_eq!(cache.get(&2, t0 + Duration::from_secs(4)), Some("short"));
        assert_eq!(cache.get(&2, t0 + Duration::from_secs(5)), None, "expired");
        cache.put(3, "new", Duration::from_secs(60), t0);
        assert_eq!(cache.len(), 2);
        assert_eq!(
            cache.get(&1, t0),
            Some("long"),
            "the longer-lived one stays"
        );
        assert_eq!(cache.get(&2, t0), None, "the one closest to expiry went");
        // When full, every expired entry goes at once.
        let mut cache: TtlCache<u32, ()> = TtlCache::new(3);
        cache.put(1, (), Duration::from_secs(1), t0);
        cache.put(2, (), Duration::from_secs(1), t0);
        cache.put(3, (), Duration::from_secs(60), t0);
        cache.put(4, (), Duration::from_secs(60), t0 + Duration::from_secs(2));
        assert_eq!(cache.len(), 2);
        assert!(cache.get(&3, t0).is_some() && cache.get(&4, t0).is_some());
    }

    #[test]
    fn a_source_gets_its_burst_then_its_rate_and_sources_are_apart() {
        let t0 = Instant::now();
        let mut limiter = SourceLimiter::new(16, t0);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..BURST as usize {
            limiter.take(a, t0).unwrap();
        }
        let wait = limiter.take(a, t0).unwrap_err();
        assert!(
            wait <= Duration::from_secs_f64(1.0 / PER_SECOND),
            "{wait:?}"
        );
        limiter
            .take(b, t0)
            .expect("another source has its own bucket");
        limiter
            .take(a, t0 + Duration::from_secs_f64(1.0 / PER_SECOND))
            .expect("refilled at the rate");
        // One IPv6 /64 is one source.
        let v6 = |last: &str| format!("2001:db8:1:2::{last}").parse::<IpAddr>().unwrap();
        for i in 0..BURST as usize {
            limiter.take(v6(&format!("{:x}", i + 1)), t0).unwrap();
        }
        assert!(limiter.take(v6("ffff"), t0).is_err());
    }

    #[test]
    fn past_its_bound_the_limiter_drops_idle_buckets_then_shares_an_overflow_bucket() {
        let t0 = Instant::now();
        let mut limiter = SourceLimiter::new(2, t0);
        let ip = |i: u8| IpAddr::from([10, 0, 0, i]);
        limiter.take(ip(1), t0).unwrap();
        limiter.take(ip(2), t0).unwrap();
        // Both partly used: new sources share the overflow bucket, which runs dry.
        for i in 0..BURST as u8 {
            limiter.take(ip(10 + i), t0).unwrap();
        }
        assert!(
            limiter.take(ip(99), t0).is_err(),
            "overflow bucket is empty"
        );
        assert_eq!(limiter.buckets.len(), 2, "the map did not grow");
        // Once the first two have refilled they are dropped and a new source gets its own.
        let later = t0 + Duration::from_secs(10);
        limiter.take(ip(99), later).unwrap();
        assert!(limiter.buckets.contains_key(&ip(99)));
    }

    /// A reviewer that counts its calls and answers when the test lets it.
    struct FakeReviewer {
        calls: Arc<AtomicUsize>,
        release: Arc<tokio::sync::Semaphore>,
    }

    impl FakeReviewer {
        fn new() -> Self {
            Self {
                calls: Arc::new(AtomicUsize::new(0)),
                release: Arc::new(tokio::sync::Semaphore::new(0)),
            }
        }

        fn review(&self, answer: Option<&'static str>) -> BoxFuture<'static, Answer<&'static str>> {
            let calls = self.calls.clone();
            let release = self.release.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                release.acquire().await.unwrap().forget();
                Ok(answer)
            }
            .boxed()
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn concurrent_requests_with_one_token_share_one_review_and_then_the_cache() {
        let (clock, now) = manual_clock();
        let reviews = Arc::new(TokenReviews::new(clock));
        let reviewer = FakeReviewer::new();
        let source = Some("10.0.0.1".parse().unwrap());
        let mut waiting = Vec::new();
        for _ in 0..10 {
            let reviews = reviews.clone();
            let review = reviewer.review(Some("alice"));
            waiting.push(tokio::spawn(async move {
                reviews.user("hash-a", source, review).await
            }));
        }
        tokio::time::timeout(Duration::from_secs(5), async {
            while reviewer.calls() == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        reviewer.release.add_permits(10);
        for waiter in waiting {
            assert_eq!(waiter.await.unwrap(), Ok(Some("alice")));
        }
        assert_eq!(reviewer.calls(), 1, "one review for ten requests");
        assert!(reviews.state.lock().unwrap().in_flight.is_empty());

        let cached = reviews.user("hash-a", source, reviewer.review(Some("x")));
        assert_eq!(cached.await, Ok(Some("alice")));
        assert_eq!(reviewer.calls(), 1, "cached");
        advance(&now, POSITIVE_TTL);
        let again = reviews.user("hash-a", source, reviewer.review(Some("alice")));
        assert_eq!(again.await, Ok(Some("alice")));
        assert_eq!(reviewer.calls(), 2, "asked again after the TTL");
    }

    #[tokio::test]
    async fn a_flood_of_bogus_tokens_neither_evicts_valid_users_nor_passes_the_rate_limit() {
        let (clock, now) = manual_clock();
        let reviews = TokenReviews::new(clock);
        let reviewer = FakeReviewer::new();
        reviewer.release.add_permits(usize::MAX >> 4);
        let user = "10.0.0.1".parse().ok();
        assert_eq!(
            reviews
                .user("valid", user, reviewer.review(Some("alice")))
                .await,
            Ok(Some("alice"))
        );
        // Many attackers, each within its own rate, together far past both bounds.
        let mut reviewed = 0;
        let mut limited = 0;
        for i in 0..(MAX_REFUSED * 2) as u32 {
            let attacker = Some(IpAddr::from((0x0b00_0000 + i / 25).to_be_bytes()));
            match reviews
                .user(&format!("bogus-{i}"), attacker, reviewer.review(None))
                .await
            {
                Ok(None) => reviewed += 1,
                Err(AuthError::RateLimited(_)) => limited += 1,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            limited,
            (MAX_REFUSED * 2 / 25) * 5,
            "5 of each 25 over the burst"
        );
        assert_eq!(reviewer.calls(), 1 + reviewed);
        {
            let state = reviews.state.lock().unwrap();
            assert!(state.refused.len() <= MAX_REFUSED);
        }
        let calls = reviewer.calls();
        advance(&now, Duration::from_secs(1));
        assert_eq!(
            reviews
                .user("valid", user, reviewer.review(Some("x")))
                .await,
            Ok(Some("alice")),
            "the valid user is still cached"
        );
        assert_eq!(reviewer.calls(), calls, "without a review");
        // A refused token is remembered apart, for its own TTL.
        let bogus = "10.9.9.9".parse().ok();
        assert_eq!(
            reviews.user("again", bogus, reviewer.review(None)).await,
            Ok(None)
        );
        assert_eq!(
            reviews
                .user("again", bogus, reviewer.review(Some("x")))
                .await,
            Ok(None)
        );
        assert_eq!(reviewer.calls(), calls + 1);
    }

    #[tokio::test]
    async fn a_failed_review_is_not_cached() {
        let (clock, _) = manual_clock();
        let reviews = TokenReviews::<&'static str>::new(clock);
        let failed = async { Err(AuthError::Unavailable("token review")) };
        assert_eq!(
            reviews.user("t", None, failed).await,
            Err(AuthError::Unavailable("token review"))
        );
        let ok = async { Ok(Some("alice")) };
        assert_eq!(reviews.user("t", None, ok).await, Ok(Some("alice")));
    }
}
