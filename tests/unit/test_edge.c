/* test_edge.c — unit tests for the edge's pure checks: the request-head verdicts
 * (proxy/httphead.c), path normalisation, constant-time secret comparison, the JSON body
 * guard (proxy/jsonguard.c), the header forwarding rule and X-Forwarded-For
 * (proxy/http.c) and the pass-through allow-list (proxy/edge.c). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "config/config.h"
#include "proxy/edge.h"
#include "proxy/http.h"
#include "proxy/httphead.h"
#include "proxy/jsonguard.h"

/* Judges a head given as "Name: value" strings (split at the first ':' exactly, so a
 * space before the colon stays in the name). */
static int judge(const char *version, const char *const *lines, size_t n, hh_verdict *v)
{
    hh_field f[16];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        const char *c = strchr(lines[i], ':');
        assert_non_null(c);
        const char *val = c + 1;
        while (*val == ' ')
            val++;
        f[i] = (hh_field){lines[i], (size_t)(c - lines[i]), val, strlen(val)};
    }
    hh_request req = {"POST", "/v1/x", version, f, n};
    return hh_check(&req, v);
}

#define JUDGE(ver, v, ...)                                                                         \
    judge(ver, (const char *const[]){__VA_ARGS__},                                                 \
          sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *), v)

static void test_head_accepts_plain_requests(void **state)
{
    (void)state;
    hh_verdict v;
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Content-Length: 12", "X-A: a\tb"), 0);
    assert_int_equal(v.content_length, 12);
    assert_false(v.chunked);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Transfer-Encoding: Chunked"), 0);
    assert_true(v.chunked);
    assert_int_equal(v.content_length, -1);
    assert_int_equal(JUDGE("HTTP/1.0", &v, "X-A: \xc3\xa9"), 0); /* obs-text, no Host */
    /* A field name holds exactly RFC 9110's tchar bytes. */
    for (int c = 1; c < 256; c++) {
        if (c == ':') continue;
        char line[8] = {'X', (char)c, ':', ' ', 'a', 0};
        bool tchar = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                     strchr("!#$%&'*+-.^_`|~", c);
        assert_int_equal(JUDGE("HTTP/1.0", &v, line), tchar ? 0 : 400);
    }
}

static void test_head_rejects_ambiguity(void **state)
{
    (void)state;
    hh_verdict v;
    /* finding 1: a bare CR inside a value */
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "X-A: a\rContent-Length: 0"), 400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "X-A: a\nb"), 400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "X-A: a\x7f"), 400);
    /* values are read eight bytes at a time: every byte at every offset of a 20-byte value
     * (in the first word, the second, the tail) */
    for (int c = 1; c < 256; c++)
        for (int at = 0; at < 20; at++) {
            char line[32] = "X-A: abcdefghijklmnopqrst";
            line[5 + at] = (char)c;
            bool bad = (c < 0x20 && c != '\t') || c == 0x7f;
            assert_int_equal(JUDGE("HTTP/1.0", &v, line), bad ? 400 : 0);
        }
    /* whitespace before the colon, a control byte or a folded line left in the name */
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Transfer-Encoding : chunked"), 400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", " X-A: a"), 400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x",
                           "X\x01"
                           "A: a"),
                     400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", ": a"), 400);
    /* finding 2 and the framing rules of RFC 9112 §6 */
    assert_int_equal(
        JUDGE("HTTP/1.1", &v, "Host: x", "Content-Length: 5", "Transfer-Encoding: chunked"), 400);
    assert_string_equal(v.code, "bad_framing");
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Transfer-Encoding: xchunked"), 501);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Transfer-Encoding: gzip, chunked"), 501);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Transfer-Encoding: chunked",
                           "Transfer-Encoding: chunked"),
                     400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Transfer-Encoding: chunked, chunked"), 400);
    assert_int_equal(JUDGE("HTTP/1.0", &v, "Transfer-Encoding: chunked"), 400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Content-Length: 3", "Content-Length: 5"),
                     400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Content-Length: 3", "Content-Length: 3"),
                     400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Content-Length: 1e3"), 400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Content-Length: 9999999999999999999"), 400);
    /* Host */
    assert_int_equal(JUDGE("HTTP/1.1", &v, "Host: x", "Host: y"), 400);
    assert_int_equal(JUDGE("HTTP/1.1", &v, "X-A: a"), 400);
    /* version */
    assert_int_equal(JUDGE("HTTP/1.2", &v, "Host: x"), 505);
    assert_int_equal(JUDGE("HTTP/2.0", &v, "Host: x"), 505);
}

