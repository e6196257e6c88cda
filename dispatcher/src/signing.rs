//! The keys a job's executor calls are signed with (`spec.executor.signing`).
//!
//! Each key is a file, `<signing dir>/<secret name>/<key>`: in a cluster the operator
//! mounts the job's own Secret at `<signing dir>/<secret name>` (optional, so a pod
//! starts while the Secret is missing, and the kubelet fills the directory once it
//! exists and refreshes it when it changes); outside a cluster the files are written by
//! hand. Files are re-read at most every [`RELOAD`], so a rotated key is used within
//! seconds of the kubelet writing it, without a restart.
//!
//! A job whose secret or any of its listed keys is missing or empty is not dispatched:
//! the dispatcher neither claims its tasks nor begins attempts of those it holds, so they
//! wait, pending, until the keys appear. A warning names the job and the file at fault
//! when it becomes unavailable, `asyncd_signing_unavailable{job}` is 1 meanwhile, and
//! `/readyz` answers 503 `signing_unavailable` with the same reason ([`SigningStatus`]),
//! so the pod shows not Ready and `kubectl describe` / a probe of `/readyz` says why.
//! A job with no signing configured sends unsigned calls; one warning per job says so.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asyncd_spec::Job;
use asyncd_spec::job::Signing;
use prometheus::IntGaugeVec;

/// How long a read of a job's key files is reused.
pub const RELOAD: Duration = Duration::from_secs(5);

/// The default `--signing-dir`, where the operator mounts each job's Secret.
pub const DEFAULT_DIR: &str = "/var/run/asyncd/signing";

/// What a job's calls may be signed with now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keys {
    /// The job configures no signing.
    Unsigned,
    /// The keys, primary first, none empty.
    Ready(Arc<Vec<Vec<u8>>>),
    /// Signing is configured but cannot be done: why.
    Unavailable(String),
}

/// Why each job this process dispatches cannot be signed now, shared by the dispatcher
/// (which records it) and `/readyz` (which reports it).
#[derive(Debug, Default)]
pub struct SigningStatus(Mutex<BTreeMap<String, String>>);

impl SigningStatus {
    fn record(&self, job: &str, keys: &Keys) {
        let mut unavailable = self.0.lock().expect("signing status lock");
        match keys {
            Keys::Unavailable(why) => {
                unavailable.insert(job.to_string(), why.clone());
            }
            Keys::Ready(_) | Keys::Unsigned => {
                unavailable.remove(job);
            }
        }
    }

    /// `job: reason` for every job among `routed` that is not dispatched for want of its
    /// keys; jobs no longer routed here are not reported.
    pub fn unavailable(&self, routed: impl Fn(&str) -> bool) -> Vec<String> {
        self.0
            .lock()
            .expect("signing status lock")
            .iter()
            .filter(|(job, _)| routed(job))
            .map(|(job, why)| format!("job {job} is not dispatched: {why}"))
            .collect()
    }
}

struct Cached {
    signing: Signing,
    read_at: Instant,
    keys: Keys,
}

pub struct SigningKeys {
    dir: PathBuf,
    unavailable: IntGaugeVec,
    status: Arc<SigningStatus>,
    /// Per job name.
    cache: Mutex<HashMap<String, Cached>>,
    warned_unsigned: Mutex<HashSet<String>>,
}

impl SigningKeys {
    pub fn new(dir: PathBuf, unavailable: IntGaugeVec, status: Arc<SigningStatus>) -> Self {
        Self {
            dir,
            unavailable,
            status,
            cache: Mutex::new(HashMap::new()),
            warned_unsigned: Mutex::new(HashSet::new()),
        }
    }

    /// The job's keys as of at most [`RELOAD`] ago.
    pub fn keys(&self, job: &Job) -> Keys {
        let Some(signing) = &job.signing else {
            if self
                .warned_unsigned
                .lock()
                .expect("warned lock")
                .insert(job.name.clone())
            {
                tracing::warn!(
                    job = %job.name,
                    "job {} configures no spec.executor.signing: its executor calls are unsigned \
                     (acceptable only for local development)",
                    job.name
                );
            }
            self.status.record(&job.name, &Keys::Unsigned);
            return Keys::Unsigned;
        };
        let mut cache = self.cache.lock().expect("signing cache lock");
        if let Some(cached) = cache.get(&job.name)
            && cached.signing == *signing
            && cached.read_at.elapsed() < RELOAD
        {
            return cached.keys.clone();
        }
        let keys = read_keys(&self.dir, signing);
        let before = cache.get(&job.name).map(|c| &c.keys);
        match (&keys, before) {
            (Keys::Unavailable(why), before) if !matches!(before, Some(Keys::Unavailable(w)) if w == why) =>
            {
                tracing::warn!(job = %job.name, "job {} is not dispatched: {why}", job.name);
            }
            (Keys::Ready(_), Some(Keys::Unavailable(_))) => {
                tracing::info!(job = %job.name, "job {}: signing keys available, dispatching", job.name);
            }
            _ => {}
        }
        self.unavailable
            .with_label_values(&[job.name.as_str()])
            .set(i64::from(matches!(keys, Keys::Unavailable(_))));
        self.status.record(&job.name, &keys);
        cache.insert(
            job.name.clone(),
            Cached {
                signing: signing.clone(),
                read_at: Instant::now(),
                keys: keys.clone(),
            },
        );
        keys
    }

