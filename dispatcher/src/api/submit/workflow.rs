//! Workflows in one call: a `POST /v1/tasks:batch` whose items name each other with
//! `ref` and `depends_on_refs` is a DAG, stored all together or not at all.
//!
//! Unlike a plain batch, whose items are answered one by one, a workflow is refused as
//! a whole — with the status and code of its first bad item and the field named
//! `tasks[i].…` — so a client never has half a DAG to clean up. Its tasks always go to
//! the store (a dependency is checked there at insert), parents first.

use std::collections::HashMap;

use asyncd_contract::{MAX_DEPENDENCIES, SubmitRequest};

use super::validate::plain_text;
use super::{Answer, accepted};
use crate::api::ApiState;
use crate::api::error::ApiError;
use asyncd_store::{Millis, NewTask, WorkflowOutcome};

/// The longest `ref`.
const MAX_REF_CHARS: usize = 64;

/// What a batch item says about the workflow it is part of.
#[derive(Debug, Default)]
pub struct Refs {
    pub reference: Option<String>,
    pub depends_on_refs: Vec<String>,
}

impl Refs {
    /// Takes the workflow fields out of `request`, which validation then refuses to see.
    pub fn take<P>(request: &mut SubmitRequest<P>) -> Self {
        Self {
            reference: request.reference.take(),
            depends_on_refs: request.depends_on_refs.take().unwrap_or_default(),
        }
    }

    fn is_workflow(&self) -> bool {
        self.reference.is_some() || !self.depends_on_refs.is_empty()
    }
}

/// Whether a batch is a workflow: any item names a `ref` or depends on one.
pub fn is_workflow(items: &[Refs]) -> bool {
    items.iter().any(Refs::is_workflow)
}

/// `err` of item `index`, its field named within the batch.
pub fn in_item(index: usize, mut err: ApiError) -> ApiError {
    let field = match err.error.field.take() {
        Some(field) => format!("tasks[{index}].{field}"),
        None => format!("tasks[{index}]"),
    };
    err.error.message = format!("tasks[{index}]: {}", err.error.message);
    err.with_field(field)
}

/// The batch's items ordered parents first, and for each item the indices of the items
/// it depends on; or the refusal naming the first bad `ref`.
pub fn order(
    items: &[Refs],
    depends_on: &[usize],
) -> Result<(Vec<usize>, Vec<Vec<usize>>), ApiError> {
    let mut by_ref: HashMap<&str, usize> = HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(reference) = item.reference.as_deref() else {
            continue;
        };
        let field = format!("tasks[{i}].ref");
        plain_text(&field, reference)?;
        if reference.is_empty() || reference.chars().count() > MAX_REF_CHARS {
            return Err(ApiError::field(
                field,
                format!("must be 1 to {MAX_REF_CHARS} characters"),
            ));
        }
        if let Some(first) = by_ref.insert(reference, i) {
            return Err(ApiError::field(
                field,
                format!("{reference:?} is also the ref of tasks[{first}]"),
            ));
        }
    }
    let mut parents = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = format!("tasks[{i}].depends_on_refs");
        if item.depends_on_refs.len() + depends_on[i] > MAX_DEPENDENCIES {
            return Err(ApiError::field(
                field,
                format!("with depends_on, at most {MAX_DEPENDENCIES} dependencies"),
            ));
        }
        let mut mine = Vec::with_capacity(item.depends_on_refs.len());
        for name in &item.depends_on_refs {
            match by_ref.get(name.as_str()) {
                Some(&parent) => mine.push(parent),
                None => {
                    return Err(ApiError::field(
                        field,
                        format!("no item of this batch has ref {name:?}"),
                    ));
                }
            }
        }
        mine.sort_unstable();
        mine.dedup();
        parents.push(mine);
    }
    // Kahn's algorithm, taking the earliest item of the batch among those ready.
    let mut waiting: Vec<usize> = parents.iter().map(Vec::len).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); items.len()];
    for (child, mine) in parents.iter().enumerate() {
        for &parent in mine {
            children[parent].push(child);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..items.len()).filter(|&i| waiting[i] == 0).collect();
    let mut ordered = Vec::with_capacity(items.len());
    while let Some(next) = ready.pop_first() {
        ordered.push(next);
        for &child in &children[next] {
            waiting[child] -= 1;
            if waiting[child] == 0 {
                ready.insert(child);
            }
        }
    }
    if ordered.len() < items.len() {
        let stuck = (0..items.len())
            .find(|&i| waiting[i] > 0)
            .expect("an unordered item waits");
        return Err(ApiError::field(
            format!("tasks[{stuck}].depends_on_refs"),
            "the batch's depends_on_refs form a cycle through this item",
        ));
    }
    Ok((ordered, parents))
}

