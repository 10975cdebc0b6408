/* exchange.c — the guarded exchange, loopguard's main job: a request's life.
 *
 * One client request (in the API of its module, api.h) becomes one or more upstream attempts. The
 * upstream is always asked to stream, so that a loop costs a few dozen tokens rather than
 * max_tokens, even when the client asked for one whole JSON answer. This file takes the
 * request's body, starts attempts, and ends them; exchange_events.c reads each attempt's
 * events through the guard and releases what it clears (see exchange_int.h).
 *
 * Trip: the event path marks the trip and fails libcurl's write callback; the transfer's
 * completion (on_done) then closes it, tells SGLang to abort the rid, records the attempt
 * and starts the next one with the next rung of the sampling ladder — restarting from the
 * original request while the client has seen nothing, or continuing the clean prefix the
 * client already has.
 *
 * Memory: everything an exchange owns is freed in ex_destroy. */
#include "proxy/exchange.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "proxy/accesslog.h"
#include "proxy/exchange_int.h"
#include "proxy/exchange_plan.h"
#include "proxy/jsonguard.h"
#include "proxy/upfail.h"
#include "proxy/upread.h"
#include "proxy/xalloc.h"

/* libmicrohttpd reads a chunked (HTTP/1.1) stream straight into the connection's write
 * buffer, which lives in its per-connection pool (max_header_bytes); the response's own
 * block (allocated with it, for every stream) only serves HTTP/1.0 clients, which get no
 * chunking: a paced event or two per read for them, no more memory per stream. */
#define EX_BLOCK   512
#define EX_EXCERPT 512

static void start_attempt(exchange *ex);

/* ---- incidents --------------------------------------------------------------------- */

static void iso_now(char *buf, size_t n)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t k = strftime(buf, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + k, n - k, ".%03ldZ", ts.tv_nsec / 1000000);
}

static cJSON *prompt_capture(const exchange *ex)
{
    lg_capture cap = cfg_of(ex)->incidents.capture;
    if (cap == LG_CAPTURE_NONE || !ex->req.root) return NULL;
    if (cap == LG_CAPTURE_FULL) return ex->api->prompt(ex, true);
    /* excerpt: the last user message (or the prompt), at most 300 bytes */
    cJSON *text = ex->api->prompt(ex, false);
    if (!cJSON_IsString(text)) {
        cJSON_Delete(text);
        return NULL;
    }
    char buf[304];
    size_t n = strlen(text->valuestring);
    if (n > 300) n = 300;
    memcpy(buf, text->valuestring, n);
    buf[n] = '\0';
    cJSON_Delete(text);
    return lg_xcheck(cJSON_CreateString(buf));
}

