/* exchange.c — the guarded exchange, loopguard's main job: a request's life.
 *
 * One client request (chat or text completion) becomes one or more upstream attempts. The
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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "proxy/exchange_int.h"
#include "proxy/jsonguard.h"

/* libmicrohttpd reads a chunked (HTTP/1.1) stream straight into the connection's write
 * buffer, which lives in its per-connection pool (max_header_bytes); the response's own
 * block only serves HTTP/1.0 clients, which get no chunking. Small: memory per stream. */
#define EX_BLOCK 1024
/* libcurl's read buffer per stream. libcurl 7.88 polls the socket after every read, so a
 * saturated stream costs a recvfrom and a poll per buffer: 8 KiB halves both against 4 KiB
 * (0.46-0.48 against 0.50-0.52 µs of CPU per event at 100 saturated streams) for 4 KiB more
 * per stream (58.5 -> 62.6 KiB at 5,000 paced streams; 16 KiB would break the 64 KiB goal). */
#define EX_UP_READ 8192
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
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(ex->req.root,
                                                      ex->chat ? "messages" : "prompt");
    if (cap == LG_CAPTURE_FULL) return cJSON_Duplicate(p, 1);
    /* excerpt: the last user message (or the prompt), at most 300 bytes */
    const char *text = NULL;
    if (cJSON_IsString(p)) text = p->valuestring;
    for (const cJSON *m = cJSON_IsArray(p) ? p->child : NULL; m; m = m->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(role) && strcmp(role->valuestring, "user") == 0 &&
            cJSON_IsString(content))
            text = content->valuestring;
    }
    if (!text) return NULL;
    char buf[304];
    size_t n = strlen(text);
    if (n > 300) n = 300;
    memcpy(buf, text, n);
    buf[n] = '\0';
    return cJSON_CreateString(buf);
}

static void write_incident(exchange *ex)
{
    lg_server *srv = ex->base.w->srv;
    if (ex->trips == 0 || !srv->incidents || !ex->attempts) return; /* once */
    char ts[40];
    iso_now(ts, sizeof ts);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "ts", ts);
    cJSON_AddStringToObject(o, "id", ex->id);
    if (ex->req.model)
        cJSON_AddStringToObject(o, "model", ex->req.model);
    else
        cJSON_AddNullToObject(o, "model");
    cJSON_AddStringToObject(o, "endpoint", ex->endpoint);
    cJSON_AddBoolToObject(o, "stream", ex->req.client_stream);
    cJSON_AddStringToObject(o, "outcome", ex->outcome ? ex->outcome : "failed");
    cJSON_AddNumberToObject(o, "trips", ex->trips);
    cJSON_AddItemToObject(o, "attempts", ex->attempts);
    ex->attempts = NULL;
    if (ex->excerpt) cJSON_AddStringToObject(o, "excerpt", ex->excerpt);
    cJSON *prompt = prompt_capture(ex);
    if (prompt) cJSON_AddItemToObject(o, "prompt", prompt);
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (line) incident_log_submit(srv->incidents, line);
}

void ex_conclude(exchange *ex)
{
    ex->phase = PHASE_DONE;
    write_incident(ex);
}

void ex_set_outcome(exchange *ex, const char *outcome)
{
    if (ex->outcome) return;
    ex->outcome = outcome;
    if (ex->trips) metrics_outcome(ex->base.w->metrics, outcome);
}

/* ---- attempts ---------------------------------------------------------------------- */

/* Tells SGLang to stop decoding the attempt's rid: recent SGLang versions keep decoding a
 * request whose client left (sglang issues 36333, 34894), so closing is not enough. */
static void send_sglang_abort(exchange *ex)
{
    lg_worker *w = ex->base.w;
    char url[2048], body[64];
    snprintf(body, sizeof body, "{\"rid\":\"%s\"}", ex->rid);
    snprintf(url, sizeof url, "%s/abort_request", pool_base(w->srv->pool, ex->replica));
    worker_post_detached(w, url, body);
}

