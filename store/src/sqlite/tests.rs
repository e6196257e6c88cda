use super::*;

/// A database in memory with every migration applied, on one connection: what the plan
/// tests read `EXPLAIN QUERY PLAN` from.
pub(crate) async fn migrated_in_memory() -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect("sqlite::memory:")
        .await
        .unwrap();
    sqlx::migrate!("./migrations/sqlite")
        .run(&pool)
        .await
        .unwrap();
    pool
}

/// Writes reach the database file without the writer checkpointing: the log's
/// pages are copied in beside it, long before the writer's own checkpoint at
/// [`WRITER_CHECKPOINT_PAGES`].
#[tokio::test]
async fn the_log_is_copied_into_the_database_beside_the_writer() {
    let dir = std::env::temp_dir().join(format!(
        "asyncd-checkpoint-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("asyncd.db");
    let store = SqliteStore::open(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let file_size = || std::fs::metadata(&db).unwrap().len();
    let before = file_size();
    // About 500 pages of log: an eighth of the writer's own threshold.
    let message = vec![b'x'; 4000];
    let mut tx = store.writer.begin().await.unwrap();
    sqlx::query("CREATE TABLE filler (n INTEGER PRIMARY KEY, body BLOB)")
        .execute(&mut *tx)
        .await
        .unwrap();
    for n in 0..500 {
        sqlx::query("INSERT INTO filler (n, body) VALUES (?, ?)")
            .bind(n)
            .bind(&message)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while file_size() < before + 500 * 4000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the database file stayed at {} bytes (from {before})",
            file_size()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The backlog gauges' frequent pass reads only the due end of each range: with a
/// million tasks waiting for later, an idle queue costs it nothing.
#[tokio::test]
async fn the_due_backlog_reads_only_what_is_due() {
    let pool = migrated_in_memory().await;
    let params = crate::JobCountParams {
        task_type: "t",
        now: crate::Millis::new(0),
        finished_since: crate::Millis::new(0),
        cap: 10,
    };
    let query = crate::job_counts::figures_query::<Sqlite>(
        &crate::job_counts::due_figures(params.now),
        params,
    );
    let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "EXPLAIN QUERY PLAN {}",
        query.sql().as_str()
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    let searches: Vec<&str> = plan
        .iter()
        .map(|row| row.3.as_str())
        .filter(|d| d.contains("tasks"))
        .collect();
    assert_eq!(searches.len(), 3, "{plan:?}");
    for search in searches {
        assert!(
            search.contains("INDEX tasks_by_type_state (task_type=? AND state=? AND trigger_at<?)"),
            "{search}"
        );
    }
}

/// The plan SQLite (the version sqlx bundles) chooses for each hot statement: every
/// named task reached by primary key, none by walking a state; the claims and the
/// dead-letter listing by their partial indexes, in order, with no sort; the start's
/// counts of running attempts and the unique keys by their partial indexes.
#[tokio::test]
async fn hot_statements_use_the_indexes_meant_for_them() {
    let pool = migrated_in_memory().await;
    let by_id = "SEARCH tasks USING INDEX sqlite_autoindex_tasks_1 (id=?)";
    let ranked = "SEARCH tasks USING INDEX tasks_ranked_by_type (task_type=? AND claim_rank<?)";
    let several_types = claim::claim_due_sql(3);
    let one_type = claim::claim_due_sql(1);
    let running_per_key = format!(
        "{}?{}?, ?) GROUP BY concurrency_key",
        crate::sql_store::RUNNING_PER_KEY.0,
        crate::sql_store::RUNNING_PER_KEY.1
    );
    for (name, statement, expected) in [
        ("CLAIM_NAMED", CLAIM_NAMED, by_id),
        ("START_BATCH", START_BATCH, by_id),
        ("FINISH_SUCCESSES", FINISH_SUCCESSES, by_id),
        (
            "FINISH_SUCCESSES, its dependents",
            FINISH_SUCCESSES,
            "SEARCH task_deps USING COVERING INDEX task_deps_reverse (depends_on=?)",
        ),
        (
            "limits_and_running",
            QUERIES.limits_and_running.expect("one statement on SQLite"),
            "SEARCH tasks USING COVERING INDEX tasks_by_type_state (task_type=? AND state=?)",
        ),
        ("FREE_UNIQUE_KEYS", FREE_UNIQUE_KEYS, by_id),
        (
            "expirable",
            QUERIES.expirable,
            "SEARCH tasks USING INDEX tasks_expiring (expires_at>? AND expires_at<?)",
        ),
        ("expire", QUERIES.expire, by_id),
        ("RELEASE_DEPENDENTS", RELEASE_DEPENDENTS, by_id),
        ("FAIL_BLOCKED_DEPENDENTS", FAIL_BLOCKED_DEPENDENTS, by_id),
        (
            "dead_letters",
            QUERIES.dead_letters,
            // The cursor's `OR` bounds no range: the dead letters in listing order,
            // stopped at the page's end.
            "SCAN tasks USING INDEX tasks_dead_due",
        ),
        (
            "running",
            QUERIES.running,
            "SEARCH tasks USING COVERING INDEX tasks_by_type_state (task_type=? AND state=?)",
        ),
        (
            "RUNNING_PER_KEY",
            running_per_key.as_str(),
            "SEARCH tasks USING INDEX tasks_keyed (task_type=? AND concurrency_key=?)",
        ),
        (
            "holder_by_unique_key",
            QUERIES.holder_by_unique_key,
            "SEARCH tasks USING INDEX tasks_unique_active (unique_active=? AND task_type=?)",
        ),
        (
            "lapsed_leases",
            QUERIES.lapsed_leases,
            "SEARCH tasks USING INDEX tasks_lease (lease_until<?)",
        ),
        (
            "release_claims",
            QUERIES.release_claims,
            "SEARCH tasks USING INDEX tasks_lease (lease_until>?)",
        ),
        (
            "purgeable",
            QUERIES.purgeable,
            "SEARCH tasks USING INDEX tasks_finished (task_type=? AND state=? AND updated_at<?)",
        ),
        (
            "purgeable, its expired branch",
            QUERIES.purgeable,
            "SEARCH tasks USING INDEX tasks_expired (task_type=? AND updated_at<?)",
        ),
        ("claim of several types", &*several_types, ranked),
        ("claim of one type", &*one_type, ranked),
        (
            "claim of every type: the types",
            claim::PENDING_TYPES,
            "SEARCH t USING COVERING INDEX tasks_ranked_by_type (task_type>?)",
        ),
        (
            "CLAIM_AHEAD_ONE_TYPE",
            CLAIM_AHEAD_ONE_TYPE,
            "SEARCH tasks USING INDEX tasks_by_type_state (task_type=? AND state=? AND trigger_at>? AND trigger_at<?)",
        ),
        (
            "next_pending_eta",
            QUERIES.next_pending_eta,
            "SEARCH tasks USING COVERING INDEX tasks_by_type_state (task_type=? AND state=? AND trigger_at>? AND trigger_at<?)",
        ),
        (
            "due_exists",
            QUERIES.due_exists,
            "SEARCH tasks USING INDEX tasks_ranked_by_type (task_type=? AND claim_rank<?)",
        ),
        (
            "START_DUE",
            START_DUE,
            "SEARCH tasks USING INDEX tasks_ranked_by_type (task_type=? AND claim_rank<?)",
        ),
    ] {
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "EXPLAIN QUERY PLAN {statement}"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        let details: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
        assert!(details.contains(&expected), "{name}: {details:?}");
        assert!(
            !details.iter().any(|d| d.contains("(state=?)")),
            "{name} walks a state: {details:?}"
        );
        // The claim ahead sorts the window between now and the horizon, not a walk;
        // the purge sorts what its branches picked, at most twice its limit, and the claim
        // of several types what each type gave, at most the limit each.
        assert!(
            name.starts_with("CLAIM_AHEAD")
                || name.starts_with("purgeable")
                || name == "claim of several types"
                || !details.iter().any(|d| d.contains("TEMP B-TREE")),
            "{name} sorts: {details:?}"
        );
    }
}
