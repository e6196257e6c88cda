//! The accounting: executor calls and submit answers in, the verdict out.

use super::*;

/// What the soak knows about one task.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// The task id, once a submit of it got a 2xx.
    pub id: Option<String>,
    /// How that 2xx came: status, route, which API process, when, and on which try.
    pub answer: Option<String>,
    pub calls: u32,
    /// Executions the executor completed successfully.
    pub successes: u32,
    /// Each success the executor completed, so a duplicate can be set against the kill
    /// of the dispatcher that made the call (`kills.log`).
    pub success_at: Vec<Success>,
    pub early: u32,
    /// The final state read back from the API (`succeeded`, `dead`, `cancelled`).
    pub end: Option<String>,
    /// The last state read back while the task was not final (`not found`: a 404).
    pub last: Option<String>,
    /// Why its last failed attempt failed, as read back once final (asyncd keeps it
    /// after a later success): shows what the socket faults and DNS outages did.
    pub last_error: Option<String>,
}

/// One execution the executor completed successfully.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Success {
    /// When (ms).
    pub at: i64,
    pub attempt: u32,
    pub lease_token: String,
    /// The pid of the dispatcher process that made the call, read from the instance name
    /// it sends in `Asyncd-Dispatcher` ([`caller_pid`]).
    pub caller: Option<u32>,
}

/// The pid in a dispatcher's instance name, `{instance}-{pid}-{random hex}` (the name
/// `asyncd dispatcher` gives itself and sends in `Asyncd-Dispatcher` with each call).
pub fn caller_pid(instance_name: &str) -> Option<u32> {
    instance_name.rsplit('-').nth(1)?.parse().ok()
}

/// The accounting: executor calls and submit answers in, the verdict out.
pub struct Ledger {
    pub seed: u64,
    pub records: Vec<Record>,
    /// The first few early calls, for the report.
    pub early_samples: Vec<String>,
}

#[derive(Debug, Default, PartialEq)]
pub struct Verdict {
    pub accepted: usize,
    pub lost: usize,
    /// Lost tasks whose id answers 404 although their work ran: the submit's 2xx named an
    /// id that never reached the store (the work ran under another submit's id).
    pub lost_unknown_id: usize,
    pub early: usize,
    pub duplicates: usize,
    /// Duplicates by the task's behaviour code, to tell which path re-ran work.
    pub duplicates_by_behaviour: std::collections::BTreeMap<String, usize>,
    /// Duplicates by tenth of the run in submit order (tenth k holds tasks k·N/10..), to
    /// tell steady kills from the database and broker restarts (at a third, two thirds).
    pub duplicates_by_tenth: [usize; 10],
    /// Duplicates set against a dispatcher SIGKILL ([`Timeline::kill_behind`]): the
    /// earlier success was answered, but its outcome not yet written, when its dispatcher
    /// was killed.
    pub after_kills: usize,
    /// The most duplicates one dispatcher kill was set against.
    pub most_per_kill: usize,
    /// Duplicates no kill explains: a re-run some other path caused.
    pub unexplained: usize,
    pub wrong: usize,
    /// Tasks that ended succeeded although no execution of theirs answered so whole:
    /// asyncd took an answer that never arrived complete (hung, trickled, cut after its
    /// headers) for a success.
    pub unearned: usize,
    /// Tasks whose submit never got a 2xx but which ran anyway (allowed: the answer was lost).
    pub ran_unconfirmed: usize,
    pub calls: u64,
    pub successes: u64,
}

impl Verdict {
    pub fn duplicates_pct(&self) -> f64 {
        self.pct(self.duplicates)
    }

    pub fn unexplained_pct(&self) -> f64 {
        self.pct(self.unexplained)
    }

    fn pct(&self, n: usize) -> f64 {
        if self.accepted == 0 {
            0.0
        } else {
            n as f64 * 100.0 / self.accepted as f64
        }
    }
}

