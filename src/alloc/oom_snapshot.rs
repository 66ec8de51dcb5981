//! Writing a snapshot when an allocation runs out of memory (`VRAMSCOPE_OOM_SNAPSHOT`): never
//! through or over a link or a special file, one writer at a time in the process and, through a
//! lock on the destination's directory, across processes; a distinct file for each snapshot
//! written to a shared path, complete or absent.

use crate::sync::Mutex;
use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Files this process has written, so that a second out-of-memory error does not replace the
/// first one's snapshot; held while a snapshot is written, so writers take turns.
static WRITTEN: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// The most snapshots one process writes: a loop that catches out-of-memory errors and tries
/// again would otherwise fill the disk with a snapshot per failure. The first ones are kept;
/// later errors say that none was written, and where the earlier ones are.
pub(crate) const MAX_SNAPSHOTS_PER_PROCESS: usize = 16;

/// How long a writer waits for another process that holds the destination's lock before it
/// gives up (the out-of-memory error returns without a snapshot, saying so).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Writes `json()` for the destination `target` names (a file, or a directory to put
/// `oom-<pid>-<n>.json` in) and returns the file written, or why nothing was.
pub(super) fn write(target: &Path, json: impl FnOnce() -> String) -> Result<PathBuf, String> {
    let mut written = WRITTEN.lock();
    let written = written.get_or_insert_with(HashSet::new);
    check_target(target)?;
    if written.len() >= MAX_SNAPSHOTS_PER_PROCESS {
        return Err(format!(
            "not written: this process wrote {MAX_SNAPSHOTS_PER_PROCESS} out-of-memory snapshots already \
             (the most it writes), under {}",
            target.display()
        ));
    }
    // Processes sharing the destination take turns from choosing the file to renaming it into
    // place: eight processes running out of memory at once write eight files.
    let Some(_turn) = lock_directory(target) else {
        return Err(format!(
            "not written: another process held the lock on {}'s directory for {} s",
            target.display(),
            LOCK_WAIT.as_secs()
        ));
    };
    let path = destination(target, written, process_start())?;
    let tmp = temporary(&path);
    let result =
        write_new(&tmp, json().as_bytes()).map_err(|e| format!("writing {}: {e}", tmp.display())).and_then(|()| {
            // The destination may have changed since it was chosen: check it again.
            refuse_special(&path)?;
            fs::rename(&tmp, &path).map_err(|e| format!("renaming {} to {}: {e}", tmp.display(), path.display()))
        });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    written.insert(path.clone());
    Ok(path)
}

/// Refuses a destination that names no file: empty, or in a directory that does not exist.
fn check_target(target: &Path) -> Result<(), String> {
    let text = target.as_os_str().to_string_lossy();
    if text.is_empty() {
        return Err(format!("{} is set but empty: name a file or a directory", super::OOM_SNAPSHOT_ENV));
    }
    let parent = match fs::symlink_metadata(target) {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() != ErrorKind::NotFound && e.kind() != ErrorKind::NotADirectory => {
            return Err(format!("{}: {e}", target.display()))
        }
        // A missing path ending in `/` names a directory that does not exist.
        Err(_) if text.ends_with('/') => target,
        Err(_) => parent_of(target),
    };
    match fs::metadata(parent) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!("{}: {} is not a directory", target.display(), parent.display())),
        Err(_) => Err(format!(
            "{}: the directory {} does not exist: create it, or name a file in one that does",
            target.display(),
            parent.display()
        )),
    }
}

