//! The `vramscope` command line.

use std::process::Command;

fn vramscope(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope")).args(args).output().expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn fixture(name: &str) -> String {
    format!("{}/../fixtures/torch/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn replay_json_has_the_promised_keys() {
    let (code, out, err) = vramscope(&["replay", &fixture("leaky_train.snapshot.pickle"), "--json", "--warm", "1"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for key in ["ops", "ns_per_op", "peak_live_bytes", "peak_reserved_bytes"] {
        assert!(v.get(key).is_some(), "{key} missing from {out}");
    }
    assert_eq!(v["ops"], 1140);
    assert_eq!(v["warm_device_calls"].as_array().map(Vec::len), Some(1), "one warm pass: {out}");
    assert_eq!(v["peak_live_bytes"], 139_501_684u64);
}

#[test]
fn fit_finds_a_cap_for_each_segment_kind() {
    let (code, out, err) = vramscope(&["fit", &fixture("resnet_train.trace.json.gz"), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for kind in ["virtual", "cumemalloc"] {
        let f = &v["segments"][kind];
        let (live, fits, fails) =
            (f["peak_live_bytes"].as_u64().unwrap(), f["fits"].as_u64().unwrap(), f["fails"].as_u64().unwrap());
        assert!(fails < fits && fits >= live, "{kind}: {f}");
        assert!(fits - fails <= (live / 1000).max(1 << 20), "bisected to 0.1%: {f}");
        // Replayed under each cap: it runs at `fits` and runs out of memory at `fails`.
        let pages = kind == "virtual";
        for (cap, runs) in [(fits, true), (fails, false)] {
            let conf =
                format!("release_pages:{pages},per_process_memory_fraction:{:?}", cap as f64 / (80u64 << 30) as f64);
            let (code, _, err) = vramscope(&[
                "replay",
                &fixture("resnet_train.trace.json.gz"),
                "--backend",
                "sim-cuda",
                "--warm",
                "2",
                "--capacity",
                "80GiB",
                "--config",
                &conf,
            ]);
            assert_eq!(code == 0, runs, "{kind} under {cap}: {err}");
            if !runs {
                assert!(err.contains("out of memory") && err.contains("may reserve"), "{err}");
            }
        }
    }
    let (code, out, err) = vramscope(&["fit", &fixture("resnet_train.trace.json.gz")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("virtual segments (the default)") && out.contains("cuMemAlloc segments"), "{out}");
    assert!(out.contains("  fits in        ") && out.contains("x live); out of memory at"), "{out}");
}

#[test]
fn replay_text_on_the_host_backend() {
    let (code, out, err) = vramscope(&["replay", &fixture("leaky_train.trace.json.gz"), "--backend", "host"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ns/op (warm)") && out.contains("peak reserved") && out.contains("host"), "{out}");
    assert!(out.contains("warm passes      "), "{out}");
    // Deciding as on CUDA (segment calls costly), a training loop settles in its cold pass
    // without views of the range's pages, and in its first warm pass with them (the default: a
    // view of the pages that the cold pass's growth left free).
    let args = ["replay", &fixture("leaky_train.trace.json.gz"), "--backend", "sim-cuda"];
    let (code, out, err) = vramscope(&[&args[..], &["--config", "alias_pages:false"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("warm passes      3 without a backend call for memory"), "{out}");
    let (code, out, err) = vramscope(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("warm passes      1 of 3 with backend calls for memory, the last pass 1 (1 call)"), "{out}");
    assert!(out.contains("1.052x live"), "{out}");
}

#[test]
fn unreadable_input_is_one_clear_line_and_exit_code_2() {
    let dir = std::env::temp_dir().join(format!("vramscope-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: [(&str, &[u8], &str); 4] = [
        ("empty.pickle", b"", "empty"),
        ("text.json", b"hello world", "neither"),
        ("truncated.pickle", b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c", "truncated"),
        ("wrong.json", br#"{"segments": []}"#, "not a JSON trace"),
    ];
    for (name, bytes, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let (code, out, err) = vramscope(&["replay", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(out.is_empty());
        assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
        assert!(err.contains(needle) && err.contains(name), "{name}: {err}");
    }
    let (code, _, err) = vramscope(&["replay", dir.join("missing.json").to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("missing.json"), "{err}");
    let (code, _, err) = vramscope(&["replay", &fixture("leaky_train.trace.json.gz"), "--config", "colour:blue"]);
    assert_eq!(code, 2);
    assert!(err.contains("accepted keys"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_report_subcommand_reads_a_pytorch_pickle() {
    let f = fixture("leaky_train.snapshot.pickle");
    for (args, needle) in [
        (vec!["summary", &f], "Allocated memory"),
        (vec!["live", &f], "scripts/train_loops.py:76 (leaky_train)"),
        (vec!["leaks", &f], "scripts/train_loops.py:71 (leaky_train)"),
        (vec!["segments", &f], "17 segments"),
        (vec!["folded", &f], "leaky_train (scripts/train_loops.py:76)"),
        (vec!["folded", "--allocated", &f], "leaky_train (scripts/train_loops.py:72)"),
        (vec!["diff", &f, &f], "no change"),
        (vec!["flamegraph", &f], "<svg"),
        (vec!["convert", &f], "\"segments\""),
    ] {
        let (code, out, err) = vramscope(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains(needle), "{args:?}: {needle:?} missing");
    }
    for sub in ["live", "leaks", "diff", "segments", "summary"] {
        let args: Vec<&str> = if sub == "diff" { vec![sub, &f, &f, "--json"] } else { vec![sub, &f, "--json"] };
        let (code, out, err) = vramscope(&args);
        assert_eq!(code, 0, "{sub}: {err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap_or_else(|e| panic!("{sub} --json: {e}"));
    }
}

#[test]
fn outputs_go_to_files_and_convert_round_trips() {
    let dir = std::env::temp_dir().join(format!("vramscope-cli-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = fixture("leaky_train.snapshot.pickle");
    let svg = dir.join("live.svg");
    let (code, out, err) = vramscope(&["flamegraph", &f, "-o", svg.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.is_empty());
    assert!(std::fs::read_to_string(&svg).unwrap().contains("train_loops.py"));
    let json = dir.join("s.json");
    let pickle = dir.join("s.pickle");
    assert_eq!(vramscope(&["convert", &f, "-o", json.to_str().unwrap()]).0, 0);
    assert_eq!(vramscope(&["convert", json.to_str().unwrap(), "--to", "pickle", "-o", pickle.to_str().unwrap()]).0, 0);
    let (_, a, _) = vramscope(&["leaks", &f]);
    let (_, b, _) = vramscope(&["leaks", pickle.to_str().unwrap()]);
    assert_eq!(a, b, "the leaks survive pickle -> JSON -> pickle");
    let (code, _, err) = vramscope(&["convert", &f, "--to", "pickle"]);
    assert_eq!(code, 2);
    assert!(err.contains("-o"), "{err}");
    // The format follows the output's name; a `--to` that contradicts it is refused.
    let by_name = dir.join("by_name.pickle");
    assert_eq!(vramscope(&["convert", json.to_str().unwrap(), "-o", by_name.to_str().unwrap()]).0, 0);
    assert_eq!(std::fs::read(&by_name).unwrap()[0], 0x80, "a pickle, as the name says");
    let by_name_json = dir.join("by_name.JSON");
    assert_eq!(vramscope(&["convert", by_name.to_str().unwrap(), "-o", by_name_json.to_str().unwrap()]).0, 0);
    assert_eq!(std::fs::read(&by_name_json).unwrap()[0], b'{');
    let contradicted = dir.join("contradicted.pickle");
    let (code, _, err) =
        vramscope(&["convert", json.to_str().unwrap(), "--to", "json", "-o", contradicted.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("--to json contradicts") && err.lines().count() == 1, "{err}");
    assert!(!contradicted.exists(), "nothing written");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn reports_refuse_bad_snapshots_with_one_line_and_exit_code_2() {
    let dir = std::env::temp_dir().join(format!("vramscope-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases: [(&str, &[u8], &str); 5] = [
        ("empty.pickle", b"", "empty"),
        ("random.bin", &[0x13, 0x37, 0xde, 0xad], "neither"),
        ("truncated.pickle", b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments", "truncated"),
        ("schema.json", br#"{"segments": 5}"#, "not a vramscope snapshot"),
        ("schema.pickle", b"\x80\x04]\x94.", "without `segments`"),
    ];
    for (name, bytes, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        for sub in ["summary", "live", "leaks", "segments", "folded", "flamegraph", "convert"] {
            let (code, out, err) = vramscope(&[sub, path.to_str().unwrap()]);
            assert_eq!(code, 2, "{sub} {name}: {err}");
            assert!(out.is_empty(), "{sub} {name}");
            assert_eq!(err.trim().lines().count(), 1, "{sub} {name}: {err}");
            assert!(err.contains(needle) && err.contains(name), "{sub} {name}: {err}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Special files are refused up front (a FIFO without a writer would block forever, `/dev/zero`
/// never ends), a gzip file cut short is named as such, `-o` paths that cannot be written are
/// the user's to fix (exit 2, one line), and out-of-range numbers are refused by the argument
/// parser.
#[cfg(unix)]
#[test]
fn special_files_outputs_and_numbers_are_exit_code_2() {
    let dir = std::env::temp_dir().join(format!("vramscope-cli-special-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let snapshot = fixture("leaky_train.snapshot.pickle");
    let missing_dir = dir.join("missing/out.txt");
    // A gzipped trace cut short (a download that stopped): the gzip layer says so, by name.
    let cut = dir.join("cut.trace.json.gz");
    std::fs::write(&cut, &std::fs::read(fixture("leaky_train.trace.json.gz")).unwrap()[..300]).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["summary", fifo.to_str().unwrap()], "not a regular file"),
        (vec!["summary", "/dev/zero"], "not a regular file"),
        (vec!["replay", fifo.to_str().unwrap()], "not a regular file"),
        (vec!["replay", cut.to_str().unwrap()], "cut.trace.json.gz: a gzip file that does not decompress"),
        (vec!["live", &snapshot, "-o", missing_dir.to_str().unwrap()], "cannot write"),
        (vec!["live", &snapshot, "-o", dir.to_str().unwrap()], "cannot write"),
        (vec!["replay", &snapshot, "--warm", "18446744073709551615"], "--warm"),
        (vec!["replay", &snapshot, "--warm", "1000000000000"], "--warm"),
    ];
    for (args, expected) in cases {
        let (code, _, err) = vramscope(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A reader that stops early (`| head`) ends the command quietly: exit code 0, nothing on
/// standard error (it used to panic with "failed printing to stdout: Broken pipe").
#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["convert", &fixture("resnet_train.snapshot.pickle")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read a little, as `head -c 100` would, then close the pipe; the JSON is megabytes long.
    let mut first = [0u8; 100];
    child.stdout.as_mut().unwrap().read_exact(&mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), stderr.as_ref()), (Some(0), ""));
}

/// Every report and every help text fits a 100-column terminal (file paths in site names
/// aside, which are as long as the program's paths), PyTorch's C++ frames too: recorded with
/// `_record_memory_history()`'s defaults, a site can be a C++ function whose parameters alone
/// take 400 columns.
#[test]
fn reports_and_help_fit_100_columns() {
    let f = fixture("resnet_train.snapshot.pickle");
    let g = fixture("leaky_train.snapshot.pickle");
    let cpp = fixture("corpus/second/hidden_state_not_detached.default.snapshot.pickle");
    let cpp_before = fixture("corpus/second/grad_norms_logged.default.snapshot.pickle");
    let mut runs: Vec<Vec<&str>> = vec![vec!["--help"]];
    for c in ["summary", "live", "leaks", "diff", "segments", "folded", "flamegraph", "convert", "replay"] {
        runs.push(vec![c, "--help"]);
    }
    for file in [&f, &g, &cpp] {
        for c in ["summary", "live", "leaks", "segments"] {
            runs.push(vec![c, file]);
        }
        runs.push(vec!["replay", file, "--warm", "1"]);
    }
    runs.push(vec!["diff", &g, &f]);
    runs.push(vec!["diff", &cpp_before, &cpp]);
    let (_, live, _) = vramscope(&["live", &cpp]);
    assert!(live.contains("x  at::_ops::_cudnn_rnn_backward::call(..)\n"), "{live}");
    assert!(live.contains("x  at::_ops::mm::call(at::Tensor const&, at::Tensor const&)\n"), "fits whole: {live}");
    for args in runs {
        let (code, out, err) = vramscope(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        for line in out.lines() {
            // Site names hold the program's own paths; the rest must fit.
            let fixed = ["scripts/", "/tmp/", "/fixtures/"].iter().fold(line, |l, p| l.split(p).next().unwrap_or(l));
            assert!(fixed.chars().count() <= 100, "{args:?}: {} columns: {line}", line.chars().count());
        }
    }
}

/// `flamegraph` without `-o` on a terminal says to name a file instead of pouring SVG into it
/// (run under `script`, which gives the command a terminal, where `script` exists).
#[test]
fn a_flamegraph_is_not_poured_into_a_terminal() {
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cmd = format!("{bin} flamegraph {}", fixture("leaky_train.snapshot.pickle"));
    let Ok(out) = Command::new("script").args(["-qec", &cmd, "/dev/null"]).output() else {
        eprintln!("skipped: no `script` to give the command a terminal");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("name one with -o") && !text.contains("<svg"), "{text}");
}

/// `--library` and `--user-code` say whose frames are whose before the built-in rule: a line of
/// code named a library's gives the site to its caller; the longer of two patterns decides; an
/// empty pattern is refused in one line.
#[test]
fn user_code_and_library_patterns_move_the_site() {
    let file = fixture("corpus/kv_cache_never_reset.snapshot.pickle");
    let (code, out, err) = vramscope(&["leaks", &file]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\ncorpus/programs.py:101 (kv_cache_never_reset)\n"), "{out}");
    let (code, out, err) = vramscope(&["leaks", &file, "--library", "corpus/programs.py"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\ncorpus/record.py:67 (run)\n"), "the caller is the site now:\n{out}");
    assert!(!out.contains("programs.py"), "{out}");
    let (code, out, err) = vramscope(&["--library", "corpus/", "live", &file, "--user-code", "corpus/programs.py"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("corpus/programs.py:101"), "the longer pattern decides:\n{out}");
    // The environment says the same for every report of a process, a test suite's included.
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["leaks", &file])
        .env("VRAMSCOPE_LIBRARY", "vendor/,corpus/programs.py")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\ncorpus/record.py:67 (run)\n"), "{text}");
    let (code, out, err) = vramscope(&["leaks", &file, "--library", ""]);
    assert_eq!(code, 2);
    assert!(out.is_empty());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("empty library pattern would match every frame"), "{err}");
}

/// One program recorded four ways (`fixtures/torch/variants`, ground truth in its README: lines
/// 13 and 31 keep 12 blocks each, 1.5 MiB and 768 KiB at the end). Where the history cannot
/// show a leak, `leaks` says so instead of "no leak candidates"; where it starts mid-run, the
/// lines are still named with their true live bytes, and a note says what it missed.
#[test]
fn leaks_says_what_a_history_cannot_show() {
    let leaks = |name: &str| {
        let (code, out, err) = vramscope(&["leaks", &fixture(&format!("variants/{name}.snapshot.pickle"))]);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(out.lines().all(|l| l.chars().count() <= 100), "{name}:\n{out}");
        out
    };
    for name in ["default", "small_ring"] {
        let out = leaks(name);
        assert!(out.starts_with("2 leak candidates"), "{name}:\n{out}");
        assert!(out.contains("probe.py:13 (forward)\n"), "{name}:\n{out}");
        assert!(out.contains("1.50 MiB in 12 blocks live at the end"), "{name}:\n{out}");
        assert!(out.contains("probe.py:31 (positional)\n"), "{name}:\n{out}");
        assert!(out.contains("768.00 KiB in 12 blocks live at the end"), "{name}:\n{out}");
        assert!(!out.contains("probe.py:26"), "freed with the model:\n{out}");
        let starts_mid_run = out.contains("The history starts in the middle of the program's work");
        assert_eq!(starts_mid_run, name == "small_ring", "{name}:\n{out}");
    }
    let out = leaks("state_only");
    assert!(out.starts_with("The history holds no allocation, so nothing here says whether memory leaks"), "{out}");
    assert!(!out.contains("no leak candidates"), "{out}");
    let out = leaks("no_context");
    assert!(out.starts_with("no line to name: no allocation in the history has a stack\n"), "{out}");
    assert!(out.contains("have no stack (recorded without stacks: PyTorch's\ncontext=None)"), "{out}");
    // JSON stays the list of candidates; the note goes to standard error.
    let (code, out, err) = vramscope(&["leaks", &fixture("variants/state_only.snapshot.pickle"), "--json"]);
    assert_eq!((code, out.trim()), (0, "[]"), "{err}");
    assert!(err.starts_with("The history holds no allocation"), "{err}");
}

/// Output faults: with standard error full, an error still exits 2 (not a panic's 101) and
/// `leaks --json` still writes its JSON; `-o` over a valid file that cannot be written whole
/// (a file size limit, as a full disk) leaves the valid file as it was.
#[test]
fn output_faults_leave_outputs_whole_and_exit_codes_true() {
    use std::os::unix::process::CommandExt;
    let full = || std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["summary", "/nonexistent.pickle"])
        .stderr(full())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let variants = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/torch/variants");
    let ring = std::fs::read_dir(variants)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("ring"))
        .expect("a recording whose ring was too small, with a note for stderr");
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("leaks")
        .arg(&ring)
        .arg("--json")
        .stderr(full())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the JSON, whole");
    assert!(json.is_array());

    let dir = std::env::temp_dir().join(format!("vramscope-atomic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join("resnet.json");
    std::fs::write(&target, b"the valid file").unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vramscope"));
    cmd.args(["convert", &fixture("resnet_train.snapshot.pickle"), "-o"]).arg(&target);
    // SAFETY: only async-signal-safe calls between fork and exec: a file size limit of 4 KiB,
    // and SIGXFSZ ignored so that passing it is a write error, not the end of the process.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 4096, rlim_max: 4096 };
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&target).unwrap(), b"the valid file");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "no temporary file left");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An error that quotes the input quotes it as one printable line of bounded length: a field of
/// a million characters with escape sequences in it prints neither whole nor raw.
#[test]
fn errors_quote_input_as_one_bounded_printable_line() {
    let path = std::env::temp_dir().join(format!("vramscope-long-op-{}.json", std::process::id()));
    let op = format!("\u{1b}[2J{}\nforged line", "x".repeat(1_000_000));
    std::fs::write(&path, serde_json::json!({"events": [[op, 1, 512, 0]]}).to_string()).unwrap();
    let (code, out, err) = vramscope(&["replay", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.len() < 1200, "{} bytes", err.len());
    assert!(!err.contains('\u{1b}'), "{err}");
    assert!(err.contains("more characters)"), "{err}");
}

/// `vramscope ledger` prints the ledger a snapshot carries, as text and as JSON, and says so
/// where a snapshot carries none.
#[test]
fn ledger_prints_what_the_snapshot_carries() {
    let alloc = vramscope::CachingAllocator::for_device(
        vramscope::backend::HostBackend::new(64 << 20),
        9_001,
        vramscope::config::AllocatorConfig::default(),
    )
    .unwrap();
    let x = alloc.alloc::<u8>(&alloc.default_stream(), 1 << 20).unwrap();
    let snap = vramscope::ledger::snapshot_with_ledger(&alloc);
    let path = std::env::temp_dir().join(format!("vramscope-ledger-{}.json", std::process::id()));
    std::fs::write(&path, snap.to_json()).unwrap();
    let file = path.to_str().unwrap();
    let (code, out, err) = vramscope(&["ledger", file]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("Device 9001 ledger: the process's total is not seen"), "{out}");
    assert!(out.contains("allocator host #1") && out.contains("not seen: the driver's figures"), "{out}");
    let (code, json, _) = vramscope(&["ledger", file, "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["device"], 9001);
    assert_eq!(v["allocators"][0]["allocated"], alloc.memory_allocated());
    let (_, summary, _) = vramscope(&["summary", file]);
    assert!(summary.contains("Device 9001 ledger"), "summary prints it: {summary}");
    let (code, _, err) = vramscope(&["ledger", &fixture("leaky_train.snapshot.pickle")]);
    assert_eq!(code, 2);
    assert!(err.contains("carries no ledger"), "{err}");
    drop(x);
    let _ = std::fs::remove_file(&path);
}

/// `ranks` reads its files on every core and lists them in the order given, as the library's
/// `report::ranks` over the same snapshots; the first file that cannot be read, in that order,
/// is the error.
#[test]
fn ranks_lists_files_in_order_as_the_library_does() {
    let files = ["leaky_train", "resnet_train", "expandable_unmap"].map(|f| fixture(&format!("{f}.snapshot.pickle")));
    let (code, out, err) = vramscope(&["ranks", &files[0], &files[1], &files[2], "--json"]);
    assert_eq!(code, 0, "{err}");
    let snaps: Vec<(String, vramscope::snapshot::Snapshot)> =
        files.iter().map(|f| (f.clone(), vramscope::snapshot::Snapshot::load(f).unwrap())).collect();
    let expected = serde_json::to_value(vramscope::report::ranks(&snaps)).unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap(), expected);
    let (code, _, err) = vramscope(&["ranks", &files[0], "no-such-rank1.pickle", "no-such-rank2.pickle"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no-such-rank1.pickle") && !err.contains("no-such-rank2"), "{err}");
    // Read largest first, reported in the order given: a file that cannot be read, named first,
    // is the error, though it is read last.
    let (code, _, err) = vramscope(&["ranks", "no-such-rank0.pickle", &files[1], &files[0]]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no-such-rank0.pickle"), "{err}");
}
