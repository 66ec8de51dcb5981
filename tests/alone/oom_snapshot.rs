//! `VRAMSCOPE_OOM_SNAPSHOT`: a complete snapshot is written when an allocation runs out of
//! memory, never through or over a link or a special file, and each error names a file that
//! holds its own snapshot. (A process of its own, one test: it sets an environment variable.)
#![cfg(unix)]

use std::path::{Path, PathBuf};
use vramscope::{
    backend::HostBackend, config::OOM_SNAPSHOT_ENV, error::OomReport, record::Action, CachingAllocator, Error, Snapshot,
};

/// Runs an allocator out of memory with 5 live blocks and returns the error's report.
fn oom(scope: &str) -> (OomReport, String) {
    let alloc = CachingAllocator::new(HostBackend::new(64 << 20));
    let s = alloc.default_stream();
    let _scope = vramscope::scope(scope);
    let keep: Vec<_> = (0..5).map(|_| alloc.alloc::<u8>(&s, 10 << 20).unwrap()).collect();
    let err = alloc.alloc::<u8>(&s, 40 << 20).unwrap_err();
    drop(keep);
    let Error::OutOfMemory(report) = &err else { panic!("{err}") };
    ((**report).clone(), err.to_string())
}

fn no_partials(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        assert!(!p.to_string_lossy().ends_with(".partial"), "{} left behind", p.display());
    }
}

/// A complete snapshot of `scope`'s 5 blocks with the OOM event.
fn check_snapshot(path: &str, scope: &str) {
    let snap = Snapshot::load(path).expect("the file is a complete snapshot");
    assert_eq!(snap.live_blocks().count(), 5, "every live block is in it");
    assert!(snap.history.iter().any(|e| e.action == Action::Oom), "with the OOM event");
    let ctx = snap.live_blocks().next().unwrap().context.unwrap();
    assert_eq!(snap.scope(ctx.scope).unwrap(), [scope]);
}

