/* guard_bench.c — how fast the guard scans real text on one core.
 *
 * Gathers up to --mib MiB of real text from this machine (Python's standard library,
 * /usr/include headers, /usr/share/doc, npm packages; first 64 KiB of each file, sorted
 * and evenly sampled), then times three ways of feeding it, each on a fresh guard per
 * file like the proxy (one guard per channel per attempt):
 *   whole   — each file in one guard_feed call;
 *   tokens  — 1–8 byte chunks (about a token each), guard_suspect after every chunk,
 *             which is what the proxy's holdback does per delta;
 *   rules   — tokens, with two PCRE2 rules configured;
 *   streams — tokens, to 100 guards at once in turn, as the proxy feeds 100 streams;
 *   stamps  — the bench's own events (`w<CLOCK_MONOTONIC ns> `, as `fake_upstream --stamp`
 *             writes them) one per call with guard_suspect after each, 500 to a guard like
 *             a saturation request, to one guard and to 100 in turn: what the guard costs per
 *             event in `make bench`'s saturation runs, in ns.
 * Prints a table and one JSON line {"bench":"guard",...} with MB/s (10^6 bytes per second
 * of this thread's CPU time, so that other load on the machine does not count).
 * `--min-mbps X` exits 1 when the token pass is slower than X. */
#define _XOPEN_SOURCE 700
#include <cjson/cJSON.h>
#include <ftw.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "guard/guard.h"

#define FILE_CAP      65536
#define BENCH_STREAMS 100 /* guards live at once in the "streams" pass */
#define BENCH_ROUNDS  3
#define STAMP_EVENTS  500 /* events per request in make bench's saturation runs */

typedef struct blob {
    char *data;
    size_t len;
} blob;

static char **paths;
static size_t npaths, cappaths;

static bool wanted(const char *p)
{
    static const char *const ext[] = {".py", ".h", ".md", ".txt", ".rst", ".js", ".json"};
    const char *b = strrchr(p, '/');
    b = b ? b + 1 : p;
    if (!strncmp(b, "README", 6) || !strncmp(b, "changelog", 9) || !strncmp(b, "NEWS", 4))
        return !strstr(b, ".gz");
    size_t n = strlen(p);
    for (size_t i = 0; i < sizeof(ext) / sizeof(ext[0]); i++) {
        size_t k = strlen(ext[i]);
        if (n > k && !strcmp(p + n - k, ext[i])) return true;
    }
    return false;
}

static int collect(const char *p, const struct stat *st, int type, struct FTW *f)
{
    (void)f;
    if (type != FTW_F || st->st_size == 0 || !wanted(p)) return 0;
    if (npaths == cappaths) {
        cappaths = cappaths ? cappaths * 2 : 4096;
        paths = realloc(paths, cappaths * sizeof(*paths));
        if (!paths) abort();
    }
    paths[npaths] = strdup(p);
    if (!paths[npaths]) abort();
    npaths++;
    return 0;
}

static int cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Loads an even sample of the gathered files until `budget` bytes. */
static blob *load(size_t budget, size_t *nout, size_t *total)
{
    static const char *const roots[] = {"/root/.pyenv/versions/3.11.7/lib/python3.11",
                                        "/usr/lib/python3.11", "/usr/include", "/usr/share/doc",
                                        "/usr/lib/node_modules"};
    for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++)
        nftw(roots[i], collect, 32, FTW_PHYS);
    qsort(paths, npaths, sizeof(*paths), cmp);
    blob *b = calloc(npaths ? npaths : 1, sizeof(*b));
    size_t n = 0, sum = 0;
    /* Stride through the sorted list so every family is represented. */
    size_t stride = npaths > 4000 ? npaths / 4000 : 1;
    for (size_t k = 0; k < stride && sum < budget; k++) {
        for (size_t i = k; i < npaths && sum < budget; i += stride) {
            FILE *f = fopen(paths[i], "rb");
            if (!f) continue;
            char *d = malloc(FILE_CAP);
            size_t len = d ? fread(d, 1, FILE_CAP, f) : 0;
            fclose(f);
            if (!len) {
                free(d);
                continue;
            }
            b[n].data = d;
            b[n].len = len;
            n++;
            sum += len;
        }
    }
    for (size_t i = 0; i < npaths; i++)
        free(paths[i]);
    free(paths);
    *nout = n;
    *total = sum;
    return b;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Feeds the next 1–8 byte chunk of `b` at *off (the length drawn from *r) and asks
 * guard_suspect, as the proxy does per delta; returns false once the file is done or the
 * guard tripped. */
