/* test_upread.c — the upstream read buffer follows what this thread's reads found waiting:
 * small before any read and while reads bring a paced event or two, large while a good
 * share of them would fill the small buffer, whichever buffer they had; one stray read
 * does not flip it. */
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

/* The test functions run in order on one thread, which holds the state. */
static void test_small_before_any_read(void **state)
{
    (void)state;
    assert_int_equal(upread_buffer_size(), UPREAD_SMALL);
}

static void test_paced_then_saturated(void **state)
{
    (void)state;
    reads(PACED, 100);
    assert_int_equal(upread_buffer_size(), UPREAD_SMALL);
    reads(UPREAD_LARGE, 1); /* one burst among paced reads */
    reads(PACED, 1);
    assert_int_equal(upread_buffer_size(), UPREAD_SMALL);
    /* The upstream outruns the relay: small buffers come back full, and so do large ones. */
    reads(UPREAD_SMALL, 8);
    assert_int_equal(upread_buffer_size(), UPREAD_LARGE);
    for (int i = 0; i < 100; i++) { /* half the reads bring 3 KiB, half 1 KiB: stays large */
        reads(3072, 1);
        reads(1024, 1);
    }
    assert_int_equal(upread_buffer_size(), UPREAD_LARGE);
    reads(PACED, 100); /* back to a decode pace */
    assert_int_equal(upread_buffer_size(), UPREAD_SMALL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_before_any_read),
        cmocka_unit_test(test_paced_then_saturated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