/* Closes the current attempt's transfer (if any) and frees its per-attempt state. Safe
 * outside libcurl callbacks only. */
static void stop_transfer(exchange *ex)
{
    if (ex->easy) {
        worker_remove_xfer(ex->base.w, ex->easy);
        curl_easy_cleanup(ex->easy);
        ex->easy = NULL;
    }
    if (ex->have_replica) {
        pool_release(ex->base.w->srv->pool, ex->replica);
        ex->have_replica = false;
    }
    curl_slist_free_all(ex->headers);
    ex->headers = NULL;
    free(ex->up_body);
    ex->up_body = NULL;
}

/* Stops the attempt at the server: close the transfer and, for SGLang, abort the rid. */
static void abort_attempt(exchange *ex)
{
    bool was_running = ex->easy != NULL;
    size_t replica = ex->replica;
    stop_transfer(ex);
    ex->replica = replica;
    if (was_running && pool_kind(ex->base.w->srv->pool, replica) == LG_UPSTREAM_SGLANG &&
        ex->rid[0])
        send_sglang_abort(ex);
}

static void free_attempt_state(exchange *ex)
{
    sse_parser_free(ex->sse);
    ex->sse = NULL;
    think_free(ex->think);
    ex->think = NULL;
    for (int c = 0; c < LG_CH_COUNT; c++) {
        guard_free(ex->ch[c].g);
        ex->ch[c].g = NULL;
        lg_buf_reset(&ex->ch[c].held);
        ex->ch[c].attempt_bytes = 0;
        memset(&ex->ch[c].run, 0, sizeof ex->ch[c].run);
    }
    http_head_clear(&ex->head);
    lg_buf_reset(&ex->errbody);
    cJSON_Delete(ex->sampling);
    ex->sampling = NULL;
}

void ex_record_attempt(exchange *ex, const guard_verdict *v)
{
    if (!ex->attempts) return; /* the incident is already written */
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "attempt", ex->attempt);
    cJSON_AddStringToObject(a, "rid", ex->rid);
    cJSON_AddStringToObject(a, "upstream", pool_base(ex->base.w->srv->pool, ex->replica));
    if (v) {
        cJSON_AddStringToObject(a, "detector", ex->verdict_detector);
        cJSON_AddStringToObject(a, "channel", guard_channel_name(v->channel));
        cJSON_AddStringToObject(a, "unit", ex->verdict_unit);
        cJSON_AddNumberToObject(a, "repeats", v->repeats);
        cJSON_AddNumberToObject(a, "loop_start", (double)v->loop_start);
        cJSON_AddNumberToObject(a, "at_byte", (double)v->at_byte);
    } else {
        cJSON_AddNullToObject(a, "detector");
    }
    cJSON_AddNumberToObject(a, "tokens", (double)ex->tokens);
    cJSON_AddNumberToObject(a, "tokens_after_trip", (double)ex->tokens_after_trip);
    cJSON_AddItemToObject(a, "sampling", ex->sampling ? ex->sampling : cJSON_CreateObject());
    ex->sampling = NULL;
    cJSON_AddNumberToObject(a, "ms",
                            (double)((ex->base.w->now_ns - ex->attempt_start_ns) / 1000000));
    cJSON_AddBoolToObject(a, "guarded", ex->attempt_guarded);
    cJSON_AddItemToArray(ex->attempts, a);
}

/* ---- the end of an exchange -------------------------------------------------------- */

bool ex_streaming_started(const exchange *ex)
{
    return ex->req.client_stream && (ex->queued || ex->stream_ready);
}

