//! Task search: filters, newest first, and pages that hold under concurrent inserts.

use asyncd_store::{CancelOutcome, InsertOutcome, Millis, NewTask, SearchParams, Store, TaskState};

use crate::{T0, T0_MS, at};

scenarios!(
    tasks_are_found_by_filter_newest_first_page_by_page,
    search_pages_through_10_000_tasks_under_concurrent_inserts,
);

/// Issue 15, task search: every filter narrows, the newest come first, and the cursor
/// of a page's last task continues where it ended, through ties on `created_at`.
async fn tasks_are_found_by_filter_newest_first_page_by_page(store: &dyn Store) {
    let mut ids = Vec::new();
    for (n, (task_type, unique, created)) in [
        ("a", None, 1),
        ("a", Some("k1"), 2),
        ("b", None, 2),
        ("a", None, 2),
        ("a", Some("k2"), 3),
    ]
    .into_iter()
    .enumerate()
    {
        let mut task = NewTask::test(task_type, at(100 + n as i64));
        task.unique_key = unique.map(String::from);
        match store.insert(&[task], at(created)).await.unwrap().remove(0) {
            InsertOutcome::Inserted { id, .. } => ids.push(id),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        store.cancel(&ids[3], at(4)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let search = |params: SearchParams<'static>| async move {
        store
            .search(params)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect::<Vec<_>>()
    };
    let all = SearchParams {
        limit: 100,
        ..SearchParams::default()
    };
    // Newest first; ties on created_at by id, descending.
    let mut tied = vec![ids[1].clone(), ids[2].clone(), ids[3].clone()];
    tied.sort();
    tied.reverse();
    let newest_first: Vec<String> = [vec![ids[4].clone()], tied, vec![ids[0].clone()]].concat();
    assert_eq!(search(all).await, newest_first);

    let only_a = search(SearchParams {
        task_type: Some("a"),
        ..all
    })
    .await;
    assert_eq!(only_a.len(), 4);
    assert!(!only_a.contains(&ids[2]));
    assert_eq!(
        search(SearchParams {
            state: Some(TaskState::Cancelled),
            ..all
        })
        .await,
        [ids[3].clone()]
    );
    assert_eq!(
        search(SearchParams {
            unique_key: Some("k2"),
            ..all
        })
        .await,
        [ids[4].clone()]
    );
    assert_eq!(
        search(SearchParams {
            created_after: Some(at(2)),
            ..all
        })
        .await,
        [ids[4].clone()]
    );
    assert_eq!(
        search(SearchParams {
            eta_before: Some(at(101)),
            ..all
        })
        .await,
        [ids[0].clone()]
    );

    // Two at a time, each page starting after the last one's (created_at, id).
    let mut paged = Vec::new();
    let mut cursor: Option<(Millis, String)> = None;
    loop {
        let page = store
            .search(SearchParams {
                after: cursor.as_ref().map(|(at, id)| (*at, id.as_str())),
                limit: 2,
                ..SearchParams::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        cursor = Some((last.created_at, last.id.clone()));
        paged.extend(page.into_iter().map(|t| t.id));
    }
    assert_eq!(paged, newest_first);
}

/// Issue 15: paging through 10 000 tasks while more are inserted meets each of them
/// exactly once and none twice. Between pages, and while the next page is read, tasks go
/// in on both sides of the cursor: created later than everything (before the first
/// page), at an instant already read, at the cursor's own instant on either side of its
/// id, and at an instant still to read. A task behind the cursor may or may not be met
/// (it raced the page); none of the inserts may shift a page, which would skip or repeat
/// one of the first 10 000.
async fn search_pages_through_10_000_tasks_under_concurrent_inserts(store: &dyn Store) {
    const TASKS: usize = 10_000;
    const INSTANTS: i64 = 10;
    let mut stored = std::collections::BTreeSet::new();
    for chunk in 0..INSTANTS {
        let batch: Vec<NewTask> = (0..TASKS as i64 / INSTANTS)
            .map(|_| NewTask::test("a", T0))
            .collect();
        // Created over ten instants, so the cursor crosses ties and instants alike.
        for outcome in store.insert(&batch, at(chunk)).await.unwrap() {
            match outcome {
                InsertOutcome::Inserted { id, .. } => assert!(stored.insert(id)),
                other => panic!("{other:?}"),
            }
        }
    }
    let page = |after: Option<(Millis, String)>| async move {
        store
            .search(SearchParams {
                task_type: Some("a"),
                after: after.as_ref().map(|(at, id)| (*at, id.as_str())),
                limit: 250,
                ..SearchParams::default()
            })
            .await
            .unwrap()
    };
    // Ids that sort below every stored one (the stored are UUIDv7s of today), for a task
    // at the cursor's instant that still has to be read.
    let low_id = |n: usize| format!("00000000-0000-7000-8000-{n:012x}");
    // The tasks to insert, with when each is created, while the page after `cursor` is
    // read.
    let around = |n: usize, cursor: &Option<(Millis, String)>| -> Vec<(NewTask, Millis)> {
        let mut tasks = vec![(NewTask::test("a", T0), at(INSTANTS + n as i64))];
        if let Some((created, _)) = cursor {
            let instant = created.as_i64() - T0_MS;
            // Already read: newer than the cursor, and at its instant with a higher id.
            tasks.push((NewTask::test("a", T0), at((instant + 1).min(INSTANTS - 1))));
            tasks.push((NewTask::test("a", T0), *created));
            // Still to read: at its instant with a lower id, and at an older instant.
            let mut low = NewTask::test("a", T0);
            low.id = low_id(n);
            tasks.push((low, *created));
            tasks.push((NewTask::test("a", T0), at((instant - 1).max(0))));
        }
        tasks
    };
    let mut seen = Vec::with_capacity(TASKS);
    let mut added = std::collections::BTreeSet::new();
    let mut cursor: Option<(Millis, String)> = None;
    for n in 0.. {
        let inserts = around(n, &cursor);
        let insert_all = async {
            let mut ids = Vec::new();
            for (task, created) in inserts {
                match store.insert(&[task], created).await.unwrap().remove(0) {
                    InsertOutcome::Inserted { id, .. } => ids.push(id),
                    other => panic!("{other:?}"),
                }
            }
            ids
        };
        let (found, ids) = tokio::join!(page(cursor.clone()), insert_all);
        added.extend(ids);
        let Some(last) = found.last() else { break };
        cursor = Some((last.created_at, last.id.clone()));
        seen.extend(found.into_iter().map(|t| t.id));
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "no task on two pages");
    let seen: std::collections::BTreeSet<String> = seen.into_iter().collect();
    assert!(
        stored.is_subset(&seen),
        "{} of the first 10 000 never listed",
        stored.difference(&seen).count()
    );
    assert!(
        seen.iter()
            .all(|id| stored.contains(id) || added.contains(id)),
        "only stored tasks are listed"
    );
    assert!(
        added.len() > 4 * 40,
        "inserts went in beside every page: {}",
        added.len()
    );
}
