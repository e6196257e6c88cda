//! The outcome journal (`--outcome-journal DIR`): each attempt's outcome appended to a
//! local file the moment the attempt settles, before it waits for the completer's write
//! to the store. A dispatcher SIGKILLed (an OOM kill, a node's kill after the grace
//! period) loses the outcomes not yet written; without the journal their tasks wait out
//! their leases and run a second time. With it, the dispatcher started again on the same
//! directory (in Kubernetes an `emptyDir`, which a container's restart keeps) writes them
//! first, long before those leases lapse.
//!
//! An append is one `write(2)` of a whole line to a file opened for appending, with no
//! `fsync`: a killed process's writes are already in the kernel and survive it, and a
//! machine that loses its page cache loses its pod's `emptyDir` with it. A line cut by
//! the kill is the last one, and is skipped when read back.
//!
//! Two segment files take turns so that the journal stays small under a steady load,
//! when some outcome is always waiting: appends go to the current segment until it
//! passes [`SEGMENT_BYTES`], then to the other one, once every outcome in that one has
//! been written (it is emptied then). A segment whose outcomes have all been written is
//! emptied at once unless it is current. A replayed outcome the store already has, or
//! that a later attempt superseded, changes nothing: every outcome is conditional on its
//! attempt's lease token.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use asyncd_store::{Finish, FinishKind, Millis};

/// A segment is left for the other one past this size: at most two of these, plus what
/// waits while the store is away.
const SEGMENT_BYTES: u64 = 4 << 20;

/// While the store is away nothing is written and the current segment keeps growing;
/// past this size outcomes go on unjournaled, so that the journal's folder (in
/// Kubernetes a size-limited emptyDir, whose overflow evicts the pod) stays under
/// 2 × this.
const SEGMENT_CAP: u64 = 32 << 20;

const SEGMENTS: [&str; 2] = ["outcomes-0.jsonl", "outcomes-1.jsonl"];

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("--outcome-journal {0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error(
        "--outcome-journal {0}: another process holds this journal (each dispatcher needs its own directory)"
    )]
    Taken(PathBuf),
}

/// Which segment an appended outcome went to; handed back by [`OutcomeJournal::written`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(usize);

pub struct OutcomeJournal {
    dir: PathBuf,
    inner: Mutex<Segments>,
    /// What an earlier process left unwritten, until the completer takes it.
    recovered: Mutex<Vec<(Finish, Ticket)>>,
    /// Held for the process's life: the lock on `DIR/lock`.
    _lock: File,
}

struct Segments {
    files: [Segment; 2],
    current: usize,
}

struct Segment {
    file: File,
    len: u64,
    /// Outcomes appended here and not yet written to the store.
    unwritten: usize,
}

/// One line of a segment.
#[derive(Serialize, Deserialize)]
struct Entry {
    id: String,
    lease_token: i64,
    kind: EntryKind,
}

/// Externally tagged (`{"succeeded":{…}}`): an internally tagged enum buffers its
/// fields, and a result kept byte for byte (`RawValue`) cannot be read from that buffer.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum EntryKind {
    Succeeded { result: Option<Box<RawValue>> },
    Extend { until: i64 },
    Retry { at: i64, error: String },
    Dead { error: String },
    Release,
}

impl From<&Finish> for Entry {
    fn from(finish: &Finish) -> Self {
        let kind = match &finish.kind {
            FinishKind::Succeeded { result } => EntryKind::Succeeded {
                result: result.clone(),
            },
            FinishKind::Extend { until } => EntryKind::Extend {
                until: until.as_i64(),
            },
            FinishKind::Retry { at, error } => EntryKind::Retry {
                at: at.as_i64(),
                error: error.clone(),
            },
            FinishKind::Dead { error } => EntryKind::Dead {
                error: error.clone(),
            },
            FinishKind::Release => EntryKind::Release,
        };
        Self {
            id: finish.id.clone(),
            lease_token: finish.lease_token,
            kind,
        }
    }
}

impl From<Entry> for Finish {
    fn from(entry: Entry) -> Self {
        let kind = match entry.kind {
            EntryKind::Succeeded { result } => FinishKind::Succeeded { result },
            EntryKind::Extend { until } => FinishKind::Extend {
                until: Millis::new(until),
            },
            EntryKind::Retry { at, error } => FinishKind::Retry {
                at: Millis::new(at),
                error,
            },
            EntryKind::Dead { error } => FinishKind::Dead { error },
            EntryKind::Release => FinishKind::Release,
        };
        Self {
            id: entry.id,
            lease_token: entry.lease_token,
            kind,
        }
    }
}

