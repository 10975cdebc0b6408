/* test_upstream.c — the pool's choice of replica (rank, least outstanding, random tie-break,
 * ramp-up after an ejection), its ejection of an outlier and its health thresholds, and the
 * event hook called without the pool's lock held. The pool's source is included to reach
 * rank_of and the replicas' fields; no network is used (kinds are configured, the health
 * checker is never started). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../proxy/upstream.c"

/* ---- fixture ------------------------------------------------------------------------ */

typedef struct {
    lg_config *cfg;
    lg_pool *p;
} fixture;

/* The events the hook saw, and whether p->mu was free each time. */
static struct {
    lg_pool *pool;
    int n;
    char event[8][16];
    size_t replica[8];
    char json[8][192];
    bool lock_held;
} seen;

static void record_event(void *ud, size_t replica, const char *event, const char *json)
{
    (void)ud;
    if (pthread_mutex_trylock(&seen.pool->mu) == 0)
        pthread_mutex_unlock(&seen.pool->mu);
    else
        seen.lock_held = true;
    if (seen.n == 8) return;
    snprintf(seen.event[seen.n], sizeof seen.event[0], "%s", event);
    snprintf(seen.json[seen.n], sizeof seen.json[0], "%s", json ? json : "");
    seen.replica[seen.n++] = replica;
}

/* A pool of n SGLang replicas (no probing) with the default thresholds, hook installed. */
static fixture make_pool(size_t n)
{
    static const char *const urls[] = {"http://127.0.0.1:1", "http://127.0.0.1:2",
                                       "http://127.0.0.1:3", "http://127.0.0.1:4"};
    char list[128] = "", err[256];
    for (size_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? "," : "", urls[i]);
    fixture f = {config_new_defaults(), NULL};
    assert_int_equal(config_set_upstream(f.cfg, list, err, sizeof err), 0);
    f.cfg->upstream_kind = LG_UPSTREAM_SGLANG;
    f.p = pool_new(f.cfg);
    atomic_store(&f.p->seed, 12345u); /* a fixed tie-break sequence */
    memset(&seen, 0, sizeof seen);
    seen.pool = f.p;
    pool_set_event_hook(f.p, record_event, NULL);
    return f;
}

static void free_pool(fixture *f)
{
    pool_free(f->p);
    config_free(f->cfg);
}

/* How often each replica is picked in `rounds` acquire/release pairs. */
static void pick_counts(lg_pool *p, size_t avoid, int rounds, int *counts)
{
    for (int i = 0; i < rounds; i++) {
        size_t r = pool_acquire(p, avoid);
        counts[r]++;
        pool_release(p, r);
    }
}

/* ---- balancing ---------------------------------------------------------------------- */

static void least_outstanding_first(void **state)
{
    (void)state;
    fixture f = make_pool(3);
    int got[3] = {0};
    for (int i = 0; i < 3; i++)
        got[pool_acquire(f.p, SIZE_MAX)]++;
    /* Each pick goes to a replica with nothing outstanding: one each. */
    assert_int_equal(got[0], 1);
    assert_int_equal(got[1], 1);
    assert_int_equal(got[2], 1);
    pool_release(f.p, 1);
    assert_int_equal(pool_acquire(f.p, SIZE_MAX), 1);
    assert_int_equal(atomic_load(&f.p->r[1].requests), 2);
    free_pool(&f);
}

static void ties_are_spread(void **state)
{
    (void)state;
    fixture f = make_pool(3);
    int counts[3] = {0};
    pick_counts(f.p, SIZE_MAX, 300, counts);
    for (int i = 0; i < 3; i++)
        assert_in_range(counts[i], 50, 150);
    free_pool(&f);
}

static void avoided_unless_alone(void **state)
{
    (void)state;
    fixture f = make_pool(2);
    int counts[2] = {0};
    pick_counts(f.p, 0, 50, counts);
    assert_int_equal(counts[0], 0);
    assert_int_equal(counts[1], 50);
    free_pool(&f);

    f = make_pool(1);
    assert_int_equal(rank_of(f.p, 0, 0, now_ms()), 0); /* the only one is never avoided */
    assert_int_equal(pool_acquire(f.p, 0), 0);
    free_pool(&f);
}

/* Rank order: eligible < ramping < avoided < ejected < unhealthy; with nothing eligible
 * the least bad one is used. */
static void ranks_order_the_fallbacks(void **state)
{
    (void)state;
    fixture f = make_pool(3);
    uint64_t now = now_ms();
    atomic_store(&f.p->r[0].healthy, false);
    f.p->r[1].ejected_until_ms = now + 60000;
    assert_int_equal(rank_of(f.p, 0, 2, now), 4);
    assert_int_equal(rank_of(f.p, 1, 2, now), 3);
    assert_int_equal(rank_of(f.p, 2, 2, now), 2);
    assert_int_equal(pool_acquire(f.p, 2), 2); /* avoided beats ejected */
    atomic_store(&f.p->r[2].healthy, false);
    assert_int_equal(pool_acquire(f.p, 2), 1); /* ejected beats unhealthy */
    f.p->r[1].ejected_until_ms = 0;
    atomic_store(&f.p->r[1].healthy, false);
    /* All unhealthy: the least outstanding (replica 2 holds two, 1 holds one). */
    assert_int_equal(pool_acquire(f.p, SIZE_MAX), 0);
    free_pool(&f);
}