static void end_stream(exchange *ex)
{
    if (!ex->req.client_stream || ex->ended) return;
    if (ex->trips) {
        char c[128];
        int n = snprintf(c, sizeof c, ": X-Loopguard-Attempts: %u\n: X-Loopguard-Trips: %u\n\n",
                         ex->attempt, ex->trips);
        out_append(ex, c, (size_t)n);
    }
    if (ex->done_raw.len && !ex->trips)
        out_append(ex, ex->done_raw.p, ex->done_raw.len);
    else
        out_append(ex, "data: [DONE]\n\n", 14);
    ex->ended = true;
    worker_resume(&ex->base);
}

void ex_fail(exchange *ex, int status, const char *message, const char *type, const char *code)
{
    if (ex->phase == PHASE_DONE) return;
    ex_conclude(ex);
    if (ex_streaming_started(ex)) {
        char *json = dl_error_json(message, type, code, status);
        ex_out_event(ex, json);
        free(json);
        end_stream(ex);
    } else {
        ex->final_status = status;
        ex->final_body = dl_error_json(message, type, code, status);
        ex->stream_ready = false;
    }
    worker_resume(&ex->base);
}

static void finish_exchange(exchange *ex)
{
    if (ex->phase == PHASE_DONE) return;
    if (ex->trips) ex_set_outcome(ex, "recovered");
    ex_conclude(ex);
    if (ex->req.client_stream) {
        if (ex->mode == LG_REASONING_INLINE && ex->inline_state == 1 && ex->chat) {
            lg_buf close = LG_BUF_INIT;
            lg_buf_append_str(&close, "</think>\n\n");
            char *json = dl_build_synthetic(ex->chat, ex->c_id ? ex->c_id : ex->id,
                                            ex->c_model ? ex->c_model : "", ex->c_created,
                                            NULL, 0, close.p, close.len, (int)ex->mode, NULL);
            ex_out_event(ex, json);
            free(json);
            lg_buf_free(&close);
        }
        end_stream(ex);
    } else {
        for (int c = LG_CH_REASONING; c <= LG_CH_CONTENT; c++)
            asm_text(ex->as, c, ex->ch[c].sent.p, ex->ch[c].sent.len);
        ex->final_status = 200;
        ex->final_body = asm_render(ex->as, (int)ex->mode);
    }
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
    if (ex->req.client_stream)
        ex_emit_chunk(ex, NULL, NULL, 0, NULL, 0, "content_filter");
    else
        asm_set_finish(ex->as, "content_filter");
    finish_exchange(ex);
}