impl OutcomeJournal {
    /// Opens the journal in `dir` (created if missing) and takes it for this process.
    /// The outcomes an earlier process appended and did not see written are kept for
    /// [`Self::take_recovered`].
    pub fn open(dir: &Path) -> Result<Self, JournalError> {
        let io = |err| JournalError::Io(dir.to_path_buf(), err);
        std::fs::create_dir_all(dir).map_err(io)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(JournalError::Taken(dir.to_path_buf()));
            }
            Err(std::fs::TryLockError::Error(err)) => return Err(io(err)),
        }
        let mut recovered = Vec::new();
        let mut files = Vec::with_capacity(2);
        for (index, name) in SEGMENTS.iter().enumerate() {
            let path = dir.join(name);
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .read(true)
                .open(&path)
                .map_err(io)?;
            let before = recovered.len();
            for line in BufReader::new(&file).split(b'\n') {
                let line = line.map_err(io)?;
                // Only the last line can be cut short (by a kill mid-append).
                match serde_json::from_slice::<Entry>(&line) {
                    Ok(entry) => recovered.push((Finish::from(entry), Ticket(index))),
                    Err(err) => tracing::warn!(
                        journal = %path.display(), %err,
                        "skipping an outcome journal line that does not parse (cut by a kill)"
                    ),
                }
            }
            let len = file.metadata().map_err(io)?.len();
            files.push(Segment {
                file,
                len,
                unwritten: recovered.len() - before,
            });
        }
        if !recovered.is_empty() {
            tracing::info!(
                outcomes = recovered.len(),
                journal = %dir.display(),
                "writing the outcomes an earlier process left unwritten"
            );
        }
        let [first, second]: [Segment; 2] = files.try_into().ok().expect("two segments");
        let mut segments = Segments {
            files: [first, second],
            current: 0,
        };
        // Start on an empty segment where there is one.
        for index in 0..2 {
            segments.empty_if_done(index).map_err(io)?;
        }
        segments.current = usize::from(segments.files[0].len > 0 && segments.files[1].len == 0);
        Ok(Self {
            dir: dir.to_path_buf(),
            inner: Mutex::new(segments),
            recovered: Mutex::new(recovered),
            _lock: lock,
        })
    }

    /// The outcomes an earlier process left unwritten, each with its ticket: the
    /// completer writes them before anything else, and their segments are emptied once
    /// it has.
    pub fn take_recovered(&self) -> Vec<(Finish, Ticket)> {
        std::mem::take(&mut *self.recovered.lock().expect("journal lock"))
    }

    /// Appends `finish`. A full journal ([`SEGMENT_CAP`]) or an error (a full disk)
    /// leaves the outcome unjournaled: the journal only saves re-runs, and an outcome
    /// must never wait on it.
    pub fn append(&self, finish: &Finish) -> Option<Ticket> {
        let mut line = serde_json::to_vec(&Entry::from(finish)).expect("an outcome serializes");
        line.push(b'\n');
        let mut segments = self.inner.lock().expect("journal lock");
        let current = segments.current;
        if segments.files[current].len >= SEGMENT_BYTES {
            let other = 1 - current;
            if segments.files[other].unwritten == 0 {
                segments.current = other;
            }
        }
        let index = segments.current;
        let segment = &mut segments.files[index];
        if segment.len + line.len() as u64 > SEGMENT_CAP {
            tracing::debug!(journal = %self.dir.display(), "outcome journal full; an outcome goes on unjournaled");
            return None;
        }
        match segment.file.write_all(&line) {
            Ok(()) => {
                segment.len += line.len() as u64;
                segment.unwritten += 1;
                Some(Ticket(index))
            }
            Err(err) => {
                tracing::warn!(journal = %self.dir.display(), %err, "could not journal an outcome");
                None
            }
        }
    }

    /// The outcomes of `tickets` are in the store: a segment none of whose outcomes
    /// waits any more, and that appends have moved on from, is emptied.
    pub fn written(&self, tickets: impl IntoIterator<Item = Ticket>) {
        let mut segments = self.inner.lock().expect("journal lock");
        for Ticket(index) in tickets {
            let segment = &mut segments.files[index];
            segment.unwritten = segment.unwritten.saturating_sub(1);
        }
        for index in 0..2 {
            if index != segments.current
                && let Err(err) = segments.empty_if_done(index)
            {
                tracing::warn!(journal = %self.dir.display(), %err, "could not empty an outcome journal segment");
            }
        }
    }
}

