#!/usr/bin/env python3
"""Corpus tests for the guard, driven through `loopguard scan`.

  corpus.py fp      — machine files: >= 2,000 real files (Python's standard library, C
                      headers, Debian docs: READMEs, changelogs, release notes; npm packages'
                      markdown/JSON/JS), first 64 KiB of each, scanned on the content and
                      the reasoning channel, with no prompt: at most 0.2 % of the files may
                      trip per channel, each trip listed with its detector and unit. Files
                      repeat on purpose (a changelog's identical entries, a codec table's
                      undefined rows); they are a secondary check of code and data a model
                      may quote, and the AlpacaEval answers (alpaca_eval.py) are the
                      authority.
  corpus.py debs    — prints the listed Debian packages that are not installed (setup).
  corpus.py recall  — loops injected into such text at a random point (word, phrase,
                      sentence, code line, block of code, prose paragraph, punctuation,
                      CJK, rotating paraphrases): >= 99% caught per kind and median distance from the
                      loop's start to the trip within the targets; prints a table.

Nobody here wrote these files. They come from a fixed list of Debian 12 packages (DEBS,
PY_DEBS: dpkg -L) and from the npm packages locked in tests/client and tests/browser, never
from wherever the machine image happens to put things (a pyenv Python with pip packages,
NodeSource's Node.js, the docs of packages nobody asked for): every Debian 12 machine after
`make setup` (which installs the listed packages `corpus.py debs` names) gathers the same
files, and fp/recall exit naming any listed package that is missing. Python is Debian's
standard library (/usr/lib/python3.11, no site-packages, no test suite: all its ~540 .py
files); headers are the .h files under /usr/include and docs the /usr/share/doc files
whose name matches DOC_RE, of the packages in DEBS. Each family keeps the files whose
seeded hash of the path is lowest (pick): a package update that adds or drops a file
changes at most one other pick. Shares of the default 2,200: python 30 % (all there is,
about 24 %), headers 27 %, docs 23 %, npm 20 %.
Environment: LOOPGUARD_BIN (the binary, called as `BIN scan`),
CORPUS_FILES (default 2200), RECALL_PER_KIND (default 200), RECALL_CHANNEL (default content), CORPUS_CONFIG (passed as
--config to scan), CORPUS_KEEP=DIR (keep the generated files there).
"""
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

MAX_BYTES = 65536
MACHINE_TRIP_SHARE = 0.002  # of the files, per channel
SEED = 20261202


def pick(paths, n):
    """The n paths whose seeded hash is lowest, sorted: a file added or dropped by a
    package update moves at most one other file in or out (a seeded shuffle would move
    them all)."""
    paths = sorted(set(paths))
    if len(paths) <= n:
        return paths
    key = lambda p: hashlib.sha256(("%d:%s" % (SEED, p)).encode()).digest()
    return sorted(sorted(paths, key=key)[:n])


ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# The Debian 12 packages whose files make the corpus, so that every Debian 12 machine
# after `make setup` (which installs the missing ones: `corpus.py debs`) gathers the same
# files, whatever else its image carries (a pyenv Python and its pip packages, NodeSource's
# Node.js, docs of unrelated packages). Python: Debian's standard library only.
PY_DEBS = ["libpython3.11-minimal", "libpython3.11-stdlib"]
# Headers (.h under /usr/include) and docs (/usr/share/doc names matching DOC_RE) of:
DEBS = [
    # Priority: required, on every Debian 12 system.
    "apt", "base-files", "base-passwd", "bash", "bsdutils", "coreutils", "dash", "debconf",
    "debianutils", "diffutils", "dpkg", "e2fsprogs", "findutils", "grep", "gzip",
    "hostname", "init-system-helpers", "libc-bin", "liblocale-gettext-perl",
    "libpam-modules", "libpam-modules-bin", "libpam-runtime", "libtext-iconv-perl",
    "login", "mawk", "mount", "ncurses-base", "ncurses-bin", "passwd", "perl-base", "sed",
    "sensible-utils", "sysvinit-utils", "tar", "tzdata", "util-linux",
    # build-essential (the Makefile's APT_BUILD) and what it depends on: libc, kernel and
    # C++ headers, the compiler's and make's docs.
    "libc6", "libc6-dev", "linux-libc-dev", "libcrypt-dev", "libnsl-dev", "libtirpc-dev",
    "rpcsvc-proto", "libc-dev-bin", "gcc-12", "cpp-12", "g++-12", "libstdc++-12-dev",
    "binutils", "binutils-common", "make", "dpkg-dev", "libdpkg-perl", "patch", "perl",
    # The rest of APT_BUILD and the test tools setup installs (none that another source
    # may replace, as NodeSource's nodejs does, nor nginx, which has rival flavours).
    "pkgconf", "libmicrohttpd-dev", "libcurl4-openssl-dev", "libcjson-dev", "libpcre2-dev",
    "libcmocka-dev", "curl", "wrk", "valgrind", "python3", "python3.11",
    # git: the repository's own tool (tests/bench/guard_same.sh); its release notes are
    # most of the docs (Debian keeps few docs per package).
    "git",
]
# npm: the packages locked in these directories' package-lock.json (`make setup-npm`).
NPM_DIRS = ["tests/client/node_modules", "tests/browser/node_modules"]
DOC_RE = re.compile(r"(readme|changelog|news|changes|history)[^/]*$|\.(md|txt|rst)(\.gz)?$", re.I)


