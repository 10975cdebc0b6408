/* soakload.c — the soak test's client (`make soak`, tests/soak.sh): thousands of concurrent
 * chat requests of mixed kinds for a long time, every completed answer checked for shape.
 *
 * One thread, one epoll loop, raw non-blocking sockets, HTTP/1.1 keep-alive. Each of N
 * connections sends one request after another. A request's kind is drawn at random: a clean
 * generation, one that loops on the first attempt only, one that loops on every attempt, or
 * one whose upstream fails in a given way (reset, stall, error event, HTTP 500, truncated
 * chunked body, garbage lines, a close before the headers, a body that is not SSE, a loop
 * whose retry is reset). The prompt names the kind (`soak-<kind>`) and the fake upstream's
 * scenario (tests/soak/soak.json) matches on it. Independently, a share of requests ask
 * for a whole (non-streaming) answer, a share carry `Connection: close`, and a share hang
 * up mid-way (right after sending, or after a random number of body bytes; by FIN or RST).
 *
 * Every answer that is not hung up on is decoded (chunked or Content-Length framing) and
 * checked when it ends: a stream must be well-formed SSE whose events are JSON objects (a
 * chunk or an OpenAI-style error event) and whose last data is `[DONE]`; a whole answer a
 * chat.completion object; an error status an OpenAI-style (or SGLang-style) error object.
 * Anything else — a broken frame, a connection closed mid-answer, a non-JSON event, a
 * missing [DONE] — counts as malformed. Loop text reaching the client ("lambda" three times
 * in a row) counts as a leak. Requests that take longer than --deadline seconds count as
 * hung. Cost: the body of each answer is kept until it ends (tens of KiB), then parsed with
 * cJSON once per event; far below what loopguard spends per event.
 *
 * Output: a progress line on stderr every --progress seconds, and one JSON summary line on
 * stdout at the end (after in-flight requests drain). Exit status: 0 when no violation was
 * counted (malformed, leaks, hung, connect or I/O errors, clean requests that did not end
 * well), 1 otherwise, 2 on bad usage or setup failure. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "proxy/num.h"
#include "tests/bench/chunked.h"

#include <cJSON.h>

#define READ_BUF   65536
#define HEAD_MAX   16384
#define BODY_MAX   (8u << 20)
#define MAX_REPORT 10 /* malformed answers described on stderr */

/* ---- request kinds ---------------------------------------------------------------- */

enum { K_CLEAN, K_LOOP1, K_LOOPALL, K_FIRST_FAULT };
static const char *const kind_names[] = {"clean",   "loop1",      "loopall", "reset",
                                         "stall",   "errevent",   "http500", "trunc",
                                         "garbage", "closeearly", "notsse",  "loopreset"};
#define N_KINDS       (sizeof kind_names / sizeof *kind_names)
#define N_FAULT_KINDS (N_KINDS - K_FIRST_FAULT)

/* How one answer ended, per kind. */
enum {
    F_STOP,
    F_CONTENT_FILTER,
    F_LENGTH,
    F_OTHER_FINISH,
    F_ERROR_EVENT,
    F_HTTP_4XX,
    F_HTTP_5XX,
    F_HUNG_UP,
    F_MALFORMED,
    N_FATES
};
static const char *const fate_names[N_FATES] = {"stop",         "content_filter", "length",
                                                "other_finish", "error_event",    "http_4xx",
                                                "http_5xx",     "hung_up",        "malformed"};

typedef struct options {
    struct sockaddr_in addr;
    char hostport[64];
    int streams;
    double duration_s, ramp_s, deadline_s, progress_s, drain_s;
    double loop_pct, fault_pct, whole_pct, hangup_pct, close_pct;
    int max_tokens;
    unsigned seed;
} options;

typedef struct stats {
    uint64_t started, completed, connect_errors, io_errors, ka_retries, hung, leaks, clean_not_ok,
        malformed;
    uint64_t fates[N_KINDS][N_FATES];
    uint64_t stream_answers, whole_answers, max_inflight, foreign_lines;
} stats;

static options opt;
static stats st;
static int epfd;
static uint64_t rng_state;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* xorshift64*: reproducible runs for a given --seed. */
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static bool chance(double pct)
{
    return (double)(rnd() % 1000000) < pct * 10000.0;
}

/* ---- growable byte buffer ---------------------------------------------------------- */

