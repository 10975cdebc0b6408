/* test_sse.c — the SSE parser against the WHATWG rules: line endings, splits at every
 * byte, comments, multi-line data, garbage, BOM, limits, and raw exactness (the raws of
 * all events followed by the pending bytes reproduce the input). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/buf.h"
#include "proxy/sse.h"

/* Everything the callback saw, serialised, so two runs compare with one strcmp. */
typedef struct collect {
    lg_buf log;  /* one line per event: event|id|has_id|retry|data */
    lg_buf raws; /* concatenated raws */
    int n;
    int stop_at; /* return 7 from the callback for event number stop_at (1-based) */
} collect;

static int on_event(void *ud, const sse_event *ev)
{
    collect *c = ud;
    c->n++;
    lg_buf_printf(&c->log, "%.*s|%.*s|%d|%ld|", (int)ev->event_len, ev->event, (int)ev->id_len,
                  ev->id, ev->has_id, ev->retry);
    lg_buf_append(&c->log, ev->data, ev->data_len);
    lg_buf_append(&c->log, "\n", 1);
    lg_buf_append(&c->raws, ev->raw, ev->raw_len);
    return c->n == c->stop_at ? 7 : 0;
}

static void collect_free(collect *c)
{
    lg_buf_free(&c->log);
    lg_buf_free(&c->raws);
}

/* Feeds `in` in pieces cut at the offsets in cuts[0..ncuts) and checks raw exactness. */
static void run_cuts(const char *in, size_t len, const size_t *cuts, size_t ncuts, collect *c)
{
    sse_parser *p = sse_parser_new(0, on_event, c);
    size_t at = 0;
    for (size_t k = 0; k <= ncuts; k++) {
        size_t to = k < ncuts ? cuts[k] : len;
        assert_int_equal(sse_parser_feed(p, in + at, to - at), 0);
        at = to;
    }
    size_t plen;
    const char *pend = sse_parser_pending_raw(p, &plen);
    assert_int_equal(plen, sse_parser_pending(p));
    assert_int_equal(c->raws.len + plen, len);
    assert_memory_equal(c->raws.p ? c->raws.p : "", in, c->raws.len);
    assert_memory_equal(pend, in + c->raws.len, plen);
    sse_parser_free(p);
}

static void run_whole(const char *in, collect *c)
{
    run_cuts(in, strlen(in), NULL, 0, c);
}

static const char sample[] = "\xEF\xBB\xBF: hello comment\n"
                             "event: add\r\n"
                             "data: {\"a\":1}\r\n"
                             "id: 7\r\n"
                             "\r\n"
                             "data:first\rdata:  second\r\r"
                             "garbage line without colon\n"
                             "data\n"
                             "retry: 1500\n"
                             "\n"
                             "\n\n"
                             "id\n"
                             "data: [DONE]\n\n"
                             "data: trailing incomplete";

static const char sample_log[] = "add|7|1|-1|{\"a\":1}\n"
                                 "|7|0|-1|first\n second\n"
                                 "|7|0|1500|\n"
                                 "||1|-1|[DONE]\n";

static void test_whole_sample(void **state)
{
    (void)state;
    collect c = {0};
    run_whole(sample, &c);
    assert_string_equal(c.log.p, sample_log);
    collect_free(&c);
}

/* Every single cut point and every pair of cut points gives the same events. */
static void test_every_split(void **state)
{
    (void)state;
    size_t len = strlen(sample);
    for (size_t i = 0; i <= len; i++) {
        for (size_t j = i; j <= len; j++) {
            size_t cuts[2] = {i, j};
            collect c = {0};
            run_cuts(sample, len, cuts, 2, &c);
            assert_string_equal(c.log.p, sample_log);
            collect_free(&c);
        }
    }
}

static void test_byte_at_a_time(void **state)
{
    (void)state;
    size_t len = strlen(sample);
    size_t *cuts = malloc(len * sizeof(*cuts));
    for (size_t i = 0; i < len; i++)
        cuts[i] = i;
    collect c = {0};
    run_cuts(sample, len, cuts, len, &c);
    assert_string_equal(c.log.p, sample_log);
    collect_free(&c);
    free(cuts);
}

