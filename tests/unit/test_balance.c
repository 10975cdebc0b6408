/* test_balance.c — a worker is full past half a core or at its connection limit; it sheds
 * only when it ran hot over two ticks while another worker that takes connections ran less
 * than half as much, and then the share of its connections that evens the two out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "proxy/balance.h"

static void test_full(void **state)
{
    (void)state;
    assert_false(balance_full(BALANCE_SPILL_PERMILLE, 10, 100));
    assert_true(balance_full(BALANCE_SPILL_PERMILLE + 1, 10, 100));
    assert_true(balance_full(0, 100, 100));
    assert_false(balance_full(0, 99, 100));
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
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_sheds_half_to_an_idle_worker),
        cmocka_unit_test(test_sheds_the_share_that_evens_out),
        cmocka_unit_test(test_one_hot_tick_sheds_nothing),
        cmocka_unit_test(test_an_even_load_sheds_nothing),
        cmocka_unit_test(test_a_paced_load_sheds_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
