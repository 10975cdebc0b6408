/* exchange_events.c — the guarded exchange's upstream events (see exchange_int.h).
 *
 * Each upstream event goes
 *
 *   SSE parser -> dialect parser -> think splitter (inline <think>) -> guard per channel
 *   -> release what the guard has cleared -> client (SSE bytes, or the assembler)
 *
 * Holdback: the guard says how many trailing bytes of a channel could still become part of
 * a loop (guard_suspect); only those are held, everything before them is released at once.
 * When nothing is held and the event needs no reshaping, the upstream's own bytes are
 * forwarded untouched, so a clean stream reaches the client byte for byte.
 *
 * Trip: the SSE callback cannot tear down the libcurl transfer it runs inside, so it marks
 * the trip and makes the write callback fail; the transfer's completion (exchange.c's
 * on_done) then closes it and starts the next attempt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/exchange_int.h"

#define EX_ERRBODY_MAX (1 << 20) /* an upstream's error body kept for the client */

/* ---- client output ----------------------------------------------------------------- */

void ex_out_event(exchange *ex, const char *json)
{
    if (!ex->req.client_stream || ex->ended) return;
    out_append(ex, "data: ", 6);
    out_append(ex, json, strlen(json));
    out_append(ex, "\n\n", 2);
}

static void remember_meta(exchange *ex, const dl_delta *d)
{
    if (d->id && !ex->c_id) ex->c_id = strdup(d->id);
    if (d->model && !ex->c_model) ex->c_model = strdup(d->model);
    if (d->has_created && !ex->c_created) ex->c_created = d->created;
}

/* Text for the client in the inline output mode: reasoning wrapped in <think>…</think>. */
static void inline_wrap(exchange *ex, const char *r, size_t rn, const char *c, size_t cn,
                        lg_buf *outc)
{
    if (rn) {
        if (ex->inline_state == 0) lg_buf_append_str(outc, "<think>");
        ex->inline_state = 1;
        lg_buf_append(outc, r, rn);
    }
    if (cn) {
        if (ex->inline_state == 1) lg_buf_append_str(outc, "</think>\n\n");
        ex->inline_state = 2;
        lg_buf_append(outc, c, cn);
    }
}

void ex_emit_chunk(exchange *ex, const dl_delta *tmpl, const char *r, size_t rn, const char *c,
                   size_t cn, const char *finish)
{
    lg_buf inl = LG_BUF_INIT;
    const char *rr = r, *cc = c;
    size_t rrn = rn, ccn = cn;
    if (ex->mode == LG_REASONING_INLINE && ex->chat) {
        inline_wrap(ex, r, rn, c, cn, &inl);
        rr = NULL, rrn = 0;
        cc = inl.len ? inl.p : NULL, ccn = inl.len;
    }
    if (!rrn) rr = NULL;
    if (!ccn) cc = NULL;
    char *json = tmpl ? dl_build_chunk(tmpl, rr, rrn, cc, ccn, (int)ex->mode, true, finish)
                      : dl_build_synthetic(ex->chat, ex->c_id ? ex->c_id : ex->id,
                                           ex->c_model ? ex->c_model : "", ex->c_created, rr,
                                           rrn, cc, ccn, (int)ex->mode, finish);
    if (json) ex_out_event(ex, json);
    free(json);
    lg_buf_free(&inl);
}

#define EX_TEXT_KEEP 4096 /* a per-event text buffer larger than this is not kept */

/* Lends the exchange's per-event text buffer i, empty; the caller owns it until
 * text_return. A nested lender would find the slot empty and start from no memory. */
static lg_buf text_borrow(exchange *ex, int i)
{
    lg_buf b = ex->text[i];
    ex->text[i] = (lg_buf)LG_BUF_INIT;
    lg_buf_reset(&b);
    return b;
}

/* Takes a borrowed buffer back (its memory kept for the next event unless it grew past
 * EX_TEXT_KEEP or the slot was refilled meanwhile) and leaves *b empty. */