static void write_incident(exchange *ex)
{
    incident_log *log = req_incidents(&ex->base);
    if (ex->rec.trips == 0 || !log || ex->rec.written) return; /* once */
    ex->rec.written = true;
    char ts[40];
    iso_now(ts, sizeof ts);
    cJSON *o = lg_xcheck(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "ts", ts);
    cJSON_AddStringToObject(o, "id", ex->id);
    if (ex->req.model)
        cJSON_AddStringToObject(o, "model", ex->req.model);
    else
        cJSON_AddNullToObject(o, "model");
    cJSON_AddStringToObject(o, "endpoint", ex->api->route);
    cJSON_AddBoolToObject(o, "stream", ex->req.client_stream);
    cJSON_AddStringToObject(o, "outcome", ex->rec.outcome ? ex->rec.outcome : "failed");
    cJSON_AddNumberToObject(o, "trips", ex->rec.trips);
    cJSON_AddItemToObject(o, "attempts", ex->rec.attempts);
    ex->rec.attempts = NULL;
    if (ex->rec.excerpt) cJSON_AddStringToObject(o, "excerpt", ex->rec.excerpt);
    cJSON *prompt = prompt_capture(ex);
    if (prompt) cJSON_AddItemToObject(o, "prompt", prompt);
    char *line = lg_xcheck(cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
    incident_log_submit(log, line);
}

void ex_conclude(exchange *ex)
{
    ex->phase = PHASE_DONE;
    write_incident(ex);
}

void ex_set_outcome(exchange *ex, const char *outcome)
{
    if (ex->rec.outcome) return;
    ex->rec.outcome = outcome;
    if (ex->rec.trips) metrics_outcome(req_metrics(&ex->base), outcome);
}

/* ---- attempts ---------------------------------------------------------------------- */

/* Tells SGLang to stop decoding `rid`: recent SGLang versions keep decoding a request whose
 * client left (sglang issues 36333, 34894), so closing is not enough. */
static void send_sglang_abort(exchange *ex, const char *rid)
{
    lg_worker *w = ex->base.w;
    cJSON *o = dl_json_must(cJSON_CreateObject());
    dl_json_set(o, "rid", cJSON_CreateString(rid));
    char *body = dl_json_print_free(o);
    char *url = pool_url(req_pool(&ex->base), ex->replica, "/abort_request");
    worker_post_detached(w, url, body);
    free(url);
    free(body);
}

/* Sends the aborts of a batch's cut samples (exchange_int.h's ex_attempt.aborts). Safe
 * outside libcurl callbacks only. */
static void send_pending_aborts(exchange *ex)
{
    const char *p = ex->at.aborts.p, *end = p + ex->at.aborts.len;
    bool sglang =
        ex->have_replica && pool_kind(req_pool(&ex->base), ex->replica) == LG_UPSTREAM_SGLANG;
    for (; sglang && p && p < end; p += strlen(p) + 1)
        send_sglang_abort(ex, p);
    lg_buf_reset(&ex->at.aborts);
}

/* Whether the attempt's transfer runs, on libcurl or on the worker's own connection. */
static bool transfer_running(const exchange *ex)
{
    return ex->at.easy || worker_uplink_running(&ex->xfer);
}

/* Closes the current attempt's transfer (if any) and frees its per-attempt state. Safe
 * outside libcurl callbacks only. */
static void stop_transfer(exchange *ex)
{
    worker_uplink_stop(ex->base.w, &ex->xfer);
    if (ex->at.easy) {
        worker_remove_xfer(ex->base.w, ex->at.easy);
        worker_easy_put(ex->base.w, ex->at.easy);
        upread_give(ex->at.rbuf);
        ex->at.easy = NULL;
    }
    if (ex->have_replica) {
        pool_release(req_pool(&ex->base), ex->replica);
        ex->have_replica = false;
    }
    http_upstream_headers_free(ex->at.headers);
    ex->at.headers = NULL;
    lg_xfree(ex->at.up_body);
    ex->at.up_body = NULL;
}

/* Stops the attempt at the server: close the transfer and, for SGLang, abort the rid. */
static void abort_attempt(exchange *ex)
{
    bool was_running = transfer_running(ex);
    if (was_running && ex->api->abandon) ex->api->abandon(ex);
    send_pending_aborts(ex);
    stop_transfer(ex);
    if (was_running && pool_kind(req_pool(&ex->base), ex->replica) == LG_UPSTREAM_SGLANG &&
        ex->at.rid[0])
        send_sglang_abort(ex, ex->at.rid);
}

/* The one place an attempt's state ends: the transfer is stopped and everything the
 * attempt owned is freed; ex->at is zeroed for the next one. */
static void attempt_reset(exchange *ex)
{
    stop_transfer(ex);
    sse_parser_clear(&ex->at.sse);
    think_free(ex->at.think);
    for (int c = 0; c < LG_CH_COUNT; c++) {
        worker_guard_put(ex->base.w, ex->at.ch[c].g);
        lg_buf_free(&ex->at.ch[c].held);
    }
    lg_buf_free(&ex->at.burst.text);
    lg_buf_free(&ex->at.burst.toks);
    http_head_clear(&ex->at.head);
    lg_buf_free(&ex->at.errbody);
    lg_buf_free(&ex->at.aborts);
    lg_xfree(ex->at.trip);
    memset(&ex->at, 0, sizeof ex->at);
    http_head_clear(&ex->at.head);
}

void ex_record_attempt(exchange *ex, const guard_verdict *v)
{
    if (ex->rec.written) return;
    cJSON *a = dl_json_must(cJSON_CreateObject());
    cJSON_AddNumberToObject(a, "attempt", ex->attempt);
    cJSON_AddStringToObject(a, "rid", ex->at.rid);
    cJSON_AddStringToObject(a, "upstream", pool_base(req_pool(&ex->base), ex->replica));
    if (v) {
        cJSON_AddStringToObject(a, "detector", ex->at.trip->detector);
        cJSON_AddStringToObject(a, "channel", guard_channel_name(v->channel));
        cJSON_AddStringToObject(a, "unit", ex->at.trip->unit);
        cJSON_AddNumberToObject(a, "repeats", v->repeats);
        cJSON_AddNumberToObject(a, "loop_start", (double)v->loop_start);
        cJSON_AddNumberToObject(a, "at_byte", (double)v->at_byte);
    } else {
        cJSON_AddNullToObject(a, "detector");
    }
    cJSON_AddNumberToObject(a, "tokens", (double)ex->at.tokens);
    cJSON_AddNumberToObject(a, "tokens_after_trip", (double)ex->at.tokens_after_trip);
    cJSON_AddItemToObject(a, "sampling",
                          ex->at.sampling ? ex->api->sampling(ex, &ex->at.sampling_opts)
                                          : cJSON_CreateObject());
    ex->at.sampling = false;
    cJSON_AddNumberToObject(a, "ms", (double)((req_now(&ex->base) - ex->at.start_ns) / 1000000));
    cJSON_AddBoolToObject(a, "guarded", ex->at.guarded);
    cJSON_AddItemToArray(ex->rec.attempts, a);
}

/* ---- the end of an exchange -------------------------------------------------------- */

bool ex_streaming_started(const exchange *ex)
{
    return ex->req.client_stream && (ex->cl.queued || ex->cl.stream_ready);
}

void ex_end_stream(exchange *ex, const char *last, size_t n)
{
    if (!ex->req.client_stream || ex->cl.ended) return;
    if (ex->rec.trips) {
        char c[128];
        int k = snprintf(c, sizeof c, ": X-Loopguard-Attempts: %u\n: X-Loopguard-Trips: %u\n\n",
                         ex->attempt, ex->rec.trips);
        out_append(ex, c, (size_t)k);
    }
    out_append(ex, last, n);
    ex->cl.ended = true;
    worker_resume(&ex->base);
}

void ex_fail(exchange *ex, int status, const char *message, const char *type, const char *code)
{
    if (ex->phase == PHASE_DONE) return;
    ex_conclude(ex);
    if (ex_streaming_started(ex)) {
        ex->api->stream_error(ex, status, message, type, code);
    } else {
        ex->cl.final_status = status;
        ex->cl.final_body = ex->api->error_body(status, message, type, code);
        ex->cl.stream_ready = false;
    }
    worker_resume(&ex->base);
}

void ex_fail_whole(exchange *ex, int status, char *body)
{
    if (ex->rec.trips) ex_record_attempt(ex, NULL);
    ex_conclude(ex);
    ex->cl.final_status = status;
    ex->cl.final_body = body;
    ex->cl.stream_ready = false;
    worker_resume(&ex->base);
}

static void finish_exchange(exchange *ex)
{
    if (ex->phase == PHASE_DONE) return;
    if (ex->rec.trips) ex_set_outcome(ex, "recovered");
    ex_conclude(ex);
    ex->api->finish(ex);
    worker_resume(&ex->base);
}

/* Attempts ran out: end as configured (documented in the README). */
static void exhausted(exchange *ex)
{
    ex_set_outcome(ex, "failed");
    if (cfg_of(ex)->retry.on_exhausted == LG_EXHAUSTED_ERROR) {
        ex_fail(ex, 502, "the generation degenerated into a loop on every attempt", "loop_detected",
                "loop_detected");
        return;
    }
    /* content_filter: a well-formed end with what was clean. */
    ex->api->withheld(ex);
    finish_exchange(ex);
}

/* Counts the trip whose verdict the attempt holds (`tokens` generated before the cut) and
 * keeps the first trip's excerpt. */
static void count_trip(exchange *ex, uint64_t tokens)
{
    const guard_verdict *v = &ex->at.verdict;
    ex->rec.trips++;
    metrics_trip(req_metrics(&ex->base), ex->replica, ex->at.trip->detector, (int)v->channel);
    metrics_aborted_tokens(req_metrics(&ex->base), tokens);
    ex->rec.cut_tokens += tokens;
    if (pool_report_generation(req_pool(&ex->base), ex->replica, true))
        metrics_ejection(req_metrics(&ex->base), ex->replica);
    if (!ex->rec.excerpt) {
        /* What the model was producing: the released tail plus the held loop. */
        const chan *c = &ex->at.ch[v->channel];
        const lg_buf *sent = &ex->cl.sent[v->channel];
        lg_buf e = LG_BUF_INIT;
        size_t from = sent->len > 128 ? sent->len - 128 : 0;
        lg_buf_append(&e, sent->p + from, sent->len - from);
        lg_buf_append(&e, c->held.p, c->held.len < EX_EXCERPT ? c->held.len : EX_EXCERPT);
        ex->rec.excerpt = lg_buf_steal(&e);
    }
}

void ex_sample_tripped(exchange *ex, const char *rid, uint64_t tokens)
{
    ex->at.trip_pending = false; /* the attempt goes on for the other samples */
    ex->rec.samples_cut = true;
    count_trip(ex, tokens);
    ex_set_outcome(ex, "failed");
    /* The record names the sample: its rid, its tokens, the batch's sampling. */
    char own_rid[sizeof ex->at.rid];
    memcpy(own_rid, ex->at.rid, sizeof own_rid);
    snprintf(ex->at.rid, sizeof ex->at.rid, "%s", rid ? rid : "");
    uint64_t own_tokens = ex->at.tokens;
    ex->at.tokens = tokens;
    bool sampling = ex->at.sampling;
    ex_record_attempt(ex, &ex->at.verdict);
    ex->at.sampling = sampling;
    ex->at.tokens = own_tokens;
    memcpy(ex->at.rid, own_rid, sizeof own_rid);
    if (rid) lg_buf_append(&ex->at.aborts, rid, strlen(rid) + 1); /* sent at the next tick */
}

/* The guard tripped in the current attempt (its transfer is already closed). */
static void after_trip(exchange *ex)
{
    count_trip(ex, ex->at.tokens);
    ex_record_attempt(ex, &ex->at.verdict);
    attempt_reset(ex);
    if (ex->attempt >= cfg_of(ex)->retry.max_attempts) {
        exhausted(ex);
        return;
    }
    start_attempt(ex);
}

/* The attempt failed at the transport or HTTP level (its transfer is closed): pass the
 * upstream's own error on, or map the failure to 502/504 (an error event once streaming). */
static void attempt_failed(exchange *ex, CURLcode rc)
{
    size_t replica = ex->replica;
    /* The cause, for the log now and for the client's message below. */
    char why[400];
    if (ex->at.head.complete && ex->at.head.status != 200 && !ex->at.timed_out)
        upf_report_status(pool_base(req_pool(&ex->base), replica), ex->at.head.status);
    else
        upf_report(why, sizeof why, pool_base(req_pool(&ex->base), replica),
                   &(upf_state){rc, ex->xfer.os_errno, ex->at.timed_out, ex->at.connected,
                                ex->at.first_byte, ex->at.not_sse});
    if (!ex->at.head.complete && rc != CURLE_OK && rc != CURLE_FAILED_INIT && !ex->at.timed_out &&
        ex->connect_retries + 1 < pool_size(req_pool(&ex->base))) {
        /* The replica never answered: the client must not see a 502 while another one
         * may be healthy. Same attempt, same sampling, another replica. */
        ex->connect_retries++;
        metrics_upstream_error(req_metrics(&ex->base), replica, "connect");
        pool_report_health(req_pool(&ex->base), replica, false);
        attempt_reset(ex);
        ex->attempt--;
        ex->avoid_replica = true;
        start_attempt(ex);
        return;
    }
    ex_set_outcome(ex, "upstream_error");
    if (ex->rec.trips) ex_record_attempt(ex, NULL);
    if (ex->at.head.complete && ex->at.head.status != 200 && !ex->at.timed_out) {
        pool_report_health(req_pool(&ex->base), replica, ex->at.head.status < 500);
        if (ex->at.head.status >= 500)
            metrics_upstream_error(req_metrics(&ex->base), replica, "http_5xx");
        if (ex->cl.queued) {
            ex_fail(ex, ex->at.head.status, "upstream error", "upstream_error", NULL);
            return;
        }
        ex_conclude(ex);
        ex->cl.final_status = ex->at.head.status;
        ex->cl.final_body = lg_buf_steal(&ex->at.errbody);
        if (ex->at.head.content_type) ex->cl.final_ctype = lg_xstrdup(ex->at.head.content_type);
        ex->cl.stream_ready = false;
        worker_resume(&ex->base);
        return;
    }
    if (ex->at.not_sse) {
        metrics_upstream_error(req_metrics(&ex->base), replica, "protocol");
        ex_fail(ex, 502, why, "upstream_error", "bad_upstream");
        return;
    }
    bool timeout = ex->at.timed_out || rc == CURLE_OPERATION_TIMEDOUT;
    metrics_upstream_error(req_metrics(&ex->base), replica,
                           timeout                 ? "timeout"
                           : rc == CURLE_OK        ? "protocol"
                           : !ex->at.head.complete ? "connect"
                                                   : "reset");
    pool_report_health(req_pool(&ex->base), replica, false);
    if (timeout)
        ex_fail(ex, 504, why, "upstream_error", "upstream_timeout");
    else if (!ex->at.head.complete)
        ex_fail(ex, 502, why, "upstream_error", "upstream_unreachable");
    else
        ex_fail(ex, 502, why, "upstream_error", "upstream_truncated");
}

/* The attempt's transfer ended (completed, failed, or failed on purpose after a trip). */
static void on_done(lg_xfer *x, CURLcode rc)
{
    exchange *ex = x->owner;
    size_t replica = ex->replica;
    bool sglang = pool_kind(req_pool(&ex->base), replica) == LG_UPSTREAM_SGLANG;
    stop_transfer(ex);
    /* A read that ended the body (or broke its framing) after a burst's tokens: the burst
     * ends before anything else is written (a trip shows below). */
    if (ex->at.in_burst) ex_burst_end(ex);
    /* An event whose last line ended in a bare CR at the very end is complete now (it may
     * still trip the guard). */
    if (rc == CURLE_OK && !ex->at.trip_pending && ex->phase == PHASE_RUNNING &&
        !ex->base.client_gone)
        (void)sse_parser_finish(&ex->at.sse);
    if (ex->at.trip_pending) {
        ex->at.trip_pending = false;
        if (sglang && ex->at.rid[0]) send_sglang_abort(ex, ex->at.rid);
        after_trip(ex);
        return;
    }
    if (ex->base.client_gone || ex->phase == PHASE_DONE) return;
    if ((ex->at.head.complete && ex->at.head.status != 200) || ex->at.not_sse || rc != CURLE_OK ||
        ex->at.timed_out || !(ex->at.finished_gen || ex->at.saw_done)) {
        attempt_failed(ex, rc);
        return;
    }
    pool_report_generation(req_pool(&ex->base), replica, false);
    /* The last attempt ran unguarded because attempts ran out: not a recovery. */
    if (ex->rec.trips && !ex->at.guarded) ex_set_outcome(ex, "failed");
    if (ex->rec.trips && !ex->rec.samples_cut) { /* the retry that recovered */
        ex_record_attempt(ex, NULL);
        metrics_retry_latency(req_metrics(&ex->base),
                              seconds_since(ex->rec.trip_ns, req_now(&ex->base)));
    }
    finish_exchange(ex);
}

/* ---- starting an attempt ----------------------------------------------------------- */

/* splitmix64 over a per-thread state seeded once from getrandom: ids and seeds need to be
 * unique and unpredictable enough, not cryptographic, and a syscall per request is waste. */
static uint64_t next_random(void)
{
    static _Thread_local uint64_t state;
    if (!state && getrandom(&state, sizeof state, 0) != sizeof state)
        state = (uint64_t)lg_now_ns() ^ (uint64_t)(uintptr_t)&state;
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void ex_random_hex(char *out, size_t nbytes)
{
    static const char hex[] = "0123456789abcdef";
    uint64_t r = 0;
    for (size_t i = 0; i < nbytes; i++) {
        if (i % 8 == 0) r = next_random();
        unsigned b = (unsigned)(r & 0xff);
        r >>= 8;
        out[2 * i] = hex[b >> 4];
        out[2 * i + 1] = hex[b & 15];
    }
    out[2 * nbytes] = '\0';
}

/* The clean prefix the client already has, as the upstream's template expects it in a
 * final assistant message: bare reasoning when the template opens <think> itself, the
 * answer after "</think>\n\n" once the reasoning is over. */
static void continuation_text(const exchange *ex, lg_buf *out)
{
    const lg_buf *r = &ex->cl.sent[LG_CH_REASONING], *c = &ex->cl.sent[LG_CH_CONTENT];
    if (!ex->req.chat || r->len == 0) {
        lg_buf_append(out, c->p, c->len);
        return;
    }
    if (!ex->think_opened) lg_buf_append_str(out, "<think>\n");
    lg_buf_append(out, r->p, r->len);
    if (c->len) {
        lg_buf_append_str(out, "\n</think>\n\n");
        lg_buf_append(out, c->p, c->len);
    }
}

/* libcurl has a connection (new or reused) and is about to send the request. */
static int on_prereq(void *ud, char *conn_ip, char *local_ip, int conn_port, int local_port)
{
    exchange *ex = ud;
    (void)conn_ip, (void)local_ip, (void)conn_port, (void)local_port;
    ex->at.connected = true;
    return CURL_PREREQFUNC_OK;
}

/* The same on the worker's own connection (lg_uplink_req.connected). */
static void on_connected(lg_xfer *x)
{
    (void)on_prereq(x->owner, NULL, NULL, 0, 0);
}

static void start_attempt(exchange *ex)
{
    lg_worker *w = ex->base.w;
    const lg_config *cfg = cfg_of(ex);
    lg_pool *pool = req_pool(&ex->base);
    unsigned k = ++ex->attempt;
    bool has_prefix = ex->cl.sent[LG_CH_REASONING].len || ex->cl.sent[LG_CH_CONTENT].len;

    metrics_attempt(req_metrics(&ex->base), k);
    size_t avoid = ex->avoid_replica || ex_plan_elsewhere(cfg, k) ? ex->replica : SIZE_MAX;
    ex->avoid_replica = false;
    ex->replica = pool_acquire(pool, avoid);
    metrics_upstream_request(req_metrics(&ex->base), ex->replica);
    ex->have_replica = true;
    lg_upstream_kind kind = pool_kind(pool, ex->replica);
    if (ex->api->takes_rid) ex_random_hex(ex->at.rid, 16);

    rw_opts o = {.upstream_kind = (int)kind,
                 .rid = kind == LG_UPSTREAM_SGLANG && ex->at.rid[0] ? ex->at.rid : NULL,
                 .history = (int)cfg->reasoning.history,
                 .raw = ex->body.len ? ex->body.p : NULL, /* the first attempt's (begin) */
                 .raw_len = ex->body.len};
    ex_plan_in pin = {.attempt = k,
                      .has_prefix = has_prefix,
                      .client_stream = ex->req.client_stream,
                      .upstream_kind = (int)kind,
                      .api_can_continue = ex->api->can_continue,
                      .prompt_continuable = ex->req.chat || ex->req.prompt_is_string,
                      .guard_on = ex->guard_on};
    ex_plan plan = ex_plan_attempt(cfg, &pin);
    o.step = plan.step;
    if (plan.step) o.seed = (unsigned)(next_random() & 0x7fffffff);
    lg_buf prefix = LG_BUF_INIT;
    bool cont = plan.cont;
    if (cont) {
        continuation_text(ex, &prefix);
        o.continue_text = prefix.p;
        o.continue_len = prefix.len;
    }
    /* A whole response restarts from scratch: the client has seen nothing. */
    if (plan.restart)
        for (int c = 0; c < LG_CH_COUNT; c++)
            lg_buf_reset(&ex->cl.sent[c]);
    ex->api->attempt_begins(ex, plan.restart);
    rw_error err = {0};
    ex->at.up_body = ex->api->build(ex, &o, &err);
    if (!ex->at.up_body && cont) { /* this upstream cannot continue: restart instead */
        o.continue_text = NULL, o.continue_len = 0, cont = false;
        ex->at.up_body = ex->api->build(ex, &o, &err);
    }
    if (!ex->at.up_body) {
        lg_buf_free(&prefix);
        ex_fail(ex, err.status ? err.status : 400, err.message ? err.message : "invalid request",
                "invalid_request_error", err.code);
        return;
    }
    ex->at.sampling_opts =
        (rw_opts){.upstream_kind = o.upstream_kind, .step = o.step, .seed = o.seed};
    ex->at.sampling = true;
    lg_buf_free(&prefix);

    ex->at.guarded = plan.guarded;
    sse_parser_init(&ex->at.sse, SSE_DEFAULT_MAX_EVENT, ex_on_event, ex);
    sse_parser_vouch(&ex->at.sse, ex->api->vouch);
    if (cont && ex->think_inline && ex->cl.sent[LG_CH_CONTENT].len == 0)
        ex->at.think = think_new(true);
    ex->at.tokens = ex->at.tokens_after_trip = 0;
    ex->at.first_byte = ex->at.finished_gen = ex->at.saw_done = ex->at.timed_out =
        ex->at.up_paused = false;
    ex->at.not_sse = ex->at.connected = false;
    ex->at.start_ns = ex->at.last_event_ns = req_now(&ex->base);

    char *url = pool_url(pool, ex->replica, ex->api->upstream_path);
    ex->at.headers = http_upstream_headers(ex->base.conn, true);
    /* A plain-HTTP upstream without a proxy: the worker speaks HTTP itself, on a connection
     * libcurl opens (worker.h); any other goes on libcurl. */
    lg_uplink_req rq = {.url = url,
                        .headers = ex->at.headers,
                        .body = ex->at.up_body,
                        .body_len = strlen(ex->at.up_body),
                        .header = ex_on_header,
                        .connected = on_connected};
    if (worker_uplink_start(w, &ex->xfer, &rq)) {
        lg_xfree(url);
        return;
    }
    /* A plain-HTTP upstream's event stream is read by the worker, not by libcurl (worker.c,
     * "the response body outside libcurl"): libcurl reads its head and its end, for which
     * its smallest buffer does. Other upstreams' buffers follow the reads (upread.h). */
    ex->at.rbuf = strncasecmp(url, "http://", 7) == 0 ? UPREAD_HEAD : upread_take();
    /* Every option that differs between attempts, every time: a kept handle still has the
     * last attempt's (worker_easy_get); the others once, on a fresh handle. */
    bool fresh;
    CURL *e = ex->at.easy = worker_easy_get(w, &fresh);
    curl_easy_setopt(e, CURLOPT_URL, url); /* libcurl keeps a copy */
    /* The same URL parsed once (or NULL: libcurl parses the string); the string stays
     * libcurl's record of the URL (a retry on a fresh connection reads it). */
    curl_easy_setopt(e, CURLOPT_CURLU, worker_upstream_url(w, url));
    lg_xfree(url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, &ex->xfer);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, ex->at.headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, ex->at.up_body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(ex->at.up_body));
    curl_easy_setopt(e, CURLOPT_HEADERDATA, ex);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, ex);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, ex);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, (long)ex->at.rbuf);
    if (fresh) {
        curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, ex_on_header);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, ex_on_write);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        /* The connect timeout is ex_tick's: libcurl would keep its timer armed for the
         * whole transfer, and with it every transfer younger than connect_ms in its timer
         * tree, which each read re-sorts (3 % of the CPU at 1,000 paced streams). */
        curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
        curl_easy_setopt(e, CURLOPT_HTTP_CONTENT_DECODING, 0L);
    }
    if ((fresh ? worker_add_xfer(w, e) : worker_add_kept_xfer(w, e)) != 0) {
        stop_transfer(ex);
        attempt_failed(ex, CURLE_FAILED_INIT);
    }
}