/* The same stream with LF, CRLF and CR endings yields the same events. */
static void test_line_endings(void **state)
{
    (void)state;
    const char *styles[] = {"\n", "\r\n", "\r"};
    for (int s = 0; s < 3; s++) {
        const char *e = styles[s];
        char in[512];
        snprintf(in, sizeof(in), "event: x%sdata: a%sdata: b%s%s: c%sdata: z%s%s", e, e, e, e, e, e,
                 e);
        collect c = {0};
        run_whole(in, &c);
        assert_string_equal(c.log.p, "x||0|-1|a\nb\n||0|-1|z\n");
        assert_int_equal(c.n, 2);
        collect_free(&c);
    }
}

/* CR at the end of one read, LF at the start of the next: one line ending. In a CR LF
 * stream the event waits for the LF so its raw is whole; in a bare-CR stream it is
 * dispatched at once; sse_parser_finish dispatches one whose CR ended the stream. */
static void test_cr_at_end_of_read(void **state)
{
    (void)state;
    collect c = {0};
    sse_parser *p = sse_parser_new(0, on_event, &c);
    assert_int_equal(sse_parser_feed(p, "data: a\r\n\r", 10), 0);
    assert_int_equal(c.n, 0); /* waits for the LF */
    assert_int_equal(sse_parser_feed(p, "\ndata: b\r\n\r\n", 12), 0);
    assert_int_equal(c.n, 2);
    assert_string_equal(c.log.p, "||0|-1|a\n||0|-1|b\n");
    assert_string_equal(c.raws.p, "data: a\r\n\r\n"
                                  "data: b\r\n\r\n");
    assert_int_equal(sse_parser_pending(p), 0);
    assert_int_equal(sse_parser_feed(p, "data: c\r\n\r", 10), 0);
    assert_int_equal(c.n, 2);
    assert_int_equal(sse_parser_finish(p), 0); /* the stream ended on that CR */
    assert_int_equal(c.n, 3);
    assert_int_equal(sse_parser_finish(p), 0);
    assert_int_equal(c.n, 3);
    sse_parser_free(p);
    collect_free(&c);

    collect d = {0};
    p = sse_parser_new(0, on_event, &d);
    assert_int_equal(sse_parser_feed(p, "data: a\r\r", 9), 0);
    assert_int_equal(d.n, 1); /* bare-CR stream: at once */
    assert_int_equal(sse_parser_feed(p, "data: b\r", 8), 0);
    assert_int_equal(sse_parser_feed(p, "\r", 1), 0);
    assert_int_equal(d.n, 2);
    assert_string_equal(d.raws.p, "data: a\r\rdata: b\r\r");
    sse_parser_free(p);
    collect_free(&d);
}

static void test_field_details(void **state)
{
    (void)state;
    collect c = {0};
    run_whole("data:no space\n"
              "data:  two spaces\n"
              "data\n"
              "data:\n"
              "retry: 12x\n"
              "retry:\n"
              "unknown: field\n"
              "DATA: upper case is another field\n"
              "event:ev\n"
              "event: last wins\n"
              "\n"
              "data:\n\n",
              &c);
    assert_string_equal(c.log.p, "last wins||0|-1|no space\n two spaces\n\n\n"
                                 "||0|-1|\n");
    collect_free(&c);
}

/* An id containing NUL is ignored; ids persist; a blank block without data dispatches
 * nothing and its bytes go into the next event's raw. */
static void test_id_and_empty_blocks(void **state)
{
    (void)state;
    static const char in[] = "id: 1\ndata: a\n\nid: b\0d\ndata: b\n\nid: 3\n\n: keepalive\n\n"
                             "data: c\n\n";
    collect c = {0};
    run_cuts(in, sizeof(in) - 1, NULL, 0, &c);
    assert_string_equal(c.log.p, "|1|1|-1|a\n|1|0|-1|b\n|3|0|-1|c\n");
    assert_int_equal(c.n, 3);
    collect_free(&c);
}

static void test_bom_only_at_start(void **state)
{
    (void)state;
    collect c = {0};
    run_whole("data: x\n\n\xEF\xBB\xBF"
              "data: y\n\n",
              &c);
    /* a BOM later in the stream is part of a field name: that line is ignored */
    assert_string_equal(c.log.p, "||0|-1|x\n");
    collect_free(&c);

    collect d = {0};
    run_whole("\xEF\xBB"
              "data: y\n\n",
              &d); /* a broken BOM: garbage first line */
    assert_int_equal(d.n, 0);
    collect_free(&d);
}

