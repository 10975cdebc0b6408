/* fake_server.c — the fake upstream's endpoints and its epoll loop; the HTTP parser and
 * writers are in fake_http.c, the scripted "GPU" in fake_gen.c (fake_int.h).
 *
 * Why raw sockets: the fake must control every byte (chunk boundaries, a TCP reset in the
 * middle of a chunk, a chunk header that promises more than it sends) and must feed the
 * benchmark with more than 100k events per second on one core, which rules out anything
 * that buffers or frames for us.
 *
 * Shape: one connection struct per socket. A connection reads and parses one request at
 * a time (keep-alive, pipelined requests wait in the input buffer), then either queues a
 * complete response, or starts a generation that a pump function advances: on a pace
 * tick (timer heap + one timerfd), when the socket drains (EPOLLOUT), or at once. The pump
 * stops when the output buffer holds more than OUT_HIGH bytes, so a reader that does not
 * read stalls its generation and memory stays bounded. A client that leaves is seen by
 * EPOLLRDHUP/EPOLLHUP or a failed write, and the generation is recorded as client_gone
 * with the number of tokens it had produced.
 *
 * Costs: a token costs one JSON render (O(token)) and an append; writes are batched up to
 * BURST bytes per pump call, so with pace 0 a stream costs about one write(2) per 64 KiB. */
#include "fake_int.h"

static int tag_listen, tag_timer, tag_signal; /* epoll data for the non-connection fds */

/* ---- small helpers ---- */

static double ms_since(const server *s, uint64_t t)
{
    return (double)(t - s->t0) / 1e6;
}

void rand_hex(server *s, char *out, int n)
{
    for (int i = 0; i < n; i++) {
        uint64_t x = s->rng;
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        s->rng = x;
        out[i] = fake_hex_digits[(x * 0x2545F4914F6CDD1DULL) >> 60];
    }
    out[n] = '\0';
}

/* ---- timer heap: connections ordered by wake time ---- */

static void heap_swap(server *s, long i, long j)
{
    conn *t = s->heap[i];
    s->heap[i] = s->heap[j];
    s->heap[j] = t;
    s->heap[i]->heap_idx = i;
    s->heap[j]->heap_idx = j;
}