/// How long the store may have been reachable between an attempt's success and the
/// SIGKILL of the dispatcher that made the call for the re-run that follows to be set
/// against that kill: the attempt's lease, the executor's timeout plus the 5 s grace
/// asyncd adds to it. A dispatcher holds an attempt's
/// concurrency slot until its outcome is written, so what a kill re-runs is what it had
/// begun and not yet recorded: the attempts still calling their executor (whose answer
/// may come after the kill), and the outcomes answered but waiting for their write.
/// Within its lease, an outcome not yet written is the dispatcher's to write; past it,
/// the rescuer retries the attempt whether or not the dispatcher lives, which is not a
/// kill's doing. Time the store was out of reach (a black hole, a slow link, the
/// database's restart) is not counted: outcomes wait for as long as that lasts.
pub const KILL_WINDOW_MS: i64 = EXECUTOR_TIMEOUT.as_millis() as i64 + 5_000;

/// A dispatcher's SIGKILL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kill {
    /// When (ms).
    pub at: i64,
    /// The process killed.
    pub pid: u32,
}

/// When dispatchers were killed and the store was out of reach, to set duplicates against.
#[derive(Debug, Default, Clone)]
pub struct Timeline {
    pub dispatcher_kills: Vec<Kill>,
    /// Spans (ms) in which the store link was faulted or the database down; they may
    /// overlap.
    pub store_out: Vec<(i64, i64)>,
}

impl Timeline {
    /// The dispatcher kill a re-run of `success` is set against: the SIGKILL of the
    /// process that made the successful call, if the store was reachable for at most
    /// [`KILL_WINDOW_MS`] from the success to it. A kill before the success counts: the
    /// call was in flight, and the executor answered a caller already gone.
    pub fn kill_behind(&self, success: &Success) -> Option<i64> {
        let caller = success.caller?;
        let kill = self
            .dispatcher_kills
            .iter()
            .find(|kill| kill.pid == caller)?
            .at;
        let answered = success.at;
        (kill - answered - self.out_between(answered, kill) <= KILL_WINDOW_MS).then_some(kill)
    }

    /// How long the store was out of reach between `from` and `to`, overlaps counted once.
    fn out_between(&self, from: i64, to: i64) -> i64 {
        let mut spans: Vec<(i64, i64)> = self
            .store_out
            .iter()
            .map(|&(b, e)| (b.max(from), e.min(to)))
            .filter(|(b, e)| b < e)
            .collect();
        spans.sort_unstable();
        let (mut total, mut reached) = (0, from);
        for (b, e) in spans {
            let b = b.max(reached);
            if e > b {
                total += e - b;
                reached = e;
            }
        }
        total
    }
}

impl Ledger {
    pub fn new(seed: u64, n: usize) -> Self {
        Self {
            seed,
            records: vec![Record::default(); n],
            early_samples: Vec::new(),
        }
    }

    /// One executor call of task `index` at `arrival_ms`. It is early when it comes before
    /// the ETA the soak asked for or the one asyncd sent with the call (a retry's), with 1 ms
    /// allowed for rounding to whole milliseconds.
    pub fn note_call(&mut self, index: usize, id: &str, arrival_ms: i64, etas_ms: &[i64]) {
        let Some(record) = self.records.get_mut(index) else {
            return;
        };
        record.calls += 1;
        if let Some(eta) = etas_ms.iter().copied().max()
            && arrival_ms + 1 < eta
        {
            record.early += 1;
            if self.early_samples.len() < 10 {
                self.early_samples.push(format!(
                    "task {index} ({id}): called at {arrival_ms}, {} ms before its ETA {eta}",
                    eta - arrival_ms
                ));
            }
        }
    }

    /// A success of task `index`'s attempt, called by dispatcher process `caller`.
    pub fn note_success(
        &mut self,
        index: usize,
        attempt: u32,
        lease_token: &str,
        caller: Option<u32>,
    ) {
        if let Some(record) = self.records.get_mut(index) {
            record.successes += 1;
            record.success_at.push(Success {
                at: now_ms(),
                attempt,
                lease_token: lease_token.to_string(),
                caller,
            });
        }
    }

