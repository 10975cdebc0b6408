/* uplink.c — see uplink.h. */
#include "proxy/uplink.h"

#include <string.h>
#include <strings.h>

#include "proxy/httphead.h"
#include "proxy/xalloc.h"

bool uplink_target_init(uplink_target *t, CURLU *url)
{
    char *scheme = NULL, *user = NULL, *pass = NULL, *host = NULL, *port = NULL, *path = NULL,
         *query = NULL;
    bool ok = url && curl_url_get(url, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
              strcmp(scheme, "http") == 0 &&
              curl_url_get(url, CURLUPART_USER, &user, 0) == CURLUE_NO_USER &&
              curl_url_get(url, CURLUPART_PASSWORD, &pass, 0) == CURLUE_NO_PASSWORD &&
              curl_url_get(url, CURLUPART_HOST, &host, 0) == CURLUE_OK && !strchr(host, '%') &&
              curl_url_get(url, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK &&
              curl_url_get(url, CURLUPART_PATH, &path, 0) == CURLUE_OK;
    if (ok) {
        (void)curl_url_get(url, CURLUPART_QUERY, &query, 0);
        lg_buf b = LG_BUF_INIT;
        lg_buf_append_str(&b, "POST ");
        lg_buf_append_str(&b, path);
        if (query) {
            lg_buf_append_str(&b, "?");
            lg_buf_append_str(&b, query);
        }
        lg_buf_append_str(&b, " HTTP/1.1\r\nHost: ");
        lg_buf_append_str(&b, host);
        if (strcmp(port, "80") != 0) { /* libcurl names the port unless it is the default */
            lg_buf_append_str(&b, ":");
            lg_buf_append_str(&b, port);
        }
        lg_buf_append_str(&b, "\r\n");
        t->start_len = b.len;
        t->start = lg_buf_steal(&b);
        lg_buf_append_str(&b, host);
        lg_buf_append_str(&b, ":");
        lg_buf_append_str(&b, port);
        t->origin = lg_buf_steal(&b);
    }
    curl_free(scheme), curl_free(user), curl_free(pass), curl_free(host);
    curl_free(port), curl_free(path), curl_free(query);
    return ok;
}

void uplink_target_free(uplink_target *t)
{
    lg_xfree(t->start);
    lg_xfree(t->origin);
    *t = (uplink_target){0};
}

/* Whether line begins with the lower-case field name `name` and its colon. */
static bool field_is(const char *line, const char *name, size_t n)
{
    return strncasecmp(line, name, n) == 0 && line[n] == ':';
}

bool uplink_headers_plain(const struct curl_slist *h)
{
    for (; h; h = h->next)
        if (field_is(h->data, "host", 4) || field_is(h->data, "content-length", 14) ||
            field_is(h->data, "transfer-encoding", 17))
            return false;
    return true;
}

void uplink_request_head(lg_buf *out, const uplink_target *t, const struct curl_slist *headers,
                         size_t body_len)
{
    bool accept = false;
    for (const struct curl_slist *h = headers; h && !accept; h = h->next)
        accept = (h->data[0] | 0x20) == 'a' && field_is(h->data, "accept", 6);
    lg_buf_append(out, t->start, t->start_len);
    if (!accept) lg_buf_append(out, "Accept: */*\r\n", 13);
    for (const struct curl_slist *h = headers; h; h = h->next) {
        const char *line = h->data, *colon = strchr(line, ':');
        size_t len = strlen(line);
        if (colon) {
            const char *v = colon + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            if (!*v) continue; /* "Name:": libcurl's way to remove a header */
            lg_buf_append(out, line, len);
        } else if (len && line[len - 1] == ';') { /* "Name;": sent with an empty value */
            lg_buf_append(out, line, len - 1);
            lg_buf_append(out, ":", 1);
        } else {
            continue; /* libcurl ignores a line with neither */
        }
        lg_buf_append(out, "\r\n", 2);
    }
    char num[24], *e = num + sizeof num, *d = e;
    do {
        *--d = (char)('0' + body_len % 10);
        body_len /= 10;
    } while (body_len);
    lg_buf_append(out, "Content-Length: ", 16);
    lg_buf_append(out, d, (size_t)(e - d));
    lg_buf_append(out, "\r\n\r\n", 4);
}

/* "HTTP/1.x NNN" followed by a space or the line's end. */
static bool status_line(uplink_resp *r, const char *p, size_t n)
{
    if (n < 12 || memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') || p[8] != ' ')
        return false;
    unsigned s = 0;
    for (int i = 9; i < 12; i++) {
        if (p[i] < '0' || p[i] > '9') return false;
        s = s * 10 + (unsigned)(p[i] - '0');
    }
    if (n > 12 && p[12] != ' ' && p[12] != '\r' && p[12] != '\n') return false;
    r->status = (uint16_t)s;
    r->http10 = p[7] == '0';
    return true;
}

/* The value of a field line p[0..n) after its colon at c, without surrounding white space. */
static void field_value(const char *p, size_t n, const char *c, const char **v, size_t *vn)
{
    const char *s = c + 1, *e = p + n;
    while (s < e && (*s == ' ' || *s == '\t'))
        s++;
    while (e > s && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ' || e[-1] == '\t'))
        e--;
    *v = s;
    *vn = (size_t)(e - s);
}

/* A Content-Length value v[0..vn): one length, or a comma-separated list of the same length
 * (RFC 9112 §6.3: a list of equal valid values is that value; an empty element may end it).
 * Anything else, or a length other than one an earlier field gave, sets bad_len. */
static void length_list(uplink_resp *r, const char *v, size_t vn)
{
    const char *p = v, *e = v + vn;
    for (;;) {
        const char *q = memchr(p, ',', (size_t)(e - p)), *s = p, *t = q ? q : e;
        while (s < t && (*s == ' ' || *s == '\t'))
            s++;
        while (t > s && (t[-1] == ' ' || t[-1] == '\t'))
            t--;
        long long len = 0;
        if (s == t ? q != NULL
                   : !hh_parse_length(s, (size_t)(t - s), &len) ||
                         (r->has_len && r->len != (uint64_t)len)) {
            r->bad_len = true;
            return;
        }
        if (s < t) r->has_len = true, r->len = (uint64_t)len;
        if (!q) return;
        p = q + 1;
    }
}

/* A field line of a head: what framing and reuse need of it. False for a line libcurl 7.88
 * refuses (CURLE_WEIRD_SERVER_REPLY): no colon, unless it folds onto a field line before it
 * ("Header without colon"), or a Content-Length that does not begin with a digit (negative
 * or rubbish: "Invalid Content-Length"). Any other invalid Content-Length, or two that
 * differ, is kept as bad_len: the head's end fails on it (length_invalid). */
static bool field_line(uplink_resp *r, const char *p, size_t n)
{
    if ((p[0] == ' ' || p[0] == '\t') && r->fields) {
        r->folded = true;
        return true;
    }
    const char *c = memchr(p, ':', n), *v;
    size_t vn;
    if (!c) return false;
    r->fields = true;
    size_t name = (size_t)(c - p);
    field_value(p, n, c, &v, &vn);
    if (name == 17 && strncasecmp(p, "transfer-encoding", 17) == 0) {
        r->te = true;
        r->chunked = hh_list_has(v, vn, "chunked", true);
    } else if (name == 14 && strncasecmp(p, "content-length", 14) == 0) {
        if (!vn || v[0] < '0' || v[0] > '9') return false; /* "Invalid Content-Length" */
        length_list(r, v, vn);
    } else if (name == 10 && strncasecmp(p, "connection", 10) == 0) {
        if (hh_list_has(v, vn, "close", false)) r->close = true;
    }
    return true;
}

/* At the end of a head: true if its body's framing is invalid, which RFC 9112 §6.3 makes an
 * unrecoverable error (a proxy closes the connection and answers 502): a final answer
 * that has a body, no Transfer-Encoding, and an invalid Content-Length or two that differ.
 * libcurl 7.88 would take a length from it; the relay refuses a client's the same way. */
static bool length_invalid(const uplink_resp *r)
{
    bool bodiless = r->status < 200 || r->status == 204 || r->status == 304;
    return r->bad_len && !r->te && !bodiless;
}

/* One complete line p[0..n) (with its LF): parsed, then handed to fn. Returns false with *rc
 * on a failure; sets *ends when the line ends a head. */
static bool take_line(uplink_resp *r, bool trailers, char *p, size_t n, uplink_line_fn fn, void *ud,
                      bool *ends, CURLcode *rc)
{
    *ends = p[0] == '\r' || p[0] == '\n';
    if (!trailers && memchr(p, '\0', n)) { /* libcurl 7.88: "Nul byte in header" */
        *rc = CURLE_WEIRD_SERVER_REPLY;
        return false;
    }
    if (!trailers && !r->started) {
        if (!status_line(r, p, n)) {
            *rc = CURLE_UNSUPPORTED_PROTOCOL;
            return false;
        }
        r->started = true;
        *ends = false;
    } else if (!trailers && ((!*ends && !field_line(r, p, n)) || (*ends && length_invalid(r)))) {
        *rc = CURLE_WEIRD_SERVER_REPLY;
        return false;
    }
    r->lines = true;
    if (trailers && *ends) return true; /* libcurl hands trailer fields only, not the end */
    if (fn(p, 1, n, ud) != n) {
        *rc = CURLE_WRITE_ERROR;
        return false;
    }
    return true;
}

/* A head ended: the final one (done), or an interim one, after which the next begins. */
static void head_ended(uplink_resp *r)
{
    if (r->status >= 100 && r->status < 200 && r->status != 101) {
        *r = (uplink_resp){.bytes = r->bytes, .lines = true};
        return;
    }
    r->done = true;
}

ssize_t uplink_head_take(uplink_resp *r, lg_buf *line, bool trailers, char *p, size_t n,
                         uplink_line_fn fn, void *ud, CURLcode *rc)
{
    size_t at = 0;
    while (at < n && !r->done) {
        const char *lf = memchr(p + at, '\n', n - at);
        size_t k = lf ? (size_t)(lf + 1 - (p + at)) : n - at;
        if (r->bytes + k > UPLINK_HEAD_MAX || line->len + k > UPLINK_LINE_MAX) {
            *rc = CURLE_OUT_OF_MEMORY;
            return -1;
        }
        r->bytes += (uint32_t)k;
        if (!lf) { /* a line cut by the read: the next call completes it */
            lg_buf_append(line, p + at, k);
            return (ssize_t)n;
        }
        bool ends, ok;
        if (line->len) {
            lg_buf_append(line, p + at, k);
            ok = take_line(r, trailers, line->p, line->len, fn, ud, &ends, rc);
            lg_buf_reset(line);
        } else {
            ok = take_line(r, trailers, p + at, k, fn, ud, &ends, rc);
        }
        if (!ok) return -1;
        at += k;
        if (ends && trailers)
            r->done = true;
        else if (ends)
            head_ended(r);
    }
    return (ssize_t)at;
}

int uplink_framing(const uplink_resp *r, bool *reusable)
{
    int frame;
    bool clean = !r->http10 && !r->close && !r->folded;
    if ((r->status >= 100 && r->status < 200) || r->status == 204 || r->status == 304) {
        frame = UPLINK_NONE;
        clean = clean && r->status != 101;
    } else if (r->te) {
        frame = r->chunked ? UPLINK_CHUNKED : UPLINK_CLOSE;
        clean = clean && r->chunked && !r->has_len && !r->bad_len;
    } else if (r->has_len && !r->bad_len) {
        frame = UPLINK_LENGTH;
    } else {
        frame = UPLINK_CLOSE;
        clean = false;
    }
    *reusable = clean;
    return frame;
}