/* ---- the client side --------------------------------------------------------------- */

/* Output left `out` (taken by the content reader or written directly): the added-latency
 * figure, and the upstream resumes once a slow client has drained half of it. */
static void output_taken(exchange *ex)
{
    uint64_t now = lg_now_ns();
    metrics_added_latency(req_metrics(&ex->base), seconds_since(ex->cl.out_since_ns, now));
    ex->cl.out_since_ns = now;
    ex->cl.last_out_ns = now;
    if (ex->at.up_paused && lg_fifo_len(&ex->cl.out) < EX_OUT_HIGH / 2 && transfer_running(ex)) {
        ex->at.up_paused = false;
        ex->at.last_event_ns = req_now(&ex->base); /* time paused for the client is not idle time */
        if (!worker_body_resume(ex->base.w, &ex->xfer) && ex->at.easy) /* the worker's: later */
            curl_easy_pause(ex->at.easy, CURLPAUSE_CONT); /* may deliver data right here */
    }
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    exchange *ex = cls;
    (void)pos;
    if (ex->base.client_gone) return MHD_CONTENT_READER_END_WITH_ERROR;
    /* Until the stream ends its output goes out by direct writes, not through a copy into
     * libmicrohttpd's buffer; the end (the stream's last event and chunk) goes through it. */
    if (!ex->cl.ended && worker_go_direct(&ex->base, buf, max)) {
        if (lg_fifo_len(&ex->cl.out)) worker_output(&ex->base);
        return 0;
    }
    if (lg_fifo_len(&ex->cl.out)) {
        size_t k = lg_fifo_take(&ex->cl.out, buf, max);
        output_taken(ex);
        return (ssize_t)k;
    }
    if (ex->cl.ended) return MHD_CONTENT_READER_END_OF_STREAM;
    worker_suspend(&ex->base);
    return 0;
}

