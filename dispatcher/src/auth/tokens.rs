//! `--auth tokens`: API tokens from a YAML (or JSON) file, stored as the hex SHA-256 of
//! the token, each scoped to jobs and verbs and optionally expiring:
//!
//! ```yaml
//! tokens:
//!   - name: orders-ci                 # names the caller in logs
//!     sha256: 9f86d081884c7d65…       # asyncd hash-token <TOKEN>
//!     jobs: [order-cancel-job]        # AsyncJobConfig names, or "*"
//!     verbs: [submit, read]           # submit, read, cancel, redrive, pause, or "*"
//!     expires: 2027-01-01T00:00:00Z   # optional
//! ```
//!
//! The file is re-read when its modification time or size changes (checked at most once a
//! second, on a request), so a mounted Secret's update applies without a restart. A file
//! that is deleted, unreadable or invalid revokes every token (fail closed: deleting the
//! file is how an operator pulls all tokens at once) until a valid file is back.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{AuthError, Verb, unauthenticated};

/// How often a request may look at the file's metadata.
const RECHECK: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("--auth-tokens-file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("--auth-tokens-file {file}: {field}: {message}")]
    Invalid {
        file: PathBuf,
        field: String,
        message: String,
    },
}

/// The hex SHA-256 of a token, as the file stores it (`asyncd hash-token`).
pub fn hash(token: &str) -> String {
    format!("{:x}", Sha256::digest(token.as_bytes()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    tokens: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    sha256: String,
    jobs: Vec<String>,
    verbs: Vec<String>,
    #[serde(default)]
    expires: Option<DateTime<Utc>>,
}

/// What one token may do.
#[derive(Debug)]
pub struct Grant {
    pub name: String,
    /// `None`: every job.
    jobs: Option<Vec<String>>,
    submit: bool,
    read: bool,
    cancel: bool,
    redrive: bool,
    pause: bool,
    purge: bool,
    expires: Option<DateTime<Utc>>,
}

impl Grant {
    pub fn allows(&self, verb: Verb, job: Option<&str>) -> bool {
        let verb_ok = match verb {
            Verb::Submit => self.submit,
            Verb::Get | Verb::ListDeadLetters => self.read,
            Verb::Cancel => self.cancel,
            Verb::Redrive => self.redrive,
            Verb::Pause => self.pause,
            Verb::Purge => self.purge,
        };
        let job_ok = match (&self.jobs, job) {
            (None, _) => true,
            (Some(jobs), Some(job)) => jobs.iter().any(|j| j == job),
            (Some(_), None) => false,
        };
        verb_ok && job_ok
    }
}

fn parse(file: &Path, text: &str) -> Result<HashMap<String, Arc<Grant>>, TokenFileError> {
    let invalid = |field: String, message: String| TokenFileError::Invalid {
        file: file.to_path_buf(),
        field,
        message,
    };
    let doc: FileDoc =
        serde_yaml::from_str(text).map_err(|e| invalid("document".into(), e.to_string()))?;
    let mut grants = HashMap::new();
    for (i, entry) in doc.tokens.into_iter().enumerate() {
        let at = |field: &str| format!("tokens[{i}].{field}");
        if entry.name.trim().is_empty() {
            return Err(invalid(at("name"), "must not be empty".into()));
        }
        let sha = entry.sha256.trim().to_ascii_lowercase();
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid(
                at("sha256"),
                "must be the 64 hex digits of the token's SHA-256 (asyncd hash-token TOKEN)".into(),
            ));
        }
        if entry.jobs.is_empty() {
            return Err(invalid(
                at("jobs"),
                "must name at least one job, or \"*\"".into(),
            ));
        }
        let mut verbs = [false; 6];
        if entry.verbs.is_empty() {
            return Err(invalid(
                at("verbs"),
                "must name at least one verb, or \"*\"".into(),
            ));
        }
        for verb in &entry.verbs {
            match verb.as_str() {
                "submit" => verbs[0] = true,
                "read" => verbs[1] = true,
                "cancel" => verbs[2] = true,
                "redrive" => verbs[3] = true,
                "pause" => verbs[4] = true,
                "purge" => verbs[5] = true,
                "*" => verbs = [true; 6],
                other => {
                    return Err(invalid(
                        at("verbs"),
                        format!(
                            "{other:?} is not one of submit, read, cancel, redrive, pause, purge, \"*\""
                        ),
                    ));
                }
            }
        }
        let grant = Grant {
            name: entry.name,
            jobs: (!entry.jobs.iter().any(|j| j == "*")).then_some(entry.jobs),
            submit: verbs[0],
            read: verbs[1],
            cancel: verbs[2],
            redrive: verbs[3],
            pause: verbs[4],
            purge: verbs[5],
            expires: entry.expires,
        };
        if grants.insert(sha, Arc::new(grant)).is_some() {
            return Err(invalid(
                at("sha256"),
                "the same token is listed twice".into(),
            ));
        }
    }
    Ok(grants)
}

