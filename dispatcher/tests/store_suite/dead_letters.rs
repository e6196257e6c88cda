//! Dead letters: listed, redriven, cancelled and purged, one by one and in bulk; and the
//! Kafka messages that could not be made tasks.

use asyncd_store::{
    BulkAction, CancelOutcome, DeadCount, DeadFilter, DeadLetterParams, Finish, FinishKind,
    KafkaDeadLetter, KafkaDeadLetterKey, KafkaDeadLetterParams, Millis, NewTask, RedriveOutcome,
    Store, TaskState,
};

use crate::{T0, at, claim_all, insert, start_params, state};

scenarios!(
    dead_letters_page_by_cursor_latest_due_first,
    dead_letters_redrive_and_cancel,
    dead_letters_are_redriven_and_purged_in_bulk,
    kafka_dead_letters_keep_messages_once_and_byte_for_byte,
);

fn dead_page<'a>(
    task_type: Option<&'a str>,
    after: Option<(Millis, &'a str)>,
    limit: u32,
) -> DeadLetterParams<'a> {
    DeadLetterParams {
        task_type,
        after,
        limit,
    }
}

async fn dead_letters_page_by_cursor_latest_due_first(store: &dyn Store) {
    // Five dead tasks of type a, two sharing a due time (the id orders those), one of
    // type b; paging by twos from each page's last item lists every a once, in order.
    let mut expected = Vec::new();
    for (i, due) in [0, 5, 5, 9, 2].into_iter().enumerate() {
        let mut task = NewTask::test("a", at(due));
        task.id = format!("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5{i}");
        expected.push((due, insert(store, task).await));
    }
    insert(store, NewTask::test("b", at(3))).await;
    let claims: Vec<(String, i64)> = claim_all(store, at(10), at(10))
        .await
        .iter()
        .map(|c| (c.id.clone(), c.lease_token))
        .collect();
    let started = store.start(start_params(&claims, at(10), 0)).await.unwrap();
    let deaths: Vec<Finish> = started
        .iter()
        .map(|s| Finish {
            id: s.id.clone(),
            lease_token: s.lease_token,
            kind: FinishKind::Dead {
                error: "bad".into(),
            },
        })
        .collect();
    assert!(
        store
            .finish(&deaths, at(11))
            .await
            .unwrap()
            .iter()
            .all(|a| *a)
    );
    expected.sort_by(|x, y| y.cmp(x));
    let expected: Vec<String> = expected.into_iter().map(|(_, id)| id).collect();

    let mut listed: Vec<String> = Vec::new();
    let mut after: Option<(Millis, String)> = None;
    loop {
        let page = store
            .dead_letters(dead_page(
                Some("a"),
                after.as_ref().map(|(at, id)| (*at, id.as_str())),
                2,
            ))
            .await
            .unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = Some((last.trigger_at, last.id.clone()));
        listed.extend(page.iter().map(|t| t.id.clone()));
    }
    assert_eq!(listed, expected);
    let everything = store
        .dead_letters(dead_page(None, None, 100))
        .await
        .unwrap();
    assert_eq!(everything.len(), 6, "no type: every dead task");
}

