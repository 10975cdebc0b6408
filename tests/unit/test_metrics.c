/* test_metrics.c — unit tests for proxy/metrics.c: every family and label the proxy
 * relies on, sums over workers, bounded detector labels, label escaping, and the text
 * format itself (each sample under a TYPE, histogram buckets cumulative and ending in +Inf
 * equal to _count), also while several threads count into their own lg_metrics and the
 * renders must never show a counter going back or a negative gauge. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/metrics.h"

/* ---- a small exposition-format parser ---------------------------------------------- */

typedef struct sample {
    char key[256];   /* name{labels} as printed */
    char name[96];   /* metric name */
    char group[400]; /* name without _bucket/_sum/_count + labels without le */
    double le;       /* buckets: the le value (INFINITY for +Inf) */
    double value;
} sample;

typedef struct parsed {
    sample *s;
    size_t n;
    char types[64][96]; /* family names with a TYPE line */
    char kinds[64][16];
    size_t n_types;
} parsed;

static const char *type_of(const parsed *p, const char *family)
{
    for (size_t i = 0; i < p->n_types; i++)
        if (strcmp(p->types[i], family) == 0) return p->kinds[i];
    return NULL;
}

/* Strips a histogram suffix from name into family when the family is a histogram. */
static void family_of(const parsed *p, const char *name, char *family, size_t len)
{
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    snprintf(family, len, "%s", name);
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(name), sl = strlen(suffixes[i]);
        if (n > sl && strcmp(name + n - sl, suffixes[i]) == 0) {
            char base[96];
            snprintf(base, sizeof base, "%.*s", (int)(n - sl), name);
            const char *t = type_of(p, base);
            if (t && strcmp(t, "histogram") == 0) snprintf(family, len, "%s", base);
        }
    }
}

/* Parses and validates the text: HELP/TYPE before samples, one TYPE per family, every
 * sample under a declared family, values numeric and non-negative. Fails the test on any
 * violation. */
static void parse(const char *text, parsed *p)
{
    memset(p, 0, sizeof *p);
    char *copy = strdup(text), *save = NULL;
    assert_non_null(copy);
    assert_true(text[0] && text[strlen(text) - 1] == '\n');
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "# HELP ", 7) == 0) continue;
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char fam[96], kind[16];
            assert_int_equal(sscanf(line + 7, "%95s %15s", fam, kind), 2);
            if (type_of(p, fam)) fail_msg("TYPE twice for %s", fam);
            assert_true(strncmp(fam, "loopguard_", 10) == 0);
            assert_true(!strcmp(kind, "counter") || !strcmp(kind, "gauge") ||
                        !strcmp(kind, "histogram"));
            assert_true(p->n_types < 64);
            snprintf(p->types[p->n_types], 96, "%s", fam);
            snprintf(p->kinds[p->n_types++], 16, "%s", kind);
            continue;
        }
        assert_true(line[0] != '#');
        p->s = realloc(p->s, (p->n + 1) * sizeof *p->s);
        sample *s = &p->s[p->n++];
        memset(s, 0, sizeof *s);
        char *sp = strrchr(line, ' ');
        assert_non_null(sp);
        char *end;
        s->value = strtod(sp + 1, &end);
        if (*end || end == sp + 1) fail_msg("bad value: %s", line);
        if (!(s->value >= 0)) fail_msg("negative or NaN: %s", line);
        snprintf(s->key, sizeof s->key, "%.*s", (int)(sp - line), line);
        size_t nl = strcspn(s->key, "{");
        snprintf(s->name, sizeof s->name, "%.*s", (int)nl, s->key);
        char family[96];
        family_of(p, s->name, family, sizeof family);
        if (!type_of(p, family)) fail_msg("sample without TYPE: %s", line);
        /* group: family + labels without le */
        char labels[256] = "";
        if (s->key[nl] == '{') {
            const char *l = s->key + nl + 1;
            assert_true(s->key[strlen(s->key) - 1] == '}');
            snprintf(labels, sizeof labels, "%.*s", (int)(strlen(l) - 1), l);
        }
        char *le = strstr(labels, "le=\"");
        s->le = NAN;
        if (le) {
            s->le = strncmp(le + 4, "+Inf", 4) == 0 ? INFINITY : strtod(le + 4, NULL);
            char *q = strchr(le + 4, '"');
            memmove(le > labels && le[-1] == ',' ? le - 1 : le, q + 1, strlen(q + 1) + 1);
        }
        snprintf(s->group, sizeof s->group, "%s{%s}", family, labels);
    }
    free(copy);
}