/* The guard tripped in the current attempt (its transfer is already closed). */
static void after_trip(exchange *ex)
{
    lg_worker *w = ex->base.w;
    const guard_verdict *v = &ex->verdict;
    ex->trips++;
    metrics_trip(w->metrics, ex->replica, ex->verdict_detector, (int)v->channel);
    metrics_aborted_tokens(w->metrics, ex->tokens);
    if (pool_report_generation(w->srv->pool, ex->replica, true))
        metrics_ejection(w->metrics, ex->replica);
    if (!ex->excerpt) {
        /* What the model was producing: the released tail plus the held loop. */
        const chan *c = &ex->ch[v->channel];
        lg_buf e = LG_BUF_INIT;
        size_t from = c->sent.len > 128 ? c->sent.len - 128 : 0;
        lg_buf_append(&e, c->sent.p + from, c->sent.len - from);
        lg_buf_append(&e, c->held.p, c->held.len < EX_EXCERPT ? c->held.len : EX_EXCERPT);
        ex->excerpt = lg_buf_steal(&e);
    }
    ex_record_attempt(ex, v);
    free_attempt_state(ex);
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
    lg_worker *w = ex->base.w;
    size_t replica = ex->replica;
    if (!ex->head.complete && rc != CURLE_OK && rc != CURLE_FAILED_INIT && !ex->timed_out &&
        ex->connect_retries + 1 < pool_size(w->srv->pool)) {
        /* The replica never answered: the client must not see a 502 while another one
         * may be healthy. Same attempt, same sampling, another replica. */
        ex->connect_retries++;
        metrics_upstream_error(w->metrics, replica, "connect");
        pool_report_health(w->srv->pool, replica, false);
        free_attempt_state(ex);
        ex->attempt--;
        ex->avoid_replica = true;
        start_attempt(ex);
        return;
    }
    ex_set_outcome(ex, "upstream_error");
    if (ex->trips) ex_record_attempt(ex, NULL);
    if (ex->head.complete && ex->head.status != 200 && !ex->timed_out) {
        pool_report_health(w->srv->pool, replica, ex->head.status < 500);
        if (ex->head.status >= 500) metrics_upstream_error(w->metrics, replica, "http_5xx");
        if (ex->queued) {
            ex_fail(ex, ex->head.status, "upstream error", "upstream_error", NULL);
            return;
        }
        ex_conclude(ex);
        ex->final_status = ex->head.status;
        ex->final_body = lg_buf_steal(&ex->errbody);
        if (ex->head.content_type) ex->final_ctype = strdup(ex->head.content_type);
        ex->stream_ready = false;
        worker_resume(&ex->base);
        return;
    }
    if (ex->not_sse) {
        metrics_upstream_error(w->metrics, replica, "protocol");
        ex_fail(ex, 502, "the upstream did not answer with an event stream", "upstream_error",
                "bad_upstream");
        return;
    }
    bool timeout = ex->timed_out || rc == CURLE_OPERATION_TIMEDOUT;
    metrics_upstream_error(w->metrics, replica,
                           timeout              ? "timeout"
                           : rc == CURLE_OK     ? "protocol"
                           : !ex->head.complete ? "connect"
                                                : "reset");
    pool_report_health(w->srv->pool, replica, false);
    if (timeout)
        ex_fail(ex, 504, "upstream timed out", "upstream_error", "upstream_timeout");
    else if (!ex->head.complete)
        ex_fail(ex, 502, "upstream unreachable", "upstream_error", "upstream_unreachable");
    else
        ex_fail(ex, 502, "upstream stream ended early", "upstream_error", "upstream_truncated");
}