    /// The verdict, each duplicate set against a dispatcher kill in `timeline` or counted
    /// as unexplained.
    pub fn verdict(&self, timeline: &Timeline) -> Verdict {
        let mut v = Verdict::default();
        let mut per_kill: BTreeMap<i64, usize> = BTreeMap::new();
        for (index, r) in self.records.iter().enumerate() {
            let mut answered: Vec<&Success> = r.success_at.iter().collect();
            answered.sort_unstable_by_key(|success| success.at);
            // Each success after the first re-ran the work of the one before it.
            for pair in answered.windows(2) {
                match timeline
                    .kill_behind(pair[0])
                    .filter(|&kill| kill <= pair[1].at)
                {
                    Some(kill) => *per_kill.entry(kill).or_default() += 1,
                    None => v.unexplained += 1,
                }
            }
            v.calls += u64::from(r.calls);
            v.successes += u64::from(r.successes);
            v.early += r.early as usize;
            let extra = r.successes.saturating_sub(1) as usize;
            if extra > 0 {
                v.duplicates += extra;
                let behaviour = Behaviour::of(self.seed, index as u64).code();
                *v.duplicates_by_behaviour.entry(behaviour).or_default() += extra;
                v.duplicates_by_tenth[index * 10 / self.records.len()] += extra;
            }
            if r.id.is_none() {
                if r.calls > 0 {
                    v.ran_unconfirmed += 1;
                }
                continue;
            }
            v.accepted += 1;
            let expected = Behaviour::of(self.seed, index as u64).expected().as_str();
            match r.end.as_deref() {
                None => {
                    v.lost += 1;
                    let ran = r.successes > 0 || (expected == "dead" && r.calls > 0);
                    if ran && r.last.as_deref() == Some(NOT_FOUND) {
                        v.lost_unknown_id += 1;
                    }
                }
                Some(end) if end != expected => v.wrong += 1,
                Some("succeeded") if r.successes == 0 => v.unearned += 1,
                Some(_) => {}
            }
        }
        v.after_kills = per_kill.values().sum();
        v.most_per_kill = per_kill.values().copied().max().unwrap_or(0);
        v
    }
}