async fn dead_letters_redrive_and_cancel(store: &dyn Store) {
    let id = insert(store, NewTask::test("a", T0)).await;
    let claimed = claim_all(store, T0, T0).await.remove(0);
    let started = store
        .start(start_params(&[(id.clone(), claimed.lease_token)], T0, 0))
        .await
        .unwrap()
        .remove(0);
    let dead = Finish {
        id: id.clone(),
        lease_token: started.lease_token,
        kind: FinishKind::Dead {
            error: "bad".into(),
        },
    };
    assert_eq!(store.finish(&[dead], T0).await.unwrap(), [true]);
    let letters = store
        .dead_letters(dead_page(Some("a"), None, 10))
        .await
        .unwrap();
    assert_eq!(
        letters.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()]
    );
    assert!(
        store
            .dead_letters(dead_page(Some("b"), None, 10))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.redrive(&id, at(1)).await.unwrap(),
        RedriveOutcome::Redriven {
            trigger_at: at(1),
            state: TaskState::Pending
        }
    );
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!((record.state, record.attempt), (TaskState::Pending, 0));
    assert_eq!(
        store.redrive(&id, T0).await.unwrap(),
        RedriveOutcome::NotDead(TaskState::Pending)
    );
    assert_eq!(
        store.redrive("nope", T0).await.unwrap(),
        RedriveOutcome::NotFound
    );

    assert_eq!(
        store.cancel(&id, T0).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        store.cancel(&id, T0).await.unwrap(),
        CancelOutcome::NotCancellable(TaskState::Cancelled)
    );
    assert_eq!(
        store.cancel("nope", T0).await.unwrap(),
        CancelOutcome::NotFound
    );
    assert!(
        claim_all(store, at(10), T0).await.is_empty(),
        "a cancelled task is never claimed"
    );
}

