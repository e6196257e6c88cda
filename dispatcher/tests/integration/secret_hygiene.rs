//! The store URL's password never leaves the process: the real `asyncd` binary, started
//! with a password-bearing store URL that fails in every way we can provoke (malformed,
//! unsupported, wrong password against the real MariaDB and PostgreSQL, unreachable
//! host, from the environment and from a file), logs at debug level, and the password
//! is in no line of its stdout or stderr and not in its `/proc/<pid>/cmdline`. The cases
//! against a server run when the server is there ([`crate::support::backends`]).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::Service;

const DEADLINE: Duration = Duration::from_secs(60);

/// The server of `service`, if it is there.
fn server_url(service: Service) -> Option<reqwest::Url> {
    Some(reqwest::Url::parse(&service.address()?).unwrap())
}

/// `base` (a server of the test bed) with this user, password and database.
fn with_password(base: &reqwest::Url, password: &str) -> String {
    let mut url = base.clone();
    url.set_password(Some(password)).unwrap();
    url.set_path("/asyncd");
    url.to_string()
}

fn closed_port() -> u16 {
    // Bound and released: nothing listens there for the few seconds of the test.
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Variables set on the process.
type Env<'a> = Vec<(&'a str, String)>;

struct Run {
    output: String,
    cmdline: Vec<String>,
}

/// Runs `asyncd ARGS` with `env` until it exits (it must fail), reading its command line
/// while it runs.
fn run(dir: &Path, args: &[&str], env: &[(&str, String)]) -> Run {
    let out = dir.join(format!("out-{}.log", uuid::Uuid::now_v7().simple()));
    let file = std::fs::File::create(&out).unwrap();
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_asyncd"))
        .args(args)
        .env_remove("ASYNCD_STORE")
        .env_remove("ASYNCD_STORE_FILE")
        .env("ASYNCD_LOG", "debug")
        .env("NO_COLOR", "1")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("asyncd runs");
    // Read while the process lives, once it has exec'd asyncd (before, it is a copy of
    // this test; after exit, a zombie whose cmdline reads empty).
    let binary = env!("CARGO_BIN_EXE_asyncd");
    let mut cmdline: Vec<String> = Vec::new();
    let started = Instant::now();
    let status = loop {
        let now: Vec<String> = std::fs::read(format!("/proc/{}/cmdline", child.id()))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if now.first().map(String::as_str) == Some(binary) {
            cmdline = now;
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > DEADLINE {
            child.kill().unwrap();
            panic!("asyncd {args:?} did not exit within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(&out).unwrap();
    assert!(!status.success(), "asyncd {args:?} should fail: {output}");
    Run { output, cmdline }
}

#[test]
fn the_store_password_is_in_no_log_line_and_no_argument() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    let jobs = jobs.to_str().unwrap().to_string();
    // Unique and recognisable; the '@' is written percent-encoded in the URLs, so both
    // the raw and the decoded form are looked for.
    let secret = format!("Pw{}Secret", uuid::Uuid::now_v7().simple());
    let encoded = format!("{secret}%40x");
    let mysql = server_url(Service::MariaDb);
    let postgres = server_url(Service::Postgres);
    let password_file = dir.path().join("store-url");

    let mut cases: Vec<(&str, Env, &str)> = vec![
        (
            "unsupported scheme",
            vec![(
                "ASYNCD_STORE",
                format!("postgress://asyncd:{encoded}@127.0.0.1:1/asyncd"),
            )],
            "is not supported",
        ),
        (
            "malformed port",
            vec![(
                "ASYNCD_STORE",
                format!("mysql://asyncd:{encoded}@127.0.0.1:notaport/asyncd"),
            )],
            "invalid port",
        ),
        (
            "unreachable host",
            vec![
                (
                    "ASYNCD_STORE",
                    format!(
                        "postgres://asyncd:{encoded}@127.0.0.1:{}/asyncd",
                        closed_port()
                    ),
                ),
                ("ASYNCD_STORE_WAIT", "3s".into()),
            ],
            "store unavailable at start",
        ),
    ];
    if let Some(mysql) = &mysql {
        std::fs::write(&password_file, with_password(mysql, &encoded) + "\n").unwrap();
        cases.push((
            "wrong password, MariaDB",
            vec![("ASYNCD_STORE", with_password(mysql, &encoded))],
            "Access denied",
        ));
        cases.push((
            "wrong password from ASYNCD_STORE_FILE",
            vec![("ASYNCD_STORE_FILE", password_file.display().to_string())],
            "Access denied",
        ));
    }
    if let Some(postgres) = &postgres {
        cases.push((
            "wrong password, PostgreSQL",
            vec![("ASYNCD_STORE", with_password(postgres, &encoded))],
            "password authentication failed",
        ));
    }
    let decoded = format!("{secret}@x");
    for (name, env, expected) in &cases {
        for role in ["api", "migrate"] {
            let args: Vec<&str> = match role {
                "api" => vec!["api", "--config", jobs.as_str(), "--listen", "127.0.0.1:0"],
                _ => vec!["migrate"],
            };
            let outcome = run(dir.path(), &args, env);
            // the failure we meant to provoke, so the check below is not vacuous
            assert!(
                outcome.output.contains(expected),
                "{role}, {name}: expected {expected:?} in:\n{}",
                outcome.output
            );
            for line in outcome.output.lines() {
                assert!(
                    !line.contains(&secret),
                    "{role}, {name}: the password is in a log line: {line}"
                );
            }
            assert!(
                !outcome.output.contains(&decoded),
                "{role}, {name}: {}",
                outcome.output
            );
            assert!(
                outcome.cmdline.iter().all(|arg| !arg.contains(&secret)),
                "{role}, {name}: the password is in argv: {:?}",
                outcome.cmdline
            );
            if *name == "unreachable host" {
                // alive for the store wait: the command line was read from the process
                assert_eq!(outcome.cmdline.get(1).map(String::as_str), Some(role));
            }
        }
    }
}

#[test]
fn help_does_not_show_the_store_url_from_the_environment() {
    let secret = format!("Pw{}Secret", uuid::Uuid::now_v7().simple());
    for role in ["api", "dispatcher", "scheduler", "migrate"] {
        let out = Command::new(env!("CARGO_BIN_EXE_asyncd"))
            .args([role, "--help"])
            .env(
                "ASYNCD_STORE",
                format!("postgres://asyncd:{secret}@db/asyncd"),
            )
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("ASYNCD_STORE"), "{role}: {text}");
        assert!(
            !text.contains(&secret),
            "{role} --help shows the URL: {text}"
        );
    }
}
