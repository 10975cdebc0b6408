/* test_handoff.c — a worker's queue of handed connections: taken whole and in order, counted
 * for placing; once shut by a take it refuses every later connection, so that none waits for
 * a worker that has left, also when another thread hands one over in the same instant; the
 * sockets never taken are closed when the queue is freed. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "proxy/handoff.h"
#include "proxy/xalloc.h"

static struct sockaddr_storage peer(int port)
{
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    sa.ss_family = AF_INET;
    ((unsigned char *)&sa)[2] = (unsigned char)(port >> 8); /* sin_port, network order */
    ((unsigned char *)&sa)[3] = (unsigned char)port;
    return sa;
}

static void test_taken_whole_in_order(void **state)
{
    (void)state;
    lg_handoff h;
    handoff_init(&h);
    for (int fd = 10; fd < 13; fd++) {
        struct sockaddr_storage sa = peer(fd);
        assert_true(handoff_put(&h, fd, &sa, 16));
    }
    assert_int_equal(handoff_count(&h), 3);
    lg_handed *q;
    assert_int_equal(handoff_take(&h, false, &q), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(q[i].fd, 10 + i);
        assert_int_equal(q[i].len, 16);
        assert_int_equal(((unsigned char *)&q[i].sa)[3], 10 + i);
    }
    lg_xfree(q);
    assert_int_equal(handoff_count(&h), 0);
    assert_int_equal(handoff_take(&h, false, &q), 0);
    assert_null(q);
    struct sockaddr_storage sa = peer(1);
    assert_true(handoff_put(&h, 20, &sa, 16)); /* a take without shut leaves it open */
    assert_int_equal(handoff_take(&h, false, &q), 1);
    lg_xfree(q);
    handoff_free(&h);
}

static void test_shut_refuses_later_ones(void **state)
{
    (void)state;
    lg_handoff h;
    handoff_init(&h);
    struct sockaddr_storage sa = peer(1);
    assert_true(handoff_put(&h, 7, &sa, 16));
    lg_handed *q;
    assert_int_equal(handoff_take(&h, true, &q), 1); /* the last take still gets what came */
    assert_int_equal(q[0].fd, 7);
    lg_xfree(q);
    assert_false(handoff_put(&h, 8, &sa, 16)); /* the caller keeps it */
    assert_int_equal(handoff_count(&h), 0);
    assert_int_equal(handoff_take(&h, false, &q), 0); /* and stays shut */
    assert_false(handoff_put(&h, 9, &sa, 16));
    handoff_free(&h);
}

static void test_free_closes_what_was_never_taken(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    lg_handoff h;
    handoff_init(&h);
    struct sockaddr_storage sa = peer(1);
    assert_true(handoff_put(&h, p[0], &sa, 16));
    assert_true(handoff_put(&h, p[1], &sa, 16));
    handoff_free(&h);
    errno = 0;
    assert_int_equal(fcntl(p[0], F_GETFD), -1);
    assert_int_equal(errno, EBADF);
    assert_int_equal(fcntl(p[1], F_GETFD), -1);
}

/* ---- a hand-off racing the receiver's shut --------------------------------------------- */

enum { PUTS_MAX = 1000000 }; /* a bound for a queue that never shuts: the test then fails */

struct giver {
    lg_handoff *h;
    unsigned given; /* queued */
    bool refused;   /* the hand-off after the last one queued was refused */
};

/* Hands connections over, one after another, until the queue refuses one. */
static void *give(void *arg)
{
    struct giver *g = arg;
    struct sockaddr_storage sa = peer(1);
    while (g->given < PUTS_MAX && !g->refused) {
        if (handoff_put(g->h, 1000 + (int)g->given, &sa, 16))
            g->given++;
        else
            g->refused = true;
    }
    return NULL;
}

/* Takes h's queue (shut: for the last time) and checks that the fds come in the order
 * given, from *next on; returns how many. */
static unsigned take_in_order(lg_handoff *h, bool shut, int *next)
{
    lg_handed *q;
    size_t n = handoff_take(h, shut, &q);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(q[i].fd, (*next)++);
    lg_xfree(q);
    return (unsigned)n;
}

/* One thread hands connections over without a pause while the owner takes some, then shuts
 * the queue: every connection queued is taken, before the shut or by the shutting take; the
 * giver is refused from then on, and nothing is queued after the shut. */
static void test_a_put_racing_the_shut(void **state)
{
    (void)state;
    lg_handoff h;
    handoff_init(&h);
    struct giver g = {&h, 0, false};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, give, &g), 0);
    unsigned taken = 0;
    int next = 1000;
    while (taken < 5000)
        taken += take_in_order(&h, false, &next);
    taken += take_in_order(&h, true, &next);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true(g.refused);
    assert_int_equal(taken, g.given);
    assert_int_equal(handoff_count(&h), 0);
    assert_int_equal(take_in_order(&h, false, &next), 0); /* nothing entered after the shut */
    handoff_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_taken_whole_in_order),
        cmocka_unit_test(test_shut_refuses_later_ones),
        cmocka_unit_test(test_free_closes_what_was_never_taken),
        cmocka_unit_test(test_a_put_racing_the_shut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
