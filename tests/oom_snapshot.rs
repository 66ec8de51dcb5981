//! `VRAMSCOPE_OOM_SNAPSHOT`: a complete snapshot is written when an allocation runs out of
//! memory. (Its own test binary: it sets an environment variable.)

use vramscope::{Action, CachingAllocator, Error, HostBackend, Snapshot, OOM_SNAPSHOT_ENV};

#[test]
fn an_oom_writes_a_complete_snapshot() {
    let dir = std::env::temp_dir().join(format!("vramscope-oom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // This binary runs this one test, so no other thread reads the environment meanwhile.
    std::env::set_var(OOM_SNAPSHOT_ENV, &dir);
    let alloc = CachingAllocator::new(HostBackend::new(64 << 20));
    let s = alloc.default_stream();
    let _scope = vramscope::scope("before_oom");
    let keep: Vec<_> = (0..5).map(|_| alloc.alloc::<u8>(&s, 10 << 20).unwrap()).collect();
    let err = alloc.alloc::<u8>(&s, 40 << 20).unwrap_err();
    let Error::OutOfMemory(report) = &err else { panic!("{err}") };
    let path = report.snapshot_path.clone().expect("a snapshot was written");
    assert!(err.to_string().contains(&path));
    let snap = Snapshot::load(&path).expect("the file is a complete snapshot");
    assert_eq!(snap.live_blocks().count(), 5, "every live block is in it");
    assert!(snap.history.iter().any(|e| e.action == Action::Oom), "with the OOM event");
    let ctx = snap.live_blocks().next().unwrap().context.unwrap();
    assert_eq!(snap.scopes[ctx.scope as usize], ["before_oom"]);
    assert!(std::fs::read_dir(&dir).unwrap().all(|e| !e.unwrap().path().to_string_lossy().ends_with(".partial")));
    drop(keep);
    std::fs::remove_dir_all(&dir).ok();
}