/// The succeeded tasks that had a failed attempt, by its cause: evidence that the socket
/// faults and DNS outages reached asyncd as failed attempts, which it then retried.
pub(super) fn failure_causes(records: &[Record]) -> String {
    let mut causes: BTreeMap<&'static str, usize> = BTreeMap::new();
    for r in records
        .iter()
        .filter(|r| r.end.as_deref() == Some("succeeded"))
    {
        let Some(error) = &r.last_error else { continue };
        *causes.entry(failure_cause(error)).or_default() += 1;
    }
    if causes.is_empty() {
        return "none".into();
    }
    causes
        .iter()
        .map(|(cause, n)| format!("{cause} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) fn failure_cause(error: &str) -> &'static str {
    if error.contains("dns error") {
        "name not resolved"
    } else if error.contains("timed out") {
        "timed out"
    } else if error.contains("body") {
        "answer cut"
    } else if error.contains("connection closed") {
        "connection closed"
    } else if error.contains("executor answered 5") {
        "5xx"
    } else {
        "other"
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_attempts_are_told_apart_by_asyncds_reason() {
        // Reasons as asyncd wrote them in a soak run.
        for (reason, cause) in [
            (
                "executor call failed: error sending request for url (http://soak-executor.test:45285/run): client error (Connect): dns error: error resolving DNS: failed to lookup address information: Name or service not known",
                "name not resolved",
            ),
            (
                "executor call timed out after 3s (the attempt's timeout)",
                "timed out",
            ),
            (
                "executor call failed: error decoding response body: request or response body error",
                "answer cut",
            ),
            (
                "executor call failed: error sending request for url (http://soak-executor.test:45285/run): client error (SendRequest): connection closed before message completed",
                "connection closed",
            ),
            ("executor answered 500 Internal Server Error", "5xx"),
            ("executor answered 422 Unprocessable Entity", "other"),
        ] {
            assert_eq!(failure_cause(reason), cause, "{reason}");
        }
    }

    fn index_of(seed: u64, wanted: Behaviour) -> usize {
        (0..).find(|i| Behaviour::of(seed, *i) == wanted).unwrap() as usize
    }

    #[test]
    fn the_verdict_counts_losses_wrong_ends_duplicates_and_early_calls() {
        let seed = 11;
        let ok = index_of(seed, Behaviour::Ok);
        let dead = index_of(seed, Behaviour::Permanent);
        // Room for more plain tasks than `ok`.
        let mut ledger = Ledger::new(seed, ok.max(dead) + 50);
        let n = ledger.records.len();
        // Everything accepted and ended as expected, each once...
        for i in 0..n {
            let r = &mut ledger.records[i];
            r.id = Some(format!("t{i}"));
            let expected = Behaviour::of(seed, i as u64).expected();
            r.end = Some(expected.as_str().into());
            r.successes = u32::from(expected == EndState::Succeeded);
        }
        assert_eq!(
            ledger.verdict(&Timeline::default()),
            Verdict {
                accepted: n,
                successes: ledger.records.iter().map(|r| u64::from(r.successes)).sum(),
                ..Verdict::default()
            }
        );
        // ...then one lost, one wrong, two extra successes, one early and one on-time call.
        ledger.records[ok].end = None;
        ledger.records[ok].successes = 0;
        ledger.records[dead].end = Some("succeeded".into());
        ledger.note_success(ok, 1, "a", Some(7));
        ledger.note_success(ok, 2, "b", None);
        ledger.note_success(ok, 2, "c", Some(8));
        ledger.note_call(ok, "t", 1_000, &[1_001]); // rounding: not early
        ledger.note_call(ok, "t", 1_000, &[1_002, 900]); // the later ETA counts: early
        let v = ledger.verdict(&Timeline::default());
        assert_eq!(v.accepted, n);
        assert_eq!(v.lost, 1);
        assert_eq!(v.wrong, 1);
        assert_eq!(v.duplicates, 2);
        assert_eq!(v.duplicates_by_behaviour.get("ok"), Some(&2));
        assert_eq!(v.duplicates_by_behaviour.len(), 1);
        assert_eq!(v.duplicates_by_tenth.iter().sum::<usize>(), 2);
        assert_eq!(v.duplicates_by_tenth[ok * 10 / n], 2);
        // Each success keeps its attempt, lease token and caller, for duplicates.tsv.
        let kept: Vec<(u32, &str, Option<u32>)> = ledger.records[ok]
            .success_at
            .iter()
            .map(|s| (s.attempt, s.lease_token.as_str(), s.caller))
            .collect();
        assert_eq!(kept, [(1, "a", Some(7)), (2, "b", None), (2, "c", Some(8))]);
        assert_eq!(v.early, 1);
        assert_eq!(v.calls, 2);
        assert_eq!(ledger.early_samples.len(), 1);
        assert!((v.duplicates_pct() - 200.0 / n as f64).abs() < 1e-9);
        assert_eq!(v.lost_unknown_id, 0);
        assert_eq!(v.unearned, 0, "the wrong end is not counted twice");
        // A success no executor answer reported is told apart.
        let other_ok = (0..n)
            .find(|i| *i != ok && Behaviour::of(seed, *i as u64) == Behaviour::Ok)
            .expect("two plain tasks");
        ledger.records[other_ok].successes = 0;
        assert_eq!(ledger.verdict(&Timeline::default()).unearned, 1);
        ledger.records[other_ok].successes = 1;
        // A lost task whose id answers 404 while its work ran is told apart.
        ledger.records[ok].last = Some(NOT_FOUND.into());
        assert_eq!(ledger.verdict(&Timeline::default()).lost_unknown_id, 1);
        ledger.records[ok].successes = 0;
        assert_eq!(ledger.verdict(&Timeline::default()).lost_unknown_id, 0);
        assert_eq!(ledger.verdict(&Timeline::default()).lost, 1);
    }

    /// A success at `at` ms, called by dispatcher process `caller`.
    fn success(at: i64, caller: u32) -> Success {
        Success {
            at,
            attempt: 1,
            lease_token: String::new(),
            caller: Some(caller),
        }
    }

    #[test]
    fn a_dispatcher_s_pid_is_read_from_its_instance_name() {
        assert_eq!(caller_pid("soak-dispatcher-0-41234-0a9f"), Some(41234));
        assert_eq!(caller_pid("asyncd-7-ffff"), Some(7));
        assert_eq!(caller_pid("soak-dispatcher-0"), None, "no pid in it");
        assert_eq!(caller_pid(""), None);
    }

    #[test]
    fn a_rerun_is_set_against_the_kill_of_its_caller_within_the_reachable_lease() {
        let w = KILL_WINDOW_MS;
        let timeline = Timeline {
            dispatcher_kills: vec![
                Kill { at: 10_000, pid: 1 },
                Kill { at: 20_000, pid: 2 },
                Kill { at: 40_000, pid: 3 },
            ],
            // The store out of reach 13–16 s and, overlapping, 15–18 s.
            store_out: vec![(15_000, 18_000), (13_000, 16_000)],
        };
        assert_eq!(timeline.kill_behind(&success(9_500, 1)), Some(10_000));
        assert_eq!(
            timeline.kill_behind(&success(10_000 - w, 1)),
            Some(10_000),
            "a whole lease before"
        );
        assert_eq!(timeline.kill_behind(&success(10_000 - w - 1, 1)), None);
        assert_eq!(
            timeline.kill_behind(&success(10_300, 1)),
            Some(10_000),
            "a call in flight, answered after its caller died"
        );
        assert_eq!(
            timeline.kill_behind(&success(9_900, 3)),
            None,
            "the kill of another dispatcher 100 ms later explains nothing"
        );
        assert_eq!(
            timeline.kill_behind(&success(9_900, 9)),
            None,
            "never killed"
        );
        let unknown = Success {
            caller: None,
            ..success(9_900, 1)
        };
        assert_eq!(timeline.kill_behind(&unknown), None, "no caller named");
        // To the 20 s kill from 20 s − w − 5 s: 5 s out (13–18, overlaps counted once),
        // a lease of reachable store.
        assert_eq!(
            timeline.kill_behind(&success(20_000 - w - 5_000, 2)),
            Some(20_000)
        );
        assert_eq!(timeline.kill_behind(&success(20_000 - w - 5_001, 2)), None);
    }

    #[test]
    fn the_verdict_sets_each_rerun_against_a_kill_or_counts_it_unexplained() {
        let seed = 5;
        let mut ledger = Ledger::new(seed, 4);
        for (i, r) in ledger.records.iter_mut().enumerate() {
            r.id = Some(format!("t{i}"));
            r.end = Some(Behaviour::of(seed, i as u64).expected().as_str().into());
        }
        // Task 0 ran three times: called by process 1, re-run after its kill at 10 s, and
        // that run (by process 2) again after the kill of 2 at 30 s. Task 1, called by 1,
        // re-ran after the 10 s kill too. Task 2 was called by 2, which lived on past the
        // re-run: not a kill's doing.
        ledger.records[0].success_at =
            vec![success(9_900, 1), success(29_500, 2), success(30_200, 3)];
        ledger.records[0].successes = 3;
        ledger.records[1].success_at = vec![success(9_990, 1), success(12_000, 3)];
        ledger.records[1].successes = 2;
        ledger.records[2].success_at = vec![success(25_000, 2), success(25_100, 3)];
        ledger.records[2].successes = 2;
        let timeline = Timeline {
            dispatcher_kills: vec![Kill { at: 10_000, pid: 1 }, Kill { at: 30_000, pid: 2 }],
            store_out: Vec::new(),
        };
        let v = ledger.verdict(&timeline);
        assert_eq!(v.duplicates, 4);
        assert_eq!(v.unexplained, 1);
        assert_eq!(v.after_kills, 3);
        assert_eq!(v.most_per_kill, 2, "the 10 s kill");
        // A second success answered before the kill of the first one's caller was not
        // that kill's doing.
        ledger.records[3].success_at = vec![success(9_950, 1), success(9_990, 3)];
        ledger.records[3].successes = 2;
        let v = ledger.verdict(&timeline);
        assert_eq!(
            v.unexplained, 2,
            "a second success before the kill was no re-run the kill caused"
        );
    }

    #[test]
    fn a_task_without_a_2xx_is_not_accepted_and_may_still_run() {
        let mut ledger = Ledger::new(1, 2);
        ledger.records[0].id = Some("a".into());
        ledger.records[0].end = Some(Behaviour::of(1, 0).expected().as_str().into());
        ledger.note_call(1, "b", 5, &[5]);
        let v = ledger.verdict(&Timeline::default());
        assert_eq!(v.accepted, 1);
        assert_eq!(v.lost, 0);
        assert_eq!(v.ran_unconfirmed, 1);
    }
}