static const sample *find(const parsed *p, const char *key)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->s[i].key, key) == 0) return &p->s[i];
    return NULL;
}

static double value(const parsed *p, const char *key)
{
    const sample *s = find(p, key);
    if (!s) fail_msg("missing sample %s", key);
    return s->value;
}

/* Every histogram group: buckets in increasing le, cumulative, last +Inf == _count, and
 * a _sum present. Returns the number of histogram groups checked. */
static size_t check_histograms(const parsed *p)
{
    size_t groups = 0;
    for (size_t i = 0; i < p->n; i++) {
        const sample *s = &p->s[i];
        size_t nl = strlen(s->name);
        if (nl < 6 || strcmp(s->name + nl - 6, "_count") != 0) continue;
        char family[96];
        family_of(p, s->name, family, sizeof family);
        if (strcmp(type_of(p, family), "histogram") != 0) continue;
        groups++;
        double last_le = -INFINITY, last_v = 0;
        size_t buckets = 0;
        bool sum = false;
        for (size_t j = 0; j < p->n; j++) {
            const sample *b = &p->s[j];
            if (strcmp(b->group, s->group) != 0) continue;
            if (strstr(b->name, "_sum")) sum = true;
            if (!strstr(b->name, "_bucket")) continue;
            buckets++;
            if (!(b->le > last_le)) fail_msg("le not increasing in %s", b->key);
            if (b->value < last_v) fail_msg("bucket not cumulative: %s", b->key);
            last_le = b->le;
            last_v = b->value;
        }
        assert_true(buckets >= 2);
        assert_true(sum);
        if (!isinf(last_le)) fail_msg("%s: last bucket is not +Inf", s->group);
        if (last_v != s->value) fail_msg("%s: +Inf %g != _count %g", s->group, last_v, s->value);
    }
    return groups;
}

static void parsed_free(parsed *p)
{
    free(p->s);
}

static const char *const ups[] = {"http://a:1", "http://b:2"};

/* ---- tests ------------------------------------------------------------------------- */

