/* fake_server.c — epoll HTTP/1.1 server and the scripted "GPU" behind it.
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
#include "fake_server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "fake_buf.h"
#include "fake_dialect.h"
#include "fake_messages.h"
#include "fake_responses.h"
#include "fake_record.h"

#define OUT_HIGH        (256 * 1024)  /* stop producing above this much unsent output */
#define BURST           (64 * 1024)   /* bytes one pump call may add before yielding */
#define MAX_HEAD        (64 * 1024)   /* request line + headers */
#define MAX_BODY        (1024L << 20) /* request body */
#define MAX_HEADERS     128
#define NS_PER_MS       1000000ULL
#define TOKENS_PER_PUMP 4096 /* whole responses: tokens per pump before yielding */

/* What the garbage fault writes (documented in the README). */
static const char junk[] = "this is not sse\n{\"partial\": tru\n: comment\nevent: junk\n\n";

/* ---- types ---- */

typedef enum {
    PH_DELAY,   /* waiting for first_byte_ms */
    PH_HEADERS, /* status line and headers (or a pre-stream fault) */
    PH_START,   /* slow_start wait, then the role chunk */
    PH_TOKENS,
    PH_STALL, /* fault: nothing until the client leaves or the stall ends */
    PH_FINISH,
} gen_phase;

typedef struct gen {
    fake_scenario *sc; /* reference held while running */
    const fake_resp *r;
    int resp_index;
    fake_ctx ctx;
    char id[96];
    char *rid;   /* body.rid, owned; NULL when absent */
    char *model; /* owned */
    const char *path;
    bool stream, usage;
    fake_plan plan;
    gen_phase phase;
    gen_phase resume; /* where a timed stall or an abort picks up */
    uint64_t t_start, wake, next_tick, pace_ns;
    long sent, reasoning_sent, prompt_tokens, cap;
    bool fault_done, aborted, finish_sent;
    bool junk_whole;         /* garbage fault on a whole response: junk precedes the JSON */
    const char *finish;      /* final finish_reason */
    char matched_stop[64];   /* JSON text */
    char stop_reason[256];   /* JSON text */
    fbuf ev;                 /* scratch for one event */
    fbuf reasoning, content; /* whole responses and /generate text */
    fbuf *args;              /* per tool call */
    char **tool_ids;
    size_t ntools;
    fake_msg msg;   /* /v1/messages: the open block */
    fake_rsp resp;  /* /v1/responses: sequence, open item, items done */
    size_t gen_text_sent; /* /generate: text and tokens sent in earlier events */
    long gen_ids_sent;
} gen;

typedef enum {
    C_READ,  /* reading a request */
    C_GEN,   /* a generation is running */
    C_BYTES, /* /_fake/bytes streaming */
    C_SLEEP, /* /_fake/sleep waiting */
    C_DONE,  /* response queued; next request once it is written */
} conn_state;

typedef struct hdr {
    char *name; /* lower-cased, NUL-terminated, inside conn.headbuf */
    char *value;
} hdr;

typedef struct conn {
    int fd;
    conn_state state;
    fbuf in;
    fbuf out;
    size_t out_off;
    bool ev_out;      /* EPOLLOUT registered */
    bool close_after; /* close once out is written */
    /* request */
    bool head_done;
    char *headbuf; /* copy of the head, owned */
    char *method, *path, *query;
    hdr hdrs[MAX_HEADERS];
    int nhdrs;
    bool chunked, keepalive;
    long clen;
    fbuf body;
    int ck_state; /* chunked decoder state */
    long ck_left;
    uint64_t t_req;
    /* work */
    gen *g;
    long bytes_left;
    long sleep_ms;
    uint64_t wake;
    long heap_idx;            /* -1 when not scheduled */
    struct conn *prev, *next; /* every open connection */
} conn;

typedef struct server {
    fake_config cfg;
    int ep, lfd, tfd, sfd;
    int reserve_fd; /* kept open to recover from EMFILE in accept */
    fake_scenario *sc;
    fake_dialect dialect;
    const char *model;
    fake_records rec;
    conn **heap;
    long nheap, capheap;
    uint64_t armed;
    conn *conns;
    uint64_t t0;
    uint64_t rng;
    long n_requests, n_generations, n_tokens, n_active;
    fbuf tmp;
    bool stop;
} server;

static int tag_listen, tag_timer, tag_signal; /* epoll data for the non-connection fds */

/* ---- small helpers ---- */

static double ms_since(const server *s, uint64_t t)
{
    return (double)(t - s->t0) / 1e6;
}

static void rand_hex(server *s, char *out, int n)
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < n; i++) {
        uint64_t x = s->rng;
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        s->rng = x;
        out[i] = hex[(x * 0x2545F4914F6CDD1DULL) >> 60];
    }
    out[n] = '\0';
}

