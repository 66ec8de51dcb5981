//! Every hostile input of the reliability issue, committed under `fixtures/hostile/` (so that
//! the fuzzers start from them and anyone can try them on the command line), rebuilt here from
//! its description and compared byte for byte, then run through the command line: one line and
//! exit code 2 in well under 10 seconds, or the correct answer. `VRAMSCOPE_UPDATE_FIXTURES=1`
//! writes the files instead of comparing.

use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../../tests/common/hostile.rs"]
mod hostile;

/// A small, consistent vramscope JSON snapshot: one 2 MiB segment with two live blocks, each
/// allocated by `train_step` (train.py:3), and a history of their two allocations.
fn snapshot() -> serde_json::Value {
    let ctx = json!({"stack": 0, "scope": 0, "thread": 0, "step": 1});
    json!({
        "version": 1, "device": 0, "backend": "sim",
        "segments": [{
            "address": 0x7f00_0000_0000u64, "total_size": 2 << 20, "mapped_size": 2 << 20, "stream": 0,
            "pool": "small", "allocated_size": 1024, "active_size": 1024, "requested_size": 1024,
            "blocks": [
                {"address": 0x7f00_0000_0000u64, "size": 512, "requested_size": 512,
                 "state": "active_allocated", "context": ctx},
                {"address": 0x7f00_0000_0200u64, "size": 512, "requested_size": 512,
                 "state": "active_allocated", "context": ctx},
                {"address": 0x7f00_0000_0400u64, "size": (2 << 20) - 1024, "requested_size": 0,
                 "state": "inactive"}
            ]
        }],
        "history": [
            {"action": "alloc", "addr": 0x7f00_0000_0000u64, "size": 512, "stream": 0, "time_ns": 1, "context": ctx},
            {"action": "alloc", "addr": 0x7f00_0000_0200u64, "size": 512, "stream": 0, "time_ns": 2, "context": ctx}
        ],
        "history_dropped": 0,
        "frames": [{"function": "train_step", "file": "train.py", "line": 3}],
        "stacks": [[0]],
        "scopes": [[]],
        "threads": ["main"],
        "stats": {}
    })
}

fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v = snapshot();
    edit(&mut v);
    serde_json::to_vec_pretty(&v).unwrap()
}

/// What the command line must do with a file.
enum Expect {
    /// Exit code 2 with one line on stderr containing this.
    Refused(&'static str),
    /// Exit code 0 with this on stdout.
    Answer(&'static str),
}

/// Each hostile input: file name, bytes, the subcommand to run on it, what must happen.
fn inputs() -> Vec<(&'static str, Vec<u8>, &'static str, Expect)> {
    use Expect::*;
    vec![
        ("block_bomb.pickle", hostile::block_bomb(20_000), "summary", Refused("expands to more than")),
        ("frame_bomb.pickle", hostile::frame_bomb(20_000), "summary", Refused("expands to more than")),
        ("cycle.pickle", hostile::cycle(), "summary", Refused("reference cycle")),
        ("consistent.json", edited(|_| {}), "live", Answer("train_step")),
        (
            "forged_frame.json",
            edited(|v| v["frames"][0]["function"] = "train_step\nevil;injected;frame 999999999\nreal".into()),
            "folded",
            Answer("train_step\\nevil:injected:frame 999999999\\nreal (train.py:3) 1024\n"),
        ),
        ("version_99999.json", edited(|v| v["version"] = 99999.into()), "summary", Refused("version 99999 is newer")),
        (
            "block_outside_segment.json",
            edited(|v| v["segments"][0]["blocks"][2]["size"] = (4u64 << 20).into()),
            "summary",
            Refused("segments[0].blocks[2]: block [0x7f0000000400, 0x7f0000400400) lies outside its segment"),
        ),
        (
            "overlapping_blocks.json",
            edited(|v| v["segments"][0]["blocks"][1]["address"] = 0x7f00_0000_0100u64.into()),
            "summary",
            Refused("segments[0].blocks[1]: block at 0x7f0000000100 overlaps the block before it"),
        ),
        (
            "stack_out_of_range.json",
            edited(|v| v["segments"][0]["blocks"][1]["context"]["stack"] = 7.into()),
            "live",
            Refused("segments[0].blocks[1].context: stack 7 does not exist (there are 1 stacks)"),
        ),
        (
            "frame_out_of_range.json",
            edited(|v| v["stacks"][0][0] = 4_000_000_000u32.into()),
            "folded",
            Refused("stacks[0][0]: frame 4000000000 does not exist (there are 1 frames)"),
        ),
        (
            "scope_out_of_range.json",
            edited(|v| v["history"][1]["context"]["scope"] = 3.into()),
            "leaks",
            Refused("history[1].context: scope 3 does not exist"),
        ),
        (
            "huge_sizes.json",
            edited(|v| {
                v["segments"][0]["total_size"] = (u64::MAX - 7).into();
                v["segments"][0]["blocks"][2]["size"] = (u64::MAX - 10).into();
            }),
            "segments",
            Refused("overflows 64 bits"),
        ),
    ]
}

fn dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hostile")
}

#[test]
fn committed_hostile_fixtures_match_their_descriptions() {
    let update = std::env::var_os("VRAMSCOPE_UPDATE_FIXTURES").is_some();
    for (name, bytes, _, _) in inputs() {
        let path = dir().join(name);
        if update {
            std::fs::create_dir_all(dir()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (VRAMSCOPE_UPDATE_FIXTURES=1 writes it)", path.display()));
        assert!(committed == bytes, "{name} differs from its description; VRAMSCOPE_UPDATE_FIXTURES=1 rewrites it");
    }
}

#[test]
fn the_command_line_refuses_each_with_one_line_or_answers() {
    for (name, _, command, expect) in inputs() {
        let path = dir().join(name);
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope")).arg(command).arg(&path).output().unwrap();
        let took = started.elapsed();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(took < Duration::from_secs(10), "{name}: {took:?}");
        match expect {
            Expect::Refused(what) => {
                assert_eq!(out.status.code(), Some(2), "{name}: {stdout}{stderr}");
                assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
                assert!(stderr.contains(what), "{name}: {stderr}");
                assert!(stdout.is_empty(), "{name}: {stdout}");
            }
            Expect::Answer(what) => {
                assert_eq!(out.status.code(), Some(0), "{name}: {stderr}");
                assert!(stdout.contains(what), "{name}: {stdout}");
                let forged = stdout.lines().any(|l| l.starts_with("evil") || l.starts_with("real"));
                assert!(!forged, "{name}: a frame name forged a line: {stdout}");
            }
        }
    }
}