def missing_debs():
    """The listed packages dpkg does not report installed."""
    r = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n"]
                       + PY_DEBS + DEBS, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       universal_newlines=True, check=False)
    ok = {l.split()[0] for l in r.stdout.splitlines() if l.endswith(" installed")}
    return [p for p in PY_DEBS + DEBS if p not in ok]


def owned(pkgs):
    """Regular files the packages own (dpkg -L), sorted."""
    r = subprocess.run(["dpkg", "-L"] + pkgs, stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, universal_newlines=True, check=False)
    return sorted({p for p in r.stdout.splitlines()
                   if p.startswith("/") and os.path.isfile(p) and not os.path.islink(p)})


def walk(roots, accept):
    out = []
    for root in roots:
        for d, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                p = os.path.join(d, f)
                if accept(p) and os.path.isfile(p) and not os.path.islink(p):
                    out.append(p)
    return out


def sources():
    """(kind, [paths]) for each source family, in a fixed order; npm paths relative to
    the repository."""
    files = owned(DEBS)
    py = [p for p in owned(PY_DEBS) if p.startswith("/usr/lib/python3.11/") and p.endswith(".py")]
    hdr = [p for p in files if p.startswith("/usr/include/") and p.endswith(".h")]
    doc = [p for p in files
           if p.startswith("/usr/share/doc/") and DOC_RE.search(os.path.basename(p))]
    npm = [os.path.relpath(p, ROOT)
           for p in walk([os.path.join(ROOT, d) for d in NPM_DIRS],
                         lambda p: p.endswith((".md", ".json", ".js")))]
    return [("python", py), ("header", hdr), ("doc", doc), ("npm", npm)]


def read_head(path):
    """First MAX_BYTES of the file (decompressed when it ends in .gz), or None."""
    path = os.path.join(ROOT, path)
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read(MAX_BYTES)
        with open(path, "rb") as f:
            return f.read(MAX_BYTES)
    except (OSError, EOFError):
        return None


def gather(total):
    """Returns [(family, path, bytes)] of about `total` non-empty files; exits naming the
    listed packages or npm directories that are not installed (the corpus would not be the
    same)."""
    missing = missing_debs()
    if missing:
        sys.exit("corpus: Debian packages missing (make setup installs them): %s" % " ".join(missing))
    absent = [d for d in NPM_DIRS if not os.path.isdir(os.path.join(ROOT, d))]
    if absent:
        sys.exit("corpus: npm packages missing (make setup-npm installs them): %s" % " ".join(absent))
    fams = sources()
    share = {"python": 0.3, "header": 0.27, "doc": 0.23, "npm": 0.2}
    out = []
    for fam, paths in fams:
        for p in pick(paths, int(total * share[fam]) + 40):
            data = read_head(p)
            if data and b"\0" not in data[:4096]:
                out.append((fam, p, data))
    return out


