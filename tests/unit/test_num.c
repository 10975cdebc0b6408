/* test_num.c — strict number parsing: a whole decimal number within its range or nothing
 * (where atoi would read "12abc" as 12, "" as 0 and an overflow as a saturated value). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>

#include "proxy/num.h"

static void accepted(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        long long min, max, want;
    } cases[] = {
        {"0", 0, 10, 0},
        {"10", 0, 10, 10},
        {"-5", -10, 10, -5},
        {"007", 0, 10, 7},
        {"65535", 0, 65535, 65535},
        {"9223372036854775807", 0, LLONG_MAX, LLONG_MAX},
        {"-9223372036854775808", LLONG_MIN, 0, LLONG_MIN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        long long v = 42;
        if (!lg_parse_ll(cases[i].s, cases[i].min, cases[i].max, &v) || v != cases[i].want)
            fail_msg("\"%s\" in [%lld, %lld]: got %lld", cases[i].s, cases[i].min, cases[i].max, v);
    }
}

static void rejected_and_left_alone(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",
        "-",
        "+5",
        " 5",
        "5 ",
        "12abc",
        "0x10",
        "1e3",
        "1.0",
        "11",
        "-1",
        "9223372036854775808",
        "99999999999999999999",
        "--1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        long long v = 42;
        if (lg_parse_ll(bad[i], 0, 10, &v) || v != 42) fail_msg("\"%s\" was accepted", bad[i]);
    }
    long long v = 42;
    assert_false(lg_parse_ll(NULL, 0, 10, &v));
    assert_int_equal(v, 42);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accepted),
        cmocka_unit_test(rejected_and_left_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