/* The attempt's transfer ended (completed, failed, or failed on purpose after a trip). */
static void on_done(lg_xfer *x, CURLcode rc)
{
    exchange *ex = x->owner;
    lg_worker *w = ex->base.w;
    size_t replica = ex->replica;
    bool sglang = pool_kind(w->srv->pool, replica) == LG_UPSTREAM_SGLANG;
    stop_transfer(ex);
    ex->replica = replica;
    /* An event whose last line ended in a bare CR at the very end is complete now (it may
     * still trip the guard). */
    if (rc == CURLE_OK && !ex->trip_pending && ex->sse && ex->phase == PHASE_RUNNING &&
        !ex->base.client_gone)
        (void)sse_parser_finish(ex->sse);
    if (ex->trip_pending) {
        ex->trip_pending = false;
        if (sglang) send_sglang_abort(ex);
        after_trip(ex);
        return;
    }
    if (ex->base.client_gone || ex->phase == PHASE_DONE) return;
    if ((ex->head.complete && ex->head.status != 200) || ex->not_sse || rc != CURLE_OK ||
        ex->timed_out ||
        !(ex->finished_gen || ex->saw_done)) {
        attempt_failed(ex, rc);
        return;
    }
    pool_report_generation(w->srv->pool, replica, false);
    /* The last attempt ran unguarded because attempts ran out: not a recovery. */
    if (ex->trips && !ex->attempt_guarded) ex_set_outcome(ex, "failed");
    if (ex->trips) {
        ex_record_attempt(ex, NULL);
        metrics_retry_latency(w->metrics, seconds_since(ex->trip_ns, w->now_ns));
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

static void random_hex(char *out, size_t nbytes)
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
    const lg_buf *r = &ex->ch[LG_CH_REASONING].sent, *c = &ex->ch[LG_CH_CONTENT].sent;
    if (!ex->chat || r->len == 0) {
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
    ex->connected = true;
    return CURL_PREREQFUNC_OK;
}

static void start_attempt(exchange *ex)
{
    lg_worker *w = ex->base.w;
    const lg_config *cfg = cfg_of(ex);
    lg_pool *pool = w->srv->pool;
    unsigned k = ++ex->attempt;
    bool has_prefix = ex->ch[LG_CH_REASONING].sent.len || ex->ch[LG_CH_CONTENT].sent.len;

    metrics_attempt(w->metrics, k);
    size_t avoid = ex->avoid_replica || (k > 1 && cfg->retry.elsewhere == LG_ELSEWHERE_AUTO)
                       ? ex->replica
                       : SIZE_MAX;
    ex->avoid_replica = false;
    ex->replica = pool_acquire(pool, avoid);
    metrics_upstream_request(w->metrics, ex->replica);
    ex->have_replica = true;
    lg_upstream_kind kind = pool_kind(pool, ex->replica);
    random_hex(ex->rid, 16);

    rw_opts o = {.upstream_kind = (int)kind,
                 .rid = kind == LG_UPSTREAM_SGLANG ? ex->rid : NULL,
                 .history = (int)cfg->reasoning.history};
    if (k > 1 && cfg->retry.n_ladder) {
        size_t i = k - 2 < cfg->retry.n_ladder ? k - 2 : cfg->retry.n_ladder - 1;
        o.step = &cfg->retry.ladder[i];
        o.seed = (unsigned)(next_random() & 0x7fffffff);
    }
    lg_buf prefix = LG_BUF_INIT;
    /* auto: continue only what a streaming client has already seen; a whole response
     * has shown nothing yet, so it restarts cleanly. */
    bool cont = k > 1 && has_prefix && kind != LG_UPSTREAM_OPENAI &&
                (ex->chat || ex->req.prompt_is_string) &&
                (cfg->retry.mode == LG_RETRY_CONTINUE ||
                 (cfg->retry.mode == LG_RETRY_AUTO && ex->req.client_stream));
    if (cont) {
        continuation_text(ex, &prefix);
        o.continue_text = prefix.p;
        o.continue_len = prefix.len;
    } else if (k > 1 && !ex->req.client_stream) {
        /* A whole response restarts from scratch: the client has seen nothing. */
        for (int c = 0; c < LG_CH_COUNT; c++) lg_buf_reset(&ex->ch[c].sent);
        asm_free(ex->as);
        ex->as = asm_new(ex->chat);
    }
    rw_error err = {0};
    ex->up_body = rw_build_upstream(&ex->req, &o, &err);
    if (!ex->up_body && cont) { /* this upstream cannot continue: restart instead */
        o.continue_text = NULL, o.continue_len = 0, cont = false;
        ex->up_body = rw_build_upstream(&ex->req, &o, &err);
    }
    if (!ex->up_body) {
        lg_buf_free(&prefix);
        ex_fail(ex, err.status ? err.status : 400, err.message ? err.message : "invalid request",
                "invalid_request_error", err.code);
        return;
    }
    ex->sampling = rw_sampling_json(&ex->req, &o);
    lg_buf_free(&prefix);

    ex->attempt_guarded = ex->guard_on && !(k > 1 && k == cfg->retry.max_attempts &&
                                            cfg->retry.on_exhausted == LG_EXHAUSTED_PASS_THROUGH);
    ex->sse = sse_parser_new(SSE_DEFAULT_MAX_EVENT, ex_on_event, ex);
    if (cont && ex->think_inline && ex->ch[LG_CH_CONTENT].sent.len == 0)
        ex->think = think_new(true);
    ex->tokens = ex->tokens_after_trip = 0;
    ex->first_byte = ex->finished_gen = ex->saw_done = ex->timed_out = ex->up_paused = false;
    ex->not_sse = ex->connected = false;
    ex->attempt_start_ns = ex->last_event_ns = w->now_ns;

    char url[2048];
    snprintf(url, sizeof url, "%s%s", pool_base(pool, ex->replica), ex->endpoint);
    ex->headers = http_upstream_headers(ex->base.conn, true);
    CURL *e = ex->easy = curl_easy_init();
    if (!e) abort();
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PRIVATE, &ex->xfer);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, ex->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, ex->up_body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(ex->up_body));
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, ex_on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, ex);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, ex_on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, ex);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    /* The connect timeout is ex_tick's: libcurl would keep its timer armed for the whole
     * transfer, and with it every transfer younger than connect_ms in its timer tree,
     * which each read re-sorts (3 % of the CPU at 1,000 paced streams). */
    curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(e, CURLOPT_PREREQDATA, ex);
    curl_easy_setopt(e, CURLOPT_HTTP_CONTENT_DECODING, 0L);
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, (long)EX_UP_READ);
    if (worker_add_xfer(w, e) != 0) {
        stop_transfer(ex);
        attempt_failed(ex, CURLE_FAILED_INIT);
    }
}