def write_files(items, d):
    paths = []
    for i, (fam, src, data) in enumerate(items):
        p = os.path.join(d, "%05d-%s" % (i, fam))
        with open(p, "wb") as f:
            f.write(data)
        paths.append(p)
    return paths


def scan(paths, channel):
    """Runs `loopguard scan` over paths; returns {path: record}."""
    bin_ = os.environ.get("LOOPGUARD_BIN", "build/loopguard")
    base = [bin_, "scan", "--channel", channel]
    if os.environ.get("CORPUS_CONFIG"):
        base += ["--config", os.environ["CORPUS_CONFIG"]]
    out = {}
    for i in range(0, len(paths), 500):
        r = subprocess.run(base + paths[i : i + 500], stdout=subprocess.PIPE, check=False)
        if r.returncode != 0:
            sys.exit("scan exited with %d" % r.returncode)
        for line in r.stdout.decode("utf-8", "replace").splitlines():
            rec = json.loads(line)
            out[rec["file"]] = rec
    missing = [p for p in paths if p not in out]
    if missing:
        sys.exit("scan printed no line for %d files, e.g. %s" % (len(missing), missing[0]))
    return out


def workdir():
    keep = os.environ.get("CORPUS_KEEP")
    if keep:
        shutil.rmtree(keep, ignore_errors=True)
        os.makedirs(keep)
        return keep
    return tempfile.mkdtemp(prefix="lg-corpus-")


def cmd_fp():
    total = int(os.environ.get("CORPUS_FILES", "2200"))
    items = gather(total)
    d = workdir()
    try:
        paths = write_files(items, d)
        fams = {}
        for fam, _, data in items:
            n, b = fams.get(fam, (0, 0))
            fams[fam] = (n + 1, b + len(data))
        print("false-positive corpus: %d files, %.1f MiB" % (len(items), sum(len(x[2]) for x in items) / 2**20))
        for fam, (n, b) in sorted(fams.items()):
            print("  %-7s %5d files %7.1f KiB" % (fam, n, b / 1024))
        trips = 0
        allowed = int(len(items) * MACHINE_TRIP_SHARE)
        for ch in ("content", "reasoning"):
            res = scan(paths, ch)
            bad = [(p, r) for p, r in res.items() if r["tripped"]]
            trips = max(trips, len(bad))
            print("channel %-9s: %d trips (%.2f%% of files; at most %d allowed)" % (
                ch, len(bad), 100 * len(bad) / len(items), allowed))
            for p, r in bad[: int(os.environ.get("CORPUS_SHOW", "40"))]:
                src = items[paths.index(p)][1]
                print("  TRIP %s (%s) %s at %s start %s unit %r" % (
                    src, os.path.basename(p), r["detector"], r["at_byte"], r["loop_start"],
                    r["unit"][:80]))
        if len(items) < 2000:
            print("FAIL: only %d files gathered (need >= 2000)" % len(items))
            return 1
        if trips > allowed:
            print("FAIL: %d trips on one channel, more than 0.2%% of %d files" % (trips, len(items)))
            return 1
        print("PASS: at most %d trips per channel on %d files (<= 0.2%%)" % (trips, len(items)))
        return 0
    finally:
        if not os.environ.get("CORPUS_KEEP"):
            shutil.rmtree(d, ignore_errors=True)


def cmd_debs():
    """Prints the listed packages that are missing, one line (what `make setup` installs)."""
    print(" ".join(missing_debs()))
    return 0


# ---- recall -------------------------------------------------------------------------

