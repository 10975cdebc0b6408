/* fuzz_httphead.c — libFuzzer target for the edge's request-head checks and the relay's
 * header rewriting (proxy/httphead.c, http_forward_header and http_xff in proxy/http.c).
 *
 * The input is read as a request head: the first line "METHOD TARGET VERSION", then one
 * field per line split at the first ':' with the value's surrounding blanks removed, as
 * libmicrohttpd hands them over (lines end at LF; a CR before it is dropped, any other CR
 * stays in the value). Properties checked (abort on violation):
 *  1. the verdict is 0, 400, 501 or 505, with a message and a code exactly when refused;
 *  2. an accepted head has token field names, no CR, LF or NUL in any value, one Host at
 *     most (exactly one in HTTP/1.1), one Content-Length at most and never with
 *     Transfer-Encoding; `chunked` is set exactly when Transfer-Encoding is present;
 *  3. of an accepted head, no header that frames or routes the message (Content-Length,
 *     Transfer-Encoding, TE, Connection, Host, Upgrade, Keep-Alive, Trailer, Expect,
 *     Proxy-Connection/-Authorization/-Authenticate, X-Forwarded-For) is ever forwarded, in either
 *     mode, and every forwarded line is free of CR, LF and NUL;
 *  4. an accepted path normalises to a path of pchar and '/', with no "." or ".." segment,
 *     no longer than the input, and normalising it again changes nothing;
 *  5. X-Forwarded-For is the client's list, ", ", then the peer, whatever the length.
 * The same input is also read as raw bytes from a client socket (hh_stream):
 *  6. the verdict does not depend on how the bytes are split into reads (whole, at a point
 *     the input picks, one byte at a time);
 *  7. the first head is refused exactly when a plain re-reading of it (ref_first_head:
 *     lines, not a state machine) finds a NUL, a field line starting with SP or HTAB, or
 *     framing other than one Content-Length of 1-18 digits or one "chunked". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/http.h"
#include "proxy/httphead.h"

#define MAX_FIELDS 64

static char *dupn(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) abort();
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static bool has_ctl(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0') return true;
    return false;
}

static bool is_named(const hh_field *f, const char *name)
{
    return f->name_len == strlen(name) && strncasecmp(f->name, name, f->name_len) == 0;
}

static void check_path(const char *target)
{
    char *p = NULL;
    if (hh_path_normalize(target, &p) != 0) return;
    size_t n = strlen(p);
    if (n > strlen(target) || p[0] != '/') abort();
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c <= 0x20 || c >= 0x7f || c == '#' || c == '?' || c == '\\') abort();
    }
    for (const char *s = p; (s = strchr(s, '/'));) {
        s++;
        size_t len = strcspn(s, "/");
        if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.')) abort();
    }
    char *q = NULL;
    if (hh_path_normalize(p, &q) != 0 || strcmp(p, q) != 0) abort();
    free(q);
    free(p);
}

static void check_forwarding(const hh_field *f, size_t n)
{
    static const char *const framing[] = {"content-length",
                                          "transfer-encoding",
                                          "te",
                                          "connection",
                                          "host",
                                          "upgrade",
                                          "keep-alive",
                                          "trailer",
                                          "expect",
                                          "x-forwarded-for",
                                          "proxy-connection",
                                          "proxy-authorization",
                                          "proxy-authenticate"};
    char *connection = NULL;
    for (size_t i = 0; i < n; i++)
        if (!connection && is_named(&f[i], "Connection")) /* the first, as MHD looks up */
            connection = dupn(f[i].value, f[i].value_len);
    for (size_t i = 0; i < n; i++) {
        char *name = dupn(f[i].name, f[i].name_len);
        for (int mode = 0; mode < 2; mode++) {
            if (!http_forward_header(name, connection, mode)) continue;
            for (size_t k = 0; k < sizeof framing / sizeof *framing; k++)
                if (strcasecmp(name, framing[k]) == 0) abort();
            if (has_ctl(f[i].name, f[i].name_len) || has_ctl(f[i].value, f[i].value_len)) abort();
        }
        free(name);
    }
    free(connection);
}

static void check_xff(const char *client, size_t n)
{
    char *c = dupn(client, n);
    char *x = http_xff(c, "192.0.2.1");
    if (!x) abort();
    size_t cl = strlen(c);
    if (cl) {
        if (strncmp(x, c, cl) != 0 || strcmp(x + cl, ", 192.0.2.1") != 0) abort();
    } else if (strcmp(x, "192.0.2.1") != 0) {
        abort();
    }
    free(x);
    free(c);
}

static bool ci_equal(const char *s, size_t n, const char *lit)
{
    return n == strlen(lit) && strncasecmp(s, lit, n) == 0;
}