static void text_return(exchange *ex, int i, lg_buf *b)
{
    if (ex->text[i].p || b->cap > EX_TEXT_KEEP) {
        lg_buf_free(b);
        return;
    }
    ex->text[i] = *b;
    *b = (lg_buf)LG_BUF_INIT;
}

/* Moves `n` bytes from the front of channel ch's held text to its sent text. */
static void release(exchange *ex, lg_channel ch, size_t n, lg_buf *into)
{
    chan *c = &ex->ch[ch];
    if (!n) return;
    lg_buf_append(&c->sent, c->held.p, n);
    if (into) lg_buf_append(into, c->held.p, n);
    lg_buf_consume(&c->held, n);
}

static size_t releasable(const exchange *ex, lg_channel ch)
{
    const chan *c = &ex->ch[ch];
    size_t suspect = c->g ? guard_suspect(c->g) : 0;
    /* a run of identical tokens past its first copy waits too */
    size_t run = c->g && c->run.count > 1 ? (c->run.count - 1) * c->run.len : 0;
    if (run > suspect) suspect = run;
    /* The global cap (guard.holdback_max_bytes) bounds every channel's own cap. */
    size_t cap = cfg_of(ex)->guard.holdback_max_bytes;
    if (suspect > cap) suspect = cap;
    return c->held.len > suspect ? c->held.len - suspect : 0;
}

/* Releases every held byte (the generation ended without a trip) as one synthetic chunk. */
static void flush_held(exchange *ex)
{
    lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
    release(ex, LG_CH_REASONING, ex->ch[LG_CH_REASONING].held.len, &r);
    release(ex, LG_CH_CONTENT, ex->ch[LG_CH_CONTENT].held.len, &c);
    release(ex, LG_CH_TOOL_ARGS, ex->ch[LG_CH_TOOL_ARGS].held.len, NULL);
    if (r.len || c.len) ex_emit_chunk(ex, NULL, r.p, r.len, c.p, c.len, NULL);
    lg_buf_free(&r);
    lg_buf_free(&c);
}

/* ---- upstream events --------------------------------------------------------------- */

/* Counts identical consecutive deltas; true when the run reaches RUN_TRIP (the verdict is
 * then set). */
static bool token_run_feed(exchange *ex, lg_channel ch, const char *s, size_t n)
{
    token_run *r = &ex->ch[ch].run;
    uint64_t at = ex->ch[ch].attempt_bytes - n;
    if (n > RUN_MAX_TOKEN) {
        r->len = r->count = 0;
        return false;
    }
    if (r->len == n && memcmp(r->last, s, n) == 0) {
        r->count++;
    } else {
        memcpy(r->last, s, n);
        r->len = n;
        r->count = 1;
        r->start = at;
    }
    if (r->count < RUN_TRIP) return false;
    ex->verdict = (guard_verdict){.detector = ex->verdict_detector,
                                  .channel = ch,
                                  .loop_start = r->start,
                                  .at_byte = ex->ch[ch].attempt_bytes,
                                  .unit = ex->verdict_unit,
                                  .unit_len = n,
                                  .repeats = r->count};
    snprintf(ex->verdict_detector, sizeof ex->verdict_detector, "token_repeat");
    snprintf(ex->verdict_unit, sizeof ex->verdict_unit, "%.*s", (int)n, s);
    ex->trip_pending = true;
    ex->trip_ns = ex->base.w->now_ns;
    return true;
}

static void take_verdict(exchange *ex, const guard *g);

/* The guard of channel ch, made when first needed (most streams use one or two channels, a
 * guard is 16.5–32 KiB); NULL when this attempt or channel is unguarded. */
static guard *channel_guard(exchange *ex, lg_channel ch)
{
    chan *c = &ex->ch[ch];
    if (c->g || !ex->attempt_guarded) return c->g;
    const guard_params *gp = config_guard_params(cfg_of(ex), ex->rule, ch);
    if (!gp || !guard_params_enabled(gp)) return NULL;
    c->g = guard_new(gp, ch);
    if (!ex->chat) guard_disable_leaks(c->g);
    return c->g;
}