/// Issue 15, dead letters in bulk: the filter narrows by type, error prefix (literally:
/// `%` is no wildcard) and time of death; each pass acts on the oldest deaths first, up
/// to its limit; what it cannot act on is counted apart; and a task that dies again after
/// the action's cutoff is not matched again.
async fn dead_letters_are_redriven_and_purged_in_bulk(store: &dyn Store) {
    // Task `id`, due at `when`, dies there with `error`.
    async fn bury(store: &dyn Store, id: &str, when: Millis, error: &str) {
        let claimed = claim_all(store, when, when).await;
        assert_eq!(claimed.len(), 1, "only {id} is due at {when:?}");
        let attempt = store
            .start(start_params(
                &[(id.to_string(), claimed[0].lease_token)],
                when,
                0,
            ))
            .await
            .unwrap()
            .remove(0);
        let dead = Finish {
            id: id.to_string(),
            lease_token: attempt.lease_token,
            kind: FinishKind::Dead {
                error: error.into(),
            },
        };
        assert_eq!(store.finish(&[dead], when).await.unwrap(), [true]);
    }
    async fn dead_at(store: &dyn Store, task: NewTask, error: &str) -> String {
        let when = task.trigger_at;
        let id = insert(store, task).await;
        bury(store, &id, when, error).await;
        id
    }
    let filter = |action, error_prefix, dead_after, dead_before| DeadFilter {
        task_type: "a",
        error_prefix,
        dead_after,
        dead_before,
        action,
    };
    let count = |filter| async move { store.count_dead(filter).await.unwrap() };
    let act =
        |filter, limit| async move { store.act_on_dead(filter, limit, at(5_000)).await.unwrap() };
    let cutoff = at(1_000);
    let busy = Some("executor answered 503");

    let d1 = dead_at(
        store,
        NewTask::test("a", at(10)),
        "executor answered 503: busy",
    )
    .await;
    let d2 = dead_at(
        store,
        NewTask::test("a", at(20)),
        "executor answered 503: busy",
    )
    .await;
    let d3 = dead_at(store, NewTask::test("a", at(30)), "timed out after 30s").await;
    let mut keyed = NewTask::test("a", at(40));
    keyed.unique_key = Some("order:7".into());
    let d4 = dead_at(store, keyed, "executor answered 503").await;
    let mut holder = NewTask::test("a", at(10_000_000));
    holder.unique_key = Some("order:7".into());
    insert(store, holder).await;
    let other_type = dead_at(store, NewTask::test("b", at(50)), "executor answered 503").await;

    let everything = filter(BulkAction::Redrive, None, None, cutoff);
    assert_eq!(
        count(everything).await,
        DeadCount {
            matched: 4,
            actionable: 3
        },
        "{d4}'s unique key is held by a pending task"
    );
    assert_eq!(
        count(filter(BulkAction::Purge, None, None, cutoff)).await,
        DeadCount {
            matched: 4,
            actionable: 4
        }
    );
    assert_eq!(
        count(filter(BulkAction::Redrive, busy, None, cutoff)).await,
        DeadCount {
            matched: 3,
            actionable: 2
        }
    );
    assert_eq!(
        count(filter(BulkAction::Redrive, Some("executor%"), None, cutoff)).await,
        DeadCount::default(),
        "a prefix is literal text"
    );
    assert_eq!(
        count(filter(BulkAction::Redrive, None, Some(at(20)), at(35)))
            .await
            .matched,
        2,
        "{d2} and {d3} died in [20, 35)"
    );

    assert_eq!(
        act(filter(BulkAction::Redrive, busy, None, cutoff), 1).await,
        1
    );
    assert_eq!(
        state(store, &d1).await,
        TaskState::Pending,
        "the oldest death first"
    );
    assert_eq!(state(store, &d2).await, TaskState::Dead);
    let d1_record = store.get(&d1).await.unwrap().unwrap();
    assert_eq!((d1_record.attempt, d1_record.trigger_at), (0, at(5_000)));
    assert_eq!(
        act(filter(BulkAction::Redrive, busy, None, cutoff), 10).await,
        1
    );
    assert_eq!(state(store, &d2).await, TaskState::Pending);
    assert_eq!(
        act(filter(BulkAction::Redrive, busy, None, cutoff), 10).await,
        0,
        "a repeat finds nothing more to do"
    );
    assert_eq!(state(store, &d4).await, TaskState::Dead);

    // d1 runs again and dies again, after the cutoff: the same action does not match it.
    assert_eq!(
        store.cancel(&d2, at(5_000)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    bury(store, &d1, at(5_000), "executor answered 503: busy").await;
    assert_eq!(
        count(filter(BulkAction::Redrive, busy, None, cutoff)).await,
        DeadCount {
            matched: 1,
            actionable: 0
        }
    );

    // Two dead letters that share a unique key (the first died, freeing it, before the
    // second took it): one redrive at a time, the second refused.
    let mut e1 = NewTask::test("a", at(60));
    e1.unique_key = Some("order:8".into());
    let e1 = dead_at(store, e1, "twin").await;
    let mut e2 = NewTask::test("a", at(70));
    e2.unique_key = Some("order:8".into());
    let e2 = dead_at(store, e2, "twin").await;
    let twins = filter(BulkAction::Redrive, Some("twin"), None, cutoff);
    assert_eq!(
        count(twins).await,
        DeadCount {
            matched: 2,
            actionable: 2
        }
    );
    assert_eq!(act(twins, 10).await, 1);
    assert_eq!(state(store, &e1).await, TaskState::Pending);
    assert_eq!(state(store, &e2).await, TaskState::Dead);
    assert_eq!(
        count(twins).await,
        DeadCount {
            matched: 1,
            actionable: 0
        }
    );

    let purge = filter(BulkAction::Purge, None, None, cutoff);
    assert_eq!(
        count(purge).await,
        DeadCount {
            matched: 3,
            actionable: 3
        }
    );
    assert_eq!(act(purge, 2).await, 2);
    assert!(
        store.get(&d3).await.unwrap().is_none(),
        "the oldest death first"
    );
    assert!(store.get(&d4).await.unwrap().is_none());
    assert_eq!(act(purge, 10).await, 1);
    assert!(store.get(&e2).await.unwrap().is_none());
    assert_eq!(act(purge, 10).await, 0);
    assert_eq!(
        state(store, &other_type).await,
        TaskState::Dead,
        "another type's"
    );
    assert_eq!(
        state(store, &d1).await,
        TaskState::Dead,
        "died after the cutoff"
    );
}

/// A Kafka message the consumer could not make a task of is kept byte for byte — NUL,
/// bytes that are no UTF-8 — once per (topic, partition, offset), however often it is
/// re-delivered and recorded.
async fn kafka_dead_letters_keep_messages_once_and_byte_for_byte(store: &dyn Store) {
    let raw: Vec<u8> = b"\x00garbage\xff\xfe{\"id\":\x00}\xc3\x28"
        .iter()
        .copied()
        .chain(0..=255)
        .collect();
    let letter = |partition: i32, offset: i64, message: &[u8], reason: &str, t: i64| {
        KafkaDeadLetter::new(
            "asyncd-topic",
            partition,
            offset,
            message,
            reason.to_string(),
            at(t),
        )
    };
    let first = letter(2, 41, &raw, "not an asyncd task envelope", 10);
    store.record_kafka_dead_letter(&first).await.unwrap();
    // Re-delivered after a crash, recorded again: still one row, the first.
    store
        .record_kafka_dead_letter(&letter(2, 41, b"other", "again", 20))
        .await
        .unwrap();
    // The same offset of another partition, and of another topic, are other messages.
    let other_partition = letter(3, 41, b"", "the message has no value", 30);
    store
        .record_kafka_dead_letter(&other_partition)
        .await
        .unwrap();
    let mut other_topic = letter(2, 41, b"x", "the store refused task t", 40);
    other_topic.topic = "asyncd-other".into();
    store.record_kafka_dead_letter(&other_topic).await.unwrap();

    let listed = store
        .kafka_dead_letters(KafkaDeadLetterParams {
            limit: 10,
            ..KafkaDeadLetterParams::default()
        })
        .await
        .unwrap();
    assert_eq!(
        listed,
        vec![other_topic.clone(), other_partition.clone(), first.clone()],
        "latest first, each once, bytes as recorded"
    );
    assert_eq!(listed[2].message, raw);
    assert_eq!(listed[2].message_size, raw.len() as i64);
    assert_eq!(
        store
            .kafka_dead_letters(KafkaDeadLetterParams {
                limit: 1,
                ..KafkaDeadLetterParams::default()
            })
            .await
            .unwrap(),
        vec![other_topic.clone()],
        "limited"
    );
    // One topic's, and a page after a page's last item.
    let of_topic = KafkaDeadLetterParams {
        topic: Some("asyncd-topic"),
        after: None,
        limit: 10,
    };
    assert_eq!(
        store.kafka_dead_letters(of_topic).await.unwrap(),
        vec![other_partition.clone(), first.clone()]
    );
    fn key(l: &KafkaDeadLetter) -> KafkaDeadLetterKey<'_> {
        KafkaDeadLetterKey {
            recorded_at: l.recorded_at,
            topic: &l.topic,
            partition: l.partition,
            offset: l.offset,
        }
    }
    let next = |after| KafkaDeadLetterParams {
        topic: None,
        after: Some(after),
        limit: 1,
    };
    assert_eq!(
        store
            .kafka_dead_letters(next(key(&other_topic)))
            .await
            .unwrap(),
        vec![other_partition.clone()]
    );
    assert_eq!(
        store
            .kafka_dead_letters(next(key(&other_partition)))
            .await
            .unwrap(),
        vec![first.clone()]
    );

    // Retention: those recorded before the cutoff go, oldest first, `limit` at a time.
    assert_eq!(
        store.purge_kafka_dead_letters(at(30), 10).await.unwrap(),
        1,
        "recorded at 10: before 30"
    );
    assert_eq!(
        store
            .kafka_dead_letters(KafkaDeadLetterParams {
                limit: 10,
                ..KafkaDeadLetterParams::default()
            })
            .await
            .unwrap(),
        vec![other_topic.clone(), other_partition.clone()]
    );
    assert_eq!(store.purge_kafka_dead_letters(at(41), 1).await.unwrap(), 1);
    assert_eq!(
        store
            .kafka_dead_letters(KafkaDeadLetterParams {
                limit: 10,
                ..KafkaDeadLetterParams::default()
            })
            .await
            .unwrap(),
        vec![other_topic],
        "the older one went first"
    );
}