typedef struct bytes {
    char *p;
    size_t len, cap;
} bytes;

/* Appends n bytes; returns -1 when the buffer would pass `max`. */
static int bytes_add(bytes *b, const char *p, size_t n, size_t max)
{
    if (b->len + n > max) return -1;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) abort();
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static void bytes_clear(bytes *b)
{
    b->len = 0;
    if (b->p) b->p[0] = '\0';
}

/* ---- one connection ---------------------------------------------------------------- */

typedef enum { S_IDLE, S_CONNECTING, S_SENDING, S_HEAD, S_BODY } conn_state;

typedef struct conn {
    int fd;
    conn_state state;
    uint64_t open_at;  /* S_IDLE: when to start the next request */
    uint64_t deadline; /* the request in flight counts as hung past this */
    bool reused;       /* this request went on a kept-alive connection */
    /* the request */
    int kind;
    bool stream, close_after;
    long hangup_at; /* -1 never; 0 right after sending; k: after k body bytes */
    bytes req;
    size_t sent;
    /* the answer */
    bytes head, body;
    int status;
    char ctype[128];
    bool keep_alive;
    body_framing framing;
    uint64_t length; /* Content-Length */
    body_decoder dec;
    size_t raw_body; /* body bytes received on the wire (for the hang-up point) */
} conn;

static conn *conns;
static size_t inflight;

static void conn_close(conn *c, bool rst)
{
    if (c->fd < 0) return;
    if (rst) {
        struct linger lg = {1, 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    close(c->fd);
    c->fd = -1;
}

/* The request in flight is over (answered, failed or hung up on): the connection waits for
 * the next one, keeping the socket only when it can be reused. */
static void request_over(conn *c, uint64_t now, bool keep)
{
    if (!keep) conn_close(c, false);
    c->state = S_IDLE;
    c->open_at = now;
    bytes_clear(&c->head);
    bytes_clear(&c->body);
    inflight--;
}

static int arm(conn *c, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = c};
    return epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Draws the next request's kind and options and renders it into c->req. */
static void build_request(conn *c)
{
    double r = (double)(rnd() % 1000000) / 10000.0;
    if (r < opt.fault_pct)
        c->kind = K_FIRST_FAULT + (int)(rnd() % N_FAULT_KINDS);
    else if (r < opt.fault_pct + opt.loop_pct)
        c->kind = rnd() % 3 == 0 ? K_LOOPALL : K_LOOP1;
    else
        c->kind = K_CLEAN;
    c->stream = !chance(opt.whole_pct);
    c->close_after = chance(opt.close_pct);
    c->hangup_at = -1;
    if (chance(opt.hangup_pct)) c->hangup_at = rnd() % 4 == 0 ? 0 : (long)(1 + rnd() % 6000);
    char body[512];
    int blen = snprintf(body, sizeof body,
                        "{\"model\":\"soak\",\"messages\":[{\"role\":\"user\",\"content\":"
                        "\"soak-%s request %llu\"}],\"temperature\":0.6,\"stream\":%s,"
                        "\"max_tokens\":%d}",
                        kind_names[c->kind], (unsigned long long)st.started,
                        c->stream ? "true" : "false", opt.max_tokens);
    char head[512];
    int hlen = snprintf(head, sizeof head,
                        "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n"
                        "Content-Type: application/json\r\nContent-Length: %d\r\n%s\r\n",
                        opt.hostport, blen, c->close_after ? "Connection: close\r\n" : "");
    c->req.len = 0;
    bytes_add(&c->req, head, (size_t)hlen, SIZE_MAX);
    bytes_add(&c->req, body, (size_t)blen, SIZE_MAX);
}

static void start_request(conn *c, uint64_t now);

static void count_fate(conn *c, int fate)
{
    static int reported;
    st.fates[c->kind][fate]++;
    if (fate == F_MALFORMED) st.malformed++;
    if (c->kind == K_CLEAN && fate != F_STOP && fate != F_HUNG_UP) {
        st.clean_not_ok++;
        if (reported++ < MAX_REPORT) {
            /* The error event or body says why (timeout, unreachable...). */
            const char *e = c->body.p ? strstr(c->body.p, "\"error\"") : NULL;
            fprintf(stderr, "soakload: clean request ended %s (%s, status %d): %.200s\n",
                    fate_names[fate], c->stream ? "stream" : "whole", c->status, e ? e : "");
        }
    }
}

static void report_malformed(conn *c, const char *why)
{
    static int reported;
    if (reported++ >= MAX_REPORT) return;
    fprintf(stderr, "soakload: malformed answer (kind %s, %s, status %d): %s; body starts: %.*s\n",
            kind_names[c->kind], c->stream ? "stream" : "whole", c->status, why,
            (int)(c->body.len < 300 ? c->body.len : 300), c->body.p ? c->body.p : "");
}

/* ---- checking a finished answer ----------------------------------------------------- */

static bool has_leak(const char *text)
{
    return text && strstr(text, "lambda lambda lambda") != NULL;
}

/* An OpenAI-style error ({"error":{"message":...}}) or SGLang's own ({"object":"error",
 * "message":...}). */
static bool is_error_object(const cJSON *j)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (cJSON_IsObject(e)) return cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "message"));
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "object");
    return cJSON_IsString(o) && strcmp(o->valuestring, "error") == 0 &&
           cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "message"));
}