static const char *reason_phrase(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 413:
        return "Request Entity Too Large";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return "Unknown";
    }
}

/* Status line and headers as uvicorn writes them. clen < 0: chunked. */
static void put_head(conn *c, int status, const char *ctype, long clen)
{
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    fbuf_printf(&c->out, "HTTP/1.1 %d %s\r\ndate: %s\r\nserver: uvicorn\r\n", status,
                reason_phrase(status), date);
    if (clen >= 0) fbuf_printf(&c->out, "content-length: %ld\r\n", clen);
    fbuf_printf(&c->out, "content-type: %s\r\n", ctype);
    if (clen < 0) fbuf_puts(&c->out, "transfer-encoding: chunked\r\n");
    if (!c->keepalive) fbuf_puts(&c->out, "connection: close\r\n");
    fbuf_puts(&c->out, "\r\n");
}

/* Queues a complete response; the connection moves to C_DONE. */
static void respond(conn *c, int status, const char *ctype, const char *body, size_t n)
{
    put_head(c, status, ctype, (long)n);
    fbuf_put(&c->out, body, n);
    c->state = C_DONE;
}

static void respond_json(conn *c, int status, const fbuf *b)
{
    respond(c, status, "application/json", b->p ? b->p : "", b->len);
}

static void respond_error(server *s, conn *c, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void respond_error(server *s, conn *c, int status, const char *type, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fbuf_reset(&s->tmp);
    /* Routing errors always use the OpenAI shape: FastAPI's 404 would differ per server,
     * and tests only need a well-formed error. */
    fake_render_error_body(&s->tmp, FAKE_D_OPENAI, msg, type, status);
    respond_json(c, status, &s->tmp);
}

/* Frames one SSE event (data: JSON\n\n) as one HTTP chunk. */
static void put_event(conn *c, const char *data, size_t n)
{
    fbuf_printf(&c->out, "%zx\r\ndata: ", n + 8);
    fbuf_put(&c->out, data, n);
    fbuf_put(&c->out, "\n\n\r\n", 4);
}

static const char *header(const conn *c, const char *name)
{
    for (int i = 0; i < c->nhdrs; i++)
        if (!strcmp(c->hdrs[i].name, name)) return c->hdrs[i].value;
    return NULL;
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
static void schedule(server *s, conn *c, uint64_t when)
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

static void record_generation(server *s, const gen *g, const char *ended, bool client_gone)
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

/* ---- connection lifetime ---- */

static void gen_free(gen *g)
{
    if (!g) return;
    fake_plan_free(&g->plan);
    fake_scenario_unref(g->sc);
    free(g->rid);
    free(g->model);
    fbuf_free(&g->ev);
    fbuf_free(&g->reasoning);
    fbuf_free(&g->content);
    for (size_t i = 0; i < g->ntools; i++) {
        fbuf_free(&g->args[i]);
        free(g->tool_ids[i]);
    }
    free(g->args);
    free(g->tool_ids);
    fake_resp_free(&g->resp);
    free(g);
}

/* Ends c's generation (recording how it ended) and unlinks it. */
static void gen_end(server *s, conn *c, const char *ended, bool client_gone)
{
    gen *g = c->g;
    if (!g) return;
    record_generation(s, g, ended, client_gone);
    s->n_tokens += g->sent;
    s->n_active--;
    gen_free(g);
    c->g = NULL;
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
static void conn_close(server *s, conn *c, bool rst)
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

static size_t pending(const conn *c)
{
    return c->out.len - c->out_off;
}

/* Writes what it can. Returns false when c was closed (and freed): the caller must not
 * touch c again. When the output is drained and the response complete, the connection
 * either closes or gets ready for its next request. */
static bool conn_flush(server *s, conn *c)
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

/* ---- generation ---- */

/* Writes v as JSON text into buf, or dflt when v is NULL. */
static void json_or_default(const cJSON *v, const char *dflt, char *buf, size_t n)
{
    char *p = v ? cJSON_PrintUnformatted(v) : NULL;
    snprintf(buf, n, "%s", p ? p : dflt);
    free(p);
}

static long body_long(const cJSON *o, const char *key, long dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? (long)v->valuedouble : dflt;
}

static fake_rmode reasoning_mode(fake_dialect d, fake_endpoint ep)
{
    if (ep == FAKE_EP_GENERATE) return FAKE_R_INLINE_NO_OPEN;
    if (ep == FAKE_EP_COMPLETION || d == FAKE_D_INLINE) return FAKE_R_INLINE;
    return d == FAKE_D_OPENAI ? FAKE_R_DROP : FAKE_R_SEPARATE;
}

/* Sets up a generation for the request on c using response ri. Returns NULL on
 * out-of-memory. */
static gen *gen_new(server *s, conn *c, const cJSON *body, fake_endpoint ep, int ri)
{
    static const char dflt_scenario[] =
        "{\"responses\":[{\"content\":[\"Hello from the fake upstream.\"]}]}";
    static fake_scenario *fallback;
    gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    if (ri >= 0) {
        g->sc = fake_scenario_ref(s->sc);
        g->r = &s->sc->resp[ri];
    } else {
        /* No response fits: the built-in clean answer (parsed once, kept forever). */
        char err[128];
        if (!fallback)
            fallback = fake_scenario_parse(dflt_scenario, strlen(dflt_scenario), err, sizeof err);
        g->sc = fake_scenario_ref(fallback);
        g->r = &fallback->resp[0];
    }
    g->resp_index = ri;
    g->t_start = c->t_req;
    g->path = ep == FAKE_EP_CHAT         ? "/v1/chat/completions"
              : ep == FAKE_EP_COMPLETION ? "/v1/completions"
              : ep == FAKE_EP_MESSAGES   ? "/v1/messages"
              : ep == FAKE_EP_RESPONSES  ? "/v1/responses"
                                         : "/generate";
    const fake_resp *r = g->r;
    fake_dialect d = s->dialect;

    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(body, "rid");
    if (cJSON_IsString(rid)) g->rid = strdup(rid->valuestring);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    g->model = strdup(cJSON_IsString(model) ? model->valuestring : s->model);
    const cJSON *reqid = cJSON_GetObjectItemCaseSensitive(body, "request_id");
    char hex[40];
    rand_hex(s, hex, 32);
    if (ep == FAKE_EP_RESPONSES) /* rendered as resp_<hex> */
        snprintf(g->id, sizeof g->id, "%s", hex);
    else if (ep == FAKE_EP_MESSAGES) /* sglang: msg_<uuid hex>; vllm: the chat chunk's id */
        snprintf(g->id, sizeof g->id, "%s%s", fake_dialect_is_vllm(d) ? "chatcmpl-" : "msg_",
                 hex);
    else if (fake_dialect_is_sglang(d) || ep == FAKE_EP_GENERATE)
        snprintf(g->id, sizeof g->id, "%s", g->rid ? g->rid : hex);
    else
        snprintf(g->id, sizeof g->id, "%s-%.80s", ep == FAKE_EP_CHAT ? "chatcmpl" : "cmpl",
                 cJSON_IsString(reqid) && fake_dialect_is_vllm(d) ? reqid->valuestring : hex);
    g->ctx = (fake_ctx){d, ep, g->id, g->model, (long)time(NULL)};

    g->stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "stream"));
    g->usage = g->stream && ep != FAKE_EP_GENERATE &&
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
                   cJSON_GetObjectItemCaseSensitive(body, "stream_options"), "include_usage"));
    if (ep == FAKE_EP_GENERATE)
        g->cap = body_long(cJSON_GetObjectItemCaseSensitive(body, "sampling_params"),
                           "max_new_tokens", 0);
    else
        g->cap = body_long(body, "max_completion_tokens",
                           body_long(body, "max_tokens", body_long(body, "max_output_tokens", 0)));
    g->prompt_tokens = r->prompt_tokens >= 0 ? r->prompt_tokens : fake_prompt_tokens(body);

    if (fake_plan_init(&g->plan, r, reasoning_mode(d, ep), g->cap, s->cfg.stamp) < 0) {
        gen_free(g);
        return NULL;
    }
    if (g->cap <= 0) g->cap = 4096;
    long pace = r->pace_us >= 0       ? r->pace_us
                : g->sc->pace_us >= 0 ? g->sc->pace_us
                                      : s->cfg.pace_ms * 1000;
    long fb = r->first_byte_ms >= 0       ? r->first_byte_ms
              : g->sc->first_byte_ms >= 0 ? g->sc->first_byte_ms
                                          : 0;
    g->pace_ns = pace > 0 ? (uint64_t)pace * 1000 : 0;
    g->wake = c->t_req + (uint64_t)fb * NS_PER_MS;
    g->phase = PH_DELAY;

    g->finish = g->plan.cut        ? "length"
                : r->finish_reason ? r->finish_reason
                : r->ntools        ? "tool_calls"
                                   : "stop";
    if (!strcmp(g->finish, "stop"))
        json_or_default(r->matched_stop, "151645", g->matched_stop, sizeof g->matched_stop);
    else
        snprintf(g->matched_stop, sizeof g->matched_stop, "null");
    json_or_default(r->stop_reason, "null", g->stop_reason, sizeof g->stop_reason);

    g->ntools = r->ntools;
    if (g->ntools) {
        g->args = calloc(g->ntools, sizeof *g->args);
        g->tool_ids = calloc(g->ntools, sizeof *g->tool_ids);
        if (!g->args || !g->tool_ids) {
            gen_free(g);
            return NULL;
        }
        for (size_t i = 0; i < g->ntools; i++) {
            char buf[64];
            rand_hex(s, hex, fake_dialect_is_vllm(d) ? 32 : 24);
            snprintf(buf, sizeof buf, "%s%s", fake_dialect_is_vllm(d) ? "chatcmpl-tool-" : "call_",
                     hex);
            g->tool_ids[i] = strdup(r->tools[i].id ? r->tools[i].id : buf);
        }
    }
    return g;
}