static void expect_path(const char *in, const char *want)
{
    char *out = NULL;
    int rc = hh_path_normalize(in, &out);
    if (!want) {
        if (rc == 0) fail_msg("%s: accepted as %s", in, out);
        return;
    }
    if (rc != 0) fail_msg("%s: refused", in);
    assert_string_equal(out, want);
    free(out);
}

static void test_path_normalisation(void **state)
{
    (void)state;
    expect_path("/v1/chat/completions", "/v1/chat/completions");
    expect_path("/v1/chat/complet%69ons", "/v1/chat/completions");
    expect_path("/v1/models/a%20b%2Bc", "/v1/models/a%20b%2Bc");
    expect_path("/v1/models/org%7euser", "/v1/models/org~user");
    expect_path("/v1//models", "/v1//models");
    /* finding 5 and its encoded forms */
    expect_path("/x/../v1/chat/completions", NULL);
    expect_path("/x/%2e%2e/v1/chat/completions", NULL);
    expect_path("/x/.%2E/v1", NULL);
    expect_path("/./v1/models", NULL);
    expect_path("/v1/models/..", NULL);
    expect_path("/v1%2fchat%2Fcompletions", NULL);
    expect_path("/v1%5cchat", NULL);
    expect_path("/v1/x%00", NULL);
    expect_path("/v1/x%", NULL);
    expect_path("/v1/x%4", NULL);
    expect_path("/v1/x%zz", NULL);
    /* finding 6: targets libcurl would refuse or cut */
    expect_path("/a b", NULL);
    expect_path("/a\tb", NULL);
    expect_path("/a#frag", NULL);
    expect_path("/a\\b", NULL);
    expect_path("/caf\xc3\xa9", NULL);
    expect_path("http://evil/v1/models", NULL);
    expect_path("", NULL);
    /* dots inside a segment are ordinary */
    expect_path("/v1/models/qwen2.5", "/v1/models/qwen2.5");
    expect_path("/v1/models/...", "/v1/models/...");
    /* RFC 3986's pchar and '/', byte by byte (a table) */
    for (int c = 1; c < 256; c++) {
        if (c == '%') continue;
        char in[8] = {'/', 'a', (char)c, 'b', 0};
        bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  strchr("-._~!$&'()*+,;=:@/", c);
        expect_path(in, ok ? in : NULL);
    }
    assert_true(hh_query_piece_ok("a%20b", 5));
    assert_false(hh_query_piece_ok("a b", 3));
    assert_false(hh_query_piece_ok("a#", 2));
    assert_false(hh_query_piece_ok("a\r", 2));
}

/* Feeds `wire` (n bytes) to a fresh tracker whole, then again one byte per call and split
 * at every point: the verdict must not depend on how the reads fall. Returns the whole
 * feed's state. */
static hh_stream stream_of(const char *wire, size_t n)
{
    hh_stream whole = {0};
    hh_stream_feed(&whole, wire, n);
    hh_stream bytes = {0};
    for (size_t i = 0; i < n; i++)
        hh_stream_feed(&bytes, wire + i, 1);
    assert_int_equal(bytes.heads, whole.heads);
    assert_int_equal(bytes.refuse_from, whole.refuse_from);
    for (size_t cut = 1; cut < n; cut++) {
        hh_stream two = {0};
        hh_stream_feed(&two, wire, cut);
        hh_stream_feed(&two, wire + cut, n - cut);
        assert_int_equal(two.heads, whole.heads);
        assert_int_equal(two.refuse_from, whole.refuse_from);
    }
    return whole;
}

#define STREAM(lit) stream_of(lit, sizeof(lit) - 1)
#define REQ         "GET / HTTP/1.1\r\nHost: x\r\n\r\n"