void ex_out_raw(exchange *ex, const char *s, size_t n)
{
    if (!ex->cl.may_lend || ex->cl.lent_len || lg_fifo_len(&ex->cl.out) || !n ||
        !ex->req.client_stream || ex->cl.ended) {
        out_append(ex, s, n);
        return;
    }
    ex->cl.out_since_ns = req_now(&ex->base);
    if (!ex->cl.first_out_ns) ex->cl.first_out_ns = ex->cl.out_since_ns;
    ex->cl.lent = s;
    ex->cl.lent_len = n;
}

void ex_out_retract(exchange *ex, size_t mark)
{
    if (ex->cl.lent_len) { /* a lent event is all that is queued (ex_out_raw) */
        if (!mark) ex->cl.lent_len = 0;
        return;
    }
    lg_fifo_cut(&ex->cl.out, mark);
}

void ex_out_keep(exchange *ex)
{
    lg_fifo_append(&ex->cl.out, ex->cl.lent, ex->cl.lent_len);
    ex->cl.lent_len = 0;
}

void ex_out_settle(exchange *ex)
{
    if (!ex->cl.lent_len) return;
    if (worker_write_now(&ex->base, ex->cl.lent, ex->cl.lent_len)) {
        ex->cl.lent_len = 0;
        output_taken(ex);
        return;
    }
    ex_out_keep(ex);
    worker_output(&ex->base);
}