static void emit_delta(conn *c, const fake_delta *d)
{
    gen *g = c->g;
    fbuf_reset(&g->ev);
    fake_render_chunk(&g->ev, &g->ctx, d);
    put_event(c, g->ev.p, g->ev.len);
}

static fake_delta delta_init(const gen *g)
{
    fake_delta d = {0};
    d.tool = -1;
    d.matched_stop = g->matched_stop;
    d.stop_reason = g->stop_reason;
    return d;
}

static fake_usage usage_of(const gen *g)
{
    return (fake_usage){g->prompt_tokens, g->sent, g->reasoning_sent};
}

static double latency_s(const gen *g)
{
    return (double)(fake_now_ns() - g->t_start) / 1e9;
}

/* One /generate event: the text so far; finish NULL until the last. */
static void emit_generate(server *s, conn *c, const char *finish)
{
    gen *g = c->g;
    fake_usage u = usage_of(g);
    bool inc = s->cfg.incremental;
    fbuf_reset(&g->ev);
    fake_render_generate(&g->ev, &g->ctx, &g->content, inc ? g->gen_text_sent : 0,
                         inc ? g->gen_ids_sent : 0, g->sent, finish, g->cap, &u, latency_s(g));
    g->gen_text_sent = g->content.len;
    g->gen_ids_sent = g->sent;
    put_event(c, g->ev.p, g->ev.len);
}

