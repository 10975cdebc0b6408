#!/usr/bin/env python3
"""report.py — turns the bench's raw loadgen lines into the table and build/bench.json.

run.sh appends one JSON line per loadgen run to build/bench/results.jsonl, labelled
"<target>:<scenario>" (scenarios sat<N>, paced<N>, and "idle" lines holding a target's VmRSS
before load). This script derives the figures the issue asks for, prints them as a markdown
table (the one README quotes) and writes bench.json:

  chunks_per_s        the best events/s of the target's saturation runs
  cpu_s_per_M_chunks  the target's CPU seconds (utime+stime, all its processes) per million
                      events in that same run (for direct: the fake upstream's own cost)
  p50/p99_added_us    per-event latency at the smallest paced load minus direct's, same run
                      shape (each event is timed from the upstream's write, so the
                      difference is what the relay added)
  ttft_added_us       p99 TTFT minus direct's at the smallest paced load (ttft_added_p50_us too);
                      under "paced" also its two legs, split at the upstream's stamp of the
                      first token (ttft_up_added_p99_us, first_token_added_p99_us)
                      (a paced load run in several passes, as the smallest is in a full run,
                      gives each figure as the median of its passes', each pass against
                      direct's in the same pass; "passes" lists them)
  rss_kib_per_stream  (VmRSS at the largest paced load - idle VmRSS) / streams
  cpu_us_per_paced_event, syscalls_per_paced_event
                      the target's CPU µs and system calls (perf's count over the measured
                      window, when run.sh could take it) per event at the smallest paced load
  cpu_us_per_request, syscalls_per_request
                      the same per request in the req<N> run (2-token requests, no pacing)
  syscalls_per_saturated_event
                      system calls per event in the best saturation run (the run whose CPU
                      cpu_s_per_M_chunks is); each saturation load has its own in "saturation",
                      beside upstream_core_share (the fake upstream's CPU over the window, in
                      cores: at ~1.0 the fake, not the target, bounded events/s) and
                      loadgen_cpu_us_per_event
  vs_nginx            each of these, and the added latency and TTFT, against nginx's in the
                      same run (ratios; system calls per event as a difference), and under
                      "saturation" and "paced" the same per load (events/s, CPU and system
                      calls per event; added p99 and TTFT)

Usage: report.py line JSON               one-line summary of a loadgen result
       report.py summary OUTDIR BENCH_JSON [quick]
Python standard library only.
"""
import datetime
import json
import os
import platform
import sys

TARGETS = ["direct", "nginx", "loopguard_guard_off", "loopguard", "portkey"]


def line_summary(rec):
    return (f"{rec['label']:<28} {rec['events_per_s']:>10.0f} ev/s  "
            f"lat p50 {rec['lat_p50_us']:>7} us p99 {rec['lat_p99_us']:>7} us  "
            f"ttft p50 {rec['ttft_p50_us']:>7} us p99 {rec['ttft_p99_us']:>7} us  "
            f"errors {rec['errors']}  cpu {rec['target_cpu_s']:.2f}s  "
            f"rss {rec['target_rss_kib']} KiB  loadgen {rec['loadgen_cpu_s']:.2f}s")


def machine(quick, outdir):
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            mem_kib = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "memory_gib": round(mem_kib / 1048576, 1),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": bool(quick),
        "note": "load generator, fake upstream and target share all cores; nothing pinned",
        "loadavg_start": read_text(os.path.join(outdir, "loadavg-start")),
        "loadavg_end": read_text("/proc/loadavg"),
        "cpu_idle_pct_start": (int(read_text(os.path.join(outdir, "idle-start")) or 0)
                               if read_text(os.path.join(outdir, "idle-start")) else None),
        "busy": busy_processes(os.path.join(outdir, "ps-start")),
        "loopguard_extra": read_json(os.path.join(outdir, "loopguard-extra.json")) or {},
    }


def read_text(path):
    try:
        with open(path) as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def busy_processes(path):
    """Processes using ≥ 20 % of a core (lifetime average, from `ps`) when the run started."""
    out = []
    try:
        with open(path) as f:
            for line in f.readlines()[1:]:
                parts = line.split(None, 1)
                if len(parts) == 2 and float(parts[0]) >= 20:
                    out.append(f"{parts[1].strip()} {parts[0]} %")
    except (OSError, ValueError):
        pass
    return out