/* Feeds one delta of channel ch to its guard and to the token-run check. Returns true when
 * either tripped; the verdict is then taken. */
static bool guard_text(exchange *ex, lg_channel ch, const char *s, size_t n)
{
    chan *c = &ex->ch[ch];
    if (!n) return false;
    c->attempt_bytes += n;
    lg_buf_append(&c->held, s, n);
    if (!channel_guard(ex, ch)) return false;
    if (guard_feed(c->g, s, n)) {
        take_verdict(ex, c->g);
        return true;
    }
    return token_run_feed(ex, ch, s, n);
}

/* Copies the tripped guard's verdict (its strings die with the guard). */
static void take_verdict(exchange *ex, const guard *g)
{
    const guard_verdict *v = guard_get_verdict(g);
    ex->verdict = *v;
    snprintf(ex->verdict_unit, sizeof ex->verdict_unit, "%.*s",
             (int)(v->unit_len < 256 ? v->unit_len : 256), v->unit ? v->unit : "");
    snprintf(ex->verdict_detector, sizeof ex->verdict_detector, "%s", v->detector);
    ex->verdict.unit = ex->verdict_unit;
    ex->verdict.detector = ex->verdict_detector;
    ex->trip_pending = true;
    ex->trip_ns = ex->base.w->now_ns;
}

/* End of generation for this attempt: last checks before the text is released. Returns
 * true when a guard tripped. */
static bool end_checks(exchange *ex, bool answer_expected)
{
    for (int c = 0; c < LG_CH_COUNT; c++) {
        guard *g = ex->ch[c].g;
        if (g && guard_finish(g)) {
            take_verdict(ex, g);
            return true;
        }
    }
    guard *cg = channel_guard(ex, LG_CH_CONTENT);
    uint64_t rbytes = ex->ch[LG_CH_REASONING].attempt_bytes + ex->ch[LG_CH_REASONING].sent.len;
    /* A generation cut by max_tokens inside its reasoning has no answer by design. */
    if (cg && answer_expected && ex->chat && ex->ch[LG_CH_CONTENT].attempt_bytes == 0 &&
        ex->ch[LG_CH_CONTENT].sent.len == 0 && ex->ch[LG_CH_TOOL_ARGS].attempt_bytes == 0 &&
        guard_report_empty_answer(cg, rbytes)) {
        take_verdict(ex, cg);
        return true;
    }
    return false;
}

/* True when the event can go to the client as the upstream's own bytes, provided that
 * releasing it leaves nothing held (the caller's check). */
static bool raw_ok(const exchange *ex, const dl_delta *d, bool held_before)
{
    if (held_before || ex->think || !ex->req.client_stream) return false;
    if (ex->mode == LG_REASONING_INLINE && ex->inline_state == 1 && d->content_len) return false;
    if (!d->reasoning_len) return true;
    switch (ex->mode) {
    case LG_REASONING_CONTENT:
        return d->reasoning_keys == DL_KEY_REASONING_CONTENT;
    case LG_REASONING_FIELD:
        return d->reasoning_keys == DL_KEY_REASONING;
    default:
        return false;
    }
}

/* How many bytes of s[i..n) after leading whitespace match "<think>" (0–7). */
static size_t open_tag_match(const char *s, size_t n, size_t *rest)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
    size_t k = 0;
    while (k < 7 && i + k < n && s[i + k] == "<think>"[k]) k++;
    *rest = n - i;
    return k;
}

/* True when content starting with `s` could open a <think> block (whitespace, then a
 * prefix of the tag): a tag split across deltas is only recognised if we look now. */
static bool may_open_think(const char *s, size_t n)
{
    size_t rest, k = open_tag_match(s, n, &rest);
    return k == (rest < 7 ? rest : 7);
}

