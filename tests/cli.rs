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
    format!("{}/fixtures/torch/{name}", env!("CARGO_MANIFEST_DIR"))
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
    assert_eq!(v["peak_live_bytes"], 139_501_684u64);
}

#[test]
fn replay_text_on_the_host_backend() {
    let (code, out, err) = vramscope(&["replay", &fixture("leaky_train.trace.json"), "--backend", "host"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ns/op (warm)") && out.contains("peak reserved") && out.contains("host"), "{out}");
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
    let (code, _, err) = vramscope(&["replay", &fixture("leaky_train.trace.json"), "--config", "colour:blue"]);
    assert_eq!(code, 2);
    assert!(err.contains("accepted keys"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
