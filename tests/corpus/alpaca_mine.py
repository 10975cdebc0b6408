#!/usr/bin/env python3
"""Candidate miner for the AlpacaEval labels (tests/corpus/labels/alpaca-dev.jsonl).

Ranks the 16,100 answers of ../shared/corpus/alpaca-dev by signs of repetition, so that a
person can read the likely ones with their instruction and label them by hand. Nothing here
decides a label; it only orders the reading and suggests a loop_start.

  alpaca_mine.py rank [--all]      TSV of candidates, best first (--all: every answer)
  alpaca_mine.py show GEN:IDX ...  instruction, features and the loop region of answers
  alpaca_mine.py unlabelled        candidates not yet in the labels file
  alpaca_mine.py label < DECISIONS adds or replaces labels from hand-written decisions

A decision is one line: `GEN:IDX D KIND [@WHERE] [note]` for a degenerate answer or
`GEN:IDX C KIND [note]` for a clean look-alike (KIND: the shape it resembles). WHERE is
the loop_start: a byte offset `@1234`, or `@N:"text"` (the start of the N-th occurrence of
text in the output); without it, the periodic stretch's a + p moved forward to the next
unit boundary (after a newline when the unit spans lines, else after a space when it
holds one); `@lines` takes the start of the first copy in the longest periodic run of
lines instead (digits folded, so numbered items with the same text are copies).

Signals per answer (byte offsets are into the UTF-8 output):
  per   the longest exactly periodic stretch: period p (1..MAX_PERIOD bytes), where it
        starts (a) and how many bytes repeat (run = bytes equal to the byte p earlier);
        suggested loop_start = a + p, the first byte that is a copy.
  tail  zlib ratio of the last 2 KiB (compressed / raw; low = repetitive)
  line  the most frequent non-blank line (digits folded to 0) and its count
  sent  the most frequent sentence (digits folded) and its count
  ngram the most frequent word 4-gram's count
  trip  what the current guard says (build/loopguard scan --records), when built

Environment: CORPUS_DIR (default ../shared/corpus/alpaca-dev relative to the repository
root), LOOPGUARD_BIN (default build/loopguard).
"""
import collections
import glob
import json
import lzma
import os
import re
import subprocess
import sys
import zlib

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CORPUS = os.environ.get("CORPUS_DIR", os.path.join(ROOT, "..", "shared", "corpus", "alpaca-dev"))
LABELS = os.path.join(ROOT, "tests", "corpus", "labels", "alpaca-dev.jsonl")
BIN = os.environ.get("LOOPGUARD_BIN", os.path.join(ROOT, "build", "loopguard"))
MAX_PERIOD = 600
CACHE = os.path.join(os.environ.get("TMPDIR", "/tmp"), "alpaca_mine_cache.json")


def load():
    """{generator: [records]} from the .json.xz files, file order kept."""
    out = {}
    for path in sorted(glob.glob(os.path.join(CORPUS, "*.json.xz"))):
        with lzma.open(path, "rb") as f:
            recs = json.loads(f.read())
        out[os.path.basename(path)[: -len(".json.xz")]] = recs
    return out