/* Appends token t's text to the whole-response buffers. */
static void accumulate(gen *g, const fake_token *t)
{
    switch (t->ch) {
    case FAKE_CH_REASONING:
        fbuf_put(&g->reasoning, t->p, t->n);
        break;
    case FAKE_CH_CONTENT:
        fbuf_put(&g->content, t->p, t->n);
        break;
    case FAKE_CH_TOOL_HEAD:
        break;
    case FAKE_CH_TOOL_ARGS:
        fbuf_put(&g->args[t->tool], t->p, t->n);
        break;
    }
}

/* Produces the next token (two when vLLM merges the reasoning/content boundary) and, when
 * streaming, writes its event. Returns false when the plan is exhausted. */
static bool emit_token(server *s, conn *c)
{
    gen *g = c->g;
    fake_token t, t2;
    if (!fake_plan_next(&g->plan, &t)) return false;
    g->sent++;
    if (t.reasoning) g->reasoning_sent++;
    accumulate(g, &t);
    fake_delta d = delta_init(g);
    bool merged = false;
    fbuf *hold = &s->tmp;
    if (t.ch == FAKE_CH_REASONING && t.last_of_part && g->r->merge_boundary &&
        fake_dialect_is_vllm(g->ctx.d)) {
        /* t's text may live in the plan's scratch: keep a copy before peeking. */
        fbuf_reset(hold);
        fbuf_put(hold, t.p, t.n);
        t.p = hold->p;
        if (fake_plan_next(&g->plan, &t2)) {
            g->sent++;
            accumulate(g, &t2);
            if (t2.ch == FAKE_CH_CONTENT) {
                merged = true;
                d.reasoning = t.p, d.rn = t.n;
                d.content = t2.p, d.cn = t2.n;
            } else {
                /* Not a content token: send both deltas separately. */
                fake_delta d1 = delta_init(g);
                d1.reasoning = t.p, d1.rn = t.n;
                if (g->stream) emit_delta(c, &d1);
                t = t2;
            }
        }
    }
    if (!merged) {
        switch (t.ch) {
        case FAKE_CH_REASONING:
            d.reasoning = t.p, d.rn = t.n;
            break;
        case FAKE_CH_CONTENT:
            d.content = t.p, d.cn = t.n;
            break;
        case FAKE_CH_TOOL_HEAD:
            d.tool = t.tool, d.tool_id = g->tool_ids[t.tool], d.tool_name = t.p;
            break;
        case FAKE_CH_TOOL_ARGS:
            d.tool = t.tool, d.args = t.p, d.an = t.n;
            break;
        }
    }
    if (!g->stream) return true;
    bool last = g->plan.total != LONG_MAX && g->sent >= g->plan.total;
    if (last && !fake_dialect_separate_finish(g->ctx.d, g->ctx.ep)) {
        d.finish = g->finish;
        g->finish_sent = true;
    }
    if (g->ctx.ep == FAKE_EP_GENERATE) {
        emit_generate(s, c, d.finish);
    } else if (g->ctx.ep == FAKE_EP_RESPONSES) {
        if (merged) {
            fake_resp_token(&c->out, &g->ev, &g->resp, FAKE_ITEM_REASONING, t.p, t.n, NULL, NULL);
            t = t2;
        }
        bool head = t.ch == FAKE_CH_TOOL_HEAD;
        fake_item k = t.ch == FAKE_CH_REASONING ? FAKE_ITEM_REASONING
                      : t.ch == FAKE_CH_CONTENT ? FAKE_ITEM_MESSAGE
                                                : FAKE_ITEM_CALL;
        fake_resp_token(&c->out, &g->ev, &g->resp, k, head ? NULL : t.p, head ? 0 : t.n,
                        head ? g->tool_ids[t.tool] : NULL, head ? t.p : NULL);
    } else if (g->ctx.ep == FAKE_EP_MESSAGES) {
        fake_blk k = t.ch == FAKE_CH_REASONING ? FAKE_BLK_THINKING
                     : t.ch == FAKE_CH_CONTENT ? FAKE_BLK_TEXT
                                               : FAKE_BLK_TOOL;
        if (merged) /* vLLM's merge_boundary: both tokens, each in its block */
            fake_msg_token(&c->out, &g->ev, &g->msg, FAKE_BLK_THINKING, t.p, t.n, NULL, NULL);
        if (merged) k = FAKE_BLK_TEXT, t = t2;
        fake_msg_token(&c->out, &g->ev, &g->msg, k,
                       t.ch == FAKE_CH_TOOL_HEAD ? NULL : t.p, t.ch == FAKE_CH_TOOL_HEAD ? 0 : t.n,
                       t.ch == FAKE_CH_TOOL_HEAD ? g->tool_ids[t.tool] : NULL,
                       t.ch == FAKE_CH_TOOL_HEAD ? t.p : NULL);
    } else {
        emit_delta(c, &d);
    }
    return true;
}