static bool starts_with_open_tag(const char *s, size_t n)
{
    size_t rest;
    return open_tag_match(s, n, &rest) == 7;
}

/* End of a whole response read in hindsight mode: with no </think> (and no explicit
 * <think>), what looked like reasoning was the answer. */
static void settle_hindsight(exchange *ex)
{
    ex->think_hindsight = false;
    if (!ex->think || think_closed(ex->think) || ex->think_explicit) return;
    chan *r = &ex->ch[LG_CH_REASONING], *c = &ex->ch[LG_CH_CONTENT];
    lg_buf_append(&c->held, r->sent.p, r->sent.len);
    lg_buf_append(&c->held, r->held.p, r->held.len);
    c->attempt_bytes += r->attempt_bytes;
    r->attempt_bytes = 0;
    lg_buf_reset(&r->sent);
    lg_buf_reset(&r->held);
}

static int on_chunk(exchange *ex, const sse_event *ev, dl_delta *d)
{
    remember_meta(ex, d);
    if (ex->as) asm_meta(ex->as, d);
    if (d->n_choices == 0) {
        /* usage-only chunk: the client sees it only if it asked for usage */
        if (!ex->req.client_usage) return 0;
        if (ex->attempt > 1 && ex->c_id && d->id && strcmp(d->id, ex->c_id) != 0) {
            cJSON_ReplaceItemInObjectCaseSensitive(d->root, "id", cJSON_CreateString(ex->c_id));
            d->id = ex->c_id;
            char *json = cJSON_PrintUnformatted(d->root);
            if (json) ex_out_event(ex, json);
            free(json);
        } else {
            out_append(ex, ev->raw, ev->raw_len);
        }
        return 0;
    }
    if (d->choice_index != 0) { /* n > 1: only choice 0 is guarded */
        out_append(ex, ev->raw, ev->raw_len);
        return 0;
    }
    bool held_before = false;
    for (int c = 0; c < LG_CH_COUNT; c++) held_before |= ex->ch[c].held.len > 0;
    if (ex->attempt > 1) {
        /* A retry continues the client's stream: same id, no second opening chunk. */
        if (d->role && !d->reasoning_len && !d->content_len && !d->n_tools &&
            !d->finish_reason)
            return 0;
        if (ex->c_id && d->id && strcmp(d->id, ex->c_id) != 0)
        {
            cJSON_ReplaceItemInObjectCaseSensitive(d->root, "id",
                                                   cJSON_CreateString(ex->c_id));
            d->id = ex->c_id; /* the borrowed string just died */
        }
        held_before = true; /* never the retry's raw bytes */
    }

    /* Split inline <think> out of content (no server-side reasoning parser). */
    if (d->content_len && ex->chat && !ex->think && !d->reasoning_len &&
        ex->ch[LG_CH_REASONING].attempt_bytes == 0 && ex->ch[LG_CH_CONTENT].attempt_bytes == 0) {
        /* A whole response can be split in hindsight: read it as reasoning until a
         * </think> and, if none comes, give it back to the answer (settle_hindsight). */
        bool hindsight = !ex->req.client_stream && !ex->think_opened &&
                         (!ex->rule || ex->rule->think_opened != 0) &&
                         ex->req.enable_thinking != 0;
        if (ex->think_opened || hindsight || may_open_think(d->content, d->content_len)) {
            ex->think = think_new(ex->think_opened || hindsight);
            ex->think_inline = true;
            ex->think_hindsight = hindsight;
            ex->think_explicit = starts_with_open_tag(d->content, d->content_len);
        }
    }
    /* The event's text per channel: the delta's own strings, unless the splitter reshapes
     * them into the per-event buffers. */
    bool reshaped = ex->think != NULL; /* the splitter saw this event */
    lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
    const char *rs = d->reasoning, *cs = d->content;
    size_t rn = d->reasoning_len, cn = d->content_len;
    if (reshaped) {
        r = text_borrow(ex, EX_TEXT_R), c = text_borrow(ex, EX_TEXT_C);
        if (d->reasoning_len) lg_buf_append(&r, d->reasoning, d->reasoning_len);
        think_feed(ex->think, d->content, d->content_len, &r, &c);
        if (d->finish_reason) think_finish(ex->think, &r, &c);
        if (!think_inside(ex->think) && !think_closed(ex->think) && c.len) {
            /* decided: no <think> at the start; plain content from here on */
            think_free(ex->think);
            ex->think = NULL;
            ex->think_inline = false;
        }
        rs = r.p, rn = r.len, cs = c.p, cn = c.len;
    }

    bool text = rn || cn;
    bool tripped = guard_text(ex, LG_CH_REASONING, rs, rn) || guard_text(ex, LG_CH_CONTENT, cs, cn);
    for (size_t i = 0; !tripped && i < d->n_tools; i++) {
        tripped = guard_text(ex, LG_CH_TOOL_ARGS, d->tools[i].args, d->tools[i].args_len);
        text |= d->tools[i].args_len > 0;
    }
    if (reshaped) {
        text_return(ex, EX_TEXT_R, &r);
        text_return(ex, EX_TEXT_C, &c);
    }
    if (text) ex->tokens++;
    if (tripped) return 1; /* the verdict was taken */
    if (d->finish_reason) {
        ex->finished_gen = true;
        if (ex->think_hindsight) settle_hindsight(ex);
        if (end_checks(ex, strcmp(d->finish_reason, "length") != 0)) return 1;
    }

    /* Release: everything at the end of the generation, else what the guard cleared. Tool
     * arguments are guarded but never held (they are forwarded in their own deltas). */
    bool all = d->finish_reason != NULL;
    const chan *hr = &ex->ch[LG_CH_REASONING], *hc = &ex->ch[LG_CH_CONTENT];
    size_t nr = all ? hr->held.len : releasable(ex, LG_CH_REASONING);
    size_t nc = all ? hc->held.len : releasable(ex, LG_CH_CONTENT);
    /* The upstream's own bytes go out when nothing stays held; the released text is then
     * not needed apart from `sent`. */
    bool raw = !reshaped && nr == hr->held.len && nc == hc->held.len && raw_ok(ex, d, held_before);
    lg_buf rel_r = text_borrow(ex, EX_TEXT_R), rel_c = text_borrow(ex, EX_TEXT_C);
    release(ex, LG_CH_TOOL_ARGS, ex->ch[LG_CH_TOOL_ARGS].held.len, NULL);
    release(ex, LG_CH_REASONING, nr, raw ? NULL : &rel_r);
    release(ex, LG_CH_CONTENT, nc, raw ? NULL : &rel_c);
    if (raw) {
        out_append(ex, ev->raw, ev->raw_len);
    } else if (ex->req.client_stream) {
        bool other = d->finish_reason || d->n_tools || d->role || d->usage;
        bool visible = rel_c.len || (rel_r.len && ex->mode != LG_REASONING_HIDE);
        if ((visible || other) && d->root) {
            ex_emit_chunk(ex, d, rel_r.p, rel_r.len, rel_c.p, rel_c.len, d->finish_reason);
        } else if (visible || other) { /* scanned on the fast path: the template needs a tree */
            dl_delta full;
            dl_parse(ev->data, ev->data_len, &full);
            ex_emit_chunk(ex, &full, rel_r.p, rel_r.len, rel_c.p, rel_c.len, full.finish_reason);
            dl_delta_clear(&full);
        }
    }
    text_return(ex, EX_TEXT_R, &rel_r);
    text_return(ex, EX_TEXT_C, &rel_c);
    return 0;
}