/* ---- the client side --------------------------------------------------------------- */

/* Output left `out` (taken by the content reader or written directly): the added-latency
 * figure, and the upstream resumes once a slow client has drained half of it. */
static void output_taken(exchange *ex)
{
    lg_worker *w = ex->base.w;
    uint64_t now = lg_now_ns();
    metrics_added_latency(w->metrics, seconds_since(ex->out_since_ns, now));
    ex->out_since_ns = now;
    ex->last_out_ns = now;
    if (ex->up_paused && lg_fifo_len(&ex->out) < EX_OUT_HIGH / 2 && ex->easy) {
        ex->up_paused = false;
        ex->last_event_ns = w->now_ns;             /* time paused for the client is not idle time */
        curl_easy_pause(ex->easy, CURLPAUSE_CONT); /* may deliver data right here */
    }
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    exchange *ex = cls;
    (void)pos;
    if (ex->base.client_gone) return MHD_CONTENT_READER_END_WITH_ERROR;
    /* Until the stream ends its output goes out by direct writes, not through a copy into
     * libmicrohttpd's buffer; the end ([DONE] and the last chunk) goes through it. */
    if (!ex->ended && worker_go_direct(&ex->base)) {
        if (lg_fifo_len(&ex->out)) worker_output(&ex->base);
        return 0;
    }
    if (lg_fifo_len(&ex->out)) {
        size_t k = lg_fifo_take(&ex->out, buf, max);
        output_taken(ex);
        return (ssize_t)k;
    }
    if (ex->ended) return MHD_CONTENT_READER_END_OF_STREAM;
    worker_suspend(&ex->base);
    return 0;
}

/* Direct writes (worker.h): all of `out` as one chunk. */
static void ex_flush(lg_req *base)
{
    exchange *ex = (exchange *)base;
    size_t n;
    const char *p = lg_fifo_peek(&ex->out, &n);
    if (!n) return;
    worker_write_chunk(base, p, n);
    lg_fifo_drop(&ex->out, n);
    output_taken(ex);
}

static void add_loopguard_headers(const exchange *ex, struct MHD_Response *resp)
{
    char n[16];
    snprintf(n, sizeof n, "%u", ex->attempt);
    MHD_add_response_header(resp, "X-Loopguard-Attempts", n);
    snprintf(n, sizeof n, "%u", ex->trips);
    MHD_add_response_header(resp, "X-Loopguard-Trips", n);
}

static lg_endpoint endpoint_id(const exchange *ex)
{
    return ex->chat ? LG_EP_CHAT : LG_EP_COMPLETIONS;
}

