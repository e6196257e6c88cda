//! Verifying executor calls: the signature ([`asyncd_contract::verify_signature`], over
//! the canonical string of `docs/security.md`) and, on top of it, replays.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use asyncd_contract::{SIGNATURE_TOLERANCE, SignatureError, SignedCall, headers, verify_signature};
use axum::http::HeaderMap;

/// The (task, attempt) pairs a [`Verifier`] remembers. An entry is kept only until its
/// call's timestamp leaves the window (the call is refused as stale after that), so the
/// bound is reached only past about 160 verified calls per second sustained over a
/// window; each entry is some 100 bytes, so the cache stays near 10 MiB whatever callers
/// send. Past it the oldest entries are forgotten first.
pub const MAX_REPLAY_ENTRIES: usize = 100_000;

/// Why an executor call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error("bad signature: this task attempt was already delivered")]
    Replayed,
}

/// Checks executor calls against one or two keys (two while a key is rotated) and
/// refuses a second call for the same (task, attempt) within [`SIGNATURE_TOLERANCE`],
/// so a captured call never runs twice in this process.
#[derive(Debug)]
pub struct Verifier {
    keys: Vec<Vec<u8>>,
    max_entries: usize,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// `"<task id>\n<attempt>\n<lease token>"` → the unix second it may be forgotten.
    until: HashMap<String, i64>,
    /// Insertion order, oldest first.
    order: VecDeque<(String, i64)>,
}

impl Seen {
    /// Drops `entry` unless its key was recorded again since.
    fn forget(&mut self, (key, until): (String, i64)) {
        if self.until.get(&key) == Some(&until) {
            self.until.remove(&key);
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// The signed parts of a call: its headers as sent, and its body.
pub fn signed_call<'a>(headers: &'a HeaderMap, body: &'a [u8]) -> SignedCall<'a> {
    SignedCall {
        timestamp: header(headers, headers::TIMESTAMP),
        task_id: header(headers, headers::TASK_ID),
        attempt: header(headers, headers::ATTEMPT),
        idempotency_key: header(headers, headers::IDEMPOTENCY_KEY),
        lease_token: header(headers, headers::LEASE_TOKEN),
        callback_url: header(headers, headers::CALLBACK_URL),
        body,
    }
}

/// The signed parts of a batch call (`Asyncd-Batch`): a single call's, with the four
/// per-task values (task id, attempt, idempotency key, lease token) empty whatever the
/// request's headers hold, since each task carries them in the signed body.
pub fn signed_batch_call<'a>(headers: &'a HeaderMap, body: &'a [u8]) -> SignedCall<'a> {
    SignedCall {
        task_id: "",
        attempt: "",
        idempotency_key: "",
        lease_token: "",
        ..signed_call(headers, body)
    }
}

/// A batch call whose signature [`Verifier::verify_batch`] accepted; its tasks are
/// checked for replays one by one with [`VerifiedBatch::check_task`].
#[derive(Debug)]
pub struct VerifiedBatch<'v> {
    verifier: &'v Verifier,
    timestamp: i64,
    now: i64,
}

impl VerifiedBatch<'_> {
    /// Refuses (`VerifyError::Replayed`) a (task, attempt, lease token) already
    /// accepted within the window, in a single call or a batch, and otherwise records
    /// it, as [`Verifier::verify`] does for a single call.
    pub fn check_task(
        &self,
        task_id: &str,
        attempt: u32,
        lease_token: &str,
    ) -> Result<(), VerifyError> {
        self.verifier.record(
            replay_key(task_id, &attempt.to_string(), lease_token),
            self.timestamp,
            self.now,
        )
    }
}

/// The replay cache's key: the lease token too, since a redriven task starts again at
/// attempt 1, with a new token.
fn replay_key(task_id: &str, attempt: &str, lease_token: &str) -> String {
    format!("{task_id}\n{attempt}\n{lease_token}")
}

impl Verifier {
    /// Accepts calls signed with any of `keys`; an empty key is never accepted, so with
    /// no other key every call is refused.
    pub fn new<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> Self {
        Self::with_capacity(keys, MAX_REPLAY_ENTRIES)
    }

    fn with_capacity<K: AsRef<[u8]>>(
        keys: impl IntoIterator<Item = K>,
        max_entries: usize,
    ) -> Self {
        Self {
            keys: keys.into_iter().map(|k| k.as_ref().to_vec()).collect(),
            max_entries,
            seen: Mutex::default(),
        }
    }