def load_results(path):
    """({target: {scenario: record}}, {target: errors over every run, repeats included}).
    A paced scenario that ran in several passes keeps them all, in order, as a list."""
    runs, errors = {}, {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                target, scen = rec["label"].split(":", 1)
                errors[target] = errors.get(target, 0) + rec.get("errors", 0)
                scens = runs.setdefault(target, {})
                old = scens.get(scen)
                if scen.startswith("paced"):
                    scens[scen] = (old or []) + [rec]
                    continue
                # Saturation runs repeat; the best pass is the target's capacity.
                if old is not None:
                    rec["passes"] = old.get("passes", [round(old["events_per_s"])]) + [
                        round(rec["events_per_s"])]
                    if old["events_per_s"] > rec["events_per_s"]:
                        old["passes"] = rec["passes"]
                        rec = old
                scens[scen] = rec
    return runs, errors


def by_prefix(scens, prefix):
    """{N: record} for scenarios named prefix<N>."""
    out = {}
    for name, rec in scens.items():
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            out[int(name[len(prefix):])] = rec
    return out


def cpu_per_m(rec):
    """The target's CPU seconds per million events of one run; None when the target
    process was lost during the run (loadgen reports -1) or nothing was relayed."""
    if rec["target_cpu_s"] < 0 or not rec["events"]:
        return None
    return round(rec["target_cpu_s"] / rec["events"] * 1e6, 2)


def others_share(recs):
    """Mean share of the machine's CPU (all cores, over the measured windows) taken by
    processes other than the target, the fake upstream and the load generator."""
    shares = []
    for r in recs:
        if "machine_busy_cpu_s" not in r or r["target_cpu_s"] < 0:
            continue
        ours = r["target_cpu_s"] + r["upstream_cpu_s"] + r["loadgen_cpu_s"]
        total = r["cores"] * r["duration_s"]
        shares.append(max(0.0, r["machine_busy_cpu_s"] - ours) / total)
    return round(sum(shares) / len(shares), 3) if shares else None


def runq_share(rec):
    """Of the time the target's threads wanted a CPU in the window, the share they spent
    waiting for one (run-queue delay from schedstat): high means its latency is mostly the
    machine's queue, not its own work."""
    wait, run = rec.get("target_runq_wait_s"), rec["target_cpu_s"]
    if wait is None or run < 0 or wait + run <= 0:
        return None
    return round(wait / (wait + run), 3)


def upstream_core(rec):
    """The fake upstream's CPU over the measured window, in cores (it has one thread): at
    about 1.0 the fake, not the target, set the run's events/s. None for direct (whose
    target is the fake) and when the fake's CPU was not watched."""
    v = rec.get("upstream_cpu_s")
    if not v or v < 0 or not rec.get("duration_s"):
        return None
    return round(v / rec["duration_s"], 2)


def per_event(rec, key, scale=1.0):
    """rec[key] per event of one run (key: target_cpu_s or target_syscalls); None when the
    figure is missing, the target was lost or nothing was relayed."""
    v = rec.get(key)
    if v is None or v < 0 or not rec["events"]:
        return None
    return round(v / rec["events"] * scale, 2)


def per_request(rec, key, scale=1.0):
    v = rec.get(key)
    if v is None or v < 0 or not rec["requests"]:
        return None
    return round(v / rec["requests"] * scale, 1)


def diff(rec, base, key):
    """rec[key] - base[key]; None unless both runs relayed events."""
    if not base or not rec["events"] or not base["events"] or key not in rec or key not in base:
        return None
    return rec[key] - base[key]


def paced_figures(n, r, base):
    """The figures of one paced pass: r the target's run, base direct's in the same pass."""
    return {
        "streams": n,
        "events_per_s": round(r["events_per_s"]),
        "lat_p50_us": r["lat_p50_us"], "lat_p99_us": r["lat_p99_us"],
        "ttft_p50_us": r["ttft_p50_us"], "ttft_p99_us": r["ttft_p99_us"],
        "p50_added_us": diff(r, base, "lat_p50_us"),
        "p99_added_us": diff(r, base, "lat_p99_us"),
        "ttft_added_p50_us": diff(r, base, "ttft_p50_us"),
        "ttft_added_us": diff(r, base, "ttft_p99_us"),
        # TTFT in two legs, split at the upstream's stamp of the first token: the
        # request's way to the upstream (with its pace) and the first token's way back.
        "ttft_up_added_p99_us": diff(r, base, "ttft_up_p99_us"),
        "first_token_added_p99_us": diff(r, base, "first_lat_p99_us"),
        "rss_kib": r["target_rss_kib"],
        "cpu_us_per_event": per_event(r, "target_cpu_s", 1e6),
        "syscalls_per_event": per_event(r, "target_syscalls"),
        "errors": r["errors"],
        # Below 1 the target did not keep up with the offered pace; the fake then
        # stalls on back-pressure, so its latency figures understate the delay.
        "delivered_vs_direct": (round(r["events_per_s"] / base["events_per_s"], 3)
                                if base and base["events_per_s"] else None),
        "runq_wait_share": runq_share(r),
    }


def median_figures(passes):
    """One paced load's figures over its passes: each number the median of the passes' (the
    middle one of three, the mean of the two middle ones of an even count), so that one
    pass disturbed by other work on the machine moves no figure; "passes" lists each pass's
    CPU per event, added p99 and added TTFT p99."""
    out = dict(passes[0])
    if len(passes) > 1:
        for k, v in out.items():
            vals = sorted(p[k] for p in passes if isinstance(p.get(k), (int, float)))
            if isinstance(v, (int, float)) and vals:
                m = len(vals) // 2
                mid = vals[m] if len(vals) % 2 else (vals[m - 1] + vals[m]) / 2
                out[k] = round(mid, 3) if isinstance(mid, float) else mid
        out["errors"] = sum(p["errors"] for p in passes)
        out["passes"] = [{k: p.get(k) for k in ("cpu_us_per_event", "p99_added_us",
                                                 "ttft_added_us")} for p in passes]
    return out


def figures(runs, errors):
    direct = runs.get("direct", {})
    d_paced = by_prefix(direct, "paced")
    out = {}
    for target in [t for t in TARGETS if t in runs] + [t for t in runs if t not in TARGETS]:
        scens = runs[target]
        sat = by_prefix(scens, "sat")
        paced = by_prefix(scens, "paced")
        fig = {}
        best = max(sat.values(), key=lambda r: r["events_per_s"]) if sat else None
        fig["chunks_per_s"] = round(best["events_per_s"]) if best else None
        fig["cpu_s_per_M_chunks"] = cpu_per_m(best) if best else None
        fig["syscalls_per_saturated_event"] = per_event(best, "target_syscalls") if best else None
        fig["saturation"] = {str(n): {"streams": n, "events_per_s": round(r["events_per_s"]),
                                      "cpu_s_per_M": cpu_per_m(r),
                                      "syscalls_per_event": per_event(r, "target_syscalls"),
                                      "upstream_core_share": upstream_core(r),
                                      "loadgen_cpu_us_per_event": per_event(r, "loadgen_cpu_s", 1e6),
                                      "passes": r.get("passes"),
                                      "errors": r["errors"]}
                             for n, r in sorted(sat.items())}
        pac = {}
        for n, recs in sorted(paced.items()):
            bases = d_paced.get(n) or []
            passes = [paced_figures(n, r, bases[i] if i < len(bases) else None)
                      for i, r in enumerate(recs)]
            pac[str(n)] = median_figures(passes)
        fig["paced"] = pac
        lo = pac[str(min(paced))] if paced else {}
        for k in ("p50_added_us", "p99_added_us", "ttft_added_us", "ttft_added_p50_us"):
            fig[k] = lo.get(k)
        fig["cpu_us_per_paced_event"] = lo.get("cpu_us_per_event")
        fig["syscalls_per_paced_event"] = lo.get("syscalls_per_event")
        req = by_prefix(scens, "req")
        fig["requests"] = {str(n): {"streams": n, "requests_per_s":
                                    round(r["requests"] / r["duration_s"]) if r["duration_s"] else None,
                                    "cpu_us_per_request": per_request(r, "target_cpu_s", 1e6),
                                    "syscalls_per_request": per_request(r, "target_syscalls"),
                                    "errors": r["errors"]}
                           for n, r in sorted(req.items())}
        rq = fig["requests"][str(min(req))] if req else {}
        fig["cpu_us_per_request"] = rq.get("cpu_us_per_request")
        fig["syscalls_per_request"] = rq.get("syscalls_per_request")
        idle = scens.get("idle", {}).get("target_rss_kib")
        if paced and idle is not None:
            hi = max(paced)
            fig["idle_rss_kib"] = idle
            fig["rss_kib_per_stream"] = round((pac[str(hi)]["rss_kib"] - idle) / hi, 2)
            fig["rss_streams"] = hi
        else:
            fig["rss_kib_per_stream"] = None
        fig["errors"] = errors.get(target, 0)
        fig["others_cpu_share"] = others_share([r for n, v in scens.items() if n != "idle"
                                                for r in (v if isinstance(v, list) else [v])])
        out[target] = fig
    ng = out.get("nginx")
    for target, fig in out.items():
        if ng and target not in ("nginx", "direct"):
            fig["vs_nginx"] = against_nginx(fig, ng)
    return out


def against_nginx(fig, ng):
    """A target's per-event and per-request costs and added latency against nginx's in the
    same run: ratios, and the difference in system calls per paced event."""
    return {
        "cpu_per_paced_event": ratio(fig.get("cpu_us_per_paced_event"),
                                     ng.get("cpu_us_per_paced_event")),
        "syscalls_per_paced_event_minus": minus(fig.get("syscalls_per_paced_event"),
                                                ng.get("syscalls_per_paced_event")),
        "cpu_per_request": ratio(fig.get("cpu_us_per_request"), ng.get("cpu_us_per_request")),
        "syscalls_per_request": ratio(fig.get("syscalls_per_request"),
                                      ng.get("syscalls_per_request")),
        "cpu_per_saturated_event": ratio(fig.get("cpu_s_per_M_chunks"),
                                         ng.get("cpu_s_per_M_chunks")),
        "p99_added": ratio(fig.get("p99_added_us"), ng.get("p99_added_us")),
        "ttft_added": ratio(fig.get("ttft_added_us"), ng.get("ttft_added_us")),
        "syscalls_per_saturated_event_minus": minus(fig.get("syscalls_per_saturated_event"),
                                                    ng.get("syscalls_per_saturated_event")),
        "rss_per_stream": ratio(fig.get("rss_kib_per_stream"), ng.get("rss_kib_per_stream")),
        "events_per_s": ratio(fig.get("chunks_per_s"), ng.get("chunks_per_s")),
        "saturation": {n: {"events_per_s": ratio(x["events_per_s"], ng["saturation"][n]["events_per_s"]),
                           "cpu_per_event": ratio(x["cpu_s_per_M"], ng["saturation"][n]["cpu_s_per_M"]),
                           "syscalls_per_event_minus": minus(x["syscalls_per_event"],
                                                             ng["saturation"][n]["syscalls_per_event"])}
                       for n, x in fig["saturation"].items() if n in ng["saturation"]},
        "paced": {n: {"cpu_per_event": ratio(x["cpu_us_per_event"], ng["paced"][n]["cpu_us_per_event"]),
                      "syscalls_per_event_minus": minus(x["syscalls_per_event"],
                                                        ng["paced"][n]["syscalls_per_event"]),
                      "p99_added": ratio(x["p99_added_us"], ng["paced"][n]["p99_added_us"]),
                      "ttft_added": ratio(x["ttft_added_us"], ng["paced"][n]["ttft_added_us"])}
                  for n, x in fig["paced"].items() if n in ng["paced"]},
    }


def minus(a, b):
    """a - b, rounded; None unless both are there."""
    return round(a - b, 2) if a is not None and b is not None else None


def ratio(a, b):
    """a / b; None unless both are positive (an added latency can read below zero, as a
    difference of two p99s, and then no ratio means anything)."""
    return round(a / b, 3) if a is not None and b is not None and a > 0 and b > 0 else None


def looping(outdir):
    def gens(name):
        try:
            with open(os.path.join(outdir, name)) as f:
                return [r for r in json.load(f) if r.get("kind") == "generation"]
        except (OSError, ValueError):
            return None
    without, with_ = gens("loop-without.json"), gens("loop-with.json")
    if without is None and with_ is None:
        return None
    res = {}
    if without:
        res["tokens_without"] = max(g["tokens_sent"] for g in without)
    if with_:
        sent = [g["tokens_sent"] for g in with_]
        res["attempts"] = len(sent)
        res["tokens_with_per_attempt"] = round(sum(sent) / len(sent), 1)
        res["tokens_with_max_attempt"] = max(sent)
        res["tokens_with_total"] = sum(sent)
        res["attempts_detail"] = [{"tokens_sent": g["tokens_sent"], "ended": g.get("ended"),
                                   "aborted": g.get("aborted")} for g in with_]
    return res


def fmt(v, unit=""):
    if v is None:
        return "–"
    if isinstance(v, float):
        v = round(v, 2)
    if isinstance(v, int) and abs(v) >= 10000:
        return f"{v:,}{unit}"
    return f"{v}{unit}"


def table(figs, ratios, loop, mach):
    sat_ns = sorted({int(n) for f in figs.values() for n in f["saturation"]})
    pac_ns = sorted({int(n) for f in figs.values() for n in f["paced"]})
    lo = pac_ns[0] if pac_ns else None
    hi = pac_ns[-1] if pac_ns else None
    head = ["target"] + [f"events/s @{n} sat" for n in sat_ns] + ["CPU s / M events"]
    if lo:
        head += [f"added p50 / p99 µs @{lo}"]
    if hi and hi != lo:
        head += [f"added p50 / p99 µs @{hi}"]
    if lo:
        head += [f"added TTFT p50 / p99 µs @{lo}", f"waiting for CPU @{lo}",
                 f"paced delivered @{hi}", f"RSS KiB / stream @{hi}"]
    head += ["errors", "others' CPU"]
    rows = []
    for t, f in figs.items():
        row = [t] + [fmt(f["saturation"].get(str(n), {}).get("events_per_s")) for n in sat_ns]
        row.append(fmt(f["cpu_s_per_M_chunks"]))
        for n in ([lo] if lo else []) + ([hi] if hi and hi != lo else []):
            p = f["paced"].get(str(n), {})
            row.append(f"{fmt(p.get('p50_added_us'))} / {fmt(p.get('p99_added_us'))}")
        if lo:
            p = f["paced"].get(str(lo), {})
            row.append(f"{fmt(p.get('ttft_added_p50_us'))} / {fmt(p.get('ttft_added_us'))}")
            w = p.get("runq_wait_share")
            row.append("–" if w is None else f"{w * 100:.0f} %")
            d = f["paced"].get(str(hi), {}).get("delivered_vs_direct")
            row.append("–" if d is None else f"{d * 100:.0f} %")
            row.append(fmt(f.get("rss_kib_per_stream")))
        row.append(fmt(f["errors"]))
        o = f.get("others_cpu_share")
        row.append("–" if o is None else f"{o * 100:.0f} %")
        rows.append(row)
    lines = [f"Machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory_gib']} GiB, "
             f"Linux {mach['kernel']}, {mach['date']}"
             f"{' (QUICK=1)' if mach['quick'] else ''}; load generator, fake upstream and "
             f"target share the cores."
             + (f" Both loopguard targets ran with {json.dumps(mach['loopguard_extra'])} added "
                "to their configuration (BENCH_LOOPGUARD_JSON), not with the defaults."
                if mach.get("loopguard_extra") else ""), ""]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines.append("")
    lines.append("Direct's latency is the floor; \"added\" is target minus direct in the same "
                 "run. Direct's CPU and RSS are the fake upstream's. \"Paced delivered\" is the "
                 "target's events/s over direct's at the largest paced load: below 100 % the "
                 "target fell behind the offered pace, the fake upstream stalled on "
                 "back-pressure, and that target's added latency is understated. \"Others' CPU\" is the "
                 "share of the machine's CPU that processes other than the target, the fake "
                 "upstream and the load generator took during that target's runs. \"Waiting for CPU\" is "
                 "the share of the time the target's threads were runnable but queued for a "
                 "core (schedstat): when it is high, the added latency is the machine's queue.")
    n_pass = max((len(f["paced"].get(str(lo), {}).get("passes") or [1]) for f in figs.values()),
                 default=1) if lo else 1
    if n_pass > 1:
        lines[-1] += (f" Every figure @{lo} paced is the median of {n_pass} passes, run in turn "
                      "over the targets.")
    lines += cost_table(figs, lo)
    idle = mach.get("cpu_idle_pct_start")
    if idle is not None and idle < 90:
        lines.append("")
        lines.append(f"The machine was only {idle} % idle before the run (figures are noisier); "
                     "busiest processes (lifetime average): " + "; ".join(mach["busy"]))
    lines.append("")
    goals = goal_rows(figs, ratios, loop, lo, hi)
    if goals:
        lines.append("| goal | measured | | nginx, same run |")
        lines.append("|---|---:|---|---:|")
        lines += [f"| {g} | {m} | {'met' if ok else ('not met' if ok is False else 'n/a')} "
                  f"| {ref} |" for g, m, ok, ref in goals]
        lines.append("")
        lines.append("The last column holds the plain relay to the same goals where they apply "
                     "to it: when nginx misses a latency goal too, the machine's queue, not the "
                     "relay, set the figure.")
    return "\n".join(lines)


def cost_table(figs, lo):
    """What each target spends per event and per request, and against nginx."""
    if not any(f.get("cpu_us_per_paced_event") or f.get("cpu_us_per_request")
               for f in figs.values()):
        return []

    def with_ratio(v, r, unit="×"):
        return fmt(v) + ("" if r is None else f" ({r:.2f}{unit})")

    def with_diff(v, d):
        return fmt(v) + ("" if d is None else f" ({d:+.2f})")

    def per_load(f, vs, key, vs_key, show):
        """One figure per saturation load, each with its comparison to nginx's."""
        sat = vs.get("saturation", {})
        cells = [show(x.get(key), sat.get(n, {}).get(vs_key)) for n, x in f["saturation"].items()]
        return " / ".join(cells) if cells else "–"

    def drivers(x):
        """The fake upstream's cores and the load generator's CPU per event of one load."""
        return f"{fmt(x.get('upstream_core_share'))}; {fmt(x.get('loadgen_cpu_us_per_event'))}"

    sat_ns = sorted({int(n) for f in figs.values() for n in f["saturation"]})
    loads = " / ".join(f"@{n}" for n in sat_ns)
    lines = ["", f"| target | CPU µs / paced event @{lo} | system calls / paced event @{lo} | "
             f"CPU µs / saturated event {loads} | system calls / saturated event {loads} | "
             f"fake upstream's cores; loadgen µs / event, saturated {loads} | "
             "CPU µs / request | system calls / request |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for t, f in figs.items():
        vs = f.get("vs_nginx", {})
        lines.append(
            f"| {t} | {with_ratio(f.get('cpu_us_per_paced_event'), vs.get('cpu_per_paced_event'))}"
            f" | {with_diff(f.get('syscalls_per_paced_event'), vs.get('syscalls_per_paced_event_minus'))}"
            f" | {per_load(f, vs, 'cpu_s_per_M', 'cpu_per_event', with_ratio)}"
            f" | {per_load(f, vs, 'syscalls_per_event', 'syscalls_per_event_minus', with_diff)}"
            f" | {' / '.join(drivers(x) for x in f['saturation'].values()) or '–'}"
            f" | {with_ratio(f.get('cpu_us_per_request'), vs.get('cpu_per_request'))}"
            f" | {with_ratio(f.get('syscalls_per_request'), vs.get('syscalls_per_request'))} |")
    lines.append("")
    lines.append("In brackets: against nginx in the same run (CPU as a ratio, system calls per "
                 "event as a difference, per request as a ratio). A request is 2-token "
                 "requests on 10 unpaced streams; the saturated columns list each saturation "
                 "load (CPU µs per event is the CPU s / M events of the main table). System "
                 "calls are perf's count of raw_syscalls:sys_enter for the target's processes "
                 "over the measured window. The fake upstream has one thread: where it used "
                 "about 1.0 core, it bounded that load's events/s, and the ratio to nginx "
                 "tells how much each target slowed the fake rather than what the target "
                 "could relay. The load generator's CPU per event depends on how the target "
                 "packs events into writes.")
    return lines


def goal_rows(figs, ratios, loop, lo, hi):
    lg = figs.get("loopguard")
    if not lg:
        return []
    ng = figs.get("nginx", {})
    rows = []

    def add(goal, value, ok, unit="", ref_key=None, ref_unit=None, note=""):
        ref = fmt(ng.get(ref_key), unit if ref_unit is None else ref_unit) if ref_key else ""
        # a ratio keeps its third decimal: 0.897× must not print as a "not met" 0.9×
        shown = f"{value:.3f}{unit}" if unit == "×" and value is not None else fmt(value, unit)
        rows.append((goal, shown + note, None if value is None else ok(value), ref))
    vs = lg.get("vs_nginx", {})
    per_load = [f"{r['events_per_s']:.3f}× @{n}" for n, r in vs.get("saturation", {}).items()
                if r.get("events_per_s") is not None]
    add("events/s ≥ 1.0× nginx (best load against best)", ratios.get("loopguard_vs_nginx"),
        lambda v: v >= 1.0, "×", "chunks_per_s", "",
        f" ({', '.join(per_load)})" if per_load else "")
    add("events/s ≥ 10× portkey", ratios.get("loopguard_vs_portkey"), lambda v: v >= 10, "×")
    add("events/s ≥ 0.9× guard off", ratios.get("loopguard_vs_guard_off"), lambda v: v >= 0.9,
        "×")
    add(f"CPU per paced event ≤ 1.0× nginx @{lo}", vs.get("cpu_per_paced_event"),
        lambda v: v <= 1.0, "×", "cpu_us_per_paced_event", " µs")
    add(f"system calls per paced event ≤ nginx + 0.3 @{lo}",
        vs.get("syscalls_per_paced_event_minus"), lambda v: v <= 0.3, "",
        "syscalls_per_paced_event")
    add("CPU per request (2 tokens) ≤ 1.5× nginx", vs.get("cpu_per_request"),
        lambda v: v <= 1.5, "×", "cpu_us_per_request", " µs")
    add(f"p99 added latency ≤ 1.5× nginx @{lo} paced", vs.get("p99_added"),
        lambda v: v <= 1.5, "×", "p99_added_us", " µs")
    add(f"p99 added TTFT ≤ 1.5× nginx @{lo} paced", vs.get("ttft_added"), lambda v: v <= 1.5,
        "×", "ttft_added_us", " µs")
    add(f"RSS ≤ 32 KiB / stream @{hi} paced", lg.get("rss_kib_per_stream"), lambda v: v <= 32,
        " KiB", "rss_kib_per_stream")
    add("no errors", lg.get("errors"), lambda v: v == 0, "", "errors")
    if loop:
        add("looping request ≤ 40 tokens / attempt", loop.get("tokens_with_per_attempt"),
            lambda v: v <= 40)
    return rows


def summary(outdir, bench_json, quick):
    runs, errors = load_results(os.path.join(outdir, "results.jsonl"))
    figs = figures(runs, errors)
    cps = {t: f["chunks_per_s"] for t, f in figs.items()}
    ratios = {
        "loopguard_vs_nginx": ratio(cps.get("loopguard"), cps.get("nginx")),
        "loopguard_vs_portkey": ratio(cps.get("loopguard"), cps.get("portkey")),
        "loopguard_vs_guard_off": ratio(cps.get("loopguard"), cps.get("loopguard_guard_off")),
        "nginx_vs_direct": ratio(cps.get("nginx"), cps.get("direct")),
    }
    loop = looping(outdir)
    mach = machine(quick, outdir)
    doc = {"machine": mach}
    doc.update(figs)
    doc["ratios"] = ratios
    if loop:
        doc["looping"] = loop
    with open(bench_json, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    print()
    print(table(figs, ratios, loop, mach))
    if loop:
        print()
        print(f"Looping request (max_tokens {loop.get('tokens_without', '?')}): upstream "
              f"generated {fmt(loop.get('tokens_without'))} tokens without loopguard; with "
              f"loopguard {fmt(loop.get('attempts'))} attempts, "
              f"{fmt(loop.get('tokens_with_per_attempt'))} tokens per attempt "
              f"(max {fmt(loop.get('tokens_with_max_attempt'))}, "
              f"total {fmt(loop.get('tokens_with_total'))}).")
    print()
    print(f"bench: wrote {bench_json}")


def main(argv):
    if len(argv) >= 3 and argv[1] == "line":
        print(line_summary(json.loads(argv[2])))
        return 0
    if len(argv) >= 4 and argv[1] == "summary":
        summary(argv[2], argv[3], len(argv) > 4 and argv[4])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