static enum MHD_Result queue_final(exchange *ex)
{
    const char *body = ex->final_body ? ex->final_body : "";
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                                                MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    /* The upstream's own headers (x-request-id, …) except its event-stream type. */
    if (ex->head.complete) http_head_apply(&ex->head, resp, true);
    MHD_add_response_header(resp, "Content-Type",
                            ex->final_ctype ? ex->final_ctype : "application/json");
    add_loopguard_headers(ex, resp);
    ex->queued = true;
    metrics_request(ex->base.w->metrics, endpoint_id(ex), ex->final_status);
    enum MHD_Result rc = MHD_queue_response(ex->base.conn, (unsigned)ex->final_status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result queue_stream(exchange *ex)
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, EX_BLOCK, reader, ex, NULL);
    if (!resp) return MHD_NO;
    if (ex->head.complete)
        http_head_apply(&ex->head, resp, false);
    else
        MHD_add_response_header(resp, "Content-Type", "text/event-stream; charset=utf-8");
    ex->queued = true;
    ex->last_out_ns = ex->base.w->now_ns;
    metrics_request(ex->base.w->metrics, endpoint_id(ex), 200);
    enum MHD_Result rc = MHD_queue_response(ex->base.conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* The body is complete: validate it and start the first attempt. Returns false when a
 * final (error) response is ready instead. */
static bool begin(exchange *ex)
{
    lg_worker *w = ex->base.w;
    const lg_config *cfg = cfg_of(ex);
    struct MHD_Connection *conn = ex->base.conn;
    rw_error err = {0};

    if (ex->body_too_big) {
        ex->final_status = 413;
        ex->final_body = dl_error_json("request body too large", "invalid_request_error",
                                       "body_too_large", 413);
        return false;
    }
    /* Before any tree is built: one value, no repeated key, within the node and depth
     * budget (jsonguard.h), so the body costs at most its budget and the upstream reads
     * what the guard reads. */
    char why[200];
    const jg_limits lim = {cfg->limits.max_json_nodes, cfg->limits.max_json_depth};
    if (jsonguard_check(ex->body.p ? ex->body.p : "", ex->body.len, &lim, why, sizeof why)) {
        ex->final_status = 400;
        ex->final_body = dl_error_json(why, "invalid_request_error", "invalid_json", 400);
        return false;
    }
    if (rw_parse(ex->body.p ? ex->body.p : "", ex->body.len, ex->chat, &ex->req, &err) != 0) {
        ex->final_status = err.status ? err.status : 400;
        ex->final_body = dl_error_json(err.message ? err.message : "invalid request",
                                       "invalid_request_error", err.code ? err.code : err.param,
                                       ex->final_status);
        return false;
    }
    lg_buf_free(&ex->body);
    ex->rule = config_model_rule(cfg, ex->req.model);
    ex->mode = cfg->reasoning.output;
    const char *want = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Loopguard-Reasoning");
    if (want && cfg->reasoning.allow_client_choice &&
        config_reasoning_output_parse(want, &ex->mode) != 0) {
        ex->final_status = 400;
        ex->final_body = dl_error_json("X-Loopguard-Reasoning must be reasoning_content, "
                                       "reasoning, inline or hide",
                                       "invalid_request_error", "bad_header", 400);
        return false;
    }
    ex->guard_on = cfg->guard.enabled;
    if (ex->rule && ex->rule->guard_enabled >= 0) ex->guard_on = ex->rule->guard_enabled;
    const char *off = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Loopguard");
    if (off && strcasecmp(off, "off") == 0 && cfg->guard.allow_client_off) ex->guard_on = false;
    ex->think_opened = ex->rule && ex->rule->think_opened == 1 && ex->req.enable_thinking != 0;
    if (!ex->req.client_stream) ex->as = asm_new(ex->chat);
    if (ex->req.client_stream) {
        metrics_streams(w->metrics, 1);
        ex->counted_stream = true;
    }
    ex->phase = PHASE_RUNNING;
    start_attempt(ex);
    return ex->phase != PHASE_DONE || !ex->final_body;
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
    if (ex->queued) return MHD_YES;
    if (ex->final_body) return queue_final(ex);
    if (ex->stream_ready || (ex->req.client_stream && ex->ended)) return queue_stream(ex);
    worker_suspend(base);
    return MHD_YES;
}

static void ex_tick(lg_req *base, uint64_t now)
{
    exchange *ex = (exchange *)base;
    const lg_config *cfg = cfg_of(ex);
    if (ex->phase != PHASE_RUNNING) return;
    if (ex->easy) {
        uint64_t cm = (uint64_t)cfg->timeouts.connect_ms * 1000000ull;
        if (!ex->connected && now > ex->attempt_start_ns && now - ex->attempt_start_ns > cm) {
            /* As libcurl's own connect timeout ends it: another replica may answer. */
            stop_transfer(ex);
            attempt_failed(ex, CURLE_OPERATION_TIMEDOUT);
            return;
        }
        uint64_t fb = (uint64_t)cfg->timeouts.first_byte_ms * 1000000ull;
        uint64_t idle = (uint64_t)cfg->timeouts.idle_ms * 1000000ull;
        if ((!ex->first_byte && fb && now > ex->attempt_start_ns &&
             now - ex->attempt_start_ns > fb) ||
            (ex->first_byte && idle && !ex->up_paused && now > ex->last_event_ns &&
             now - ex->last_event_ns > idle)) {
            ex->timed_out = true;
            abort_attempt(ex);
            attempt_failed(ex, CURLE_OPERATION_TIMEDOUT);
            return;
        }
    }
    /* Keep intermediaries from timing out while text is held back or a retry runs. */
    uint64_t ka = (uint64_t)cfg->guard.keepalive_ms * 1000000ull;
    if (ex->req.client_stream && ex->queued && !ex->ended && ka && lg_fifo_len(&ex->out) == 0 &&
        now > ex->last_out_ns && now - ex->last_out_ns >= ka) {
        out_append(ex, ": keep-alive\n\n", 14);
        ex->last_out_ns = now;
    }
}

static void ex_client_gone(lg_req *base)
{
    exchange *ex = (exchange *)base;
    if (ex->phase == PHASE_RUNNING) {
        bool running = ex->easy != NULL;
        abort_attempt(ex);
        ex_set_outcome(ex, "client_gone");
        if (ex->trips && running) ex_record_attempt(ex, NULL);
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
    stop_transfer(ex);
    free_attempt_state(ex);
    if (ex->counted_stream) metrics_streams(ex->base.w->metrics, -1);
    for (int c = 0; c < LG_CH_COUNT; c++) {
        lg_buf_free(&ex->ch[c].held);
        lg_buf_free(&ex->ch[c].sent);
    }
    rw_request_clear(&ex->req);
    asm_free(ex->as);
    lg_buf_free(&ex->body);
    lg_buf_free(&ex->errbody);
    lg_fifo_free(&ex->out);
    lg_buf_free(&ex->done_raw);
    chunkscan_free(&ex->scan);
    lg_buf_free(&ex->text[EX_TEXT_R]);
    lg_buf_free(&ex->text[EX_TEXT_C]);
    free(ex->final_body);
    free(ex->final_ctype);
    free(ex->c_id);
    free(ex->c_model);
    free(ex->excerpt);
    cJSON_Delete(ex->attempts);
    free(ex);
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

lg_req *exchange_new(lg_worker *w, struct MHD_Connection *conn, const char *url)
{
    exchange *ex = calloc(1, sizeof *ex);
    if (!ex) abort();
    worker_req_init(w, &ex->base, &exchange_ops, conn);
    ex->xfer = (lg_xfer){.done = on_done, .owner = ex};
    ex->chat = strcmp(url, "/v1/chat/completions") == 0;
    ex->endpoint = ex->chat ? "/v1/chat/completions" : "/v1/completions";
    ex->attempts = cJSON_CreateArray();
    http_head_clear(&ex->head);
    memcpy(ex->id, "lg-", 3);
    random_hex(ex->id + 3, 12);
    return &ex->base;
}

