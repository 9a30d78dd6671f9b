//! Advisory locks on a sweep's output directory, so that two invocations
//! never write the same results at once (a resubmitted Slurm task
//! overlapping a live one, a second terminal).
//!
//! An unsharded run and a merge hold `<dir>/.lock` exclusively. A shard
//! holds `<dir>/.lock` shared (shards of one sweep run side by side) and its
//! own `<dir>/.lock-shard-<i>-of-<n>` exclusively. The exclusive holder
//! writes its PID, host and start time into its lock file, for the error
//! another invocation prints. Locks are `flock(2)` locks
//! ([`std::fs::File::try_lock`]): the operating system drops them when the
//! process ends, however it ends, so a crash never leaves a stale lock.

use super::runner::Shard;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Locks held on an output directory; released when dropped.
#[derive(Debug)]
pub struct DirLock {
    /// Locks held shared (nothing recorded in them).
    shared: Option<File>,
    /// The lock held exclusively, with this process recorded in it.
    exclusive: File,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Clear the record while still holding the lock, so that nobody is
        // later named as a holder who is gone.
        let _ = self.exclusive.set_len(0);
        drop(self.shared.take());
    }
}

/// What a lock is taken for (named in the holder's record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Running the sweep's runs.
    Run,
    /// Merging part files.
    Merge,
}

impl DirLock {
    /// Takes the locks a run of `shard` (or of the whole sweep) or a merge
    /// needs on `dir` (created if missing). Fails at once, naming the holder,
    /// if another process holds a conflicting one.
    pub fn acquire(dir: &Path, shard: Option<Shard>, purpose: Purpose) -> Result<DirLock, LockError> {
        std::fs::create_dir_all(dir).map_err(|e| LockError::io(dir, "cannot create the output directory", e))?;
        let main = dir.join(".lock");
        match shard.filter(|s| s.count > 1) {
            None => Ok(DirLock { shared: None, exclusive: exclusive(&main, dir, purpose)? }),
            Some(s) => {
                let shared = open(&main)?;
                if let Err(e) = shared.try_lock_shared() {
                    return Err(busy(&main, dir, e, holder(&shared)));
                }
                let own = dir.join(format!(".lock-shard-{}-of-{}", s.index, s.count));
                Ok(DirLock { shared: Some(shared), exclusive: exclusive(&own, dir, purpose)? })
            }
        }
    }
}

/// Why a directory could not be locked.
#[derive(Debug)]
pub enum LockError {
    /// Another opal-sweep holds a conflicting lock on `dir` (its lock file `lock`).
    Busy {
        /// The output directory.
        dir: PathBuf,
        /// The lock file held.
        lock: PathBuf,
        /// Who holds it, as recorded in the lock file (empty for shards, which hold it shared).
        holder: String,
    },
    /// The directory or a lock file could not be created, opened or locked.
    Io {
        /// The directory or file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The system's error.
        cause: std::io::Error,
    },
}

impl LockError {
    fn io(path: &Path, what: &'static str, cause: std::io::Error) -> LockError {
        LockError::Io { path: path.to_path_buf(), what, cause }
    }
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Busy { dir, lock, holder } => {
                let who = if holder.is_empty() {
                    "shards of a sweep (opal-sweep --shard) hold it".to_string()
                } else {
                    format!("held by {holder}")
                };
                write!(
                    f,
                    "{} is in use by another opal-sweep: {} is locked ({who})\n  fix: wait for it to finish, or write elsewhere with -o",
                    dir.display(),
                    lock.display()
                )
            }
            LockError::Io { path, what, cause } => write!(f, "{}: {what}: {cause}", path.display()),
        }
    }
}

impl std::error::Error for LockError {}

fn open(path: &Path) -> Result<File, LockError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| LockError::io(path, "cannot open the lock file", e))
}

/// Locks `path` exclusively and records this process as its holder.
fn exclusive(path: &Path, dir: &Path, purpose: Purpose) -> Result<File, LockError> {
    let mut f = open(path)?;
    if let Err(e) = f.try_lock() {
        return Err(busy(path, dir, e, holder(&f)));
    }
    let what = match purpose {
        Purpose::Run => "running",
        Purpose::Merge => "merging",
    };
    let record = format!(
        "pid {} on {}, {what} since {} (Unix time)\n",
        std::process::id(),
        hostname(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
    );
    // Best effort: the lock itself is what protects the directory.
    let _ = f.set_len(0).and_then(|_| f.write_all(record.as_bytes())).and_then(|_| f.flush());
    Ok(f)
}

/// Who holds `f`'s lock, as recorded in it (empty for shared holders).
fn holder(f: &File) -> String {
    let mut text = String::new();
    let mut f = f;
    let _ = f.rewind().and_then(|_| f.read_to_string(&mut text));
    text.trim().to_string()
}

fn busy(path: &Path, dir: &Path, e: TryLockError, holder: String) -> LockError {
    match e {
        TryLockError::WouldBlock => LockError::Busy { dir: dir.to_path_buf(), lock: path.to_path_buf(), holder },
        TryLockError::Error(e) => LockError::io(path, "cannot lock", e),
    }
}

/// This machine's name (for the holder's record).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "an unknown host".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("opal-lock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_second_run_is_refused_naming_the_holder_and_may_go_once_the_first_is_done() {
        let d = dir("run");
        let first = DirLock::acquire(&d, None, Purpose::Run).unwrap();
        let e = DirLock::acquire(&d, None, Purpose::Merge).unwrap_err().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())) && e.contains("running since"), "{e}");
        assert!(e.contains("fix:"), "{e}");
        drop(first);
        assert_eq!(std::fs::read_to_string(d.join(".lock")).unwrap(), "", "the record goes with the lock");
        DirLock::acquire(&d, None, Purpose::Run).unwrap();
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn shards_run_side_by_side_but_not_twice_and_not_beside_a_whole_run() {
        let d = dir("shards");
        let s = |i| Some(Shard { index: i, count: 2 });
        let a = DirLock::acquire(&d, s(0), Purpose::Run).unwrap();
        let b = DirLock::acquire(&d, s(1), Purpose::Run).unwrap();
        let again = DirLock::acquire(&d, s(1), Purpose::Run).unwrap_err().to_string();
        assert!(again.contains(".lock-shard-1-of-2") && again.contains("pid"), "{again}");
        let whole = DirLock::acquire(&d, None, Purpose::Merge).unwrap_err().to_string();
        assert!(whole.contains("shards of a sweep"), "{whole}");
        drop((a, b));
        let whole = DirLock::acquire(&d, None, Purpose::Merge).unwrap();
        assert!(DirLock::acquire(&d, s(0), Purpose::Run).is_err(), "a shard waits for the merge");
        drop(whole);
        let _ = std::fs::remove_dir_all(&d);
    }
}