CJK = [
    "我们需要计算这个数字的平方根",
    "用户正在询问二加二的结果",
    "这是一个检查素数的函数",
    "让我再想一想这个问题",
    "答案是四",
    "所以我们得到",
    "問題を解決するために考えます",
    "ユーザーは結果を尋ねています",
    "그래서 답은 사입니다",
]
CJK_TAIL = ["", "。", "，", "、", "！"]
PUNCT = ["!", "?", "!?", "?!", "。", "！", "…", ".", "?!?", "!!1"]
PARA_TEMPLATES = [
    ["The answer is {w}.", "So the answer is {w}.", "Therefore, the answer must be {w}.",
     "In other words, the result is {w}."],
    ["Let me check {w} again.", "Wait, let me verify {w} once more.",
     "Hmm, I should double-check {w}.", "Let me re-examine {w} carefully."],
    ["The user wants to know about {w}.", "The user is asking about {w}.",
     "So the question is about {w}.", "Okay, the user asks about {w}."],
]
# Distance targets (median bytes from the loop's start to the trip), per kind.
TARGET_BYTES = {"word": 200, "phrase": 200, "sentence": 400}
TARGET_PERIODS = {"paragraph": 3}
LOOP_BYTES = 24576

WORD_RE = re.compile(rb"[A-Za-z][a-z]{2,14}")
SENT_RE = re.compile(rb"[A-Z][A-Za-z ,;'()-]{28,158}[a-z]\.(?=\s)")


def is_prose(b):
    chars = [c for c in b if not c.isspace()]
    letters = sum(c.isalpha() for c in chars)
    return letters >= 0.85 * len(chars) and len(re.findall(r"[.!?](\s|$)", b)) >= 2


def prose_words(text):
    return [w.decode() for w in WORD_RE.findall(text)]


def make_unit(kind, host, pool, rng):
    """Returns (unit, period description) for one injected loop."""
    if kind == "word":
        ws = prose_words(host) or prose_words(rng.choice(pool))
        return rng.choice(ws) + " "
    if kind == "phrase":
        ws = prose_words(host)
        while len(ws) < 6:
            ws = prose_words(rng.choice(pool))
        n = rng.randint(2, 5)
        i = rng.randrange(0, len(ws) - n)
        return " ".join(ws[i : i + n]) + " "
    if kind == "sentence":
        ss = SENT_RE.findall(host)
        while not ss:
            ss = SENT_RE.findall(rng.choice(pool))
        return rng.choice(ss).decode() + " "
    if kind == "code_line":
        lines = []
        while not lines:
            src = rng.choice(pool)
            lines = [l for l in src.decode("utf-8", "replace").split("\n")
                     if 10 <= len(l.strip()) <= 80 and re.search("[A-Za-z]", l)]
        return rng.choice(lines).rstrip() + "\n"
    if kind == "paragraph":
        # A paragraph of prose: a block between blank lines, 200-600 characters, with at
        # least 85% letters among its non-space characters and two sentence ends.
        while True:
            src = rng.choice(pool).decode("utf-8", "replace")
            paras = [b.strip() for b in re.split(r"\n\s*\n", src)]
            paras = [b for b in paras if 200 <= len(b) <= 600 and is_prose(b)]
            if paras:
                return rng.choice(paras) + "\n\n"
    if kind == "code_block":
        # 200-600 characters of code, whole lines, from a Python file or a C header.
        while True:
            lines = rng.choice(pool).decode("utf-8", "replace").split("\n")
            i = rng.randrange(0, len(lines))
            block = []
            while i < len(lines) and len("\n".join(block)) < 200:
                block.append(lines[i])
                i += 1
            text = "\n".join(block).strip("\n")
            if 200 <= len(text) <= 600 and re.search("[A-Za-z]{3}", text):
                return text + "\n"
    if kind == "punct":
        return rng.choice(PUNCT)
    if kind == "cjk":
        return rng.choice(CJK) + rng.choice(CJK_TAIL)
    raise ValueError(kind)


def paraphrase_loop(host, pool, rng):
    ws = prose_words(host) or ["it"]
    w = rng.choice(ws)
    variants = [t.format(w=w) for t in rng.choice(PARA_TEMPLATES)]
    k = rng.randint(3, len(variants))
    variants = variants[:k]
    out, last = [], None
    size = 0
    while size < LOOP_BYTES:
        v = rng.choice([x for x in variants if x != last])
        out.append(v)
        last = v
        size += len(v) + 1
    sep = rng.choice([" ", "\n"])
    return sep.join(out) + sep, len(variants[0]) + 1


