/* exchange_events.c — the guarded exchange's upstream events (see exchange_int.h).
 *
 * Each upstream event goes
 *
 *   SSE parser -> the API module (api.h: its event shape in, the channels' text out)
 *   -> guard per channel -> release what the guard has cleared -> the module writes the
 *   client's events (or its whole-response state)
 *
 * This file holds the API-independent half: libcurl's callbacks, the guard per channel,
 * the token-run check and holdback. Holdback: the guard says how many trailing bytes of a
 * channel could still become part of a loop (guard_suspect); only those are held,
 * everything before them is released at once.
 *
 * Bursts: a saturated stream's worker read brings dozens of tokens, a chunk each. Its usual
 * tokens join a burst (exchange_int.h: ex_guard_text_release, ex_burst_end): their events go
 * on as usual, the guard is fed their text in one call at the read's end, and what is held
 * is decided there, for the whole burst, taking back the events it does not release.
 *
 * Trip: the SSE callback cannot tear down the libcurl transfer it runs inside, so it marks
 * the trip and makes the write callback fail; the transfer's completion (exchange.c's
 * on_done) then closes it and starts the next attempt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/exchange_int.h"
#include "proxy/upbody.h"
#include "proxy/xalloc.h"

#define EX_ERRBODY_MAX (1 << 20) /* an upstream's error body kept for the client */

/* ---- client output ----------------------------------------------------------------- */

void ex_out_event(exchange *ex, const char *json)
{
    if (!ex->req.client_stream || ex->cl.ended) return;
    out_append(ex, "data: ", 6);
    out_append(ex, json, strlen(json));
    out_append(ex, "\n\n", 2);
}

#define EX_TEXT_KEEP 4096 /* a per-event text buffer larger than this is not kept */

/* Lends the exchange's per-event text buffer i, empty; the caller owns it until
 * text_return. A nested lender would find the slot empty and start from no memory. */
void ex_sample_swap(exchange *ex, lg_channel ch, chan *c, lg_buf *sent)
{
    ex->at.fed |= (uint8_t)(1u << ch); /* the sample's text, either way */
    chan t = ex->at.ch[ch];
    ex->at.ch[ch] = *c;
    *c = t;
    lg_buf b = ex->cl.sent[ch];
    ex->cl.sent[ch] = *sent;
    *sent = b;
}

char *ex_openai_error_body(int status, const char *message, const char *type, const char *code)
{
    return dl_error_json(message, type, code, status);
}

lg_buf ex_text_borrow(exchange *ex, int i)
{
    lg_buf b = ex->cl.text[i];
    ex->cl.text[i] = (lg_buf)LG_BUF_INIT;
    lg_buf_reset(&b);
    return b;
}

/* Takes a borrowed buffer back (its memory kept for the next event unless it grew past
 * EX_TEXT_KEEP or the slot was refilled meanwhile) and leaves *b empty. */
void ex_text_return(exchange *ex, int i, lg_buf *b)
{
    if (ex->cl.text[i].p || b->cap > EX_TEXT_KEEP) {
        lg_buf_free(b);
        return;
    }
    ex->cl.text[i] = *b;
    *b = (lg_buf)LG_BUF_INIT;
}

/* Moves `n` bytes from the front of channel ch's held text to its sent text. */
void ex_release_run(exchange *ex, lg_channel ch, size_t n, lg_buf *into)
{
    chan *c = &ex->at.ch[ch];
    lg_buf_append(&ex->cl.sent[ch], c->held.p, n);
    if (into) lg_buf_append(into, c->held.p, n);
    lg_buf_consume(&c->held, n);
}

/* The trailing bytes of channel c that must stay held: what its guard suspects, or a run
 * of identical tokens past its first copy, within the holdback cap. */
__attribute__((always_inline)) static inline size_t hold_back(const exchange *ex, const chan *c)
{
    size_t suspect = c->g ? guard_suspect(c->g) : 0;
    /* a run of identical tokens past its first copy waits too */
    size_t run = c->g && c->run.count > 1 ? (size_t)(c->run.count - 1) * c->run.len : 0;
    if (run > suspect) suspect = run;
    /* The global cap (guard.holdback_max_bytes) bounds every channel's own cap. */
    size_t cap = cfg_of(ex)->guard.holdback_max_bytes;
    return suspect > cap ? cap : suspect;
}