/// The directory a file path is in (`.` for a bare name).
fn parent_of(path: &Path) -> &Path {
    path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Takes the lock that writers of every process share for the destination's directory (an
/// advisory lock on the directory itself: nothing is left behind), released on drop; `None`
/// where another process held it for [`LOCK_WAIT`]. Where the system cannot lock a directory,
/// writers choose their files without it (`Some(None)`).
fn lock_directory(target: &Path) -> Option<Option<fs::File>> {
    let dir = if fs::metadata(target).is_ok_and(|m| m.is_dir()) { target } else { parent_of(target) };
    let Ok(handle) = fs::File::open(dir) else { return Some(None) };
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let started = std::time::Instant::now();
        loop {
            // SAFETY: `handle` is an open file, so its descriptor is valid for the call; the
            // lock is released when the descriptor is closed (the handle dropped).
            if unsafe { libc::flock(handle.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Some(Some(handle));
            }
            match std::io::Error::last_os_error().kind() {
                ErrorKind::Interrupted => {}
                ErrorKind::WouldBlock if started.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                ErrorKind::WouldBlock => return None,
                // A file system without locks: write without them.
                _ => return Some(None),
            }
        }
    }
    #[cfg(not(unix))]
    Some(None)
}

/// When this process started, where the system says (Linux: `/proc/self/stat` and the boot
/// time in `/proc/stat`).
fn process_start() -> Option<SystemTime> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) in parentheses; the start time,
    // field 22, in clock ticks since boot.
    let ticks: u64 = stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 =
        fs::read_to_string("/proc/stat").ok()?.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&t| t > 0)?;
    let start = std::time::Duration::from_secs(boot) + std::time::Duration::from_millis(ticks * 1000 / per_second);
    SystemTime::UNIX_EPOCH.checked_add(start)
}

/// The file to write: in a directory, a new `oom-<pid>-<n>.json`. A file is replaced only when
/// it was there before this process started (an earlier run's); one this process wrote, or one
/// written since it started (another process of the same job), is kept, and the snapshot goes
/// to a numbered sibling (`oom.json`, then `oom-2.json`).
fn destination(target: &Path, written: &HashSet<PathBuf>, started: Option<SystemTime>) -> Result<PathBuf, String> {
    match fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => Ok(first_free(|n| target.join(format!("oom-{}-{n}.json", std::process::id())))),
        Ok(m) => {
            refuse_special(target)?;
            // A second of slack: file times and the start time are counted differently.
            let earlier_run = match (m.modified(), started) {
                (Ok(modified), Some(started)) => modified + std::time::Duration::from_secs(1) < started,
                _ => false,
            };
            if !written.contains(target) && earlier_run {
                return Ok(target.to_path_buf());
            }
            let stem = target.file_stem().map_or_else(|| "oom".into(), |s| s.to_string_lossy().into_owned());
            let ext = target.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
            Ok(first_free(|n| target.with_file_name(format!("{stem}-{}{ext}", n + 2))))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(target.to_path_buf()),
        Err(e) => Err(format!("{}: {e}", target.display())),
    }
}

/// Refuses a path that is a symbolic link or anything but a regular file (a missing path is
/// fine): vramscope never writes through or replaces those.
fn refuse_special(path: &Path) -> Result<(), String> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(format!(
            "{} is a symbolic link: vramscope does not write through or replace links; name a regular file or a directory",
            path.display()
        )),
        Ok(m) if !m.is_file() => Err(format!(
            "{} is not a regular file (a directory, device, FIFO or socket): refused",
            path.display()
        )),
        _ => Ok(()),
    }
}

/// The first name from `name(0)`, `name(1)`, ... that does not exist.
fn first_free(name: impl Fn(u64) -> PathBuf) -> PathBuf {
    (0..).map(name).find(|p| fs::symlink_metadata(p).is_err()).expect("an unbounded range ends with a free name")
}

/// A hidden temporary beside `path`, named after this process and a counter.
///
/// The name is cut to 200 bytes, so that a destination whose name is near the system's limit
/// (255 bytes) still has a temporary beside it.
fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().map_or_else(|| "oom".into(), |s| s.to_string_lossy().into_owned());
    if name.len() > 200 {
        let cut = (0..=200).rev().find(|&i| name.is_char_boundary(i)).unwrap_or(0);
        name.truncate(cut);
    }
    first_free(|n| path.with_file_name(format!(".{name}.{}-{n}.partial", std::process::id())))
}

/// Writes a file that must not exist yet (so no link is followed), and flushes it to disk.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}
