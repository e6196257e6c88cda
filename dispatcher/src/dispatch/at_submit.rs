//! Claim at submit: when the API and a dispatcher share a process (`asyncd dev`, the
//! combined role), a submitted task due within the lookahead goes in already claimed by
//! this dispatcher and straight into its heap — one row write where an insert and then
//! the claimer's claim wrote it twice.
//!
//! Only where the claimer would have claimed it next, so that nothing overtakes what
//! waits in the store:
//! - the claimer's last pass planned the task's type (owned here, not paused by its
//!   config, its signing keys present) and the type has no concurrency key (keyed jobs
//!   are claimed fairly among their keys);
//! - that pass left none of the type's due tasks in the store (its claim came back short
//!   of its limit), and nothing has woken the claimer since: every wake (a retry, a
//!   release, a resume, a submit left pending) says the store may hold due tasks again,
//!   so claim at submit stops until the claimer has looked;
//! - within the room that pass left the job ([`super::holdings`]) and `max_heap`;
//! - not once the claimer has stopped (shutdown hands the heap back to the store).
//!
//! A task left out of that goes in pending and wakes the claimer, as every submit did
//! before. The store decides the rest in the insert's transaction (a type paused through
//! the API, a taken key: `Store::insert_claiming`).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{ClaimerWakeup, Intake};
use asyncd_store::{ClaimAtInsert, InsertOutcome, Millis, NewTask, Store};

/// What may be claimed at submit, as the claimer's last pass measured it.
#[derive(Debug, Default)]
pub(super) struct SubmitRoom {
    /// The claimer's wakes counted when the pass began; a wake since closes the room.
    wakes: u64,
    /// Bumped by each pass, so room taken from an older measure is not given back into
    /// a newer one.
    generation: u64,
    /// Per task type: how many more tasks may be claimed at submit.
    room: HashMap<String, usize>,
}

/// Room taken for one insert.
#[derive(Debug)]
pub(super) struct Reserved {
    generation: u64,
    room: HashMap<String, usize>,
}

impl SubmitRoom {
    /// A pass that began at `wakes` left the store without due tasks of these types, and
    /// these jobs with this much room.
    pub(super) fn measured(&mut self, wakes: u64, room: HashMap<String, usize>) {
        self.wakes = wakes;
        self.generation += 1;
        self.room = room;
    }

    /// Takes room for the tasks of `tasks` due by `horizon`, at most `most` in all, if
    /// the claimer has not been woken since it measured the room (`wakes` now).
    pub(super) fn reserve(
        &mut self,
        tasks: &[NewTask],
        horizon: Millis,
        wakes: u64,
        most: usize,
    ) -> Option<Reserved> {
        if self.wakes != wakes {
            self.room.clear();
        }
        if self.room.is_empty() {
            return None;
        }
        let mut taken: HashMap<String, usize> = HashMap::new();
        let mut total = 0;
        for task in tasks {
            if total == most {
                break;
            }
            if task.trigger_at > horizon || !task.depends_on.is_empty() {
                continue;
            }
            if let Some(left) = self.room.get_mut(&task.task_type)
                && *left > 0
            {
                *left -= 1;
                total += 1;
                *taken.entry(task.task_type.clone()).or_default() += 1;
            }
        }
        (!taken.is_empty()).then_some(Reserved {
            generation: self.generation,
            room: taken,
        })
    }

    /// The room `reserved` took that the insert did not use (it claimed tasks of
    /// `claimed`, a type each) comes back, unless a newer pass has measured the room since.
    pub(super) fn give_back<'t>(
        &mut self,
        reserved: Reserved,
        claimed: impl IntoIterator<Item = &'t str>,
    ) {
        if reserved.generation != self.generation {
            return;
        }
        let mut unused = reserved.room;
        for task_type in claimed {
            if let Some(n) = unused.get_mut(task_type) {
                *n = n.saturating_sub(1);
            }
        }
        for (task_type, n) in unused {
            if let Some(left) = self.room.get_mut(&task_type) {
                *left += n;
            }
        }
    }
}

/// The way the API inserts tasks when a dispatcher runs in its process. Weak, so an API
/// outliving the dispatcher keeps nothing alive; it then only inserts.
#[derive(Clone)]
pub struct LocalDispatch {
    pub(super) intake: Weak<Intake>,
    pub(super) waker: ClaimerWakeup,
    pub(super) owner: Arc<str>,
    pub(super) hold: Duration,
    pub(super) lookahead: Duration,
}

