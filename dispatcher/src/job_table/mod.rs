//! The routing table: which jobs exist, with the AsyncLimiters they name, read from a
//! folder of YAML files (`--config DIR`) or from the operator's routing ConfigMap
//! (`--routing-configmap`, see [`configmap`]), and re-read when either changes, so edits apply without a restart.
//! `--job NAME` narrows the table to one job, for the dispatchers the operator runs per
//! AsyncJobConfig.
//!
//! Readers hold an `Arc<RouteTable>` snapshot from a watch channel; a reload swaps in a
//! whole new table. A folder that stops parsing keeps the last good table (and logs
//! why), so a typo never unroutes every job.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use asyncd_spec::{
    AsyncJobConfig, AsyncLimiter, Declared, Job, LIMITER_KIND, Limiter, SpecError, bind_limiters,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub mod configmap;

#[derive(Debug, Default)]
pub struct RouteTable {
    jobs: HashMap<String, Arc<Job>>,
}

impl RouteTable {
    pub fn from_jobs(jobs: impl IntoIterator<Item = Job>) -> Self {
        Self {
            jobs: jobs
                .into_iter()
                .map(|job| (job.task_type.clone(), Arc::new(job)))
                .collect(),
        }
    }

    pub fn job(&self, task_type: &str) -> Option<&Arc<Job>> {
        self.jobs.get(task_type)
    }

    pub fn jobs(&self) -> impl Iterator<Item = &Arc<Job>> {
        self.jobs.values()
    }

    pub fn task_types(&self) -> Vec<String> {
        let mut types: Vec<_> = self.jobs.keys().cloned().collect();
        types.sort();
        types
    }
}

pub type Routes = watch::Receiver<Arc<RouteTable>>;

#[derive(Debug, thiserror::Error)]
pub enum RoutingError {
    #[error("config folder {0}: {1}")]
    Folder(PathBuf, std::io::Error),
    #[error("{file}: {field}: {message}")]
    Invalid {
        file: PathBuf,
        field: String,
        message: String,
    },
}

/// Reads every `*.yaml` / `*.yml` document in `dir`. Two jobs claiming one task type is
/// an error naming both files.
pub fn load_dir(dir: &Path, job: Option<&str>) -> Result<RouteTable, RoutingError> {
    let mut sources = Vec::new();
    for file in config_files(dir)? {
        let text =
            std::fs::read_to_string(&file).map_err(|e| RoutingError::Folder(file.clone(), e))?;
        sources.push((file, text));
    }
    table_from_documents(sources, job)
}