static void test_limit(void **state)
{
    (void)state;
    collect c = {0};
    sse_parser *p = sse_parser_new(32, on_event, &c);
    assert_int_equal(sse_parser_feed(p, "data: 0123456789\n\n", 18), 0); /* 18 <= 32 */
    assert_int_equal(c.n, 1);
    assert_int_equal(sse_parser_feed(p, "data: 0123456789", 16), 0);
    assert_int_equal(sse_parser_feed(p, "0123456789", 10), 0); /* 26 pending */
    assert_int_equal(sse_parser_feed(p, "0123456789", 10), SSE_ERR_TOO_BIG);
    assert_int_equal(sse_parser_feed(p, "\n\n", 2), SSE_ERR_TOO_BIG);
    assert_int_equal(c.n, 1);
    sse_parser_free(p);
    collect_free(&c);

    /* comments count too: the raw of an event is what is limited */
    collect d = {0};
    p = sse_parser_new(16, on_event, &d);
    assert_int_equal(sse_parser_feed(p, ": a\n: b\n: c\n", 12), 0);
    assert_int_equal(sse_parser_feed(p, "data: x\n\n", 9), SSE_ERR_TOO_BIG);
    assert_int_equal(d.n, 0);
    sse_parser_free(p);
    collect_free(&d);
}