size_t ex_releasable_run(const exchange *ex, lg_channel ch)
{
    const chan *c = &ex->at.ch[ch];
    size_t suspect = hold_back(ex, c);
    return c->held.len > suspect ? c->held.len - suspect : 0;
}

/* Releases every held byte (the generation ended without a trip) as one synthetic chunk. */

/* ---- upstream events --------------------------------------------------------------- */

/* The attempt's verdict strings, made at its first trip (attempt_reset frees them). */
static struct ex_trip_text *trip_text(exchange *ex)
{
    if (!ex->at.trip) ex->at.trip = lg_xcalloc(1, sizeof *ex->at.trip);
    return ex->at.trip;
}

/* A delta's bytes as two words that tell two deltas of the same length of up to 16 bytes
 * apart (every byte is in them: overlapping reads), and a longer one's first and last 8
 * bytes. */
__attribute__((always_inline)) static inline void token_head(const char *s, size_t n, uint64_t w[2])
{
    uint32_t a, b;
    if (n >= 8) {
        memcpy(&w[0], s, 8);
        memcpy(&w[1], s + n - 8, 8);
        return;
    }
    w[1] = 0;
    if (n >= sizeof a) {
        memcpy(&a, s, sizeof a);
        memcpy(&b, s + n - sizeof b, sizeof b);
        w[0] = (uint64_t)b << 32 | a;
        return;
    }
    w[0] = !n ? 0
              : (uint64_t)(unsigned char)s[0] | (uint64_t)(unsigned char)s[n / 2] << 8 |
                    (uint64_t)(unsigned char)s[n - 1] << 16;
}

/* Counts delta s[0..n) into run r: r->count is then the number of identical consecutive
 * deltas it ends. */
__attribute__((always_inline)) static inline void token_run_count(token_run *r, const char *s,
                                                                  size_t n)
{
    if (n > RUN_MAX_TOKEN) {
        r->len = r->count = 0;
        return;
    }
    uint64_t head[2];
    token_head(s, n, head);
    if (r->len == n && r->head[0] == head[0] && r->head[1] == head[1] &&
        (n <= 16 || memcmp(r->last, s, n) == 0)) {
        r->count++;
    } else {
        r->head[0] = head[0];
        r->head[1] = head[1];
        if (n > 16) memcpy(r->last, s, n);
        r->len = (uint32_t)n;
        r->count = 1;
    }
}

/* Counts identical consecutive deltas; true when the run reaches RUN_TRIP (the verdict is
 * then set). Inlined, as hold_back is, into a paced token's path (and into a burst's). */
__attribute__((always_inline)) static inline bool token_run_feed(exchange *ex, lg_channel ch,
                                                                 const char *s, size_t n)
{
    token_run *r = &ex->at.ch[ch].run;
    token_run_count(r, s, n);
    if (r->count < RUN_TRIP) return false;
    struct ex_trip_text *t = trip_text(ex);
    uint64_t at = ex->at.ch[ch].attempt_bytes;
    ex->at.verdict = (guard_verdict){.detector = t->detector,
                                     .channel = ch,
                                     .loop_start = at - (uint64_t)r->count * n,
                                     .at_byte = at,
                                     .unit = t->unit,
                                     .unit_len = n,
                                     .repeats = r->count};
    snprintf(t->detector, sizeof t->detector, "token_repeat");
    snprintf(t->unit, sizeof t->unit, "%.*s", (int)n, s);
    ex->at.trip_pending = true;
    ex->rec.trip_ns = req_now(&ex->base);
    return true;
}

static void take_verdict(exchange *ex, const guard *g);

/* A guard of the exchange's for channel ch under params gp, fed nothing yet (the worker's
 * spare: give it back with worker_guard_put). */
static guard *guard_for(exchange *ex, const guard_params *gp, lg_channel ch)
{
    guard *g = worker_guard_get(ex->base.w, gp, ch);
    guard_set_prompt_json(g, ex->req.root); /* what the request asks for earns slack */
    if (!ex->api->templated) guard_disable_leaks(g);
    return g;
}

/* The guard of channel ch, made when first needed (most streams use one or two channels, a
 * guard is 7–33 KiB); NULL when this attempt or channel is unguarded. */
static guard *channel_guard(exchange *ex, lg_channel ch)
{
    chan *c = &ex->at.ch[ch];
    if (c->g || !ex->at.guarded) return c->g;
    const guard_params *gp = config_guard_params(cfg_of(ex), ex->rule, ch);
    if (!gp || !guard_params_enabled(gp)) return NULL;
    c->g = guard_for(ex, gp, ch);
    return c->g;
}