/* Half a back-off after its return a replica takes about half its share of ties: rank 0
 * half the time (then a coin against the other), rank 1 otherwise. */
static void ramp_up_after_return(void **state)
{
    (void)state;
    fixture f = make_pool(2);
    uint64_t backoff = f.cfg->eject.backoff_ms;
    f.p->r[0].returned_at_ms = now_ms() - backoff / 2;
    int counts[2] = {0};
    pick_counts(f.p, SIZE_MAX, 2000, counts);
    assert_in_range(counts[0], 300, 700); /* expected 500 */
    /* Just returned: never picked while another is eligible; after a whole back-off: fully. */
    f.p->r[0].returned_at_ms = now_ms();
    memset(counts, 0, sizeof counts);
    pick_counts(f.p, SIZE_MAX, 200, counts);
    assert_in_range(counts[0], 0, 5); /* a share of at most a few per mille */
    f.p->r[0].returned_at_ms = now_ms() - backoff;
    assert_int_equal(rank_of(f.p, 0, SIZE_MAX, now_ms()), 0);
    free_pool(&f);
}

/* ---- ejection ----------------------------------------------------------------------- */

static void outlier_is_ejected_and_hook_runs_unlocked(void **state)
{
    (void)state;
    fixture f = make_pool(2);
    unsigned min = f.cfg->eject.min_requests;
    for (unsigned i = 0; i < min; i++)
        assert_false(pool_report_generation(f.p, 1, false));
    for (unsigned i = 0; i + 1 < min; i++)
        assert_false(pool_report_generation(f.p, 0, true));
    assert_true(pool_report_generation(f.p, 0, true)); /* the min_requests-th sample */
    assert_int_equal(seen.n, 1);
    assert_string_equal(seen.event[0], "ejected");
    assert_int_equal(seen.replica[0], 0);
    assert_non_null(strstr(seen.json[0], "\"trip_rate\":1.000"));
    assert_non_null(strstr(seen.json[0], "\"others_trip_rate\":0.000"));
    assert_false(seen.lock_held);
    int counts[2] = {0};
    pick_counts(f.p, SIZE_MAX, 50, counts);
    assert_int_equal(counts[0], 0);

    /* Its back-off over, the next report brings it back, announced outside the lock too. */
    f.p->r[0].ejected_until_ms = now_ms() - 1;
    assert_false(pool_report_generation(f.p, 0, false));
    assert_int_equal(seen.n, 2);
    assert_string_equal(seen.event[1], "returned");
    assert_false(seen.lock_held);
    assert_int_equal(f.p->r[0].ejected_until_ms, 0);
    assert_int_equal(rank_of(f.p, 0, SIZE_MAX, now_ms()) <= 1, 1); /* ramping or eligible */
    free_pool(&f);
}

static void never_the_last_replica(void **state)
{
    (void)state;
    fixture f = make_pool(2);
    atomic_store(&f.p->r[1].healthy, false);
    for (unsigned i = 0; i < 3 * f.cfg->eject.min_requests; i++)
        assert_false(pool_report_generation(f.p, 0, true));
    assert_int_equal(seen.n, 0);
    free_pool(&f);
}

static void no_ejection_below_ratio(void **state)
{
    (void)state;
    fixture f = make_pool(2);
    /* Both trip half the time: not an outlier, however many samples. */
    for (unsigned i = 0; i < 40; i++) {
        assert_false(pool_report_generation(f.p, 1, i % 2));
        assert_false(pool_report_generation(f.p, 0, i % 2));
    }
    assert_int_equal(seen.n, 0);
    free_pool(&f);
}

/* ---- health ------------------------------------------------------------------------- */

static void health_thresholds_announce_once(void **state)
{
    (void)state;
    fixture f = make_pool(2);
    assert_int_equal(f.cfg->health.unhealthy_after, 2);
    pool_report_health(f.p, 0, false);
    assert_true(atomic_load(&f.p->r[0].healthy));
    pool_report_health(f.p, 0, false);
    pool_report_health(f.p, 0, false);
    assert_false(atomic_load(&f.p->r[0].healthy));
    assert_int_equal(seen.n, 1);
    assert_string_equal(seen.event[0], "unhealthy");
    assert_int_equal(pool_acquire(f.p, SIZE_MAX), 1);
    pool_report_health(f.p, 0, true); /* one success is not enough... */
    assert_false(atomic_load(&f.p->r[0].healthy));
    pool_report_health(f.p, 0, false); /* ...and a failure starts the count again */
    pool_report_health(f.p, 0, true);
    pool_report_health(f.p, 0, true);
    assert_true(atomic_load(&f.p->r[0].healthy));
    assert_int_equal(seen.n, 2);
    assert_string_equal(seen.event[1], "healthy");
    assert_false(seen.lock_held);
    free_pool(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(least_outstanding_first),
        cmocka_unit_test(ties_are_spread),
        cmocka_unit_test(avoided_unless_alone),
        cmocka_unit_test(ranks_order_the_fallbacks),
        cmocka_unit_test(ramp_up_after_return),
        cmocka_unit_test(outlier_is_ejected_and_hook_runs_unlocked),
        cmocka_unit_test(never_the_last_replica),
        cmocka_unit_test(no_ejection_below_ratio),
        cmocka_unit_test(health_thresholds_announce_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