static int finish_fate(const char *finish)
{
    if (!finish) return F_OTHER_FINISH;
    if (!strcmp(finish, "stop")) return F_STOP;
    if (!strcmp(finish, "content_filter")) return F_CONTENT_FILTER;
    if (!strcmp(finish, "length")) return F_LENGTH;
    return F_OTHER_FINISH;
}

/* Appends a string member of obj (when there is one) to text. */
static void add_text(bytes *text, const cJSON *obj, const char *name)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (cJSON_IsString(s)) bytes_add(text, s->valuestring, strlen(s->valuestring), SIZE_MAX);
}

/* Checks one SSE data payload. Updates *finish (owned by the caller, strdup'd), *errors and
 * text. Returns NULL when well-formed, else the reason. */
static const char *check_event(const char *data, char **finish, int *errors, bytes *text)
{
    cJSON *j = cJSON_Parse(data);
    const char *why = NULL;
    if (!cJSON_IsObject(j)) {
        why = "an event that is not a JSON object";
        goto out;
    }
    if (cJSON_GetObjectItemCaseSensitive(j, "error")) {
        if (!is_error_object(j)) why = "an error event without a message";
        (*errors)++;
        goto out;
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
    if (!cJSON_IsArray(choices)) {
        why = "a chunk without choices";
        goto out;
    }
    const cJSON *ch = cJSON_GetArrayItem(choices, 0);
    if (!ch) goto out; /* the usage chunk */
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
    if (!cJSON_IsObject(delta)) {
        why = "a choice without a delta";
        goto out;
    }
    add_text(text, delta, "reasoning_content");
    add_text(text, delta, "content");
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
    if (cJSON_IsString(fr) && fr->valuestring[0]) {
        free(*finish);
        *finish = strdup(fr->valuestring);
    }
out:
    cJSON_Delete(j);
    return why;
}

/* Checks an event-stream body: events split on blank lines (LF or CR LF), comments
 * ignored, data lines joined. Sets *fate. Returns NULL or the reason it is malformed. */
static const char *check_stream(char *body, size_t len, int *fate)
{
    bytes data = {0}, text = {0};
    char *finish = NULL;
    int errors = 0;
    bool done = false, in_event = false;
    const char *why = NULL;
    char *p = body, *end = body + len;
    while (p < end && !why) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) {
            why = "the stream ends inside a line";
            break;
        }
        char *line = p;
        size_t n = (size_t)(nl - p);
        p = nl + 1;
        if (n && line[n - 1] == '\r') n--;
        if (n == 0) {
            if (in_event) {
                if (done) {
                    why = "data after [DONE]";
                } else if (data.len == 6 && !memcmp(data.p, "[DONE]", 6)) {
                    done = true;
                } else {
                    why = check_event(data.p, &finish, &errors, &text);
                }
            }
            in_event = false;
            data.len = 0;
            continue;
        }
        if (line[0] == ':') continue;
        if (n < 5 || memcmp(line, "data:", 5) != 0) {
            /* Another field (event:, id:) or a line an SSE client ignores, such as the
             * upstream's own garbage that loopguard relays untouched (WHATWG rules). */
            st.foreign_lines++;
            continue;
        }
        size_t off = n > 5 && line[5] == ' ' ? 6 : 5;
        if (in_event) bytes_add(&data, "\n", 1, SIZE_MAX);
        bytes_add(&data, line + off, n - off, SIZE_MAX);
        if (!data.p) bytes_add(&data, "", 0, SIZE_MAX);
        in_event = true;
    }
    if (!why && in_event) why = "an event without its blank line";
    if (!why && !done) why = "no [DONE]";
    if (!why) {
        *fate = errors ? F_ERROR_EVENT : finish_fate(finish);
        if (has_leak(text.p)) st.leaks++;
    }
    free(finish);
    free(data.p);
    free(text.p);
    return why;
}