static void heap_fix(server *s, long i)
{
    while (i > 0 && s->heap[(i - 1) / 2]->wake > s->heap[i]->wake) {
        heap_swap(s, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        long l = 2 * i + 1, r = l + 1, m = i;
        if (l < s->nheap && s->heap[l]->wake < s->heap[m]->wake) m = l;
        if (r < s->nheap && s->heap[r]->wake < s->heap[m]->wake) m = r;
        if (m == i) break;
        heap_swap(s, i, m);
        i = m;
    }
}

static void heap_remove(server *s, conn *c)
{
    long i = c->heap_idx;
    if (i < 0) return;
    c->heap_idx = -1;
    s->nheap--;
    if (i != s->nheap) {
        s->heap[i] = s->heap[s->nheap];
        s->heap[i]->heap_idx = i;
        heap_fix(s, i);
    }
}

/* Schedules c to be serviced at when (CLOCK_MONOTONIC ns); replaces an earlier schedule. */
void schedule(server *s, conn *c, uint64_t when)
{
    c->wake = when;
    if (c->heap_idx >= 0) {
        heap_fix(s, c->heap_idx);
        return;
    }
    if (s->nheap == s->capheap) {
        long cap = s->capheap ? s->capheap * 2 : 64;
        conn **h = realloc(s->heap, (size_t)cap * sizeof *h);
        if (!h) {
            fprintf(stderr, "fake_upstream: out of memory\n");
            abort();
        }
        s->heap = h;
        s->capheap = cap;
    }
    c->heap_idx = s->nheap;
    s->heap[s->nheap++] = c;
    heap_fix(s, c->heap_idx);
}

/* Arms the timerfd for the earliest wake, if that changed. */
static void arm_timer(server *s)
{
    uint64_t when = s->nheap ? s->heap[0]->wake : 0;
    if (when == s->armed) return;
    s->armed = when;
    struct itimerspec its = {0};
    if (when) {
        its.it_value.tv_sec = (time_t)(when / 1000000000ULL);
        its.it_value.tv_nsec = (long)(when % 1000000000ULL);
        if (!its.it_value.tv_sec && !its.it_value.tv_nsec) its.it_value.tv_nsec = 1;
    }
    if (timerfd_settime(s->tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
        perror("fake_upstream: timerfd_settime");
}

/* ---- records ---- */

static void put_json_or_string(fbuf *b, const fbuf *body, const cJSON *parsed)
{
    if (parsed) {
        char *p = cJSON_PrintUnformatted(parsed);
        fbuf_puts(b, p ? p : "null");
        free(p);
    } else if (!body->len) {
        fbuf_puts(b, "null");
    } else {
        fbuf_json_str(b, body->p, body->len, false);
    }
}

/* The headers as a JSON object with lower-case names; repeated names joined by ", ".
 * Returns a new object owned by the caller. */
static cJSON *headers_json(const conn *c)
{
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < c->nhdrs; i++) {
        cJSON *old = cJSON_GetObjectItemCaseSensitive(o, c->hdrs[i].name);
        if (old) {
            size_t n = strlen(old->valuestring) + strlen(c->hdrs[i].value) + 3;
            char *j = malloc(n);
            if (!j) continue;
            snprintf(j, n, "%s, %s", old->valuestring, c->hdrs[i].value);
            cJSON_ReplaceItemInObjectCaseSensitive(o, c->hdrs[i].name, cJSON_CreateString(j));
            free(j);
        } else {
            cJSON_AddStringToObject(o, c->hdrs[i].name, c->hdrs[i].value);
        }
    }
    return o;
}

static void record_request(server *s, const conn *c, const cJSON *hj, const cJSON *body,
                           const char *rid, int resp)
{
    fbuf *b = &s->tmp;
    if (!fake_records_begin(&s->rec, b, "request", ms_since(s, c->t_req))) return;
    fbuf_puts(b, ",\"method\":");
    fbuf_json_str(b, c->method, strlen(c->method), false);
    fbuf_puts(b, ",\"path\":");
    fbuf_json_str(b, c->path, strlen(c->path), false);
    fbuf_puts(b, ",\"query\":");
    fbuf_json_str(b, c->query, c->query ? strlen(c->query) : 0, false);
    char *h = cJSON_PrintUnformatted(hj);
    fbuf_printf(b, ",\"headers\":%s,\"body\":", h ? h : "{}");
    free(h);
    put_json_or_string(b, &c->body, body);
    fbuf_puts(b, ",\"rid\":");
    fbuf_json_str(b, rid, rid ? strlen(rid) : 0, false);
    if (resp == INT_MIN)
        fbuf_puts(b, ",\"response\":null");
    else
        fbuf_printf(b, ",\"response\":%d", resp);
    fake_records_commit(&s->rec, b);
}

void record_generation(server *s, const gen *g, const char *ended, bool client_gone)
{
    fbuf *b = &s->tmp;
    uint64_t now = fake_now_ns();
    if (!fake_records_begin(&s->rec, b, "generation", ms_since(s, now))) return;
    fbuf_puts(b, ",\"rid\":");
    fbuf_json_str(b, g->rid, g->rid ? strlen(g->rid) : 0, false);
    fbuf_puts(b, ",\"id\":");
    fbuf_json_str(b, g->id, strlen(g->id), false);
    fbuf_printf(b,
                ",\"path\":\"%s\",\"stream\":%s,\"response\":%d,\"tokens_sent\":%ld,"
                "\"tokens_planned\":%ld,\"client_gone\":%s,\"aborted\":%s,\"ended\":\"%s\","
                "\"finish_reason\":",
                g->path, g->stream ? "true" : "false", g->resp_index, g->sent,
                g->plan.total == LONG_MAX ? -1L : g->plan.total, client_gone ? "true" : "false",
                g->aborted ? "true" : "false", ended);
    /* A generation that did not reach its end has no finish reason. */
    const char *fin = strcmp(ended, "complete") && strcmp(ended, "aborted") ? NULL : g->finish;
    fbuf_json_str(b, fin, fin ? strlen(fin) : 0, false);
    fbuf_printf(b, ",\"ms\":%.3f", (double)(now - g->t_start) / 1e6);
    fake_records_commit(&s->rec, b);
}

static void reset_request(conn *c)
{
    free(c->headbuf);
    c->headbuf = NULL;
    c->method = c->path = c->query = NULL;
    c->nhdrs = 0;
    c->head_done = false;
    c->chunked = false;
    c->clen = 0;
    c->ck_state = 0;
    c->ck_left = 0;
    fbuf_reset(&c->body);
}

/* Closes and frees c. rst: abortive close (TCP RST). */
void conn_close(server *s, conn *c, bool rst)
{
    if (c->g) gen_end(s, c, "client_gone", true);
    heap_remove(s, c);
    if (rst) {
        struct linger l = {1, 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    reset_request(c);
    fbuf_free(&c->in);
    fbuf_free(&c->out);
    fbuf_free(&c->body);
    free(c);
}

static void set_epollout(server *s, conn *c, bool on)
{
    if (c->ev_out == on) return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0), .data.ptr = c};
    if (epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev) < 0) perror("fake_upstream: epoll_ctl");
    c->ev_out = on;
}

size_t pending(const conn *c)
{
    return c->out.len - c->out_off;
}

/* Writes what it can. Returns false when c was closed (and freed): the caller must not
 * touch c again. When the output is drained and the response complete, the connection
 * either closes or gets ready for its next request. */
bool conn_flush(server *s, conn *c)
{
    while (pending(c)) {
        ssize_t n = send(c->fd, c->out.p + c->out_off, pending(c), MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        conn_close(s, c, false); /* EPIPE, ECONNRESET: the client is gone */
        return false;
    }
    if (!pending(c)) {
        fbuf_reset(&c->out);
        c->out_off = 0;
    } else if (c->out_off > c->out.len / 2) {
        fbuf_consume(&c->out, c->out_off);
        c->out_off = 0;
    }
    set_epollout(s, c, pending(c) > 0);
    if (pending(c)) return true;
    if (c->close_after) {
        conn_close(s, c, false);
        return false;
    }
    if (c->state == C_DONE) {
        if (!c->keepalive) {
            conn_close(s, c, false);
            return false;
        }
        reset_request(c);
        c->state = C_READ;
        /* A pipelined request may already be buffered: parse it from the timer, not
         * from here, so that flush never recurses into request handling. */
        if (c->in.len) schedule(s, c, 1);
    }
    return true;
}

/* ---- endpoints ---- */

static bool kind_has(const server *s, const char *path)
{
    static const struct {
        const char *path;
        unsigned kinds; /* bit per fake_kind */
    } table[] = {
        {"/get_model_info", 1},  {"/get_server_info", 1},
        {"/health_generate", 1}, {"/abort_request", 1},
        {"/generate", 1},        {"/health", 3},
        {"/metrics", 3},         {"/version", 2},
        {"/v1/models", 7},       {"/v1/chat/completions", 7},
        {"/v1/completions", 7},  {"/v1/messages", 3},
        {"/v1/responses", 3},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(path, table[i].path)) return table[i].kinds & (1u << s->cfg.kind);
    return false;
}

/* Responds 200 with the JSON template tmpl in which each "$M" stands for the model name
 * (written as a JSON string). */
static void respond_with_model(server *s, conn *c, const char *tmpl)
{
    fbuf *b = &s->tmp;
    fbuf_reset(b);
    for (const char *p = tmpl, *m; *p; p = m + 2) {
        if (!(m = strstr(p, "$M"))) {
            fbuf_puts(b, p);
            break;
        }
        fbuf_put(b, p, (size_t)(m - p));
        fbuf_json_str(b, s->model, strlen(s->model), false);
    }
    respond_json(c, 200, b);
}

static void ep_models(server *s, conn *c)
{
    char t[512];
    const char *owner = s->cfg.kind == FAKE_KIND_SGLANG ? "sglang"
                        : s->cfg.kind == FAKE_KIND_VLLM ? "vllm"
                                                        : "fake";
    snprintf(t, sizeof t,
             "{\"object\":\"list\",\"data\":[{\"id\":$M,\"object\":\"model\",\"created\":%ld,"
             "\"owned_by\":\"%s\",\"root\":$M,\"parent\":null,\"max_model_len\":262144}]}",
             (long)time(NULL), owner);
    respond_with_model(s, c, t);
}

static void ep_server_info(server *s, conn *c)
{
    char t[512];
    snprintf(t, sizeof t,
             "{\"model_path\":$M,\"served_model_name\":$M,\"reasoning_parser\":\"qwen3\","
             "\"tool_call_parser\":\"qwen3_coder\",\"context_length\":262144,\"dialect\":\"%s\","
             "\"version\":\"0.5.6\"}",
             fake_dialect_name(s->dialect));
    respond_with_model(s, c, t);
}

static void ep_metrics(server *s, conn *c)
{
    fbuf *b = &s->tmp;
    fbuf_reset(b);
    fbuf_printf(b,
                "# HELP fake_requests_total Requests received (test helpers excluded).\n"
                "# TYPE fake_requests_total counter\nfake_requests_total %ld\n"
                "# HELP fake_generations_total Generations started.\n"
                "# TYPE fake_generations_total counter\nfake_generations_total %ld\n"
                "# HELP fake_tokens_total Tokens produced by finished generations.\n"
                "# TYPE fake_tokens_total counter\nfake_tokens_total %ld\n"
                "# HELP fake_active_generations Generations running now.\n"
                "# TYPE fake_active_generations gauge\nfake_active_generations %ld\n",
                s->n_requests, s->n_generations, s->n_tokens, s->n_active);
    respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", b->p, b->len);
}

static void ep_abort(server *s, conn *c, const cJSON *body)
{
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(body, "rid");
    bool all = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "abort_all"));
    const char *want = cJSON_IsString(rid) ? rid->valuestring : NULL;
    bool found = false;
    for (conn *g = s->conns; g; g = g->next) {
        if (g->g && (all || (want && g->g->rid && !strcmp(want, g->g->rid)))) {
            found = true;
            g->g->aborted = true;
            /* A stalled generation is aborted too: it leaves the stall at once. */
            if (g->g->phase == PH_STALL) g->g->phase = g->g->resume;
            schedule(s, g, 1);
        }
        for (size_t i = 0; g->g && want && i < g->g->nkids; i++) { /* one sample of a batch */
            gen *k = g->g->kids[i];
            if (!k->ended && k->rid && !strcmp(want, k->rid)) {
                found = k->aborted = true;
                schedule(s, g, 1);
            }
        }
    }
    fbuf *b = &s->tmp;
    if (fake_records_begin(&s->rec, b, "abort", ms_since(s, fake_now_ns()))) {
        fbuf_puts(b, ",\"rid\":");
        fbuf_json_str(b, want, want ? strlen(want) : 0, false);
        fbuf_printf(b, ",\"abort_all\":%s,\"found\":%s", all ? "true" : "false",
                    found ? "true" : "false");
        fake_records_commit(&s->rec, b);
    }
    respond(c, 200, "application/json", "{}", 2);
}