static bool feed_token(guard *g, const blob *b, size_t *off, unsigned *r, size_t *susp)
{
    if (*off >= b->len) return false;
    *r = *r * 1103515245u + 12345u;
    size_t k = 1 + (*r >> 16) % 8;
    if (k > b->len - *off) k = b->len - *off;
    if (guard_feed(g, b->data + *off, k)) return false;
    *susp += guard_suspect(g);
    *off += k;
    return true;
}

/* Ends one file's guard; returns the bytes it was fed. */
static size_t done(guard *g, size_t *trips)
{
    guard_finish(g);
    *trips += guard_tripped(g);
    size_t fed = (size_t)guard_bytes(g);
    guard_free(g);
    return fed;
}

/* One pass over every file, `streams` files at a time, one chunk to each in turn (a
 * single stream with `tokens`, the whole file in one call without): returns bytes fed.
 * Many streams at once is what the proxy sees: every guard's tables are cold again by the
 * time its next chunk comes. */
static size_t pass(const guard_params *p, const blob *b, size_t n, bool tokens, size_t streams,
                   size_t *trips)
{
    size_t fed = 0, susp = 0;
    unsigned r = 12345;
    guard *g[BENCH_STREAMS];
    size_t off[BENCH_STREAMS];
    for (size_t i0 = 0; i0 < n; i0 += streams) {
        size_t m = n - i0 < streams ? n - i0 : streams, live = m;
        for (size_t j = 0; j < m; j++) {
            g[j] = guard_new(p, LG_CH_CONTENT);
            off[j] = 0;
        }
        if (!tokens) {
            guard_feed(g[0], b[i0].data, b[i0].len);
            live = 0;
        }
        while (live) {
            for (size_t j = 0; j < m; j++) {
                if (!g[j] || feed_token(g[j], &b[i0 + j], &off[j], &r, &susp)) continue;
                fed += done(g[j], trips);
                g[j] = NULL;
                live--;
            }
        }
        for (size_t j = 0; j < m; j++)
            if (g[j]) fed += done(g[j], trips);
    }
    if (susp == (size_t)-1) /* keep the calls from being optimised away */
        abort();
    return fed;
}

static double measure(const guard_params *p, const blob *b, size_t n, bool tokens, size_t streams,
                      double min_s, size_t *trips)
{
    double t0 = now(), t;
    size_t bytes = 0;
    do {
        bytes += pass(p, b, n, tokens, streams, trips);
        t = now() - t0;
    } while (t < min_s);
    return bytes / t / 1e6;
}

/* The stamps of BENCH_STREAMS saturated streams, each its own: `w<ns> ` from this host's
 * clock now (so with as many digits as make bench's), 1.0-1.3 µs apart as the fake writes
 * a stream's burst, each stream from another start. Stream j's event i is
 * text[j][off[j][i] .. off[j][i + 1]). Identical streams would let the branch predictor
 * learn each event from the stream before and flatter the many-streams figure. */
typedef struct stamp_set {
    char *text[BENCH_STREAMS];
    size_t off[BENCH_STREAMS][STAMP_EVENTS + 1];
} stamp_set;

