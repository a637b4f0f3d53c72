//! The `plexus` command lines an operator types: `--help` everywhere, usage mistakes named with exit code 2,
//! and `plexus hook` on a real component.

use std::process::{Command, Output};

use plexus_tests::plexus::{guest_wasm, plexus_bin};
use serde_json::Value;

fn plexus(args: &[&str]) -> Output {
    Command::new(plexus_bin())
        .args(args)
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn every_command_has_help_on_stdout_with_exit_0() {
    for (args, mentions) in [
        (&["--help"][..], "plexus install"),
        (&["hook", "--help"], "plexus hook run"),
        (&["hook", "run", "--help"], "--kind policy|resolver|status"),
        (&["hook", "inspect", "-h"], "plexus hook inspect FILE"),
        (&["install", "--help"], "--poll-interval"),
        (&["daemon", "--help"], "--pod-wait-ms"),
        (&["daemon", "--help"], "--hook-signatures POLICY"),
        (
            &["hook", "push", "--help"],
            "plexus hook push FILE REFERENCE",
        ),
        (&["hook", "verify", "-h"], "plexus hook verify REFERENCE"),
    ] {
        let out = plexus(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let stdout = text(&out.stdout);
        assert!(stdout.contains(mentions), "{args:?}: {stdout}");
    }
}

#[test]
fn usage_mistakes_are_named_with_exit_2() {
    for (args, named) in [
        (&["frobnicate"][..], "unknown subcommand \"frobnicate\""),
        (&["hook", "inspect"], "missing FILE"),
        (
            &["hook", "inspect", "a.wasm", "--cache-dir", "/x"],
            "unknown option --cache-dir",
        ),
        (
            &["hook", "compile", "a.wasm", "--cache-dir"],
            "--cache-dir needs a value",
        ),
        (
            &["hook", "run", "a.wasm", "b.wasm"],
            "unexpected argument \"b.wasm\"",
        ),
        (
            &["hook", "run", "a.wasm", "--input", "{}"],
            "missing --kind",
        ),
        (&["hook", "nope"], "unknown hook command \"nope\""),
        (&["hook", "push", "a.wasm"], "missing REFERENCE"),
        (
            &["hook", "verify", "r.example/a:v1"],
            "give --key PUBLIC-PEM (or --unsigned)",
        ),
        (
            &[
                "hook",
                "push",
                "a.wasm",
                "r.example/a:v1",
                "--timeout-ms",
                "0",
            ],
            "--timeout-ms needs a positive",
        ),
        (
            &["daemon", "--node-name", "n", "--hook-signatures", "maybe"],
            "--hook-signatures takes required or off",
        ),
        (&["install", "--bin"], "unknown argument \"--bin\""),
        (&["install", "--watch=yes"], "--watch"),
        (
            &["daemon", "--node-name", "n", "--max-in-flight", "x"],
            "--max-in-flight needs a positive",
        ),
        (&["daemon", "--node-name", "n", "--bogus"], "--bogus"),
        (
            &["daemon", "--node-name", "n", "--install", "--bin"],
            "\"--bin\"",
        ),
    ] {
        let out = plexus(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: stdout is for results");
    }
}

#[test]
fn hook_inspect_and_run_a_real_component() {
    let wasm = guest_wasm("namespace-isolation");
    let out = plexus(&["hook", "inspect", wasm.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds = info["kinds"].as_array().unwrap();
    assert!(kinds.contains(&"policy".into()), "{info}");
    assert_eq!(info["sha256"].as_str().map(str::len), Some(64), "{info}");

    // `--flag=value` and `--flag value` both work.
    let input = r#"{"pod": {"namespace": "team-a", "name": "p"},
                    "selections": [{"name": "net", "namespace": "team-b"}]}"#;
    let out = plexus(&[
        "hook",
        "run",
        wasm.to_str().unwrap(),
        "--kind=policy",
        "--input",
        input,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["output"]["decision"], "deny", "{run}");

    // Input without what the kind needs, or without a pod, is a usage mistake naming it.
    for (input, named) in [
        (
            r#"{"pod": {"namespace": "a", "name": "p"}}"#,
            "input has no \"selections\"",
        ),
        (r#"{"selections": []}"#, "missing field `pod`"),
    ] {
        let out = plexus(&[
            "hook",
            "run",
            wasm.to_str().unwrap(),
            "--kind",
            "policy",
            "--input",
            input,
        ]);
        assert_eq!(out.status.code(), Some(2), "{input}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(named), "{input}: {stderr}");
    }
}
