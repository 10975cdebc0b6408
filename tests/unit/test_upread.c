/* test_upread.c — the upstream read buffer follows what this thread's reads found waiting:
 * small before any read and while reads bring a paced event or two, large while a good
 * share of them would fill the small buffer, whichever buffer they had; one stray read
 * does not flip it; only so many transfers hold the large one at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "proxy/upread.h"

#define PACED 260 /* one chat completion chunk */

static void reads(size_t n, int times)
{
    for (int i = 0; i < times; i++)
        upread_note_read(n);
}

/* The size a transfer starting now gets, handed straight back. */
static size_t one_buffer(void)
{
    size_t n = upread_take();
    upread_give(n);
    return n;
}

/* The test functions run in order on one thread, which holds the state. */
static void test_small_before_any_read(void **state)
{
    (void)state;
    assert_int_equal(one_buffer(), UPREAD_SMALL);
}

static void test_paced_then_saturated(void **state)
{
    (void)state;
    reads(PACED, 100);
    assert_int_equal(one_buffer(), UPREAD_SMALL);
    reads(UPREAD_LARGE, 1); /* one burst among paced reads */
    reads(PACED, 1);
    assert_int_equal(one_buffer(), UPREAD_SMALL);
    /* The upstream outruns the relay: small buffers come back full, and so do large ones. */
    reads(UPREAD_SMALL, 8);
    assert_int_equal(one_buffer(), UPREAD_LARGE);
    for (int i = 0; i < 100; i++) { /* half the reads bring 3 KiB, half 1 KiB: stays large */
        reads(3072, 1);
        reads(1024, 1);
    }
    assert_int_equal(one_buffer(), UPREAD_LARGE);
    reads(PACED, 100); /* back to a decode pace */
    assert_int_equal(one_buffer(), UPREAD_SMALL);
}

/* While UPREAD_LARGE_MAX transfers hold the large buffer, the next ones get the small one;
 * one large ending lets the next transfer have it again. */
static void test_large_ones_capped(void **state)
{
    (void)state;
    static size_t held[UPREAD_LARGE_MAX + 2];
    reads(UPREAD_LARGE, 100);
    for (size_t i = 0; i < UPREAD_LARGE_MAX; i++) {
        held[i] = upread_take();
        assert_int_equal(held[i], UPREAD_LARGE);
    }
    held[UPREAD_LARGE_MAX] = upread_take();
    assert_int_equal(held[UPREAD_LARGE_MAX], UPREAD_SMALL);
    upread_give(held[0]);
    held[0] = upread_take();
    assert_int_equal(held[0], UPREAD_LARGE);
    held[UPREAD_LARGE_MAX + 1] = upread_take();
    assert_int_equal(held[UPREAD_LARGE_MAX + 1], UPREAD_SMALL);
    for (size_t i = 0; i < UPREAD_LARGE_MAX + 2; i++)
        upread_give(held[i]);
    assert_int_equal(one_buffer(), UPREAD_LARGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_before_any_read),
        cmocka_unit_test(test_paced_then_saturated),
        cmocka_unit_test(test_large_ones_capped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