#[test]
fn oom_snapshots_are_complete_and_never_clobber() {
    if crate::in_child(module_path!(), "oom_snapshots_are_complete_and_never_clobber") {
        return;
    }
    // (Steps: a directory, a link, a FIFO, one path shared by 8 threads, a full disk.)
    let dir = std::env::temp_dir().join(format!("vramscope-oom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // A directory: a new file inside it.
    // This process runs this one test, so no other thread reads the environment meanwhile.
    std::env::set_var(OOM_SNAPSHOT_ENV, &dir);
    let (report, message) = oom("into_a_directory");
    let path = report.snapshot_path.clone().expect("a snapshot was written");
    assert!(message.contains(&path));
    check_snapshot(&path, "into_a_directory");
    no_partials(&dir);

    // A symbolic link: refused, the link and its target untouched.
    let target = dir.join("target.txt");
    std::fs::write(&target, "keep me").unwrap();
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    std::env::set_var(OOM_SNAPSHOT_ENV, &link);
    let (report, message) = oom("link");
    assert_eq!(report.snapshot_path, None);
    assert!(message.contains("is a symbolic link"), "{message}");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");

    // A FIFO (a special file): refused up front, still a FIFO, and nothing blocks.
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    std::env::set_var(OOM_SNAPSHOT_ENV, &fifo);
    let (report, message) = oom("fifo");
    assert_eq!(report.snapshot_path, None);
    assert!(message.contains("is not a regular file"), "{message}");
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());

    // One file path shared by 8 threads running out of memory at once: each error names a
    // distinct, complete file holding its own snapshot.
    let shared = dir.join("shared.json");
    std::env::set_var(OOM_SNAPSHOT_ENV, &shared);
    let barrier = std::sync::Barrier::new(8);
    let reports: Vec<(OomReport, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    oom(&format!("thread{i}"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut paths: Vec<PathBuf> = Vec::new();
    for (i, (report, message)) in reports.iter().enumerate() {
        let path = report.snapshot_path.clone().unwrap_or_else(|| panic!("thread {i}: {message}"));
        check_snapshot(&path, &format!("thread{i}"));
        paths.push(path.into());
    }
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), 8, "one file per snapshot: {paths:?}");
    no_partials(&dir);

    // Odd paths: empty, a missing directory with a trailing slash, a file in a missing
    // directory, a file under a file. Each is refused in a line that says what is wrong, and
    // nothing is written (in the working directory either).
    let missing = dir.join("missing");
    for (target, says) in [
        (std::ffi::OsString::new(), "is set but empty: name a file or a directory".to_string()),
        (format!("{}/", missing.display()).into(), format!("the directory {}/ does not exist", missing.display())),
        (missing.join("oom.json").into(), format!("the directory {} does not exist", missing.display())),
        (target.join("oom.json").into(), format!("{} is not a directory", target.display())),
    ] {
        std::env::set_var(OOM_SNAPSHOT_ENV, &target);
        let (report, message) = oom("odd");
        assert_eq!(report.snapshot_path, None, "{target:?}: {message}");
        assert!(message.contains(&says), "{target:?}: {message}");
    }
    assert!(!missing.exists());
    let cwd = std::env::current_dir().unwrap();
    assert!(std::fs::read_dir(&cwd).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains(".partial")));

    // A full disk (a file size limit of 4 KiB, which makes writes fail as ENOSPC would): the
    // error says why, no file appears and no temporary is left behind.
    let full = dir.join("full");
    std::fs::create_dir_all(&full).unwrap();
    std::env::set_var(OOM_SNAPSHOT_ENV, &full);
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain system calls on valid pointers; SIGXFSZ ignored so that the write fails
    // with EFBIG instead of ending the process; both are restored below.
    let before = unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit), 0);
        let small = libc::rlimit { rlim_cur: 4096, rlim_max: limit.rlim_max };
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &small), 0);
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN)
    };
    let (report, message) = oom("full");
    // SAFETY: as above, restoring what was there.
    unsafe {
        libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
        libc::signal(libc::SIGXFSZ, before);
    }
    assert_eq!(report.snapshot_path, None, "{message}");
    assert!(message.contains("writing") && message.contains("too large"), "{message}");
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 0, "nothing left in {}", full.display());

    // A name of 250 bytes: its temporary fits beside it.
    let long = dir.join(format!("{}.json", "n".repeat(245)));
    std::env::set_var(OOM_SNAPSHOT_ENV, &long);
    let (report, message) = oom("long_name");
    assert_eq!(report.snapshot_path.as_deref(), Some(long.to_str().unwrap()), "{message}");
    check_snapshot(long.to_str().unwrap(), "long_name");

    // Another process holding the directory's lock (here: another open file of it, locked):
    // the error returns within the wait, saying why no snapshot was written.
    let locked = dir.join("locked");
    std::fs::create_dir_all(&locked).unwrap();
    let holder = std::fs::File::open(&locked).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: `holder` is open, so its descriptor is valid; the lock goes with the file.
    assert_eq!(unsafe { libc::flock(holder.as_raw_fd(), libc::LOCK_EX) }, 0);
    std::env::set_var(OOM_SNAPSHOT_ENV, &locked);
    let started = std::time::Instant::now();
    let (report, message) = oom("locked");
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(report.snapshot_path, None, "{message}");
    assert!(message.contains("another process held the lock"), "{message}");
    drop(holder);

    // A loop that catches out-of-memory errors: at most 16 snapshots in a process, then each
    // error says none was written.
    let looped = dir.join("loop");
    std::fs::create_dir_all(&looped).unwrap();
    std::env::set_var(OOM_SNAPSHOT_ENV, &looped);
    let messages: Vec<String> = (0..20).map(|i| oom(&format!("loop{i}")).1).collect();
    assert!(messages.last().unwrap().contains("wrote 16 out-of-memory snapshots already"), "{}", messages[19]);
    let files = std::fs::read_dir(&looped).unwrap().count();
    assert!(files < 16, "{files} files: the process's 16 include those written above");
    std::env::remove_var(OOM_SNAPSHOT_ENV);

    std::fs::remove_dir_all(&dir).ok();
}