def periodic(b):
    """(p, a, run): the exactly periodic stretch of bytes `b` with the most repeated bytes.
    run counts the bytes equal to the byte p before them, so the stretch spans
    [a, a + p + run) and the copies begin at a + p."""
    best = (0, 0, 0)
    n = len(b)
    if n < 8:
        return best
    big = int.from_bytes(b, "big")
    for p in range(1, min(MAX_PERIOD, n // 2) + 1):
        # Equal bytes of b[p:] and b[:-p] become zero bytes of the XOR.
        x = (big >> (8 * p)) ^ (big & ((1 << (8 * (n - p))) - 1))
        diff = x.to_bytes(n - p, "big")
        for m in re.finditer(rb"\x00{%d,}" % max(best[2] + 1, 2 * p, 24), diff):
            run = m.end() - m.start()
            if run > best[2]:
                best = (p, m.start(), run)
    return best


DIGITS = re.compile(r"\d+")


def line_periodic(b):
    """(offset, p, copies): the longest periodic run of lines, comparing lines with their
    digits folded (so "7. x" and "8. x" are copies); offset is the first byte of the first
    line that is a copy (line a + p), copies how many lines repeat. (0, 0, 0) if none."""
    lines = b.split(b"\n")
    keys = [re.sub(rb"\d+", b"0", l.strip()) for l in lines]
    starts, off = [], 0
    for l in lines:
        starts.append(off)
        off += len(l) + 1
    filled = [0]  # filled[i]: non-blank lines before line i
    for k in keys:
        filled.append(filled[-1] + (1 if k else 0))
    best = (0, 0, 0)
    for p in range(1, 41):
        run = 0
        for i in range(len(keys) - p):
            if keys[i] == keys[i + p] and (keys[i] or p > 1):
                run += 1
                a = i - run + 1
                if (run >= p and run > best[2] and filled[i + p + 1] - filled[a + p] >= 2
                        and filled[a + p] > filled[a]):
                    best = (starts[a + p], p, run)
            else:
                run = 0
    return best


def features(rec):
    out = rec["output"]
    b = out.encode("utf-8")
    tail = b[-2048:]
    lines = [DIGITS.sub("0", l.strip()) for l in out.split("\n") if l.strip()]
    lc = collections.Counter(lines).most_common(1)
    sents = [DIGITS.sub("0", s.strip()) for s in re.split(r"(?<=[.!?])\s+|\n+", out) if len(s.strip()) > 3]
    sc = collections.Counter(sents).most_common(1)
    words = out.split()
    ng = collections.Counter(tuple(words[i : i + 4]) for i in range(len(words) - 3)).most_common(1)
    p, a, run = periodic(b)
    lp = line_periodic(b)
    return {
        "lines": list(lp),
        "bytes": len(b),
        "tail": round(len(zlib.compress(tail, 9)) / max(1, len(tail)), 3),
        "per": [p, a, run],
        "line": [lc[0][1], lc[0][0][:60]] if lc else [0, ""],
        "sent": [sc[0][1], sc[0][0][:60]] if sc else [0, ""],
        "ngram": [ng[0][1], " ".join(ng[0][0])[:60]] if ng else [0, ""],
    }


def scan(corpus):
    """{(gen, idx): verdict line} from the current guard, or {} when it is not built."""
    if not os.access(BIN, os.X_OK):
        return {}
    res = {}
    for gen, recs in corpus.items():
        data = json.dumps(recs).encode()
        r = subprocess.run([BIN, "scan", "--records", "-"], input=data, capture_output=True, check=True)
        for line in r.stdout.decode().splitlines():
            v = json.loads(line)
            res[(gen, v["record"])] = v
    return res


def all_features(corpus):
    if os.path.exists(CACHE):
        with open(CACHE) as f:
            return {tuple(k.split("\t")[:1]) + (int(k.split("\t")[1]),): v for k, v in json.load(f).items()}
    feats = {}
    for gen, recs in corpus.items():
        for i, r in enumerate(recs):
            feats[(gen, i)] = features(r)
    with open(CACHE, "w") as f:
        json.dump({"%s\t%d" % k: v for k, v in feats.items()}, f)
    return feats


def score(f, v):
    """A rough order for reading; higher first."""
    p, a, run = f["per"]
    s = 0.0
    if run:
        s += min(run / max(f["bytes"], 1), 1.0) * 3 + min(run / p, 50) / 10
    if f["tail"] < 0.25 and f["bytes"] > 1000:
        s += 1.5
    if f["line"][0] >= 5:
        s += min(f["line"][0], 30) / 10
    if f["sent"][0] >= 4:
        s += min(f["sent"][0], 30) / 10
    if f["ngram"][0] >= 8:
        s += min(f["ngram"][0], 40) / 20
    if v and v.get("tripped"):
        s += 2
    return round(s, 2)


def is_candidate(f, v):
    p, a, run = f["per"]
    return bool(
        (run >= 3 * p and run >= 64)
        or (run >= 200)
        or (f["tail"] < 0.3 and f["bytes"] > 800)
        or f["line"][0] >= 6
        or f["sent"][0] >= 4
        or f["ngram"][0] >= 10
        or (v and v.get("tripped"))
    )


def read_labels():
    if not os.path.exists(LABELS):
        return {}
    out = {}
    with open(LABELS) as f:
        for line in f:
            if line.strip():
                l = json.loads(line)
                out[(l["generator"], l["index"])] = l
    return out


def rank(all_rows, only_unlabelled):
    corpus = load()
    feats = all_features(corpus)
    verdicts = scan(corpus)
    labels = read_labels()
    rows = []
    for k, f in feats.items():
        v = verdicts.get(k)
        if not all_rows and not is_candidate(f, v):
            continue
        if only_unlabelled and k in labels:
            continue
        rows.append((score(f, v), k, f, v))
    rows.sort(key=lambda r: (-r[0], r[1]))
    print("score\tgen:idx\tbytes\ttail\tperiod\tstart\trun\tline\tsent\tngram\ttrip")
    for s, k, f, v in rows:
        p, a, run = f["per"]
        trip = "%s@%s" % (v["detector"], v["at_byte"]) if v and v["tripped"] else "-"
        print("%.2f\t%s:%d\t%d\t%.2f\t%d\t%d\t%d\t%d\t%d\t%d\t%s" % (
            s, k[0], k[1], f["bytes"], f["tail"], p, a + p if run else -1, run,
            f["line"][0], f["sent"][0], f["ngram"][0], trip))
    print("%d candidates" % len(rows), file=sys.stderr)


def show(keys, width):
    corpus = load()
    for key in keys:
        gen, idx = key.rsplit(":", 1)
        rec = corpus[gen][int(idx)]
        out = rec["output"]
        b = out.encode("utf-8")
        f = features(rec)
        p, a, run = f["per"]
        print("=" * 100)
        print("%s:%s  bytes=%d tail=%.2f per=p%d start=%d run=%d line=%s sent=%s ngram=%s" % (
            gen, idx, len(b), f["tail"], p, a + p, run, f["line"], f["sent"], f["ngram"]))
        print("INSTRUCTION:", rec["instruction"][:400].replace("\n", "⏎"))
        print("--- output[0:%d]" % min(width, len(b)))
        print(b[:width].decode("utf-8", "replace"))
        if len(b) > width:
            lo = max(width, (a + p - width // 2) if run else len(b) - width)
            if lo > width:
                print("--- ... output[%d:%d]" % (lo, min(len(b), lo + width)))
            else:
                lo = width
            print(b[lo : lo + width].decode("utf-8", "replace"))
            if lo + width < len(b):
                print("--- ... tail output[%d:]" % max(lo + width, len(b) - 300))
                print(b[max(lo + width, len(b) - 300) :].decode("utf-8", "replace"))


KINDS = ("line", "list-item", "multi-line", "sentence", "paraphrase", "token-run", "char",
         "number-seq", "code-block", "ascii-art")


LINE_KINDS = ("line", "list-item", "multi-line", "code-block", "ascii-art")


def suggest(b, p, a):
    """The first unit boundary at or after a + p (see the module comment)."""
    s = a + p
    unit = b[a : a + p]
    if b"\n" in unit.strip(b"\n") or unit.endswith(b"\n") or unit.startswith(b"\n"):
        seps = b"\n"
    elif b" " in unit.strip():
        seps = b" \n"
    else:
        return s
    end = s + p
    while s < end and s < len(b) and b[s - 1 : s] not in [bytes([c]) for c in seps]:
        s += 1
    return s if s < end else a + p


DECISION = re.compile(r'^(\S+):(\d+)\s+([DC])\s+(\S+)(?:\s+@(?:(\d+):"((?:[^"\\]|\\.)*)"|(\d+)|(lines)))?\s*(.*)$')


def label():
    import hashlib
    corpus = load()
    labels = read_labels()
    for line in sys.stdin:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = DECISION.match(line)
        if not m:
            sys.exit("bad decision: " + line)
        gen, idx, dc, kind, nth, text, off, bylines, note = m.groups()
        idx = int(idx)
        out = corpus[gen][idx]["output"]
        b = out.encode("utf-8")
        rec = {"generator": gen, "index": idx, "sha1": hashlib.sha1(b).hexdigest()[:16],
               "bytes": len(b), "label": "degenerate" if dc == "D" else "clean", "kind": kind}
        if dc == "D":
            if kind not in KINDS:
                sys.exit("unknown kind %s: %s" % (kind, line))
            if off is not None:
                start = int(off)
            elif bylines:
                start, lp, copies = line_periodic(b)
                if not copies:
                    sys.exit("no periodic run of lines: " + line)
            elif text is not None:
                needle = json.loads('"%s"' % text).encode("utf-8")
                start = -1
                for _ in range(int(nth)):
                    start = b.find(needle, start + 1)
                    if start < 0:
                        sys.exit("occurrence %s of %r not found: %s" % (nth, text, line))
                if kind in LINE_KINDS:
                    start = b.rfind(b"\n", 0, start) + 1
                elif kind in ("sentence", "paraphrase"):
                    # Back to the sentence's start, unless the text is one long run-on line.
                    back = max([b.rfind(b"\n", 0, start) + 1] +
                               [b.rfind(e, 0, start) + 2 for e in (b". ", b"? ", b"! ")
                                if b.rfind(e, 0, start) >= 0])
                    if start - back <= 300:
                        start = back
            else:
                p, a, run = periodic(b)
                if not run:
                    sys.exit("no periodic stretch, give @WHERE: " + line)
                start = suggest(b, p, a)
            if kind != "char":
                while b[start : start + 1] == b"\n":
                    start += 1
            rec["loop_start"] = start
            rec["excerpt"] = b[start : start + 120].decode("utf-8", "ignore")[:80]
        else:
            rec["loop_start"] = None
        if note:
            rec["note"] = note
        labels[(gen, idx)] = rec
    os.makedirs(os.path.dirname(LABELS), exist_ok=True)
    with open(LABELS, "w") as f:
        for k in sorted(labels):
            f.write(json.dumps(labels[k], ensure_ascii=False) + "\n")
    n = collections.Counter((l["label"], l["kind"]) for l in labels.values())
    print(" ".join("%s/%s=%d" % (a, b, c) for (a, b), c in sorted(n.items())), file=sys.stderr)


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    if args[0] == "rank":
        rank("--all" in args, False)
    elif args[0] == "unlabelled":
        rank(False, True)
    elif args[0] == "label":
        label()
    elif args[0] == "show":
        width = int(os.environ.get("SHOW_WIDTH", "900"))
        show(args[1:], width)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