    /// Whether the job's tasks may be dispatched now.
    pub fn may_dispatch(&self, job: &Job) -> bool {
        !matches!(self.keys(job), Keys::Unavailable(_))
    }
}

fn read_keys(dir: &Path, signing: &Signing) -> Keys {
    let secret_dir = dir.join(&signing.secret);
    let mut keys = Vec::with_capacity(signing.keys.len());
    for key in &signing.keys {
        let path = secret_dir.join(key);
        match std::fs::read(&path) {
            Ok(bytes) if bytes.is_empty() => {
                return Keys::Unavailable(format!(
                    "key {key:?} of signing Secret {:?} is empty ({})",
                    signing.secret,
                    path.display()
                ));
            }
            Ok(bytes) => keys.push(bytes),
            Err(err) => {
                return Keys::Unavailable(format!(
                    "key {key:?} of signing Secret {:?} cannot be read ({}: {err}); \
                     is the Secret created in the job's namespace?",
                    signing.secret,
                    path.display()
                ));
            }
        }
    }
    Keys::Ready(Arc::new(keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(signing: Option<Signing>) -> Job {
        let mut job = crate::executor::test_job("http://127.0.0.1:1/");
        job.signing = signing;
        job
    }

    fn signing(keys: &[&str]) -> Option<Signing> {
        Some(Signing {
            secret: "job-signing".into(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
        })
    }

    fn gauge() -> IntGaugeVec {
        IntGaugeVec::new(prometheus::Opts::new("g", "g"), &["job"]).unwrap()
    }

    #[test]
    fn missing_or_empty_keys_stop_the_job_until_they_appear() {
        let dir = tempfile::tempdir().unwrap();
        let unavailable = gauge();
        let status = Arc::new(SigningStatus::default());
        let keys = SigningKeys::new(dir.path().into(), unavailable.clone(), status.clone());
        let reported = || status.unavailable(|job| job == "job");
        let job = job(signing(&["key", "old"]));
        let read = || {
            keys.cache.lock().unwrap().clear();
            keys.keys(&job)
        };
        assert!(matches!(read(), Keys::Unavailable(why) if why.contains("\"key\"")));
        assert_eq!(unavailable.with_label_values(&["job"]).get(), 1);
        assert!(
            matches!(reported().as_slice(), [why] if why.starts_with("job job is not dispatched: key \"key\" of signing Secret \"job-signing\"")),
            "{:?}",
            reported()
        );
        assert!(
            status.unavailable(|_| false).is_empty(),
            "unrouted jobs are not reported"
        );
        let secret = dir.path().join("job-signing");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("key"), b"k1").unwrap();
        assert!(
            matches!(read(), Keys::Unavailable(why) if why.contains("\"old\"")),
            "every listed key must be there"
        );
        std::fs::write(secret.join("old"), b"").unwrap();
        assert!(matches!(read(), Keys::Unavailable(why) if why.contains("empty")));
        std::fs::write(secret.join("old"), b"k0").unwrap();
        assert_eq!(
            read(),
            Keys::Ready(Arc::new(vec![b"k1".to_vec(), b"k0".to_vec()]))
        );
        assert_eq!(unavailable.with_label_values(&["job"]).get(), 0);
        assert!(reported().is_empty());
        assert!(keys.may_dispatch(&job));
    }

    #[test]
    fn a_rotated_key_is_read_after_the_reload_interval() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("job-signing");
        std::fs::create_dir(&secret).unwrap();
        std::fs::write(secret.join("key"), b"before").unwrap();
        let keys = SigningKeys::new(dir.path().into(), gauge(), Arc::default());
        let job = job(signing(&["key"]));
        assert_eq!(
            keys.keys(&job),
            Keys::Ready(Arc::new(vec![b"before".to_vec()]))
        );
        std::fs::write(secret.join("key"), b"after").unwrap();
        // Within RELOAD the cached key is used.
        assert_eq!(
            keys.keys(&job),
            Keys::Ready(Arc::new(vec![b"before".to_vec()]))
        );
        {
            let mut cache = keys.cache.lock().unwrap();
            let read_at = &mut cache.get_mut("job").unwrap().read_at;
            *read_at = read_at
                .checked_sub(RELOAD)
                .expect("the machine has been up longer");
        }
        assert_eq!(
            keys.keys(&job),
            Keys::Ready(Arc::new(vec![b"after".to_vec()]))
        );
    }

    #[test]
    fn a_job_without_signing_is_unsigned_not_stopped() {
        let keys = SigningKeys::new("/nonexistent".into(), gauge(), Arc::default());
        assert_eq!(keys.keys(&job(None)), Keys::Unsigned);
        assert!(keys.may_dispatch(&job(None)));
    }
}