static void test_all_families_and_values(void **state)
{
    (void)state;
    lg_metrics *m = metrics_new(2);
    metrics_request(m, LG_EP_CHAT, 200);
    metrics_request(m, LG_EP_CHAT, 200);
    metrics_request(m, LG_EP_COMPLETIONS, 504);
    metrics_request(m, LG_EP_PASSTHROUGH, 404);
    metrics_request(m, LG_EP_ADMIN, 42); /* not an HTTP status */
    metrics_streams(m, 1);
    metrics_streams(m, 1);
    metrics_streams(m, -1);
    metrics_upstream_error(m, 0, "connect");
    metrics_upstream_error(m, 1, "http_5xx");
    metrics_upstream_error(m, 1, "weird");
    metrics_upstream_error(m, 7, "connect"); /* no such upstream: ignored */
    metrics_ttfb(m, 1, 0.2);
    metrics_ttfb(m, 1, 3.0);
    metrics_added_latency(m, 0.00002);
    metrics_added_latency(m, 5.0);
    metrics_trip(m, 0, "repeat", 0);
    metrics_trip(m, 0, "rule:apology", 1);
    metrics_trip(m, SIZE_MAX, "rule:apology", 1);
    metrics_attempt(m, 1);
    metrics_attempt(m, 2);
    metrics_attempt(m, 2);
    metrics_attempt(m, 99); /* clamped */
    metrics_outcome(m, "recovered");
    metrics_outcome(m, "failed");
    metrics_outcome(m, "whatever");
    metrics_aborted_tokens(m, 37);
    metrics_aborted_tokens(m, 5);
    metrics_retry_latency(m, 0.3);
    metrics_upstream_request(m, 0);
    metrics_upstream_request(m, 0);
    metrics_upstream_request(m, 1);
    metrics_ejection(m, 1);

    char *text = metrics_render(&m, 1, ups, 2,
                                "# HELP x y\n# TYPE loopguard_extra gauge\n"
                                "loopguard_extra 7\n");
    parsed p;
    parse(text, &p);
    assert_true(check_histograms(&p) == 2 + 1 + 1); /* ttfb × 2 upstreams, added, retry */
    assert_true(value(&p, "loopguard_requests_total{endpoint=\"chat\",code=\"200\"}") == 2);
    assert_true(value(&p, "loopguard_requests_total{endpoint=\"completions\",code=\"504\"}") == 1);
    assert_true(value(&p, "loopguard_requests_total{endpoint=\"passthrough\",code=\"404\"}") == 1);
    assert_true(value(&p, "loopguard_requests_total{endpoint=\"admin\",code=\"other\"}") == 1);
    assert_null(find(&p, "loopguard_requests_total{endpoint=\"chat\",code=\"500\"}"));
    assert_true(value(&p, "loopguard_active_streams") == 1);
    assert_true(
        value(&p, "loopguard_upstream_errors_total{upstream=\"http://a:1\",kind=\"connect\"}") ==
        1);
    assert_true(
        value(&p, "loopguard_upstream_errors_total{upstream=\"http://b:2\",kind=\"http_5xx\"}") ==
        1);
    assert_true(
        value(&p, "loopguard_upstream_errors_total{upstream=\"http://b:2\",kind=\"other\"}") == 1);
    assert_true(
        value(&p, "loopguard_upstream_errors_total{upstream=\"http://a:1\",kind=\"timeout\"}") ==
        0);
    assert_true(value(&p, "loopguard_upstream_ttfb_seconds_bucket{upstream=\"http://b:2\","
                          "le=\"0.1\"}") == 0);
    assert_true(value(&p, "loopguard_upstream_ttfb_seconds_bucket{upstream=\"http://b:2\","
                          "le=\"0.25\"}") == 1);
    assert_true(value(&p, "loopguard_upstream_ttfb_seconds_count{upstream=\"http://b:2\"}") == 2);
    assert_true(fabs(value(&p, "loopguard_upstream_ttfb_seconds_sum{upstream=\"http://b:2\"}") -
                     3.2) < 1e-9);
    assert_true(value(&p, "loopguard_upstream_ttfb_seconds_count{upstream=\"http://a:1\"}") == 0);
    assert_true(value(&p, "loopguard_added_latency_seconds_bucket{le=\"2.5e-05\"}") == 1);
    assert_true(value(&p, "loopguard_added_latency_seconds_bucket{le=\"1\"}") == 1);
    assert_true(value(&p, "loopguard_added_latency_seconds_bucket{le=\"+Inf\"}") == 2);
    assert_true(value(&p, "loopguard_trips_total{detector=\"repeat\",channel=\"reasoning\"}") == 1);
    assert_true(value(&p, "loopguard_trips_total{detector=\"rule:apology\",channel=\"content\"}") ==
                2);
    assert_true(value(&p, "loopguard_upstream_trips_total{upstream=\"http://a:1\","
                          "detector=\"rule:apology\"}") == 1);
    assert_true(value(&p, "loopguard_upstream_trips_total{upstream=\"http://a:1\","
                          "detector=\"repeat\"}") == 1);
    assert_true(value(&p, "loopguard_attempts_total{attempt=\"1\"}") == 1);
    assert_true(value(&p, "loopguard_attempts_total{attempt=\"2\"}") == 2);
    assert_true(value(&p, "loopguard_attempts_total{attempt=\"16\"}") == 1);
    assert_true(value(&p, "loopguard_outcomes_total{outcome=\"recovered\"}") == 1);
    assert_true(value(&p, "loopguard_outcomes_total{outcome=\"failed\"}") == 1);
    assert_true(value(&p, "loopguard_outcomes_total{outcome=\"client_gone\"}") == 0);
    assert_true(value(&p, "loopguard_outcomes_total{outcome=\"other\"}") == 1);
    assert_true(value(&p, "loopguard_aborted_tokens_total") == 42);
    assert_true(value(&p, "loopguard_retry_latency_seconds_count") == 1);
    assert_true(value(&p, "loopguard_upstream_requests_total{upstream=\"http://a:1\"}") == 2);
    assert_true(value(&p, "loopguard_upstream_requests_total{upstream=\"http://b:2\"}") == 1);
    assert_true(value(&p, "loopguard_ejections_total{upstream=\"http://b:2\"}") == 1);
    assert_true(value(&p, "loopguard_ejections_total{upstream=\"http://a:1\"}") == 0);
    assert_true(value(&p, "loopguard_extra") == 7); /* extra appended verbatim */
    parsed_free(&p);
    free(text);
    metrics_free(m);
    metrics_free(NULL);
}