    /// Verifies a call at `now` and records its (task, attempt). Only a verified call is
    /// recorded: forged calls can neither fill the cache nor block the real one.
    pub fn verify(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), VerifyError> {
        let call = signed_call(headers, body);
        let (timestamp, now) = self.check_signature(headers, &call, now)?;
        self.record(
            replay_key(call.task_id, call.attempt, call.lease_token),
            timestamp,
            now,
        )
    }

    /// Verifies a batch call's signature at `now`, over [`signed_batch_call`]. Nothing
    /// is recorded yet: replays are refused per task, with
    /// [`VerifiedBatch::check_task`] on each task of the body.
    pub fn verify_batch(
        &self,
        headers: &HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<VerifiedBatch<'_>, VerifyError> {
        let (timestamp, now) =
            self.check_signature(headers, &signed_batch_call(headers, body), now)?;
        Ok(VerifiedBatch {
            verifier: self,
            timestamp,
            now,
        })
    }

    /// Checks the signature and the timestamp; returns the call's timestamp and `now`,
    /// in unix seconds.
    fn check_signature(
        &self,
        headers: &HeaderMap,
        call: &SignedCall,
        now: SystemTime,
    ) -> Result<(i64, i64), VerifyError> {
        let keys: Vec<&[u8]> = self.keys.iter().map(Vec::as_slice).collect();
        verify_signature(&keys, Some(header(headers, headers::SIGNATURE)), call, now)?;
        let ts: i64 = call.timestamp.trim().parse().unwrap_or_default();
        let now = now
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        Ok((ts, now))
    }

    /// Records a verified call's replay key until its timestamp `ts` leaves the window,
    /// or refuses it when it is already recorded.
    fn record(&self, key: String, ts: i64, now: i64) -> Result<(), VerifyError> {
        let mut seen = self.seen.lock().expect("replay cache lock");
        while let Some((_, until)) = seen.order.front() {
            if *until >= now {
                break;
            }
            let entry = seen.order.pop_front().expect("a front entry");
            seen.forget(entry);
        }
        if seen.until.get(&key).is_some_and(|until| *until >= now) {
            return Err(VerifyError::Replayed);
        }
        while seen.order.len() >= self.max_entries {
            let entry = seen.order.pop_front().expect("a full cache has entries");
            seen.forget(entry);
        }
        let until = ts + SIGNATURE_TOLERANCE.as_secs() as i64;
        seen.until.insert(key.clone(), until);
        seen.order.push_back((key, until));
        Ok(())
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.seen.lock().unwrap().until.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn signed(key: &[u8], id: &str, ts: i64) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(headers::TIMESTAMP, ts.to_string().parse().unwrap());
        h.insert(headers::TASK_ID, id.parse().unwrap());
        h.insert(headers::ATTEMPT, "1".parse().unwrap());
        let sig = asyncd_contract::sign(&[key], &signed_call(&h, b"")).unwrap();
        h.insert(headers::SIGNATURE, sig.parse().unwrap());
        h
    }

    #[test]
    fn the_replay_cache_is_bounded_and_forgets_expired_entries() {
        let verifier = Verifier::with_capacity([b"k"], 3);
        let t = 1_700_000_000;
        let at = |s: i64| UNIX_EPOCH + Duration::from_secs(s as u64);
        for id in ["a", "b", "c", "d"] {
            verifier.verify(&signed(b"k", id, t), b"", at(t)).unwrap();
        }
        assert_eq!(verifier.remembered(), 3);
        assert_eq!(
            verifier.verify(&signed(b"k", "d", t), b"", at(t)),
            Err(VerifyError::Replayed)
        );
        verifier
            .verify(&signed(b"k", "a", t), b"", at(t))
            .expect("the oldest was forgotten");
        verifier
            .verify(&signed(b"k", "e", t + 301), b"", at(t + 301))
            .unwrap();
        assert_eq!(verifier.remembered(), 1, "expired entries are dropped");
    }

    #[test]
    fn an_empty_key_accepts_nothing() {
        let verifier = Verifier::new([b""]);
        assert_eq!(
            verifier.verify(
                &signed(b"x", "a", 1_700_000_000),
                b"",
                UNIX_EPOCH + Duration::from_secs(1_700_000_000)
            ),
            Err(VerifyError::Signature(SignatureError::NoKey))
        );
    }
}
