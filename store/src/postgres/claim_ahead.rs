//! The claim of only the tasks due after now (`ClaimParams::ahead`).

use super::*;

impl PostgresStore {
    /// The claim of only the tasks due after now (`ClaimParams::ahead`): the range of the
    /// types' pending tasks due between now and the horizon (tasks_by_type_state),
    /// sorted. The rank is ordered by as `claim_rank + 0`, which no index serves, so the
    /// planner cannot choose to walk tasks_ranked_by_type in order instead — through
    /// every task already due.
    pub(super) async fn claim_ahead(
        &self,
        params: ClaimParams<'_>,
        types: &[String],
    ) -> Result<Vec<ClaimedTask>> {
        let rows: Vec<ClaimRow> = retrying(Self::transient, || async {
            Ok(sqlx::query_as(concat!(
                "UPDATE tasks SET state = 'claimed', lease_token = lease_token + 1, \
                        owner = $4, lease_until = GREATEST(trigger_at, $5) + $6, \
                        updated_at = $5 \
                 WHERE id = ANY(ARRAY( \
                     SELECT id FROM tasks \
                     WHERE task_type = ANY($2) AND state = 'pending' \
                       AND trigger_at > $5 AND trigger_at <= $1 \
                       AND CASE WHEN EXISTS (SELECT 1 FROM job_pauses p \
                                             WHERE p.task_type = tasks.task_type) \
                                THEN false ELSE true END \
                     ORDER BY claim_rank + 0, id \
                     LIMIT $3 \
                     FOR UPDATE SKIP LOCKED)) \
                 RETURNING ",
                claim_columns!()
            ))
            .bind(params.horizon)
            .bind(types)
            .bind(i64::from(params.limit))
            .bind(params.owner)
            .bind(params.now)
            .bind(duration_ms(params.hold))
            .fetch_all(&self.pool)
            .await?)
        })
        .await?;
        rows::claimed(rows)
    }
}