/* Feeds one delta of channel ch to its guard and to the token-run check, without holding
 * it. Returns true when either tripped; the verdict is then taken. */
static bool guard_feed_run(exchange *ex, lg_channel ch, const char *s, size_t n)
{
    chan *c = &ex->at.ch[ch];
    ex->at.fed |= (uint8_t)(1u << ch);
    c->attempt_bytes += n;
    if (!channel_guard(ex, ch)) return false;
    if (guard_feed(c->g, s, n)) {
        take_verdict(ex, c->g);
        return true;
    }
    return token_run_feed(ex, ch, s, n);
}

bool ex_guard_text_run(exchange *ex, lg_channel ch, const char *s, size_t n)
{
    lg_buf_append(&ex->at.ch[ch].held, s, n);
    return guard_feed_run(ex, ch, s, n);
}

/* ---- bursts: the guard fed once per worker read (exchange_int.h) ------------------- */

/* ex_guard_text_release's delta fed and released at once. */
__attribute__((always_inline)) static inline bool release_now(exchange *ex, lg_channel ch,
                                                              const char *s, size_t n)
{
    chan *c = &ex->at.ch[ch];
    bool tripped = guard_feed_run(ex, ch, s, n);
    /* a trip's delta is held: the incident's excerpt ends with it */
    lg_buf_append(tripped || hold_back(ex, c) ? &c->held : &ex->cl.sent[ch], s, n);
    return tripped;
}

/* Channel ch's delta s[0..n) joins the burst (opened for ch when none is; an unguarded
 * channel's is released at once: its bursts would save nothing). Out of a paced token's
 * path. */
__attribute__((noinline)) static bool burst_join(exchange *ex, lg_channel ch, const char *s,
                                                 size_t n)
{
    struct ex_burst *b = &ex->at.burst;
    if (!ex->at.in_burst) {
        if (!channel_guard(ex, ch)) return release_now(ex, ch, s, n);
        ex->at.in_burst = true;
        b->ch = ch;
        b->first_out_ns = ex->cl.first_out_ns;
        b->run0 = ex->at.ch[ch].run;
        lg_buf_reset(&b->text);
        lg_buf_reset(&b->toks);
    }
    ex->at.fed |= (uint8_t)(1u << ch);
    ex->at.ch[ch].attempt_bytes += n;
    lg_buf_append(&b->text, s, n);
    ex_burst_tok t = {.end = b->text.len, .mark = ex_out_mark(ex)};
    lg_buf_append(&b->toks, &t, sizeof t);
    /* A token run trips at this token: the burst ends with it (a guard's trip in it first) */
    return token_run_feed(ex, ch, s, n) && ex_burst_end(ex);
}

/* The burst's tokens from k on are not released: their events are taken back, their text
 * up to byte `end` of the burst's is held. */
static void burst_hold(exchange *ex, const ex_burst_tok *tok, size_t k, size_t end)
{
    struct ex_burst *b = &ex->at.burst;
    ex_out_retract(ex, tok[k].mark);
    if (!k) ex->cl.first_out_ns = b->first_out_ns;
    size_t from = k ? tok[k - 1].end : 0;
    lg_buf_append(&ex->at.ch[b->ch].held, b->text.p + from, end - from);
}

/* A trip at the burst's token k: how many of its first tokens feeding them one by one would
 * have released whole before it (what hold_back cleared after each). Found by a replay: a
 * spare guard of the channel fed the text the channel's guard had before the burst (the
 * first attempt's, the only one with bursts: its sent text), then the tokens one by one, and
 * the token run as it was. 0 when the replay cannot stand for the guard (it has another
 * number of bytes). Only on a trip. */
static size_t burst_cleared(exchange *ex, const ex_burst_tok *tok, size_t k, uint64_t fed0)
{
    struct ex_burst *b = &ex->at.burst;
    const lg_buf *sent = &ex->cl.sent[b->ch];
    chan r = {.g = guard_for(ex, guard_params_of(ex->at.ch[b->ch].g), b->ch), .run = b->run0};
    size_t released = 0;
    if (!guard_feed(r.g, sent->p, sent->len) && guard_bytes(r.g) == fed0) {
        for (size_t i = 0, from = 0; i < k; from = tok[i++].end) {
            if (guard_feed(r.g, b->text.p + from, tok[i].end - from)) break;
            token_run_count(&r.run, b->text.p + from, tok[i].end - from);
            size_t hold = hold_back(ex, &r);
            if (hold < tok[i].end && tok[i].end - hold > released) released = tok[i].end - hold;
        }
    }
    worker_guard_put(ex->base.w, r.g);
    size_t n = 0;
    while (n < k && tok[n].end <= released)
        n++;
    return n;
}

