/* test_uplink.c — the HTTP/1.1 the worker speaks on its own upstream connections: the
 * request head is byte for byte what libcurl 7.88 writes for the same POST (captured from
 * its wire), the target is made only for the URLs the worker speaks for, the response's
 * lines reach the header callback as libcurl hands them at every split of the input (the
 * interim heads' and the trailers' too), the bytes after a head are left to the body, bad
 * status lines and oversized heads fail with libcurl's codes, and the framing and reuse
 * rules of RFC 9112 §6.3 hold (chunked wins over Content-Length, and then no reuse). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/uplink.h"

static uplink_target target_of(const char *url, bool *ok)
{
    uplink_target t = {0};
    CURLU *u = curl_url();
    assert_int_equal(
        curl_url_set(u, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME),
        CURLUE_OK);
    *ok = uplink_target_init(&t, u);
    curl_url_cleanup(u);
    return t;
}

static void test_request_as_libcurl(void **state)
{
    (void)state;
    bool ok;
    uplink_target t = target_of("http://127.0.0.1:45041/v1/chat/completions", &ok);
    assert_true(ok);
    assert_string_equal(t.origin, "127.0.0.1:45041");
    /* The exchange's list: forwarded headers (an empty one as "Name;"), then its own tail. */
    static char h[][48] = {"User-Agent: curl/7.88.1",
                           "X-Foo: bar",
                           "Empty;",
                           "Authorization: Bearer k",
                           "X-Forwarded-For: 127.0.0.1",
                           "Expect:",
                           "Content-Type: application/json",
                           "Accept: text/event-stream"};
    struct curl_slist l[8];
    for (int i = 0; i < 8; i++)
        l[i] = (struct curl_slist){h[i], i < 7 ? &l[i + 1] : NULL};
    assert_true(uplink_headers_plain(l));
    lg_buf out = LG_BUF_INIT;
    uplink_request_head(&out, &t, l, 152);
    assert_string_equal(out.p, "POST /v1/chat/completions HTTP/1.1\r\n"
                               "Host: 127.0.0.1:45041\r\n"
                               "User-Agent: curl/7.88.1\r\n"
                               "X-Foo: bar\r\n"
                               "Empty:\r\n"
                               "Authorization: Bearer k\r\n"
                               "X-Forwarded-For: 127.0.0.1\r\n"
                               "Content-Type: application/json\r\n"
                               "Accept: text/event-stream\r\n"
                               "Content-Length: 152\r\n\r\n");
    /* Without an Accept of its own, libcurl's default comes after Host. */
    lg_buf_reset(&out);
    l[6].next = NULL;
    uplink_request_head(&out, &t, &l[5], 0);
    assert_string_equal(out.p, "POST /v1/chat/completions HTTP/1.1\r\n"
                               "Host: 127.0.0.1:45041\r\n"
                               "Accept: */*\r\n"
                               "Content-Type: application/json\r\n"
                               "Content-Length: 0\r\n\r\n");
    lg_buf_free(&out);
    uplink_target_free(&t);
}

static void test_targets(void **state)
{
    (void)state;
    bool ok;
    uplink_target t = target_of("http://Example.com/a/b?x=1#frag", &ok);
    assert_true(ok);
    assert_string_equal(t.start, "POST /a/b?x=1 HTTP/1.1\r\nHost: Example.com\r\n");
    assert_string_equal(t.origin, "Example.com:80");
    uplink_target_free(&t);
    t = target_of("http://[::1]:8000/v1", &ok);
    assert_true(ok);
    assert_string_equal(t.start, "POST /v1 HTTP/1.1\r\nHost: [::1]:8000\r\n");
    uplink_target_free(&t);
    /* Not the worker's: TLS, user info (libcurl would send Authorization). */
    target_of("https://example.com/v1", &ok);
    assert_false(ok);
    target_of("http://u:p@example.com/v1", &ok);
    assert_false(ok);
    struct curl_slist host = {(char *)"Host: elsewhere", NULL};
    assert_false(uplink_headers_plain(&host));
    struct curl_slist cl = {(char *)"content-length: 3", NULL};
    assert_false(uplink_headers_plain(&cl));
}

/* The header callback's record: every line, joined with '|' after it. */
typedef struct seen {
    char lines[4096];
    size_t n;
    size_t refuse_at; /* the line number (from 1) refused, 0: none */
    size_t count;
} seen;