/* Whether the first head in s[0..n) must be refused, judged line by line. */
static bool ref_first_head(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && (s[i] == '\n' || (s[i] == '\r' && i + 1 < n && s[i + 1] == '\n')))
        i += s[i] == '\n' ? 1 : 2; /* empty lines before the request line */
    bool bad = false, fbad = false;
    unsigned lengths = 0, codings = 0;
    for (size_t line = 0; i < n; line++) {
        const char *lf = memchr(s + i, '\n', n - i);
        size_t e = lf ? (size_t)(lf - s) : n, len = e - i;
        if (lf && len && s[e - 1] == '\r') len--;
        const char *l = s + i;
        if (line && lf && len == 0) /* the end of the head */
            return bad || fbad || lengths > 1 || codings > 1 || (lengths && codings);
        if (memchr(l, '\0', len) || (line && len && (l[0] == ' ' || l[0] == '\t'))) bad = true;
        const char *colon = line && lf ? memchr(l, ':', len) : NULL;
        if (colon) {
            const char *v = colon + 1, *ve = l + len;
            while (v < ve && (*v == ' ' || *v == '\t'))
                v++;
            size_t vn = (size_t)(ve - v);
            if (ci_equal(l, (size_t)(colon - l), "Content-Length")) {
                lengths++;
                fbad |= vn == 0 || vn > 18 || strspn(v, "0123456789") < vn;
            } else if (ci_equal(l, (size_t)(colon - l), "Transfer-Encoding")) {
                codings++;
                fbad |= !ci_equal(v, vn, "chunked");
            }
        }
        i = lf ? e + 1 : n;
    }
    return bad; /* the head is not complete: framing is not judged yet */
}

static void check_stream(const char *s, size_t n)
{
    hh_stream whole = {0}, two = {0}, bytes = {0};
    hh_stream_feed(&whole, s, n);
    size_t cut = n ? (unsigned char)s[n - 1] % (n + 1) : 0;
    hh_stream_feed(&two, s, cut);
    hh_stream_feed(&two, s + cut, n - cut);
    for (size_t i = 0; i < n; i++)
        hh_stream_feed(&bytes, s + i, 1);
    if (two.heads != whole.heads || two.refuse_from != whole.refuse_from) abort();
    if (bytes.heads != whole.heads || bytes.refuse_from != whole.refuse_from) abort();
    if (whole.refuse_from && (!whole.why || !whole.code)) abort();
    if ((whole.refuse_from == 1) != ref_first_head(s, n)) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
    check_stream((const char *)data, len);

    const char *s = (const char *)data, *end = s + len;
    const char *nl = memchr(s, '\n', len);
    const char *line_end = nl ? nl : end;
    /* Request line: three space-separated parts, each cut at a NUL as libmicrohttpd does. */
    char *line = dupn(s, (size_t)(line_end - s));
    char *sp1 = strchr(line, ' '), *sp2 = sp1 ? strrchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || sp2 == sp1) {
        free(line);
        return 0;
    }
    *sp1 = *sp2 = '\0';
    char *method = line, *target = sp1 + 1, *version = sp2 + 1;
    size_t vl = strlen(version);
    if (vl && version[vl - 1] == '\r') version[vl - 1] = '\0';

    hh_field f[MAX_FIELDS];
    size_t n = 0;
    for (const char *p = nl ? nl + 1 : end; p < end && n < MAX_FIELDS;) {
        const char *e = memchr(p, '\n', (size_t)(end - p));
        const char *le = e ? e : end;
        const char *lend = le > p && le[-1] == '\r' ? le - 1 : le;
        const char *colon = memchr(p, ':', (size_t)(lend - p));
        if (colon) {
            const char *v = colon + 1, *ve = lend;
            while (v < ve && (*v == ' ' || *v == '\t'))
                v++;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
                ve--;
            f[n++] = (hh_field){p, (size_t)(colon - p), v, (size_t)(ve - v)};
        }
        p = e ? e + 1 : end;
    }

    hh_request req = {method, target, version, f, n};
    hh_verdict v;
    int st = hh_check(&req, &v);
    if (st != v.status) abort();
    if (st != 0 && st != 400 && st != 501 && st != 505) abort();
    if ((st != 0) != (v.message != NULL) || (st != 0) != (v.code != NULL)) abort();
    if (st == 0) {
        unsigned hosts = 0, lengths = 0, tes = 0;
        for (size_t i = 0; i < n; i++) {
            if (f[i].name_len == 0 || has_ctl(f[i].value, f[i].value_len) ||
                has_ctl(f[i].name, f[i].name_len) || memchr(f[i].name, ' ', f[i].name_len))
                abort();
            hosts += is_named(&f[i], "Host");
            lengths += is_named(&f[i], "Content-Length");
            tes += is_named(&f[i], "Transfer-Encoding");
        }
        if (hosts > 1 || (strcmp(version, "HTTP/1.1") == 0 && hosts != 1)) abort();
        if (lengths > 1 || (lengths && tes) || v.chunked != (tes > 0)) abort();
        if (lengths != (v.content_length >= 0)) abort();
        check_forwarding(f, n);
        check_path(target);
    }
    for (size_t i = 0; i < n; i++)
        if (is_named(&f[i], "X-Forwarded-For")) check_xff(f[i].value, f[i].value_len);
    free(line);
    return 0;
}
