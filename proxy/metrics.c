/* metrics.c — per-worker Prometheus counters, gauges and histograms, summed on render.
 *
 * Every value is an _Atomic 64-bit integer bumped with a relaxed fetch-add: on x86-64 one
 * locked add on a cache line no other core writes, a few nanoseconds. Histograms keep one
 * non-cumulative counter per bucket (plus the overflow bucket) and their sum in integer
 * nanoseconds; render derives the cumulative buckets and _count from the same reads, so
 * +Inf always equals _count however the workers race with it. Each lg_metrics is allocated
 * on its own cache lines so that two workers never false-share.
 *
 * Detector names are open-ended ("rule:<name>" comes from the operator's config), so each
 * worker keeps a small table of the names it has seen. A name is published once (written,
 * then the count stored with release) and never changes; lookups are lock-free, and only
 * the first sighting of a new name takes the table's mutex. */
#include "proxy/metrics.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/buf.h"
#include "proxy/xalloc.h"

#define N_CODES           600 /* index = HTTP status; index 0 counts codes outside 100..599 */
#define N_CHANNELS        3
#define MAX_BOUNDS        16
#define DETECTOR_NAME_MAX 64
#define CACHE_LINE        64

typedef _Atomic uint64_t counter;

static const char *const endpoint_names[LG_EP_COUNT] = {
    "chat", "completions", "messages", "responses", "generate", "passthrough", "admin"};
/* Label values of the channel label, indexed by lg_channel. */
static const char *const channel_names[N_CHANNELS] = {"reasoning", "content", "tool_args"};
static const char *const error_kinds[] = {"connect",  "timeout",  "reset",
                                          "http_5xx", "protocol", "other"};
static const char *const outcome_names[] = {"recovered", "failed", "client_gone", "upstream_error",
                                            "other"};
/* Pre-registered so that the common detectors keep a stable order in the output. */
static const char *const known_detectors[] = {"other",  "repeat",       "lines", "novelty",
                                              "budget", "empty_answer", "leak"};
#define N_ERROR_KINDS     (sizeof error_kinds / sizeof *error_kinds)
#define N_OUTCOMES        (sizeof outcome_names / sizeof *outcome_names)
#define N_KNOWN_DETECTORS (sizeof known_detectors / sizeof *known_detectors)

typedef struct histogram {
    counter n[MAX_BOUNDS + 1]; /* n[i]: observations in (bounds[i-1], bounds[i]]; last: +Inf */
    counter sum_ns;
} histogram;

typedef struct hist_kind {
    const double *bounds;
    size_t n_bounds;
} hist_kind;

/* Time to first byte spans fast prefills to long queues; added latency is meant to be
 * microseconds; a retry costs a new prefill. */
static const double ttfb_bounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1,     2.5,  5,     10,   30,  60,   120};
static const double added_bounds[] = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025,
                                      0.0005,  0.001,    0.0025,  0.005,  0.01,
                                      0.025,   0.05,     0.1,     0.5,    1};
static const double retry_bounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                      2.5,  5,     10,   30,  60,   120};
#define KIND(b)                                                                                    \
    {                                                                                              \
        b, sizeof b / sizeof *b                                                                    \
    }
static const hist_kind ttfb_kind = KIND(ttfb_bounds);
static const hist_kind added_kind = KIND(added_bounds);
static const hist_kind retry_kind = KIND(retry_bounds);
_Static_assert(sizeof added_bounds / sizeof *added_bounds <= MAX_BOUNDS, "bounds fit");
_Static_assert(sizeof ttfb_bounds / sizeof *ttfb_bounds <= MAX_BOUNDS, "bounds fit");

typedef struct per_upstream {
    counter errors[N_ERROR_KINDS];
    histogram ttfb;
    counter trips[LG_METRICS_MAX_DETECTORS];
    counter requests, ejections;
} per_upstream;

struct lg_metrics {
    counter requests[LG_EP_COUNT][N_CODES];
    _Atomic int64_t streams;
    histogram added, retry;
    counter attempts[LG_METRICS_MAX_ATTEMPT + 1]; /* index = attempt number */
    counter outcomes[N_OUTCOMES];
    counter aborted_tokens;