static void test_sum_over_workers_and_detector_union(void **state)
{
    (void)state;
    lg_metrics *w[3] = {metrics_new(2), metrics_new(2), metrics_new(1)};
    /* Different workers meet new detector names in different orders. */
    metrics_trip(w[0], 0, "rule:b", 1);
    metrics_trip(w[0], 0, "rule:a", 1);
    metrics_trip(w[1], 1, "rule:a", 1);
    metrics_trip(w[2], 0, "rule:c", 2);
    for (int i = 0; i < 3; i++) {
        metrics_request(w[i], LG_EP_CHAT, 200);
        metrics_upstream_request(w[i], 1); /* w[2] has one upstream: ignored there */
        metrics_ttfb(w[i], 0, 0.01);
        metrics_streams(w[i], 2);
    }
    lg_metrics *const ws[4] = {w[0], NULL, w[1], w[2]}; /* NULL entries are skipped */
    char *text = metrics_render(ws, 4, ups, 2, NULL);
    parsed p;
    parse(text, &p);
    check_histograms(&p);
    assert_true(value(&p, "loopguard_requests_total{endpoint=\"chat\",code=\"200\"}") == 3);
    assert_true(value(&p, "loopguard_active_streams") == 6);
    assert_true(value(&p, "loopguard_upstream_requests_total{upstream=\"http://b:2\"}") == 2);
    assert_true(value(&p, "loopguard_upstream_ttfb_seconds_count{upstream=\"http://a:1\"}") == 3);
    assert_true(value(&p, "loopguard_trips_total{detector=\"rule:a\",channel=\"content\"}") == 2);
    assert_true(value(&p, "loopguard_trips_total{detector=\"rule:b\",channel=\"content\"}") == 1);
    assert_true(value(&p, "loopguard_trips_total{detector=\"rule:c\",channel=\"tool_args\"}") == 1);
    assert_true(value(&p, "loopguard_upstream_trips_total{upstream=\"http://b:2\","
                          "detector=\"rule:a\"}") == 1);
    parsed_free(&p);
    free(text);
    for (int i = 0; i < 3; i++)
        metrics_free(w[i]);
}

/* Operator-chosen rule names are bounded per worker and escaped in labels. */
static void test_detector_table_bounded_and_escaped(void **state)
{
    (void)state;
    lg_metrics *m = metrics_new(1);
    char name[64];
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "rule:r%d", i);
        metrics_trip(m, 0, name, 1);
    }
    metrics_trip(m, 0, "rule:say \"hi\"\\now", 1);
    metrics_trip(m, 0, NULL, 1);
    metrics_trip(m, 0, "repeat", 7); /* no such channel: only the upstream series counts */
    char *text = metrics_render(&m, 1, ups, 1, NULL);
    parsed p;
    parse(text, &p);
    size_t trip_series = 0;
    double total = 0;
    for (size_t i = 0; i < p.n; i++)
        if (strcmp(p.s[i].name, "loopguard_trips_total") == 0) trip_series++, total += p.s[i].value;
    assert_true(trip_series <= LG_METRICS_MAX_DETECTORS);
    assert_true(total == 102); /* nothing lost: the overflow went to "other" */
    assert_true(value(&p, "loopguard_trips_total{detector=\"rule:r0\",channel=\"content\"}") == 1);
    assert_true(value(&p, "loopguard_trips_total{detector=\"other\",channel=\"content\"}") >= 2);
    assert_true(value(&p, "loopguard_upstream_trips_total{upstream=\"http://a:1\","
                          "detector=\"repeat\"}") == 1);
    parsed_free(&p);
    free(text);
    metrics_free(m);

    /* Escaping, in a table with room for the name. */
    m = metrics_new(1);
    metrics_trip(m, 0, "rule:say \"hi\"\\now\nx", 1);
    const char *names[] = {"http://q\"uote"};
    text = metrics_render(&m, 1, names, 1, NULL);
    assert_non_null(strstr(text, "loopguard_trips_total{detector=\"rule:say "
                                 "\\\"hi\\\"\\\\now\\nx\",channel=\"content\"} 1\n"));
    assert_non_null(strstr(text, "upstream=\"http://q\\\"uote\""));
    free(text);
    metrics_free(m);
}

/* ---- concurrency -------------------------------------------------------------------- */

enum { THREADS = 4, RENDERS = 50 };

typedef struct counting {
    lg_metrics *m;
    atomic_bool *go, *stop;
    uint64_t iters; /* how many rounds the thread did */
} counting;

