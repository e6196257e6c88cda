//! The `tasks` table's dead row versions ([`crate::Store::dead_rows`]) and their reclaim
//! ([`crate::Store::reclaim_dead_rows`]): PostgreSQL keeps the versions an update or a
//! delete replaced, and their index entries, until a vacuum.

use sqlx::PgPool;

use crate::{DeadRows, Result};

/// The statistics functions rather than the `pg_stat_user_tables` view, whose joins and
/// grouping cost more than the count. Vacuuming takes the table's owner, the
/// database's, or a superuser: `pg_has_role(…, 'USAGE')` holds for a role with the
/// privileges of the owner, and for a superuser.
pub(super) async fn dead_rows(pool: &PgPool) -> Result<DeadRows> {
    let (live, dead, may_reclaim): (i64, i64, bool) = sqlx::query_as(
        "SELECT pg_stat_get_live_tuples(c.oid), pg_stat_get_dead_tuples(c.oid), \
                pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE') \
         FROM pg_class c, pg_database d \
         WHERE c.oid = 'tasks'::regclass AND d.datname = current_database()",
    )
    .fetch_one(pool)
    .await?;
    Ok(DeadRows {
        live: u64::try_from(live).unwrap_or(0),
        dead: u64::try_from(dead).unwrap_or(0),
        may_reclaim,
    })
}

/// SKIP_LOCKED: a vacuum already at work on the table (autovacuum's, another
/// dispatcher's) is left to it, not waited for. INDEX_CLEANUP ON: the index entries are
/// the point (PostgreSQL may otherwise leave the indexes alone when few pages hold dead
/// rows). TRUNCATE OFF: handing the table's empty tail back to the file system takes a
/// lock that stops every reader and writer of the table while it lasts. The simple
/// query protocol: VACUUM runs in no transaction, not even an implicit one. A vacuum
/// skipped for another's sake says so in a warning, which is no news to the caller: the
/// connection hears errors only while it vacuums.
pub(super) async fn reclaim(pool: &PgPool) -> Result<()> {
    let mut conn = pool.acquire().await?;
    sqlx::raw_sql("SET client_min_messages = error")
        .execute(&mut *conn)
        .await?;
    let vacuumed = sqlx::raw_sql("VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE OFF) tasks")
        .execute(&mut *conn)
        .await;
    sqlx::raw_sql("RESET client_min_messages")
        .execute(&mut *conn)
        .await?;
    vacuumed?;
    Ok(())
}