/* The end of every stream: the usage chunk when asked for, [DONE], the last HTTP chunk. */
static void put_tail(conn *c)
{
    gen *g = c->g;
    if (g->ctx.ep == FAKE_EP_MESSAGES || g->ctx.ep == FAKE_EP_RESPONSES) {
        /* Anthropic and Responses streams end with their last event, no [DONE] */
        fbuf_puts(&c->out, "0\r\n\r\n");
        return;
    }
    if (g->usage) {
        fbuf_reset(&g->ev);
        fake_usage u = usage_of(g);
        fake_render_usage_chunk(&g->ev, &g->ctx, &u);
        put_event(c, g->ev.p, g->ev.len);
    }
    put_event(c, "[DONE]", 6);
    fbuf_puts(&c->out, "0\r\n\r\n");
}

/* The end of a stream: a separate finish chunk where the dialect has one (or where no
 * token carried the finish), the usage chunk, [DONE] and the last HTTP chunk. */
static void stream_finish(server *s, conn *c)
{
    gen *g = c->g;
    if (g->ctx.ep == FAKE_EP_MESSAGES) {
        fake_msg_finish(&c->out, &g->ev, &g->msg, g->finish, g->prompt_tokens, g->sent);
        put_tail(c);
        return;
    }
    if (g->ctx.ep == FAKE_EP_RESPONSES) {
        fake_resp_finish(&c->out, &g->ev, &g->resp, &g->ctx, g->finish, g->prompt_tokens, g->sent,
                         g->reasoning_sent);
        put_tail(c);
        return;
    }
    if (!g->finish_sent) {
        fake_delta d = delta_init(g);
        d.finish = g->finish;
        if (strcmp(g->finish, "stop")) d.matched_stop = "null";
        if (!fake_dialect_separate_finish(g->ctx.d, g->ctx.ep)) d.content = "", d.cn = 0;
        if (g->ctx.ep == FAKE_EP_GENERATE)
            emit_generate(s, c, g->finish);
        else
            emit_delta(c, &d);
        g->finish_sent = true;
    }
    put_tail(c);
}

