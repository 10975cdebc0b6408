#!/usr/bin/env python3
"""Measures the guard on real model answers: the AlpacaEval corpus against the hand labels.

Runs `loopguard scan --records -` once per model file of ../shared/corpus/alpaca-dev (every
answer, 16,100 of them), joins the verdicts with tests/corpus/labels/alpaca-dev.jsonl and
prints:
  - recall on the answers labelled degenerate, overall and per kind;
  - bytes from the loop's start to the trip (at_byte - loop_start; a trip before loop_start
    counts as caught at 0 and is listed);
  - false trips on every other answer (labelled clean look-alikes and the unlabelled ones,
    presumed clean), each with generator, index, detector and unit; how many fall on the
    strong models; and the false-trip rate over all clean answers.

It exits 1 when a target of the guard issue is missed (TARGETS below), 0 when all are met,
2 when it cannot measure (no binary, no corpus, a label that no longer matches its answer).
--report prints the same and always exits 0 unless it cannot measure.

Options: --report, --misses (list every missed loop), --config FILE (passed to scan),
--json FILE (the same figures and lists, machine-readable, for threshold sweeps),
--labels FILE, --corpus DIR. Environment: LOOPGUARD_BIN (default build/loopguard),
ALPACA_CORPUS (the corpus directory; default ../shared/corpus/alpaca-dev beside this
checkout or the one it was cloned from: default_corpus). Python 3 standard library only.
"""
import argparse
import glob
import hashlib
import json
import lzma
import math
import os
import statistics
import subprocess
import sys
from collections import Counter, defaultdict

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS_IN_SHARED = os.path.join("..", "shared", "corpus", "alpaca-dev")
DEFAULT_LABELS = os.path.join(ROOT, "tests", "corpus", "labels", "alpaca-dev.jsonl")

# The models the issue names as strong: no false trip allowed on their clean answers.
STRONG = (
    "gpt-4o-2024-05-13",
    "gpt4_0613",
    "claude-3-sonnet-20240229",
    "Meta-Llama-3.1-70B-Instruct-Turbo",
    "Qwen2-72B-Instruct",
    "yi-large-preview",
    "mistral-medium",
    "dbrx-instruct",
)

TARGETS = {
    "recall": 0.95,  # overall, on labelled degenerate answers
    "recall_kind": 0.90,  # every kind
    "median_bytes": 300,  # at_byte - loop_start
    "p90_bytes": 1500,
    "strong_false_trips": 0,
    "false_trip_rate": 1 / 2000,  # over all clean answers (labelled + presumed)
}


