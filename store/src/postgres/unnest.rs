//! New task rows by one `INSERT … SELECT … FROM UNNEST(…)`: each column's values bound as
//! one array, so a run of any length is the same statement, prepared once per
//! connection, and one round trip. A multi-row `VALUES` insert is another statement
//! text for every row count, and so was cut into multiples of 16 rows: two statements
//! for most group commits.

use sqlx::PgConnection;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;

use crate::Result;
use crate::shared::insert_columns;
use crate::task_row::{CLAIMED_AT_INSERT_TOKEN, TaskValues};

/// `INSERT INTO tasks … SELECT * FROM UNNEST(…)`, the arrays' element types in
/// [`insert_columns`]' order, then whatever follows (a literal).
macro_rules! insert_unnest {
    ($($tail:literal)?) => {
        concat!(
            "INSERT INTO tasks (",
            insert_columns!(),
            ") SELECT * FROM UNNEST(\
             $1::text[], $2::text[], $3::text[], $4::text[], $5::int2[], $6::int8[], $7::int8[], \
             $8::int8[], $9::text[], $10::text[], $11::text[], $12::int8[], $13::text[], $14::text[], \
             $15::text[], $16::int8[], $17::int8[], $18::text[], $19::text[], $20::text[], \
             $21::text[], $22::int8[], $23::text[], $24::int8[], $25::int8[])"
            $(, $tail)?
        )
    };
}

const INSERT_UNNEST: &str = insert_unnest!();

/// [`INSERT_UNNEST`], each row whose id or key is taken left out.
const INSERT_UNNEST_LEAVING_OUT: &str = insert_unnest!(" ON CONFLICT DO NOTHING RETURNING id");

/// Writes `rows` in one statement ([`Dialect::load_tasks`](crate::tx::Dialect::load_tasks)
/// below `COPY`'s threshold): a taken id fails it, as it fails `COPY`.
pub(super) async fn load_tasks(conn: &mut PgConnection, rows: &[TaskValues<'_>]) -> Result<()> {
    bind_rows(sqlx::query(INSERT_UNNEST), rows)
        .execute(conn)
        .await?;
    Ok(())
}

/// Writes `rows` in one statement, leaving out each whose id or key is taken; the ids
/// of those written.
pub(super) async fn insert_leaving_out(
    conn: &mut PgConnection,
    rows: &[TaskValues<'_>],
) -> Result<Vec<String>> {
    let ids = bind_rows(sqlx::query(INSERT_UNNEST_LEAVING_OUT), rows)
        .fetch_all(conn)
        .await?
        .iter()
        .map(|row| sqlx::Row::try_get(row, 0))
        .collect::<std::result::Result<_, _>>()?;
    Ok(ids)
}

/// `query` with one array per column of `rows`.
fn bind_rows<'q>(
    query: Query<'q, sqlx::Postgres, PgArguments>,
    rows: &'q [TaskValues<'q>],
) -> Query<'q, sqlx::Postgres, PgArguments> {
    fn column<'q, T>(
        rows: &'q [TaskValues<'q>],
        value: impl Fn(&'q TaskValues<'q>) -> T,
    ) -> Vec<T> {
        rows.iter().map(value).collect()
    }
    let now = column(rows, |v| v.now.as_i64());
    query
        .bind(column(rows, |v| v.id))
        .bind(column(rows, |v| v.task_type))
        .bind(column(rows, |v| v.payload))
        .bind(column(rows, |v| v.state.as_str()))
        .bind(column(rows, |v| v.priority))
        .bind(column(rows, |v| v.trigger_at.as_i64()))
        .bind(column(rows, |v| v.max_retries))
        .bind(column(rows, |v| v.timeout_ms))
        .bind(column(rows, |v| v.idempotency_key))
        .bind(column(rows, |v| v.unique_key))
        .bind(column(rows, |v| v.unique_active))
        .bind(column(rows, |v| v.unique_for))
        .bind(column(rows, |v| v.cron_key))
        .bind(column(rows, |v| v.source_service))
        .bind(column(rows, |v| v.last_error))
        .bind(now.clone())
        .bind(now)
        .bind(column(rows, |v| v.lease_secret.as_str()))
        .bind(column(rows, |v| v.concurrency_key))
        .bind(column(rows, |v| v.traceparent.as_deref()))
        .bind(column(rows, |v| v.tracestate))
        .bind(column(rows, |v| v.expires_at.map(|at| at.as_i64())))
        .bind(column(rows, |v| v.claim.map(|(owner, _)| owner)))
        .bind(column(rows, |v| v.claim.map(|(_, until)| until.as_i64())))
        .bind(column(rows, |v| match v.claim {
            Some(_) => CLAIMED_AT_INSERT_TOKEN,
            None => 0,
        }))
}