static void whole_finish(conn *c)
{
    gen *g = c->g;
    const char *names[g->ntools ? g->ntools : 1];
    for (size_t i = 0; i < g->ntools; i++)
        names[i] = g->r->tools[i].name;
    fake_whole w = {
        .reasoning = g->plan.reasoning_n &&
                             (g->ctx.ep == FAKE_EP_CHAT || g->ctx.ep == FAKE_EP_MESSAGES)
                         ? &g->reasoning
                         : NULL,
        .content = &g->content,
        .ntools = g->ntools,
        .ids = (const char *const *)g->tool_ids,
        .names = names,
        .args = g->args,
        .finish = g->finish,
        .matched_stop = strcmp(g->finish, "stop") ? "null" : g->matched_stop,
        .stop_reason = g->stop_reason,
        .usage = usage_of(g),
        .latency_s = latency_s(g),
    };
    fbuf_reset(&g->ev);
    if (g->junk_whole) fbuf_put(&g->ev, junk, sizeof junk - 1);
    if (g->ctx.ep == FAKE_EP_MESSAGES) {
        fake_msg_whole(&g->ev, &g->ctx, &w);
    } else if (g->ctx.ep == FAKE_EP_RESPONSES) {
        /* the items as the stream would have built them */
        fbuf sink = {0}, scratch = {0};
        if (g->plan.reasoning_n && g->reasoning.len)
            fake_resp_token(&sink, &scratch, &g->resp, FAKE_ITEM_REASONING, g->reasoning.p,
                            g->reasoning.len, NULL, NULL);
        if (g->content.len)
            fake_resp_token(&sink, &scratch, &g->resp, FAKE_ITEM_MESSAGE, g->content.p,
                            g->content.len, NULL, NULL);
        for (size_t i = 0; i < g->ntools; i++) {
            fake_resp_token(&sink, &scratch, &g->resp, FAKE_ITEM_CALL, NULL, 0, g->tool_ids[i],
                            g->r->tools[i].name);
            fake_resp_token(&sink, &scratch, &g->resp, FAKE_ITEM_CALL, g->args[i].p,
                            g->args[i].len, NULL, NULL);
        }
        fbuf_free(&sink);
        fbuf_free(&scratch);
        fake_resp_object(&g->ev, &g->resp, &g->ctx,
                         strcmp(g->finish, "length") ? "completed" : "incomplete", g->finish,
                         g->prompt_tokens, g->sent, g->reasoning_sent);
    } else
        fake_render_whole(&g->ev, &g->ctx, &w);
    respond_json(c, 200, &g->ev);
}

static const char *fault_message(const fake_fault *f)
{
    return f->message ? f->message : "Internal server error";
}

static const char *fault_type(const fake_fault *f)
{
    return f->type ? f->type : "InternalServerError";
}

/* Faults that strike before the response starts. Returns true when one did (c may then be
 * closed: *alive tells). */
static bool prestream_fault(server *s, conn *c, bool *alive)
{
    gen *g = c->g;
    const fake_fault *f = &g->r->fault;
    *alive = true;
    switch (f->kind) {
    case FAKE_FAULT_HTTP_STATUS:
        fbuf_reset(&g->ev);
        fake_render_error_body(&g->ev, g->ctx.d, fault_message(f), fault_type(f), f->status);
        respond(c, f->status, "application/json", g->ev.p, g->ev.len);
        break;
    case FAKE_FAULT_NOT_SSE: {
        const char *m = f->message ? f->message : "Internal Server Error";
        respond(c, 200, "text/plain; charset=utf-8", m, strlen(m));
        break;
    }
    case FAKE_FAULT_CLOSE_BEFORE_HEADERS:
        gen_end(s, c, "fault", false);
        conn_close(s, c, false);
        *alive = false;
        return true;
    default:
        return false;
    }
    g->finish = NULL;
    gen_end(s, c, "fault", false);
    return true;
}

/* Faults that strike after at_token tokens. Returns false when c was closed. Sets *stop
 * when the pump must not produce more now. */
