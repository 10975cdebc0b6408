#!/usr/bin/env python3
"""check.py — the soak's verdict (called by tests/soak.sh; python3 standard library only).

Reads what the run left behind (soakload's JSON summary, the fd/RSS samples, the incident
log) and asks the live loopguard and fake upstreams for their end state (/loopguard/health,
/loopguard/metrics, each fake's /metrics). Prints the figures, writes them as one JSON
object to --out, and exits 1 when any criterion of tests/soak.sh's header failed.
"""
import argparse
import json
import os
import re
import sys
import time
import urllib.request


def get(url, timeout=10):
    """(status, body text) of a GET; (0, reason) when the server cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except OSError as e:
        return 0, str(e)


def parse_metrics(text):
    """{(name, frozenset(labels)): value} from Prometheus text."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][\w:]*)(\{(.*)\})? (\S+)$', line)
        if not m:
            continue
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def metric(ms, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, l), v in ms.items() if n == name and want <= set(l))


def slope_per_min(points):
    """Least-squares slope of [(t_s, v)] in units per minute (0 with fewer than 2 points)."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / den if den else 0.0


def fd_classes(pid, lg_port, upstream_ports):
    """loopguard's open descriptors by kind: sockets of client connections (local port =
    the listener's), of upstream connections (remote port = a fake's), and the rest."""
    inode_ports = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in f.read().splitlines()[1:]:
                    c = line.split()
                    lport = int(c[1].rsplit(":", 1)[1], 16)
                    rport = int(c[2].rsplit(":", 1)[1], 16)
                    inode_ports[c[9]] = (lport, rport, c[3] == "0A")  # 0A: LISTEN
        except OSError:
            pass
    out = {"client": 0, "upstream": 0, "listen": 0, "other": 0}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for n in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        m = re.match(r"socket:\[(\d+)\]", target)
        ports = inode_ports.get(m.group(1)) if m else None
        if not ports:
            out["other"] += 1
        elif ports[2]:
            out["listen"] += 1
        elif ports[0] == lg_port:
            out["client"] += 1
        elif ports[1] in upstream_ports:
            out["upstream"] += 1
        else:
            out["other"] += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--incidents", required=True)
    ap.add_argument("--samples", required=True)
    ap.add_argument("--load", required=True)
    ap.add_argument("--load-rc", type=int, required=True)
    ap.add_argument("--warmup", type=float, required=True)
    ap.add_argument("--streams", type=int, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--baseline", type=int, nargs=2, required=True)
    ap.add_argument("--after", type=int, nargs=2, required=True)
    ap.add_argument("--fakes", required=True)
    ap.add_argument("--stderr", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    fails = []
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "streams": a.streams,
           "duration_s": a.duration, "warmup_s": a.warmup}

    def check(ok, what):
        if not ok:
            fails.append(what)

    # --- the client's view -------------------------------------------------------------
    try:
        with open(a.load) as f:
            load = json.loads(f.read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError) as e:
        load = {}
        fails.append(f"no soakload summary ({e})")
    res["load"] = load
    for k in ("malformed", "leaks", "hung", "connect_errors", "io_errors", "clean_not_ok"):
        check(load.get(k, 1) == 0, f"soakload {k} = {load.get(k)}")
    check(a.load_rc == 0, f"soakload exit status {a.load_rc}")
    check(load.get("max_inflight", 0) >= a.streams, f"only {load.get('max_inflight')} streams were in flight at once")

    # --- crashes -------------------------------------------------------------------------
    alive = os.path.exists(f"/proc/{a.pid}")
    status, body = get(a.url + "/loopguard/health")
    res["alive"] = alive
    res["health"] = status
    check(alive, "loopguard is not running")
    check(status == 200 and '"ok"' in body, f"/loopguard/health answered {status} {body[:100]}")

    # --- fds and RSS ---------------------------------------------------------------------
    samples = []
    with open(a.samples) as f:
        for line in f.read().splitlines()[1:]:
            t, fds, rss = (int(x) for x in line.split())
            samples.append((t, fds, rss))
    res["samples"] = [{"t_s": t, "fds": fds, "rss_kib": rss} for t, fds, rss in samples]
    res["baseline"] = {"fds": a.baseline[0], "rss_kib": a.baseline[1]}
    res["after_idle"] = {"fds": a.after[0], "rss_kib": a.after[1]}
    check(all(fds >= 0 for _, fds, _ in samples), "loopguard vanished during the run")
    steady = [s for s in samples if s[0] >= a.warmup]
    if len(steady) < 2:
        fails.append(f"fewer than 2 samples after the {a.warmup:.0f} s warm-up")
    else:
        (t0, f0, r0), (t1, f1, r1) = steady[0], steady[-1]
        fd_slope = slope_per_min([(t, f) for t, f, _ in steady])
        rss_slope = slope_per_min([(t, r) for t, _, r in steady])
        res["steady"] = {"from_s": t0, "to_s": t1, "fds_first": f0, "fds_last": f1,
                         "fds_min": min(s[1] for s in steady), "fds_max": max(s[1] for s in steady),
                         "fds_slope_per_min": round(fd_slope, 1), "rss_first_kib": r0,
                         "rss_last_kib": r1, "rss_max_kib": max(s[2] for s in steady),
                         "rss_slope_kib_per_min": round(rss_slope, 1)}
        check(r1 <= r0 * 1.10 + 16384, f"RSS grew after warm-up: {r0} -> {r1} KiB ({rss_slope:.0f} KiB/min)")
        check(f1 <= f0 * 1.10 + 64, f"fds grew after warm-up: {f0} -> {f1} ({fd_slope:.1f}/min)")
    # After the load: no client connection may stay open; upstream connections stay cached
    # for reuse (libcurl keeps up to 4x the transfers a worker had, and drops them after
    # about two idle minutes), so they are bounded, not zero.
    lg_port = int(a.url.rsplit(":", 1)[1])
    fake_ports = {int(u.rsplit(":", 1)[1]) for u in a.fakes.split(",")}
    classes = fd_classes(a.pid, lg_port, fake_ports)
    res["after_idle"]["by_kind"] = classes
    if classes is not None:
        check(classes["client"] == 0, f"{classes['client']} client connections still open after the load")
        check(classes["upstream"] <= 4 * a.streams + 64, f"{classes['upstream']} upstream connections open after the load")
        check(classes["other"] <= a.baseline[0] + 16, f"{classes['other']} other descriptors open after the load (baseline {a.baseline[0]} in all)")

    # --- metrics vs incident log ---------------------------------------------------------
    ms = {}
    # The incident writer is asynchronous: wait until it has written all it was given.
    for _ in range(50):
        status, text = get(a.url + "/loopguard/metrics")
        ms = parse_metrics(text) if status == 200 else {}
        sub = metric(ms, "loopguard_incidents_total", fate="submitted")
        done = sum(metric(ms, "loopguard_incidents_total", fate=f) for f in ("written", "dropped", "write_error"))
        if status == 200 and metric(ms, "loopguard_active_streams") == 0 and sub == done:
            break
        time.sleep(0.2)
    check(bool(ms), "no metrics")
    check(metric(ms, "loopguard_active_streams") == 0, f"{metric(ms, 'loopguard_active_streams'):.0f} streams still active after the load")
    records, bad_lines = [], 0
    try:
        with open(a.incidents) as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    bad_lines += 1
    except FileNotFoundError:
        pass
    inc = {f: int(metric(ms, "loopguard_incidents_total", fate=f)) for f in ("submitted", "written", "dropped", "write_error")}
    exch = [r for r in records if r.get("kind") != "upstream"]
    ups = [r for r in records if r.get("kind") == "upstream"]
    by_outcome_file, by_outcome_metrics = {}, {}
    for r in exch:
        by_outcome_file[r.get("outcome")] = by_outcome_file.get(r.get("outcome"), 0) + 1
    for (n, l), v in ms.items():
        if n == "loopguard_outcomes_total" and v:
            by_outcome_metrics[dict(l)["outcome"]] = int(v)
    ejections = int(metric(ms, "loopguard_upstream_ejections_total"))
    res["upstream_errors"] = {dict(l)["kind"]: int(metric(ms, "loopguard_upstream_errors_total", kind=dict(l)["kind"]))
                              for (n, l), v in ms.items() if n == "loopguard_upstream_errors_total"}
    res["requests_by_code"] = {dict(l)["code"]: int(metric(ms, "loopguard_requests_total", endpoint="chat", code=dict(l)["code"]))
                               for (n, l), v in ms.items() if n == "loopguard_requests_total" and dict(l).get("endpoint") == "chat"}
    res["incidents"] = {"file_lines": len(records) + bad_lines, "unparsable_lines": bad_lines,
                        "metrics": inc, "exchange_records": len(exch),
                        "outcomes_file": by_outcome_file, "outcomes_metrics": by_outcome_metrics,
                        "upstream_records": len(ups), "ejections_metric": ejections}
    check(bad_lines == 0, f"{bad_lines} incident lines are not JSON")
    check(len(records) + bad_lines == inc["written"], f"incident file has {len(records) + bad_lines} lines, metrics say {inc['written']} written")
    check(inc["dropped"] == 0 and inc["write_error"] == 0, f"incidents dropped {inc['dropped']}, write errors {inc['write_error']}")
    check(inc["submitted"] == inc["written"] + inc["dropped"] + inc["write_error"], f"incident fates do not add up: {inc}")
    check(by_outcome_file == by_outcome_metrics, f"incident outcomes {by_outcome_file} != loopguard_outcomes_total {by_outcome_metrics}")
    check(sum(1 for r in ups if r.get("event") == "ejected") == ejections, f"{len(ups)} upstream records vs {ejections} ejections counted")
    check(len(exch) > 0, "no exchange tripped: the looping share did not reach the guard")
    # What clients saw must be in the log: every recovered loop1 answer is a "recovered"
    # record, every content_filter end of a loopall request a "failed" one, every error end
    # of a loopreset request (loop, then the retry was reset) an "upstream_error" one. At
    # least: a client that hangs up after loopguard decided (and logged) the fate is counted
    # as hung up here, not by its fate.
    kinds = load.get("kinds", {})
    seen = {"recovered": kinds.get("loop1", {}).get("stop", 0),
            "failed": kinds.get("loopall", {}).get("content_filter", 0),
            "upstream_error": sum(kinds.get("loopreset", {}).get(f, 0) for f in ("error_event", "http_4xx", "http_5xx"))}
    res["incidents"]["client_observed"] = seen
    for outcome, n in seen.items():
        check(by_outcome_file.get(outcome, 0) >= n, f"clients saw {n} {outcome} exchanges, the log holds {by_outcome_file.get(outcome, 0)}")

    # --- upstreams released ----------------------------------------------------------------
    active = {}
    for u in a.fakes.split(","):
        for _ in range(25):
            status, text = get(u + "/metrics")
            n = metric(parse_metrics(text), "fake_active_generations") if status == 200 else -1
            if n == 0:
                break
            time.sleep(0.2)
        active[u] = n
    res["fake_active_generations"] = active
    check(all(v == 0 for v in active.values()), f"upstream generations still running: {active}")

    with open(a.stderr, errors="replace") as f:
        err = f.read()
    check(not re.search(r"Sanitizer|runtime error:", err), "sanitizer report in loopguard's stderr")
    res["violations"] = fails
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)

    # --- report ----------------------------------------------------------------------------
    L = load
    print(f"soak summary ({res['date']}): {a.streams} streams, {a.duration:.0f} s")
    print(f"  requests: {L.get('started')} started, {L.get('completed')} completed "
          f"({L.get('stream_answers')} streams, {L.get('whole_answers')} whole), "
          f"{sum(k.get('hung_up', 0) for k in L.get('kinds', {}).values())} hung up by the client, "
          f"peak {L.get('max_inflight')} in flight, {L.get('completed', 0) / max(L.get('wall_s', 1), 1):.0f}/s")
    print(f"  malformed {L.get('malformed')}, loop leaks {L.get('leaks')}, hung {L.get('hung')}, "
          f"connect errors {L.get('connect_errors')}, I/O errors {L.get('io_errors')}, "
          f"clean not ok {L.get('clean_not_ok')}, relayed foreign SSE lines {L.get('foreign_lines')}")
    for k, v in L.get("kinds", {}).items():
        print(f"    {k:<11}" + " ".join(f"{f}={n}" for f, n in v.items() if n))
    print("  samples (t s, fds, RSS KiB): " + ", ".join(f"{t}:{f}/{r}" for t, f, r in samples))
    if "steady" in res:
        s = res["steady"]
        print(f"  after warm-up ({s['from_s']}-{s['to_s']} s): fds {s['fds_first']}->{s['fds_last']} "
              f"(min {s['fds_min']}, max {s['fds_max']}, {s['fds_slope_per_min']}/min); RSS "
              f"{s['rss_first_kib']}->{s['rss_last_kib']} KiB (max {s['rss_max_kib']}, "
              f"{s['rss_slope_kib_per_min']} KiB/min)")
    print(f"  baseline {a.baseline[0]} fds / {a.baseline[1]} KiB; after the load (idle) "
          f"{a.after[0]} fds / {a.after[1]} KiB; open now by kind: {res['after_idle'].get('by_kind')}")
    i = res["incidents"]
    print(f"  incidents: {i['file_lines']} lines in the file, metrics {i['metrics']}; exchange "
          f"records {i['exchange_records']} by outcome {i['outcomes_file']} vs "
          f"loopguard_outcomes_total {i['outcomes_metrics']}; upstream records {i['upstream_records']}, "
          f"ejections {i['ejections_metric']}; clients saw at least {i['client_observed']}")
    print(f"  loopguard: chat answers by status {res['requests_by_code']}, upstream errors by kind {res['upstream_errors']}")
    print(f"  loopguard alive: {alive}, health {res['health']}; upstream generations active: {active}")
    for f_ in fails:
        print(f"  VIOLATION: {f_}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