bool ex_burst_end(exchange *ex)
{
    struct ex_burst *b = &ex->at.burst;
    chan *c = &ex->at.ch[b->ch];
    const ex_burst_tok *tok = (const ex_burst_tok *)(void *)b->toks.p;
    size_t ntok = b->toks.len / sizeof *tok, k = 0;
    ex->at.in_burst = false;
    uint64_t fed0 = guard_bytes(c->g);
    /* The tripping token: the guard's history ends with the byte it decided at; a token run
     * trips at the last token (burst_join). */
    size_t at = b->text.len;
    if (guard_feed(c->g, b->text.p, b->text.len)) {
        take_verdict(ex, c->g);
        at = (size_t)(guard_bytes(c->g) - fed0);
    }
    if (ex->at.trip_pending) {
        while (tok[k].end < at)
            k++;
        /* The tokens after it: counted as tokens already, but not reached by per-token
         * feeding (their parse would have stopped at the trip). A token run's trip comes
         * inside its token's callback, which counts that token only after this returns:
         * then tok[k] is not yet counted and the count comes out the same. */
        uint64_t after = ntok - k - 1;
        ex->at.tokens -= after;
        ex->at.tokens_after_trip += after;
        c->attempt_bytes -= b->text.len - tok[k].end;
        size_t n = burst_cleared(ex, tok, k, fed0);
        lg_buf_append(&ex->cl.sent[b->ch], b->text.p, n ? tok[n - 1].end : 0);
        burst_hold(ex, tok, n, tok[k].end);
        return true;
    }
    size_t hold = hold_back(ex, c);
    size_t clear = b->text.len > hold ? b->text.len - hold : 0;
    while (k < ntok && tok[k].end <= clear)
        k++;
    size_t released = k ? tok[k - 1].end : 0;
    lg_buf_append(&ex->cl.sent[b->ch], b->text.p, released);
    if (k < ntok) burst_hold(ex, tok, k, b->text.len);
    return false;
}

bool ex_guard_text_release(exchange *ex, lg_channel ch, const char *s, size_t n)
{
    if (ex->at.in_burst || ex->at.read_on) return burst_join(ex, ch, s, n);
    return release_now(ex, ch, s, n);
}

/* Copies the tripped guard's verdict (its strings die with the guard). */
static void take_verdict(exchange *ex, const guard *g)
{
    const guard_verdict *v = guard_get_verdict(g);
    struct ex_trip_text *t = trip_text(ex);
    ex->at.verdict = *v;
    snprintf(t->unit, sizeof t->unit, "%.*s", (int)(v->unit_len < 256 ? v->unit_len : 256),
             v->unit ? v->unit : "");
    snprintf(t->detector, sizeof t->detector, "%s", v->detector);
    ex->at.verdict.unit = t->unit;
    ex->at.verdict.detector = t->detector;
    ex->at.trip_pending = true;
    ex->rec.trip_ns = req_now(&ex->base);
}

/* End of generation for this attempt: last checks before the text is released. Returns
 * true when a guard tripped. */
bool ex_end_checks(exchange *ex, bool answer_expected)
{
    for (int c = 0; c < LG_CH_COUNT; c++) {
        guard *g = ex->at.ch[c].g;
        if (g && guard_finish(g)) {
            take_verdict(ex, g);
            return true;
        }
    }
    guard *cg = channel_guard(ex, LG_CH_CONTENT);
    uint64_t rbytes = ex->at.ch[LG_CH_REASONING].attempt_bytes + ex->cl.sent[LG_CH_REASONING].len;
    /* A generation cut by max_tokens inside its reasoning has no answer by design. */
    if (cg && answer_expected && ex->api->templated &&
        ex->at.ch[LG_CH_CONTENT].attempt_bytes == 0 && ex->cl.sent[LG_CH_CONTENT].len == 0 &&
        ex->at.ch[LG_CH_TOOL_ARGS].attempt_bytes == 0 && guard_report_empty_answer(cg, rbytes)) {
        take_verdict(ex, cg);
        return true;
    }
    return false;
}

