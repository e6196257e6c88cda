//! Key windows: debounce and throttle on a key. A submit that names a key window
//! ([`NewTask::window`](crate::NewTask::window)) is combined with the others of its job
//! and key by one row of `key_windows` (migration 0019), which the insert locks in its
//! transaction, so submits of one key from any number of API replicas take turns. What
//! each submit does is [`step`], pure and tested here; the store applies it.

use std::time::Duration;

use crate::Millis;

/// How the submits of one key are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowRule {
    /// Trailing debounce, replace-latest: the key has at most one waiting task. Each
    /// submit replaces its payload and moves it to `period` after the submit, but never
    /// later than `max_delay` after the first submit of the burst. A submit after that
    /// task began starts a new burst with a new task.
    Trailing {
        period: Duration,
        max_delay: Duration,
    },
    /// Leading debounce: a submit after `period` of quiet is stored (due as submitted);
    /// one within `period` of the key's last submit is held back, and extends the quiet.
    Leading { period: Duration },
    /// Throttle: at most one task stored per `period`, counted from the submit that
    /// stored it; the others within it are held back.
    Throttle { period: Duration },
}

impl WindowRule {
    /// The rule's name in `key_windows.kind`: each rule keeps its own windows.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Trailing { .. } => "trailing",
            Self::Leading { .. } => "leading",
            Self::Throttle { .. } => "throttle",
        }
    }
}

/// A submit's key window: the key (within its job) and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyWindow {
    pub key: String,
    pub rule: WindowRule,
    /// Whether a held submit is to be refused rather than dropped: the store holds it
    /// back either way and hands this on with [`crate::InsertOutcome::Held`], for the
    /// API's answer.
    pub refuse_held: bool,
}

/// A key's window as stored: the task it last stored (or folded submits into), when
/// its burst began and when it closes. A new window is all empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowRow {
    pub task_id: Option<String>,
    pub opened_at: Millis,
    pub closes_at: Millis,
}

/// What one submit does to its key's window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowStep {
    /// Fold the submit into the waiting task `id`: its payload, due at `trigger_at`. If
    /// it has begun meanwhile, the submit is stored as on an empty window instead.
    Replace { id: String, trigger_at: Millis },
    /// Store the submit as a new task due at `trigger_at`; the window becomes `row`.
    Insert { trigger_at: Millis, row: WindowRow },
    /// Store nothing: the window's last task stands, and the window now closes at
    /// `closes_at`.
    Hold { id: String, closes_at: Millis },
}

/// What a submit due at `due` under `rule` does at `now` to a window `row`.
pub fn step(rule: WindowRule, row: &WindowRow, due: Millis, now: Millis) -> WindowStep {
    match (rule, &row.task_id) {
        (WindowRule::Trailing { period, max_delay }, Some(id)) => WindowStep::Replace {
            id: id.clone(),
            trigger_at: (now + period).min(row.opened_at + max_delay),
        },
        (WindowRule::Leading { period }, Some(id)) if now < row.closes_at => WindowStep::Hold {
            id: id.clone(),
            closes_at: now + period,
        },
        (WindowRule::Throttle { .. }, Some(id)) if now < row.closes_at => WindowStep::Hold {
            id: id.clone(),
            closes_at: row.closes_at,
        },
        _ => open(rule, due, now),
    }
}

/// The step of a submit that opens a new window: its task is stored, due at `due` (a
/// trailing debounce's at `period` later, within its cap).
pub fn open(rule: WindowRule, due: Millis, now: Millis) -> WindowStep {
    let (trigger_at, closes_at) = match rule {
        WindowRule::Trailing { period, max_delay } => {
            (now + period.min(max_delay), now + max_delay)
        }
        WindowRule::Leading { period } | WindowRule::Throttle { period } => (due, now + period),
    };
    WindowStep::Insert {
        trigger_at,
        row: WindowRow {
            task_id: None,
            opened_at: now,
            closes_at,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn at(secs: i64) -> Millis {
        Millis::new(secs * 1000)
    }

    /// Applies `step` for submits at `times` (seconds, each due then) and records what
    /// each did, keeping the window as the store would.
    fn run(rule: WindowRule, times: &[i64]) -> Vec<WindowStep> {
        let mut row = WindowRow::default();
        let mut steps = Vec::new();
        for (n, &t) in times.iter().enumerate() {
            let step = step(rule, &row, at(t), at(t));
            match &step {
                WindowStep::Insert { row: next, .. } => {
                    row = WindowRow {
                        task_id: Some(format!("task{n}")),
                        ..next.clone()
                    };
                }
                WindowStep::Hold { closes_at, .. } => row.closes_at = *closes_at,
                WindowStep::Replace { .. } => {}
            }
            steps.push(step);
        }
        steps
    }

    #[test]
    fn a_trailing_debounce_keeps_one_task_and_moves_it_until_the_cap() {
        let rule = WindowRule::Trailing {
            period: 10 * S,
            max_delay: 25 * S,
        };
        let steps = run(rule, &[0, 5, 12, 30]);
        assert!(matches!(
            &steps[0],
            WindowStep::Insert { trigger_at, row } if *trigger_at == at(10) && row.closes_at == at(25)
        ));
        let replaced: Vec<(String, Millis)> = steps[1..]
            .iter()
            .map(|s| match s {
                WindowStep::Replace { id, trigger_at } => (id.clone(), *trigger_at),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            replaced,
            [
                ("task0".to_string(), at(15)),
                ("task0".to_string(), at(22)),
                // Capped 25 s after the burst's first submit: due at once.
                ("task0".to_string(), at(25)),
            ]
        );
        // A period longer than the cap: the first submit waits only the cap.
        let short_cap = WindowRule::Trailing {
            period: 60 * S,
            max_delay: 20 * S,
        };
        assert!(matches!(
            step(short_cap, &WindowRow::default(), at(0), at(0)),
            WindowStep::Insert { trigger_at, .. } if trigger_at == at(20)
        ));
    }

    #[test]
    fn a_leading_debounce_runs_the_first_and_holds_until_a_quiet_period() {
        let rule = WindowRule::Leading { period: 10 * S };
        let steps = run(rule, &[0, 5, 14, 23, 40]);
        let kinds: Vec<&str> = steps
            .iter()
            .map(|s| match s {
                WindowStep::Insert { .. } => "insert",
                WindowStep::Hold { .. } => "hold",
                WindowStep::Replace { .. } => "replace",
            })
            .collect();
        // 5, 14 and 23 each come within 10 s of the one before: held, the quiet
        // extended each time; 40 comes after 17 s of quiet.
        assert_eq!(kinds, ["insert", "hold", "hold", "hold", "insert"]);
        assert_eq!(
            steps[3],
            WindowStep::Hold {
                id: "task0".into(),
                closes_at: at(33)
            }
        );
    }

    #[test]
    fn a_throttle_stores_one_per_period_from_the_one_it_stored() {
        let rule = WindowRule::Throttle { period: 10 * S };
        let steps = run(rule, &[0, 5, 9, 10, 19, 21]);
        let stored: Vec<bool> = steps
            .iter()
            .map(|s| matches!(s, WindowStep::Insert { .. }))
            .collect();
        assert_eq!(stored, [true, false, false, true, false, true]);
        assert_eq!(
            steps[1],
            WindowStep::Hold {
                id: "task0".into(),
                closes_at: at(10)
            },
            "a held submit does not extend a throttle's window"
        );
    }
}
