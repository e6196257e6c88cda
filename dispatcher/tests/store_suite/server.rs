//! The database servers the suite runs on besides SQLite: MariaDB and PostgreSQL, each
//! from the environment, skipped without it ([`crate::backends`]).

use asyncd_store::{self as store, Store};

use crate::backends::Service;

/// A database server for the backend tests: a URL without a database.
pub struct Server {
    url: String,
    postgres: bool,
    /// Databases this test created, dropped when it passes (a failed test leaves them
    /// for inspection; names are unique, so they never disturb a later run).
    created: std::sync::Mutex<Vec<String>>,
}

impl Server {
    /// The MariaDB server, if it is there.
    pub fn mariadb() -> Option<Self> {
        Self::of(Service::MariaDb)
    }

    /// The PostgreSQL server, if it is there.
    pub fn postgres() -> Option<Self> {
        Self::of(Service::Postgres)
    }

    fn of(service: Service) -> Option<Self> {
        Some(Self {
            url: service.address()?.trim_end_matches('/').to_string(),
            postgres: service == Service::Postgres,
            created: Default::default(),
        })
    }

    /// Runs one statement as the test user, on the server's maintenance database.
    async fn admin(&self, sql: String) {
        self.try_admin(sql).await.unwrap();
    }

    async fn try_admin(&self, sql: String) -> Result<(), sqlx::Error> {
        use sqlx::Connection;
        let sql = sqlx::AssertSqlSafe(sql);
        if self.postgres {
            let options: sqlx::postgres::PgConnectOptions = self.url.parse().unwrap();
            let mut conn = sqlx::PgConnection::connect_with(&options.database("postgres"))
                .await
                .unwrap_or_else(|e| panic!("cannot reach {}: {e}", self.url));
            sqlx::query(sql).execute(&mut conn).await?;
        } else {
            let mut conn = sqlx::MySqlConnection::connect(&self.url)
                .await
                .unwrap_or_else(|e| panic!("cannot reach {}: {e}", self.url));
            sqlx::query(sql).execute(&mut conn).await?;
        }
        Ok(())
    }

    /// Creates a fresh, empty database and returns its URL.
    pub async fn create_db(&self) -> String {
        let name = format!("asyncd_t_{}", uuid::Uuid::now_v7().simple());
        self.admin(if self.postgres {
            format!("CREATE DATABASE {name}")
        } else {
            format!("CREATE DATABASE {name} CHARACTER SET utf8mb4")
        })
        .await;
        self.created.lock().unwrap().push(name.clone());
        // Any query string (sslmode=…) stays after the database name.
        match self.url.split_once('?') {
            Some((base, query)) => format!("{base}/{name}?{query}"),
            None => format!("{}/{name}", self.url),
        }
    }

    pub async fn drop_created(&self) {
        let names = std::mem::take(&mut *self.created.lock().unwrap());
        for name in names {
            let dropped = self
                .try_admin(if self.postgres {
                    // FORCE: pools of finished scenarios may still hold idle connections.
                    format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                } else {
                    format!("DROP DATABASE IF EXISTS {name}")
                })
                .await;
            // Cleanup only: the scenario passed. PostgreSQL refuses FORCE when a process
            // the test user may not signal (an autovacuum worker) is on the database;
            // the name is unique, so a database left behind disturbs no later run.
            if let Err(err) = dropped {
                eprintln!("left database {name} behind: {err}");
            }
        }
    }

    /// Runs one scenario on a fresh, migrated database.
    pub async fn run<F>(&self, scenario: F)
    where
        F: for<'a> AsyncFn(&'a dyn Store),
    {
        let store = store::open(&self.create_db().await).await.unwrap();
        store.migrate().await.unwrap();
        scenario(store.as_ref()).await;
        drop(store);
        self.drop_created().await;
    }
}

/// A transaction of its own on database `url` holding the row locks `lock` (a `SELECT …
/// FOR UPDATE`) took, as another dispatcher's write would, until [`Held::release`].
pub enum Held {
    Postgres(sqlx::PgConnection),
    MariaDb(sqlx::MySqlConnection),
}

impl Held {
    pub async fn take(url: &str, lock: &'static str) -> Self {
        use sqlx::Connection;
        if url.starts_with("postgres") {
            let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
            sqlx::query(lock).execute(&mut conn).await.unwrap();
            Self::Postgres(conn)
        } else {
            let mut conn = sqlx::MySqlConnection::connect(url).await.unwrap();
            sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
            sqlx::query(lock).execute(&mut conn).await.unwrap();
            Self::MariaDb(conn)
        }
    }

    pub async fn release(self) {
        match self {
            Self::Postgres(mut conn) => {
                sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
            }
            Self::MariaDb(mut conn) => {
                sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
            }
        }
    }
}
