//! Every hostile input of the reliability issue, rebuilt here from its description, then run
//! through the command line: one line and exit code 2 in well under 10 seconds, or the correct
//! answer. Those of at most [`COMMITTED`] bytes are committed under `fixtures/hostile/` (so that
//! the fuzzers start from them and anyone can try them on the command line) and compared byte
//! for byte with their description; `VRAMSCOPE_UPDATE_FIXTURES=1` writes them instead of
//! comparing. The larger ones (2 to 5 MB, a long string or bytes value shared by reference
//! hundreds of thousands of times) are written where the tests build, as they were 17 MB of a
//! working tree that the GPU machine's runs must carry; `cargo test -p vramscope-cli --test
//! hostile_fixtures` leaves them in `target/tmp/hostile/` to try by hand.

use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../../../tests/common/hostile.rs"]
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

/// A vramscope JSON snapshot of 5,000 allocation events sharing one stack of 1,000 frames.
fn shared_stack() -> Vec<u8> {
    let frames: Vec<_> =
        (0..1000).map(|i| json!({"function": format!("layer_{i}"), "file": "model.rs", "line": i + 1})).collect();
    let ctx = json!({"stack": 0, "scope": 0, "thread": 0, "step": 0});
    let history: Vec<_> = (0..5000u64)
        .map(|i| json!({"action": "alloc", "addr": i * 512, "size": 512, "stream": 0, "time_ns": i, "context": ctx}))
        .collect();
    let v = json!({
        "version": 4, "device": 0, "backend": "sim", "segments": [], "history": history, "history_dropped": 0,
        "frames": frames, "stacks": [(0..1000).collect::<Vec<u32>>()], "scopes": [[]], "threads": ["main"], "stats": {}
    });
    serde_json::to_vec(&v).unwrap()
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
        // 400 million frames by reference, but one shared list of 20,000: read once.
        ("frame_bomb.pickle", hostile::frame_bomb(20_000), "summary", Answer("Allocated memory")),
        ("cycle.pickle", hostile::cycle(), "summary", Refused("reference cycle")),
        ("unreachable_cycle.pickle", hostile::unreachable_cycle(), "summary", Refused("reference cycle")),
        ("consistent.json", edited(|_| {}), "live", Answer("train_step")),
        (
            "forged_frame.json",
            edited(|v| v["frames"][0]["function"] = "train_step\nevil;injected;frame 999999999\nreal".into()),
            "folded",
            Answer("train_step\\nevil:injected:frame 999999999\\nreal (train.py:3) 1024\n"),
        ),
        (
            "forged_escape.json",
            edited(|v| v["frames"][0]["function"] = "train_step\u{1b}[2J\nreal 999 B live".into()),
            "live",
            Answer("train_step\\u{1b}[2J\\nreal 999 B live"),
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
        // Round three: shared strings and bytes, each copy paid for by its length.
        (
            "shared_compile_context.pickle",
            hostile::shared_compile_context(200_000, 1_000_000),
            "summary",
            Refused("device_traces[0][33]: the pickle expands to more than"),
        ),
        (
            "shared_settings_bytes.pickle",
            hostile::shared_settings_bytes(2_000, 1_000_000),
            "summary",
            Refused("allocator_settings: the pickle expands to more than"),
        ),
        (
            "distinct_frames_one_name.pickle",
            hostile::distinct_frames_one_name(20_000, 4_000_000),
            "summary",
            Refused("device_traces[0][0]: frame 20: the pickle expands to more than"),
        ),
        // A shared event whose frame, or scope, is one long string: read once, answered.
        (
            "shared_frame_name.pickle",
            hostile::shared_frame_name(200_000, 4_000_000),
            "summary",
            Answer("Allocated memory"),
        ),
        (
            "shared_user_metadata.pickle",
            hostile::shared_user_metadata(200_000, 4_000_000),
            "summary",
            Answer("Allocated memory"),
        ),
        ("shared_stack.json", shared_stack(), "summary", Answer("Allocated memory")),
        // 64-bit addresses and stream handles, kept whole: two streams 2^32 apart print apart.
        ("pytorch_edges.pickle", hostile::pytorch_edges(), "segments", Answer("s4294967312")),
        // Two GPUs: each device's figures apart.
        ("two_devices.pickle", hostile::two_devices(), "summary", Answer("device 1:")),
        // Round four: files that expand. Gzip of spaces or of repeated events expands past
        // the read limit, refused after reading that much, not all of it; a pickle whose 5-byte
        // references stand for 8 million events is refused before the entries are made.
        ("spaces.json.gz", gzip_of(b"{", b' ', 1 << 30, b""), "summary", Refused("expands past the read limit")),
        (
            "events.trace.json.gz",
            gzip_of(b"{\"events\":[", b'x', 1 << 30, b"]}"),
            "replay",
            Refused("expands past the read limit"),
        ),
        (
            "identical_events.pickle",
            hostile::identical_events(8_000_000),
            "summary",
            Refused("device_traces[0]: 8000000 entries would take"),
        ),
        // 20,000 events each on a device of its own, all naming one stack of 2,000 frames:
        // split by device, the stack would be copied into each part.
        ("devices_share_a_long_stack.json", devices_sharing_a_stack(20_000, 2_000), "summary", Refused("would copy")),
        // Zeros after gzip data are padding, as `gzip -d` reads them.
        ("zero_padded.json.gz", zero_padded(&edited(|_| {})), "live", Answer("train_step")),
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

/// `head`, then `len` bytes of `fill`, then `tail`, gzipped as members of 64 MiB each (as
/// `cat` of gzip files makes them), so that a gigabyte is built from one compressed member.
fn gzip_of(head: &[u8], fill: u8, len: usize, tail: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let gz = |data: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    };
    // `x` stands for an event: the events of a trace, repeated.
    let chunk: Vec<u8> = if fill == b'x' {
        b"[\"a\",1,512,0],".iter().copied().cycle().take(64 << 20).collect()
    } else {
        vec![fill; 64 << 20]
    };
    let member = gz(&chunk);
    let mut out = gz(&[head, &chunk[..chunk.len() - head.len()]].concat());
    for _ in 1..len / chunk.len() {
        out.extend_from_slice(&member);
    }
    out.extend(gz(tail));
    out
}

/// `events` allocation events, each on a device of its own, all naming one stack of `frames`.
fn devices_sharing_a_stack(events: u64, frames: u32) -> Vec<u8> {
    let ctx = json!({"stack": 0, "scope": 0, "thread": 0, "step": 0});
    let history: Vec<_> = (0..events)
        .map(|i| json!({"action": "alloc", "addr": 512, "size": 512, "stream": 0, "time_ns": i, "device": i, "context": ctx}))
        .collect();
    let frames_v: Vec<_> =
        (0..frames).map(|i| json!({"function": format!("f{i}"), "file": "a.py", "line": i})).collect();
    serde_json::to_vec(&json!({
        "version": 4, "device": 0, "backend": "sim", "segments": [], "history": history, "history_dropped": 0,
        "frames": frames_v, "stacks": [(0..frames).collect::<Vec<u32>>()], "scopes": [[]], "threads": ["main"],
        "stats": {}
    }))
    .unwrap()
}

/// `data` gzipped, then 4 KiB of zeros.
fn zero_padded(data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    let mut out = e.finish().unwrap();
    out.extend([0u8; 4096]);
    out
}

fn dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hostile")
}