/* A new stamp_set; free with free_stamps. */
static stamp_set *make_stamps(void)
{
    stamp_set *st = malloc(sizeof *st);
    if (!st) abort();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long long now_ns =
        (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
    for (size_t j = 0; j < BENCH_STREAMS; j++) {
        unsigned long long ns = now_ns + j * 1000003ull;
        unsigned r = 12345u + (unsigned)j;
        size_t len = 0;
        st->text[j] = malloc(STAMP_EVENTS * 24 + 1);
        if (!st->text[j]) abort();
        for (size_t i = 0; i < STAMP_EVENTS; i++) {
            r = r * 1103515245u + 12345u;
            ns += 1000 + (r >> 16) % 300;
            st->off[j][i] = len;
            len += (size_t)sprintf(st->text[j] + len, "w%llu ", ns);
        }
        st->off[j][STAMP_EVENTS] = len;
    }
    return st;
}

static void free_stamps(stamp_set *st)
{
    for (size_t j = 0; j < BENCH_STREAMS; j++)
        free(st->text[j]);
    free(st);
}

/* Feeds the stamps of `streams` streams to as many guards in turn, one event per call with
 * guard_suspect after each, a fresh guard per STAMP_EVENTS, for at least min_s; returns ns
 * of CPU per event. */
static double stamps(const guard_params *p, const stamp_set *st, size_t streams, double min_s)
{
    size_t susp = 0, events = 0;
    guard *g[BENCH_STREAMS];
    double t0 = now(), t;
    do {
        for (size_t j = 0; j < streams; j++)
            g[j] = guard_new(p, LG_CH_CONTENT);
        for (size_t i = 0; i < STAMP_EVENTS; i++)
            for (size_t j = 0; j < streams; j++) {
                const size_t *o = st->off[j];
                guard_feed(g[j], st->text[j] + o[i], o[i + 1] - o[i]);
                susp += guard_suspect(g[j]);
            }
        for (size_t j = 0; j < streams; j++)
            guard_free(g[j]);
        events += STAMP_EVENTS * streams;
        t = now() - t0;
    } while (t < min_s);
    if (susp == (size_t)-1) abort(); /* keep the calls from being optimised away */
    return t / (double)events * 1e9;
}

/* The ways of feeding, in the order they take turns; "stamps100" is BENCH_STREAMS streams. */
enum { W_WHOLE, W_TOKENS, W_RULES, W_STREAMS, W_STAMPS1, W_STAMPSN, W_COUNT };
static const char *const way_names[W_COUNT] = {"whole",   "tokens", "rules",
                                               "streams", "stamps", "stamps100"};
/* Their keys in the JSON line, and what the table calls them. */
static const char *const way_keys[W_COUNT] = {"whole_mbps",   "tokens_mbps", "rules_mbps",
                                              "streams_mbps", "stamp_ns_1",  "stamp_ns_100"};
static const char *const way_labels[W_COUNT] = {
    "whole files            ", "token chunks + suspect ", "same with 2 rules      ",
    "tokens, 100 streams    ", "stamps, 1 stream       ", "stamps, 100 streams    "};
_Static_assert(BENCH_STREAMS == 100, "the labels and keys say 100 streams");

/* The index of way `name`, or -1. */
static int way_index(const char *name)
{
    for (int k = 0; k < W_COUNT; k++)
        if (!strcmp(name, way_names[k])) return k;
    return -1;
}

static bool is_ns(int way)
{
    return way >= W_STAMPS1;
}

/* Heap bytes per guard: just made, after the MEM_PACED stamps of one of make bench's paced
 * requests, and after the first MEM_ANSWER bytes of a real text in token chunks (an
 * answer). */
enum { M_NEW, M_PACED, M_ANSWER, M_COUNT };
static const char *const mem_keys[M_COUNT] = {"guard_bytes_new", "guard_bytes_paced",
                                              "guard_bytes_answer"};
static const char *const mem_labels[M_COUNT] = {
    "bytes/guard, new       ", "bytes/guard, 60 tokens ", "bytes/guard, 2,000 B   "};
#define MEM_GUARDS 1000
#define MEM_PACED  60 /* tokens per request in make bench's paced runs */
#define MEM_ANSWER 2000

/* Bytes malloc has handed out and not had back, its own overhead included. */
static size_t heap_used(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

/* Fills out[M_COUNT]: the heap MEM_GUARDS live guards hold, per guard, in each state. */
static void memory(const guard_params *p, const stamp_set *st, const blob *b, size_t n, double *out)
{
    static guard *g[MEM_GUARDS];
    for (int m = 0; m < M_COUNT; m++) {
        size_t before = heap_used(), susp = 0, f = 0;
        unsigned r = 12345;
        for (size_t i = 0; i < MEM_GUARDS; i++) {
            g[i] = guard_new(p, LG_CH_CONTENT);
            const size_t *o = st->off[i % BENCH_STREAMS];
            for (size_t e = 0; m == M_PACED && e < MEM_PACED; e++) {
                guard_feed(g[i], st->text[i % BENCH_STREAMS] + o[e], o[e + 1] - o[e]);
                susp += guard_suspect(g[i]);
            }
            if (m != M_ANSWER) continue;
            for (size_t k = 0; k < n && b[f].len < MEM_ANSWER; k++) /* the next text that long */
                f = (f + 1) % n;
            blob cut = {b[f].data, b[f].len < MEM_ANSWER ? b[f].len : MEM_ANSWER};
            f = (f + 1) % n;
            for (size_t off = 0; feed_token(g[i], &cut, &off, &r, &susp);)
                ;
        }
        out[m] = (double)(heap_used() - before) / MEM_GUARDS;
        for (size_t i = 0; i < MEM_GUARDS; i++)
            guard_free(g[i]);
        if (susp == (size_t)-1) abort(); /* keep the calls from being optimised away */
    }
}

/* One run's figures: per way MB/s, or ns per event for the stamps (0: not measured), and
 * the bytes per guard. */
typedef struct figures {
    double way[W_COUNT];
    double mem[M_COUNT];
} figures;

/* Keeps the better of each figure of f and g in f (more MB/s, fewer ns). */
static void keep_best(figures *f, const figures *g)
{
    for (int k = 0; k < W_COUNT; k++)
        if (g->way[k] > 0 &&
            (f->way[k] <= 0 || (is_ns(k) ? g->way[k] < f->way[k] : g->way[k] > f->way[k])))
            f->way[k] = g->way[k];
    for (int m = 0; m < M_COUNT; m++)
        if (g->mem[m] > 0) f->mem[m] = g->mem[m];
}

/* Runs the guard_bench `bin` (one built against another guard: tests/bench/guard_vs.sh) for
 * one round of the same ways and sizes and reads its figures from its JSON line. Returns
 * false when it fails. */
static bool run_baseline(const char *bin, const char *only, size_t mib, double min_s, figures *f)
{
    if (strchr(bin, '\'')) return false;
    char cmd[1024], line[4096];
    snprintf(cmd, sizeof cmd, "'%s' --rounds 1 --mib %zu --min-s %g%s%s", bin, mib, min_s,
             only ? " --only " : "", only ? only : "");
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    cJSON *j = NULL;
    while (fgets(line, sizeof line, p))
        if (!j && !strncmp(line, "{\"bench\":\"guard\"", 16)) j = cJSON_Parse(line);
    int rc = pclose(p);
    if (!j || rc != 0) {
        cJSON_Delete(j);
        return false;
    }
    memset(f, 0, sizeof *f);
    for (int k = 0; k < W_COUNT; k++)
        f->way[k] = cJSON_GetNumberValue(cJSON_GetObjectItem(j, way_keys[k]));
    for (int m = 0; m < M_COUNT; m++) {
        double v = cJSON_GetNumberValue(cJSON_GetObjectItem(j, mem_keys[m]));
        f->mem[m] = isnan(v) ? 0 : v; /* a baseline without the figure */
    }
    for (int k = 0; k < W_COUNT; k++)
        if (isnan(f->way[k]) || isinf(f->way[k])) f->way[k] = 0;
    cJSON_Delete(j);
    return true;
}

/* This guard's speed over the baseline's for way k (above 1: faster), or 0. */
static double speed_ratio(const figures *f, const figures *base, int k)
{
    if (f->way[k] <= 0 || base->way[k] <= 0) return 0;
    return is_ns(k) ? base->way[k] / f->way[k] : f->way[k] / base->way[k];
}

static void print_figures(const figures *f, const figures *base, size_t n, size_t total,
                          size_t trips)
{
    printf("guard_bench: %zu files, %.1f MiB of real text, one core%s\n", n, total / 1048576.0,
           base ? "; beside the baseline guard, in alternating rounds" : "");
    if (base) printf("                           %12s %12s %8s\n", "this", "baseline", "speed");
    for (int k = 0; k < W_COUNT; k++) {
        if (f->way[k] <= 0) continue;
        const char *unit = is_ns(k) ? "ns/event" : "MB/s";
        if (!base)
            printf("  %s %8.1f %s\n", way_labels[k], f->way[k], unit);
        else
            printf("  %s %8.1f %-8s %8.1f %-8s %5.2fx\n", way_labels[k], f->way[k], unit,
                   base->way[k], unit, speed_ratio(f, base, k));
    }
    for (int m = 0; m < M_COUNT && f->mem[M_NEW] > 0; m++) { /* measured: every way ran */
        if (!base)
            printf("  %s %8.0f B\n", mem_labels[m], f->mem[m]);
        else
            printf("  %s %8.0f B        %8.0f B        %5.2fx\n", mem_labels[m], f->mem[m],
                   base->mem[m], base->mem[m] > 0 ? f->mem[m] / base->mem[m] : 0);
    }
    printf("{\"bench\":\"guard\",\"files\":%zu,\"bytes\":%zu", n, total);
    for (int k = 0; k < W_COUNT; k++)
        printf(",\"%s\":%.1f", way_keys[k], f->way[k]);
    for (int m = 0; m < M_COUNT; m++)
        printf(",\"%s\":%.0f", mem_keys[m], f->mem[m]);
    printf(",\"trips\":%zu", trips);
    if (base) {
        printf(",\"baseline\":{");
        for (int k = 0; k < W_COUNT; k++)
            printf("%s\"%s\":%.1f", k ? "," : "", way_keys[k], base->way[k]);
        for (int m = 0; m < M_COUNT; m++)
            printf(",\"%s\":%.0f", mem_keys[m], base->mem[m]);
        printf("},\"speed_vs_baseline\":{");
        for (int k = 0; k < W_COUNT; k++)
            printf("%s\"%s\":%.3f", k ? "," : "", way_names[k], speed_ratio(f, base, k));
        printf("}");
    }
    printf("}\n");
}

int main(int argc, char **argv)
{
    double min_mbps = 0, min_s = 0.5;
    size_t mib = 24;
    int rounds = BENCH_ROUNDS;
    const char *only = NULL, *baseline = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--min-mbps") && i + 1 < argc)
            min_mbps = atof(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (size_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--quick"))
            min_s = 0.2, mib = 4, rounds = 1; /* make bench QUICK=1 has 60 s for everything */
        else if (!strcmp(argv[i], "--once"))
            min_s = 0, rounds = 1; /* a fixed amount of work, for counting instructions */
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc && atoi(argv[i + 1]) > 0)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-s") && i + 1 < argc)
            min_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && way_index(argv[i + 1]) >= 0)
            only = argv[++i];
        else if (!strcmp(argv[i], "--baseline") && i + 1 < argc)
            baseline = argv[++i];
        else {
            fprintf(stderr,
                    "usage: guard_bench [--quick] [--once] [--rounds N] [--min-s S] [--only WAY] "
                    "[--mib N] [--min-mbps X] [--baseline GUARD_BENCH]\n"
                    "  WAY: whole tokens rules streams stamps stamps100\n");
            return 2;
        }
    }
    size_t n, total;
    blob *b = load(mib << 20, &n, &total);
    if (!n) {
        fprintf(stderr, "guard_bench: no text found\n");
        return 1;
    }
    guard_params *plain = guard_params_new(LG_CH_CONTENT);
    guard_params *rules = guard_params_new(LG_CH_CONTENT);
    cJSON *o = cJSON_Parse("{\"rules\":[{\"name\":\"ai\",\"pattern\":\"(?i)as an ai language "
                           "model\"},{\"name\":\"sorry\",\"pattern\":\"I apologi[sz]e for the "
                           "confusion\"}]}");
    char err[256];
    if (guard_params_apply_json(rules, o, "bench", err, sizeof(err)) < 0) {
        fprintf(stderr, "guard_bench: %s\n", err);
        return 1;
    }
    cJSON_Delete(o);

    size_t trips = 0;
    /* The host's speed drifts by tens of percent over seconds on a shared VM: the six ways
     * take turns for BENCH_ROUNDS rounds (one with --quick) and each keeps its best; with a
     * baseline, its rounds alternate with these, so that both see the same moments. */
    stamp_set *st = make_stamps();
    figures best = {{0}, {0}}, base = {{0}, {0}};
    int w = only ? way_index(only) : -1; /* -1: every way */
    for (int round = 0; round < rounds; round++) {
        figures f = {{0}, {0}};
        if (w < 0 || w == W_WHOLE) f.way[W_WHOLE] = measure(plain, b, n, false, 1, min_s, &trips);
        if (w < 0 || w == W_TOKENS) f.way[W_TOKENS] = measure(plain, b, n, true, 1, min_s, &trips);
        if (w < 0 || w == W_RULES) f.way[W_RULES] = measure(rules, b, n, true, 1, min_s, &trips);
        if (w < 0 || w == W_STREAMS)
            f.way[W_STREAMS] = measure(plain, b, n, true, BENCH_STREAMS, min_s, &trips);
        if (w < 0 || w == W_STAMPS1) f.way[W_STAMPS1] = stamps(plain, st, 1, min_s);
        if (w < 0 || w == W_STAMPSN) f.way[W_STAMPSN] = stamps(plain, st, BENCH_STREAMS, min_s);
        if (round == 0 && w < 0) memory(plain, st, b, n, f.mem);
        keep_best(&best, &f);
        figures bf;
        if (baseline && !run_baseline(baseline, only, mib, min_s, &bf)) {
            fprintf(stderr, "guard_bench: the baseline %s failed\n", baseline);
            return 1;
        }
        if (baseline) keep_best(&base, &bf);
    }
    print_figures(&best, baseline ? &base : NULL, n, total, trips);
    for (size_t i = 0; i < n; i++)
        free(b[i].data);
    free(b);
    free_stamps(st);
    guard_params_free(plain);
    guard_params_free(rules);
    if (min_mbps > 0 && best.way[W_TOKENS] < min_mbps) {
        fprintf(stderr, "guard_bench: %.1f MB/s is below %.1f\n", best.way[W_TOKENS], min_mbps);
        return 1;
    }
    return 0;
}
