//! `plexus migrate check`: the cluster as Plexus would meet it, read through the API before a move from Multus:
//! per pod and NAD, what would behave differently under Plexus, strict and with `"compat": "multus"`. The node's
//! half of the move (a Multus conf turned into the plexus conflist) is `plexus install --from-multus`
//! ([`plexus_node::multus`]).

use plexus_cluster::ClusterError;
use plexus_core::spec::NetworkAttachmentDefinition;
use plexus_node::multus::read_conf;
use plexus_node::terminal;
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// What one object would meet under Plexus, in each mode.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// `pod NAMESPACE/NAME` or `nad NAMESPACE/NAME`.
    pub object: String,
    pub issue: String,
    /// Without `compat`: what happens.
    pub strict: String,
    pub strict_fails: bool,
    /// With `"compat": "multus"`.
    pub multus: String,
    pub multus_fails: bool,
}

/// `plexus migrate check`'s answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub pods: usize,
    pub nads: usize,
    pub findings: Vec<Finding>,
    /// Pods that would fail to start (ADD) in each mode.
    pub pods_failing_strict: usize,
    pub pods_failing_multus: usize,
}

/// What a NAD's config is, for the check: no `cniVersion`, and its plugins (for their capabilities).
struct NadConf {
    missing_version: bool,
    plugins: Vec<Map<String, Value>>,
}

fn nad_conf(nad: &NetworkAttachmentDefinition) -> Option<NadConf> {
    let config: Value = serde_json::from_str(nad.config.as_deref()?).ok()?;
    // As compat mode runs it: a config without a version as 0.1.0.
    let versioned = plexus_cni::plan::with_missing_version(&config);
    let list = plexus_core::cni::NetworkConfigList::parse_with_default_name(
        versioned.as_ref().unwrap_or(&config),
        Some(&nad.name),
    )
    .ok()?;
    Some(NadConf {
        missing_version: versioned.is_some(),
        plugins: list.plugins,
    })
}

type NadConfs = std::collections::BTreeMap<(String, String), Option<NadConf>>;

fn finding(object: &str, issue: String, strict: (bool, &str), multus: (bool, &str)) -> Finding {
    Finding {
        object: object.to_string(),
        issue,
        strict: strict.1.to_string(),
        strict_fails: strict.0,
        multus: multus.1.to_string(),
        multus_fails: multus.0,
    }
}