KINDS = ["word", "phrase", "sentence", "code_line", "code_block", "paragraph", "punct", "cjk",
         "paraphrase"]


def cmd_recall():
    rng = random.Random(SEED + 1)
    per = int(os.environ.get("RECALL_PER_KIND", "200"))
    items = gather(600)
    prose = [x[2] for x in items if x[0] in ("doc", "npm") and len(x[2]) > 1000]
    code = [x[2] for x in items if x[0] in ("python", "header")]
    hosts = [x[2] for x in items if len(x[2]) > 200]
    d = workdir()
    try:
        cases = []
        for kind in KINDS:
            for i in range(per):
                host = rng.choice(hosts)
                cut = rng.randint(0, min(len(host), 8192))
                # Cut the host on a line end or a space so the loop starts at a boundary.
                while cut > 0 and host[cut - 1 : cut] not in (b" ", b"\n"):
                    cut -= 1
                prefix = host[:cut]
                if kind == "paraphrase":
                    loop, period = paraphrase_loop(host, prose, rng)
                else:
                    pool = code if kind.startswith("code") else prose
                    unit = make_unit(kind, host, pool, rng)
                    period = len(unit.encode())
                    loop = unit * (LOOP_BYTES // period + 1)
                body = prefix + loop.encode()
                p = os.path.join(d, "%s-%03d" % (kind, i))
                with open(p, "wb") as f:
                    f.write(body)
                cases.append((kind, p, len(prefix), period, loop[:60]))
        channel = os.environ.get("RECALL_CHANNEL", "content")
        print("recall corpus: %d injected loops, channel %s" % (len(cases), channel))
        res = scan([c[1] for c in cases], channel)
        ok = True
        print("%-10s %6s %8s %8s %10s %8s  %s" % ("kind", "cases", "caught", "early", "median B", "periods", "target"))
        for kind in KINDS:
            ks = [c for c in cases if c[0] == kind]
            caught, early, dist, per_ = 0, [], [], []
            for k, p, inj, period, head in ks:
                r = res[p]
                if not r["tripped"]:
                    continue
                if r["at_byte"] <= inj:
                    early.append((p, r, head))
                    continue
                caught += 1
                dist.append(r["at_byte"] - inj)
                per_.append((r["at_byte"] - inj) / period)
            rate = caught / len(ks)
            med = statistics.median(dist) if dist else float("inf")
            medp = statistics.median(per_) if per_ else float("inf")
            target = ">=99%"
            good = rate >= 0.99
            if kind in TARGET_BYTES:
                target += ", median <= %d B" % TARGET_BYTES[kind]
                good = good and med <= TARGET_BYTES[kind]
            if kind in TARGET_PERIODS:
                target += ", median <= %d periods" % TARGET_PERIODS[kind]
                good = good and medp <= TARGET_PERIODS[kind]
            print("%-10s %6d %7.1f%% %8d %10.0f %8.2f  %s %s" % (
                kind, len(ks), 100 * rate, len(early), med, medp, target, "ok" if good else "MISSED"))
            for k, p, inj, period, head in ks:
                r = res[p]
                if not r["tripped"] or r["at_byte"] <= inj:
                    print("    %s: inj=%d %s unit=%r" % (
                        os.path.basename(p), inj,
                        "clean" if not r["tripped"] else "%s at %d (%r)" % (r["detector"], r["at_byte"], r["unit"][:60]),
                        head))
            ok = ok and good
        print("PASS" if ok else "FAIL: recall targets missed")
        return 0 if ok else 1
    finally:
        if not os.environ.get("CORPUS_KEEP"):
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    cmds = {"fp": cmd_fp, "recall": cmd_recall, "debs": cmd_debs}
    if len(sys.argv) != 2 or sys.argv[1] not in cmds:
        sys.exit("usage: corpus.py fp|recall|debs")
    sys.exit(cmds[sys.argv[1]]())