def p90(values):
    """Nearest-rank 90th percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def load_labels(path):
    labels = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                rec = json.loads(line)
                key = (rec["generator"], rec["index"])
                if key in labels:
                    raise SystemExit("alpaca_eval: %s:%d: %s:%d labelled twice" % (path, n, *key))
                labels[key] = rec
    return labels


def scan_model(binary, path, config):
    """(records, {index: verdict}) for one .json.xz model file."""
    with lzma.open(path, "rb") as f:
        data = f.read()
    cmd = [binary, "scan", "--records"] + (["--config", config] if config else []) + ["-"]
    r = subprocess.run(cmd, input=data, capture_output=True)
    if r.returncode != 0:
        raise SystemExit("alpaca_eval: %s on %s: exit %d: %s" % (
            " ".join(cmd), os.path.basename(path), r.returncode, r.stderr.decode(errors="replace")))
    verdicts = {}
    for line in r.stdout.decode("utf-8").splitlines():
        v = json.loads(line)
        verdicts[v["record"]] = v
    return json.loads(data), verdicts


def short(s, n=60):
    s = json.dumps(s if s is not None else "", ensure_ascii=False)[1:-1]
    return s if len(s) <= n else s[: n - 1] + "…"


def git_out(*args):
    """What `git -C ROOT ARGS` prints (stripped), or "" when git fails or is absent."""
    try:
        r = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True)
    except OSError:
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def default_corpus():
    """The team's corpus lives in ../shared beside the main checkout: beside this checkout,
    else beside the checkout it stems from (a worktree's main checkout, or the local
    repository a clone was made from, as CI clones main elsewhere). The first that exists;
    else the first, for the error to name."""
    homes = [ROOT]
    common = git_out("rev-parse", "--path-format=absolute", "--git-common-dir")
    if common:
        homes.append(os.path.dirname(common))
    origin = git_out("config", "--get", "remote.origin.url")
    if origin and os.path.isdir(origin):
        homes.append(origin)
    dirs = [os.path.normpath(os.path.join(h, CORPUS_IN_SHARED)) for h in homes]
    return next((d for d in dirs if os.path.isdir(d)), dirs[0])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", action="store_true", help="print only; exit 0 even when targets are missed")
    ap.add_argument("--misses", action="store_true", help="list every missed loop")
    ap.add_argument("--config", help="guard config passed to loopguard scan --config")
    ap.add_argument("--json", help="also write the figures and lists to this file as JSON")
    ap.add_argument("--labels", default=DEFAULT_LABELS)
    ap.add_argument("--corpus", default=os.environ.get("ALPACA_CORPUS") or default_corpus())
    args = ap.parse_args()

    binary = os.environ.get("LOOPGUARD_BIN", os.path.join(ROOT, "build", "loopguard"))
    if not os.access(binary, os.X_OK):
        print("alpaca_eval: %s is not built" % binary, file=sys.stderr)
        return 2
    files = sorted(glob.glob(os.path.join(args.corpus, "*.json.xz")))
    if not files:
        print("alpaca_eval: no *.json.xz in %s" % args.corpus, file=sys.stderr)
        return 2
    labels = load_labels(args.labels)

    caught, missed, early, false_trips = [], [], [], []
    clean_total = 0
    seen = set()
    for path in files:
        gen_file = os.path.basename(path)[: -len(".json.xz")]
        records, verdicts = scan_model(binary, path, args.config)
        if len(verdicts) != len(records):
            print("alpaca_eval: %s: %d records, %d verdicts" % (gen_file, len(records), len(verdicts)), file=sys.stderr)
            return 2
        for i, rec in enumerate(records):
            gen = gen_file  # the file name; yi-large-preview's records say "...-verified"
            v = verdicts[i]
            lab = labels.get((gen, i))
            if lab:
                seen.add((gen, i))
                sha = hashlib.sha1(rec["output"].encode("utf-8")).hexdigest()[:16]
                if sha != lab["sha1"]:
                    print("alpaca_eval: label %s:%d no longer matches its answer (sha1 %s, labelled %s)" % (
                        gen, i, sha, lab["sha1"]), file=sys.stderr)
                    return 2
            if lab and lab["label"] == "degenerate":
                if not v["tripped"]:
                    missed.append((lab, v))
                elif v["at_byte"] < lab["loop_start"]:
                    early.append((lab, v))
                    caught.append((lab, v, 0))
                else:
                    caught.append((lab, v, v["at_byte"] - lab["loop_start"]))
            else:
                clean_total += 1
                if v["tripped"]:
                    false_trips.append((gen, i, lab, v))
    unknown = set(labels) - seen
    if unknown:
        print("alpaca_eval: labels for answers not in the corpus: %s" % sorted(unknown)[:5], file=sys.stderr)
        return 2

    degenerate = len(caught) + len(missed)
    by_kind = defaultdict(lambda: [0, 0, []])  # kind -> [labelled, caught, delays]
    for lab, v, d in caught:
        k = by_kind[lab["kind"]]
        k[0] += 1
        k[1] += 1
        k[2].append(d)
    for lab, v in missed:
        by_kind[lab["kind"]][0] += 1
    delays = [d for _, _, d in caught]
    recall = len(caught) / degenerate if degenerate else 0.0
    med = statistics.median(delays) if delays else float("inf")
    q90 = p90(delays) if delays else float("inf")
    strong_ft = [f for f in false_trips if f[0] in STRONG]
    rate = len(false_trips) / clean_total if clean_total else 0.0

    print("AlpacaEval dev corpus: %d answers of %d models; %d labelled degenerate, %d labelled clean "
          "look-alikes, %d presumed clean" % (
              clean_total + degenerate, len(files), degenerate,
              sum(1 for l in labels.values() if l["label"] == "clean"),
              clean_total - sum(1 for l in labels.values() if l["label"] == "clean")))
    print("\nrecall per kind (bytes from loop_start to the trip where caught):")
    print("  %-12s %5s %6s %7s %7s %7s" % ("kind", "loops", "caught", "recall", "median", "p90"))
    for kind in sorted(by_kind):
        n, c, ds = by_kind[kind]
        print("  %-12s %5d %6d %6.1f%% %7s %7s" % (
            kind, n, c, 100.0 * c / n, int(statistics.median(ds)) if ds else "-", p90(ds) if ds else "-"))
    print("  %-12s %5d %6d %6.1f%% %7s %7s" % (
        "all", degenerate, len(caught), 100 * recall, int(med) if delays else "-", q90 if delays else "-"))
    det = Counter(v["detector"] for _, v, _ in caught)
    print("  caught by detector: " + ", ".join("%s %d" % kv for kv in det.most_common()))
    if early:
        print("\ntripped before loop_start (counted as caught at 0 bytes): %d" % len(early))
        for lab, v in early:
            print("  %s:%d %s loop_start=%d at_byte=%d %s unit=\"%s\"" % (
                lab["generator"], lab["index"], lab["kind"], lab["loop_start"], v["at_byte"], v["detector"], short(v["unit"], 40)))
    if args.misses and missed:
        print("\nmissed loops: %d" % len(missed))
        for lab, v in missed:
            print("  %s:%d %s loop_start=%d bytes=%d \"%s\"" % (
                lab["generator"], lab["index"], lab["kind"], lab["loop_start"], v["bytes"], short(lab.get("excerpt", ""), 50)))
    print("\nfalse trips on clean answers: %d of %d (%.3f%%, 1 in %s); on strong models: %d" % (
        len(false_trips), clean_total, 100 * rate, "%d" % (clean_total / len(false_trips)) if false_trips else "-", len(strong_ft)))
    for gen, i, lab, v in false_trips:
        print("  %s%s:%d %s at_byte=%d unit=\"%s\"%s" % (
            "*" if gen in STRONG else " ", gen, i, v["detector"], v["at_byte"], short(v["unit"], 50),
            " (look-alike: %s)" % short(lab.get("note", lab["kind"]), 40) if lab else ""))
    if strong_ft:
        print("  (* = strong model)")

    failed = []
    if recall < TARGETS["recall"]:
        failed.append("recall %.1f%% < %.0f%%" % (100 * recall, 100 * TARGETS["recall"]))
    for kind, (n, c, _) in sorted(by_kind.items()):
        if c / n < TARGETS["recall_kind"]:
            failed.append("recall on %s %.1f%% < %.0f%%" % (kind, 100.0 * c / n, 100 * TARGETS["recall_kind"]))
    if med > TARGETS["median_bytes"]:
        failed.append("median bytes to trip %s > %d" % (med, TARGETS["median_bytes"]))
    if q90 > TARGETS["p90_bytes"]:
        failed.append("p90 bytes to trip %s > %d" % (q90, TARGETS["p90_bytes"]))
    if len(strong_ft) > TARGETS["strong_false_trips"]:
        failed.append("%d false trips on strong models > 0" % len(strong_ft))
    if rate > TARGETS["false_trip_rate"]:
        failed.append("false-trip rate 1 in %d > 1 in 2000" % (clean_total / len(false_trips)))
    if args.json:
        summary = {
            "degenerate": degenerate,
            "caught": len(caught),
            "recall": recall,
            "median_bytes": med if delays else None,
            "p90_bytes": q90 if delays else None,
            "kinds": {k: {"loops": n, "caught": c,
                          "median_bytes": statistics.median(ds) if ds else None,
                          "p90_bytes": p90(ds) if ds else None}
                      for k, (n, c, ds) in sorted(by_kind.items())},
            "caught_loops": [{"generator": l["generator"], "index": l["index"], "kind": l["kind"],
                              "detector": v["detector"], "bytes_to_trip": d} for l, v, d in caught],
            "missed_loops": [{"generator": l["generator"], "index": l["index"], "kind": l["kind"]}
                             for l, v in missed],
            "clean": clean_total,
            "false_trips": [{"generator": g, "index": i, "strong": g in STRONG, "detector": v["detector"],
                             "at_byte": v["at_byte"], "unit": v["unit"], "look_alike": bool(l)}
                            for g, i, l, v in false_trips],
            "false_trip_rate": rate,
            "missed_targets": failed,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary, f, ensure_ascii=False, indent=1)
    print("\ntargets: " + ("all met" if not failed else "MISSED: " + "; ".join(failed)))
    if failed and args.report:
        print("(report only: --report given, exit status 0)")
    return 1 if failed and not args.report else 0


if __name__ == "__main__":
    sys.exit(main())
