/* test_balance.c — a worker takes the next connection while it holds no more than the
 * least loaded other that takes connections, and none at its limit; it sheds only when it
 * ran hot over two ticks while another worker that takes connections ran less than half as
 * much, and then the share of its connections that evens the two out. */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "proxy/balance.h"

static void test_takes(void **state)
{
    (void)state;
    assert_true(balance_takes(0, 0));    /* at the start every worker watches */
    assert_true(balance_takes(10, 10));  /* equal: either may take it */
    assert_false(balance_takes(11, 10)); /* one more than another: the next is the other's */
    assert_true(balance_takes(10, 11));
    assert_true(balance_takes(500, UINT_MAX));       /* no other takes connections */
    assert_false(balance_takes(UINT_MAX, UINT_MAX)); /* it takes none itself */
    assert_false(balance_takes(UINT_MAX, 3));
}

/* 100 saturated streams on one worker running a whole core, the other idle: half go. */
static void test_sheds_half_to_an_idle_worker(void **state)
{
    (void)state;
    assert_int_equal(balance_shed(100, 1000, 1000, 0), 50);
    assert_int_equal(balance_shed(100, 820, 800, 0), 50);
}

/* 90 % against 30 %: a third of the load moves, so a third of the connections. */
static void test_sheds_the_share_that_evens_out(void **state)
{
    (void)state;
    assert_int_equal(balance_shed(90, 900, 900, 300), 30);
}

static void test_one_hot_tick_sheds_nothing(void **state)
{
    (void)state;
    assert_int_equal(balance_shed(100, 1000, BALANCE_SHED_PERMILLE - 1, 0), 0);
    assert_int_equal(balance_shed(100, BALANCE_SHED_PERMILLE - 1, 1000, 0), 0);
    assert_int_equal(balance_shed(100, BALANCE_SHED_PERMILLE, BALANCE_SHED_PERMILLE, 0), 50);
}

/* The others are about as busy (or none takes connections: least == mine). */
static void test_an_even_load_sheds_nothing(void **state)
{
    (void)state;
    assert_int_equal(balance_shed(100, 900, 900, 450), 0);
    assert_int_equal(balance_shed(100, 900, 900, 900), 0);
    assert_int_equal(balance_shed(100, 900, 900, 449), 25);
}

/* A paced load: however many streams, the worker stays under the shed share. */
static void test_a_paced_load_sheds_nothing(void **state)
{
    (void)state;
    assert_int_equal(balance_shed(5000, 400, 400, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_takes),
        cmocka_unit_test(test_sheds_half_to_an_idle_worker),
        cmocka_unit_test(test_sheds_the_share_that_evens_out),
        cmocka_unit_test(test_one_hot_tick_sheds_nothing),
        cmocka_unit_test(test_an_even_load_sheds_nothing),
        cmocka_unit_test(test_a_paced_load_sheds_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
