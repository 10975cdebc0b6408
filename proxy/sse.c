/* sse.c — the server-sent-events parser (see sse.h for the contract).
 *
 * While no event is pending, a read is parsed in place in the caller's buffer and only
 * its incomplete tail is copied into `in`; so complete events are never copied and a
 * parser between events holds no read buffer (what 10k idle streams cost). Otherwise the
 * read is appended to `in` and parsed there. Three offsets walk the bytes being parsed:
 * `start` is where the raw bytes of the pending event begin, `pos` where the next
 * unparsed line begins, and `scan` how far past pos we already looked for a line
 * terminator, so a long line that arrives in many small reads is searched once, not once
 * per read. A dispatch hands the callback [start, end of the blank line) as raw and moves
 * start forward; the consumed front of `in` is dropped once per feed (one memmove of the
 * pending event), so a read holding many events costs O(read), not O(read × events).
 * An event's first data line is borrowed, not copied: `one` points at its value in the
 * bytes being parsed, and is copied into `data` only when a second data line comes or the
 * feed ends before the event does (those bytes then move). The usual event, one data line,
 * thus reaches the callback with no copy of its data. And the usual read, one such event
 * while nothing is pending (`idle`, settled at the end of every other feed), is taken
 * whole without the line loop, reading nothing of the parser past its first cache line. */
#include "proxy/sse.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/buf.h"
#include "proxy/xalloc.h"

static const unsigned char bom[3] = {0xEF, 0xBB, 0xBF};

void sse_parser_init(sse_parser *p, size_t max_event_bytes, sse_event_fn fn, void *ud)
{
    memset(p, 0, sizeof *p);
    p->max = max_event_bytes ? max_event_bytes : SSE_DEFAULT_MAX_EVENT;
    p->fn = fn;
    p->ud = ud;
    p->retry = -1;
    p->crlf = true;
    /* The id field persists across events, so it must always read as a string. */
    lg_buf_append(&p->id, "", 0);
}

sse_parser *sse_parser_new(size_t max_event_bytes, sse_event_fn fn, void *ud)
{
    sse_parser *p = lg_xmalloc(sizeof(*p));
    sse_parser_init(p, max_event_bytes, fn, ud);
    return p;
}

void sse_parser_vouch(sse_parser *p, sse_vouch_fn vouch)
{
    p->vouch = vouch;
}

void sse_parser_clear(sse_parser *p)
{
    lg_buf_free(&p->in);
    lg_buf_free(&p->data);
    lg_buf_free(&p->event);
    lg_buf_free(&p->id);
    memset(p, 0, sizeof *p);
}

void sse_parser_free(sse_parser *p)
{
    if (!p) return;
    sse_parser_clear(p);
    free(p);
}

size_t sse_parser_pending(const sse_parser *p)
{
    return p->in.len - p->start;
}

const char *sse_parser_pending_raw(const sse_parser *p, size_t *len)
{
    *len = p->in.len - p->start;
    return p->in.p ? p->in.p + p->start : "";
}

/* Parses a retry value: ASCII digits only (none is not a number). Returns -1 when the
 * value does not qualify; saturates at LONG_MAX. */
static long parse_retry(const char *v, size_t n)
{
    if (n == 0) return -1;
    long r = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9') return -1;
        int d = v[i] - '0';
        r = r > (LONG_MAX - d) / 10 ? LONG_MAX : r * 10 + d;
    }
    return r;
}

/* Appends one data line to `data`, each line followed by its LF. */
static void add_data_line(sse_parser *p, const char *v, size_t vlen)
{
    lg_buf_append(&p->data, v, vlen);
    lg_buf_append(&p->data, "\n", 1);
}

/* Copies a borrowed first data line into `data`: the bytes it points at are about to move
 * or another line joins it. */
static void keep_data(sse_parser *p)
{
    if (!p->one) return;
    add_data_line(p, p->one, p->one_len);
    p->one = NULL;
}