/* Checks a JSON body: an error object on an error status, a chat.completion on 200. */
static const char *check_json(conn *c, int *fate)
{
    cJSON *j = cJSON_Parse(c->body.p ? c->body.p : "");
    const char *why = NULL;
    if (!cJSON_IsObject(j)) {
        why = "a JSON body that does not parse";
    } else if (c->status != 200) {
        if (!is_error_object(j)) why = "an error status without an error object";
        *fate = c->status < 500 ? F_HTTP_4XX : F_HTTP_5XX;
    } else {
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
        const cJSON *fr = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
        if (!cJSON_IsObject(msg)) {
            why = "a completion without choices[0].message";
        } else {
            bytes text = {0};
            add_text(&text, msg, "reasoning_content");
            add_text(&text, msg, "content");
            if (has_leak(text.p)) st.leaks++;
            free(text.p);
            *fate = finish_fate(cJSON_IsString(fr) ? fr->valuestring : NULL);
        }
    }
    cJSON_Delete(j);
    return why;
}

static void answer_done(conn *c, uint64_t now)
{
    int fate = F_MALFORMED;
    const char *why;
    bool sse = strstr(c->ctype, "text/event-stream") != NULL;
    if (c->status == 200 && sse) {
        st.stream_answers++;
        why = check_stream(c->body.p ? c->body.p : "", c->body.len, &fate);
    } else if (strstr(c->ctype, "json")) {
        if (c->status == 200) st.whole_answers++;
        why = check_json(c, &fate);
    } else {
        why = "neither an event stream nor JSON";
    }
    if (why) {
        fate = F_MALFORMED;
        report_malformed(c, why);
    }
    st.completed++;
    count_fate(c, fate);
    request_over(c, now, c->keep_alive && !c->close_after);
}

/* ---- reading the answer --------------------------------------------------------------- */

static void parse_head(conn *c)
{
    c->status = 0;
    c->ctype[0] = '\0';
    c->keep_alive = true;
    c->framing = BODY_CLOSE;
    c->length = 0;
    char *save = NULL;
    for (char *line = strtok_r(c->head.p, "\r\n", &save); line;
         line = strtok_r(NULL, "\r\n", &save)) {
        if (!c->status) {
            if (strncmp(line, "HTTP/1.", 7) == 0 && strlen(line) >= 12) c->status = atoi(line + 9);
            if (strncmp(line, "HTTP/1.0", 8) == 0) c->keep_alive = false;
            continue;
        }
        if (!strncasecmp(line, "content-length:", 15)) {
            c->framing = BODY_LENGTH;
            c->length = strtoull(line + 15, NULL, 10);
        } else if (!strncasecmp(line, "transfer-encoding:", 18) && strstr(line, "chunked")) {
            c->framing = BODY_CHUNKED;
        } else if (!strncasecmp(line, "content-type:", 13)) {
            snprintf(c->ctype, sizeof c->ctype, "%s", line + 13);
        } else if (!strncasecmp(line, "connection:", 11) && strcasestr(line, "close")) {
            c->keep_alive = false;
        }
    }
    if (c->framing == BODY_CLOSE) c->keep_alive = false;
    body_start(&c->dec, c->framing, c->length);
}

/* Body bytes from the decoder into c->body (body_data_fn). */
static int body_data(void *ud, const char *p, size_t n)
{
    conn *c = ud;
    return bytes_add(&c->body, p, n, BODY_MAX);
}

/* Decodes body bytes into c->body. Returns 1 when the answer is complete, 0 when more is
 * needed, -1 on a framing error (bytes after the end of the body included: nothing is
 * pipelined). */
static int body_feed(conn *c, const char *p, size_t n)
{
    ssize_t used = body_decode(&c->dec, p, n, body_data, c);
    if (used < 0 || (size_t)used < n) return -1;
    return body_done(&c->dec);
}