/// The most bytes a hostile input may have to be committed.
const COMMITTED: usize = 1 << 20;

/// Where input `name` lies: committed, or, larger than [`COMMITTED`], written from `bytes` into
/// the tests' own folder (through a temporary name, so that a reader never sees it half written).
fn path_of(name: &str, bytes: &[u8]) -> std::path::PathBuf {
    if bytes.len() <= COMMITTED {
        return dir().join(name);
    }
    let built = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("hostile");
    std::fs::create_dir_all(&built).unwrap();
    let path = built.join(name);
    if std::fs::read(&path).ok().as_deref() != Some(bytes) {
        // One name per process and thread: two tests of this binary may build it at once.
        let thread = format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_ascii_alphanumeric(), "");
        let partial = built.join(format!("{name}.{}.{thread}.partial", std::process::id()));
        std::fs::write(&partial, bytes).unwrap();
        std::fs::rename(&partial, &path).unwrap();
    }
    path
}

#[test]
fn committed_hostile_fixtures_match_their_descriptions() {
    let update = std::env::var_os("VRAMSCOPE_UPDATE_FIXTURES").is_some();
    for (name, bytes, _, _) in inputs() {
        let path = dir().join(name);
        if bytes.len() > COMMITTED {
            assert!(!path.exists(), "{name}: {} bytes, built by the tests, not committed", bytes.len());
            continue;
        }
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
    for (name, bytes, command, expect) in inputs() {
        let path = path_of(name, &bytes);
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

/// Runs the command line; its stdout, or a panic naming the command and its stderr.
fn vramscope(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "vramscope {args:?}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Round three's files that must be answered the same through `convert`: the 64-bit edges
/// survive both ways (the second round trip writes the first's bytes, and the JSON of the
/// original equals the JSON of its pickle), and a JSON snapshot whose 5,000 events share one
/// stack of 1,000 frames converts to a pickle smaller than the JSON (frames shared through
/// the pickle memo, as PyTorch's pickler shares them).
#[test]
fn convert_keeps_64_bit_values_and_shares_frames() {
    let tmp = std::env::temp_dir().join(format!("vramscope-round3-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let at = |name: &str| tmp.join(name).into_os_string();
    let edges = dir().join("pytorch_edges.pickle").into_os_string();
    let convert = |from: &std::ffi::OsStr, to: &str| vramscope(&["convert".as_ref(), from, "-o".as_ref(), &at(to)]);
    convert(&edges, "a.pickle");
    convert(&at("a.pickle"), "b.pickle");
    convert(&edges, "e.json");
    convert(&at("a.pickle"), "a.json");
    let read = |name: &str| std::fs::read(tmp.join(name)).unwrap();
    assert!(read("a.pickle") == read("b.pickle"), "the second round trip differs from the first");
    let (e, a) = (String::from_utf8(read("e.json")).unwrap(), String::from_utf8(read("a.json")).unwrap());
    assert_eq!(e, a, "the original and its pickle read differently");
    let json: serde_json::Value = serde_json::from_str(&e).unwrap();
    let seg = &json["segments"][1];
    assert_eq!(seg["address"], (1u64 << 63) + (1 << 40), "{seg}");
    assert_eq!(seg["stream"], (1u64 << 32) + 16);
    assert_eq!(seg["expandable"], true);
    assert_eq!(json["segments"][0]["stream"], 16);
    assert_eq!(seg["blocks"][0]["size"], 512, "the key given last");
    assert_eq!(json["history"][0]["user_metadata"], json!({"step": 3}));
    assert_eq!(json["frames"][0], json!({"function": "torch::unwind::unwind()", "file": null, "line": null}));
    assert_eq!(json["allocator_settings"], json!({"expandable_segments": true}));

    // Two devices: each keeps its segment and its trace, in both directions.
    let two = dir().join("two_devices.pickle").into_os_string();
    convert(&two, "two.pickle");
    convert(&at("two.pickle"), "two2.pickle");
    convert(&two, "two.json");
    convert(&at("two.pickle"), "two2.json");
    assert!(read("two.pickle") == read("two2.pickle"));
    assert_eq!(read("two.json"), read("two2.json"));
    let json: serde_json::Value = serde_json::from_slice(&read("two.json")).unwrap();
    let devices: Vec<_> = json["segments"].as_array().unwrap().iter().map(|s| s["device"].clone()).collect();
    assert_eq!(devices, [json!(0), json!(1)]);
    let events: Vec<_> =
        json["history"].as_array().unwrap().iter().map(|e| (e["device"].clone(), e["time_ns"].clone())).collect();
    assert_eq!(
        events,
        [(json!(0), json!(0)), (json!(1), json!(100_000)), (json!(0), json!(200_000)), (json!(1), json!(300_000))]
    );
    // The summary of each device holds its own memory only.
    let summary = vramscope(&["summary".as_ref(), &two]);
    let (zero, one) = summary.split_once("device 1:").unwrap();
    assert!(zero.contains("device 0:") && zero.contains("1024 KiB") && !zero.contains("3072 KiB"), "{summary}");
    assert!(one.contains("3072 KiB") && !one.contains("1024 KiB"), "{summary}");
    // In JSON, an object keyed by device; `leaks` keeps each device's list of candidates.
    for sub in ["summary", "live", "leaks", "segments"] {
        let out = vramscope(&[sub.as_ref(), &two, "--json".as_ref()]);
        let json: serde_json::Value = serde_json::from_str(&out).unwrap();
        let keys: Vec<_> = json.as_object().unwrap_or_else(|| panic!("{sub}: {out}")).keys().collect();
        assert_eq!(keys, ["0", "1"], "{sub}");
        if sub == "leaks" {
            assert!(json["0"].is_array() && json["1"].is_array(), "{out}");
        }
    }

    let shared = dir().join("shared_stack.json");
    convert(shared.as_os_str(), "shared.pickle");
    let (json_len, pickle_len) = (std::fs::metadata(&shared).unwrap().len(), read("shared.pickle").len() as u64);
    assert!(pickle_len < json_len, "{pickle_len} bytes of pickle for {json_len} of JSON");
    convert(&at("shared.pickle"), "shared2.pickle");
    assert!(read("shared.pickle") == read("shared2.pickle"));
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// A 3 GB file of zeros is refused from its first bytes, without reading the rest.
#[test]
fn a_large_file_of_something_else_is_refused_from_its_head() {
    let path = std::env::temp_dir().join(format!("vramscope-zeros-{}", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(3 << 30).unwrap(); // sparse: no disk written
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope")).arg("summary").arg(&path).output().unwrap();
    let took = started.elapsed();
    std::fs::remove_file(&path).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("neither a PyTorch snapshot pickle"), "{stderr}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

/// A sparse file of 3 GB whose first byte opens JSON (or whose first two open a pickle) and
/// whose next is already wrong is refused from its head, not read whole.
#[test]
fn a_large_file_wrong_at_its_second_byte_is_refused_from_its_head() {
    for (name, head, says) in [("brace", &b"{"[..], "not JSON"), ("pickle", &[0x80, 4][..], "invalid pickle at byte 2")]
    {
        let path = std::env::temp_dir().join(format!("vramscope-sparse-{name}-{}", std::process::id()));
        std::fs::write(&path, head).unwrap();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(3 << 30).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope")).arg("summary").arg(&path).output().unwrap();
        std::fs::remove_file(&path).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
        assert!(stderr.contains(says), "{name}: {stderr}");
    }
}

/// Every command on every hostile file, committed or built: an answer (exit 0) or one line
/// (exit 2), never a panic, each in well under 10 seconds (under 0.2 s in a release build here).
#[test]
fn every_command_on_every_hostile_file_answers_or_refuses() {
    let out_file = std::env::temp_dir().join(format!("vramscope-every-{}.pickle", std::process::id()));
    let mut files: Vec<_> = std::fs::read_dir(dir()).unwrap().map(|e| e.unwrap().path()).collect();
    let built = inputs().into_iter().filter(|(_, bytes, _, _)| bytes.len() > COMMITTED);
    files.extend(built.map(|(name, bytes, _, _)| path_of(name, &bytes)));
    files.sort();
    for file in &files {
        for command in [&["summary"][..], &["live"], &["leaks"], &["segments"], &["folded"], &["folded", "--allocated"]]
            .into_iter()
            .map(|c| c.to_vec())
            .chain([vec!["convert", "-o", out_file.to_str().unwrap()]])
        {
            let started = Instant::now();
            let out = Command::new(env!("CARGO_BIN_EXE_vramscope")).args(&command).arg(file).output().unwrap();
            let took = started.elapsed();
            let what = format!("{command:?} {}", file.display());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(took < Duration::from_secs(10), "{what}: {took:?}");
            match out.status.code() {
                Some(0) => {}
                Some(2) => assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}"),
                other => panic!("{what}: exit {other:?}: {stderr}"),
            }
        }
    }
    std::fs::remove_file(&out_file).ok();
}

/// A snapshot whose last event names device 65,535 (the highest allowed) among 20,000 on
/// device 0: the pickle holds a trace list per device up to it, and writing it splits the
/// history by device once (it scanned the whole history once per device: 14 s for 100,000
/// events in a release build).
#[test]
fn a_far_device_index_converts_at_once() {
    let history: Vec<_> = (0..20_000u64)
        .map(|i| json!({"action": "alloc", "addr": i * 512, "size": 512, "stream": 0, "time_ns": i}))
        .collect();
    let mut v = json!({
        "version": 4, "device": 0, "backend": "sim", "segments": [], "history": history, "history_dropped": 0,
        "frames": [], "stacks": [], "scopes": [[]], "threads": ["main"], "stats": {}
    });
    v["history"][19_999]["device"] = 65_535.into();
    let dir = std::env::temp_dir().join(format!("vramscope-far-device-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("far.json"), serde_json::to_vec(&v).unwrap()).unwrap();
    let started = Instant::now();
    vramscope(&[
        "convert".as_ref(),
        dir.join("far.json").as_os_str(),
        "-o".as_ref(),
        dir.join("far.pickle").as_os_str(),
    ]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "{took:?}");
    let summary = vramscope(&["summary".as_ref(), dir.join("far.pickle").as_os_str()]);
    assert!(summary.contains("device 65535:"), "{summary}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// 20,000 events each on a device of its own: every report is made per device from one split
/// of the snapshot (each device's part was filtered out of the whole history in turn, and
/// PyTorch's 65,536 possible devices took the summary past two minutes).
#[test]
fn many_devices_are_split_once() {
    let history: Vec<_> = (0..20_000u64)
        .map(|i| json!({"action": "alloc", "addr": i * 512, "size": 512, "stream": 0, "time_ns": i, "device": i}))
        .collect();
    let v = json!({
        "version": 4, "device": 0, "backend": "sim", "segments": [], "history": history, "history_dropped": 0,
        "frames": [], "stacks": [], "scopes": [[]], "threads": ["main"], "stats": {}
    });
    let path = std::env::temp_dir().join(format!("vramscope-many-devices-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    let started = Instant::now();
    let leaks = vramscope(&["leaks".as_ref(), path.as_os_str()]);
    let took = started.elapsed();
    std::fs::remove_file(&path).unwrap();
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(leaks.matches("device ").count(), 20_000, "one report per device");
}