static void test_stream_frames_like_libmicrohttpd(void **state)
{
    (void)state;
    /* Clean pipelines: every head counted, none refused; bodies are skipped whatever they
     * hold (NUL, a CRLF followed by a blank). */
    hh_stream s = STREAM("\r\n\n" REQ "POST / HTTP/1.1\r\nHost: x\r\ncontent-LENGTH:  5\r\n\r\n"
                         "\0\r\n x" REQ);
    assert_int_equal(s.heads, 3);
    assert_int_equal(s.refuse_from, 0);
    s = STREAM("POST / HTTP/1.1\nHost: x\nTransfer-Encoding: CHUNKED\n\n"
               "5;ext=\"a\0\"\r\n\0\r\n x\r\n00a\n0123456789\n0\r\nX-T: t\r\n\r\n" REQ);
    assert_int_equal(s.heads, 2);
    assert_int_equal(s.refuse_from, 0);
    /* A bare CR inside a line is content, not a line end (hh_check refuses it by value). */
    s = STREAM("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\r\n\r\n" REQ);
    assert_int_equal(s.heads, 2);
    assert_int_equal(s.refuse_from, 0);
}

static void test_stream_refuses_hidden_bytes(void **state)
{
    (void)state;
    hh_stream s = STREAM(REQ "GET / HTTP/1.1\r\nHost: x\r\nX-A: one\r\n two\r\n\r\n" REQ);
    assert_int_equal(s.refuse_from, 2);
    assert_string_equal(s.code, "bad_header");
    assert_int_equal(STREAM("GET / HTTP/1.1\r\n\tHost: x\r\n\r\n").refuse_from, 1);
    assert_int_equal(STREAM("GET / HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n").refuse_from, 1);
    assert_int_equal(STREAM("GET /\0/x HTTP/1.1\r\nHost: x\r\n\r\n").refuse_from, 1);
    assert_int_equal(STREAM(REQ "\0\r\n" REQ).refuse_from, 2);
    assert_int_equal(STREAM("GET / HTTP/1.1\r\nHost: x\r\n\0X: y\r\n\r\n").refuse_from, 1);
    /* Hidden bytes in a trailer, or chunk framing libmicrohttpd refuses: the next head. */
    s = STREAM("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               "0\r\n\0X: y\r\n\r\n" REQ);
    assert_int_equal(s.refuse_from, 2);
    assert_int_equal(STREAM("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                            "2\r\nabX\r\n" REQ)
                         .refuse_from,
                     2);
    for (size_t i = 0; i < 6; i++) {
        static const char *const bad_sizes[] = {";x\r\n",  "\r\n",   "5 \r\n",
                                                "5\r\r\n", "-1\r\n", "11111111111111111\r\n"};
        char wire[256];
        int n = snprintf(wire, sizeof wire,
                         "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%s",
                         bad_sizes[i]);
        hh_stream b = {0};
        hh_stream_feed(&b, wire, (size_t)n);
        assert_int_equal(b.refuse_from, 2);
    }
    /* Framing hh_check lets through but libmicrohttpd reads otherwise: that head. */
    assert_int_equal(
        STREAM("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked \r\n\r\n").refuse_from, 1);
    assert_int_equal(STREAM("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5 \r\n\r\n").refuse_from,
                     1);
    assert_int_equal(STREAM("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n")
                         .refuse_from,
                     1);
    /* The first refusal stands: a later one never moves it. */
    s = STREAM(REQ "GET / HTTP/1.1\r\nHost: x\r\nX: \0\r\n\r\nGET / HTTP/1.1\r\n x\r\n\r\n");
    assert_int_equal(s.refuse_from, 2);
}

static void test_addr_key_ipv6_per_64(void **state)
{
    (void)state;
    struct sockaddr_in6 a = {.sin6_family = AF_INET6}, b = a;
    unsigned char ka[8], kb[8];
    inet_pton(AF_INET6, "2001:db8:1:2:aaaa::1", &a.sin6_addr);
    inet_pton(AF_INET6, "2001:db8:1:2:ffff:1:2:3", &b.sin6_addr);
    assert_int_equal(edge_addr_key((struct sockaddr *)&a, ka), 8);
    assert_int_equal(edge_addr_key((struct sockaddr *)&b, kb), 8);
    assert_memory_equal(ka, kb, 8); /* one /64, one count */
    inet_pton(AF_INET6, "2001:db8:1:3::1", &b.sin6_addr);
    edge_addr_key((struct sockaddr *)&b, kb);
    assert_memory_not_equal(ka, kb, 8); /* the next /64 is another client */
    /* An IPv4-mapped address counts as its IPv4 address, not as the ::ffff:0:0/96 prefix
     * every IPv4 client of a dual-stack socket shares. */
    struct sockaddr_in v4 = {.sin_family = AF_INET};
    inet_pton(AF_INET, "192.0.2.7", &v4.sin_addr);
    inet_pton(AF_INET6, "::ffff:192.0.2.7", &a.sin6_addr);
    inet_pton(AF_INET6, "::ffff:192.0.2.8", &b.sin6_addr);
    unsigned char k4[8];
    assert_int_equal(edge_addr_key((struct sockaddr *)&v4, k4), 4);
    assert_int_equal(edge_addr_key((struct sockaddr *)&a, ka), 4);
    assert_memory_equal(ka, k4, 4);
    edge_addr_key((struct sockaddr *)&b, kb);
    assert_memory_not_equal(ka, kb, 4);
    struct sockaddr un = {.sa_family = AF_UNIX};
    assert_int_equal(edge_addr_key(&un, ka), 0);
}

static void test_secret_equal(void **state)
{
    (void)state;
    assert_true(hh_secret_equal("sk-abc", "sk-abc"));
    assert_false(hh_secret_equal("sk-abd", "sk-abc"));
    assert_false(hh_secret_equal("sk-ab", "sk-abc"));
    assert_false(hh_secret_equal("sk-abcd", "sk-abc"));
    assert_false(hh_secret_equal("", "sk-abc"));
    assert_false(hh_secret_equal("sk-abc", ""));
    assert_true(hh_secret_equal("", ""));
    assert_false(hh_secret_equal(NULL, "x"));
    assert_false(hh_secret_equal("x", NULL));
}

static int guard_json(const char *s, size_t nodes, unsigned depth, char *err)
{
    jg_limits lim = {nodes, depth};
    return jsonguard_check(s, strlen(s), &lim, err, 200);
}

static void test_jsonguard_accepts_json(void **state)
{
    (void)state;
    char err[200];
    const char *ok[] = {
        "{}",
        " [] ",
        "0",
        "-0.5e+3",
        "\"x\"",
        "true",
        "null",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi \\u00e9 "
        "\\ud83d\\ude00\"}],\"stream\":true}",
        "{\"a\":{\"a\":1},\"b\":{\"a\":2}}", /* the same key in different objects */
        "[{\"a\":1},{\"a\":1}]",
        "{\"a\":1,\"A\":2}",
        "{\"\\u00e9\":1,\"\\u00c9\":2}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (guard_json(ok[i], 1000, 64, err)) fail_msg("%s: %s", ok[i], err);
}

static void test_jsonguard_rejects(void **state)
{
    (void)state;
    char err[200];
    /* finding 3 and the low item: duplicates, also when only the unescaped keys match */
    assert_int_equal(guard_json("{\"stream\":true,\"x\":1,\"stream\":false}", 1000, 64, err), -1);
    assert_non_null(strstr(err, "duplicate key \"stream\""));
    assert_int_equal(guard_json("{\"messages\":[],\"m\\u0065ssages\":[]}", 1000, 64, err), -1);
    assert_int_equal(guard_json("{\"a\":{\"b\":1,\"b\":2}}", 1000, 64, err), -1);
    /* a key without an escape is compared in the body, one with an escape unescaped in
     * the arena, in either order; and among arena keys after the arena has grown */
    assert_int_equal(guard_json("{\"m\\u0065ssages\":[],\"messages\":[]}", 1000, 64, err), -1);
    assert_non_null(strstr(err, "duplicate key \"messages\""));
    assert_int_equal(
        guard_json("{\"\\u0061_long_key_1\":1,\"\\u0061_long_key_2\":2,\"\\u0061_long_key_3\":3,"
                   "\"\\u0061_long_key_4\":4,\"\\u0061_long_key_5\":5,\"a_long_key_\\u0032\":6}",
                   1000, 64, err),
        -1);
    assert_non_null(strstr(err, "duplicate key \"a_long_key_2\""));
    /* strings are read eight bytes at a time: what ends a run in a word and in the tail */
    if (guard_json("[\"0123456789abcdef\\\"0123456789\",\"0123456789\\\\x\",\"caf\xc3\xa9\x7f~\"]",
                   1000, 64, err))
        fail_msg("%s", err);
    assert_int_equal(guard_json("\"0123456789abcdef\x01xyz\"", 1000, 64, err), -1);
    assert_int_equal(guard_json("\"01234567\x1f\"", 1000, 64, err), -1);
    assert_int_equal(guard_json("{\"0123456789\x02\":1}", 1000, 64, err), -1);
    assert_int_equal(guard_json("\"0123456789abcdef", 1000, 64, err), -1);
    /* trailing garbage, strict grammar */
    const char *bad[] = {
        "{} x",        "{}{}",         "[1,]",        "{\"a\":1,}", "{'a':1}",   "01",
        "1.",          ".5",           "+1",          "tru",        "\"a\x01\"", "\"\\x\"",
        "\"\\ud800\"", "\"\\udc00x\"", "\"\\u0000\"", "{\"a\" 1}",  "",          "   ",
        "[",           "{\"a\":",      "\"abc",       "nul",        "[1 2]",     "{1:2}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (guard_json(bad[i], 1000, 64, err) == 0) fail_msg("accepted: %s", bad[i]);
    /* budgets */
    if (guard_json("[0,0,0,0]", 5, 64, err)) fail_msg("%s", err);
    assert_int_equal(guard_json("[0,0,0,0,0]", 5, 64, err), -1);
    assert_non_null(strstr(err, "max_json_nodes"));
    assert_int_equal(guard_json("[[[1]]]", 100, 3, err), 0);
    assert_int_equal(guard_json("[[[[1]]]]", 100, 3, err), -1);
    assert_non_null(strstr(err, "max_json_depth"));
    assert_int_equal(guard_json("{\"a\":{\"b\":{}}}", 100, 3, err), 0);
}

/* Many duplicate keys cost linear time: 200,000 keys in one object, all distinct but one
 * repeated at the end. */
static void test_jsonguard_linear(void **state)
{
    (void)state;
    size_t n = 200000;
    char *s = malloc(n * 16 + 64), *p = s;
    p += sprintf(p, "{");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "\"k%zu\":0,", i);
    p += sprintf(p, "\"k7\":1}");
    char err[200];
    jg_limits lim = {n + 10, 8};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(jsonguard_check(s, (size_t)(p - s), &lim, err, sizeof err), -1);
    clock_gettime(CLOCK_MONOTONIC, &b);
    assert_non_null(strstr(err, "duplicate key \"k7\""));
    print_message("    %zu keys checked in %.1f ms\n", n,
                  (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6);
    free(s);
}

/* The upstream's response head, line by line as libcurl hands it over, then applied to a
 * client response: the last head's end-to-end fields, in one block (a long one grows it; a
 * name holding a NUL reads as the name before it). */
static void test_response_head(void **state)
{
    (void)state;
    char long_value[301];
    memset(long_value, 'v', 300);
    long_value[300] = '\0';
    char long_line[320];
    snprintf(long_line, sizeof long_line, "X-Long: %s\r\n", long_value);
    const char *lines[] = {"HTTP/1.1 100 Continue\r\n",
                           "X-Interim: 1\r\n",
                           "\r\n",
                           "HTTP/1.1 200 OK\r\n",
                           "date: Sun, 06 Dec 2026 12:00:00 GMT\r\n",
                           "Connection: keep-alive, X-Drop\r\n",
                           "X-Drop: z\r\n",
                           "Content-Length: 12\r\n",
                           "content-type: text/event-stream\r\n",
                           long_line,
                           "Transfer-Encoding: chunked\r\n",
                           "Keep-Alive: timeout=5\r\n",
                           "X-Empty:\r\n",
                           "X-Id:  abc \t\r\n",
                           "\r\n"};
    http_head h = {.content_length = -1};
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        assert_false(h.complete);
        if (i == 12) http_head_line(&h, "X-N\0ul: n\r\n", 11); /* fields follow it */
        http_head_line(&h, lines[i], strlen(lines[i]));
    }
    assert_true(h.complete);
    assert_int_equal(h.status, 200);
    assert_int_equal(h.content_length, 12);
    assert_true(h.chunked);
    assert_string_equal(h.content_type, "text/event-stream");
    assert_int_equal(h.n, 11);
    for (int own = 0; own < 2; own++) {
        struct MHD_Response *r =
            MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        http_head_apply(&h, r, own);
        assert_string_equal(MHD_get_response_header(r, "Date"), "Sun, 06 Dec 2026 12:00:00 GMT");
        assert_string_equal(MHD_get_response_header(r, "X-Long"), long_value);
        assert_string_equal(MHD_get_response_header(r, "X-Id"), "abc");
        assert_string_equal(MHD_get_response_header(r, "X-N"), "n");
        if (own)
            assert_null(MHD_get_response_header(r, "Content-Type"));
        else
            assert_string_equal(MHD_get_response_header(r, "Content-Type"), "text/event-stream");
        const char *gone[] = {"X-Interim",      "Connection",        "X-Drop",
                              "Content-Length", "Transfer-Encoding", "Keep-Alive"};
        for (size_t i = 0; i < sizeof gone / sizeof *gone; i++)
            if (MHD_get_response_header(r, gone[i])) fail_msg("%s forwarded", gone[i]);
        MHD_destroy_response(r);
    }
    http_head_drop_fields(&h); /* the status, framing and type stay */
    assert_int_equal(h.n, 0);
    assert_string_equal(h.content_type, "text/event-stream");
    assert_true(h.complete && h.chunked);
    http_head_clear(&h);
    assert_int_equal(h.content_length, -1);
    assert_null(h.content_type);
    /* Fields past HTTP_HEAD_FIELDS_MAX: too_big, and what was kept stays within the bound. */
    char big[1100];
    snprintf(big, sizeof big, "X-Big: %01000d\r\n", 0);
    http_head_line(&h, "HTTP/1.1 200 OK\r\n", 17);
    for (size_t i = 0; i < HTTP_HEAD_FIELDS_MAX / 1000; i++) {
        http_head_line(&h, big, strlen(big));
        assert_false(h.too_big);
    }
    http_head_line(&h, big, strlen(big));
    assert_true(h.too_big);
    assert_int_equal(h.n, HTTP_HEAD_FIELDS_MAX / 1000);
    http_head_line(&h, "HTTP/1.1 200 OK\r\n", 17); /* a new head starts clean */
    assert_false(h.too_big);
    http_head_clear(&h);
}

static void test_forward_headers(void **state)
{
    (void)state;
    const char *never[] = {"Content-Length", "transfer-encoding", "TE",
                           "Connection",     "Keep-Alive",        "Upgrade",
                           "Trailer",        "Proxy-Connection",  "Host",
                           "Expect",         "X-Forwarded-For",   "Proxy-Authorization"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++) {
        assert_false(http_forward_header(never[i], NULL, false));
        assert_false(http_forward_header(never[i], NULL, true));
    }
    assert_true(http_forward_header("Authorization", NULL, false));
    assert_true(http_forward_header("X-Custom", NULL, false));
    assert_false(http_forward_header("X-Custom", "close, x-custom", false));
    assert_true(http_forward_header("Content-Type", NULL, false));
    assert_false(http_forward_header("Content-Type", NULL, true));
    assert_true(http_forward_header("Accept", NULL, false));
    assert_false(http_forward_header("accept", NULL, true)); /* an exchange writes its own */
    assert_false(http_forward_header("X-Loopguard-Reasoning", NULL, true));
}

static void test_xff_any_length(void **state)
{
    (void)state;
    char *x = http_xff(NULL, "10.0.0.1");
    assert_string_equal(x, "10.0.0.1");
    free(x);
    x = http_xff("1.1.1.1, 2.2.2.2", "10.0.0.1");
    assert_string_equal(x, "1.1.1.1, 2.2.2.2, 10.0.0.1");
    free(x);
    assert_null(http_xff(NULL, ""));
    /* the low item: 1,023 bytes used to be the end, and the client then chose the last hop */
    char *big = malloc(5001);
    memset(big, '1', 5000);
    big[5000] = '\0';
    x = http_xff(big, "10.0.0.1");
    assert_int_equal(strlen(x), 5000 + 2 + 8);
    assert_string_equal(x + 5002, "10.0.0.1");
    free(x);
    free(big);
}

static void test_passthrough_allow_list(void **state)
{
    (void)state;
    lg_config *cfg = config_new_defaults();
    assert_true(edge_passthrough_allowed(cfg, "GET", "/v1/models"));
    assert_true(edge_passthrough_allowed(cfg, "HEAD", "/v1/models"));
    assert_true(edge_passthrough_allowed(cfg, "GET", "/v1/models/qwen"));
    assert_true(edge_passthrough_allowed(cfg, "POST", "/v1/embeddings"));
    assert_true(edge_passthrough_allowed(cfg, "POST", "/v1/messages"));
    assert_true(edge_passthrough_allowed(cfg, "GET", "/get_model_info"));
    assert_false(edge_passthrough_allowed(cfg, "POST", "/v1/models"));
    assert_false(edge_passthrough_allowed(cfg, "GET", "/v1/embeddings"));
    /* finding 9: control routes stay closed */
    const char *closed[] = {"/abort_request",
                            "/flush_cache",
                            "/update_weights_from_disk",
                            "/start_profile",
                            "/stop_profile",
                            "/v1/load_lora_adapter",
                            "/v1/unload_lora_adapter",
                            "/reset_prefix_cache",
                            "/sleep",
                            "/wake_up",
                            "/generate",
                            "/_fake/echo"};
    for (size_t i = 0; i < sizeof closed / sizeof *closed; i++) {
        assert_false(edge_passthrough_allowed(cfg, "POST", closed[i]));
        assert_false(edge_passthrough_allowed(cfg, "GET", closed[i]));
    }
    char err[256];
    assert_int_equal(
        config_load_string(cfg, "{\"passthrough\":{\"allow\":[\"/generate\",\"/_fake/*\"]}}", err,
                           sizeof err),
        0);
    assert_true(edge_passthrough_allowed(cfg, "POST", "/generate"));
    assert_true(edge_passthrough_allowed(cfg, "PUT", "/_fake/echo"));
    assert_false(edge_passthrough_allowed(cfg, "POST", "/generatex"));
    assert_int_equal(
        config_load_string(cfg, "{\"passthrough\":{\"allow\":[\"generate\"]}}", err, sizeof err),
        -1);
    assert_non_null(strstr(err, "passthrough.allow[0]"));
    assert_int_equal(config_load_string(cfg,
                                        "{\"limits\":{\"max_conns_per_ip\":4,"
                                        "\"header_timeout_ms\":500}}",
                                        err, sizeof err),
                     0);
    assert_int_equal(cfg->limits.max_conns_per_ip, 4);
    assert_int_equal(cfg->limits.header_timeout_ms, 500);
    assert_int_equal(
        config_load_string(cfg, "{\"limits\":{\"max_json_depth\":1}}", err, sizeof err), -1);
    assert_true(edge_route_match("*", "/anything"));
    config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_accepts_plain_requests),
        cmocka_unit_test(test_head_rejects_ambiguity),
        cmocka_unit_test(test_path_normalisation),
        cmocka_unit_test(test_stream_frames_like_libmicrohttpd),
        cmocka_unit_test(test_stream_refuses_hidden_bytes),
        cmocka_unit_test(test_addr_key_ipv6_per_64),
        cmocka_unit_test(test_secret_equal),
        cmocka_unit_test(test_jsonguard_accepts_json),
        cmocka_unit_test(test_jsonguard_rejects),
        cmocka_unit_test(test_jsonguard_linear),
        cmocka_unit_test(test_response_head),
        cmocka_unit_test(test_forward_headers),
        cmocka_unit_test(test_xff_any_length),
        cmocka_unit_test(test_passthrough_allow_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