int ex_on_event(void *ud, const sse_event *ev)
{
    exchange *ex = ud;
    ex->last_event_ns = ex->base.w->now_ns;
    if (ex->trip_pending) { /* already decided: count what the upstream still produced */
        ex->tokens_after_trip++;
        return 1;
    }
    dl_delta d;
    /* The fast path once the stream's identity is known; whole responses and retries need
     * the full tree (assembler, id rewriting). */
    bool fast = ex->req.client_stream && ex->c_id && ex->attempt == 1 &&
                chunkscan(ev->data, ev->data_len, &ex->scan, &d);
    if (!fast) dl_parse(ev->data, ev->data_len, &d);
    int rc = 0;
    switch (d.kind) {
    case DL_DONE:
        ex->saw_done = true;
        lg_buf_reset(&ex->done_raw);
        lg_buf_append(&ex->done_raw, ev->raw, ev->raw_len);
        break;
    case DL_ERROR:
        metrics_upstream_error(ex->base.w->metrics, ex->replica, "protocol");
        ex_set_outcome(ex, "upstream_error");
        if (ex_streaming_started(ex)) {
            flush_held(ex);
            out_append(ex, ev->raw, ev->raw_len);
            ex->finished_gen = true; /* the stream ends with [DONE] after the error */
        } else {
            if (ex->trips) ex_record_attempt(ex, NULL);
            ex_conclude(ex);
            ex->final_status = d.error_code >= 400 && d.error_code < 600 ? d.error_code : 502;
            ex->final_body = cJSON_PrintUnformatted(d.root);
            ex->stream_ready = false;
            worker_resume(&ex->base);
        }
        break;
    case DL_CHUNK:
        rc = on_chunk(ex, ev, &d);
        break;
    case DL_OTHER:
        out_append(ex, ev->raw, ev->raw_len);
        break;
    }
    if (!fast) dl_delta_clear(&d); /* chunkscan's delta owns nothing */
    return rc;
}