    pthread_mutex_t det_mu; /* taken only to add a name */
    _Atomic unsigned n_det;
    char det_names[LG_METRICS_MAX_DETECTORS][DETECTOR_NAME_MAX];
    counter trips[LG_METRICS_MAX_DETECTORS][N_CHANNELS];

    size_t n_up;
    per_upstream *up;
};

static void add(counter *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

static uint64_t get(const counter *c)
{
    return atomic_load_explicit((counter *)c, memory_order_relaxed);
}

/* Cache-line aligned, zeroed memory for `size` bytes; aborts on OOM. */
static void *alloc_lines(size_t size)
{
    size = (size + CACHE_LINE - 1) / CACHE_LINE * CACHE_LINE;
    void *p = aligned_alloc(CACHE_LINE, size ? size : CACHE_LINE);
    if (!p) lg_oom(size);
    memset(p, 0, size);
    return p;
}

lg_metrics *metrics_new(size_t n_upstreams)
{
    lg_metrics *m = alloc_lines(sizeof *m);
    m->n_up = n_upstreams;
    m->up = alloc_lines(n_upstreams * sizeof *m->up);
    pthread_mutex_init(&m->det_mu, NULL);
    for (size_t i = 0; i < N_KNOWN_DETECTORS; i++)
        snprintf(m->det_names[i], DETECTOR_NAME_MAX, "%s", known_detectors[i]);
    atomic_store_explicit(&m->n_det, (unsigned)N_KNOWN_DETECTORS, memory_order_release);
    return m;
}

void metrics_free(lg_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->det_mu);
    free(m->up);
    free(m);
}

/* Index of `s` in the NULL-free array `names` of n, else `fallback`. */
static size_t name_index(const char *const *names, size_t n, const char *s, size_t fallback)
{
    for (size_t i = 0; s && i < n; i++)
        if (strcmp(names[i], s) == 0) return i;
    return fallback;
}

static void observe(histogram *h, const hist_kind *k, double seconds)
{
    size_t i = 0;
    while (i < k->n_bounds && !(seconds <= k->bounds[i]))
        i++; /* NaN lands in +Inf */
    add(&h->n[i], 1);
    /* Negative and NaN add nothing to the sum; a day caps one observation. */
    if (seconds > 0) add(&h->sum_ns, (uint64_t)((seconds < 86400 ? seconds : 86400) * 1e9 + 0.5));
}

void metrics_request(lg_metrics *m, lg_endpoint ep, int status)
{
    if ((unsigned)ep >= LG_EP_COUNT) return;
    add(&m->requests[ep][status >= 100 && status < N_CODES ? status : 0], 1);
}

void metrics_streams(lg_metrics *m, int delta)
{
    atomic_fetch_add_explicit(&m->streams, delta, memory_order_relaxed);
}

void metrics_upstream_error(lg_metrics *m, size_t upstream, const char *kind)
{
    if (upstream >= m->n_up) return;
    add(&m->up[upstream]
             .errors[name_index(error_kinds, N_ERROR_KINDS - 1, kind, N_ERROR_KINDS - 1)],
        1);
}

void metrics_ttfb(lg_metrics *m, size_t upstream, double seconds)
{
    if (upstream < m->n_up) observe(&m->up[upstream].ttfb, &ttfb_kind, seconds);
}

void metrics_added_latency(lg_metrics *m, double seconds)
{
    observe(&m->added, &added_kind, seconds);
}

/* The slot of detector `name` in m's table, adding it when new (slot 0, "other", once the
 * table is full). Lock-free when the name is known. */
