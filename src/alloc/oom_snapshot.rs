//! Writing a snapshot when an allocation runs out of memory (`VRAMSCOPE_OOM_SNAPSHOT`): never
//! through or over a link or a special file, one writer at a time in the process, a distinct
//! file for each snapshot the process writes to a shared path, complete or absent.

use crate::sync::Mutex;
use std::collections::HashSet;
use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

/// Files this process has written, so that a second out-of-memory error does not replace the
/// first one's snapshot; held while a snapshot is written, so writers take turns.
static WRITTEN: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// Writes `json()` for the destination `target` names (a file, or a directory to put
/// `oom-<pid>-<n>.json` in) and returns the file written, or why nothing was.
pub(super) fn write(target: &Path, json: impl FnOnce() -> String) -> Result<PathBuf, String> {
    let mut written = WRITTEN.lock();
    let written = written.get_or_insert_with(HashSet::new);
    let path = destination(target, written)?;
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

/// The file to write: in a directory, a new `oom-<pid>-<n>.json`; a path this process wrote
/// before gets a numbered sibling (`oom.json`, then `oom-2.json`).
fn destination(target: &Path, written: &HashSet<PathBuf>) -> Result<PathBuf, String> {
    match fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => Ok(first_free(|n| target.join(format!("oom-{}-{n}.json", std::process::id())))),
        Ok(_) => {
            refuse_special(target)?;
            if !written.contains(target) {
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
fn temporary(path: &Path) -> PathBuf {
    let name = path.file_name().map_or_else(|| "oom".into(), |s| s.to_string_lossy().into_owned());
    first_free(|n| path.with_file_name(format!(".{name}.{}-{n}.partial", std::process::id())))
}

/// Writes a file that must not exist yet (so no link is followed), and flushes it to disk.
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}