/// Builds the table from YAML texts, each named by where it came from (a file, or a
/// ConfigMap key), keeping only `job` when given.
pub fn table_from_documents(
    sources: impl IntoIterator<Item = (PathBuf, String)>,
    job: Option<&str>,
) -> Result<RouteTable, RoutingError> {
    let mut jobs: Vec<(Declared<Job>, PathBuf)> = Vec::new();
    let mut limiters: HashMap<String, (Limiter, PathBuf)> = HashMap::new();
    for (file, text) in sources {
        for document in serde_yaml::Deserializer::from_str(&text) {
            let invalid = |e: serde_yaml::Error| RoutingError::Invalid {
                file: file.clone(),
                field: "document".into(),
                message: e.to_string(),
            };
            let value: serde_yaml::Value =
                serde::Deserialize::deserialize(document).map_err(invalid)?;
            if value.is_null() {
                continue;
            }
            let spec_error = |e: SpecError| RoutingError::Invalid {
                file: file.clone(),
                field: e.field,
                message: e.message,
            };
            if value.get("kind").and_then(|k| k.as_str()) == Some(LIMITER_KIND) {
                let doc: AsyncLimiter = serde_yaml::from_value(value).map_err(invalid)?;
                let limiter = doc.validate().map_err(spec_error)?;
                if let Some((_, other)) = limiters.get(&limiter.id) {
                    return Err(RoutingError::Invalid {
                        file: file.clone(),
                        field: "metadata.name".into(),
                        message: format!(
                            "limiter {:?} is already declared in {}",
                            limiter.id,
                            other.display()
                        ),
                    });
                }
                limiters.insert(limiter.id.clone(), (limiter, file.clone()));
                continue;
            }
            let doc: AsyncJobConfig = serde_yaml::from_value(value).map_err(invalid)?;
            let validated = doc.validate().map_err(spec_error)?;
            if let Some((_, other)) = jobs
                .iter()
                .find(|(j, _)| j.value.task_type == validated.task_type)
            {
                return Err(RoutingError::Invalid {
                    file: file.clone(),
                    field: "spec.taskType".into(),
                    message: format!(
                        "task type {:?} is already declared in {}",
                        validated.task_type,
                        other.display()
                    ),
                });
            }
            let declared = Declared {
                namespace: doc.metadata.namespace.clone(),
                value: validated,
            };
            jobs.push((declared, file.clone()));
        }
    }
    // Bound before narrowing to `job`: a limiter counts the attempts of every job that
    // names it, including those this dispatcher does not run.
    let (mut declared, files): (Vec<_>, Vec<_>) = jobs.into_iter().unzip();
    bind_limiters(
        &mut declared,
        limiters.into_values().map(|(l, _)| l).collect(),
    )
    .map_err(|(name, e)| RoutingError::Invalid {
        file: declared_file(&declared, &files, &name),
        field: e.field,
        message: e.message,
    })?;
    Ok(RouteTable::from_jobs(
        declared
            .into_iter()
            .map(|d| d.value)
            .filter(|j| job.is_none_or(|name| j.name == name)),
    ))
}

/// The file the job named `name` came from.
fn declared_file(declared: &[Declared<Job>], files: &[PathBuf], name: &str) -> PathBuf {
    declared
        .iter()
        .position(|d| d.value.name == name)
        .map(|i| files[i].clone())
        .unwrap_or_default()
}

fn config_files(dir: &Path) -> Result<Vec<PathBuf>, RoutingError> {
    let entries = std::fs::read_dir(dir).map_err(|e| RoutingError::Folder(dir.to_path_buf(), e))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.is_file()
                && matches!(
                    path.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml")
                )
        })
        .collect();
    files.sort();
    Ok(files)
}

/// What a folder looks like from outside: each file's name, size and modification time.
fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    config_files(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|path| {
            let meta = std::fs::metadata(&path).ok();
            let len = meta.as_ref().map_or(0, |m| m.len());
            let modified = meta.and_then(|m| m.modified().ok());
            (path, len, modified)
        })
        .collect()
}

/// Loads the folder now (an error here stops start-up) and returns the table with the
/// watcher that re-reads it, polling every `interval` until `shutdown`; the caller runs
/// the watcher as one of its tasks.
pub fn watch_dir(
    dir: PathBuf,
    job: Option<String>,
    interval: Duration,
    shutdown: CancellationToken,
) -> Result<(Routes, impl Future<Output = ()> + Send + 'static), RoutingError> {
    let table = load_dir(&dir, job.as_deref())?;
    tracing::info!(dir = %dir.display(), jobs = ?table.task_types(), "job configs loaded");
    let (tx, rx) = watch::channel(Arc::new(table));
    let watcher = async move {
        let mut seen = fingerprint(&dir);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let now = fingerprint(&dir);
            if now == seen {
                continue;
            }
            seen = now;
            match load_dir(&dir, job.as_deref()) {
                Ok(table) => {
                    tracing::info!(jobs = ?table.task_types(), "job configs reloaded");
                    tx.send_replace(Arc::new(table));
                }
                Err(err) => {
                    tracing::error!(%err, "job configs not reloaded; keeping the last good ones")
                }
            }
        }
    };
    Ok((rx, watcher))
}

/// A fixed table, for tests and embedding.
pub fn fixed(table: RouteTable) -> Routes {
    watch::channel(Arc::new(table)).1
}
