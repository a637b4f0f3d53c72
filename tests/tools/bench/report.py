#!/usr/bin/python3
"""Renders docs/benchmarks.md and docs/benchmarks.png from plexus-bench's results.json and hook_bench's JSON.

Run by tests/bench.sh; the report is overwritten on every run. Every figure comes from those two files.
"""

import argparse
import datetime
import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 1024.0


def f(x, nd=2):
    if x is None or x != x:
        return "n/a"
    return f"{x:.{nd}f}"


def yes(ok):
    if ok is None:
        return "not measured"
    if ok == "info":
        return "(breakdown)"
    return "**met**" if ok else "**missed**"


def case(results, cid):
    for c in results.get("cases") or []:
        if c["id"] == cid:
            return c
    return None


def med(c, op="add"):
    return c[op]["median"] if c else float("nan")


def linear_fit(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys) or 1e-12
    return a, b, 1 - ss_res / ss_tot


def top_lines(text, n, skip_prefix=()):
    out = []
    for line in text.splitlines():
        if line.strip() and not line.startswith(skip_prefix):
            out.append(line.rstrip())
        if len(out) >= n:
            break
    return out


# The results' sections a run of some alone may replace (--extra).
SECTIONS = ("startup", "cases", "scaling", "concurrency", "hammer", "daemon", "density", "densityLarge",
            "hookMemory", "languages", "profile")

DENSITY_LABELS = (("floor", "cluster network alone (the floor)"),
                  ("runtime-3", "the same three networks, attached by containerd itself"),
                  ("plexus-daemon", "Plexus, daemon mode"),
                  ("plexus-thin", "Plexus, thin mode"), ("plexus-nri", "Plexus, NRI mode"),
                  ("multus-thick", "Multus thick"))


CPU_PARTS = [
    ("network plugins", "network plugins: what the runtime execs and reaps (the CNI plugin, its delegates, IPAM; "
     "also containerd's runc shim start command, CRI-O's conmon and pinns)"),
    ("node agent", "node agent (Plexus's or Multus's daemon)"),
    ("containerd", "containerd"),
    ("cri-o", "CRI-O"),
    ("kubelet", "kubelet"),
    ("kube-apiserver", "kube-apiserver"),
    ("etcd", "etcd"),
    ("scheduler, controllers", "kube-scheduler, kube-controller-manager"),
    ("bench", "the bench (its watch of the pods, the RSS sampler)"),
    ("rest", "the rest: containers, their shims and runc, the kernel's threads"),
    ("machine", "**the machine**"),
    ("steal", "the hypervisor's: time it ran others while this machine wanted a core (steal; not in the machine's)"),
]


def cpu_section(ds, w):
    """Where the node's CPU time went during each subject's burst, per pod."""
    keys = [k for k, _ in DENSITY_LABELS if "cpuMsPerPod" in (ds.get(k) or {})]
    if not keys:
        return
    cpu = {k: {p: v["median"] for p, v in ds[k]["cpuMsPerPod"].items()} for k in keys}
    w("Where the node's CPU went from the first create to the last pod Ready: user + system ms per pod (median over "
      "rounds). Each part is its processes' own time, or for *network plugins* the time of the children the runtime "
      "reaped; *the machine* is the whole node's busy time (`/proc/stat`: not idle, iowait or steal). On a node this "
      "busy the last pod is Ready about when the machine has done the burst's work, so the machine's CPU per pod adds "
      "up what a subject cost every process on the node, wherever its pods waited; it moves less between rounds than "
      "any p99.")
    w("")
    labels = dict(DENSITY_LABELS)
    w("| ms CPU per pod | " + " | ".join(labels[k] for k in keys) + " |")
    w("| --- | " + " | ".join("---" for _ in keys) + " |")
    for part, label in CPU_PARTS:
        if not any(part in cpu[k] for k in keys):
            continue
        cells = []
        for k in keys:
            x = cpu[k].get(part)
            cells.append("–" if x is None or (part == "node agent" and x == 0) else f(x, 1))
        w(f"| {label} | " + " | ".join(cells) + " |")
    floor = cpu.get("floor", {}).get("machine")
    runtime = cpu.get("runtime-3", {}).get("machine")
    if floor:
        w("| the machine / the floor's | " + " | ".join(f(cpu[k]["machine"] / floor) for k in keys) + " |")
    if runtime:
        w("| the machine over containerd's three networks, ms per pod | " +
          " | ".join(f(cpu[k]["machine"] - runtime, 1) if k != "floor" else "–" for k in keys) + " |")
    w("")


