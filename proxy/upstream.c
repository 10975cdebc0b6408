/* upstream.c — see upstream.h.
 *
 * Hot path (pool_acquire/pool_release, once per attempt) touches only atomics. The
 * degeneration record is a ring of time buckets per replica under one pool mutex, taken once
 * per finished generation (not per token); the ejection decision is made there, O(replicas).
 * The health checker is one background thread doing blocking GETs with short timeouts.
 *
 * The event hook is foreign code (main.c's writes stderr and takes the incident log's
 * mutex), so it is never called with p->mu held: what happens under the lock is noted in a
 * pool_event and delivered after the unlock. The ejection fields read without the lock
 * (rank_of) are written with atomic stores under it. */
#include "proxy/upstream.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cJSON.h>
#include <curl/curl.h>

#include "proxy/xalloc.h"

#define BUCKETS 12

typedef struct lg_replica {
    char *base;
    atomic_int kind; /* lg_upstream_kind; AUTO until probed */
    atomic_uint outstanding;
    atomic_bool healthy;
    atomic_bool reached;    /* answered once (health check or request): until then not healthy */
    atomic_uint fails, oks; /* consecutive health results (active and passive) */
    atomic_uint_fast64_t requests;
    /* guarded by pool->mu */
    uint32_t gens[BUCKETS], trips[BUCKETS];
    uint64_t bucket_epoch[BUCKETS];
    uint64_t ejected_until_ms; /* 0: not ejected; stored atomically (read without the lock) */
    uint64_t returned_at_ms;   /* end of the last ejection: ramp-up starts here; ditto */
    unsigned ejections;
} lg_replica;

