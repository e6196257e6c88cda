//! Submitting the tasks through the APIs (being killed too), and reading them back
//! until all are final.

use super::*;

pub(super) struct Submitter {
    pub(super) http: reqwest::Client,
    pub(super) apis: Vec<String>,
    pub(super) next: AtomicUsize,
}

impl Submitter {
    pub(super) fn base(&self) -> &str {
        &self.apis[self.next.fetch_add(1, Ordering::Relaxed) % self.apis.len()]
    }

    /// One try on the next API process: the status and body, or None for a connection
    /// error, and the process it went to.
    pub(super) async fn post(&self, path: &str, body: &Value) -> (Option<(u16, Value)>, &str) {
        let base = self.base();
        let answer = async {
            let r = self
                .http
                .post(format!("{base}{path}"))
                .json(body)
                .send()
                .await
                .ok()?;
            let status = r.status().as_u16();
            Some((status, r.json().await.unwrap_or(Value::Null)))
        };
        (answer.await, base)
    }

    pub(super) async fn get(&self, path: &str) -> Option<(u16, Value)> {
        let r = self
            .http
            .get(format!("{}{path}", self.base()))
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.json().await.unwrap_or(Value::Null)))
    }
}

pub(super) fn submit_body(seed: u64, index: usize, max_delay_ms: u64) -> Value {
    let eta = now_ms() + delay_ms(seed, index as u64, max_delay_ms) as i64;
    let behaviour = Behaviour::of(seed, index as u64);
    json!({
        "type": "soak",
        "payload": {"i": index, "b": behaviour.code(), "eta": eta},
        "eta": chrono::DateTime::from_timestamp_millis(eta)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "idempotency_key": format!("soak-{seed}-{index}"),
    })
}

pub(super) async fn submit_all(
    client: &Submitter,
    args: &Args,
    seed: u64,
    ledger: &Arc<Mutex<Ledger>>,
    submitted: &Arc<AtomicUsize>,
) {
    let start = Instant::now();
    let max_delay_ms = args.max_delay.as_millis() as u64;
    let rate = args.rate.max(1) as f64;
    let refused = AtomicUsize::new(0);
    futures::stream::iter(units(seed, args.tasks))
        .for_each_concurrent(32, |(first, count, batch)| {
            let refused = &refused;
            async move {
                let due = Duration::from_secs_f64(first as f64 / rate);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                let bodies: Vec<(usize, Value)> = (first..first + count)
                    .map(|i| (i, submit_body(seed, i, max_delay_ms)))
                    .collect();
                let outcome = submit_unit(client, bodies, batch).await;
                let mut ledger = ledger.lock().unwrap();
                for (i, id, answer) in outcome.accepted {
                    ledger.records[i].id = Some(id);
                    ledger.records[i].answer = Some(answer);
                }
                drop(ledger);
                if !outcome.refused.is_empty() {
                    refused.fetch_add(outcome.refused.len(), Ordering::Relaxed);
                    eprintln!("refused: {}", outcome.refused[0]);
                }
                submitted.fetch_add(count, Ordering::Relaxed);
            }
        })
        .await;
    let refused = refused.into_inner();
    if refused > 0 {
        eprintln!("{refused} submits were refused or never got a 2xx");
    }
}

#[derive(Default)]
pub(super) struct UnitOutcome {
    /// Index, id, and how it was answered ([`Record::answer`]).
    pub(super) accepted: Vec<(usize, String, String)>,
    pub(super) refused: Vec<String>,
}