/// What the file's metadata looked like when it was last read.
type Stamp = (Option<SystemTime>, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok(), meta.len()))
}

struct Loaded {
    grants: HashMap<String, Arc<Grant>>,
    stamp: Option<Stamp>,
    checked: Instant,
    /// The last read failed, so `grants` is empty. The file is then read at every check,
    /// changed or not: a permission fixed with `chmod` changes neither size nor mtime.
    revoked: bool,
}

pub struct TokenFile {
    path: PathBuf,
    loaded: Mutex<Loaded>,
}

impl TokenFile {
    /// Reads the file now; an unreadable or invalid file stops start-up.
    pub fn open(path: PathBuf) -> Result<Self, TokenFileError> {
        let stamp = stamp(&path);
        let text =
            std::fs::read_to_string(&path).map_err(|e| TokenFileError::Read(path.clone(), e))?;
        let grants = parse(&path, &text)?;
        tracing::info!(file = %path.display(), tokens = grants.len(), "API tokens loaded");
        Ok(Self {
            path,
            loaded: Mutex::new(Loaded {
                grants,
                stamp,
                checked: Instant::now(),
                revoked: false,
            }),
        })
    }

    fn reload_if_changed(&self, loaded: &mut Loaded) {
        if loaded.checked.elapsed() < RECHECK {
            return;
        }
        loaded.checked = Instant::now();
        let now = stamp(&self.path);
        if now == loaded.stamp && !loaded.revoked {
            return;
        }
        loaded.stamp = now;
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| TokenFileError::Read(self.path.clone(), e));
        match text.and_then(|text| parse(&self.path, &text)) {
            Ok(grants) => {
                tracing::info!(file = %self.path.display(), tokens = grants.len(), "API tokens reloaded");
                loaded.grants = grants;
                loaded.revoked = false;
            }
            Err(err) => {
                // Logged once per failure, not at every recheck while it lasts.
                if !loaded.revoked {
                    tracing::error!(
                        %err,
                        "every API token revoked: the tokens file is missing, unreadable or \
                         invalid; all requests are refused until it is valid again"
                    );
                }
                loaded.grants.clear();
                loaded.revoked = true;
            }
        }
    }

    pub fn authenticate(&self, token: &str) -> Result<Arc<Grant>, AuthError> {
        // Looked up by hash: the table holds no token, and the lookup's timing depends on
        // the hash of what the caller sent, which tells them nothing about stored tokens.
        let key = hash(token);
        let (grant, revoked) = {
            let mut loaded = self.loaded.lock().expect("token file lock");
            self.reload_if_changed(&mut loaded);
            (loaded.grants.get(&key).cloned(), loaded.revoked)
        };
        let grant = grant.ok_or_else(|| {
            unauthenticated(if revoked {
                "no token is accepted: the server's tokens file is missing or invalid"
            } else {
                "unknown bearer token"
            })
        })?;
        if grant.expires.is_some_and(|at| at <= Utc::now()) {
            tracing::info!(token = %grant.name, "expired API token refused");
            return Err(unauthenticated("the bearer token has expired"));
        }
        Ok(grant)
    }

    #[cfg(test)]
    fn force_recheck(&self) {
        self.loaded.lock().unwrap().checked -= RECHECK;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
tokens:
  - {name: a, sha256: "HASH_A", jobs: [job-a], verbs: [submit, read]}
  - {name: all, sha256: "HASH_ALL", jobs: ["*"], verbs: ["*"]}
  - {name: old, sha256: "HASH_OLD", jobs: ["*"], verbs: ["*"], expires: "2020-01-01T00:00:00Z"}
"#;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("tokens.yaml");
        let text = text
            .replace("HASH_ALL", &hash("t-all"))
            .replace("HASH_A", &hash("t-a"))
            .replace("HASH_OLD", &hash("t-old"));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn tokens_are_matched_by_hash_scoped_and_expire() {
        assert_eq!(
            hash("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = TokenFile::open(write(dir.path(), FILE)).unwrap();
        let a = file.authenticate("t-a").unwrap();
        assert!(a.allows(Verb::Submit, Some("job-a")));
        assert!(a.allows(Verb::ListDeadLetters, Some("job-a")));
        assert!(!a.allows(Verb::Cancel, Some("job-a")));
        assert!(!a.allows(Verb::Submit, Some("job-b")));
        assert!(!a.allows(Verb::Get, None), "not every job");
        assert!(
            !a.allows(Verb::Pause, Some("job-a")),
            "pause is a verb of its own"
        );
        let all = file.authenticate("t-all").unwrap();
        assert!(all.allows(Verb::Redrive, None));
        assert!(
            all.allows(Verb::Pause, Some("job-a")),
            "\"*\" includes pause"
        );
        let dir2 = tempfile::tempdir().unwrap();
        let pauser = TokenFile::open(write(
            dir2.path(),
            "tokens:\n  - {name: p, sha256: \"HASH_A\", jobs: [job-a], verbs: [pause]}\n",
        ))
        .unwrap()
        .authenticate("t-a")
        .unwrap();
        assert!(pauser.allows(Verb::Pause, Some("job-a")));
        assert!(!pauser.allows(Verb::Submit, Some("job-a")));
        assert!(!pauser.allows(Verb::Pause, Some("job-b")));
        for refused in ["t-old", "nope", &hash("t-a")] {
            let err = file.authenticate(refused).unwrap_err();
            assert!(matches!(err, AuthError::Unauthenticated(_)), "{refused}");
        }
        assert!(
            file.authenticate("t-old")
                .unwrap_err()
                .to_string()
                .contains("expired")
        );
    }

    #[test]
    fn the_file_is_reloaded_when_it_changes_and_a_bad_or_missing_one_revokes_every_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), FILE);
        let file = TokenFile::open(path.clone()).unwrap();
        file.authenticate("t-a").unwrap();
        // A different size is a change even where mtime has a coarse resolution.
        write(
            dir.path(),
            "tokens:\n  - {name: all, sha256: \"HASH_ALL\", jobs: [\"*\"], verbs: [read]}\n",
        );
        file.force_recheck();
        assert!(file.authenticate("t-a").is_err(), "removed token refused");
        let all = file.authenticate("t-all").unwrap();
        assert!(!all.allows(Verb::Submit, Some("x")), "new scope applies");

        std::fs::write(&path, "tokens: [{name: broken}]").unwrap();
        file.force_recheck();
        let err = file.authenticate("t-all").unwrap_err();
        assert!(err.to_string().contains("missing or invalid"), "{err}");

        write(dir.path(), FILE);
        file.force_recheck();
        file.authenticate("t-all")
            .expect("a valid file restores the tokens");

        std::fs::remove_file(&path).unwrap();
        file.force_recheck();
        assert!(
            file.authenticate("t-all").is_err(),
            "a deleted file revokes"
        );
        file.force_recheck();
        assert!(file.authenticate("t-all").is_err(), "and keeps revoking");

        write(dir.path(), FILE);
        file.force_recheck();
        file.authenticate("t-a").expect("back once the file is");
    }

    #[test]
    fn a_revoked_file_is_read_again_even_when_its_size_and_mtime_say_unchanged() {
        // As after `chmod` fixes an unreadable file: nothing in the metadata moves.
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), FILE);
        let valid = std::fs::read_to_string(&path).unwrap();
        let file = TokenFile::open(path.clone()).unwrap();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let put = |text: &str| {
            std::fs::write(&path, text).unwrap();
            let handle = std::fs::File::options().write(true).open(&path).unwrap();
            handle.set_modified(at).unwrap();
        };
        put(&valid.replacen("tokens:", "tokenz:", 1));
        file.force_recheck();
        assert!(file.authenticate("t-a").is_err(), "invalid revokes");
        put(&valid);
        file.force_recheck();
        file.authenticate("t-a")
            .expect("the same stamp, but valid now");
    }

    #[test]
    fn invalid_files_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        for (text, field) in [
            (
                "tokens: [{name: x, sha256: abc, jobs: [a], verbs: [read]}]",
                "tokens[0].sha256",
            ),
            (
                "tokens: [{name: x, sha256: HASH_A, jobs: [], verbs: [read]}]",
                "tokens[0].jobs",
            ),
            (
                "tokens: [{name: x, sha256: HASH_A, jobs: [a], verbs: [write]}]",
                "tokens[0].verbs",
            ),
            (
                "tokens: [{name: x, sha256: HASH_A, jobs: [a], verbs: [read], expires: soon}]",
                "document",
            ),
            (
                "tokens: [{name: x, sha256: HASH_A, jobs: [a], verbs: [read]}, {name: y, sha256: HASH_A, jobs: [a], verbs: [read]}]",
                "tokens[1].sha256",
            ),
        ] {
            let err = TokenFile::open(write(dir.path(), text))
                .err()
                .expect(text)
                .to_string();
            assert!(err.contains(field), "{text}: {err}");
        }
        let err = TokenFile::open(dir.path().join("missing")).err().unwrap();
        assert!(err.to_string().contains("--auth-tokens-file"), "{err}");
    }
}