/* The client hangs up (the planned disconnect): by RST or FIN, at random. */
static void hang_up(conn *c, uint64_t now)
{
    count_fate(c, F_HUNG_UP);
    conn_close(c, rnd() % 2 == 0);
    request_over(c, now, false);
}

static void broken(conn *c, uint64_t now, const char *why)
{
    st.completed++;
    count_fate(c, F_MALFORMED);
    report_malformed(c, why);
    conn_close(c, true);
    request_over(c, now, false);
}

static void on_input(conn *c, const char *p, size_t n, uint64_t now)
{
    if (c->state == S_HEAD) {
        size_t before = c->head.len;
        /* One read may hold the head and much of the body: only a head that is still
         * incomplete past HEAD_MAX is oversized. */
        if (bytes_add(&c->head, p, n, HEAD_MAX + READ_BUF) < 0) {
            broken(c, now, "oversized head");
            return;
        }
        char *e = strstr(c->head.p, "\r\n\r\n");
        if (!e && c->head.len > HEAD_MAX) {
            broken(c, now, "oversized head");
            return;
        }
        if (!e) return;
        size_t head_len = (size_t)(e - c->head.p) + 4;
        e[2] = '\0';
        parse_head(c);
        if (c->status < 100) {
            broken(c, now, "no status line");
            return;
        }
        c->state = S_BODY;
        bytes_clear(&c->body);
        c->raw_body = 0;
        p += head_len - before;
        n -= head_len - before;
        if (body_done(&c->dec)) {
            answer_done(c, now);
            return;
        }
    }
    c->raw_body += n;
    if (c->hangup_at > 0 && c->raw_body >= (size_t)c->hangup_at) {
        hang_up(c, now);
        return;
    }
    int r = body_feed(c, p, n);
    if (r < 0) {
        broken(c, now, "broken framing");
        return;
    }
    if (r > 0) answer_done(c, now);
}

static void on_eof(conn *c, uint64_t now, bool error)
{
    if (c->state == S_HEAD && c->head.len == 0 && c->reused && !error) {
        /* The server closed an idle kept-alive connection as we reused it: resend. */
        st.ka_retries++;
        conn_close(c, false);
        c->state = S_IDLE;
        c->open_at = now;
        inflight--;
        st.started--;
        return;
    }
    if (c->state == S_BODY && c->framing == BODY_CLOSE && !error) {
        answer_done(c, now);
        return;
    }
    st.io_errors++;
    broken(c, now, error ? "connection error mid-answer" : "connection closed mid-answer");
}

static void send_more(conn *c, uint64_t now)
{
    while (c->sent < c->req.len) {
        ssize_t k = write(c->fd, c->req.p + c->sent, c->req.len - c->sent);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            st.io_errors++;
            broken(c, now, "write failed");
            return;
        }
        c->sent += (size_t)k;
    }
    if (c->sent < c->req.len) {
        arm(c, EPOLLOUT);
        return;
    }
    if (c->hangup_at == 0) {
        hang_up(c, now);
        return;
    }
    c->state = S_HEAD;
    bytes_clear(&c->head);
    arm(c, EPOLLIN | EPOLLRDHUP);
}

static void start_request(conn *c, uint64_t now)
{
    build_request(c);
    st.started++;
    inflight++;
    if (inflight > st.max_inflight) st.max_inflight = inflight;
    c->deadline = now + (uint64_t)(opt.deadline_s * 1e9);
    c->sent = 0;
    c->reused = c->fd >= 0;
    if (c->reused) {
        c->state = S_SENDING;
        send_more(c, now);
        return;
    }
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        perror("soakload: socket");
        exit(2);
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
        perror("soakload: epoll_ctl");
        exit(2);
    }
    c->state = S_CONNECTING;
    if (connect(c->fd, (struct sockaddr *)&opt.addr, sizeof opt.addr) < 0 && errno != EINPROGRESS) {
        st.connect_errors++;
        conn_close(c, false);
        request_over(c, now, false);
        c->open_at = now + 100000000ull;
    }
}