static void ep_echo(server *s, conn *c)
{
    fbuf *b = &s->tmp;
    cJSON *hj = headers_json(c);
    char *h = cJSON_PrintUnformatted(hj);
    cJSON_Delete(hj);
    fbuf_reset(b);
    fbuf_puts(b, "{\"method\":");
    fbuf_json_str(b, c->method, strlen(c->method), false);
    fbuf_puts(b, ",\"path\":");
    fbuf_json_str(b, c->path, strlen(c->path), false);
    fbuf_puts(b, ",\"query\":");
    fbuf_json_str(b, c->query, c->query ? strlen(c->query) : 0, false);
    fbuf_printf(b, ",\"headers\":%s,\"body\":", h ? h : "{}");
    free(h);
    fbuf_json_str(b, c->body.p ? c->body.p : "", c->body.len, false);
    fbuf_puts(b, "}");
    respond_json(c, 200, b);
}

static long query_long(const char *q, const char *key, long dflt)
{
    size_t kl = strlen(key);
    for (const char *p = q; p && *p;) {
        if (!strncmp(p, key, kl) && p[kl] == '=') return strtol(p + kl + 1, NULL, 10);
        p = strchr(p, '&');
        if (p) p++;
    }
    return dflt;
}

static void bytes_fill(server *s, conn *c)
{
    static const char xs[16384] = {[0 ... 16383] = 'x'};
    while (c->bytes_left > 0 && pending(c) < OUT_HIGH) {
        long n = c->bytes_left < (long)sizeof xs ? c->bytes_left : (long)sizeof xs;
        fbuf_put(&c->out, xs, (size_t)n);
        c->bytes_left -= n;
    }
    if (c->bytes_left == 0) c->state = C_DONE;
    /* All written at once (no EPOLLOUT will come): refill on the next loop turn. */
    if (conn_flush(s, c) && c->bytes_left > 0 && !pending(c)) schedule(s, c, 1);
}