static size_t on_line(char *line, size_t size, size_t n, void *ud)
{
    seen *s = ud;
    s->count++;
    if (s->count == s->refuse_at) return 0;
    if (s->n + size * n + 2 > sizeof s->lines) return size * n; /* recorded up to here */
    memcpy(s->lines + s->n, line, size * n);
    s->n += size * n;
    s->lines[s->n++] = '|';
    s->lines[s->n] = '\0';
    return size * n;
}

/* Feeds `in` in pieces of `step` bytes; returns the offset where the final head ended
 * (bytes after it are the body's), or -1 on a failure (*rc). */
static long feed(uplink_resp *r, seen *s, bool trailers, const char *in, size_t step, CURLcode *rc)
{
    lg_buf line = LG_BUF_INIT;
    size_t n = strlen(in);
    char *copy = strdup(in);
    long end = -2;
    for (size_t at = 0; at < n && end == -2; at += step) {
        size_t k = n - at < step ? n - at : step;
        ssize_t took = uplink_head_take(r, &line, trailers, copy + at, k, on_line, s, rc);
        if (took < 0)
            end = -1;
        else if (r->done)
            end = (long)(at + (size_t)took);
    }
    free(copy);
    lg_buf_free(&line);
    return end;
}

static void test_lines_at_every_split(void **state)
{
    (void)state;
    const char *in = "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
                     "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n5\r\nhello";
    const char *want = "HTTP/1.1 103 Early Hints\r\n|Link: </a>\r\n|\r\n|"
                       "HTTP/1.1 200 OK\r\n|Content-Type: text/event-stream\r\n|"
                       "Transfer-Encoding: chunked\r\n|\r\n|";
    for (size_t step = 1; step <= strlen(in); step++) {
        uplink_resp r = {0};
        seen s = {0};
        CURLcode rc = CURLE_OK;
        assert_int_equal(feed(&r, &s, false, in, step, &rc), (long)(strlen(in) - 8));
        assert_string_equal(s.lines, want);
        assert_int_equal(r.status, 200);
        bool reuse;
        assert_int_equal(uplink_framing(&r, &reuse), UPLINK_CHUNKED);
        assert_true(reuse);
    }
}

static void test_trailers(void **state)
{
    (void)state;
    uplink_resp r = {0};
    seen s = {0};
    CURLcode rc;
    assert_int_equal(feed(&r, &s, true, "X-T: 1\r\n\r\nextra", 3, &rc), 10);
    assert_string_equal(s.lines, "X-T: 1\r\n|"); /* the fields, not the end (libcurl's way) */
}