static void on_event(conn *c, uint32_t events, char *buf, uint64_t now)
{
    if (c->fd < 0 || c->state == S_IDLE) return;
    if (c->state == S_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
            st.connect_errors++;
            conn_close(c, false);
            request_over(c, now, false);
            c->open_at = now + 100000000ull;
            return;
        }
        c->state = S_SENDING;
        send_more(c, now);
        return;
    }
    if (c->state == S_SENDING) {
        if (events & (EPOLLERR | EPOLLHUP)) {
            on_eof(c, now, true);
            return;
        }
        send_more(c, now);
        return;
    }
    for (;;) {
        ssize_t n = read(c->fd, buf, READ_BUF);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) return;
            on_eof(c, now, true);
            return;
        }
        if (n == 0) {
            on_eof(c, now, false);
            return;
        }
        on_input(c, buf, (size_t)n, now);
        if (c->state != S_HEAD && c->state != S_BODY) return;
    }
}

/* ---- setup and main loop --------------------------------------------------------------- */

_Noreturn static void usage(void)
{
    fprintf(
        stderr,
        "usage: soakload --url http://127.0.0.1:PORT [--streams N] [--duration S] [--ramp S]\n"
        "                [--loop PCT] [--fault PCT] [--whole PCT] [--hangup PCT] [--close PCT]\n"
        "                [--max-tokens K] [--deadline S] [--drain S] [--progress S] [--seed N]\n");
    exit(2);
}

static void parse_args(int argc, char **argv)
{
    opt = (options){.streams = 100,
                    .duration_s = 60,
                    .ramp_s = 5,
                    .deadline_s = 60,
                    .progress_s = 30,
                    .drain_s = 60,
                    .loop_pct = 15,
                    .fault_pct = 15,
                    .whole_pct = 20,
                    .hangup_pct = 5,
                    .close_pct = 10,
                    .max_tokens = 400,
                    .seed = 1};
    bool have_url = false;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage();
        double *d = !strcmp(a, "--duration")   ? &opt.duration_s
                    : !strcmp(a, "--ramp")     ? &opt.ramp_s
                    : !strcmp(a, "--deadline") ? &opt.deadline_s
                    : !strcmp(a, "--drain")    ? &opt.drain_s
                    : !strcmp(a, "--progress") ? &opt.progress_s
                    : !strcmp(a, "--loop")     ? &opt.loop_pct
                    : !strcmp(a, "--fault")    ? &opt.fault_pct
                    : !strcmp(a, "--whole")    ? &opt.whole_pct
                    : !strcmp(a, "--hangup")   ? &opt.hangup_pct
                    : !strcmp(a, "--close")    ? &opt.close_pct
                                               : NULL;
        long long n;
        if (d) {
            *d = atof(v);
        } else if (!strcmp(a, "--streams")) {
            if (!lg_parse_ll(v, 1, 1000000, &n)) usage();
            opt.streams = (int)n;
        } else if (!strcmp(a, "--max-tokens")) {
            if (!lg_parse_ll(v, 1, 1000000, &n)) usage();
            opt.max_tokens = (int)n;
        } else if (!strcmp(a, "--seed")) {
            if (!lg_parse_ll(v, 0, UINT32_MAX, &n)) usage();
            opt.seed = (unsigned)n;
        } else if (!strcmp(a, "--url")) {
            unsigned port = 0;
            char host[32];
            if (sscanf(v, "http://%31[0-9.]:%u", host, &port) != 2 || !port || port > 65535 ||
                inet_pton(AF_INET, host, &opt.addr.sin_addr) != 1)
                usage();
            opt.addr.sin_family = AF_INET;
            opt.addr.sin_port = htons((uint16_t)port);
            snprintf(opt.hostport, sizeof opt.hostport, "%s:%u", host, port);
            have_url = true;
        } else {
            usage();
        }
    }
    if (!have_url || opt.streams <= 0 || opt.duration_s <= 0 || opt.loop_pct + opt.fault_pct > 100)
        usage();
    rng_state = 0x9e3779b97f4a7c15ull ^ opt.seed;
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) return;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur < (rlim_t)opt.streams + 16) {
        fprintf(stderr, "soakload: RLIMIT_NOFILE %llu too low for %d streams\n",
                (unsigned long long)rl.rlim_cur, opt.streams);
        exit(2);
    }
}

static uint64_t violations(void)
{
    return st.malformed + st.leaks + st.hung + st.connect_errors + st.io_errors + st.clean_not_ok;
}