static void ep_scenario(server *s, conn *c)
{
    char err[256];
    fake_scenario *sc =
        fake_scenario_parse(c->body.p ? c->body.p : "", c->body.len, err, sizeof err);
    if (!sc) {
        respond_error(s, c, 400, "BadRequestError", "bad scenario: %s", err);
        return;
    }
    if (sc->dialect && fake_dialect_parse(sc->dialect) < 0) {
        respond_error(s, c, 400, "BadRequestError", "unknown dialect \"%s\"", sc->dialect);
        fake_scenario_unref(sc);
        return;
    }
    fake_scenario_unref(s->sc);
    s->sc = sc;
    int d = sc->dialect ? fake_dialect_parse(sc->dialect) : s->cfg.dialect;
    s->dialect = (fake_dialect)d;
    s->model = sc->model ? sc->model : s->cfg.model;
    respond(c, 200, "application/json", "{\"ok\":true}", 11);
}

static void start_generation(server *s, conn *c, fake_endpoint ep, const cJSON *body,
                             const cJSON *headers, int ri)
{
    char err[160] = "";
    gen *g = ep == FAKE_EP_GENERATE && fake_generate_is_batch(body)
                 ? gen_new_batch(s, c, body, headers, err, sizeof err)
                 : gen_new(s, c, body, ep, ri);
    if (!g && err[0]) { /* as SGLang's /generate answers a ValueError */
        fbuf *b = &s->tmp;
        fbuf_reset(b);
        fbuf_puts(b, "{\"error\":{\"message\":");
        fbuf_json_str(b, err, strlen(err), false);
        fbuf_puts(b, "}}");
        respond_json(c, 400, b);
        return;
    }
    if (!g) {
        respond_error(s, c, 500, "InternalServerError", "out of memory%s", "");
        return;
    }
    c->g = g;
    c->state = C_GEN;
    s->n_generations++;
    s->n_active++;
    schedule(s, c, 1);
}