static unsigned detector_slot(lg_metrics *m, const char *name)
{
    unsigned n = atomic_load_explicit(&m->n_det, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (strncmp(m->det_names[i], name, DETECTOR_NAME_MAX - 1) == 0) return i;
    pthread_mutex_lock(&m->det_mu);
    unsigned slot = 0, now = atomic_load_explicit(&m->n_det, memory_order_relaxed);
    for (unsigned i = n; i < now && !slot; i++) /* added meanwhile by another thread? */
        if (strncmp(m->det_names[i], name, DETECTOR_NAME_MAX - 1) == 0) slot = i;
    if (!slot && now < LG_METRICS_MAX_DETECTORS) {
        snprintf(m->det_names[now], DETECTOR_NAME_MAX, "%s", name);
        atomic_store_explicit(&m->n_det, now + 1, memory_order_release);
        slot = now;
    }
    pthread_mutex_unlock(&m->det_mu);
    return slot;
}

void metrics_trip(lg_metrics *m, size_t upstream, const char *detector, int channel)
{
    unsigned slot = detector_slot(m, detector ? detector : "other");
    if (channel >= 0 && channel < N_CHANNELS) add(&m->trips[slot][channel], 1);
    if (upstream < m->n_up) add(&m->up[upstream].trips[slot], 1);
}

void metrics_attempt(lg_metrics *m, unsigned attempt_no)
{
    if (attempt_no == 0) return;
    add(&m->attempts[attempt_no < LG_METRICS_MAX_ATTEMPT ? attempt_no : LG_METRICS_MAX_ATTEMPT], 1);
}

void metrics_outcome(lg_metrics *m, const char *outcome)
{
    add(&m->outcomes[name_index(outcome_names, N_OUTCOMES - 1, outcome, N_OUTCOMES - 1)], 1);
}

void metrics_aborted_tokens(lg_metrics *m, uint64_t tokens)
{
    add(&m->aborted_tokens, tokens);
}

void metrics_retry_latency(lg_metrics *m, double seconds)
{
    observe(&m->retry, &retry_kind, seconds);
}

void metrics_upstream_request(lg_metrics *m, size_t upstream)
{
    if (upstream < m->n_up) add(&m->up[upstream].requests, 1);
}

void metrics_ejection(lg_metrics *m, size_t upstream)
{
    if (upstream < m->n_up) add(&m->up[upstream].ejections, 1);
}

/* ------------------------------------------------------------------------------------- */
/* Rendering                                                                              */

/* What render needs besides the output buffer. */
typedef struct render_ctx {
    lg_buf *b;
    lg_metrics *const *w;
    size_t n_w;
    const char *const *up_names;
    size_t n_up;
} render_ctx;

static void family(lg_buf *b, const char *name, const char *type, const char *help)
{
    lg_buf_printf(b, "# HELP loopguard_%s %s\n# TYPE loopguard_%s %s\n", name, help, name, type);
}

/* A label value with \, " and newline escaped as the exposition format requires. */
static void label_value(lg_buf *b, const char *s)
{
    lg_buf_append(b, "\"", 1);
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            lg_buf_printf(b, "\\%c", *s);
        else if (*s == '\n')
            lg_buf_append_str(b, "\\n");
        else
            lg_buf_append(b, s, 1);
    }
    lg_buf_append(b, "\"", 1);
}

/* upstream="<name>" (the index when there is no name) into b. */
static void upstream_label(lg_buf *b, const render_ctx *c, size_t u)
{
    lg_buf_append_str(b, "upstream=");
    if (c->up_names && c->up_names[u])
        label_value(b, c->up_names[u]);
    else
        lg_buf_printf(b, "\"%zu\"", u);
}

/* Sum over workers of the counter at byte offset `off` inside each worker's lg_metrics
 * (or inside its per_upstream u when u != SIZE_MAX). */
static uint64_t sum_at(const render_ctx *c, size_t u, size_t off)
{
    uint64_t s = 0;
    for (size_t i = 0; i < c->n_w; i++) {
        const lg_metrics *m = c->w[i];
        if (!m || (u != SIZE_MAX && u >= m->n_up)) continue;
        const char *base = u == SIZE_MAX ? (const char *)m : (const char *)&m->up[u];
        s += get((const counter *)(base + off));
    }
    return s;
}