static bool stream_fault(server *s, conn *c, bool *stop)
{
    gen *g = c->g;
    const fake_fault *f = &g->r->fault;
    *stop = false;
    g->fault_done = true;
    switch (f->kind) {
    case FAKE_FAULT_RESET:
        gen_end(s, c, "fault", false);
        if (!conn_flush(s, c)) return false;
        conn_close(s, c, true);
        return false;
    case FAKE_FAULT_STALL:
        g->resume = g->phase;
        g->phase = PH_STALL;
        g->wake = fake_now_ns() + (uint64_t)(f->ms > 0 ? f->ms : 0) * NS_PER_MS;
        if (f->ms >= 0) schedule(s, c, g->wake);
        *stop = true;
        return true;
    case FAKE_FAULT_GARBAGE:
        if (g->stream) {
            fbuf_printf(&c->out, "%zx\r\n", sizeof junk - 1);
            fbuf_put(&c->out, junk, sizeof junk - 1);
            fbuf_puts(&c->out, "\r\n");
        } else {
            g->junk_whole = true;
        }
        return true;
    case FAKE_FAULT_ERROR_EVENT:
        g->finish = NULL;
        if (g->stream && g->ctx.ep == FAKE_EP_RESPONSES) {
            fake_resp_error(&c->out, &g->ev, &g->resp, fault_message(f));
            put_tail(c);
            c->state = C_DONE;
        } else if (g->stream && g->ctx.ep == FAKE_EP_MESSAGES) {
            fake_msg_error(&c->out, &g->ev, fault_message(f));
            put_tail(c);
            c->state = C_DONE;
        } else if (g->stream) {
            fbuf_reset(&g->ev);
            fake_render_error_event(&g->ev, g->ctx.d, fault_message(f), fault_type(f), f->status);
            put_event(c, g->ev.p, g->ev.len);
            put_tail(c);
            c->state = C_DONE;
        } else {
            fbuf_reset(&g->ev);
            fake_render_error_body(&g->ev, g->ctx.d, fault_message(f), fault_type(f), f->status);
            respond(c, f->status, "application/json", g->ev.p, g->ev.len);
        }
        gen_end(s, c, "fault", false);
        *stop = true;
        return true;
    case FAKE_FAULT_TRUNCATED_CHUNKED:
        if (!g->stream) put_head(c, 200, "application/json", -1);
        fbuf_puts(&c->out, "40\r\ndata: {\"i");
        gen_end(s, c, "fault", false);
        c->close_after = true;
        *stop = true;
        return true;
    default:
        return true;
    }
}

/* Advances c's generation as far as pacing, the output budget and faults allow. May close
 * c. */
