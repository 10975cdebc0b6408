/* upstream.c — see upstream.h. */
#include "proxy/upstream.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <cJSON.h>

typedef struct lg_replica {
    char *base;
    atomic_int kind; /* lg_upstream_kind; AUTO until probed */
    atomic_uint outstanding;
    atomic_bool healthy;
} lg_replica;

struct lg_pool {
    const lg_config *cfg;
    lg_replica *r;
    size_t n;
    atomic_uint seed;
    pool_event_fn hook;
    void *hook_ud;
};

static size_t discard(char *p, size_t sz, size_t n, void *ud)
{
    (void)p, (void)ud;
    return sz * n;
}

/* Blocking GET of base+path; returns the HTTP status or 0 when unreachable. */
static long probe_get(const char *base, const char *path, long timeout_ms)
{
    char url[2048];
    long status = 0;
    snprintf(url, sizeof url, "%s%s", base, path);
    CURL *c = curl_easy_init();
    if (!c) return 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
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
    lg_pool *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->cfg = cfg;
    p->n = cfg->n_upstreams;
    p->r = calloc(p->n, sizeof *p->r);
    if (!p->r) abort();
    atomic_store(&p->seed, 0x9e3779b9u);
    for (size_t i = 0; i < p->n; i++) {
        lg_replica *r = &p->r[i];
        r->base = strdup(cfg->upstreams[i]);
        if (!r->base) abort();
        lg_upstream_kind k = cfg->upstream_kind;
        if (k == LG_UPSTREAM_AUTO) k = probe_kind(r->base);
        atomic_store(&r->kind, (int)k);
        atomic_store(&r->healthy, true);
    }
    return p;
}

int pool_start(lg_pool *p)
{
    (void)p;
    return 0;
}

size_t pool_size(const lg_pool *p)
{
    return p->n;
}

const char *pool_base(const lg_pool *p, size_t i)
{
    return p->r[i].base;
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

static unsigned next_random(lg_pool *p)
{
    /* xorshift on a shared word; a lost update only repeats a tie-break. */
    unsigned x = atomic_load_explicit(&p->seed, memory_order_relaxed);
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    atomic_store_explicit(&p->seed, x, memory_order_relaxed);
    return x;
}

size_t pool_acquire(lg_pool *p, size_t avoid)
{
    size_t best = 0, ties = 0;
    unsigned best_load = ~0u;
    int best_rank = 3;
    for (size_t i = 0; i < p->n; i++) {
        /* rank: 0 eligible, 1 avoided, 2 unhealthy */
        int rank = !atomic_load(&p->r[i].healthy) ? 2 : (i == avoid && p->n > 1) ? 1 : 0;
        unsigned load = atomic_load_explicit(&p->r[i].outstanding, memory_order_relaxed);
        if (rank < best_rank || (rank == best_rank && load < best_load)) {
            best = i, best_rank = rank, best_load = load, ties = 1;
        } else if (rank == best_rank && load == best_load && next_random(p) % ++ties == 0) {
            best = i;
        }
    }
    atomic_fetch_add_explicit(&p->r[best].outstanding, 1, memory_order_relaxed);
    return best;
}

void pool_release(lg_pool *p, size_t i)
{
    atomic_fetch_sub_explicit(&p->r[i].outstanding, 1, memory_order_relaxed);
}

void pool_report_health(lg_pool *p, size_t i, bool ok)
{
    (void)p, (void)i, (void)ok;
}

void pool_report_generation(lg_pool *p, size_t i, bool tripped)
{
    (void)p, (void)i, (void)tripped;
}

char *pool_json(lg_pool *p)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < p->n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "url", p->r[i].base);
        cJSON_AddStringToObject(o, "kind", config_upstream_kind_name(pool_kind(p, i)));
        cJSON_AddBoolToObject(o, "healthy", atomic_load(&p->r[i].healthy));
        cJSON_AddNumberToObject(o, "outstanding", atomic_load(&p->r[i].outstanding));
        cJSON_AddItemToArray(arr, o);
    }
    char *s = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    if (!s) abort();
    return s;
}

void pool_set_event_hook(lg_pool *p, pool_event_fn fn, void *ud)
{
    p->hook = fn;
    p->hook_ud = ud;
}

void pool_free(lg_pool *p)
{
    if (!p) return;
    for (size_t i = 0; i < p->n; i++) free(p->r[i].base);
    free(p->r);
    free(p);
}