/* One histogram series: `labels` (may be "") goes inside the braces before le. */
static void histogram_series(render_ctx *c, const char *name, const char *labels, size_t u,
                             size_t off, const hist_kind *k)
{
    uint64_t cum = 0;
    const char *sep = *labels ? "," : "";
    for (size_t i = 0; i <= k->n_bounds; i++) {
        cum += sum_at(c, u, off + offsetof(histogram, n) + i * sizeof(counter));
        if (i < k->n_bounds)
            lg_buf_printf(c->b, "loopguard_%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep,
                          k->bounds[i], (unsigned long long)cum);
        else
            lg_buf_printf(c->b, "loopguard_%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                          (unsigned long long)cum);
    }
    uint64_t ns = sum_at(c, u, off + offsetof(histogram, sum_ns));
    const char *open = *labels ? "{" : "", *close = *labels ? "}" : "";
    lg_buf_printf(c->b, "loopguard_%s_sum%s%s%s %llu.%09llu\n", name, open, labels, close,
                  (unsigned long long)(ns / 1000000000u), (unsigned long long)(ns % 1000000000u));
    lg_buf_printf(c->b, "loopguard_%s_count%s%s%s %llu\n", name, open, labels, close,
                  (unsigned long long)cum);
}

/* A per-upstream histogram, one series per upstream. */
static void upstream_histogram(render_ctx *c, const char *name, size_t off, const hist_kind *k)
{
    for (size_t u = 0; u < c->n_up; u++) {
        lg_buf lab = LG_BUF_INIT;
        upstream_label(&lab, c, u);
        histogram_series(c, name, lab.p, u, off, k);
        lg_buf_free(&lab);
    }
}

/* One counter per upstream at offset `off` of per_upstream, zeros included. */
static void upstream_counter(render_ctx *c, const char *name, size_t off)
{
    for (size_t u = 0; u < c->n_up; u++) {
        lg_buf_printf(c->b, "loopguard_%s{", name);
        upstream_label(c->b, c, u);
        lg_buf_printf(c->b, "} %llu\n", (unsigned long long)sum_at(c, u, off));
    }
}

/* The union of all workers' detector names, in first-seen order; returns how many. */
static size_t detector_union(const render_ctx *c, const char **names, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < c->n_w; i++) {
        if (!c->w[i]) continue;
        unsigned nd = atomic_load_explicit(&c->w[i]->n_det, memory_order_acquire);
        for (unsigned d = 0; d < nd && n < cap; d++)
            if (name_index(names, n, c->w[i]->det_names[d], SIZE_MAX) == SIZE_MAX)
                names[n++] = c->w[i]->det_names[d];
    }
    return n;
}

/* Sum over workers of trips for detector `name`: per channel (u == SIZE_MAX) or per
 * upstream u (channel ignored). */
static uint64_t trips_for(const render_ctx *c, const char *name, int channel, size_t u)
{
    uint64_t s = 0;
    for (size_t i = 0; i < c->n_w; i++) {
        const lg_metrics *m = c->w[i];
        if (!m) continue;
        unsigned nd = atomic_load_explicit(&m->n_det, memory_order_acquire);
        for (unsigned d = 0; d < nd; d++) {
            if (strcmp(m->det_names[d], name) != 0) continue;
            if (u == SIZE_MAX)
                s += get(&m->trips[d][channel]);
            else if (u < m->n_up)
                s += get(&m->up[u].trips[d]);
            break;
        }
    }
    return s;
}

static void render_trips(render_ctx *c)
{
    const char **names = lg_xmalloc(LG_METRICS_MAX_DETECTORS * (c->n_w + 1) * sizeof *names);
    size_t n = detector_union(c, names, LG_METRICS_MAX_DETECTORS * (c->n_w + 1));
    family(c->b, "trips_total", "counter", "Guard trips by detector and channel.");
    for (size_t d = 0; d < n; d++)
        for (int ch = 0; ch < N_CHANNELS; ch++) {
            uint64_t v = trips_for(c, names[d], ch, SIZE_MAX);
            if (!v) continue;
            lg_buf_append_str(c->b, "loopguard_trips_total{detector=");
            label_value(c->b, names[d]);
            lg_buf_printf(c->b, ",channel=\"%s\"} %llu\n", channel_names[ch],
                          (unsigned long long)v);
        }
    family(c->b, "upstream_trips_total", "counter", "Guard trips by upstream and detector.");
    for (size_t u = 0; u < c->n_up; u++)
        for (size_t d = 0; d < n; d++) {
            uint64_t v = trips_for(c, names[d], 0, u);
            if (!v) continue;
            lg_buf_append_str(c->b, "loopguard_upstream_trips_total{");
            upstream_label(c->b, c, u);
            lg_buf_append_str(c->b, ",detector=");
            label_value(c->b, names[d]);
            lg_buf_printf(c->b, "} %llu\n", (unsigned long long)v);
        }
    free(names);
}