int ex_on_event(void *ud, const sse_event *ev)
{
    exchange *ex = ud;
    ex->at.last_event_ns = req_now(&ex->base);
    if (ex->at.trip_pending) { /* already decided: count what the upstream still produced */
        ex->at.tokens_after_trip++;
        return 1;
    }
    return ex->api->on_event(ex, ev);
}

static bool is_event_stream(const http_head *h)
{
    return h->content_type && strncasecmp(h->content_type, "text/event-stream", 17) == 0;
}

size_t ex_on_header(char *line, size_t size, size_t n, void *ud)
{
    exchange *ex = ud;
    bool was_complete = ex->at.head.complete;
    http_head_line(&ex->at.head, line, size * n);
    if (ex->at.head.too_big) {
        ex_set_outcome(ex, "upstream_error");
        ex_fail(ex, 502, "upstream response head too large", "upstream_error", "bad_upstream");
        return 0;
    }
    if (ex->at.head.complete && ex->at.head.status == 200 && !is_event_stream(&ex->at.head))
        ex->at.not_sse = true;
    /* An event stream's chunked body may be read by the worker (worker.h): ex_on_write
     * gets it either way. */
    if (ex->at.head.complete && !was_complete)
        worker_head_complete(ex->base.w, &ex->xfer, ex->at.easy,
                             ex->at.head.status == 200 && !ex->at.not_sse && ex->at.head.chunked);
    if (ex->at.head.complete && ex->at.head.status == 200 && !ex->at.not_sse &&
        ex->req.client_stream) {
        ex->cl.stream_ready = true;
        worker_resume(&ex->base);
    }
    return size * n;
}

size_t ex_on_write(char *data, size_t size, size_t n, void *ud)
{
    exchange *ex = ud;
    size_t len = size * n;
    if (ex->base.client_gone || ex->phase == PHASE_DONE) return 0;
    if (!ex->at.first_byte) {
        ex->at.first_byte = true;
        metrics_ttfb(req_metrics(&ex->base), ex->replica,
                     seconds_since(ex->at.start_ns, req_now(&ex->base)));
        pool_report_health(req_pool(&ex->base), ex->replica, ex->at.head.status < 500);
    }
    if (ex->at.head.status != 200 || ex->at.not_sse) {
        if (ex->at.errbody.len < EX_ERRBODY_MAX) lg_buf_append(&ex->at.errbody, data, len);
        return len;
    }
    /* A slow client: stop reading the upstream until the output drains. */
    if (lg_fifo_len(&ex->cl.out) >= EX_OUT_HIGH) {
        /* `out` drains before the rest of the read is parsed: the burst ends first */
        if (ex->at.in_burst && ex_burst_end(ex)) return 0; /* on_done finishes the trip */
        ex->at.up_paused = true;
        return CURL_WRITEFUNC_PAUSE;
    }
    /* A burst (more of the worker's read follows: at saturation some 60 events a read) goes
     * out as one write of `out`: room for the rest of the read, the most its raw events
     * take, is made once, not by `out` doubling from EX_OUT_KEEP five or six times a read. */
    size_t left = ex->xfer.body_left;
    if (left > len && !lg_fifo_len(&ex->cl.out) && ex->req.client_stream)
        lg_buf_reserve(&ex->cl.out.b, left);
    ex->cl.may_lend = left == len; /* the data dies with the read: see ex_out_raw */
    ex->at.read_on = left > len && upbody_data_follows(data + len, left - len);
    int rc = sse_parser_feed(&ex->at.sse, data, len);
    /* A burst ends with the read, or with a parse that failed; a trip shows below. */
    if (ex->at.in_burst && (!ex->at.read_on || rc)) ex_burst_end(ex);
    ex->at.read_on = false;
    ex->cl.may_lend = false;
    ex_out_settle(ex);
    if (rc == SSE_ERR_TOO_BIG) {
        ex_set_outcome(ex, "upstream_error");
        ex_fail(ex, 502, "upstream event too large", "upstream_error", "bad_upstream");
        return 0;
    }
    if (ex->at.trip_pending) {
        /* Events already in this read that the guard never needed. */
        size_t pend = 0;
        const char *raw = sse_parser_pending_raw(&ex->at.sse, &pend);
        for (const char *p = raw; p && (p = memmem(p, pend - (size_t)(p - raw), "data:", 5));
             p += 5)
            ex->at.tokens_after_trip++;
        return 0; /* fails the transfer; on_done finishes the trip */
    }
    return len;
}