/* Applies one non-blank, non-comment line [line, line+n) to the pending event. */
static void process_field(sse_parser *p, const char *line, size_t n)
{
    /* Nearly every line is an event's data: its colon is known without a search. */
    const char *colon = n >= 5 && !memcmp(line, "data:", 5) ? line + 4 : memchr(line, ':', n);
    size_t nlen = colon ? (size_t)(colon - line) : n;
    const char *v = colon ? colon + 1 : line + n;
    size_t vlen = (size_t)(line + n - v);
    if (vlen && *v == ' ') {
        v++;
        vlen--;
    }
    if (nlen == 4 && !memcmp(line, "data", 4)) {
        if (!p->one && !p->data.len) {
            p->one = v;
            p->one_len = vlen;
            return;
        }
        keep_data(p);
        add_data_line(p, v, vlen);
    } else if (nlen == 5 && !memcmp(line, "event", 5)) {
        lg_buf_reset(&p->event);
        lg_buf_append(&p->event, v, vlen);
    } else if (nlen == 2 && !memcmp(line, "id", 2)) {
        if (!memchr(v, '\0', vlen)) {
            lg_buf_reset(&p->id);
            lg_buf_append(&p->id, v, vlen);
            p->has_id = true;
        }
    } else if (nlen == 5 && !memcmp(line, "retry", 5)) {
        long r = parse_retry(v, vlen);
        if (r >= 0) p->retry = r;
    }
    /* Any other field name — including garbage without a colon — is ignored. */
}

/* A blank line ending at s[end]: dispatches the pending event when it has data and
 * starts the next one. Returns the callback's value (0 when nothing was dispatched). */
static int dispatch(sse_parser *p, const char *s, size_t end)
{
    int rc = 0;
    if (p->one || p->data.len) {
        sse_event ev = {
            .data = p->one ? p->one : p->data.p,
            .data_len = p->one ? p->one_len : p->data.len - 1, /* the last LF is not data */
            .event = p->event.p ? p->event.p : "",
            .event_len = p->event.len,
            .id = p->id.p,
            .id_len = p->id.len,
            .has_id = p->has_id,
            .retry = p->retry,
            .raw = s + p->start,
            .raw_len = end - p->start,
        };
        p->start = end;
        rc = p->fn(p->ud, &ev);
    }
    p->one = NULL;
    lg_buf_reset(&p->data);
    lg_buf_reset(&p->event);
    p->has_id = false;
    p->retry = -1;
    return rc;
}

/* Settles whether the stream opens with a BOM. Returns false while the few bytes read so
 * far are still a proper prefix of one. */
static bool check_bom(sse_parser *p)
{
    size_t have = p->in.len < 3 ? p->in.len : 3;
    if (have == 0) return false;
    if (memcmp(p->in.p, bom, have)) {
        p->bom_checked = true;
        return true;
    }
    if (have < 3) return false;
    p->pos = p->scan = 3;
    p->bom_checked = true;
    return true;
}

/* Parses the lines of s[0..n) from the offsets start/pos/scan on, dispatching events.
 * Returns 0 when it ran out of complete lines, the callback's nonzero, or
 * SSE_ERR_TOO_BIG (the parser is then dead). */
static int scan_lines(sse_parser *p, const char *s, size_t n)
{
    for (;;) {
        if (p->skip_lf && p->pos < n) {
            p->crlf = s[p->pos] == '\n';
            if (p->crlf) p->pos++;
            p->skip_lf = false;
            if (p->scan < p->pos) p->scan = p->pos;
        }
        /* Two memchr passes (LF, then CR only before it) beat a byte loop: almost every
         * server ends lines in LF, so the CR search covers one short line. */
        const char *lf = p->scan < n ? memchr(s + p->scan, '\n', n - p->scan) : NULL;
        size_t i = lf ? (size_t)(lf - s) : n;
        const char *cr = i > p->scan ? memchr(s + p->scan, '\r', i - p->scan) : NULL;
        if (cr) i = (size_t)(cr - s);
        if (i == n) {
            p->scan = n;
            if (n - p->start > p->max) break;
            return 0;
        }
        size_t end = i + 1;
        if (s[i] == '\r') {
            if (end == n && i == p->pos && p->crlf) {
                /* A blank line's CR ends the input of a CR LF stream: its LF is almost
                 * surely the next byte, so wait for it and keep the event's raw whole. */
                p->scan = i;
                p->deferred = true;
                if (n - p->start > p->max) break;
                return 0;
            }
            if (end < n) {
                p->crlf = s[end] == '\n';
                end += p->crlf;
            } else {
                p->skip_lf = true; /* an LF at the start of the next read pairs with it */
            }
        }
        p->deferred = false;
        if (end - p->start > p->max) break;
        size_t line = p->pos;
        p->pos = p->scan = end;
        if (i == line) {
            int rc = dispatch(p, s, end);
            if (rc) return rc;
        } else if (s[line] != ':') {
            process_field(p, s + line, i - line);
            /* The usual event: its blank line right after its LF-ended data line, taken
             * here without a search. */
            if (s[i] == '\n' && end < n && s[end] == '\n') {
                if (end + 1 - p->start > p->max) break;
                p->pos = p->scan = end + 1;
                int rc = dispatch(p, s, end + 1);
                if (rc) return rc;
            }
        }
    }
    p->dead = true;
    return SSE_ERR_TOO_BIG;
}