/// A Multus conf's `systemNamespaces` (Multus's default when absent) and `defaultNetworks`.
fn multus_defaults(multus_conf: Option<&Value>) -> (Vec<String>, Vec<String>) {
    let Some(c) = multus_conf else {
        return (Vec::new(), Vec::new());
    };
    let conf = if c["plugins"][0].is_object() {
        &c["plugins"][0]
    } else {
        c
    };
    let list = |key: &str| -> Vec<String> {
        conf[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let system = match conf.get("systemNamespaces") {
        Some(_) => list("systemNamespaces"),
        None => vec!["kube-system".to_string()],
    };
    (system, list("defaultNetworks"))
}

/// What a pod's networks annotation meets: unknown keys, NADs without cniVersion, requests of capabilities the
/// NAD's plugins do not declare.
fn selection_findings(pod: &plexus_core::spec::Pod, confs: &NadConfs) -> Vec<Finding> {
    let object = format!("pod {}/{}", pod.namespace, pod.name);
    let mut findings = Vec::new();
    // Invalid for Multus as well (or no annotation): no difference to report.
    let Some((selections, strict_error)) = lenient_selections(pod) else {
        return findings;
    };
    if let Some((e, dropped)) = strict_error {
        findings.push(finding(
            &object,
            format!(
                "its networks annotation has keys the standard does not define: {}",
                dropped.join(", ")
            ),
            (true, &format!("fails: {e}")),
            (
                false,
                "the keys are ignored with a warning, as under Multus",
            ),
        ));
    }
    for sel in selections {
        let Some(Some(conf)) = confs.get(&(sel.namespace.clone(), sel.name.clone())) else {
            continue;
        };
        let network = sel.namespaced_name();
        if conf.missing_version {
            findings.push(finding(
                &object,
                format!("selects {network}, whose config has no cniVersion"),
                (true, "fails: the NAD's config is refused"),
                (false, "attached, the config run as 0.1.0"),
            ));
        }
        if let Err(e) = plexus_core::spec::check_capabilities(
            &sel.required_capabilities(),
            &conf.plugins,
            &network,
        ) {
            let why = format!(
                "fails: {e} (the standard's rule in both modes; Multus dropped the request silently)"
            );
            findings.push(finding(
                &object,
                format!(
                    "requests {} on {network}, whose plugins do not declare it",
                    e.capability
                ),
                (true, &why),
                (true, &why),
            ));
        }
    }
    findings
}

/// The cluster as Plexus would meet it: what each pod (and NAD) would see differently than under Multus, in
/// each mode. `multus_conf` is a node's Multus conf, for its `defaultNetworks` and `systemNamespaces`.
pub fn check(
    nads: &[NetworkAttachmentDefinition],
    pods: &[plexus_core::spec::Pod],
    multus_conf: Option<&Value>,
) -> Report {
    let confs: NadConfs = nads
        .iter()
        .map(|n| ((n.namespace.clone(), n.name.clone()), nad_conf(n)))
        .collect();
    let mut findings = Vec::new();
    for ((ns, name), conf) in &confs {
        if conf.as_ref().is_some_and(|c| c.missing_version) {
            findings.push(finding(
                &format!("nad {ns}/{name}"),
                "its config has no cniVersion".into(),
                (false, "refused: every pod selecting it fails"),
                (false, "run as 0.1.0, as under Multus"),
            ));
        }
    }
    let (system_namespaces, default_networks) = multus_defaults(multus_conf);
    let (mut failing_strict, mut failing_multus) = (0, 0);
    for pod in pods {
        let object = format!("pod {}/{}", pod.namespace, pod.name);
        let mut mine = selection_findings(pod, &confs);
        if let Some(default) = pod
            .annotations
            .get(plexus_cni::plan::MULTUS_DEFAULT_NETWORK)
            .filter(|v| !v.trim().is_empty())
        {
            mine.push(finding(
                &object,
                format!("{}: {default}", plexus_cni::plan::MULTUS_DEFAULT_NETWORK),
                (false, "ignored: the pod gets the cluster network instead"),
                (false, "replaces the cluster network, as under Multus"),
            ));
        }
        if !default_networks.is_empty() && system_namespaces.contains(&pod.namespace) {
            mine.push(finding(
                &object,
                format!(
                    "in a system namespace, where Multus attaches no defaultNetworks ({})",
                    default_networks.join(", ")
                ),
                (false, "gets the defaultNetworks"),
                (false, "gets none, as under Multus"),
            ));
        }
        failing_strict += usize::from(mine.iter().any(|f| f.strict_fails));
        failing_multus += usize::from(mine.iter().any(|f| f.multus_fails));
        findings.extend(mine);
    }
    Report {
        pods: pods.len(),
        nads: nads.len(),
        findings,
        pods_failing_strict: failing_strict,
        pods_failing_multus: failing_multus,
    }
}

impl Report {
    /// The report for a terminal: a line per finding, then the totals. Findings quote pods' annotations and
    /// NADs' configs, so each is shown with its control characters escaped ([`printable`]).
    pub fn text(&self) -> String {
        use terminal::printable;
        let mut out = String::new();
        for f in &self.findings {
            out.push_str(&format!(
                "{}: {}\n    strict: {}\n    compat multus: {}\n",
                printable(&f.object),
                printable(&f.issue),
                printable(&f.strict),
                printable(&f.multus)
            ));
        }
        out.push_str(&format!(
            "{} pods and {} NADs read; pods that would fail to start: {} strict, {} with \"compat\": \"multus\"\n",
            self.pods, self.nads, self.pods_failing_strict, self.pods_failing_multus
        ));
        out
    }
}

/// `plexus migrate ...`: moving a cluster from Multus.
#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    #[command(subcommand)]
    pub command: MigrateCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum MigrateCommand {
    /// What would behave differently under Plexus: reads every NAD and pod through the API
    #[command(
        long_about = "Reads every NetworkAttachmentDefinition and pod through the API (and a node's Multus conf, \
                      with --multus-conf) and prints, per object, what would behave differently under Plexus, \
                      strict and with \"compat\": \"multus\". Exit status: 0, or 3 when a pod would fail to \
                      start in the --compat mode; 1 on errors, 2 for bad arguments.",
        after_help = crate::cluster_args::CLUSTER_HELP
    )]
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    cluster: crate::cluster_args::ClusterArgs,
    /// Check the pods and NADs of this namespace only (and the NADs of other namespaces its pods select)
    /// [default: every namespace]
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// A node's Multus conf (00-multus.conf), for its defaultNetworks and systemNamespaces
    #[arg(long, value_name = "FILE")]
    multus_conf: Option<std::path::PathBuf>,
    /// The mode the exit status is about
    #[arg(long, value_name = "MODE", default_value = "multus", value_parser = ["multus", "strict"])]
    compat: String,
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
}

