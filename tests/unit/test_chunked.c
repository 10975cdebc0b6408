/* test_chunked.c — the load tools' body decoder (tests/bench/chunked.c): each well-formed
 * body decodes to the same bytes however the input is split, stops at its end, and each
 * malformed one is a framing error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "../bench/chunked.c"

typedef struct {
    char body[256];
    size_t len, cap; /* cap: the most the "tool" accepts */
} sink;

static int collect(void *ud, const char *p, size_t n)
{
    sink *s = ud;
    if (s->len + n > s->cap) return -1;
    memcpy(s->body + s->len, p, n);
    s->len += n;
    return 0;
}

typedef struct {
    const char *name;
    body_framing framing;
    uint64_t length;
    const char *wire;
    const char *body; /* what the tool gets */
    bool done;
    size_t used; /* bytes of wire consumed; 0: all of them */
} good_case;

static const good_case good[] = {
    {"one chunk", BODY_CHUNKED, 0, "5\r\nhello\r\n0\r\n\r\n", "hello", true, 0},
    {"two chunks, upper-case hex", BODY_CHUNKED, 0, "3\r\nabc\r\nA\r\n0123456789\r\n0\r\n\r\n",
     "abc0123456789", true, 0},
    {"extensions", BODY_CHUNKED, 0, "5;a=b\r\nhello\r\n0 ; last\r\n\r\n", "hello", true, 0},
    {"trailer fields", BODY_CHUNKED, 0, "2\r\nhi\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n", "hi", true, 0},
    {"leading zeros", BODY_CHUNKED, 0, "0002\r\nhi\r\n000\r\n\r\n", "hi", true, 0},
    {"bytes after the end", BODY_CHUNKED, 0, "1\r\nx\r\n0\r\n\r\nHTTP/1.1", "x", true, 11},
    {"not finished", BODY_CHUNKED, 0, "5\r\nhel", "hel", false, 0},
    {"content-length", BODY_LENGTH, 5, "hello", "hello", true, 0},
    {"content-length, more sent", BODY_LENGTH, 3, "hello", "hel", true, 3},
    {"until close", BODY_CLOSE, 0, "data: x\n\n", "data: x\n\n", false, 0},
};

static const struct {
    const char *name, *wire;
} bad[] = {
    {"no size", "\r\nhello\r\n0\r\n\r\n"},
    {"a bare LF after the size", "5\nhello\r\n0\r\n\r\n"},
    {"a bare LF in an extension", "5;x\nhello\r\n0\r\n\r\n"},
    {"not hex", "g\r\n"},
    {"a sign", "-5\r\n"},
    {"extension without a size", ";x\r\n"},
    {"data longer than its size", "5\r\nhelloX\r\n0\r\n\r\n"},
    {"data without its CR LF", "5\r\nhello0\r\n\r\n"},
    {"a chunk of 2^40 bytes", "10000000000\r\n"},
};

/* Decodes `wire` in pieces of `step` bytes (0: in two pieces split at `split`). */
static ssize_t decode_split(const good_case *c, size_t step, size_t split, sink *s, body_decoder *d)
{
    size_t n = strlen(c->wire), off = 0;
    bool first = true;
    body_start(d, c->framing, c->length);
    while (off < n && !body_done(d)) {
        size_t k = step ? step : first ? split : n - off;
        first = false;
        if (k > n - off) k = n - off;
        ssize_t used = body_decode(d, c->wire + off, k, collect, s);
        if (used < 0) return -1;
        off += (size_t)used;
        if ((size_t)used < k) break; /* the body ended inside this piece */
    }
    return (ssize_t)off;
}

static void good_bodies_decode_whatever_the_split(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        const good_case *c = &good[i];
        size_t n = strlen(c->wire);
        for (size_t split = 0; split <= n + 1; split++) {
            sink s = {.cap = sizeof s.body};
            body_decoder d;
            /* split == n + 1: one byte at a time */
            ssize_t used =
                split <= n ? decode_split(c, 0, split, &s, &d) : decode_split(c, 1, 0, &s, &d);
            if (used != (ssize_t)(c->used ? c->used : n) || s.len != strlen(c->body) ||
                memcmp(s.body, c->body, s.len) != 0 || body_done(&d) != c->done)
                fail_msg("%s (split %zu): used %zd, body \"%.*s\", done %d", c->name, split, used,
                         (int)s.len, s.body, body_done(&d));
        }
    }
}

static void malformed_bodies_are_framing_errors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        good_case c = {bad[i].name, BODY_CHUNKED, 0, bad[i].wire, "", false, 0};
        for (size_t step = 0; step <= 1; step++) {
            sink s = {.cap = sizeof s.body};
            body_decoder d;
            if (decode_split(&c, step, strlen(c.wire), &s, &d) != -1)
                fail_msg("%s (step %zu) was accepted", c.name, step);
        }
    }
}

static void zero_length_is_done_at_once(void **state)
{
    (void)state;
    body_decoder d;
    body_start(&d, BODY_LENGTH, 0);
    assert_true(body_done(&d));
    body_start(&d, BODY_CLOSE, 0);
    assert_false(body_done(&d));
}

static void the_tool_can_refuse_bytes(void **state)
{
    (void)state;
    sink s = {.cap = 4};
    body_decoder d;
    body_start(&d, BODY_CHUNKED, 0);
    assert_int_equal(body_decode(&d, "5\r\nhello\r\n", 10, collect, &s), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(good_bodies_decode_whatever_the_split),
        cmocka_unit_test(malformed_bodies_are_framing_errors),
        cmocka_unit_test(zero_length_is_done_at_once),
        cmocka_unit_test(the_tool_can_refuse_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