static void gen_pump(server *s, conn *c)
{
    size_t budget_end = c->out.len + BURST;
    long tokens = 0;
    while (c->g) {
        gen *g = c->g;
        if (pending(c) >= OUT_HIGH) {
            if (!conn_flush(s, c)) return;
            if (pending(c) >= OUT_HIGH) return; /* EPOLLOUT resumes us */
            budget_end = c->out.len + BURST;
        }
        if (c->out.len >= budget_end || tokens >= TOKENS_PER_PUMP) {
            schedule(s, c, fake_now_ns()); /* let other streams run */
            break;
        }
        uint64_t now = fake_now_ns();
        bool alive = true, stop = false;
        if (g->aborted) g->wake = 0; /* an abort cuts first_byte and slow_start waits short */
        switch (g->phase) {
        case PH_DELAY:
            if (now < g->wake) {
                schedule(s, c, g->wake);
                goto out;
            }
            g->phase = PH_HEADERS;
            break;
        case PH_HEADERS:
            if (prestream_fault(s, c, &alive)) {
                if (!alive) return;
                goto out;
            }
            if (g->stream) put_head(c, 200, "text/event-stream; charset=utf-8", -1);
            g->phase = PH_START;
            g->wake = now;
            if (g->r->fault.kind == FAKE_FAULT_SLOW_START) {
                g->fault_done = true;
                g->wake = now + (uint64_t)(g->r->fault.ms > 0 ? g->r->fault.ms : 0) * NS_PER_MS;
            }
            break;
        case PH_START:
            if (now < g->wake) {
                schedule(s, c, g->wake);
                goto out;
            }
            if (!g->fault_done && !g->aborted && g->r->fault.at_token <= 0 &&
                g->r->fault.kind != FAKE_FAULT_NONE) {
                if (!stream_fault(s, c, &stop)) return;
                if (stop) goto out;
            }
            if (g->stream && g->ctx.ep == FAKE_EP_MESSAGES)
                fake_msg_start(&c->out, &g->ev, &g->ctx, g->prompt_tokens);
            if (g->stream && g->ctx.ep == FAKE_EP_RESPONSES)
                fake_resp_start(&c->out, &g->ev, &g->resp, &g->ctx, g->cap);
            if (g->stream && g->ctx.ep == FAKE_EP_CHAT) {
                fake_delta d = delta_init(g);
                d.role = true;
                emit_delta(c, &d);
            }
            g->phase = PH_TOKENS;
            g->next_tick = now + g->pace_ns;
            break;
        case PH_TOKENS:
            if (g->aborted) {
                g->finish = "abort";
                g->phase = PH_FINISH;
                break;
            }
            if (!g->fault_done && g->r->fault.kind != FAKE_FAULT_NONE &&
                g->sent >= g->r->fault.at_token) {
                if (!stream_fault(s, c, &stop)) return;
                if (stop) goto out;
            }
            if (g->pace_ns && now < g->next_tick) {
                schedule(s, c, g->next_tick);
                goto out;
            }
            tokens++;
            if (!emit_token(s, c))
                g->phase = PH_FINISH;
            else if (g->pace_ns)
                g->next_tick += g->pace_ns;
            break;
        case PH_STALL:
            /* Woken by the end of a timed stall: carry on as if nothing happened. */
            if (g->r->fault.ms >= 0 && now >= g->wake) {
                g->phase = g->resume;
                g->wake = g->next_tick = now;
                break;
            }
            goto out;
        case PH_FINISH:
            if (g->stream) {
                stream_finish(s, c);
                c->state = C_DONE;
            } else {
                whole_finish(c);
            }
            /* Recorded as soon as the end is queued: a flush that closes the
             * connection afterwards must not turn a complete stream into a lost one. */
            gen_end(s, c, g->aborted ? "aborted" : "complete", false);
            goto out;
        }
    }
out:
    conn_flush(s, c);
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
        {"/v1/completions", 7},  {"/v1/messages", 3}, {"/v1/responses", 3},
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

static void start_generation(server *s, conn *c, fake_endpoint ep, const cJSON *body, int ri)
{
    gen *g = gen_new(s, c, body, ep, ri);
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
    if (known && gen_path && post && cJSON_IsObject(body))
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
            start_generation(s, c, ep, body, ri);
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

/* ---- request parsing ---- */

/* Parses the head in c->in[0..n). Returns 0, or an HTTP status for a bad request. */
static int parse_head(conn *c, size_t n)
{
    c->headbuf = malloc(n + 1);
    if (!c->headbuf) return 500;
    memcpy(c->headbuf, c->in.p, n);
    c->headbuf[n] = '\0';
    char *save = NULL;
    char *line = strtok_r(c->headbuf, "\r\n", &save);
    if (!line) return 400;
    char *sp1 = strchr(line, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2) return 400;
    *sp1 = *sp2 = '\0';
    c->method = line;
    c->path = sp1 + 1;
    const char *version = sp2 + 1;
    if (strncmp(version, "HTTP/1.", 7)) return 400;
    char *q = strchr(c->path, '?');
    if (q) *q = '\0', c->query = q + 1;
    c->keepalive = strcmp(version, "HTTP/1.0") != 0;
    c->clen = 0;
    while ((line = strtok_r(NULL, "\r\n", &save))) {
        char *colon = strchr(line, ':');
        if (!colon || c->nhdrs == MAX_HEADERS) return colon ? 431 : 400;
        *colon = '\0';
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        size_t vl = strlen(v);
        while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
            v[--vl] = '\0';
        for (char *k = line; *k; k++)
            *k = (char)tolower((unsigned char)*k);
        c->hdrs[c->nhdrs++] = (hdr){line, v};
        if (!strcmp(line, "content-length")) {
            char *end;
            c->clen = strtol(v, &end, 10);
            if (*end || c->clen < 0) return 400;
        } else if (!strcmp(line, "transfer-encoding")) {
            c->chunked = strcasestr(v, "chunked") != NULL;
        } else if (!strcmp(line, "connection")) {
            if (strcasestr(v, "close"))
                c->keepalive = false;
            else if (strcasestr(v, "keep-alive"))
                c->keepalive = true;
        }
    }
    if (c->clen > MAX_BODY) return 413;
    return 0;
}

/* Decodes chunked body bytes from c->in starting at *pos. Returns 1 when the body is
 * complete, 0 when more input is needed, -1 on a framing error. */
static int dechunk(conn *c, size_t *pos)
{
    enum { CK_SIZE, CK_DATA, CK_DATA_CRLF, CK_TRAILER };
    for (;;) {
        const char *base = c->in.p + *pos;
        size_t avail = c->in.len - *pos;
        switch (c->ck_state) {
        case CK_SIZE:
        case CK_TRAILER: {
            const char *nl = memchr(base, '\n', avail);
            if (!nl) return avail > 4096 ? -1 : 0;
            size_t ll = (size_t)(nl - base) + 1;
            if (c->ck_state == CK_SIZE) {
                char *end;
                long n = strtol(base, &end, 16);
                if (end == base || n < 0 || (long)c->body.len + n > MAX_BODY) return -1;
                c->ck_left = n;
                c->ck_state = n ? CK_DATA : CK_TRAILER;
            } else if (ll <= 2) {
                *pos += ll;
                return 1;
            }
            *pos += ll;
            break;
        }
        case CK_DATA: {
            if (!avail) return 0;
            size_t take = avail < (size_t)c->ck_left ? avail : (size_t)c->ck_left;
            fbuf_put(&c->body, base, take);
            *pos += take;
            c->ck_left -= (long)take;
            if (!c->ck_left) c->ck_state = CK_DATA_CRLF;
            break;
        }
        case CK_DATA_CRLF: {
            const char *nl = memchr(base, '\n', avail);
            if (!nl) return avail > 2 ? -1 : 0;
            *pos += (size_t)(nl - base) + 1;
            c->ck_state = CK_SIZE;
            break;
        }
        }
    }
}

/* Parses as much of the buffered request as there is; dispatches it when complete. */
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