static void print_summary(double wall_s)
{
    printf("{\"streams\":%d,\"wall_s\":%.1f,\"started\":%llu,\"completed\":%llu,"
           "\"stream_answers\":%llu,\"whole_answers\":%llu,\"max_inflight\":%llu,"
           "\"malformed\":%llu,\"leaks\":%llu,\"hung\":%llu,\"connect_errors\":%llu,"
           "\"io_errors\":%llu,\"clean_not_ok\":%llu,\"keepalive_retries\":%llu,"
           "\"foreign_lines\":%llu,\"violations\":%llu,\"kinds\":{",
           opt.streams, wall_s, (unsigned long long)st.started, (unsigned long long)st.completed,
           (unsigned long long)st.stream_answers, (unsigned long long)st.whole_answers,
           (unsigned long long)st.max_inflight, (unsigned long long)st.malformed,
           (unsigned long long)st.leaks, (unsigned long long)st.hung,
           (unsigned long long)st.connect_errors, (unsigned long long)st.io_errors,
           (unsigned long long)st.clean_not_ok, (unsigned long long)st.ka_retries,
           (unsigned long long)st.foreign_lines, (unsigned long long)violations());
    for (size_t k = 0; k < N_KINDS; k++) {
        printf("%s\"%s\":{", k ? "," : "", kind_names[k]);
        for (int f = 0; f < N_FATES; f++)
            printf("%s\"%s\":%llu", f ? "," : "", fate_names[f],
                   (unsigned long long)st.fates[k][f]);
        printf("}");
    }
    printf("}}\n");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    raise_nofile();
    epfd = epoll_create1(EPOLL_CLOEXEC);
    conns = calloc((size_t)opt.streams, sizeof *conns);
    char *buf = malloc(READ_BUF);
    struct epoll_event *evs = malloc(sizeof *evs * 1024);
    if (epfd < 0 || !conns || !buf || !evs) {
        perror("soakload: setup");
        return 2;
    }
    uint64_t t0 = now_ns(), stop_at = t0 + (uint64_t)(opt.duration_s * 1e9);
    uint64_t drain_until = stop_at + (uint64_t)(opt.drain_s * 1e9);
    uint64_t next_progress = t0 + (uint64_t)(opt.progress_s * 1e9), next_scan = t0;
    for (int i = 0; i < opt.streams; i++) {
        conns[i].fd = -1;
        conns[i].open_at = t0 + (uint64_t)(opt.ramp_s * 1e9 * i / opt.streams);
    }
    for (;;) {
        uint64_t now = now_ns();
        bool running = now < stop_at;
        if (!running && (inflight == 0 || now >= drain_until)) break;
        if (now >= next_scan) {
            /* Idle connections start their next request; requests past their deadline are
             * hung. O(streams) every 10 ms. */
            for (int i = 0; i < opt.streams; i++) {
                conn *c = &conns[i];
                if (c->state == S_IDLE && running && c->open_at <= now) {
                    start_request(c, now);
                } else if (c->state == S_IDLE && !running) {
                    conn_close(c, false);
                } else if (c->state != S_IDLE && now > c->deadline) {
                    st.hung++;
                    fprintf(stderr, "soakload: hung request (kind %s, state %d)\n",
                            kind_names[c->kind], c->state);
                    conn_close(c, true);
                    request_over(c, now, false);
                }
            }
            next_scan = now + 10000000ull;
        }
        if (now >= next_progress) {
            fprintf(stderr,
                    "soakload: t=%.0fs started=%llu completed=%llu inflight=%zu violations=%llu\n",
                    (double)(now - t0) / 1e9, (unsigned long long)st.started,
                    (unsigned long long)st.completed, inflight, (unsigned long long)violations());
            next_progress += (uint64_t)(opt.progress_s * 1e9);
        }
        int n = epoll_wait(epfd, evs, 1024, 10);
        if (n < 0 && errno != EINTR) {
            perror("soakload: epoll_wait");
            return 2;
        }
        now = now_ns();
        for (int i = 0; i < n; i++)
            on_event(evs[i].data.ptr, evs[i].events, buf, now);
    }
    st.hung += inflight;
    print_summary((double)(now_ns() - t0) / 1e9);
    for (int i = 0; i < opt.streams; i++) {
        conn_close(&conns[i], true);
        free(conns[i].req.p);
        free(conns[i].head.p);
        free(conns[i].body.p);
    }
    free(conns);
    free(buf);
    free(evs);
    close(epfd);
    return violations() ? 1 : 0;
}