impl Segments {
    fn empty_if_done(&mut self, index: usize) -> std::io::Result<()> {
        let segment = &mut self.files[index];
        if segment.unwritten == 0 && segment.len > 0 {
            segment.file.set_len(0)?;
            segment.len = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn success(id: &str, token: i64) -> Finish {
        Finish {
            id: id.into(),
            lease_token: token,
            kind: FinishKind::Succeeded {
                result: Some(RawValue::from_string(r#"{"a": [1, "\n"]}"#.into()).unwrap()),
            },
        }
    }

    fn recovered_ids(dir: &Path) -> Vec<(String, i64)> {
        OutcomeJournal::open(dir)
            .unwrap()
            .take_recovered()
            .into_iter()
            .map(|(f, _)| (f.id, f.lease_token))
            .collect()
    }

    #[test]
    fn outcomes_not_written_come_back_to_the_next_process_and_written_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        {
            let journal = OutcomeJournal::open(dir.path()).unwrap();
            assert!(journal.take_recovered().is_empty());
            let kinds = [
                success("a", 1),
                Finish {
                    id: "b".into(),
                    lease_token: 2,
                    kind: FinishKind::Retry {
                        at: Millis::new(9),
                        error: "boom\t\"x\"".into(),
                    },
                },
                Finish {
                    id: "c".into(),
                    lease_token: 3,
                    kind: FinishKind::Extend {
                        until: Millis::new(7),
                    },
                },
            ];
            let tickets: Vec<Ticket> = kinds.iter().map(|f| journal.append(f).unwrap()).collect();
            journal.written([tickets[0]]);
            // The process dies here: no destructor of note runs on SIGKILL either.
        }
        let recovered = OutcomeJournal::open(dir.path()).unwrap().take_recovered();
        // Segment 0 still holds "a": it is emptied only once all of its outcomes are
        // written, and by the process that wrote them.
        let ids: Vec<&str> = recovered.iter().map(|(f, _)| f.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        match &recovered[1].0.kind {
            FinishKind::Retry { at, error } => {
                assert_eq!((*at, error.as_str()), (Millis::new(9), "boom\t\"x\""))
            }
            other => panic!("{other:?}"),
        }
        match &recovered[0].0.kind {
            FinishKind::Succeeded { result } => {
                assert_eq!(result.as_ref().unwrap().get(), r#"{"a": [1, "\n"]}"#)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_replayed_segment_is_emptied_once_written_and_a_cut_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        {
            let journal = OutcomeJournal::open(dir.path()).unwrap();
            journal.append(&success("a", 1)).unwrap();
        }
        // A kill in the middle of an append.
        let mut segment = OpenOptions::new()
            .append(true)
            .open(dir.path().join(SEGMENTS[0]))
            .unwrap();
        segment.write_all(br#"{"id":"b","lease_tok"#).unwrap();
        drop(segment);
        let journal = OutcomeJournal::open(dir.path()).unwrap();
        let recovered = journal.take_recovered();
        assert_eq!(recovered.len(), 1, "the cut line is skipped");
        // New outcomes go to the other, empty segment meanwhile.
        let fresh = journal.append(&success("c", 1)).unwrap();
        assert_ne!(fresh, recovered[0].1);
        journal.written(recovered.into_iter().map(|(_, t)| t));
        drop(journal);
        assert_eq!(recovered_ids(dir.path()), [("c".to_string(), 1)]);
    }

    #[test]
    fn segments_take_turns_and_stay_bounded_under_a_steady_load() {
        let dir = tempfile::tempdir().unwrap();
        let journal = OutcomeJournal::open(dir.path()).unwrap();
        let mut waiting = std::collections::VecDeque::new();
        let big = "x".repeat(4096);
        for n in 0..4_000 {
            let finish = Finish {
                id: format!("t{n}"),
                lease_token: 1,
                kind: FinishKind::Dead { error: big.clone() },
            };
            waiting.push_back(journal.append(&finish).unwrap());
            // Some outcome always waits: each is written 10 appends later.
            if waiting.len() > 10 {
                journal.written([waiting.pop_front().unwrap()]);
            }
        }
        let total: u64 = SEGMENTS
            .iter()
            .map(|name| std::fs::metadata(dir.path().join(name)).unwrap().len())
            .sum();
        assert!(
            total <= 2 * (SEGMENT_BYTES + 8192),
            "16 MiB appended, {total} bytes kept"
        );
        drop(journal);
        let left = recovered_ids(dir.path());
        assert!(
            left.len() >= 10,
            "the 10 waiting outcomes are kept: {}",
            left.len()
        );
    }

    #[test]
    fn the_journal_stops_growing_at_its_cap_while_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let journal = OutcomeJournal::open(dir.path()).unwrap();
        let big = "x".repeat(64 << 10);
        let dead = |n: usize| Finish {
            id: format!("t{n}"),
            lease_token: 1,
            kind: FinishKind::Dead { error: big.clone() },
        };
        let journaled = (0..1_000)
            .filter(|&n| journal.append(&dead(n)).is_some())
            .count();
        assert!(
            (400..600).contains(&journaled),
            "{journaled} of 1 000 journaled"
        );
        for name in SEGMENTS {
            let len = std::fs::metadata(dir.path().join(name)).unwrap().len();
            assert!(len <= SEGMENT_CAP, "{name}: {len}");
        }
    }

    #[test]
    fn one_journal_one_process() {
        let dir = tempfile::tempdir().unwrap();
        let _held = OutcomeJournal::open(dir.path()).unwrap();
        assert!(matches!(
            OutcomeJournal::open(dir.path()),
            Err(JournalError::Taken(_))
        ));
    }
}