/* Handles one complete request on c. */
static void dispatch(server *s, conn *c)
{
    const char *p = c->path;
    bool get = !strcmp(c->method, "GET"), post = !strcmp(c->method, "POST");
    if (!strncmp(p, "/_fake/", 7)) {
        if (!strcmp(p, "/_fake/records") && get) {
            fbuf_reset(&s->tmp);
            fake_records_dump(&s->rec, &s->tmp);
            respond_json(c, 200, &s->tmp);
        } else if (!strcmp(p, "/_fake/reset") && post) {
            fake_records_clear(&s->rec);
            fake_scenario_reset_counters(s->sc);
            s->n_requests = s->n_generations = s->n_tokens = 0;
            respond(c, 200, "application/json", "{\"ok\":true}", 11);
        } else if (!strcmp(p, "/_fake/scenario") && post) {
            ep_scenario(s, c);
        } else if (!strcmp(p, "/_fake/echo")) {
            ep_echo(s, c);
        } else if (!strcmp(p, "/_fake/bytes") && get) {
            long n = query_long(c->query, "n", 0);
            c->bytes_left = n > 0 ? n : 0;
            put_head(c, 200, "application/octet-stream", c->bytes_left);
            c->state = C_BYTES;
            bytes_fill(s, c);
            return;
        } else if (!strcmp(p, "/_fake/sleep") && get) {
            c->sleep_ms = query_long(c->query, "ms", 0);
            c->state = C_SLEEP;
            schedule(s, c, c->t_req + (uint64_t)(c->sleep_ms > 0 ? c->sleep_ms : 0) * NS_PER_MS);
            return;
        } else {
            respond_error(s, c, 404, "NotFoundError", "Not Found: %s", p);
        }
        conn_flush(s, c);
        return;
    }

    s->n_requests++;
    cJSON *body = c->body.len ? cJSON_ParseWithLength(c->body.p, c->body.len) : NULL;
    cJSON *hj = headers_json(c);
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(body, "rid");
    const char *rids = cJSON_IsString(rid) ? rid->valuestring : NULL;
    fake_endpoint ep = !strcmp(p, "/v1/chat/completions") ? FAKE_EP_CHAT
                       : !strcmp(p, "/v1/completions")    ? FAKE_EP_COMPLETION
                       : !strcmp(p, "/v1/messages")       ? FAKE_EP_MESSAGES
                       : !strcmp(p, "/v1/responses")      ? FAKE_EP_RESPONSES
                                                          : FAKE_EP_GENERATE;
    bool gen_path = !strcmp(p, "/v1/chat/completions") || !strcmp(p, "/v1/completions") ||
                    !strcmp(p, "/generate") || !strcmp(p, "/v1/messages") ||
                    !strcmp(p, "/v1/responses");
    bool known = kind_has(s, p);
    int ri = INT_MIN;
    /* A batch is matched sample by sample (gen_new_batch), not as a whole. */
    if (known && gen_path && post && cJSON_IsObject(body) &&
        !(ep == FAKE_EP_GENERATE && fake_generate_is_batch(body)))
        ri = fake_scenario_match(s->sc, p, hj, body);
    record_request(s, c, hj, body, rids, ri);

    if (!known) {
        respond_error(s, c, 404, "NotFoundError", "Not Found: %s", p);
    } else if (gen_path || !strcmp(p, "/abort_request")) {
        if (!post)
            respond_error(s, c, 405, "MethodNotAllowed", "Method Not Allowed: %s", c->method);
        else if (!cJSON_IsObject(body))
            respond_error(s, c, 400, "BadRequestError", "request body is not a JSON object%s", "");
        else if (gen_path)
            start_generation(s, c, ep, body, hj, ri);
        else
            ep_abort(s, c, body);
    } else if (!get) {
        respond_error(s, c, 405, "MethodNotAllowed", "Method Not Allowed: %s", c->method);
    } else if (!strcmp(p, "/v1/models")) {
        ep_models(s, c);
    } else if (!strcmp(p, "/get_model_info")) {
        respond_with_model(s, c,
                           "{\"model_path\":$M,\"tokenizer_path\":$M,\"is_generation\":true,"
                           "\"preferred_sampling_params\":null,\"weight_version\":\"default\","
                           "\"has_image_understanding\":false,\"has_audio_understanding\":false,"
                           "\"model_type\":\"qwen3_5\","
                           "\"architectures\":[\"Qwen3_5ForConditionalGeneration\"]}");
    } else if (!strcmp(p, "/get_server_info")) {
        ep_server_info(s, c);
    } else if (!strcmp(p, "/metrics")) {
        ep_metrics(s, c);
    } else if (!strcmp(p, "/version")) {
        respond(c, 200, "application/json", "{\"version\":\"0.17.0\"}", 20);
    } else {
        respond(c, 200, "application/json", "", 0); /* /health, /health_generate */
    }
    cJSON_Delete(body);
    cJSON_Delete(hj);
    if (c->state != C_GEN) conn_flush(s, c);
}