/* The usual input of an idle parser, exactly one event of one LF-ended data line and its
 * blank line ("data:…\n\n", no CR): dispatched as scan_lines would dispatch it, without
 * its line loop and reading only the parser's first line (idle says the rest is as a
 * dispatch leaves it, and stays so). The value is searched for CR and LF unless the vouch
 * proves it holds none ("data:" and the space hold none). False (nothing done) for
 * anything else. */
static bool one_event(const sse_parser *p, const char *buf, size_t len, int *rc)
{
    if (len < 7 || len > p->max || buf[len - 1] != '\n' || buf[len - 2] != '\n' ||
        memcmp(buf, "data:", 5) != 0)
        return false;
    size_t at = buf[5] == ' ' ? 6 : 5;
    bool vouched = p->vouch && p->vouch(p->ud, buf + at, len - 2 - at);
    if (!vouched && (memchr(buf, '\n', len - 2) || memchr(buf, '\r', len - 2))) return false;
    sse_event ev = {
        .data = buf + at,
        .data_len = len - 2 - at,
        .event = "",
        .id = p->id.p,
        .id_len = p->id.len,
        .retry = -1,
        .raw = buf,
        .raw_len = len,
        .vouched = vouched,
    };
    *rc = p->fn(p->ud, &ev);
    return true;
}

/* Between events with nothing pending: no bytes kept or being parsed, no field of a next
 * event read yet, the stream's line endings and BOM settled so that the next byte starts
 * an event's first line. */
static bool is_idle(const sse_parser *p)
{
    return !p->dead && p->bom_checked && !p->skip_lf && !p->deferred && !p->in.p && !p->start &&
           !p->pos && !p->scan && !p->one && !p->data.len && !p->event.len && !p->has_id &&
           p->retry == -1;
}

int sse_parser_finish(sse_parser *p)
{
    if (p->dead || !p->deferred) return 0;
    p->deferred = false;
    p->pos = p->scan = p->in.len;
    p->idle = false;
    return dispatch(p, p->in.p, p->in.len);
}

static int feed(sse_parser *p, const char *buf, size_t len, bool tried);

int sse_parser_feed(sse_parser *p, const char *buf, size_t len)
{
    int rc;
    bool tried = p->idle;
    if (tried && one_event(p, buf, len, &rc)) return rc;
    rc = feed(p, buf, len, tried);
    p->idle = is_idle(p);
    return rc;
}

/* Any input (sse_parser_feed's contract); tried: one_event already said no to it. */
static int feed(sse_parser *p, const char *buf, size_t len, bool tried)
{
    if (p->dead) return SSE_ERR_TOO_BIG;
    if (p->start) { /* drop the bytes of events already dispatched */
        lg_buf_consume(&p->in, p->start);
        p->pos -= p->start;
        p->scan -= p->start;
        p->start = 0;
    }
    if (p->in.len == 0 && p->bom_checked) {
        /* Nothing pending: parse the caller's bytes in place and keep only the incomplete
         * tail, so a parser between events holds no read buffer (10k idle streams cost
         * nothing) and complete events are never copied. */
        if (p->in.p) lg_buf_free(&p->in); /* what the last feed that kept bytes took */
        if (len == 0) return 0;
        int rc;
        /* the first read after kept bytes were consumed: idle only now */
        if (!tried && is_idle(p) && one_event(p, buf, len, &rc)) return rc;
        rc = scan_lines(p, buf, len);
        keep_data(p);
        if (rc != SSE_ERR_TOO_BIG) {
            if (p->start < len) lg_buf_append(&p->in, buf + p->start, len - p->start);
            p->pos -= p->start;
            p->scan -= p->start;
            p->start = 0;
        }
        return rc;
    }
    lg_buf_append(&p->in, buf, len);
    if (!p->bom_checked && !check_bom(p)) return 0;
    int rc = scan_lines(p, p->in.p, p->in.len);
    keep_data(p);
    return rc;
}