static void *count_loop(void *arg)
{
    counting *c = arg;
    char det[32];
    while (!atomic_load(c->go))
        ;
    uint64_t i = 0;
    for (; !atomic_load_explicit(c->stop, memory_order_relaxed); i++) {
        metrics_streams(c->m, 1);
        metrics_request(c->m, (lg_endpoint)(i % LG_EP_COUNT), 200 + (i % 3));
        metrics_ttfb(c->m, (size_t)(i & 1), (double)(i % 1000) / 100.0);
        metrics_added_latency(c->m, (double)(i % 100) * 1e-5);
        snprintf(det, sizeof det, "rule:t%d", (int)(i % 5));
        metrics_trip(c->m, (size_t)(i & 1), i % 2 ? "repeat" : det, i % 3);
        metrics_attempt(c->m, 1 + (unsigned)(i % 3));
        metrics_aborted_tokens(c->m, 3);
        metrics_retry_latency(c->m, 0.5);
        metrics_upstream_request(c->m, (size_t)(i & 1));
        metrics_streams(c->m, -1);
    }
    c->iters = i;
    return NULL;
}

typedef struct snapshot {
    char key[256];
    double v;
} snapshot;

static void test_render_while_counting(void **state)
{
    (void)state;
    lg_metrics *w[THREADS];
    pthread_t t[THREADS];
    counting c[THREADS];
    atomic_bool go = false, stop = false;
    for (int i = 0; i < THREADS; i++) {
        w[i] = metrics_new(2);
        c[i] = (counting){w[i], &go, &stop, 0};
        assert_int_equal(pthread_create(&t[i], NULL, count_loop, &c[i]), 0);
    }
    atomic_store(&go, true);
    snapshot *prev = NULL;
    size_t n_prev = 0;
    int progress = 0;
    double last_tokens = 0;
    /* The threads count until every render is done, so all renders race with them. On a
     * loaded machine the counters may not get the CPU for a while: keep rendering (and
     * yielding) until they have visibly moved twice, within a generous bound. */
    for (int r = 0; r < RENDERS || (progress < 2 && r < RENDERS * 1000); r++) {
        if (r >= RENDERS) sched_yield();
        char *text = metrics_render(w, THREADS, ups, 2, NULL);
        parsed p;
        parse(text, &p);
        check_histograms(&p);
        for (size_t i = 0; i < p.n; i++) {
            const sample *s = &p.s[i];
            if (strcmp(s->name, "loopguard_aborted_tokens_total") == 0) {
                progress += s->value > last_tokens;
                last_tokens = s->value;
            }
            if (strcmp(s->name, "loopguard_active_streams") == 0) {
                assert_true(s->value >= 0 && s->value <= THREADS);
                continue;
            }
            for (size_t j = 0; j < n_prev; j++) /* counters never go back */
                if (strcmp(prev[j].key, s->key) == 0 && s->value < prev[j].v)
                    fail_msg("%s went from %g to %g", s->key, prev[j].v, s->value);
        }
        free(prev);
        prev = calloc(p.n ? p.n : 1, sizeof *prev);
        for (size_t i = 0; i < p.n; i++) {
            snprintf(prev[i].key, sizeof prev[i].key, "%s", p.s[i].key);
            prev[i].v = p.s[i].value;
        }
        n_prev = p.n;
        parsed_free(&p);
        free(text);
    }
    atomic_store(&stop, true);
    uint64_t total = 0, odd = 0;
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        total += c[i].iters;
        odd += c[i].iters / 2;
    }
    free(prev);
    assert_true(progress >= 2); /* renders really saw the counting move */

    /* After the threads stop the totals are exact. */
    char *text = metrics_render(w, THREADS, ups, 2, NULL);
    parsed p;
    parse(text, &p);
    double req = 0, trips = 0;
    for (size_t i = 0; i < p.n; i++) {
        if (strcmp(p.s[i].name, "loopguard_requests_total") == 0) req += p.s[i].value;
        if (strcmp(p.s[i].name, "loopguard_trips_total") == 0) trips += p.s[i].value;
    }
    assert_true(req == total);
    assert_true(trips == total);
    assert_true(value(&p, "loopguard_active_streams") == 0);
    assert_true(value(&p, "loopguard_aborted_tokens_total") == 3.0 * total);
    assert_true(value(&p, "loopguard_added_latency_seconds_count") == total);
    assert_true(fabs(value(&p, "loopguard_retry_latency_seconds_sum") - 0.5 * total) < 1e-6);
    assert_true(value(&p, "loopguard_upstream_requests_total{upstream=\"http://b:2\"}") == odd);
    assert_true(value(&p, "loopguard_trips_total{detector=\"rule:t0\",channel=\"reasoning\"}") > 0);
    parsed_free(&p);
    free(text);
    for (int i = 0; i < THREADS; i++)
        metrics_free(w[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_families_and_values),
        cmocka_unit_test(test_sum_over_workers_and_detector_union),
        cmocka_unit_test(test_detector_table_bounded_and_escaped),
        cmocka_unit_test(test_render_while_counting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
