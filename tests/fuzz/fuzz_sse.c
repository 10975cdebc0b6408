/* fuzz_sse.c — libFuzzer target for the SSE parser.
 *
 * Properties checked (abort on violation):
 *  1. raw exactness: the raws of all dispatched events followed by the pending bytes
 *     equal the input, whatever the chunking;
 *  2. split invariance: the parsed events (fields, not raw boundaries — a CR LF cut
 *     between reads moves the LF into the next raw by design) are the same when the input
 *     is fed whole and when it is fed in pieces chosen by the input's first bytes with a
 *     callback that stops the feed every few events (and the feeder resuming it);
 *  3. under a tiny event limit the parser either succeeds with property 1 or reports
 *     SSE_ERR_TOO_BIG, and stays dead afterwards;
 *  4. the pieces are fed to a parser with a vouch (one that searches, as the parser would):
 *     the same events, and only data without CR or LF dispatched vouched. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/buf.h"
#include "tests/fuzz/fuzz_cuts.h"
#include "proxy/sse.h"

typedef struct run {
    lg_buf fields; /* serialised event fields */
    lg_buf raws;
    unsigned stop_every; /* the callback stops the feed every this many events (0: never) */
    unsigned n;
    bool vouch; /* the parser has vouch_searches */
} run;

static bool vouch_searches(void *ud, const char *data, size_t len)
{
    (void)ud;
    return !memchr(data, '\n', len) && !memchr(data, '\r', len);
}

static int on_event(void *ud, const sse_event *ev)
{
    run *r = ud;
    if (ev->vouched && (!r->vouch || !vouch_searches(NULL, ev->data, ev->data_len))) abort();
    lg_buf_printf(&r->fields, "%zu:%zu:%zu:%d:%ld|", ev->data_len, ev->event_len, ev->id_len,
                  ev->has_id, ev->retry);
    lg_buf_append(&r->fields, ev->data, ev->data_len);
    lg_buf_append(&r->fields, ev->event, ev->event_len);
    lg_buf_append(&r->fields, ev->id, ev->id_len);
    lg_buf_append(&r->raws, ev->raw, ev->raw_len);
    return r->stop_every && ++r->n % r->stop_every == 0 ? 1 : 0;
}

/* Feeds data[0..len) with cut sizes drawn from `cuts`; returns the feed status. */
static int feed(const uint8_t *data, size_t len, fuzz_cuts *cuts, size_t max, run *r)
{
    sse_parser *p = sse_parser_new(max, on_event, r);
    if (r->vouch) sse_parser_vouch(p, vouch_searches);
    size_t at = 0;
    int rc = 0;
    while (at < len && rc == 0) {
        size_t step = fuzz_cuts_next(cuts, len - at);
        rc = sse_parser_feed(p, (const char *)data + at, step);
        at += step;
        while (rc == 1) /* stopped by the callback: resume on the buffered bytes */
            rc = sse_parser_feed(p, NULL, 0);
    }
    if (rc == 0 && sse_parser_finish(p) < 0) abort(); /* 0, or 1 from the callback */
    if (rc == 0) {
        size_t plen;
        const char *pend = sse_parser_pending_raw(p, &plen);
        if (plen != sse_parser_pending(p)) abort();
        if (r->raws.len + plen != len) abort();
        if (r->raws.len && memcmp(r->raws.p, data, r->raws.len)) abort();
        if (plen && memcmp(pend, data + r->raws.len, plen)) abort();
    } else if (rc == SSE_ERR_TOO_BIG) {
        if (sse_parser_feed(p, "\n\n", 2) != SSE_ERR_TOO_BIG) abort();
    } else {
        abort();
    }
    sse_parser_free(p);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_cuts cuts;
    if (!fuzz_cuts_take(&data, &size, &cuts, 17)) return 0;

    run whole = {0}, split = {.stop_every = 1 + (size % 3), .vouch = true}, tiny = {0};
    if (feed(data, size, NULL, 0, &whole) != 0) abort();
    if (feed(data, size, &cuts, 0, &split) != 0) abort();
    if (whole.fields.len != split.fields.len ||
        (whole.fields.len && memcmp(whole.fields.p, split.fields.p, whole.fields.len)))
        abort();
    feed(data, size, &cuts, 24, &tiny);
    lg_buf_free(&whole.fields);
    lg_buf_free(&whole.raws);
    lg_buf_free(&split.fields);
    lg_buf_free(&split.raws);
    lg_buf_free(&tiny.fields);
    lg_buf_free(&tiny.raws);
    return 0;
}