def density_table(dn, w, large, separately=None):
    """A density section's table of subjects, its CPU table and its notes; `separately`, the time of the run of
    its own it was measured in, if it was."""
    ds = dn["subjects"]
    if large:
        w(f"### The same at {dn['pods']} pods at once")
        w("")
        alone = ""
        if separately:
            when = datetime.datetime.fromtimestamp(separately, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            alone = (f" Measured {when} in a run of this section alone (`plexus-bench --only density-large`, "
                     "its results given to the report with `--extra`), on the same machine.")
        w(f"As above, with {dn['pods']} pods per burst (the kubelet's usual maximum of pods per node is 110 to 250), "
          f"{dn['rounds']} round(s), subjects {', '.join(k for k, _ in DENSITY_LABELS if k in ds)}.{alone}")
        w("")
    w("| subject | startup p50 | p99 | max | sandbox p50 | p99 | pods/s | p99 / floor's, per round (median) | "
      "p99 / containerd's three networks', per round (median) | network set-up per sandbox, mean (containerd's "
      "timer) | its / containerd's three networks' | teardown | node agent RSS: resting → peak → after | agent CPU | "
      "API requests | addresses left |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, label in DENSITY_LABELS:
        v = ds.get(key)
        if not v:
            continue
        rd, sb, ag = v["ready"], v["sandbox"], v.get("agent")
        agent = (f"{f(ag['restKiB'] / 1024, 1)} → {f(ag['peakKiB'] / 1024, 1)} → {f(ag['afterKiB'] / 1024, 1)} MiB"
                 if ag else "none (no node agent)")
        cpu = f"{f(ag['cpuSeconds'], 2)} s" if ag else ""
        ratio = f(v["readyP99OverFloor"]["median"]) if "readyP99OverFloor" in v else ""
        over3 = f((v.get("readyP99OverRuntime3") or {}).get("median"))
        setup = f((v.get("cniSetupMs") or {}).get("median"), 0)
        setup3 = f((v.get("cniSetupOverRuntime3") or {}).get("median"))
        down = f((v.get("cniTeardownMs") or {}).get("median"), 0)
        w(f"| {label} | {f(rd['median'] / 1e3, 1)} s | {f(rd['p99'] / 1e3, 1)} s | {f(rd['max'] / 1e3, 1)} s | "
          f"{f(sb['median'] / 1e3, 1)} s | {f(sb['p99'] / 1e3, 1)} s | {f(v['podsPerSecond']['median'], 1)} | {ratio} | {over3} | "
          f"{setup} ms | {setup3} | {down} ms | "
          f"{agent} | {cpu} | {f(v['apiRequests']['median'], 0)} | {v['leftAddresses']} |")
    w("")
    rounds = ", ".join(f"{k} " + "/".join(f(x / 1e3, 1) for x in ds[k]["readyP99"]["rounds"])
                       for k, _ in DENSITY_LABELS if k in ds)
    ratios = ", ".join(f"{k} " + "/".join(f(x) for x in ds[k]["readyP99OverFloor"]["rounds"])
                       for k, _ in DENSITY_LABELS if k in ds and k != "floor")
    cpu_section(ds, w)
    w(f"Startup p99 of each round, s: {rounds}; over the floor's of the same round: {ratios}. API requests are those the API server's audit log attributes to the "
      "subject's identities during the burst (the node daemon's and the CNI plugin's service accounts; Multus's). "
      "*Addresses left*: what host-local still held 30 s after the subject's pods were gone (summed over rounds; the "
      "bench then frees them, so that a leak does not shrink the next burst's range).")
    w("")
    for key, label in DENSITY_LABELS:
        v = ds.get(key) or {}
        held = {}
        for by in v.get("leftByNetwork", []):
            for net, n in by.items():
                held[net] = held.get(net, 0) + n
        if held:
            nets = ", ".join(f"{n} of {net}" for net, n in sorted(held.items()))
            w(f"{label}: addresses still held after its pods were gone: {nets} (its DEL of those networks did not "
              "release them; containerd's teardown at the end of the burst tries again).")
            w("")


def density_section(dn, w, plot, m):
    ds = dn["subjects"]
    mu = dn.get("multus") or {}
    w("## Node density: many pods with secondary networks on one node")
    w("")
    w(f"![Pod startup latency, node density](density.png)")
    w("")
    runtime = {"containerd": "containerd 2", "cri-o": "CRI-O 1.36"}.get(dn.get("runtime", "containerd"))
    w(f"Runtime: **{runtime}** (`plexus-bench --runtime`; containerd unless it says otherwise). On CRI-O, which attaches "
      "one CNI network per pod and serves no timer of its CNI calls, the subject of the three networks attached by "
      "the runtime itself and the network set-up column are not measured.")
    w("")
    w(f"As kube-burner's node-density-cni measures it, on one real node: kubelet over {runtime} (from "
      f"tests/parts), pods placed by the real kube-scheduler. {dn['pods']} pods are created at once (four threads of "
      f"creates), each with the cluster network and {dn['networks'] - 1} secondary networks (NADs of the reference "
      "bridge + host-local, each its own bridge and subnet); when every pod is Ready they are all deleted. Each subject "
      "gets a fresh runtime and kubelet whose CNI configuration is the subject's; the subjects run one after the "
      f"other, {dn['rounds']} round(s), each round starting with the next subject, and the IPAM state reset after "
      "each subject's burst. Each burst starts from the same machine: the kernel's clean caches dropped (the memory "
      "cgroups of the pods before, kept until the page cache charged to them goes, pile up by the thousand over a run, "
      "and the whole node's CPU per pod grew with them, round after round), the binaries the burst execs read back "
      "in, and the machine quiet (under half a core busy over a second). *Startup*: from the create request to the pod's Ready condition as the bench sees "
      "it (a watch of the pods, from before the first create); *sandbox*: to `PodReadyToStartContainers`, the kubelet's \"sandbox "
      "created and its network set up\"; *network set-up*: containerd's own timer of the CNI ADD of each sandbox (its "
      "`network_plugin_operations_duration_seconds` metric, sum over count), the plugin's part of a pod's start without "
      "the rest. Latencies are over every pod of every round; pods/s, API requests and the "
      "node agent's figures are medians over rounds. *Floor*: the cluster network's conflist alone is the runtime's "
      "configuration (no secondary networks: the two extra networks' delegates are part of every other subject's "
      "cost). *The same three networks, attached by containerd itself*: no multi-network plugin; containerd loads the "
      "cluster network's and the two NADs' conflists (`max_conf_num` 3) and runs them one after another "
      "(`setup_serially`), as Plexus runs its delegates: the networks' own work, so that a subject over it is what "
      "the subject adds. *Plexus, NRI mode*: the cluster network's conflist alone is the runtime's configuration, as "
      "for the floor, and the node daemon in NRI mode (`plexus daemon --nri`) attaches the two secondary networks at "
      "each sandbox's `RunPodSandbox`, with the runtime's default NRI request timeout; its network set-up column is "
      "the cluster network's alone, as the runtime times only its own CNI. *Multus thick*: " + (f"{mu['version']}, multus-shim and multus-daemon built from the Go module proxy "
      "(tests/parts/multus), its daemon configured as its DaemonSet is (`multusConfigFile: auto`, the cluster network "
      "its default)." if "version" in mu else f"not measured ({mu.get('skipped', 'no Multus given')})."))
    w("")
    density_table(dn, w, False)
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
    for key, label in DENSITY_LABELS:
        v = ds.get(key)
        if not v:
            continue
        xs = sorted(x / 1e3 for x in v["ready"]["samples"])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=label)
    ax.set_xlabel("pod startup latency, s (created → Ready)")
    ax.set_ylabel("fraction of pods Ready")
    ax.set_title(f"{dn['pods']} pods at once, {dn['networks'] - 1} secondary networks each, {dn['rounds']} round(s) "
                 f"({m['nproc']} CPUs)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plot)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--hooks", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot", required=True)
    ap.add_argument("--density-plot", required=True)
    ap.add_argument("--extra", action="append", default=[],
                    help="results of a run of some sections alone (plexus-bench --only ...): each section measured "
                         "there replaces the main run's, and the report says when it was measured")
    args = ap.parse_args()
    r = json.load(open(args.results))
    for extra in args.extra:
        e = json.load(open(extra))
        for key, value in e.items():
            if key in SECTIONS and value:
                r[key] = value
                r.setdefault("separately", {})[key] = e["generatedAt"]
    hb = json.load(open(args.hooks))
    m = r["machine"]
    runs = r["runs"]
    L = []
    w = L.append

    w("# Benchmarks")
    w("")
    w("<!-- Generated by tests/bench.sh (tests/tools/bench/report.py) from target/bench/results.json; overwritten on every run. -->")
    w("")
    when = datetime.datetime.fromtimestamp(r["generatedAt"], datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    w(f"Measured {when}, in one run of `bash tests/bench.sh` as root (the command to reproduce; about "
      f"{r['benchSeconds'] / 60:.0f} minutes of measuring after the build). Every latency is a median or p95 over "
      f"{runs} runs unless stated; every ratio compares medians taken in this same run, interleaved run by run, "
      f"because the machine is shared and noisy.")
    if r.get("separately"):
        names = {"densityLarge": "density-large"}
        runs_alone = ", ".join(
            f"`{names.get(k, k)}` at "
            + datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            for k, t in sorted(r["separately"].items()))
        w("")
        w(f"Measured again in a run of their own (`plexus-bench --only SECTION`, given to the report with `--extra`), "
          f"on the same machine, and shown in place of that run's: {runs_alone}. A ratio compares figures of one run.")
    w("")
    w("## Machine")
    w("")
    w("| | |")
    w("| --- | --- |")
    w(f"| CPUs (nproc) | {m['nproc']} |")
    w(f"| CPU model | {m['cpu']} |")
    w(f"| memory | {m['memMiB']} MiB |")
    w(f"| kernel | {m['kernel']} |")
    w(f"| root filesystem (cache, run and manifest dirs live on it) | {m['rootFs']} |")
    w(f"| load average at start / end of the measurements | {m['loadavg']} / {r.get('loadavgEnd', 'n/a')} |")
    w(f"| plexus binary | {r['plexusBinaryBytes'] / MIB / MIB:.0f} MiB (release, line-tables debug info) |")
    w("")
    w("## What is measured")
    w("")
    w("- **Pod**: the cluster network plus 3 secondary networks (NADs in the pod's namespace), through plexus with "
      "`FileCluster` (a directory of manifests), as a runtime runs it: a fresh `plexus` process per ADD and per DEL, "
      "config on stdin, `CNI_*` in the environment. Time is from fork to reaping the process: what the pod waits.")
    w("- **Floor**: a minimal driver inside the bench (`tests/tools/bench/floor.rs`) that execs the same delegate plugins "
      "with the same configurations directly, as libcni does (name and cniVersion injected, `prevResult` chained, DEL "
      "in reverse with the cached result), one network after the other. Floor = the delegates' own cost plus process "
      "creation; **overhead = plexus median − floor median**.")
    w("- **Delegates**: *noop* is the bench binary exec'd as `bench-noop` (reads its config, prints a fixed result), "
      "which isolates Plexus's own cost; *real* is Debian's `bridge` + `host-local` (one bridge and subnet per network) "
      "in a real network namespace per pod, created and deleted outside the timed region.")
    w("- **Hooks**: the three example guests (namespace-isolation policy, network-templates resolver, status-labels). "
      "*Warm*: compiled artifacts already in `cacheDir/hooks`. *Cold*: that directory emptied before each ADD (outside "
      "the timed region), so the ADD compiles all three. *From the node agent*: the three compiled once by `plexus hook "
      "compile` (what the agent runs) and published as the node's hook set with precompiled entries (what the agent "
      "writes); every ADD is a fresh process that reads the set and maps the artifacts, as the first ADD after the "
      "agent published does (the page cache is warm, as it is right after the agent wrote them). *Python* and "
      "*TypeScript hooks from the node agent*: the same with three hooks written in that language (namespace-isolation, "
      "pod-prefix, status-labels), through plexus-cni.")
    w("- **plexus-cni**: the CNI plugin alone, built without the compiler and the node's parts (`cargo build -p "
      "plexus-cni`): the binary the image installs on nodes. *plexus* rows are the full binary.")
    w("- **Peak RSS**: `ru_maxrss` of each plexus ADD process from `wait4`.")
    w("")

    # ---------------------------------------------------------------- targets
    nf, npx, nw, nc = (case(r, f"noop/{v}") for v in ("floor", "plexus", "plexus+3 hooks warm", "plexus+3 hooks cold"))
    rf, rpx, rw, rc = (case(r, f"real/{v}") for v in ("floor", "plexus", "plexus+3 hooks warm", "plexus+3 hooks cold"))
    rows = []
    if nf and npx:
        ov = med(npx) - med(nf)
        lim = 2 + 0.3 * 4
        rows.append(("Plexus's own overhead per ADD, no-op delegates, no hooks, 4 attachments", f"≤ {lim:.1f} ms (2 ms + 0.3 ms × 4)",
                     f"{f(ov)} ms ({f(med(npx))} − {f(med(nf))})", ov <= lim))
    scal = r.get("scaling") or []
    if scal:
        worst = []
        for s in scal:
            k = s["attachments"]
            ov = s["plexus"]["add"]["median"] - s["floor"]["add"]["median"]
            worst.append((ov - (2 + 0.3 * k), k, ov))
        bad = [x for x in worst if x[0] > 0]
        desc = ", ".join(f"{k}: {f(ov)}" for _, k, ov in worst)
        rows.append(("… the same at 1, 2, 4, 8, 16 attachments", "≤ 2 ms + 0.3 ms × attachments at each",
                     f"{desc} ms", not bad))
    if nf and nw:
        ov = med(nw) - med(nf)
        rows.append(("Plexus's own overhead per ADD, no-op delegates, three warm hooks", "≤ 5 ms", f"{f(ov)} ms", ov <= 5))
    if rf and rpx:
        ratio = med(rpx) / med(rf)
        rows.append(("Plexus / floor, real bridge + host-local, no hooks (ADD)", "≤ 1.3",
                     f"{f(ratio)} ({f(med(rpx))} / {f(med(rf))} ms)", ratio <= 1.3))
        ratio_d = med(rpx, "del") / med(rf, "del")
        rows.append(("Plexus / floor, real bridge + host-local, no hooks (DEL)", "≤ 1.3",
                     f"{f(ratio_d)} ({f(med(rpx, 'del'))} / {f(med(rf, 'del'))} ms)", ratio_d <= 1.3))
    rss_cases = [(c["id"], c["maxRssKiB"]["max"]) for c in r.get("cases") or [] if "maxRssKiB" in c]
    if rss_cases:
        warm_max = max(v for k, v in rss_cases if "cold" not in k)
        rows.append(("Peak RSS of the plexus process per ADD (no hooks and warm hooks, max over all runs)", "≤ 30 MiB",
                     f"{f(warm_max / MIB, 1)} MiB", warm_max <= 30 * MIB))
        cold_max = max([v for k, v in rss_cases if "cold" in k] or [0])
        if cold_max:
            rows.append(("… when the ADD compiles three hooks (cold cache)", "≤ 30 MiB",
                         f"{f(cold_max / MIB, 1)} MiB", cold_max <= 30 * MIB))
    if len(scal) >= 3:
        ks = [s["attachments"] for s in scal]
        # The ADD's cost through plexus against attachments. (An earlier report fitted plexus's overhead alone;
        # once that overhead became nearly constant, its slope was smaller than the noise and R² said nothing
        # about linearity. The overhead's own fit is shown beside it.)
        a, b, r2 = linear_fit(ks, [s["plexus"]["add"]["median"] for s in scal])
        oa, ob, _ = linear_fit(ks, [s["plexus"]["add"]["median"] - s["floor"]["add"]["median"] for s in scal])
        rows.append(("Cost linear in attachments (least squares of the plexus ADD median against attachments, "
                     "1-16)", "R² ≥ 0.95",
                     f"{f(a)} ms + {f(b)} ms × k, R² = {f(r2, 3)} (overhead alone: {f(oa)} ms + {f(ob)} ms × k)",
                     r2 >= 0.95))
    for g in hb["guests"]:
        p50 = g["warmCall"]["p50Us"]
        rows.append((f"Warm hook call p50, {g['guest']}", "≤ 100 µs", f"{f(p50, 1)} µs (p99 {f(g['warmCall']['p99Us'], 1)} µs)", p50 <= 100))
    for g in hb["guests"]:
        rows.append((f"Cached load, {g['guest']}", "≤ 5 ms", f"{f(g['cachedLoadMs'])} ms", g["cachedLoadMs"] <= 5))
    if npx and nw:
        add = med(nw) - med(npx)
        rows.append(("Three warm hooks' added cost on one ADD (no-op delegates)", "≤ 5 ms", f"{f(add)} ms", add <= 5))
    if rpx and rw:
        add = med(rw) - med(rpx)
        rows.append(("Three warm hooks' added cost on one ADD (real plugins)", "≤ 5 ms", f"{f(add)} ms", add <= 5))

    for d, label in (("noop", "no-op delegates"), ("real", "real plugins")):
        base, agent = case(r, f"{d}/plexus-cni"), case(r, f"{d}/plexus-cni+3 hooks from the node agent")
        full_base, full_agent = case(r, f"{d}/plexus"), case(r, f"{d}/plexus+3 hooks from the node agent")
        if base and agent:
            add = med(agent) - med(base)
            extra = f"; full binary {f(med(full_agent) - med(full_base))} ms" if full_base and full_agent else ""
            rows.append((f"Three hooks precompiled by the node agent: added cost on an ADD, plexus-cni ({label})", "≤ 5 ms",
                         f"{f(add)} ms ({f(med(agent))} − {f(med(base))}{extra}; an ADD compiling them: "
                         f"{f(med(nc if d == 'noop' else rc), 0)} ms)", add <= 5))
        for language in ("Python", "TypeScript"):
            other = case(r, f"{d}/plexus-cni+3 {language} hooks from the node agent")
            if base and other:
                add = med(other) - med(base)
                rows.append((f"Three hooks in {language} precompiled by the node agent: added cost on an ADD, "
                             f"plexus-cni ({label})", "≤ 10 ms per hook",
                             f"{f(add / 3)} ms per hook ({f(add)} ms for the three: {f(med(other))} − {f(med(base))})",
                             add / 3 <= 10))
    bins = r.get("binaries") or {}
    rel, dist = bins.get("releaseStripped") or {}, bins.get("dist") or {}
    if rel.get("plexusCni"):
        shipped = dist.get("plexusCni")
        size = shipped or rel["plexusCni"]
        what = "dist-cni profile" if shipped else "release profile stripped (no dist-cni build present)"
        full = dist.get("plexus") or rel.get("plexus")
        full_what = "dist" if dist.get("plexus") else "release, stripped"
        rows.append(("The binary kubelet's runtime execs (plexus-cni), stripped", "≤ 6 MB",
                     f"{f(size / 1e6, 1)} MB ({what}; full plexus binary {f(full / 1e6, 1)} MB, {full_what})",
                     size <= 6e6))

    dm = r.get("daemon")
    if dm:
        cy = dm["cycles"]
        cni = cy.get("daemonCni")
        best = min(cy["daemonOverFloor"], cy.get("daemonCniOverFloor", 99))
        st0 = (r.get("startup") or {}).get("plexusCniVersion")
        # Any plugin the runtime execs starts twice per cycle: the floor plus two bare starts of plexus-cni.
        bound = (f"; the floor plus two bare process starts of plexus-cni ({f(st0['median'])} ms each, answering "
                 f"VERSION) is already {f((cy['floor']['median'] + 2 * st0['median']) / cy['floor']['median'])}"
                 if st0 else "")
        rows.append(("Node daemon: ADD+DEL cycle / floor, kube source (real kube-apiserver), no-op delegates, 4 attachments",
                     "≤ 1.3", f"{f(cy['daemonCniOverFloor'])} through plexus-cni, {f(cy['daemonOverFloor'])} through plexus "
                     f"({f(cni['median'])} and {f(cy['daemon']['median'])} / {f(cy['floor']['median'])} ms){bound}" if cni
                     else f"{f(cy['daemonOverFloor'])} ({f(cy['daemon']['median'])} / {f(cy['floor']['median'])} ms){bound}",
                     best <= 1.3))
        ten = cy.get("ten")
        if ten:
            rows.append((f"… the same with 10 NADs ({ten['attachments']} attachments), plexus-cni", "≤ 1.15",
                         f"{f(ten['daemonOverFloor'])} ({f(ten['daemon']['median'])} / {f(ten['floor']['median'])} ms)",
                         ten["daemonOverFloor"] <= 1.15))
        mu = cy.get("multus") or {}
        if "cycle" in mu:
            rows.append((f"Daemon mode against Multus {mu['version']} thick (same pods, NADs, delegates, run), ADD+DEL cycle",
                         "faster", f"plexus-cni {f(cni['median'])} ms, Multus {f(mu['cycle']['median'])} ms "
                         f"({f(mu['plexusCniOverMultus'])}×)", mu["plexusCniOverMultus"] < 1))
        else:
            rows.append(("Daemon mode against Multus thick, ADD+DEL cycle", "faster",
                         f"not measured: {mu.get('skipped', 'no Multus given')} (a directory with multus-shim and "
                         "multus-daemon)", None))
        rows.append(("Thin mode (no daemon): ADD+DEL cycle / floor, 4 attachments", "≤ 1.8",
                     f"{f(cy['thinOverFloor'])} ({f(cy['thin']['median'])} / {f(cy['floor']['median'])} ms)",
                     cy["thinOverFloor"] <= 1.8))
        cdel = cy.get("del")
        if cdel:
            hs = cdel["apiStopped"]
            worst = max(cdel["daemonCniOverFloor"], hs["daemonOverFloor"], hs["thinOverFloor"])
            rows.append(("DEL / the floor's DEL, whatever the API does (plexus-cni, 4 attachments)", "≤ 1.2",
                         f"API up: {f(cdel['daemonCniOverFloor'])} ({f(cdel['daemonCni']['median'])} / {f(cdel['floor']['median'])} ms); "
                         f"API server stopped: daemon mode {f(hs['daemonOverFloor'])}, thin mode {f(hs['thinOverFloor'])} "
                         f"({f(hs['daemon']['median'])}, {f(hs['thin']['median'])} / {f(hs['floor']['median'])} ms)",
                         worst <= 1.2))
        dra = cy.get("dra")
        if dra:
            dq = dra["requestsPerAdd"]
            dreads = sum(dq[k]["cniReads"] + dq[k]["daemonReads"] for k in ("claims", "devicePlugin"))
            rows.append((f"Daemon mode, a pod with {dra['nads']} NADs whose devices come from its ResourceClaim / the same "
                         "pod with device-plugin devices (kubelet PodResources API), plexus-cni; API reads per ADD",
                         "cycle ≤ 1.05, 0 reads",
                         f"ADD {f(dra['addOverDevicePlugin'])} ({f(dra['claimsAdd']['median'])} / {f(dra['devicePluginAdd']['median'])} ms), "
                         f"ADD+DEL {f(dra['claimsOverDevicePlugin'])} ({f(dra['claims']['median'])} / {f(dra['devicePlugin']['median'])} ms); "
                         f"reads per ADD: claims {f(dq['claims']['cniReads'] + dq['claims']['daemonReads'], 1)}, device plugin "
                         f"{f(dq['devicePlugin']['cniReads'] + dq['devicePlugin']['daemonReads'], 1)}",
                         dra["claimsOverDevicePlugin"] <= 1.05 and dreads == 0))
        rq = cy["requestsPerAdd"]["daemon"]
        reads = rq["cni"]["reads"] + rq["daemon"]["reads"]
        writes = rq["cni"]["statusWrites"] + rq["daemon"]["statusWrites"]
        events = rq["cni"]["events"] + rq["daemon"]["events"]
        rows.append(("Node daemon: API requests per ADD (CNI process + daemon)", "0 reads, 1 write",
                     f"{f(reads, 1)} reads, {f(writes, 1)} status write (+ {f(events, 1)} AddedInterface events, one per "
                     "secondary network)", reads == 0 and writes <= 1))
        mem = dm["memory"]
        rows.append((f"Node daemon resident memory with {mem['pods']} pods on the node and {mem['nads']} NADs in the cluster",
                     "≤ 64 MiB", f"{f(mem['rssKiB'] / 1024, 1)} MiB (peak {f(mem['peakKiB'] / 1024, 1)} MiB)",
                     mem["peakKiB"] <= 64 * 1024))
        bu = dm["burst"]
        rows.append((f"Burst of {bu['adds']} simultaneous ADDs through the daemon: failures", "none",
                     f"{len(bu['failures'])} (p99 {f(bu['add']['p99'], 0)} ms)", not bu["failures"] and bu["delFailures"] == 0))
        rows.append(("… the daemon's peak resident memory during the burst", "≤ 128 MiB",
                     f"{f(bu['daemonPeakKiB'] / 1024, 1)} MiB", bu["daemonPeakKiB"] <= 128 * 1024))
        kd = dm["killedDuringBurst"]
        rows.append((f"Daemon killed during a burst of {kd['adds']} ADDs: each completes or fails cleanly, every DEL succeeds",
                     "all", f"{kd['succeeded']} completed, {kd['failedCleanly']} failed cleanly, {len(kd['failedUncleanly'])} "
                     f"otherwise; {kd['delFailures']} DEL failures", not kd["failedUncleanly"] and kd["delFailures"] == 0
                     and not kd["cacheLeftAfterDel"]))
        hp = dm.get("hotplug")
        if hp:
            at, de = hp["attach"], hp["detach"]
            rows.append((f"Dynamic networks: annotation changed → network-status written ({hp['changes']} attaches and "
                         "detaches of a second network, no-op delegates, real kube-apiserver)", "≤ 2 s",
                         f"attach median {f(at['median'])} ms, max {f(at['max'])} ms; detach median {f(de['median'])} ms, "
                         f"max {f(de['max'])} ms", max(at["max"], de["max"]) <= 2000 and hp["delOk"]
                         and not hp["cacheLeftAfterDel"]))

    dn = r.get("density") or {}
    ds = dn.get("subjects") or {}
    if "plexus-daemon" in ds and "floor" in ds:
        dd, mt = ds["plexus-daemon"], ds.get("multus-thick")
        ratio = dd["readyP99OverFloor"]["median"]
        d99, f99 = dd["ready"]["p99"], ds["floor"]["ready"]["p99"]
        vs = (f"; Multus thick {f(mt['readyP99OverFloor']['median'])}, {f(mt['ready']['p99'] / 1e3, 1)} s"
              if mt else "; Multus not measured")
        ok = ratio <= 1.15 and (mt is None or ratio < mt["readyP99OverFloor"]["median"])
        rows.append((f"Node density: {dn['pods']} pods at once on the real node, 2 secondary networks each; "
                     "Plexus daemon mode's pod startup p99 (created → Ready) / the cluster network alone's in the same "
                     "round (median over rounds)",
                     "≤ 1.15, and below Multus thick's",
                     f"{f(ratio)} (p99 over all rounds {f(d99 / 1e3, 1)} / {f(f99 / 1e3, 1)} s{vs})", ok))
        r3 = ds.get("runtime-3")
        if r3:
            nets = r3["readyP99OverFloor"]["median"]
            own = dd["readyP99OverRuntime3"]["median"]
            rows.append(("… where it goes: the two extra networks' own work (containerd attaching the same three "
                         "networks itself / the floor), and what Plexus adds to it (daemon mode / containerd's three "
                         "networks), p99 per round (median)", "(no target)",
                         f"networks {f(nets)}, Plexus {f(own)}"
                         + (f" (Multus thick {f(mt['readyP99OverRuntime3']['median'])})" if mt else ""), "info"))
            if "cniSetupOverRuntime3" in dd:
                rows.append(("… the network set-up alone (containerd's own timer of the CNI ADD, mean per sandbox, per round "
                             "median): Plexus daemon mode / containerd attaching the same three networks itself",
                             "(no target)", f"{f(dd['cniSetupOverRuntime3']['median'])} ({f(dd['cniSetupMs']['median'], 0)} / "
                             f"{f(r3['cniSetupMs']['median'], 0)} ms)"
                             + (f"; Multus thick {f(mt['cniSetupOverRuntime3']['median'])}" if mt and "cniSetupOverRuntime3" in mt
                                else ""), "info"))
        cpu = {k: (ds.get(k) or {}).get("cpuMsPerPod", {}).get("machine", {}).get("median")
               for k in ("floor", "runtime-3", "plexus-daemon", "multus-thick")}
        if cpu["floor"] and cpu["plexus-daemon"]:
            extra = (f"; over containerd's three networks: Plexus +{f(cpu['plexus-daemon'] - cpu['runtime-3'], 1)} ms a pod"
                     if cpu["runtime-3"] else "")
            if cpu["runtime-3"] and cpu["multus-thick"]:
                extra += f", Multus thick +{f(cpu['multus-thick'] - cpu['runtime-3'], 1)}"
            rows.append(("… the node's CPU per pod over the burst (all processes, first create to last Ready; median "
                         "over rounds): Plexus daemon mode / the floor", "(no target)",
                         f"{f(cpu['plexus-daemon'] / cpu['floor'])} ({f(cpu['plexus-daemon'], 0)} / "
                         f"{f(cpu['floor'], 0)} ms){extra}", "info"))
        ag = ds["plexus-daemon"].get("agent")
        if ag:
            grow = ag["peakOverRestKiB"] / 1024
            rows.append(("… the node daemon's memory across the burst (peak − resting RSS)", "≤ 10 MiB",
                         f"{f(grow, 1)} MiB ({f(ag['restKiB'] / 1024, 1)} → {f(ag['peakKiB'] / 1024, 1)} MiB)",
                         grow <= 10))

    machine = lambda d, k: ((d.get(k) or {}).get("cpuMsPerPod") or {}).get("machine", {}).get("median")
    if "plexus-nri" in ds and "plexus-daemon" in ds:
        nri, dd = ds["plexus-nri"], ds["plexus-daemon"]
        rn, rd = nri["readyP99OverFloor"]["median"], dd["readyP99OverFloor"]["median"]
        cn, cd = machine(ds, "plexus-nri"), machine(ds, "plexus-daemon")
        ok = rn <= rd and (cn is None or cd is None or cn <= cd)
        rows.append((f"Node density, {dn['pods']} pods: Plexus NRI mode's startup p99 / the floor's and the node's CPU "
                     "per pod, against daemon mode's (medians over rounds)", "no more than daemon mode's",
                     f"p99 {f(rn)} (daemon mode {f(rd)}); CPU {f(cn, 0)} ms a pod (daemon mode {f(cd, 0)} ms)", ok))
    large = r.get("densityLarge") or {}
    large_s = large.get("subjects") or {}
    for key, label in (("plexus-daemon", "daemon mode"), ("plexus-nri", "NRI mode")):
        v = large_s.get(key)
        if not v or "floor" not in large_s:
            continue
        ratio = v["readyP99OverFloor"]["median"]
        rows.append((f"Node density, {large['pods']} pods at once: Plexus {label}'s startup p99 / the cluster network "
                     "alone's (same round)", "≤ 1.05",
                     f"{f(ratio)} ({f(v['ready']['p99'] / 1e3, 1)} / {f(large_s['floor']['ready']['p99'] / 1e3, 1)} s)",
                     ratio <= 1.05))
        own, three = machine(large_s, key), machine(large_s, "runtime-3")
        if own is not None and three is not None:
            rows.append((f"… Plexus {label}: the node's CPU per pod over containerd attaching the same three networks "
                         "itself", "≤ +5 ms", f"{own - three:+.1f} ms ({f(own, 0)} / {f(three, 0)} ms)",
                         own - three <= 5))
    if "failed" in large:
        rows.append(("Node density at the kubelet's usual maximum of pods", "measured", f"failed: {large['failed']}", False))

    hmem = r.get("hookMemory")
    if hmem:
        d = hmem["deltaKiB"] / 1024
        rows.append(("Node daemon's resident memory with three active hooks − with none (same flags, sampled over the "
                     "same seconds, median over rounds)", "≤ 15 MiB",
                     f"{f(d, 1)} MiB ({f(hmem['noneRssKiB'] / 1024, 1)} → {f(hmem['threeRssKiB'] / 1024, 1)} MiB; "
                     f"anonymous {f(hmem['anonDeltaKiB'] / 1024, 1)} MiB of it)", d <= 15))
        for st in hmem.get("sets", [])[1:]:
            d = st["deltaKiB"] / 1024
            rows.append((f"… with three hooks in {st['language']} − with none", "≤ 15 MiB",
                         f"{f(d, 1)} MiB ({f(st['noneRssKiB'] / 1024, 1)} → {f(st['threeRssKiB'] / 1024, 1)} MiB; "
                         f"anonymous {f(st['anonDeltaKiB'] / 1024, 1)} MiB of it)", d <= 15))

    langs = r.get("languages")
    if langs:
        bound = langs.get("compileMemoryBoundMiB")
        for h in langs["hooks"]:
            if h["language"] == "Rust":
                continue
            what = f"{h['language']} build of {h['guest']}"
            p50 = h["warmCall"]["p50Us"] / 1000
            rows.append((f"Hook in {h['language']}: warm call p50, {h['guest']}", "≤ 1 ms",
                         f"{f(p50)} ms (p99 {f(h['warmCall']['p99Us'] / 1000)} ms)", p50 <= 1))
            rows.append((f"… added to an ADD (artifact's load and one call), {what}", "≤ 10 ms",
                         f"{f(h['perAddMs'])} ms", h["perAddMs"] <= 10))
            rows.append((f"… the node agent's compile, {what}", "≤ 60 s",
                         f"{f(h['compileMs'] / 1000, 1)} s", h["compileMs"] <= 60000))
            if bound:
                rss = h["compilePeakRssKiB"] / 1024
                rows.append((f"… the compile's peak RSS, {what}", f"≤ {bound} MiB (the agent's compile bound)",
                             f"{f(rss, 0)} MiB", rss <= bound))

    w("## Targets")
    w("")
    w("| target | goal | measured | |")
    w("| --- | --- | --- | --- |")
    for name, goal, got, ok in rows:
        w(f"| {name} | {goal} | {got} | {yes(ok)} |")
    w("")
    missed = [x for x in rows if x[3] is False]
    measured = [x for x in rows if x[3] is not None and x[3] != "info"]
    w(f"{len(measured) - len(missed)} of {len(measured)} met. Where the time goes, and what was changed, is under "
      "[Where the time goes](#where-the-time-goes).")
    w("")

    # ---------------------------------------------------------------- cases
    w("## ADD and DEL of one pod (cluster network + 3 NADs)")
    w("")
    w("| delegates | driver | ADD median | ADD p95 | DEL median | DEL p95 | ADD / floor | ADD overhead | ADD CPU median | peak RSS median / max |")
    w("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for c in r.get("cases") or []:
        floor = case(r, f"{c['delegates']}/floor")
        ratio = med(c) / med(floor) if floor else float("nan")
        ov = med(c) - med(floor) if floor else float("nan")
        rss = c.get("maxRssKiB")
        rss_s = f"{f(rss['median'] / MIB, 1)} / {f(rss['max'] / MIB, 1)} MiB" if rss else "–"
        w(f"| {c['delegates']} | {c['variant']} | {f(c['add']['median'])} ms | {f(c['add']['p95'])} ms | "
          f"{f(c['del']['median'])} ms | {f(c['del']['p95'])} ms | {f(ratio)} | "
          f"{'–' if c['variant'] == 'floor' else f(ov) + ' ms'} | {f(c['addCpu']['median']) + ' ms' if 'addCpu' in c else '–'} | {rss_s} |")
    w("")
    if nf and npx and "addCpu" in nf and "addCpu" in npx:
        w(f"*ADD CPU* is the user + system time of the ADD's whole process tree (plexus and its delegates, or the floor's "
          f"delegates), from `getrusage(RUSAGE_CHILDREN)`. A loaded machine stretches wall time far more than CPU time, "
          f"so it is the steadier measure of Plexus's own work: with no-op delegates and no hooks, "
          f"{f(npx['addCpu']['median'] - nf['addCpu']['median'])} ms of CPU per ADD on top of the floor's "
          f"{f(nf['addCpu']['median'])} ms; with three warm hooks, {f(nw['addCpu']['median'] - nf['addCpu']['median'])} ms. "
          f"Wall-clock overhead beyond that CPU is waiting, mostly for a core (the machine is shared).")
        w("")
    st = r.get("startup")
    if st:
        w(f"Process start and exit alone (answering `VERSION`, median of {st['plexusVersion']['n']}): plexus "
          f"{f(st['plexusVersion']['median'])} ms, the no-op delegate {f(st['noopVersion']['median'])} ms; so "
          f"{f(st['plexusVersion']['median'] - st['noopVersion']['median'])} ms of every plexus invocation is what "
          f"starting the larger, wasmtime-carrying executable costs beyond starting a small one (the page faults of its "
          f"mapping; it is linked at a fixed address, so the loader has no relocations to apply). Peak RSS of that: "
          f"{f((st['plexusVersionMaxRssKiB'] or 0) / MIB, 1)} MiB." + (
              f" plexus-cni, the binary nodes run: {f(st['plexusCniVersion']['median'])} ms."
              if st.get("plexusCniVersion") else ""))
        w("")

    # ---------------------------------------------------------------- breakdown
    bd = ((r.get("daemon") or {}).get("cycles") or {}).get("breakdown")
    if bd:
        order = [("conf", "environment and conf read (before logging exists)"),
                 ("setup", "cluster source, daemon client and hooks set up"),
                 ("lock", "the per-container lock"),
                 ("cache", "cache dir opened; stale plan / cached plan read"),
                 ("pod", "the pod (a socket round trip to the daemon)"),
                 ("plan", "planning: NADs (socket round trips), naming, capabilities"),
                 ("record", "the plan written (temp file, rename)"),
                 ("attach", "every delegate's ADD, each result journaled"),
                 ("route", "the default route"),
                 ("publish", "network-status and events handed to the daemon"),
                 ("detach", "every delegate's DEL, in reverse"),
                 ("forget", "cache entry removed, DEL recorded")]
        add, dl = bd["add"], bd["del"]
        w("## Where one ADD and one DEL go (daemon mode, plexus-cni)")
        w("")
        w(f"The daemon cycle's pod (cluster network + {bd['delegates'] - 1} NADs, no-op delegates), {bd['runs']} ADD+DEL "
          f"cycles of `plexus-cni` with `logLevel: debug`, each invocation's phases read back from its log "
          f"(`logging::phase`; medians). Debug logging costs time of its own, so the totals are a little above the "
          f"cycle rows.")
        w("")
        th = ((r.get("daemon") or {}).get("cycles") or {}).get("breakdownThin")
        if th:
            w(f"The last two columns are thin mode ({th['runs']} cycles): there `pod` and `plan` are API reads of the "
              "CNI process (a new TLS connection per process) and `publish` is its own status write and events, "
              "and `setup` builds the Kubernetes client.")
            w("")
        tcols = (lambda v: f" {v} |") if th else (lambda v: "")
        w("| phase | what | ADD ms | DEL ms |" + tcols("thin ADD ms") + tcols("thin DEL ms"))
        w("| --- | --- | --- | --- |" + tcols("---") + tcols("---"))
        w(f"| process start, logging set-up, exit | the wall time outside the phases below | {f(add['outsidePhases'])} | "
          f"{f(dl['outsidePhases'])} |" + (tcols(f(th['add']['outsidePhases'])) + tcols(f(th['del']['outsidePhases']))
                                          if th else ""))
        dash = lambda v: "–" if v is None else f(v)
        for key, what in order:
            a, d = add["phases"].get(key), dl["phases"].get(key)
            ta, td = (th["add"]["phases"].get(key), th["del"]["phases"].get(key)) if th else (None, None)
            if a is None and d is None and ta is None and td is None:
                continue
            w(f"| {key} | {what} | {dash(a)} | {dash(d)} |" + tcols(dash(ta)) + tcols(dash(td)))
        w(f"| total | the process's wall time | {f(add['wall'])} | {f(dl['wall'])} |" +
          (tcols(f(th['add']['wall'])) + tcols(f(th['del']['wall'])) if th else ""))
        w("")
        w(f"Each delegate exec inside `attach`/`detach` (spawn, the delegate's run, its output read): "
          f"{f(add['execEach'])} ms on ADD, {f(dl['execEach'])} ms on DEL "
          f"({f(add['execsPerInvocation'], 0)} per invocation); the floor execs the same delegates at "
          f"{f(bd['floorPerDelegateExec'])} ms each.")
        w("")

    # ---------------------------------------------------------------- scaling
    if scal:
        w("## Latency against the number of attachments (no-op delegates)")
        w("")
        w("![ADD latency against attachments](benchmarks.png)")
        w("")
        w("| attachments | floor ADD | plexus ADD | overhead | target | plexus + 3 warm hooks ADD | floor DEL | plexus DEL |")
        w("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for s in scal:
            k = s["attachments"]
            fl, px, hk = s["floor"], s["plexus"], s["plexus+3 hooks warm"]
            w(f"| {k} | {f(fl['add']['median'])} ms | {f(px['add']['median'])} ms | "
              f"{f(px['add']['median'] - fl['add']['median'])} ms | ≤ {f(2 + 0.3 * k, 1)} ms | {f(hk['add']['median'])} ms | "
              f"{f(fl['del']['median'])} ms | {f(px['del']['median'])} ms |")
        w("")
        ks = [s["attachments"] for s in scal]
        fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=110)
        for key, label, style in (("floor", "floor (delegates exec'd directly)", "o-"),
                                  ("plexus", "plexus, no hooks", "s-"),
                                  ("plexus+3 hooks warm", "plexus, 3 warm hooks", "^-")):
            meds = [s[key]["add"]["median"] for s in scal]
            p95 = [s[key]["add"]["p95"] for s in scal]
            ax.plot(ks, meds, style, label=f"{label}, median")
            ax.fill_between(ks, meds, p95, alpha=0.15)
        ax.plot(ks, [s["floor"]["add"]["median"] + 2 + 0.3 * s["attachments"] for s in scal], "k:",
                label="floor + target overhead (2 ms + 0.3 ms/attachment)")
        ax.set_xticks(ks)
        ax.set_xticklabels([str(k) for k in ks])
        ax.set_xlabel("attachments (cluster network + NADs)")
        ax.set_ylabel("ADD latency, ms (band: median to p95)")
        ax.set_title(f"Pod ADD, no-op delegates, {runs} runs each ({m['nproc']} CPUs, {m['cpu']})", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot)

    # ---------------------------------------------------------------- concurrency
    conc = r.get("concurrency") or []
    if conc:
        w("## Concurrency: N pods added, then deleted, in parallel")
        w("")
        w("Distinct containers, no-op delegates, cluster network + 3 NADs, one shared cacheDir/runDir and one manifest "
          "directory holding all 64 pods. Each round starts N plexus ADDs at once (a barrier), waits for all, then the "
          "N DELs. Pods/second is N over the round's wall time (median over rounds). FileCluster lists and parses the whole "
          "manifest directory once per invocation, so with 64 pod manifests in it even N = 1 is slower than the one-pod "
          "matrix above; that difference is FileCluster's, not concurrency's.")
        w("")
        w("| N | rounds | ADD p50 | ADD p95 | ADD p99 | ADD max | ADD pods/s | DEL p50 | DEL p99 | DEL pods/s | errors | status written | cache left after DEL |")
        w("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for c in conc:
            w(f"| {c['pods']} | {c['rounds']} | {f(c['add']['median'])} ms | {f(c['add']['p95'])} ms | {f(c['add']['p99'])} ms | "
              f"{f(c['add']['max'])} ms | {f(c['addPodsPerSec']['median'], 1)} | {f(c['del']['median'])} ms | "
              f"{f(c['del']['p99'])} ms | {f(c['delPodsPerSec']['median'], 1)} | {len(c['errors'])} | "
              f"{c['statusWritten']}/{c['pods']} | {len(c['cacheLeftAfterDel'])} |")
        w("")
        errs = [e for c in conc for e in c["errors"]]
        if errs:
            w("First errors: " + "; ".join(f"`{e}`" for e in errs[:3]))
            w("")
    hm = r.get("hammer")
    if hm:
        w("## Serialization: one container hammered by concurrent ADD and DEL")
        w("")
        w(f"{hm['threads']} threads each ran alternating ADD/DEL on the same container ID at once ({hm['ops']} plexus "
          f"processes: {hm['adds']} ADD, {hm['dels']} DEL). The no-op delegate logged its parent (the plexus process) and "
          f"the wall-clock interval of each of its {hm['delegateCalls']} calls (with a 1 ms sleep inside, to widen any "
          "overlap).")
        w("")
        w("| check | result |")
        w("| --- | --- |")
        w(f"| plexus processes that failed | {len(hm['errors'])} |")
        w(f"| delegate calls overlapping in time | {hm['overlappingDelegateCalls']} |")
        w(f"| plexus processes whose delegate calls were interleaved with another's | {hm['interleavedProcesses']} |")
        w(f"| delegate calls from a process that is not one of the bench's plexus runs | {hm['callsFromUnknownParents']} |")
        w(f"| last operation to hold the lock | {hm['lastOperation']} |")
        w(f"| final state matches it (ADD: cached plan with 4 results and status written; DEL: no plan) | {hm['finalStateConsistent']} |")
        w(f"| cache left after a final DEL | {len(hm['cacheLeftAfterFinalDel'])} files |")
        w("")
        if hm["errors"]:
            w("Errors: " + "; ".join(f"`{e}`" for e in hm["errors"][:3]))
            w("")

    if dm:
        w("## Node daemon: the kube source with and without `plexus daemon`")
        w("")
        w("A real kube-apiserver 1.37.2 with etcd 3.7.0 on loopback (TLS, token authentication, RBAC from "
          "`examples/deploy/rbac.yaml`, an audit log). The pod selects 3 NADs (4 attachments with the cluster network), "
          "no-op delegates. *Thin*: the CNI process reads the pod and the NADs and writes the status and events itself "
          "(`\"daemon\": false`). *Daemon*: `plexus daemon` runs on the node and the CNI process asks it over its socket. "
          f"Each cycle is one ADD and one DEL, the three variants interleaved run by run ({cy['runs']} runs). Requests "
          "are counted per identity from the API server's audit log (the CNI process and the daemon have different "
          "service accounts), over 10 ADDs of each variant.")
        w("")
        w("| per ADD+DEL cycle | median ms | p95 ms | / floor |")
        w("| --- | --- | --- | --- |")
        fm = cy["floor"]["median"]
        for key, label in (("floor", "floor (the delegates exec'd directly)"), ("thin", "plexus, thin mode"),
                           ("daemon", "plexus, daemon mode"), ("daemonCni", "plexus-cni, daemon mode")):
            if key in cy:
                w(f"| {label} | {f(cy[key]['median'])} | {f(cy[key]['p95'])} | {f(cy[key]['median'] / fm)} |")
        rp = cy.get("report")
        if rp:
            w(f"| plexus-cni, daemon mode, without the metrics report (`\"report\": false`) | {f(rp['off']['median'])} | "
              f"{f(rp['off']['p95'])} | {f(rp['off']['median'] / fm)} |")
        if "cycle" in mu:
            w(f"| Multus {mu['version']} thick (multus-shim, {f(mu['shimBytes'] / 1e6, 1)} MB, and multus-daemon) | "
              f"{f(mu['cycle']['median'])} | {f(mu['cycle']['p95'])} | {f(mu['overFloor'])} |")
        if ten:
            tf = ten["floor"]["median"]
            w(f"| floor, 10 NADs ({ten['attachments']} attachments) | {f(tf)} | {f(ten['floor']['p95'])} | 1.00 |")
            w(f"| plexus-cni, daemon mode, 10 NADs | {f(ten['daemon']['median'])} | {f(ten['daemon']['p95'])} | "
              f"{f(ten['daemonOverFloor'])} |")
        if npx and nf:
            files_cycle = med(npx) + med(npx, "del")
            floor_cycle = med(nf) + med(nf, "del")
            w(f"| for comparison: plexus with `FileCluster` (no API at all), from the no-op matrix above | "
              f"{f(files_cycle)} | | {f(files_cycle / floor_cycle)} (against that matrix's floor) |")
        w("")
        if rp:
            w(f"The report each CNI process hands the daemon for its metrics (after answering; see docs/operations.md, "
              f"\"Metrics\"), measured by the same cycles with `\"report\": false`, interleaved: "
              f"{f(rp['on']['median'])} against {f(rp['off']['median'])} ms per ADD+DEL cycle ({f(rp['onOverOff'])}×), "
              f"ADD {f(rp['addOn']['median'])} against {f(rp['addOff']['median'])} ms.")
            w("")
        if cdel:
            w("DEL alone: the DELs of the cycles above, and DELs run while the API server is stopped (SIGSTOP: "
              "its requests hang) after ADDs made with it up; the floor's DELs interleaved with them "
              f"({hs['runs']} of each).")
            w("")
            w("| DEL | median ms | p95 ms | / floor's DEL |")
            w("| --- | --- | --- | --- |")
            df = cdel["floor"]["median"]
            w(f"| floor (the delegates' DEL exec'd directly) | {f(df)} | {f(cdel['floor']['p95'])} | 1.00 |")
            for key, label in (("thin", "plexus, thin mode"), ("daemon", "plexus, daemon mode"),
                               ("daemonCni", "plexus-cni, daemon mode")):
                w(f"| {label} | {f(cdel[key]['median'])} | {f(cdel[key]['p95'])} | {f(cdel[key]['median'] / df)} |")
            hf = hs["floor"]["median"]
            w(f"| API server stopped: floor | {f(hf)} | {f(hs['floor']['p95'])} | 1.00 |")
            for key in ("thin", "daemon"):
                w(f"| API server stopped: plexus-cni, {key} mode | {f(hs[key]['median'])} | {f(hs[key]['p95'])} | "
                  f"{f(hs[key]['median'] / hf)} |")
            w("")
        w("| requests per ADD | reads | status writes | events |")
        w("| --- | --- | --- | --- |")
        for mode in ("thin", "daemon"):
            for who in ("cni", "daemon"):
                x = cy["requestsPerAdd"][mode][who]
                w(f"| {mode} mode, sent by the {'CNI process' if who == 'cni' else 'daemon'} | {f(x['reads'], 1)} | "
                  f"{f(x['statusWrites'], 1)} | {f(x['events'], 1)} |")
        w("")
        w(f"Memory: with {mem['pods']} pods on the node and {mem['nads']} NADs in 20 namespaces, the daemon synced in "
          f"{f(mem['syncSeconds'], 1)} s and holds {f(mem['rssKiB'] / 1024, 1)} MiB resident (peak "
          f"{f(mem['peakKiB'] / 1024, 1)} MiB). Burst: {bu['adds']} ADDs started at once (no-op delegates, the daemon "
          f"above): {len(bu['failures'])} failures, median {f(bu['add']['median'], 0)} ms, p99 {f(bu['add']['p99'], 0)} ms, "
          f"{bu['shed']} requests shed, {bu['apiReadsByDaemon']} API reads by the daemon, daemon peak "
          f"{f(bu['daemonPeakKiB'] / 1024, 1)} MiB; their DELs: {bu['delFailures']} failures. Killed: the daemon got SIGKILL "
          f"100 ms into a second burst of {kd['adds']}: {kd['succeeded']} ADDs completed ({kd.get('thinStatusWrites', 0)} of them "
          f"wrote their status themselves after the kill, with {kd.get('thinReads', 0)} API reads between them: thin mode), "
          f"{kd['failedCleanly']} failed with a CNI error, {len(kd['failedUncleanly'])} otherwise; every DEL "
          f"{'succeeded' if kd['delFailures'] == 0 else 'did not succeed'}, and the attachment cache was "
          f"{'empty' if not kd['cacheLeftAfterDel'] else 'not empty'} afterwards.")
        w("")

    # ---------------------------------------------------------------- density
    if ds:
        density_section(dn, w, args.density_plot, m)
    if large.get("subjects"):
        density_table(large, w, True, r.get("separately", {}).get("densityLarge"))
    elif "failed" in large:
        w(f"The density section at the kubelet's usual maximum of pods failed: {large['failed']}")
        w("")

    # ---------------------------------------------------------------- hook memory
    if hmem:
        w("## What hooks cost the node daemon in memory")
        w("")
        names = ", ".join(f"{h['guest']} ({h['kind']})" for h in hmem["hooks"])
        w(f"Two node daemons side by side on one real kube-apiserver, with the same flags (a trusted key, a plain-HTTP "
          f"registry): one on a node three NetworkHooks select ({names}: pulled from a real registry, signature "
          "checked, compiled and probed by the agent, published), one on a node they do not select. Once the first "
          f"runs all three, both are sampled every half second over the same ten seconds; each round starts fresh "
          "daemons. *Anonymous* is heap and stacks; the rest of the resident memory is the binary's code pages the "
          "process has run (file-backed, shared with every other plexus process on the node).")
        w("")
        w("| round | no hooks: RSS | anonymous | file | three hooks: RSS | anonymous | file | difference |")
        w("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for i, rd in enumerate(hmem["rounds"]):
            a, b = rd["none"]["kib"], rd["three"]["kib"]
            cells = " | ".join(f"{f(x / 1024, 1)} MiB" for x in a + b)
            w(f"| {i + 1} | {cells} | {f((b[0] - a[0]) / 1024, 1)} MiB |")
        w("")
        others = hmem.get("sets", [])[1:]
        if others:
            w("The same with three hooks written in Python, then in TypeScript (two policies and a status hook: "
              + "; ".join(f"{st['language']}: " + ", ".join(f"{h['guest']} ({h['kind']})" for h in st["hooks"])
                          for st in others)
              + "), each set on a node of its own, against a daemon of a node without hooks in the same seconds:")
            w("")
            w("| hooks | round | no hooks: RSS | anonymous | file | three hooks: RSS | anonymous | file | difference |")
            w("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for st in others:
                for i, rd in enumerate(st["rounds"]):
                    a, b = rd["none"]["kib"], rd["three"]["kib"]
                    cells = " | ".join(f"{f(x / 1024, 1)} MiB" for x in a + b)
                    w(f"| {st['language']} | {i + 1} | {cells} | {f((b[0] - a[0]) / 1024, 1)} MiB |")
            w("")

    if langs:
        w("## Hooks by language")
        w("")
        w("The example hooks written in Rust, Python (componentize-py) and TypeScript (componentize-js), each build "
          "measured alike. *Compile*: `plexus hook compile` into an empty cache, what the node agent runs in its "
          "compile process (wall time and the process's peak RSS, median of three). *Added to an ADD*: the compiled "
          "artifact's load and one call, in a fresh engine, as a fresh plexus process makes them "
          "(`cargo run --release -p plexus-hooks --example hook_cost`). *Warm call*: a fresh store and instance per "
          "call, 1000 calls. A Python or TypeScript component carries its interpreter, started anew in every instance: "
          "that start is most of its call.")
        w("")
        w("| hook | language | component | compile | compile peak RSS | added to an ADD | warm call p50 | p99 |")
        w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for h in langs["hooks"]:
            w(f"| {h['guest']} ({h['kind']}) | {h['language']} | {f(h['componentBytes'] / MIB / MIB, 1)} MiB | "
              f"{f(h['compileMs'] / 1000, 2)} s | {f(h['compilePeakRssKiB'] / 1024, 0)} MiB | {f(h['perAddMs'])} ms | "
              f"{f(h['warmCall']['p50Us'] / 1000, 3)} ms | {f(h['warmCall']['p99Us'] / 1000, 3)} ms |")
        w("")

    # ---------------------------------------------------------------- hooks
    w("## Hook runtime (`cargo run --release -p plexus-hooks --example hook_bench`)")
    w("")
    w(f"In-process figures of the hook runtime alone, {hb['calls']} calls per measurement; a warm call is a fresh "
      "store and instantiation from the pre-instantiated component plus the call. *Warm call* is the engine the "
      "plexus binary uses (instances allocated on demand: one ADD makes a handful of calls). The target "
      "row above is the plexus binary's. Cold compile is an ADD's (one thread; `plexus hook compile` uses every core).")
    w("")
    w("| guest | kind | component | cold compile | cached load | warm call p50 | warm call p99 |")
    w("| --- | --- | --- | --- | --- | --- | --- |")
    for g in hb["guests"]:
        w(f"| {g['guest']} | {g['kind']} | {g['componentBytes'] // 1024} KiB | {f(g['coldCompileMs'], 1)} ms | "
          f"{f(g['cachedLoadMs'])} ms | {f(g['warmCall']['p50Us'], 1)} µs | {f(g['warmCall']['p99Us'], 1)} µs |")
    t3 = hb["threeInSequence"]
    w("")
    w(f"All three as one ADD runs them: cold load {f(t3['coldLoadMs'], 1)} ms, cached load {f(t3['cachedLoadMs'])} ms, "
      f"one call of each p50 {f(t3['perPod']['p50Us'], 1)} µs, p99 {f(t3['perPod']['p99Us'], 1)} µs.")
    if nc and npx:
        w(f"Through the plexus binary, an ADD that compiles the three hooks (cold cache) takes {f(med(nc))} ms "
          f"(p95 {f(nc['add']['p95'])} ms) with no-op delegates, against {f(med(nw))} ms warm.")
    w("")

    # ---------------------------------------------------------------- profile
    w("## Where the time goes")
    w("")
    prof = r.get("profile") or {}
    w("Profiles of one no-op ADD (cluster network + 3 NADs), taken by the bench right after the measurements: "
      "`strace -c -w` (wall time per syscall of the plexus process, children excluded), `perf stat` (CPU time against "
      "elapsed), `valgrind --tool=callgrind` (instructions per function; valgrind does not emulate SHA-NI, so sha256 is "
      "over-weighted there), and `perf record -e cpu-clock -g` over "
      f"{runs} ADD+DEL rounds of each kind (CPU samples of plexus processes only, functions including callees).")
    w("")
    for name, title in (("nohooks", "no hooks"), ("hooks", "three warm hooks")):
        w(f"### ADD, {title}")
        w("")
        ps = prof.get(f"perf-{name}", {})
        if "text" in ps:
            lines = [ln.strip() for ln in ps["text"].splitlines() if any(k in ln for k in ("task-clock", "elapsed", "user", "sys", "page-faults", "context-switches"))]
            w("perf stat:")
            w("")
            w("```")
            w("\n".join(lines))
            w("```")
            w("")
        stc = prof.get(f"strace-{name}", {})
        if "text" in stc:
            w("strace -c -w, top syscalls by wall time:")
            w("")
            w("```")
            w("\n".join(top_lines(stc["text"], 14)))
            w("```")
            w("")
        pr = prof.get(f"perfrecord-{name}", {})
        if "text" in pr:
            keep = [ln.rstrip() for ln in pr["text"].splitlines() if "%" in ln and not ln.startswith("#") and "[k]" not in ln][:22]
            w("perf record, plexus processes, user-space functions by inclusive share of CPU samples:")
            w("")
            w("```")
            w("\n".join(ln[:140].rstrip() for ln in keep))
            w("```")
            w("")
        cg = prof.get(f"callgrind-{name}", {})
        if "text" in cg:
            summary = cg["text"].split("Auto-annotated source")[0]
            lines = [ln for ln in summary.splitlines() if "%)" in ln][:12]
            w("callgrind, instructions by function (exclusive):")
            w("")
            w("```")
            # The object a function is in, by file name only: the docs name no path of the measuring machine.
            lines = [re.sub(r"\[(?:[^\]]*/)?([^\]/]+)\]", r"[\1]", ln) for ln in lines]
            # Sources by crate and file, not by where the measuring machine keeps cargo's registry or rustc's.
            lines = [re.sub(r"\S*/registry/src/[^/\s]+/", "", ln) for ln in lines]
            lines = [re.sub(r"/rustc/[0-9a-f]+/", "rustc/", ln) for ln in lines]
            w("\n".join(ln[:160] for ln in lines))
            w("```")
            w("")
        for k in (f"perf-{name}", f"strace-{name}", f"callgrind-{name}", f"perfrecord-{name}"):
            if "error" in prof.get(k, {}):
                w(f"({k}: {prof[k]['error']})")
                w("")
    notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "analysis.md")
    if os.path.exists(notes):
        w(open(notes).read().strip())
        w("")
    with open(args.out, "w") as fh:
        fh.write("\n".join(L).rstrip() + "\n")


if __name__ == "__main__":
    main()
