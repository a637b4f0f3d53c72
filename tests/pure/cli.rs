//! The `plexus` command lines an operator types: `--help` everywhere, usage mistakes named with exit code 2,
//! and `plexus hook` on a real component.

use std::path::Path;
use std::process::{Command, Output};

use plexus_tests::plexus::{example_builds, guest_wasm, plexus_bin};
use serde_json::{json, Value};

fn plexus(args: &[&str]) -> Output {
    Command::new(plexus_bin())
        .args(args)
        .env_remove("CNI_COMMAND")
        .env_remove("NODE_NAME")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn every_command_has_help_on_stdout_with_exit_0() {
    for (args, mentions) in [
        (&["--help"][..], "install "),
        (&["--help"], "completions "),
        (&["hook", "--help"], "verify "),
        (
            &["hook", "run", "--help"],
            "[possible values: policy, resolver, status]",
        ),
        (&["hook", "run", "--help"], "resolver  {\"pod\": POD"),
        (
            &["hook", "inspect", "-h"],
            "plexus hook inspect [OPTIONS] <FILE>",
        ),
        (&["hook", "inspect", "-h"], "--log-level <LEVEL>"),
        (&["install", "--help"], "--poll-interval <DURATION>"),
        (&["daemon", "--help"], "--pod-wait-ms <N>"),
        (&["daemon", "--help"], "--hook-signatures <POLICY>"),
        (&["daemon", "--help"], "--log-file <FILE>"),
        (
            &["hook", "push", "--help"],
            "plexus hook push [OPTIONS] <FILE> <REFERENCE>",
        ),
        (
            &["hook", "verify", "-h"],
            "plexus hook verify [OPTIONS] <REFERENCE>",
        ),
        (
            &["--version"],
            concat!("plexus ", env!("CARGO_PKG_VERSION")),
        ),
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
fn shell_completions_cover_every_subcommand() {
    let out = plexus(&["completions", "bash"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    for word in [
        "install",
        "daemon",
        "hook",
        "--hook-signatures",
        "--poll-interval",
        "verify",
    ] {
        assert!(script.contains(word), "{word} is completed");
    }
    assert_eq!(plexus(&["completions", "tcsh"]).status.code(), Some(2));
}

#[test]
fn usage_mistakes_are_named_with_exit_2() {
    for (args, named) in [
        (&["frobnicate"][..], "unrecognized subcommand 'frobnicate'"),
        (&["hook", "inspect"], "<FILE>"),
        (
            &["hook", "inspect", "a.wasm", "--cache-dir", "/x"],
            "unexpected argument '--cache-dir'",
        ),
        (
            &["hook", "compile", "a.wasm", "--cache-dir"],
            "a value is required for '--cache-dir <DIR>'",
        ),
        (
            &["hook", "run", "a.wasm", "b.wasm"],
            "unexpected argument 'b.wasm'",
        ),
        (&["hook", "run", "a.wasm", "--input", "{}"], "--kind <KIND>"),
        (
            &[
                "hook",
                "run",
                "a.wasm",
                "--kind",
                "admission",
                "--input",
                "{}",
            ],
            "'admission'",
        ),
        (&["hook", "nope"], "unrecognized subcommand 'nope'"),
        (&["hook", "push", "a.wasm"], "<REFERENCE>"),
        (&["hook", "verify", "r.example/a:v1"], "--key <PUBLIC-PEM>"),
        (
            &[
                "hook",
                "push",
                "a.wasm",
                "r.example/a:v1",
                "--timeout-ms",
                "0",
            ],
            "invalid value '0' for '--timeout-ms <N>'",
        ),
        (
            &["daemon", "--node-name", "n", "--hook-signatures", "maybe"],
            "[possible values: required, off]",
        ),
        (&["install", "--bin"], "unexpected argument '--bin'"),
        (&["install", "--watch=yes"], "'--watch'"),
        (
            &["install", "--watch", "--uninstall"],
            "'--watch' cannot be used with '--uninstall'",
        ),
        (
            &["install", "--timeout", "soon"],
            "'soon' for '--timeout <DURATION>'",
        ),
        (
            &["daemon", "--node-name", "n", "--max-in-flight", "x"],
            "invalid value 'x' for '--max-in-flight <N>'",
        ),
        (&["daemon", "--node-name", "n", "--bogus"], "'--bogus'"),
        (
            &["daemon", "--node-name", "n", "--log-level", "loud"],
            "'loud'",
        ),
        (
            &["daemon", "--node-name", "n", "--install", "--bin"],
            "'--bin'",
        ),
        (&["daemon", "--socket", "/run/x.sock"], "NODE_NAME"),
    ] {
        let out = plexus(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: stdout is for results");
    }
}

/// `plexus hook run` of `wasm` with the kind flags `kind` and `--input input`.
fn hook_run(wasm: &Path, kind: &[&str], input: &str) -> Output {
    let mut args = vec!["hook", "run", wasm.to_str().unwrap()];
    args.extend_from_slice(kind);
    args.extend_from_slice(&["--input", input]);
    plexus(&args)
}

#[test]
fn hook_inspect_and_run_a_real_component() {
    // The Rust build, the Python one and the TypeScript one answer alike; what follows the loop is the command's
    // own (Rust only: a Python or TypeScript build costs seconds of compiling for each run).
    let builds = example_builds("namespace-isolation");
    for guest in builds
        .iter()
        .map(String::as_str)
        .chain(["ts-namespace-isolation"])
    {
        let wasm = guest_wasm(guest);
        let out = plexus(&["hook", "inspect", wasm.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(0), "{guest}: {}", text(&out.stderr));
        let info: Value = serde_json::from_slice(&out.stdout).unwrap();
        // A policy hook built with an SDK: exactly the kind named in its export.
        assert_eq!(info["kinds"], json!(["policy"]), "{info}");
        assert_eq!(info["kindsDeclared"], true, "{info}");
        assert_eq!(info["sha256"].as_str().map(str::len), Some(64), "{info}");

        // `--flag=value` and `--flag value` both work.
        let input = r#"{"pod": {"namespace": "team-a", "name": "p"},
                        "selections": [{"name": "net", "namespace": "team-b"}]}"#;
        let out = hook_run(&wasm, &["--kind=policy"], input);
        // Denied: its own exit status, so a script tells allow from deny.
        assert_eq!(out.status.code(), Some(3), "{guest}: {}", text(&out.stderr));
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(answer["output"]["decision"], "deny", "{answer}");
        assert_eq!(
            answer["output"]["reason"],
            "pod team-a/p may not select network team-b/net: only its own namespace and default are allowed",
            "{answer}"
        );
        // Admitted: 0.
        let own = r#"{"pod": {"namespace": "team-a", "name": "p"},
                      "selections": [{"name": "net", "namespace": "team-a"}]}"#;
        let out = hook_run(&wasm, &["--kind", "policy"], own);
        assert_eq!(out.status.code(), Some(0), "{guest}: {}", text(&out.stderr));
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(answer["output"]["decision"], "admit", "{answer}");
    }
    let wasm = guest_wasm("namespace-isolation");
    let run = |kind: &[&str], input: &str| hook_run(&wasm, kind, input);
    // A kind the module does not implement: an error (1) that says so.
    let out = run(
        &["--kind=resolver"],
        r#"{"pod": {"namespace": "a", "name": "p"}, "selection": {"name": "n", "namespace": "a"}}"#,
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("implements policy only, not resolver"),
        "{}",
        text(&out.stderr)
    );
    assert!(out.stdout.is_empty());

    // Input without what the kind needs, or without a pod, is a usage mistake naming it.
    for (input, named) in [
        (
            r#"{"pod": {"namespace": "a", "name": "p"}}"#,
            "input has no \"selections\"",
        ),
        (r#"{"selections": []}"#, "missing field `pod`"),
    ] {
        let out = run(&["--kind", "policy"], input);
        assert_eq!(out.status.code(), Some(2), "{input}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(named), "{input}: {stderr}");
    }
}

/// `plexus hook inspect x.wasm | head`: a reader that closed the pipe before the answer was written ends the
/// command quietly, with the command's own status, not a panic on stderr.
#[test]
fn a_closed_stdout_ends_hook_commands_quietly() {
    let wasm = guest_wasm("namespace-isolation");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(plexus_bin())
        .args(["hook", "inspect", wasm.to_str().unwrap()])
        .env_remove("CNI_COMMAND")
        .env_remove("NODE_NAME")
        .stdout(writer)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
}