/* A callback's nonzero stops the feed; the rest is parsed by the next call. */
static void test_callback_stop(void **state)
{
    (void)state;
    collect c = {.stop_at = 2};
    sse_parser *p = sse_parser_new(0, on_event, &c);
    const char *in = "data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4";
    assert_int_equal(sse_parser_feed(p, in, strlen(in)), 7);
    assert_int_equal(c.n, 2);
    assert_int_equal(sse_parser_pending(p), strlen("data: 3\n\ndata: 4"));
    assert_int_equal(sse_parser_feed(p, NULL, 0), 0);
    assert_int_equal(c.n, 3);
    assert_int_equal(sse_parser_feed(p, "\n\n", 2), 0);
    assert_string_equal(c.log.p, "||0|-1|1\n||0|-1|2\n||0|-1|3\n||0|-1|4\n");
    assert_string_equal(c.raws.p, "data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
    sse_parser_free(p);
    collect_free(&c);
    sse_parser_free(NULL);
}

/* Once the BOM question is settled and nothing is pending, reads are parsed in place:
 * a stop there must still keep the rest, and an incomplete tail must survive the read. */
static void test_in_place_path(void **state)
{
    (void)state;
    collect c = {.stop_at = 3};
    sse_parser *p = sse_parser_new(0, on_event, &c);
    assert_int_equal(sse_parser_feed(p, "data: 1\n\n", 9), 0);
    assert_int_equal(sse_parser_pending(p), 0);
    char in[] = "data: 2\n\ndata: 3\n\ndata: 4\n\ndata: 5";
    assert_int_equal(sse_parser_feed(p, in, strlen(in)), 7);
    memset(in, 'X', strlen(in)); /* the caller's buffer is gone after the call */
    assert_int_equal(sse_parser_pending(p), strlen("data: 4\n\ndata: 5"));
    assert_int_equal(sse_parser_feed(p, "\r", 1), 0);
    assert_int_equal(c.n, 4);
    assert_int_equal(sse_parser_feed(p, "\n\r\n", 3), 0);
    assert_int_equal(c.n, 5);
    assert_string_equal(c.log.p, "||0|-1|1\n||0|-1|2\n||0|-1|3\n||0|-1|4\n||0|-1|5\n");
    assert_string_equal(c.raws.p, "data: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\ndata: 5\r\n\r\n");
    /* Back in place after bytes were kept (their buffer is given back): a whole event, an
     * event cut after its data line, a whole one again. */
    char more[] = "data: 6\n\ndata: 7\n";
    assert_int_equal(sse_parser_feed(p, more, strlen(more)), 0);
    memset(more, 'X', strlen(more));
    assert_int_equal(c.n, 6);
    assert_int_equal(sse_parser_pending(p), strlen("data: 7\n"));
    assert_int_equal(sse_parser_feed(p, "\n", 1), 0);
    assert_int_equal(sse_parser_feed(p, "data: 8\n\n", 9), 0);
    assert_int_equal(sse_parser_pending(p), 0);
    assert_int_equal(c.n, 8);
    assert_string_equal(strstr(c.log.p, "||0|-1|6"), "||0|-1|6\n||0|-1|7\n||0|-1|8\n");
    assert_string_equal(strstr(c.raws.p, "data: 6"), "data: 6\n\ndata: 7\n\ndata: 8\n\n");
    sse_parser_free(p);
    collect_free(&c);
}

/* A read of one whole event while nothing is pending takes a path of its own (sse.c's
 * one_event): the persisted id and every field's default must reach it whatever came
 * before — fields, a comment kept for the next raw, CR LF lines, an event name. */
static void test_one_event_reads(void **state)
{
    (void)state;
    static const char *const reads[] = {
        "id: 7\nretry: 5\ndata: a\n\n",
        "data: b\n\n",
        ": c\n",
        "data: d\n\n",
        "data: e\n\n",
        "data: f\r\n\r\n",
        "data: g\n\n",
        "event: x\n",
        "data: h\n\n",
        "data:i\n\n",
    };
    collect c = {0};
    lg_buf all = LG_BUF_INIT;
    sse_parser *p = sse_parser_new(0, on_event, &c);
    for (size_t i = 0; i < sizeof reads / sizeof *reads; i++) {
        assert_int_equal(sse_parser_feed(p, reads[i], strlen(reads[i])), 0);
        lg_buf_append_str(&all, reads[i]);
    }
    assert_int_equal(sse_parser_pending(p), 0);
    assert_string_equal(c.log.p, "|7|1|5|a\n|7|0|-1|b\n|7|0|-1|d\n|7|0|-1|e\n|7|0|-1|f\n"
                                 "|7|0|-1|g\nx|7|0|-1|h\n|7|0|-1|i\n");
    assert_string_equal(c.raws.p, all.p);
    sse_parser_free(p);
    lg_buf_free(&all);
    collect_free(&c);
}

/* A vouch that searches as the parser would, and counts what it was asked. */
static int vouch_asked;
static bool vouch_no_break(void *ud, const char *data, size_t len)
{
    (void)ud;
    vouch_asked++;
    return !memchr(data, '\n', len) && !memchr(data, '\r', len);
}

static int vouched_events;
static int on_vouched_event(void *ud, const sse_event *ev)
{
    vouched_events += ev->vouched;
    return on_event(ud, ev);
}

/* With a vouch, an idle parser's one-event reads are asked about and dispatched vouched;
 * every other read is parsed as without one, the same events with the same raws. */
static void test_vouch(void **state)
{
    (void)state;
    static const char *const reads[] = {
        "data: a\n\n",
        "data: b\n\ndata: c\n\n",
        "data: d\r\n\r\n",
        "data: e\nf: g\n\n",
        "data:h\n\n",
        "data: i",
        "\n\n",
        "data: j\n\n",
    };
    collect with = {0}, without = {0};
    sse_parser *p = sse_parser_new(0, on_vouched_event, &with);
    sse_parser *q = sse_parser_new(0, on_event, &without);
    sse_parser_vouch(p, vouch_no_break);
    for (size_t i = 0; i < sizeof reads / sizeof *reads; i++) {
        assert_int_equal(sse_parser_feed(p, reads[i], strlen(reads[i])), 0);
        assert_int_equal(sse_parser_feed(q, reads[i], strlen(reads[i])), 0);
    }
    assert_string_equal(with.log.p, without.log.p);
    assert_string_equal(with.raws.p, without.raws.p);
    assert_int_equal(with.n, 8);
    /* Not a (the first read settles the BOM), d (CR LF), "i" nor its end. */
    assert_int_equal(vouch_asked, 4);    /* b+c, e+g, h, j */
    assert_int_equal(vouched_events, 2); /* h, j */
    sse_parser_free(p);
    sse_parser_free(q);
    collect_free(&with);
    collect_free(&without);
}

/* Data may contain NUL bytes; data_len counts them. */
static void test_nul_in_data(void **state)
{
    (void)state;
    static const char in[] = "data: a\0b\n\n";
    collect c = {0};
    run_cuts(in, sizeof(in) - 1, NULL, 0, &c);
    assert_int_equal(c.n, 1);
    assert_int_equal(c.log.len, strlen("||0|-1|") + 4);
    assert_memory_equal(c.log.p + strlen("||0|-1|"), "a\0b\n", 4);
    collect_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_sample),
        cmocka_unit_test(test_every_split),
        cmocka_unit_test(test_byte_at_a_time),
        cmocka_unit_test(test_line_endings),
        cmocka_unit_test(test_cr_at_end_of_read),
        cmocka_unit_test(test_field_details),
        cmocka_unit_test(test_id_and_empty_blocks),
        cmocka_unit_test(test_bom_only_at_start),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_callback_stop),
        cmocka_unit_test(test_in_place_path),
        cmocka_unit_test(test_one_event_reads),
        cmocka_unit_test(test_nul_in_data),
        cmocka_unit_test(test_vouch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