/// `plexus migrate check`'s exit status when a pod would fail to start.
pub const PODS_WOULD_FAIL: u8 = 3;

/// Runs `plexus migrate ...`.
pub fn main(args: MigrateArgs) -> u8 {
    let MigrateCommand::Check(args) = args.command;
    let report = match run_check(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("plexus migrate check: {}", terminal::printable(&e));
            return 1;
        }
    };
    if args.json {
        println!("{}", terminal::json(&report).unwrap_or_default());
    } else {
        print!("{}", report.text());
    }
    let failing = match args.compat.as_str() {
        "strict" => report.pods_failing_strict,
        _ => report.pods_failing_multus,
    };
    if failing > 0 {
        PODS_WOULD_FAIL
    } else {
        0
    }
}

/// The NADs and pods to check: the whole cluster's, or one namespace's with the NADs its pods select elsewhere.
async fn read_objects(
    api: &plexus_cluster::KubeApi,
    namespace: Option<&str>,
) -> Result<
    (
        Vec<NetworkAttachmentDefinition>,
        Vec<plexus_core::spec::Pod>,
    ),
    ClusterError,
> {
    let mut nads = api.nads(namespace).await?;
    let pods = api.pods(namespace).await?;
    if let Some(ns) = namespace {
        let elsewhere: BTreeSet<(String, String)> = pods
            .iter()
            .flat_map(selected_nads)
            .filter(|(other, _)| other != ns)
            .collect();
        for (other, name) in elsewhere {
            match api.nad(&other, &name).await {
                Ok(nad) => nads.push(nad),
                Err(ClusterError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok((nads, pods))
}

/// Why the annotation does not parse as the standard says, and the keys dropped to read it as Multus does.
type StrictError = (String, Vec<String>);

/// A pod's selections as Multus reads them: as the standard says, else without the keys it does not define, with
/// the strict error and the keys dropped; `None` without an annotation or when neither way parses.
fn lenient_selections(
    pod: &plexus_core::spec::Pod,
) -> Option<(
    Vec<plexus_core::spec::selection::Selection>,
    Option<StrictError>,
)> {
    use plexus_core::spec::selection::{parse_selections, without_unknown_keys};
    let value = pod.networks_annotation()?;
    match parse_selections(value, &pod.namespace) {
        Ok(s) => Some((s, None)),
        Err(e) => {
            let (lenient, dropped) = without_unknown_keys(value)?;
            let s = parse_selections(&lenient, &pod.namespace).ok()?;
            Some((s, Some((e.to_string(), dropped))))
        }
    }
}

/// The NADs a pod's networks annotation selects, `(namespace, name)`, read as leniently as Multus reads it.
fn selected_nads(pod: &plexus_core::spec::Pod) -> Vec<(String, String)> {
    lenient_selections(pod)
        .map(|(selections, _)| selections)
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s.namespace, s.name))
        .collect()
}

fn run_check(args: &CheckArgs) -> Result<Report, String> {
    let multus_conf = args.multus_conf.as_deref().map(read_conf).transpose()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let (nads, pods) = runtime.block_on(async {
        let (api, source) = args.cluster.connect().await.map_err(|e| e.to_string())?;
        // An error names the server; this says which configuration named it.
        read_objects(&api, args.namespace.as_deref())
            .await
            .map_err(|e| format!("{e} (the cluster of {source})"))
    })?;
    Ok(check(&nads, &pods, multus_conf.as_ref()))
}
