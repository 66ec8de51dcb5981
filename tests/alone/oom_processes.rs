//! `VRAMSCOPE_OOM_SNAPSHOT` shared by several processes, as a job with one process per GPU has
//! it: eight processes running out of memory at once with one file path each write their own
//! file, and each error names the file that holds that process's snapshot. (One test: it runs
//! its own binary eight times as the processes.)
#![cfg(unix)]

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use vramscope::{backend::HostBackend, config::OOM_SNAPSHOT_ENV, CachingAllocator, Error, Snapshot};

const CHILD: &str = "VRAMSCOPE_TEST_OOM_CHILD";
const AT: &str = "VRAMSCOPE_TEST_OOM_AT";

/// In a child: waits for the agreed moment, runs out of memory with 5 live blocks in scope
/// `process<i>`, and prints the path the error names.
fn child(i: &str) {
    let at: u128 = std::env::var(AT).unwrap().parse().unwrap();
    let alloc = CachingAllocator::new(HostBackend::new(64 << 20));
    let s = alloc.default_stream();
    let _scope = vramscope::scope(&format!("process{i}"));
    let keep: Vec<_> = (0..5).map(|_| alloc.alloc::<u8>(&s, 10 << 20).unwrap()).collect();
    while SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() < at {
        std::hint::spin_loop();
    }
    let err = alloc.alloc::<u8>(&s, 40 << 20).unwrap_err();
    drop(keep);
    let Error::OutOfMemory(report) = &err else { panic!("{err}") };
    let path = report.snapshot_path.clone().unwrap_or_else(|| panic!("no snapshot: {err}"));
    assert!(err.to_string().contains(&path), "{err}");
    println!("PATH {path}");
}

#[test]
fn processes_sharing_a_path_each_name_their_own_file() {
    if let Ok(i) = std::env::var(CHILD) {
        return child(&i);
    }
    let dir = std::env::temp_dir().join(format!("vramscope-oom-procs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shared = dir.join("oom.json");
    let me = std::env::current_exe().unwrap();
    for round in 0..3 {
        let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_millis(500);
        let children: Vec<_> = (0..8)
            .map(|i| {
                Command::new(&me)
                    .args([
                        "--exact",
                        "oom_processes::processes_sharing_a_path_each_name_their_own_file",
                        "--nocapture",
                    ])
                    .env(CHILD, i.to_string())
                    .env(AT, at.as_millis().to_string())
                    .env(OOM_SNAPSHOT_ENV, &shared)
                    .output_async()
            })
            .collect();
        let mut paths = Vec::new();
        for (i, c) in children.into_iter().enumerate() {
            let out = c.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "round {round}, process {i}: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let path = stdout.lines().find_map(|l| l.strip_prefix("PATH ")).unwrap().to_string();
            let snap = Snapshot::load(&path).expect("a complete snapshot");
            let block = snap.live_blocks().next().unwrap();
            assert_eq!(snap.scopes[block.context.unwrap().scope.index()], [format!("process{i}")], "{path}");
            paths.push(path);
        }
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), 8, "round {round}: {paths:?}");
        // The next round's processes start after these files were written: they are an
        // earlier run's, and the first writer replaces `oom.json`.
        std::thread::sleep(Duration::from_millis(1100));
    }
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        assert!(!p.to_string_lossy().ends_with(".partial"), "{} left behind", p.display());
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Starts a command with its output captured.
trait Spawn {
    fn output_async(&mut self) -> std::process::Child;
}

impl Spawn for Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
    }
}