struct lg_pool {
    const lg_config *cfg;
    lg_replica *r;
    size_t n;
    atomic_uint seed;
    pthread_mutex_t mu;
    pthread_t health;
    bool health_running;
    atomic_bool stop;
    pool_event_fn hook;
    void *hook_ud;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static size_t discard(char *p, size_t sz, size_t n, void *ud)
{
    (void)p, (void)ud;
    return sz * n;
}

/* Blocking GET of base+path; returns the HTTP status or 0 when unreachable. */
static long probe_get(const char *base, const char *path, long timeout_ms)
{
    long status = 0;
    CURL *c = curl_easy_init();
    if (!c) return 0;
    char *url = lg_xasprintf("%s%s", base, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    free(url);
    return status;
}

/* Decides a replica's kind from its endpoints; AUTO when it does not answer at all. */
static lg_upstream_kind probe_kind(const char *base)
{
    long s = probe_get(base, "/get_model_info", 2000);
    if (s == 0) return LG_UPSTREAM_AUTO;
    if (s == 200) return LG_UPSTREAM_SGLANG;
    if (probe_get(base, "/version", 2000) == 200) return LG_UPSTREAM_VLLM;
    return LG_UPSTREAM_OPENAI;
}

lg_pool *pool_new(const lg_config *cfg)
{
    lg_pool *p = lg_xcalloc(1, sizeof *p);
    p->cfg = cfg;
    p->n = cfg->n_upstreams;
    p->r = lg_xcalloc(p->n, sizeof *p->r);
    pthread_mutex_init(&p->mu, NULL);
    atomic_store(&p->seed, 0x9e3779b9u ^ (unsigned)now_ms());
    for (size_t i = 0; i < p->n; i++) {
        lg_replica *r = &p->r[i];
        r->base = lg_xstrdup(cfg->upstreams[i]);
        lg_upstream_kind k = cfg->upstream_kind;
        if (k == LG_UPSTREAM_AUTO) {
            k = probe_kind(r->base);
            atomic_store(&r->reached, k != LG_UPSTREAM_AUTO); /* it answered the probe */
        }
        atomic_store(&r->kind, (int)k);
        atomic_store(&r->healthy, true);
    }
    return p;
}

size_t pool_size(const lg_pool *p)
{
    return p->n;
}

const char *pool_base(const lg_pool *p, size_t i)
{
    return p->r[i].base;
}

char *pool_url(const lg_pool *p, size_t i, const char *path)
{
    /* Once per attempt: two copies, not vasprintf's format machinery. */
    const char *base = p->r[i].base;
    size_t bl = strlen(base), pl = strlen(path);
    char *url = lg_xmalloc(bl + pl + 1);
    memcpy(url, base, bl);
    memcpy(url + bl, path, pl + 1);
    return url;
}

lg_upstream_kind pool_kind(const lg_pool *p, size_t i)
{
    int k = atomic_load(&p->r[i].kind);
    /* Not probed yet (it was down at start): treat as generic, never send SGLang fields. */
    return k == LG_UPSTREAM_AUTO ? LG_UPSTREAM_OPENAI : (lg_upstream_kind)k;
}

const char *const *pool_names(const lg_pool *p)
{
    return (const char *const *)p->cfg->upstreams;
}

void pool_set_event_hook(lg_pool *p, pool_event_fn fn, void *ud)
{
    p->hook = fn;
    p->hook_ud = ud;
}

/* What changed for a replica, noted while p->mu is held and given to the hook after it is
 * released. */
typedef struct pool_event {
    const char *name; /* "ejected", "returned"; NULL: nothing happened */
    char json[192];   /* details for the hook: four bounded numbers (see maybe_eject) */
} pool_event;

static void deliver(lg_pool *p, size_t i, const pool_event *ev)
{
    if (ev->name && p->hook) p->hook(p->hook_ud, i, ev->name, ev->json[0] ? ev->json : NULL);
}

/* ---- health ------------------------------------------------------------------------ */

/* Healthy as reported: up by the counters, and answered at least once (a replica that was
 * never reached is routed to, since nothing says it is down yet, but not called healthy). */
static bool reported_healthy(const lg_replica *r)
{
    return atomic_load(&r->healthy) && atomic_load(&r->reached);
}

/* A health result from the checker thread or a worker. The transition is an exchange on
 * `healthy`, so that two reporters crossing the threshold at once announce it once. */
static void health_result(lg_pool *p, size_t i, bool ok)
{
    if (ok) atomic_store(&p->r[i].reached, true);
    lg_replica *r = &p->r[i];
    const lg_config *cfg = p->cfg;
    if (ok) {
        atomic_store(&r->fails, 0);
        unsigned oks = atomic_fetch_add(&r->oks, 1) + 1;
        if (oks >= cfg->health.healthy_after && !atomic_load(&r->healthy) &&
            !atomic_exchange(&r->healthy, true) && p->hook)
            p->hook(p->hook_ud, i, "healthy", NULL);
    } else {
        atomic_store(&r->oks, 0);
        unsigned fails = atomic_fetch_add(&r->fails, 1) + 1;
        if (fails >= cfg->health.unhealthy_after && atomic_load(&r->healthy) &&
            atomic_exchange(&r->healthy, false) && p->hook)
            p->hook(p->hook_ud, i, "unhealthy", NULL);
    }
}

void pool_report_health(lg_pool *p, size_t i, bool ok)
{
    health_result(p, i, ok);
}

static void *health_main(void *arg)
{
    lg_pool *p = arg;
    const lg_config *cfg = p->cfg;
    long timeout = cfg->health.interval_ms / 2 < 2000 ? (long)cfg->health.interval_ms / 2 : 2000;
    if (timeout < 100) timeout = 100;
    while (!atomic_load(&p->stop)) {
        for (size_t i = 0; i < p->n && !atomic_load(&p->stop); i++) {
            lg_replica *r = &p->r[i];
            long s = probe_get(r->base, cfg->health.path, timeout);
            health_result(p, i, s >= 200 && s < 300);
            if (s && atomic_load(&r->kind) == LG_UPSTREAM_AUTO)
                atomic_store(&r->kind, (int)probe_kind(r->base));
        }
        /* Sleep in small steps so that pool_free does not wait a whole interval. */
        for (unsigned slept = 0; slept < cfg->health.interval_ms && !atomic_load(&p->stop);
             slept += 50) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

int pool_start(lg_pool *p)
{
    if (p->cfg->health.interval_ms == 0) return 0;
    if (pthread_create(&p->health, NULL, health_main, p) != 0) return -1;
    p->health_running = true;
    return 0;
}

/* ---- degeneration record and ejection ---------------------------------------------- */

static uint64_t bucket_ms(const lg_config *cfg)
{
    uint64_t w = (uint64_t)(cfg->eject.window_s ? cfg->eject.window_s : 60) * 1000u;
    return w / BUCKETS ? w / BUCKETS : 1;
}

/* Generations and trips of replica r within the window. Caller holds p->mu. */
static void window_counts(const lg_pool *p, const lg_replica *r, uint64_t now, uint64_t *gens,
                          uint64_t *trips)
{
    uint64_t epoch = now / bucket_ms(p->cfg);
    *gens = *trips = 0;
    for (int b = 0; b < BUCKETS; b++)
        if (epoch - r->bucket_epoch[b] < BUCKETS) {
            *gens += r->gens[b];
            *trips += r->trips[b];
        }
}

static bool is_ejected(const lg_replica *r, uint64_t now)
{
    return r->ejected_until_ms && now < r->ejected_until_ms;
}

/* Decides whether replica i is an outlier and ejects it, noting that in *ev. Caller holds
 * p->mu. */
static void maybe_eject(lg_pool *p, size_t i, uint64_t now, pool_event *ev)
{
    const lg_config *cfg = p->cfg;
    lg_replica *r = &p->r[i];
    uint64_t g, t, og = 0, ot = 0;
    size_t others_up = 0;
    if (is_ejected(r, now)) return;
    window_counts(p, r, now, &g, &t);
    if (g < cfg->eject.min_requests || g == 0) return;
    for (size_t j = 0; j < p->n; j++) {
        if (j == i) continue;
        uint64_t jg, jt;
        window_counts(p, &p->r[j], now, &jg, &jt);
        og += jg, ot += jt;
        if (atomic_load(&p->r[j].healthy) && !is_ejected(&p->r[j], now)) others_up++;
    }
    double rate = (double)t / (double)g;
    double others = og ? (double)ot / (double)og : 0.0;
    if (others_up == 0 || rate < cfg->eject.min_trip_rate) return; /* never the last one */
    if (og && rate <= cfg->eject.trip_ratio * others) return;
    /* Exponential back-off on repeat offenders, capped at 16x. */
    unsigned shift = r->ejections < 4 ? r->ejections : 4;
    uint64_t backoff = (uint64_t)cfg->eject.backoff_ms << shift;
    __atomic_store_n(&r->ejected_until_ms, now + backoff, __ATOMIC_RELAXED);
    r->ejections++;
    memset(r->gens, 0, sizeof r->gens);
    memset(r->trips, 0, sizeof r->trips);
    /* Rates are in [0, 1] (others: at most the number of trips), the counts 20 digits at
     * most: under 120 bytes. */
    ev->name = "ejected";
    snprintf(ev->json, sizeof ev->json,
             "{\"trip_rate\":%.3f,\"others_trip_rate\":%.3f,\"generations\":%llu,"
             "\"backoff_ms\":%llu}",
             rate, others, (unsigned long long)g, (unsigned long long)backoff);
}

bool pool_report_generation(lg_pool *p, size_t i, bool tripped)
{
    lg_replica *r = &p->r[i];
    uint64_t now = now_ms(), epoch = now / bucket_ms(p->cfg);
    int b = (int)(epoch % BUCKETS);
    pool_event returned = {0}, ejected = {0};
    pthread_mutex_lock(&p->mu);
    if (r->bucket_epoch[b] != epoch) {
        r->bucket_epoch[b] = epoch;
        r->gens[b] = r->trips[b] = 0;
    }
    r->gens[b]++;
    r->trips[b] += tripped;
    if (r->ejected_until_ms && now >= r->ejected_until_ms) {
        __atomic_store_n(&r->returned_at_ms, r->ejected_until_ms, __ATOMIC_RELAXED);
        __atomic_store_n(&r->ejected_until_ms, 0, __ATOMIC_RELAXED);
        returned.name = "returned";
    }
    if (tripped) maybe_eject(p, i, now, &ejected);
    pthread_mutex_unlock(&p->mu);
    deliver(p, i, &returned);
    deliver(p, i, &ejected);
    return ejected.name != NULL;
}

/* ---- balancing --------------------------------------------------------------------- */

static unsigned next_random(lg_pool *p)
{
    /* xorshift on a shared word; a lost update only repeats a tie-break. */
    unsigned x = atomic_load_explicit(&p->seed, memory_order_relaxed);
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    atomic_store_explicit(&p->seed, x, memory_order_relaxed);
    return x;
}

/* 0 eligible, 1 ramping up after an ejection and not chosen this time, 2 avoided,
 * 3 ejected, 4 unhealthy. Reads the ejection fields without the lock: a stale value only
 * misroutes one attempt. */
static int rank_of(lg_pool *p, size_t i, size_t avoid, uint64_t now)
{
    lg_replica *r = &p->r[i];
    if (!atomic_load(&r->healthy)) return 4;
    uint64_t until = __atomic_load_n(&r->ejected_until_ms, __ATOMIC_RELAXED);
    if (until && now < until) return 3;
    if (i == avoid && p->n > 1) return 2;
    uint64_t back = __atomic_load_n(&r->returned_at_ms, __ATOMIC_RELAXED);
    uint64_t ramp = p->cfg->eject.backoff_ms;
    if (until) back = until; /* expired but not yet noticed by a report */
    if (back && ramp && now - back < ramp) {
        /* Brought back gradually: a share of picks growing linearly over one back-off. */
        unsigned share = (unsigned)((now - back) * 1000 / ramp);
        if (next_random(p) % 1000 >= share) return 1;
    }
    return 0;
}

size_t pool_acquire(lg_pool *p, size_t avoid)
{
    uint64_t now = now_ms();
    size_t best = 0, ties = 0;
    unsigned best_load = ~0u;
    int best_rank = 5;
    for (size_t i = 0; i < p->n; i++) {
        int rank = rank_of(p, i, avoid, now);
        unsigned load = atomic_load_explicit(&p->r[i].outstanding, memory_order_relaxed);
        if (rank < best_rank || (rank == best_rank && load < best_load)) {
            best = i, best_rank = rank, best_load = load, ties = 1;
        } else if (rank == best_rank && load == best_load && next_random(p) % ++ties == 0) {
            best = i;
        }
    }
    atomic_fetch_add_explicit(&p->r[best].outstanding, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->r[best].requests, 1, memory_order_relaxed);
    return best;
}

void pool_release(lg_pool *p, size_t i)
{
    atomic_fetch_sub_explicit(&p->r[i].outstanding, 1, memory_order_relaxed);
}

char *pool_json(lg_pool *p)
{
    uint64_t now = now_ms();
    cJSON *arr = lg_xcheck(cJSON_CreateArray());
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n; i++) {
        lg_replica *r = &p->r[i];
        uint64_t g, t;
        window_counts(p, r, now, &g, &t);
        cJSON *o = lg_xcheck(cJSON_CreateObject());
        cJSON_AddStringToObject(o, "url", r->base);
        cJSON_AddStringToObject(o, "kind", config_upstream_kind_name(pool_kind(p, i)));
        cJSON_AddBoolToObject(o, "healthy", reported_healthy(r));
        cJSON_AddBoolToObject(o, "reached", atomic_load(&r->reached));
        cJSON_AddBoolToObject(o, "ejected", is_ejected(r, now));
        cJSON_AddNumberToObject(o, "ejected_for_ms",
                                is_ejected(r, now) ? (double)(r->ejected_until_ms - now) : 0);
        cJSON_AddNumberToObject(o, "ejections", r->ejections);
        cJSON_AddNumberToObject(o, "outstanding", atomic_load(&r->outstanding));
        cJSON_AddNumberToObject(o, "requests", (double)atomic_load(&r->requests));
        cJSON_AddNumberToObject(o, "window_generations", (double)g);
        cJSON_AddNumberToObject(o, "window_trips", (double)t);
        cJSON_AddNumberToObject(o, "window_trip_rate", g ? round(1000.0 * t / g) / 1000 : 0);
        cJSON_AddItemToArray(arr, o);
    }
    pthread_mutex_unlock(&p->mu);
    char *s = lg_xcheck(cJSON_PrintUnformatted(arr));
    cJSON_Delete(arr);
    return s;
}

char *pool_metrics_text(lg_pool *p)
{
    uint64_t now = now_ms();
    char *buf = NULL;
    size_t len = 0;
    FILE *f = lg_xcheck(open_memstream(&buf, &len));
    static const char *const names[] = {"healthy", "ejected", "ejections_total"};
    static const char *const help[] = {"1 when the replica passes health checks.",
                                       "1 while the replica is ejected.",
                                       "Times the replica was ejected for degenerating."};
    pthread_mutex_lock(&p->mu);
    for (size_t m = 0; m < 3; m++) {
        bool counter = m >= 2;
        fprintf(f, "# HELP loopguard_upstream_%s %s\n# TYPE loopguard_upstream_%s %s\n", names[m],
                help[m], names[m], counter ? "counter" : "gauge");
        for (size_t i = 0; i < p->n; i++) {
            lg_replica *r = &p->r[i];
            unsigned long long v = m == 0   ? reported_healthy(r)
                                   : m == 1 ? is_ejected(r, now)
                                            : r->ejections;
            fprintf(f, "loopguard_upstream_%s{upstream=\"%s\"} %llu\n", names[m], r->base, v);
        }
    }
    pthread_mutex_unlock(&p->mu);
    fclose(f);
    return buf;
}

void pool_free(lg_pool *p)
{
    if (!p) return;
    atomic_store(&p->stop, true);
    if (p->health_running) pthread_join(p->health, NULL);
    for (size_t i = 0; i < p->n; i++)
        free(p->r[i].base);
    pthread_mutex_destroy(&p->mu);
    free(p->r);
    free(p);
}