char *metrics_render(lg_metrics *const *workers, size_t n_workers,
                     const char *const *upstream_names, size_t n_upstreams, const char *extra)
{
    lg_buf b = LG_BUF_INIT;
    render_ctx c = {&b, workers, n_workers, upstream_names, n_upstreams};
    const size_t G = SIZE_MAX; /* "not per upstream" for sum_at */

    family(&b, "requests_total", "counter", "Client requests by endpoint and HTTP status.");
    for (int ep = 0; ep < LG_EP_COUNT; ep++)
        for (int code = 0; code < N_CODES; code++) {
            uint64_t v = sum_at(&c, G,
                                offsetof(lg_metrics, requests[0][0]) +
                                    ((size_t)ep * N_CODES + (size_t)code) * sizeof(counter));
            if (!v) continue;
            if (code)
                lg_buf_printf(&b, "loopguard_requests_total{endpoint=\"%s\",code=\"%d\"} %llu\n",
                              endpoint_names[ep], code, (unsigned long long)v);
            else
                lg_buf_printf(&b, "loopguard_requests_total{endpoint=\"%s\",code=\"other\"} %llu\n",
                              endpoint_names[ep], (unsigned long long)v);
        }

    int64_t streams = 0;
    for (size_t i = 0; i < n_workers; i++)
        if (workers[i]) streams += atomic_load_explicit(&workers[i]->streams, memory_order_relaxed);
    family(&b, "active_streams", "gauge", "Streaming responses in progress.");
    lg_buf_printf(&b, "loopguard_active_streams %lld\n", (long long)streams);

    family(&b, "upstream_errors_total", "counter", "Upstream failures by upstream and kind.");
    for (size_t u = 0; u < n_upstreams; u++)
        for (size_t k = 0; k < N_ERROR_KINDS; k++) {
            lg_buf_append_str(&b, "loopguard_upstream_errors_total{");
            upstream_label(&b, &c, u);
            lg_buf_printf(&b, ",kind=\"%s\"} %llu\n", error_kinds[k],
                          (unsigned long long)sum_at(
                              &c, u, offsetof(per_upstream, errors) + k * sizeof(counter)));
        }

    family(&b, "upstream_ttfb_seconds", "histogram",
           "Upstream time to first byte (request sent to first response byte).");
    upstream_histogram(&c, "upstream_ttfb_seconds", offsetof(per_upstream, ttfb), &ttfb_kind);

    family(&b, "added_latency_seconds", "histogram",
           "Time an upstream event spent inside loopguard before it went to the client.");
    histogram_series(&c, "added_latency_seconds", "", G, offsetof(lg_metrics, added), &added_kind);

    render_trips(&c);

    family(&b, "attempts_total", "counter", "Generation attempts started, by attempt number.");
    for (unsigned a = 1; a <= LG_METRICS_MAX_ATTEMPT; a++) {
        uint64_t v = sum_at(&c, G, offsetof(lg_metrics, attempts) + a * sizeof(counter));
        if (v)
            lg_buf_printf(&b, "loopguard_attempts_total{attempt=\"%u\"} %llu\n", a,
                          (unsigned long long)v);
    }

    family(&b, "outcomes_total", "counter", "How guarded exchanges that tripped ended.");
    for (size_t o = 0; o < N_OUTCOMES; o++) {
        uint64_t v = sum_at(&c, G, offsetof(lg_metrics, outcomes) + o * sizeof(counter));
        if (v || o < N_OUTCOMES - 1)
            lg_buf_printf(&b, "loopguard_outcomes_total{outcome=\"%s\"} %llu\n", outcome_names[o],
                          (unsigned long long)v);
    }

    family(&b, "aborted_tokens_total", "counter", "Tokens generated by aborted attempts.");
    lg_buf_printf(&b, "loopguard_aborted_tokens_total %llu\n",
                  (unsigned long long)sum_at(&c, G, offsetof(lg_metrics, aborted_tokens)));

    family(&b, "retry_latency_seconds", "histogram",
           "From a guard trip to the first event of the retry.");
    histogram_series(&c, "retry_latency_seconds", "", G, offsetof(lg_metrics, retry), &retry_kind);

    family(&b, "upstream_requests_total", "counter", "Requests sent to each upstream.");
    upstream_counter(&c, "upstream_requests_total", offsetof(per_upstream, requests));
    family(&b, "ejections_total", "counter", "Replica ejections for degenerate output.");
    upstream_counter(&c, "ejections_total", offsetof(per_upstream, ejections));

    if (extra) lg_buf_append_str(&b, extra);
    return lg_buf_steal(&b);
}