/// Stores a batch that is a workflow: every item valid, refs resolved, the tasks stored
/// parents first in one transaction — or one refusal for the whole batch. One answer per
/// item, in the batch's order.
pub(super) async fn store(
    state: &ApiState,
    checked: Vec<Result<NewTask, ApiError>>,
    refs: &[Refs],
    now: Millis,
) -> Result<Vec<Answer>, ApiError> {
    let mut tasks = Vec::with_capacity(checked.len());
    for (i, item) in checked.into_iter().enumerate() {
        let task = item.map_err(|err| in_item(i, err))?;
        if task.window.is_some() {
            // Stored all or nothing, a workflow has no room for a submit folded into
            // another task or held back.
            let refused = ApiError::field(
                "debounce",
                "a workflow's tasks cannot be debounced or throttled",
            );
            return Err(in_item(i, refused));
        }
        tasks.push(task);
    }
    let own_dependencies: Vec<usize> = tasks.iter().map(|t| t.depends_on.len()).collect();
    let (ordered, parents) = order(refs, &own_dependencies)?;
    for (child, mine) in parents.iter().enumerate() {
        let ids: Vec<String> = mine.iter().map(|&p| tasks[p].id.clone()).collect();
        tasks[child].depends_on.extend(ids);
    }
    let in_order: Vec<NewTask> = ordered.iter().map(|&i| tasks[i].clone()).collect();
    let outcomes = match state.store.insert_workflow(&in_order, now).await? {
        WorkflowOutcome::Stored(outcomes) => outcomes,
        WorkflowOutcome::Refused { index, outcome } => {
            let err = accepted(outcome).expect_err("a refused outcome");
            return Err(in_item(ordered[index], err));
        }
    };
    let mut answers: Vec<Option<Answer>> =
        std::iter::repeat_with(|| None).take(tasks.len()).collect();
    for (&i, outcome) in ordered.iter().zip(outcomes) {
        answers[i] = Some(accepted(outcome));
    }
    let answers: Vec<Answer> = answers
        .into_iter()
        .map(|a| a.expect("every task answered"))
        .collect();
    state.count_and_wake(&tasks, &answers, now);
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(reference: Option<&str>, deps: &[&str]) -> Refs {
        Refs {
            reference: reference.map(str::to_string),
            depends_on_refs: deps.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn field(err: ApiError) -> String {
        err.error.field.unwrap()
    }

    #[test]
    fn parents_come_first_then_the_earliest_ready_item() {
        let items = [
            item(Some("ship"), &["charge", "pack"]),
            item(Some("charge"), &[]),
            item(Some("pack"), &["charge"]),
            item(None, &[]),
        ];
        let (ordered, parents) = order(&items, &[0; 4]).unwrap();
        assert_eq!(ordered, [1, 2, 0, 3]);
        assert_eq!(parents, [vec![1, 2], vec![], vec![1], vec![]]);
    }

    #[test]
    fn bad_refs_and_cycles_name_the_item() {
        let refused = |items: &[Refs]| field(order(items, &vec![0; items.len()]).unwrap_err());
        assert_eq!(
            refused(&[item(Some("a"), &["b"]), item(Some("b"), &["a"])]),
            "tasks[0].depends_on_refs"
        );
        assert_eq!(
            refused(&[item(Some("a"), &["a"])]),
            "tasks[0].depends_on_refs"
        );
        assert_eq!(
            refused(&[item(Some("a"), &[]), item(Some("a"), &[])]),
            "tasks[1].ref"
        );
        assert_eq!(
            refused(&[item(Some("a"), &["nope"])]),
            "tasks[0].depends_on_refs"
        );
        assert_eq!(refused(&[item(Some(""), &[])]), "tasks[0].ref");
        assert_eq!(refused(&[item(Some("a\u{0}"), &[])]), "tasks[0].ref");
        assert_eq!(
            refused(&[item(Some(&"x".repeat(MAX_REF_CHARS + 1)), &[])]),
            "tasks[0].ref"
        );
        let many: Vec<String> = (0..=MAX_DEPENDENCIES).map(|i| i.to_string()).collect();
        let mut items: Vec<Refs> = many.iter().map(|r| item(Some(r), &[])).collect();
        items.push(Refs {
            reference: None,
            depends_on_refs: many.clone(),
        });
        assert_eq!(
            refused(&items),
            format!("tasks[{}].depends_on_refs", many.len())
        );
    }
}