static bool is_event_stream(const http_head *h)
{
    return h->content_type && strncasecmp(h->content_type, "text/event-stream", 17) == 0;
}

size_t ex_on_header(char *line, size_t size, size_t n, void *ud)
{
    exchange *ex = ud;
    http_head_line(&ex->head, line, size * n);
    if (ex->head.complete && ex->head.status == 200 && !is_event_stream(&ex->head))
        ex->not_sse = true;
    if (ex->head.complete && ex->head.status == 200 && !ex->not_sse && ex->req.client_stream) {
        ex->stream_ready = true;
        worker_resume(&ex->base);
    }
    return size * n;
}

size_t ex_on_write(char *data, size_t size, size_t n, void *ud)
{
    exchange *ex = ud;
    size_t len = size * n;
    if (ex->base.client_gone || ex->phase == PHASE_DONE) return 0;
    if (!ex->first_byte) {
        ex->first_byte = true;
        metrics_ttfb(ex->base.w->metrics, ex->replica,
                     seconds_since(ex->attempt_start_ns, ex->base.w->now_ns));
        pool_report_health(ex->base.w->srv->pool, ex->replica, ex->head.status < 500);
    }
    if (ex->head.status != 200 || ex->not_sse) {
        if (ex->errbody.len < EX_ERRBODY_MAX) lg_buf_append(&ex->errbody, data, len);
        return len;
    }
    /* A slow client: stop reading the upstream until the output drains. */
    if (lg_fifo_len(&ex->out) >= EX_OUT_HIGH) {
        ex->up_paused = true;
        return CURL_WRITEFUNC_PAUSE;
    }
    int rc = sse_parser_feed(ex->sse, data, len);
    if (rc == SSE_ERR_TOO_BIG) {
        ex_set_outcome(ex, "upstream_error");
        ex_fail(ex, 502, "upstream event too large", "upstream_error", "bad_upstream");
        return 0;
    }
    if (ex->trip_pending) {
        /* Events already in this read that the guard never needed. */
        size_t pend = 0;
        const char *raw = sse_parser_pending_raw(ex->sse, &pend);
        for (const char *p = raw; p && (p = memmem(p, pend - (size_t)(p - raw), "data:", 5));
             p += 5)
            ex->tokens_after_trip++;
        return 0; /* fails the transfer; on_done finishes the trip */
    }
    return len;
}