/// Submits until each task got a 2xx or a permanent refusal, retrying 503s and connection
/// errors for up to two minutes (the idempotency key makes a repeat safe).
pub(super) async fn submit_unit(
    client: &Submitter,
    mut bodies: Vec<(usize, Value)>,
    batch: bool,
) -> UnitOutcome {
    let mut out = UnitOutcome::default();
    let start = Instant::now();
    let mut backoff = Duration::from_millis(50);
    let mut tries = 0;
    while !bodies.is_empty() {
        if start.elapsed() > Duration::from_secs(120) {
            out.refused.extend(
                bodies
                    .iter()
                    .map(|(i, _)| format!("task {i}: no 2xx within 120 s")),
            );
            break;
        }
        let mut retry = Vec::new();
        tries += 1;
        let answered = |api: &str, status: u64, result: &Value| {
            format!(
                "{status} route {} from {api} at {} ms, try {tries}",
                result["route"].as_str().unwrap_or("?"),
                now_ms()
            )
        };
        if batch {
            let tasks: Vec<&Value> = bodies.iter().map(|(_, b)| b).collect();
            let (answer, api) = client
                .post("/v1/tasks:batch", &json!({"tasks": tasks}))
                .await;
            match answer {
                Some((200, answer)) => {
                    let results = answer["results"].as_array().cloned().unwrap_or_default();
                    for ((i, body), result) in bodies
                        .into_iter()
                        .zip(results.into_iter().map(Some).chain(std::iter::repeat(None)))
                    {
                        match result {
                            Some(r) if matches!(r["status"].as_u64(), Some(200 | 201)) => {
                                out.accepted.push((
                                    i,
                                    r["id"].as_str().unwrap_or("").to_string(),
                                    answered(api, r["status"].as_u64().unwrap_or(0), &r),
                                ));
                            }
                            Some(r) if r["status"].as_u64().is_some_and(|s| s < 500) => {
                                out.refused.push(format!("task {i}: {r}"));
                            }
                            _ => retry.push((i, body)),
                        }
                    }
                }
                Some((status, answer)) if status < 500 => {
                    out.refused
                        .push(format!("batch at {}: {status} {answer}", bodies[0].0));
                    break;
                }
                _ => retry = bodies,
            }
        } else {
            for (i, body) in bodies {
                let (answer, api) = client.post("/v1/tasks", &body).await;
                match answer {
                    Some((status @ (200 | 201), answer)) => out.accepted.push((
                        i,
                        answer["id"].as_str().unwrap_or("").to_string(),
                        answered(api, status.into(), &answer),
                    )),
                    Some((status, answer)) if status < 500 => {
                        out.refused.push(format!("task {i}: {status} {answer}"));
                    }
                    _ => retry.push((i, body)),
                }
            }
        }
        bodies = retry;
        if !bodies.is_empty() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }
    out
}

/// When [`drain`] gives up on the tasks not yet final.
pub(super) struct DrainLimits {
    /// Every task should be final by then.
    pub(super) deadline: Duration,
    /// Past the deadline, how long without a task finishing ends the drain.
    pub(super) stall: Duration,
    /// The end, however the drain progresses.
    pub(super) limit: Duration,
}

/// Reads every accepted task back until all are final, or, past the deadline, until no
/// task finished for `stall` or the `limit` passed; returns the ones that never got
/// there, with the last state seen. A drain still finishing tasks after the deadline
/// says so: the pipeline is slow (a busy machine), not stopped.
pub(super) async fn drain(
    client: &Submitter,
    ledger: &Arc<Mutex<Ledger>>,
    limits: DrainLimits,
) -> Vec<(usize, String)> {
    let start = Instant::now();
    let mut last_finish = Duration::ZERO;
    let mut said_late = false;
    let mut pending: Vec<(usize, String, String)> = ledger
        .lock()
        .unwrap()
        .records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.id.clone().map(|id| (i, id, "unread".to_string())))
        .collect();
    let mut last_print = Instant::now();
    loop {
        // A pass over 10⁶ tasks takes minutes: only a read begun after the deadline may
        // call a task unfinished, or one that finished while an earlier pass went on
        // would be counted lost.
        let pass_began = start.elapsed();
        let pending_before = pending.len();
        let read: Vec<(usize, String, String, Option<String>)> = futures::stream::iter(pending)
            .map(|(i, id, last)| async move {
                let (state, error) = match client.get(&format!("/v1/tasks/{id}")).await {
                    Some((200, task)) => (
                        task["state"].as_str().unwrap_or("?").to_string(),
                        task["last_error"].as_str().map(str::to_string),
                    ),
                    Some((404, _)) => (NOT_FOUND.to_string(), None),
                    _ => (last, None),
                };
                (i, id, state, error)
            })
            .buffer_unordered(32)
            .collect()
            .await;
        let mut still: Vec<(usize, String, String)> = Vec::new();
        {
            let mut ledger = ledger.lock().unwrap();
            for (i, id, state, error) in read {
                if matches!(state.as_str(), "succeeded" | "dead" | "cancelled") {
                    ledger.records[i].end = Some(state);
                    ledger.records[i].last_error = error;
                } else {
                    ledger.records[i].last = Some(state.clone());
                    still.push((i, id, state));
                }
            }
        }
        if still.len() != pending_before || last_print.elapsed() > Duration::from_secs(30) {
            eprintln!(
                "drain: {} unfinished after {:.0} s",
                still.len(),
                start.elapsed().as_secs_f64()
            );
            last_print = Instant::now();
        }
        if still.len() < pending_before {
            last_finish = start.elapsed();
        }
        pending = still;
        // Only a read begun after the deadline may call a task unfinished (see above);
        // past it, the drain stops at a stall or the limit.
        let stalled =
            pass_began > limits.deadline && pass_began.saturating_sub(last_finish) > limits.stall;
        if pending.is_empty() || stalled || pass_began > limits.limit {
            return pending.into_iter().map(|(i, _, s)| (i, s)).collect();
        }
        if pass_began > limits.deadline && !said_late {
            eprintln!(
                "drain: past the {} s deadline with {} unfinished, going on while they finish",
                limits.deadline.as_secs(),
                pending.len()
            );
            said_late = true;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