static void process_input(server *s, conn *c)
{
    if (c->state != C_READ) return;
    if (!c->head_done) {
        char *end = c->in.len ? memmem(c->in.p, c->in.len, "\r\n\r\n", 4) : NULL;
        if (!end) {
            if (c->in.len > MAX_HEAD) {
                c->keepalive = false;
                respond_error(s, c, 431, "BadRequestError", "request head too large%s", "");
                conn_flush(s, c);
            }
            return;
        }
        size_t n = (size_t)(end - c->in.p) + 4;
        c->t_req = fake_now_ns();
        int st = parse_head(c, n - 2);
        fbuf_consume(&c->in, n);
        c->head_done = true;
        if (st) {
            c->keepalive = false;
            if (!c->method) c->method = "GET", c->path = "/";
            respond_error(s, c, st, "BadRequestError", "bad request (%s)", reason_phrase(st));
            conn_flush(s, c);
            return;
        }
        const char *expect = header(c, "expect");
        if (expect && !strcasecmp(expect, "100-continue") && (c->chunked || c->clen > 0))
            fbuf_puts(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
    }
    size_t pos = 0;
    int done;
    if (c->chunked) {
        done = dechunk(c, &pos);
    } else {
        size_t want = (size_t)c->clen - c->body.len;
        pos = c->in.len < want ? c->in.len : want;
        fbuf_put(&c->body, c->in.p ? c->in.p : "", pos);
        done = c->body.len == (size_t)c->clen;
    }
    fbuf_consume(&c->in, pos);
    if (done < 0) {
        c->keepalive = false;
        respond_error(s, c, 400, "BadRequestError", "bad chunked encoding%s", "");
        conn_flush(s, c);
        return;
    }
    if (!done) {
        if (pending(c)) conn_flush(s, c); /* the 100 Continue */
        return;
    }
    dispatch(s, c);
}

/* ---- event handlers ---- */

static void on_readable(server *s, conn *c, uint32_t events)
{
    char buf[65536];
    bool eof = false;
    for (int rounds = 0; rounds < 16; rounds++) {
        ssize_t n = recv(c->fd, buf, sizeof buf, 0);
        if (n > 0) {
            fbuf_put(&c->in, buf, (size_t)n);
            if (c->in.len > (size_t)MAX_HEAD + (size_t)MAX_BODY) eof = true;
            continue;
        }
        if (n == 0)
            eof = true;
        else if (errno == EINTR)
            continue;
        else if (errno != EAGAIN && errno != EWOULDBLOCK)
            eof = true;
        break;
    }
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) eof = true;
    /* The peer closed (or half-closed) its side: whatever is running was for a client
     * that is gone. uvicorn treats a half-close the same way. */
    if (eof) {
        conn_close(s, c, false);
        return;
    }
    if (c->state == C_READ) process_input(s, c);
}

