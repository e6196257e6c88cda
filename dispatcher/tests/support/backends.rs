//! The servers some tests need — MariaDB, PostgreSQL, Kafka, Toxiproxy — and what such a test does
//! when one is not there.
//!
//! Each server comes from an environment variable holding its address, which
//! `e2e/services/<name>.sh url` prints. Without it a test needing the server returns at
//! once (it passes, having tested nothing there), and the first such test in the process
//! says so on stderr:
//!
//! ```text
//! skipped on MariaDB: ASYNCD_TEST_MYSQL_URL is not set (start it with e2e/services/mariadb.sh start)
//! ```
//!
//! so `cargo test` on a fresh clone passes and shows what it left untested. With
//! `ASYNCD_TEST_REQUIRE_BACKENDS=1` (e2e/run-tests.sh sets it) a missing server fails the
//! test instead, naming the variable: there a skip would let a broken backend pass CI.
//!
//! The asyncd test binaries and kafka-admin's share this file (`#[path]`), so it uses the
//! standard library only.
#![allow(dead_code)] // each binary needs some of the servers

use std::io::Write;
use std::sync::Once;

/// Set to `1` to make a missing server fail the tests that need it.
pub const REQUIRE: &str = "ASYNCD_TEST_REQUIRE_BACKENDS";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    MariaDb,
    Postgres,
    Kafka,
    /// The network-fault proxy (`support/toxiproxy.rs`).
    Toxiproxy,
    /// PostgreSQL and MariaDB servers whose data is on a small file system of their own
    /// (`e2e/services/small-disk.sh`), which a test may fill ([`Service::mount`]).
    SmallDiskPostgres,
    SmallDiskMariaDb,
}

impl Service {
    pub const fn name(self) -> &'static str {
        match self {
            Self::MariaDb => "MariaDB",
            Self::Postgres => "PostgreSQL",
            Self::Kafka => "Kafka",
            Self::Toxiproxy => "Toxiproxy",
            Self::SmallDiskPostgres => "PostgreSQL on a small disk",
            Self::SmallDiskMariaDb => "MariaDB on a small disk",
        }
    }

    /// The variable holding the address: a server URL without a database, Kafka's
    /// bootstrap servers, or Toxiproxy's API URL.
    pub const fn var(self) -> &'static str {
        match self {
            Self::MariaDb => "ASYNCD_TEST_MYSQL_URL",
            Self::Postgres => "ASYNCD_TEST_POSTGRES_URL",
            Self::Kafka => "ASYNCD_TEST_KAFKA_BROKERS",
            Self::Toxiproxy => "ASYNCD_TEST_TOXIPROXY_URL",
            Self::SmallDiskPostgres => "ASYNCD_TEST_SMALL_DISK_POSTGRES_URL",
            Self::SmallDiskMariaDb => "ASYNCD_TEST_SMALL_DISK_MYSQL_URL",
        }
    }

    /// Where a small-disk server's file system is mounted (`…_MOUNT` beside its URL's
    /// variable): a file written there takes the database's space.
    pub fn mount(self) -> Option<String> {
        let var = self.var().strip_suffix("_URL")?;
        std::env::var(format!("{var}_MOUNT")).ok()
    }

    /// The script under e2e/services/ that installs, starts and names the server.
    const fn script(self) -> &'static str {
        match self {
            Self::MariaDb => "e2e/services/mariadb.sh",
            Self::Postgres => "e2e/services/postgres.sh",
            Self::Kafka => "e2e/services/kafka.sh",
            Self::Toxiproxy => "e2e/services/toxiproxy.sh",
            Self::SmallDiskPostgres | Self::SmallDiskMariaDb => "e2e/services/small-disk.sh",
        }
    }

    /// The server's address, or `None` when its variable is not set: the caller skips
    /// what needs the server. Panics instead when [`REQUIRE`] is `1`.
    pub fn address(self) -> Option<String> {
        let value = std::env::var(self.var()).unwrap_or_default();
        if !value.trim().is_empty() {
            return Some(value.trim().to_string());
        }
        let (var, script) = (self.var(), self.script());
        if std::env::var(REQUIRE).is_ok_and(|v| v == "1") {
            panic!(
                "{var} is not set, and {REQUIRE}=1 requires {name}: start it with `{script} \
                 start` and export {var}=$({script} url)",
                name = self.name()
            );
        }
        static SAID: [Once; 6] = [const { Once::new() }; 6];
        SAID[self as usize].call_once(|| {
            // Past the test harness's capture of `eprintln!`, so that it shows for a test
            // that passed.
            let _ = writeln!(
                std::io::stderr(),
                "skipped on {}: {var} is not set (start it with {script} start)",
                self.name()
            );
        });
        None
    }
}
