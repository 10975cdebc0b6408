/* test_think.c — the think-tag splitter: expected splits for each rule, and the same
 * output whatever the chunking (every one and two cut positions, one byte at a time). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "proxy/buf.h"
#include "proxy/think.h"

typedef struct tcase {
    const char *in;
    bool inside;
    const char *reasoning;
    const char *content;
} tcase;

static const tcase cases[] = {
    {"<think>abc</think>\n\nanswer", false, "abc", "answer"},
    {"<think>\nstep one\n</think>\n\nThe answer is 4.", false, "\nstep one\n", "The answer is 4."},
    {"  \n<think>r</think>c", false, "r", "c"},
    {"reasoning</think>\n\nanswer", true, "reasoning", "answer"},
    {"<think>redundant</think> x", true, "redundant", "x"},
    {"no tags at all", false, "", "no tags at all"},
    {"  leading space kept", false, "", "  leading space kept"},
    {"text then <think>late</think>", false, "", "text then <think>late</think>"},
    {"<think>cut by max_tokens", false, "cut by max_tokens", ""},
    {"<think>ends in partial </th", false, "ends in partial </th", ""},
    {"<thi", false, "", "<thi"},
    {"<thinking>", false, "", "<thinking>"},
    {"\n\n", false, "", "\n\n"},
    {"\n\n", true, "\n\n", ""},
    {"<think>a < b <</ </thinker </think>", false, "a < b <</ </thinker ", ""},
    {"<think>x</think>y</think>z</think>", false, "x", "y</think>z</think>"},
    {"r1 <think> r2</think>\n \t\r\n</think>c", true, "r1 <think> r2", "</think>c"},
    {"</think>", true, "", ""},
    {"<</think>ok", true, "<", "ok"},
    {"", false, "", ""},
};

/* Splits `in` with cuts at the sorted offsets cuts[0..n); returns r and c. */
static void split(const char *in, bool inside, const size_t *cuts, size_t n, lg_buf *r, lg_buf *c)
{
    size_t len = strlen(in), at = 0;
    think_split *t = think_new(inside);
    for (size_t k = 0; k <= n; k++) {
        size_t to = k < n ? cuts[k] : len;
        think_feed(t, in + at, to - at, r, c);
        at = to;
    }
    think_finish(t, r, c);
    think_free(t);
    lg_buf_append(r, "", 0); /* make p non-NULL for string compares */
    lg_buf_append(c, "", 0);
}

static void test_expected(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
        split(cases[i].in, cases[i].inside, NULL, 0, &r, &c);
        assert_string_equal(r.p, cases[i].reasoning);
        assert_string_equal(c.p, cases[i].content);
        lg_buf_free(&r);
        lg_buf_free(&c);
    }
}

static void test_every_split(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const tcase *tc = &cases[k];
        size_t len = strlen(tc->in);
        for (size_t i = 0; i <= len; i++) {
            for (size_t j = i; j <= len; j++) {
                size_t cuts[2] = {i, j};
                lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
                split(tc->in, tc->inside, cuts, 2, &r, &c);
                assert_string_equal(r.p, tc->reasoning);
                assert_string_equal(c.p, tc->content);
                lg_buf_free(&r);
                lg_buf_free(&c);
            }
        }
        size_t *cuts = malloc((len + 1) * sizeof(*cuts));
        for (size_t i = 0; i < len; i++)
            cuts[i] = i;
        lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
        split(tc->in, tc->inside, cuts, len, &r, &c);
        assert_string_equal(r.p, tc->reasoning);
        assert_string_equal(c.p, tc->content);
        lg_buf_free(&r);
        lg_buf_free(&c);
        free(cuts);
    }
}

/* Held bytes are held, not lost: a partial tag stays back until the next byte decides. */
static void test_holding(void **state)
{
    (void)state;
    lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
    think_split *t = think_new(false);
    assert_false(think_inside(t));
    think_feed(t, "\n<thi", 5, &r, &c);
    assert_int_equal(r.len + c.len, 0);
    think_feed(t, "nk>abc</th", 10, &r, &c);
    assert_true(think_inside(t));
    assert_int_equal(r.len, 3); /* "</th" held */
    assert_memory_equal(r.p, "abc", 3);
    assert_int_equal(c.len, 0);
    think_feed(t, "ink>\n\n", 6, &r, &c);
    assert_true(think_closed(t));
    assert_false(think_inside(t));
    think_feed(t, "A", 1, &r, &c);
    assert_int_equal(c.len, 1);
    think_free(t);
    think_free(NULL);
    lg_buf_free(&r);
    lg_buf_free(&c);
}

/* More leading whitespace than THINK_MAX_LEAD: a later "<think>" does not open. */
static void test_lead_cap(void **state)
{
    (void)state;
    char in[THINK_MAX_LEAD + 32];
    memset(in, ' ', THINK_MAX_LEAD + 1);
    strcpy(in + THINK_MAX_LEAD + 1, "<think>x</think>");
    lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
    split(in, false, NULL, 0, &r, &c);
    assert_string_equal(c.p, in);
    assert_int_equal(r.len, 0);
    lg_buf_free(&r);
    lg_buf_free(&c);
    in[1] = '\0'; /* one space: opens */
    memmove(in + 1, "<think>x</think>", 17);
    split(in, false, NULL, 0, &r, &c);
    assert_string_equal(r.p, "x");
    lg_buf_free(&r);
    lg_buf_free(&c);
}

static void test_whole(void **state)
{
    (void)state;
    const struct {
        const char *in, *r, *c;
        bool found;
    } w[] = {
        {"reasoning without open</think>\n\nanswer", "reasoning without open", "answer", true},
        {"<think>r</think>c", "r", "c", true},
        {"plain answer", "", "plain answer", false},
        {"<think>truncated", "truncated", "", true},
    };
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
        assert_int_equal(think_split_whole(w[i].in, strlen(w[i].in), &r, &c), w[i].found);
        lg_buf_append(&r, "", 0);
        lg_buf_append(&c, "", 0);
        assert_string_equal(r.p, w[i].r);
        assert_string_equal(c.p, w[i].c);
        lg_buf_free(&r);
        lg_buf_free(&c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expected), cmocka_unit_test(test_every_split),
        cmocka_unit_test(test_holding),  cmocka_unit_test(test_lead_cap),
        cmocka_unit_test(test_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