static void on_timer_conn(server *s, conn *c)
{
    switch (c->state) {
    case C_GEN:
        gen_pump(s, c);
        break;
    case C_READ:
        process_input(s, c);
        break;
    case C_SLEEP: {
        char b[64];
        int n = snprintf(b, sizeof b, "{\"slept\":%ld}", c->sleep_ms);
        respond(c, 200, "application/json", b, (size_t)n);
        conn_flush(s, c);
        break;
    }
    case C_BYTES:
        bytes_fill(s, c);
        break;
    case C_DONE:
        conn_flush(s, c);
        break;
    }
}

static void on_writable(server *s, conn *c)
{
    if (!conn_flush(s, c)) return;
    if (c->state == C_GEN && pending(c) < OUT_HIGH / 2)
        gen_pump(s, c);
    else if (c->state == C_BYTES)
        bytes_fill(s, c);
}

static void on_accept(server *s)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE) && s->reserve_fd >= 0) {
            /* Out of descriptors: the listener would stay readable and spin the loop.
             * Spend the reserve descriptor to accept and drop the connection. */
            close(s->reserve_fd);
            fd = accept(s->lfd, NULL, NULL);
            if (fd >= 0) close(fd);
            s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            fprintf(stderr, "fake_upstream: out of file descriptors, connection dropped\n");
            continue;
        }
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                perror("fake_upstream: accept4");
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->heap_idx = -1;
        c->state = C_READ;
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            perror("fake_upstream: epoll_ctl");
            conn_close(s, c, false);
        }
    }
}

static void on_timer(server *s)
{
    uint64_t exp;
    if (read(s->tfd, &exp, sizeof exp) < 0 && errno != EAGAIN) perror("fake_upstream: timerfd");
    s->armed = 0;
}

/* Services every connection whose wake time has come. A connection rescheduled for "now"
 * by its own pump waits for the next loop turn, so I/O events interleave fairly. */
static void run_due(server *s)
{
    uint64_t now = fake_now_ns();
    long budget = s->nheap;
    while (s->nheap && s->heap[0]->wake <= now && budget-- > 0) {
        conn *c = s->heap[0];
        heap_remove(s, c);
        on_timer_conn(s, c);
    }
}

/* ---- setup ---- */