impl LocalDispatch {
    /// Inserts `tasks` as [`Store::insert`] does, claiming for this dispatcher the ones
    /// it may (see the module's doc); wakes the claimer when a new task due within the
    /// lookahead was left in the store.
    pub async fn insert(
        &self,
        store: &dyn Store,
        tasks: &[NewTask],
        now: Millis,
    ) -> asyncd_store::Result<Vec<InsertOutcome>> {
        let horizon = now + self.lookahead;
        let intake = self.intake.upgrade();
        let reserved = intake
            .as_ref()
            .and_then(|intake| intake.reserve(tasks, horizon, self.waker.wakes()));
        let (outcomes, claimed) = match (&intake, reserved) {
            (Some(intake), Some(reserved)) => {
                let claim = ClaimAtInsert {
                    owner: &self.owner,
                    hold: self.hold,
                    horizon,
                    room: Some(&reserved.room),
                };
                let inserted = store.insert_claiming(tasks, now, claim).await;
                let claimed = inserted.as_ref().map_or(&[][..], |(_, claimed)| claimed);
                intake
                    .at_submit()
                    .give_back(reserved, claimed.iter().map(|task| task.task_type.as_str()));
                inserted?
            }
            _ => (store.insert(tasks, now).await?, Vec::new()),
        };
        let due = outcomes
            .iter()
            .filter(|outcome| {
                matches!(outcome, InsertOutcome::Inserted { trigger_at, .. } if *trigger_at <= horizon)
            })
            .count();
        let left_in_store = due > claimed.len();
        if let Some(intake) = &intake
            && !claimed.is_empty()
        {
            intake.push(claimed);
        }
        if left_in_store {
            self.waker.wake();
        }
        Ok(outcomes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due(task_type: &str, at: i64) -> NewTask {
        NewTask::test(task_type, Millis::new(at))
    }

    fn room(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
        pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    #[test]
    fn only_types_measured_drained_and_within_their_room_are_taken() {
        let mut at_submit = SubmitRoom::default();
        at_submit.measured(7, room(&[("a", 2), ("b", 5)]));
        let tasks = [due("a", 10), due("a", 10), due("a", 10), due("c", 10)];
        let reserved = at_submit
            .reserve(&tasks, Millis::new(100), 7, usize::MAX)
            .expect("room for a");
        assert_eq!(
            reserved.room,
            room(&[("a", 2)]),
            "a's room is 2; c was not measured"
        );
        assert_eq!(at_submit.room, room(&[("a", 0), ("b", 5)]));
    }

    #[test]
    fn tasks_beyond_the_horizon_or_with_dependencies_are_not_taken() {
        let mut at_submit = SubmitRoom::default();
        at_submit.measured(0, room(&[("a", 10)]));
        let mut child = due("a", 10);
        child.depends_on = vec!["parent".into()];
        let tasks = [due("a", 101), child];
        assert!(
            at_submit
                .reserve(&tasks, Millis::new(100), 0, usize::MAX)
                .is_none()
        );
    }

    #[test]
    fn a_wake_since_the_measure_closes_the_room_until_the_next_pass() {
        let mut at_submit = SubmitRoom::default();
        at_submit.measured(3, room(&[("a", 10)]));
        let tasks = [due("a", 10)];
        assert!(
            at_submit
                .reserve(&tasks, Millis::new(100), 4, usize::MAX)
                .is_none()
        );
        assert!(
            at_submit
                .reserve(&tasks, Millis::new(100), 3, usize::MAX)
                .is_none(),
            "still closed: only a new pass opens it"
        );
        at_submit.measured(4, room(&[("a", 10)]));
        assert!(
            at_submit
                .reserve(&tasks, Millis::new(100), 4, usize::MAX)
                .is_some()
        );
    }

    #[test]
    fn unused_room_comes_back_only_into_the_measure_it_was_taken_from() {
        let mut at_submit = SubmitRoom::default();
        at_submit.measured(0, room(&[("a", 3)]));
        let tasks = [due("a", 10), due("a", 10)];
        let reserved = at_submit
            .reserve(&tasks, Millis::new(100), 0, usize::MAX)
            .unwrap();
        // One of the two went in claimed (the other was a duplicate, say).
        at_submit.give_back(reserved, ["a"]);
        assert_eq!(at_submit.room, room(&[("a", 2)]));

        let reserved = at_submit
            .reserve(&tasks, Millis::new(100), 0, usize::MAX)
            .unwrap();
        at_submit.measured(0, room(&[("a", 9)]));
        at_submit.give_back(reserved, []);
        assert_eq!(at_submit.room, room(&[("a", 9)]), "a newer measure stands");
    }

    #[test]
    fn at_most_the_room_left_in_the_heap_is_taken() {
        let mut at_submit = SubmitRoom::default();
        at_submit.measured(0, room(&[("a", 10)]));
        let tasks = [due("a", 10), due("a", 10), due("a", 10)];
        let reserved = at_submit.reserve(&tasks, Millis::new(100), 0, 2).unwrap();
        assert_eq!(reserved.room, room(&[("a", 2)]));
    }
}