static void test_framing_and_reuse(void **state)
{
    (void)state;
    static const struct {
        const char *head;
        int frame;
        bool reuse;
    } cases[] = {
        {"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", UPLINK_LENGTH, true},
        /* Chunked wins over Content-Length, and such a connection is not reused. */
        {"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nTransfer-Encoding: chunked\r\n\r\n",
         UPLINK_CHUNKED, false},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", UPLINK_CHUNKED, true},
        {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", UPLINK_CLOSE, false},
        /* Neither: until the close (HTTP/1.0, Python's http.server). */
        {"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n", UPLINK_CLOSE, false},
        {"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n", UPLINK_LENGTH, false},
        {"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 2\r\n\r\n",
         UPLINK_LENGTH, false},
        /* A list of one length is that length (RFC 9112 §6.3). */
        {"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\n", UPLINK_LENGTH,
         true},
        /* Chunked framing makes a bad length harmless, and no reuse. */
        {"HTTP/1.1 200 OK\r\nContent-Length: 2x\r\nTransfer-Encoding: chunked\r\n\r\n",
         UPLINK_CHUNKED, false},
        {"HTTP/1.1 204 No Content\r\n\r\n", UPLINK_NONE, true},
        {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n folded\r\n\r\n", UPLINK_LENGTH, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        uplink_resp r = {0};
        seen s = {0};
        CURLcode rc = CURLE_OK;
        bool reuse;
        assert_true(feed(&r, &s, false, cases[i].head, 1000, &rc) >= 0);
        assert_int_equal(uplink_framing(&r, &reuse), cases[i].frame);
        assert_int_equal(reuse, cases[i].reuse);
    }
}

static void test_failures(void **state)
{
    (void)state;
    static const char *bad[] = {"HELLO there\r\n\r\n", "HTTP/1.1 2x0 OK\r\n\r\n",
                                "HTTP/2 200\r\n\r\n", "HTTP/1.1 2000\r\n\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uplink_resp r = {0};
        seen s = {0};
        CURLcode rc = CURLE_OK;
        assert_int_equal(feed(&r, &s, false, bad[i], 3, &rc), -1);
        assert_int_equal(rc, CURLE_UNSUPPORTED_PROTOCOL);
    }
    /* Lines libcurl 7.88 calls a weird reply: a field line without a colon (a fold onto the
     * status line included), a NUL in a line, a negative or rubbish Content-Length; and a
     * head whose framing RFC 9112 §6.3 makes an unrecoverable error (a length with junk
     * after its digits, two that differ, a list of two), failed at its end. A fold onto a
     * field is taken. */
    static const struct {
        const char *head;
        size_t len;
    } weird[] = {{"HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n", 0},
                 {"HTTP/1.1 200 OK\r\n folded: onto the status line\r\nA\r\n\r\n", 0},
                 {"HTTP/1.1 200 OK\r\nA: a\0b\r\n\r\n", 27},
                 {"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", 0},
                 {"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", 0},
                 {"HTTP/1.1 200 OK\r\nContent-Length: 12abc\r\n\r\n", 0},
                 {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n", 0},
                 {"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\n", 0},
                 {"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n", 0}};
    for (size_t i = 0; i < sizeof weird / sizeof *weird; i++) {
        const char *h = weird[i].head;
        uplink_resp r = {0};
        seen s = {0};
        lg_buf line = LG_BUF_INIT;
        CURLcode rc = CURLE_OK;
        char buf[96];
        size_t n = weird[i].len ? weird[i].len : strlen(h);
        memcpy(buf, h, n);
        assert_int_equal(uplink_head_take(&r, &line, false, buf, n, on_line, &s, &rc), -1);
        assert_int_equal(rc, CURLE_WEIRD_SERVER_REPLY);
        lg_buf_free(&line);
    }
    {
        uplink_resp r = {0};
        seen s = {0};
        CURLcode rc = CURLE_OK;
        assert_int_equal(feed(&r, &s, false, "HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n", 5, &rc), 29);
        assert_true(r.done && r.folded);
    }
    /* A line past 100 KiB, and heads past UPLINK_HEAD_MAX of short lines. */
    size_t big = UPLINK_LINE_MAX + 10;
    char *in = malloc(big + 64);
    int k = snprintf(in, 64, "HTTP/1.1 200 OK\r\nX: ");
    memset(in + k, 'a', big);
    strcpy(in + k + big, "\r\n\r\n");
    uplink_resp r = {0};
    seen s = {0};
    CURLcode rc = CURLE_OK;
    assert_int_equal(feed(&r, &s, false, in, 4096, &rc), -1);
    assert_int_equal(rc, CURLE_OUT_OF_MEMORY);
    free(in);
    lg_buf many = LG_BUF_INIT;
    lg_buf_append_str(&many, "HTTP/1.1 200 OK\r\n");
    while (many.len <= UPLINK_HEAD_MAX)
        lg_buf_append_str(&many,
                          "X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
    lg_buf_append_str(&many, "\r\n");
    r = (uplink_resp){0};
    s = (seen){0};
    assert_int_equal(feed(&r, &s, false, many.p, 4096, &rc), -1);
    assert_int_equal(rc, CURLE_OUT_OF_MEMORY);
    lg_buf_free(&many);
    /* The header callback refusing a line: libcurl's CURLE_WRITE_ERROR. */
    r = (uplink_resp){0};
    s = (seen){.refuse_at = 2};
    assert_int_equal(feed(&r, &s, false, "HTTP/1.1 200 OK\r\nA: b\r\n\r\n", 100, &rc), -1);
    assert_int_equal(rc, CURLE_WRITE_ERROR);
    /* No whole line (libcurl's "empty reply") and some. */
    r = (uplink_resp){0};
    s = (seen){0};
    assert_int_equal(feed(&r, &s, false, "HTTP/1.1 200", 100, &rc), -2);
    assert_false(r.lines);
    r = (uplink_resp){0};
    assert_int_equal(feed(&r, &s, false, "HTTP/1.1 200 OK\r\nA: b\r\n", 100, &rc), -2);
    assert_true(r.lines);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_as_libcurl),   cmocka_unit_test(test_targets),
        cmocka_unit_test(test_lines_at_every_split), cmocka_unit_test(test_trailers),
        cmocka_unit_test(test_framing_and_reuse),    cmocka_unit_test(test_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