static int listen_on(server *s)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->cfg.port)};
    if (inet_pton(AF_INET, s->cfg.host, &a.sin_addr) != 1) {
        fprintf(stderr, "fake_upstream: bad listen address %s\n", s->cfg.host);
        return -1;
    }
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s->lfd < 0 || setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(s->lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(s->lfd, 4096) < 0) {
        perror("fake_upstream: listen");
        return -1;
    }
    socklen_t len = sizeof a;
    if (getsockname(s->lfd, (struct sockaddr *)&a, &len) < 0) {
        perror("fake_upstream: getsockname");
        return -1;
    }
    printf("listening on %s:%d\n", s->cfg.host, ntohs(a.sin_port));
    fflush(stdout);
    return 0;
}

static int add_fd(server *s, int fd, int *tag)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = tag};
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        perror("fake_upstream: epoll_ctl");
        return -1;
    }
    return 0;
}

int fake_server_run(fake_config *cfg)
{
    server s = {.cfg = *cfg, .ep = -1, .lfd = -1, .tfd = -1, .sfd = -1};
    /* Many concurrent streams need many descriptors: raise the soft limit to the hard one. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0) perror("fake_upstream: setrlimit");
    }
    s.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int rc = 1;
    s.t0 = fake_now_ns();
    s.rng = s.t0 ^ ((uint64_t)getpid() << 32) ^ 0x9E3779B97F4A7C15ULL;
    s.sc = cfg->scenario;
    cfg->scenario = NULL;
    if (!s.sc) {
        static const char empty[] = "{\"responses\":[]}";
        char err[128];
        s.sc = fake_scenario_parse(empty, sizeof empty - 1, err, sizeof err);
    }
    int d = s.sc && s.sc->dialect ? fake_dialect_parse(s.sc->dialect) : s.cfg.dialect;
    if (d < 0) {
        fprintf(stderr, "fake_upstream: unknown dialect in scenario\n");
        goto done;
    }
    s.dialect = (fake_dialect)d;
    s.model = s.sc->model ? s.sc->model : s.cfg.model;
    fake_records_init(&s.rec, s.cfg.max_records);

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    signal(SIGPIPE, SIG_IGN);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0 ||
        (s.sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
        (s.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)) < 0 ||
        (s.ep = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        perror("fake_upstream: setup");
        goto done;
    }
    if (listen_on(&s) < 0 || add_fd(&s, s.lfd, &tag_listen) < 0 ||
        add_fd(&s, s.tfd, &tag_timer) < 0 || add_fd(&s, s.sfd, &tag_signal) < 0)
        goto done;

    struct epoll_event evs[256];
    while (!s.stop) {
        arm_timer(&s);
        int n = epoll_wait(s.ep, evs, 256, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("fake_upstream: epoll_wait");
            goto done;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &tag_listen) {
                on_accept(&s);
            } else if (p == &tag_timer) {
                on_timer(&s);
            } else if (p == &tag_signal) {
                s.stop = true;
            } else {
                conn *c = p;
                uint32_t e = evs[i].events;
                /* A handler only ever closes (frees) its own connection, never another
                 * one (an abort merely schedules its target), so every pointer in this
                 * batch is valid until its own turn. Output first; pending input is
                 * level-triggered and comes back on the next turn. */
                if (e & EPOLLOUT) {
                    if (e & (EPOLLERR | EPOLLHUP)) {
                        conn_close(&s, c, false);
                        continue;
                    }
                    on_writable(&s, c);
                    continue; /* input, if any, is level-triggered: next turn */
                }
                on_readable(&s, c, e);
            }
        }
        run_due(&s);
    }
    rc = 0;
done:
    /* Close every connection still open (their generations are recorded as gone). */
    while (s.conns)
        conn_close(&s, s.conns, false);
    free(s.heap);
    fake_records_free(&s.rec);
    fake_scenario_unref(s.sc);
    fbuf_free(&s.tmp);
    if (s.lfd >= 0) close(s.lfd);
    if (s.tfd >= 0) close(s.tfd);
    if (s.sfd >= 0) close(s.sfd);
    if (s.ep >= 0) close(s.ep);
    if (s.reserve_fd >= 0) close(s.reserve_fd);
    return rc;
}
