//! Reads plexus's phase timings back from a debug log (`logging::phase`): per invocation, the time of each
//! top-level phase and of each delegate exec, then medians over the invocations of one command.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::stats;

/// One invocation's phases, in milliseconds (`exec` summed over its delegates, `execs` counted).
#[derive(Debug, Default)]
struct Invocation {
    command: String,
    phases: BTreeMap<String, f64>,
    exec: Vec<f64>,
}

/// `35.2µs`, `1.02ms`, `870ns`, `1.5s` in milliseconds.
fn duration_ms(text: &str) -> Option<f64> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = text.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "ns" => n / 1e6,
        "µs" | "us" => n / 1e3,
        "ms" => n,
        "s" => n * 1e3,
        _ => return None,
    })
}

/// The value of `key=` in a log line (quotes removed), up to the next space.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("{key}="))? + key.len() + 1;
    let rest = &line[at..];
    let end = rest.find(' ').unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
}

fn parse(text: &str) -> Vec<Invocation> {
    let mut out: Vec<Invocation> = Vec::new();
    for line in text.lines() {
        if line.contains(" invoked command=") {
            // The first line of an invocation: its conf was read (before logging existed).
            let mut inv = Invocation {
                command: field(line, "command").unwrap_or_default().to_string(),
                ..Invocation::default()
            };
            if let Some(us) = field(line, "conf_us").and_then(|v| v.parse::<f64>().ok()) {
                inv.phases.insert("conf".into(), us / 1e3);
            }
            out.push(inv);
            continue;
        }
        let Some(close) = line.find(": close ") else {
            continue;
        };
        let Some(inv) = out.last_mut() else { continue };
        let spans = &line[..close];
        let depth = spans.matches("phase{").count();
        let Some(last) = spans.rfind("phase{") else {
            continue;
        };
        let Some(name) = field(&spans[last..], "phase{name") else {
            continue;
        };
        let name = name.trim_end_matches('}').trim_matches('"').to_string();
        let busy = field(line, "time.busy").and_then(duration_ms);
        let idle = field(line, "time.idle").and_then(duration_ms);
        let (Some(busy), Some(idle)) = (busy, idle) else {
            continue;
        };
        if name == "exec" {
            inv.exec.push(busy + idle);
        } else if depth == 1 {
            *inv.phases.entry(name).or_default() += busy + idle;
        }
    }
    out
}

/// Medians of each phase over the invocations of `command`, with the process's wall time (`wall`, one sample
/// per invocation, measured by the caller) and what the phases leave of it (process start, logging set-up, exit).
pub fn summary(text: &str, command: &str, wall: &[f64]) -> Value {
    let invs: Vec<Invocation> = parse(text)
        .into_iter()
        .filter(|i| i.command == command)
        .collect();
    let mut names: Vec<String> = invs.iter().flat_map(|i| i.phases.keys().cloned()).collect();
    names.sort();
    names.dedup();
    let median_of = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        stats::median(&v)
    };
    let mut phases = serde_json::Map::new();
    for name in &names {
        let v: Vec<f64> = invs
            .iter()
            .map(|i| i.phases.get(name).copied().unwrap_or(0.0))
            .collect();
        phases.insert(name.clone(), json!(median_of(v)));
    }
    let inside: Vec<f64> = invs.iter().map(|i| i.phases.values().sum()).collect();
    let execs: Vec<f64> = invs.iter().flat_map(|i| i.exec.iter().copied()).collect();
    let wall_median = median_of(wall.to_vec());
    let inside_median = median_of(inside);
    json!({
        "invocations": invs.len(),
        "wall": wall_median,
        "phases": phases,
        "inPhases": inside_median,
        "outsidePhases": wall_median - inside_median,
        "execEach": median_of(execs.clone()),
        "execsPerInvocation": if invs.is_empty() { 0.0 } else { execs.len() as f64 / invs.len() as f64 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_phases_of_each_invocation() {
        let log = "\
2026-11-25T05:00:00Z DEBUG invoked command=\"ADD\" container=c conf_us=200
2026-11-25T05:00:00Z DEBUG phase{name=\"lock\"}: close time.busy=40.0µs time.idle=10.0µs
2026-11-25T05:00:00Z DEBUG phase{name=\"attach\"}:phase{name=\"exec\" plugin=noop command=\"ADD\"}: close time.busy=1.00ms time.idle=0.0ns
2026-11-25T05:00:00Z DEBUG phase{name=\"attach\"}:phase{name=\"exec\" plugin=noop command=\"ADD\"}: close time.busy=3.00ms time.idle=0.0ns
2026-11-25T05:00:00Z DEBUG phase{name=\"attach\"}: close time.busy=4.5ms time.idle=0.0ns
2026-11-25T05:00:01Z DEBUG invoked command=\"DEL\" container=c conf_us=100
2026-11-25T05:00:01Z DEBUG phase{name=\"lock\"}: close time.busy=20.0µs time.idle=0.0ns
";
        let add = summary(log, "ADD", &[6.0]);
        assert_eq!(add["invocations"], 1);
        assert_eq!(add["phases"]["conf"], 0.2);
        assert_eq!(add["phases"]["lock"], 0.05);
        assert_eq!(add["phases"]["attach"], 4.5);
        assert_eq!(add["execEach"], 2.0);
        assert_eq!(add["execsPerInvocation"], 2.0);
        assert!((add["outsidePhases"].as_f64().unwrap() - (6.0 - 4.75)).abs() < 1e-9);
        let del = summary(log, "DEL", &[1.0]);
        assert_eq!(del["phases"]["lock"], 0.02);
        assert!(del["execEach"].is_null(), "no exec: no median");
    }
}