/* Direct writes (worker.h): all of `out` as one chunk. */
static void ex_flush(lg_req *base)
{
    exchange *ex = (exchange *)base;
    size_t n;
    const char *p = lg_fifo_peek(&ex->cl.out, &n);
    if (!n) return;
    worker_write_chunk(base, p, n);
    lg_fifo_drop(&ex->cl.out, n);
    lg_fifo_shrink(&ex->cl.out, EX_OUT_KEEP);
    output_taken(ex);
}

static void add_loopguard_headers(const exchange *ex, struct MHD_Response *resp)
{
    char n[16];
    snprintf(n, sizeof n, "%u", ex->attempt);
    MHD_add_response_header(resp, "X-Loopguard-Attempts", n);
    snprintf(n, sizeof n, "%u", ex->rec.trips);
    MHD_add_response_header(resp, "X-Loopguard-Trips", n);
}

/* Queues resp (consumed) as the client's response with `status`, counted in the metrics;
 * its head says "Connection: close" when the worker sheds connections (worker_shed). */
static enum MHD_Result queue_response(exchange *ex, unsigned status, struct MHD_Response *resp)
{
    if (worker_shed(ex->base.w)) MHD_add_response_header(resp, "Connection", "close");
    ex->cl.queued = true;
    metrics_request(req_metrics(&ex->base), ex->api->endpoint, (int)status);
    enum MHD_Result rc = MHD_queue_response(ex->base.conn, status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result queue_final(exchange *ex)
{
    const char *body = ex->cl.final_body ? ex->cl.final_body : "";
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    /* The upstream's own headers (x-request-id, …) except its event-stream type. */
    if (ex->at.head.complete) http_head_apply(&ex->at.head, resp, true);
    MHD_add_response_header(resp, "Content-Type",
                            ex->cl.final_ctype ? ex->cl.final_ctype : "application/json");
    add_loopguard_headers(ex, resp);
    return queue_response(ex, (unsigned)ex->cl.final_status, resp);
}

/* A stream that ended before its head went out (a short answer, read whole from the
 * upstream) leaves as one response of known length: libmicrohttpd sends its head and body
 * in one call, where a chunked one takes three (head, events, last chunk), each in a loop
 * pass of its own. */
static enum MHD_Result queue_stream(exchange *ex)
{
    struct MHD_Response *resp;
    if (ex->cl.ended) {
        size_t n;
        const char *p = lg_fifo_peek(&ex->cl.out, &n);
        resp = MHD_create_response_from_buffer(n, (void *)p, MHD_RESPMEM_MUST_COPY);
        if (resp) {
            lg_fifo_drop(&ex->cl.out, n);
            output_taken(ex);
        }
    } else {
        resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, EX_BLOCK, reader, ex, NULL);
    }
    if (!resp) return MHD_NO;
    if (ex->at.head.complete) {
        http_head_apply(&ex->at.head, resp, false);
        http_head_drop_fields(&ex->at.head); /* the response holds its own copies */
    } else
        MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
    ex->cl.last_out_ns = req_now(&ex->base);
    return queue_response(ex, 200, resp);
}

/* The body is complete: validate it and start the first attempt. Returns false when a
 * final (error) response is ready instead. */
static bool begin(exchange *ex)
{
    const lg_config *cfg = cfg_of(ex);
    struct MHD_Connection *conn = ex->base.conn;
    rw_error err = {0};

    if (ex->body_too_big) {
        ex->cl.final_status = 413;
        ex->cl.final_body = ex->api->error_body(413, "request body too large",
                                                "invalid_request_error", "body_too_large");
        return false;
    }
    /* Before any tree is built: one value, no repeated key, within the node and depth
     * budget (jsonguard.h), so the body costs at most its budget and the upstream reads
     * what the guard reads. */
    char why[200];
    const jg_limits lim = {cfg->limits.max_json_nodes, cfg->limits.max_json_depth};
    if (jsonguard_check(ex->body.p ? ex->body.p : "", ex->body.len, &lim, why, sizeof why)) {
        ex->cl.final_status = 400;
        ex->cl.final_body = ex->api->error_body(400, why, "invalid_request_error", "invalid_json");
        return false;
    }
    if (ex->api->parse(ex, ex->body.p ? ex->body.p : "", ex->body.len, &err) != 0) {
        ex->cl.final_status = err.status ? err.status : 400;
        ex->cl.final_body =
            ex->api->error_body(ex->cl.final_status, err.message ? err.message : "invalid request",
                                "invalid_request_error", err.code ? err.code : err.param);
        return false;
    }
    ex->rule = config_model_rule(cfg, ex->req.model);
    ex->mode = cfg->reasoning.output;
    const char *want = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Loopguard-Reasoning");
    if (want && cfg->reasoning.allow_client_choice &&
        config_reasoning_output_parse(want, &ex->mode) != 0) {
        ex->cl.final_status = 400;
        ex->cl.final_body = ex->api->error_body(400,
                                                "X-Loopguard-Reasoning must be "
                                                "reasoning_content, reasoning, inline or hide",
                                                "invalid_request_error", "bad_header");
        return false;
    }
    ex->guard_on = cfg->guard.enabled;
    if (ex->rule && ex->rule->guard_enabled >= 0) ex->guard_on = ex->rule->guard_enabled;
    const char *off = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Loopguard");
    if (off && strcasecmp(off, "off") == 0 && cfg->guard.allow_client_off) ex->guard_on = false;
    ex->think_opened = ex->rule && ex->rule->think_opened == 1 && ex->req.enable_thinking != 0;
    if (ex->req.client_stream) {
        metrics_streams(req_metrics(&ex->base), 1);
        ex->cl.counted_stream = true;
    }
    ex->phase = PHASE_RUNNING;
    start_attempt(ex); /* may splice the body into the first attempt's (rw_opts.raw) */
    lg_buf_free(&ex->body);
    return ex->phase != PHASE_DONE || !ex->cl.final_body;
}

static enum MHD_Result ex_access(lg_req *base, const char *upload, size_t *upload_size)
{
    exchange *ex = (exchange *)base;
    if (*upload_size) {
        if (ex->body.len + *upload_size > cfg_of(ex)->max_body_bytes) {
            ex->body_too_big = true; /* keep reading, keep nothing: 413 at the end */
            lg_buf_free(&ex->body);
        } else if (!ex->body_too_big) {
            lg_buf_append(&ex->body, upload, *upload_size);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (ex->phase == PHASE_BODY && !begin(ex)) {
        ex->phase = PHASE_DONE;
        return queue_final(ex);
    }
    if (ex->cl.queued) return MHD_YES;
    if (ex->cl.final_body) return queue_final(ex);
    if (ex->cl.stream_ready || (ex->req.client_stream && ex->cl.ended)) return queue_stream(ex);
    worker_suspend(base);
    return MHD_YES;
}

static void ex_tick(lg_req *base, uint64_t now)
{
    exchange *ex = (exchange *)base;
    const lg_config *cfg = cfg_of(ex);
    if (ex->phase != PHASE_RUNNING) return;
    if (ex->at.aborts.len) send_pending_aborts(ex);
    if (transfer_running(ex)) {
        uint64_t cm = (uint64_t)cfg->timeouts.connect_ms * 1000000ull;
        if (!ex->at.connected && now > ex->at.start_ns && now - ex->at.start_ns > cm) {
            /* As libcurl's own connect timeout ends it: another replica may answer. */
            stop_transfer(ex);
            attempt_failed(ex, CURLE_OPERATION_TIMEDOUT);
            return;
        }
        uint64_t fb = (uint64_t)cfg->timeouts.first_byte_ms * 1000000ull;
        uint64_t idle = (uint64_t)cfg->timeouts.idle_ms * 1000000ull;
        if ((!ex->at.first_byte && fb && now > ex->at.start_ns && now - ex->at.start_ns > fb) ||
            (ex->at.first_byte && idle && !ex->at.up_paused && now > ex->at.last_event_ns &&
             now - ex->at.last_event_ns > idle)) {
            ex->at.timed_out = true;
            abort_attempt(ex);
            attempt_failed(ex, CURLE_OPERATION_TIMEDOUT);
            return;
        }
    }
    lg_fifo_shrink(&ex->cl.out, EX_OUT_KEEP);
    /* Keep intermediaries from timing out while text is held back or a retry runs. */
    uint64_t ka = (uint64_t)cfg->guard.keepalive_ms * 1000000ull;
    if (ex->req.client_stream && ex->cl.queued && !ex->cl.ended && ka &&
        lg_fifo_len(&ex->cl.out) == 0 && now > ex->cl.last_out_ns &&
        now - ex->cl.last_out_ns >= ka) {
        out_append(ex, ": keep-alive\n\n", 14);
        ex->cl.last_out_ns = now;
    }
}

static void ex_client_gone(lg_req *base)
{
    exchange *ex = (exchange *)base;
    if (ex->phase == PHASE_RUNNING) {
        bool running = transfer_running(ex);
        abort_attempt(ex);
        ex_set_outcome(ex, "client_gone");
        if (ex->rec.trips && running) ex_record_attempt(ex, NULL);
    }
    ex_conclude(ex);
}

static void ex_shutdown(lg_req *base)
{
    exchange *ex = (exchange *)base;
    if (ex->phase != PHASE_RUNNING) return;
    abort_attempt(ex);
    ex_fail(ex, 503, "loopguard is shutting down", "server_error", "shutting_down");
}

static void ex_destroy(lg_req *base)
{
    exchange *ex = (exchange *)base;
    write_incident(ex);
    accesslog_exchange(ex);
    attempt_reset(ex);
    if (ex->cl.counted_stream) metrics_streams(req_metrics(&ex->base), -1);
    for (int c = 0; c < LG_CH_COUNT; c++)
        lg_buf_free(&ex->cl.sent[c]);
    rw_request_clear(&ex->req);
    ex->api->destroy(ex);
    lg_buf_free(&ex->body);
    lg_fifo_free(&ex->cl.out);
    lg_buf_free(&ex->cl.text[EX_TEXT_R]);
    lg_buf_free(&ex->cl.text[EX_TEXT_C]);
    lg_xfree(ex->cl.final_body);
    lg_xfree(ex->cl.final_ctype);
    lg_xfree(ex->rec.excerpt);
    cJSON_Delete(ex->rec.attempts);
    lg_xfree(ex->block); /* kept for the worker's next request (xalloc.h) */
}

static const lg_req_ops exchange_ops = {
    .name = "exchange",
    .access = ex_access,
    .client_gone = ex_client_gone,
    .tick = ex_tick,
    .shutdown = ex_shutdown,
    .destroy = ex_destroy,
    .flush = ex_flush,
};

/* exchange_int.h's layout: the request's per-token fields on its first line, the transfer
 * from the third, the client side's first two lines on two lines of their own, the
 * attempt's per-token fields (head.status included) on one. */
_Static_assert(offsetof(lg_req, tail) + sizeof(lg_fifo) <= 64, "lg_req's first line");
_Static_assert(offsetof(exchange, xfer) == 128, "the transfer from the third line");
_Static_assert(offsetof(exchange, cl) % 64 == 0 &&
                   offsetof(ex_client, sent) + 2 * sizeof(lg_buf) <= 128,
               "the client side's per-token fields");
_Static_assert(offsetof(ex_attempt, head) + sizeof(int) <= 64, "the attempt's first line");
_Static_assert(offsetof(sse_parser, has_id) + sizeof(bool) <= 64, "the parser's first line");
_Static_assert(sizeof(chan) == 128 && offsetof(chan, run.last) == 64, "a channel's first line");

/* lg_xfer.warm: before the worker reads a token's bytes, the lines the token will read are
 * fetched, so that their misses overlap the read's system call rather than follow one
 * another through the event (with 1,000 paced streams every token finds its exchange cold):
 * the exchange's lines up to the client side's two (the layout above), the attempt's first
 * line and its parser's, then what the API module reads of its state, and the first line
 * and the guard of each channel fed this attempt (`fed`: a token reads no other channel's
 * lines). Each load here waits for its line while the other fetches are in flight. */
static void ex_warm(void *ud)
{
    const exchange *ex = ud;
    for (size_t off = 0; off < offsetof(exchange, cl) + 128; off += 64)
        __builtin_prefetch((const char *)ex + off);
    __builtin_prefetch(&ex->at);
    __builtin_prefetch(&ex->at.sse);
    if (ex->api->warm) ex->api->warm(ex);
    for (int c = 0; c < LG_CH_COUNT; c++)
        if (ex->at.fed & 1u << c) {
            __builtin_prefetch(&ex->at.ch[c]);
            if (ex->at.ch[c].g) guard_warm(ex->at.ch[c].g);
        }
}

lg_req *exchange_new(lg_worker *w, struct MHD_Connection *conn, const lg_api *api)
{
    /* Aligned as its type asks (exchange_int.h's layout: whole cache lines). */
    _Static_assert(_Alignof(exchange) == 64, "lg_xcalloc_lines' alignment");
    void *block;
    exchange *ex = lg_xcalloc_lines(sizeof *ex, &block);
    ex->block = block;
    worker_req_init(w, &ex->base, &exchange_ops, conn);
    ex->xfer = (lg_xfer){.done = on_done, .owner = ex, .body = ex_on_write, .warm = ex_warm};
    ex->api = api;
    ex->rec.attempts = lg_xcheck(cJSON_CreateArray());
    http_head_clear(&ex->at.head);
    memcpy(ex->id, "lg-", 3);
    ex_random_hex(ex->id + 3, 12);
    return &ex->base;
}
