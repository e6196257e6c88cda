//! Which task types this dispatcher polls.
//!
//! The reference system's dispatchers all scanned every due row, and the lock contention
//! pushed MySQL's CPU up; its fix was to split task types among dispatchers by consistent
//! hashing. We use rendezvous (highest-random-weight) hashing over the live dispatcher
//! set: each type goes to the member with the highest `hash(type, member)`, so a member
//! joining or leaving moves only the types it wins or held.
//!
//! While membership changes, a dispatcher keeps polling what it owned under the previous
//! view for a grace period as well, so no type goes unpolled while the others catch up.
//! Overlap is harmless: `SKIP LOCKED` claims never hand one row to two dispatchers.
//!
//! Members are named `<scope>/<instance>`: a dispatcher started with `--job NAME` has
//! scope `NAME` and is only eligible for that job's task type; one without has scope `*`
//! and is eligible for every type. So a job's type is never handed to a dispatcher that
//! does not route it.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// The rendezvous weight of `member` for `task_type`: stable across processes, builds
/// and platforms, since every dispatcher must compute the same answer.
fn weight(task_type: &str, member: &str) -> u64 {
    let mut hash = Sha256::new();
    hash.update(task_type.as_bytes());
    hash.update([0]);
    hash.update(member.as_bytes());
    u64::from_be_bytes(hash.finalize()[..8].try_into().expect("8 bytes"))
}

/// A member name: `<scope>/<instance>`.
pub fn member_name(scope: Option<&str>, instance: &str) -> String {
    format!("{}/{instance}", scope.unwrap_or("*"))
}

/// The instance a member name names: what its claims carry as their `owner`.
pub fn instance_of(member: &str) -> &str {
    member
        .split_once('/')
        .map_or(member, |(_, instance)| instance)
}

fn eligible(member: &str, job: &str) -> bool {
    match member.split_once('/') {
        Some(("*", _)) | None => true,
        Some((scope, _)) => scope == job,
    }
}

/// The member that owns `task_type` (of job `job`), if any member is eligible.
pub fn owner<'a>(task_type: &str, job: &str, members: &'a BTreeSet<String>) -> Option<&'a str> {
    members
        .iter()
        .filter(|m| eligible(m, job))
        .max_by_key(|m| (weight(task_type, m), m.as_str()))
        .map(String::as_str)
}

/// Tracks membership views and answers which types to poll.
#[derive(Debug)]
pub struct Ownership {
    me: String,
    grace: Duration,
    current: BTreeSet<String>,
    previous: Option<(BTreeSet<String>, Instant)>,
}

impl Ownership {
    pub fn new(me: impl Into<String>, grace: Duration) -> Self {
        let me = me.into();
        Self {
            current: BTreeSet::from([me.clone()]),
            me,
            grace,
            previous: None,
        }
    }

    /// Records the live members seen now (this dispatcher is always one of them).
    pub fn observe(&mut self, mut members: BTreeSet<String>, now: Instant) {
        members.insert(self.me.clone());
        if members != self.current {
            tracing::info!(members = ?members, "dispatcher membership changed");
            let old = std::mem::replace(&mut self.current, members);
            self.previous = Some((old, now));
        }
    }

    pub fn members(&self) -> &BTreeSet<String> {
        &self.current
    }

    /// The types this dispatcher polls now, out of `(task type, job name)` pairs.
    pub fn owned(&self, types: &[(String, String)], now: Instant) -> Vec<String> {
        let previous = self
            .previous
            .as_ref()
            .filter(|(_, since)| now.duration_since(*since) < self.grace)
            .map(|(members, _)| members);
        types
            .iter()
            .filter(|(t, job)| {
                owner(t, job, &self.current) == Some(&self.me)
                    || previous.is_some_and(|p| owner(t, job, p) == Some(&self.me))
            })
            .map(|(t, _)| t.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn types(n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|i| (format!("type-{i}"), format!("job-{i}")))
            .collect()
    }

    #[test]
    fn every_type_has_exactly_one_owner_and_the_split_is_fair() {
        let members = set(&["*/a", "*/b", "*/c"]);
        let types = types(300);
        let mut counts = std::collections::HashMap::new();
        for (t, job) in &types {
            *counts.entry(owner(t, job, &members).unwrap()).or_insert(0) += 1;
        }
        assert_eq!(counts.values().sum::<i32>(), 300);
        for (m, n) in counts {
            assert!((60..=140).contains(&n), "{m} owns {n} of 300");
        }
    }

    #[test]
    fn a_leaving_member_moves_only_its_own_types() {
        let before = set(&["*/a", "*/b", "*/c"]);
        let after = set(&["*/a", "*/b"]);
        for (t, job) in types(200) {
            let old = owner(&t, &job, &before).unwrap();
            if old != "*/c" {
                assert_eq!(
                    owner(&t, &job, &after).unwrap(),
                    old,
                    "{t} moved needlessly"
                );
            }
        }
    }

    #[test]
    fn during_a_change_the_old_owner_keeps_polling_for_the_grace_period() {
        let start = Instant::now();
        let grace = Duration::from_secs(5);
        let all = types(100);
        let mut a = Ownership::new("*/a", grace);
        a.observe(set(&["*/a"]), start);
        assert_eq!(
            a.owned(&all, start).len(),
            100,
            "alone, it polls everything"
        );

        a.observe(set(&["*/a", "*/b"]), start);
        let mut b = Ownership::new("*/b", grace);
        b.observe(set(&["*/a", "*/b"]), start);
        let during = a.owned(&all, start + Duration::from_secs(1));
        assert_eq!(
            during.len(),
            100,
            "a still polls b's new types during the grace"
        );
        let after_a = a.owned(&all, start + Duration::from_secs(6));
        let after_b = b.owned(&all, start + Duration::from_secs(6));
        assert_eq!(
            after_a.len() + after_b.len(),
            100,
            "then they split without overlap"
        );
        assert!(!after_a.is_empty() && !after_b.is_empty());
    }

    #[test]
    fn a_job_scoped_dispatcher_only_gets_its_own_job() {
        let members = set(&["orders/x", "emails/y", "emails/z"]);
        for i in 0..50 {
            let t = format!("t{i}");
            assert_eq!(owner(&t, "orders", &members), Some("orders/x"));
            assert!(
                owner(&t, "emails", &members)
                    .unwrap()
                    .starts_with("emails/")
            );
            assert_eq!(
                owner(&t, "reports", &members),
                None,
                "no dispatcher routes it"
            );
        }
        let with_general = set(&["orders/x", "*/g"]);
        assert_eq!(owner("r", "reports", &with_general), Some("*/g"));
    }
}
