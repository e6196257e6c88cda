//! Writing attempt outcomes so that one the store refuses never blocks the others.
//!
//! The dispatcher's completer and the rescuer write outcomes in batches, one transaction
//! each. A batch the store cannot take because it is away is kept whole and tried again
//! later. A batch it refuses (a value some backend cannot store, a constraint) is split
//! in halves until the refused outcome is alone; that one is written instead as a dead
//! letter naming why, so an operator sees it and can redrive it, and if even that is
//! refused it is left to its lease and logged. Everything else in the batch is written.

use crate::executor::sanitize_reason;
use asyncd_store::{Finish, FinishKind, Millis, Result, Store};

/// How a dead letter written in place of a refused outcome begins; an outcome whose
/// error already begins so is not replaced again.
const REFUSED: &str = "the store refused this attempt's outcome";

/// Writes `outcomes` (emptied on success) and returns how many applied (a finish whose
/// token is stale applies nothing). When the store is unavailable, returns its error
/// with what is still unwritten left in `outcomes`, to try again.
pub async fn write(store: &dyn Store, outcomes: &mut Vec<Finish>, now: Millis) -> Result<usize> {
    let mut applied = 0;
    // Parts still to write, the next one last.
    let mut parts = vec![std::mem::take(outcomes)];
    while let Some(mut part) = parts.pop() {
        let err = match store.finish(&part, now).await {
            Ok(done) => {
                applied += done.iter().filter(|a| **a).count();
                continue;
            }
            Err(err) => err,
        };
        if err.is_unavailable() {
            parts.push(part);
            *outcomes = parts.into_iter().flatten().collect();
            return Err(err);
        }
        if part.len() > 1 {
            let second = part.split_off(part.len() / 2);
            parts.push(second);
            parts.push(part);
            continue;
        }
        let refused = part.remove(0);
        match instead_of_refused(&refused, &err.to_string()) {
            Some(dead) => {
                tracing::warn!(id = %refused.id, %err, "the store refused an outcome; writing the task as dead instead");
                parts.push(vec![dead]);
            }
            None => {
                tracing::error!(id = %refused.id, %err, "the store refused an outcome; its lease will bring the task back");
            }
        }
    }
    Ok(applied)
}

/// The dead letter to write in place of an outcome the store refused on its own, if any:
/// a release or lease extension refused is left to the lease, and so is a dead letter
/// that already replaced a refused outcome.
fn instead_of_refused(refused: &Finish, why: &str) -> Option<Finish> {
    match &refused.kind {
        FinishKind::Dead { error } if error.starts_with(REFUSED) => None,
        FinishKind::Succeeded { .. } | FinishKind::Retry { .. } | FinishKind::Dead { .. } => {
            Some(Finish {
                id: refused.id.clone(),
                lease_token: refused.lease_token,
                kind: FinishKind::Dead {
                    error: sanitize_reason(&format!("{REFUSED}: {why}")),
                },
            })
        }
        FinishKind::Release | FinishKind::Extend { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish(kind: FinishKind) -> Finish {
        Finish {
            id: "t".into(),
            lease_token: 7,
            kind,
        }
    }

    #[test]
    fn a_refused_outcome_becomes_a_dead_letter_once() {
        let dead = instead_of_refused(&finish(FinishKind::Succeeded { result: None }), "bad\0")
            .expect("replaced");
        assert_eq!(dead.lease_token, 7);
        let FinishKind::Dead { error } = &dead.kind else {
            panic!("{dead:?}")
        };
        assert!(
            error.starts_with(REFUSED) && !error.contains('\0'),
            "{error}"
        );
        assert!(
            instead_of_refused(&dead, "again").is_none(),
            "not replaced twice"
        );
    }

    #[test]
    fn releases_and_extensions_are_left_to_the_lease() {
        assert!(instead_of_refused(&finish(FinishKind::Release), "x").is_none());
        let extend = FinishKind::Extend {
            until: Millis::new(1),
        };
        assert!(instead_of_refused(&finish(extend), "x").is_none());
    }
}
