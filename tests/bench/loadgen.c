/* loadgen.c — the bench's client: many concurrent SSE streams, every event timed.
 *
 * One thread, one epoll loop, raw non-blocking sockets. Each of N connections repeatedly
 * POSTs a streaming chat request over HTTP/1.1 keep-alive, decodes the response (chunked,
 * Content-Length or close-delimited), splits the body into SSE lines and looks at every
 * `data:` event. The fake upstream, run with --stamp, writes each content token as
 * `w<CLOCK_MONOTONIC ns> `; the clock is shared by every process on the machine, so the
 * time from the upstream's write to our read is (time of our read - stamp). That is the
 * per-event latency; run against the upstream directly it is the floor, and a proxy's
 * added latency is its figure minus the floor. TTFT is the time from writing the request to
 * the first stamped event; it is also given in two legs split at that event's stamp
 * (ttft_up: the request's way to the upstream plus the upstream's pace before its first
 * token; first_lat: that token's way back), so that a relay's added TTFT can be told apart
 * as request handling or as first-token delivery.
 *
 * Only a measurement window [warmup, warmup + duration) is counted; connections are opened
 * evenly over the ramp so that paced streams do not tick in lockstep. At the start and end
 * of the window the CPU time (utime + stime) of the processes named by --watch-pid is read
 * from /proc, and their VmRSS at the end, so that CPU per event and RSS per stream line up
 * exactly with the events counted. The CPU time of the fake upstream (--upstream-pid) and
 * of the whole machine is sampled too, so that the report can say how much of the machine
 * other work took during the window.
 *
 * Cost: one read(2) per readiness event into a shared 64 KiB buffer; partial SSE lines are
 * copied into a per-connection buffer, whole lines are parsed in place. Events are checked
 * for shape (a JSON object between braces) rather than fully parsed, which keeps the client
 * well below the cost of the servers it measures (see --self in the output: our own CPU).
 *
 * Output: one JSON line on stdout (see print_summary). Exit status 0 unless setup failed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "proxy/num.h"
#include "tests/bench/chunked.h"

#define MAX_WATCH 16
#define READ_BUF  65536
#define MAX_LINE  (1 << 20)
#define RETRY_NS  (50 * 1000000ULL)
#define HIST_EXACT_BITS                                                                            \
    17 /* exact to the microsecond below 131 ms: every TTFT at the bench's pace */
#define HIST_LINEAR  (1u << HIST_EXACT_BITS)
#define HIST_SUBBITS 9
#define HIST_BINS    (HIST_LINEAR + (64 - HIST_EXACT_BITS) * (1 << HIST_SUBBITS))

/* ---- latency histogram: exact below 131 ms, then 9 bits of mantissa (< 0.2 % error) ----
 * The exact range covers TTFT (the upstream's pace, 33 ms, plus the relay's part): with 9
 * bits of mantissa there its bins were 64 us wide, as wide as nginx's whole added TTFT p99. */

typedef struct hist {
    uint64_t bins[HIST_BINS];
    uint64_t count;
    uint64_t max;
} hist;

static unsigned hist_bin(uint64_t v)
{
    if (v < HIST_LINEAR) return (unsigned)v;
    unsigned e = 63 - (unsigned)__builtin_clzll(v); /* >= HIST_EXACT_BITS */
    unsigned sub = (unsigned)(v >> (e - HIST_SUBBITS)) & ((1u << HIST_SUBBITS) - 1);
    return HIST_LINEAR + (e - HIST_EXACT_BITS) * (1u << HIST_SUBBITS) + sub;
}

/* Lower bound of the values that fall in bin `b`. */
static uint64_t hist_bin_value(unsigned b)
{
    if (b < HIST_LINEAR) return b;
    unsigned e = (b - HIST_LINEAR) / (1u << HIST_SUBBITS) + HIST_EXACT_BITS;
    uint64_t sub = (b - HIST_LINEAR) % (1u << HIST_SUBBITS);
    return (1ULL << e) | (sub << (e - HIST_SUBBITS));
}

static void hist_add(hist *h, uint64_t v)
{
    h->bins[hist_bin(v)]++;
    h->count++;
    if (v > h->max) h->max = v;
}

/* Returns the q-quantile (0 < q <= 1) in the histogram's unit, 0 when empty. O(bins). */
static uint64_t hist_quantile(const hist *h, double q)
{
    if (h->count == 0) return 0;
    uint64_t rank = (uint64_t)(q * (double)h->count + 0.999999);
    if (rank < 1) rank = 1;
    uint64_t seen = 0;
    for (unsigned b = 0; b < HIST_BINS; b++) {
        seen += h->bins[b];
        if (seen >= rank) return hist_bin_value(b);
    }
    return h->max;
}

/* ---- configuration and global counters ---- */

typedef struct options {
    const char *host;
    uint16_t port;
    const char *path;
    int streams;
    double duration_s, warmup_s, ramp_s;
    int max_tokens;
    const char *label;
    char headers[4096]; /* extra request header lines, each ending in CRLF */
    size_t headers_len;
    int watch[MAX_WATCH];
    int nwatch;
    int upstream_pid; /* the fake upstream, when it is not itself the target (0: none) */
} options;

typedef struct counters {
    uint64_t events;   /* stamped content events read inside the window */
    uint64_t stamps;   /* stamps seen (an event may carry several tokens) */
    uint64_t data;     /* every data: line inside the window, stamped or not */
    uint64_t requests; /* responses completed inside the window */
    uint64_t err_status, err_malformed, err_io, err_connect, err_truncated, err_event;
    uint64_t negative; /* stamps later than our read: clock trouble, counted not hidden */
    hist lat, ttft;
    hist ttft_up;   /* request written -> the upstream's stamp of its first token */
    hist first_lat; /* that stamp -> our read: the first token's own latency */
} counters;

static options opt;
static counters cnt;
static char *request;
static size_t request_len;
static uint64_t win_start, win_end;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static bool in_window(uint64_t t)
{
    return t >= win_start && t < win_end;
}

/* ---- one connection ---- */

typedef enum { C_WAIT, C_CONNECTING, C_HEAD, C_BODY } conn_state;

typedef struct conn {
    int fd;
    conn_state state;
    uint64_t open_at; /* C_WAIT: when to (re)connect */
    size_t sent;      /* bytes of the request written */
    uint64_t t_sent;  /* when the request was fully written */
    /* response head */
    int status;
    bool keep_alive;
    /* body framing: from the head, then the decoder */
    body_framing framing;
    uint64_t length; /* Content-Length */
    body_decoder body;
    uint64_t t_read; /* when the bytes being decoded were read */
    bool saw_done, got_first;
    /* partial line (head lines and SSE lines share it) */
    char *line;
    size_t llen, lcap;
} conn;

static conn *conns;
static int epfd;
static int waiting; /* connections in C_WAIT */

static void conn_schedule(conn *c, uint64_t at)
{
    if (c->fd >= 0) {
        /* RST instead of FIN: no TIME_WAIT left behind for the next run's ports. */
        struct linger lg = {1, 0};
        setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(c->fd);
        c->fd = -1;
    }
    c->state = C_WAIT;
    c->open_at = at;
    c->llen = 0;
    waiting++;
}

static void conn_fail(conn *c, uint64_t *counter, uint64_t now)
{
    if (in_window(now)) (*counter)++;
    conn_schedule(c, now + RETRY_NS);
}

/* Writes what is left of the request. Returns 0, or -1 when the connection failed. */
static int conn_send(conn *c, uint64_t now)
{
    while (c->sent < request_len) {
        ssize_t n = write(c->fd, request + c->sent, request_len - c->sent);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) break;
            return -1;
        }
        c->sent += (size_t)n;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (c->sent < request_len)
        ev.events |= EPOLLOUT;
    else
        c->t_sent = now;
    if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0) return -1;
    return 0;
}

static void conn_start_request(conn *c, uint64_t now)
{
    c->sent = 0;
    c->state = C_HEAD;
    c->status = 0;
    c->keep_alive = true;
    c->framing = BODY_CLOSE;
    c->length = 0;
    c->saw_done = c->got_first = false;
    c->llen = 0;
    if (conn_send(c, now) < 0) conn_fail(c, &cnt.err_io, now);
}

static void conn_open(conn *c, uint64_t now)
{
    waiting--;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(opt.port)};
    inet_pton(AF_INET, opt.host, &sa.sin_addr);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        fprintf(stderr, "loadgen: socket: %s\n", strerror(errno));
        exit(2);
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->state = C_CONNECTING;
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
        fprintf(stderr, "loadgen: epoll_ctl: %s\n", strerror(errno));
        exit(2);
    }
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS)
        conn_fail(c, &cnt.err_connect, now);
}

/* Appends n bytes to the connection's partial line. Returns 0, or -1 when the line would
 * exceed MAX_LINE (a runaway line is a malformed response). */
static int line_append(conn *c, const char *p, size_t n)
{
    if (c->llen + n > MAX_LINE) return -1;
    if (c->llen + n > c->lcap) {
        size_t cap = c->lcap ? c->lcap : 256;
        while (cap < c->llen + n)
            cap *= 2;
        char *nl = realloc(c->line, cap);
        if (!nl) abort();
        c->line = nl;
        c->lcap = cap;
    }
    memcpy(c->line + c->llen, p, n);
    c->llen += n;
    return 0;
}

/* Records every `w<digits>` stamp inside the JSON string that starts at p (just after the
 * opening quote of "content"'s value). Returns how many stamps it found. */
static unsigned scan_stamps(const char *p, const char *end, uint64_t t_read, conn *c)
{
    unsigned found = 0;
    uint64_t first = 0; /* the first stamp of this string */
    while (p < end && *p != '"') {
        if (*p == '\\') {
            p += 2;
            continue;
        }
        if (*p == 'w' && p + 1 < end && p[1] >= '0' && p[1] <= '9') {
            uint64_t v = 0;
            p++;
            while (p < end && *p >= '0' && *p <= '9')
                v = v * 10 + (uint64_t)(*p++ - '0');
            if (!found++) first = v;
            if (!in_window(t_read)) continue;
            cnt.stamps++;
            if (v > t_read) {
                cnt.negative++;
                hist_add(&cnt.lat, 0);
            } else {
                hist_add(&cnt.lat, (t_read - v) / 1000);
            }
            continue;
        }
        p++;
    }
    if (found && !c->got_first) {
        c->got_first = true;
        if (in_window(t_read) && c->t_sent) {
            hist_add(&cnt.ttft, (t_read - c->t_sent) / 1000);
            /* TTFT split at the upstream's stamp: the request's way there (with the
             * upstream's own pace before its first token) and the first token's way back. */
            hist_add(&cnt.ttft_up, first > c->t_sent ? (first - c->t_sent) / 1000 : 0);
            hist_add(&cnt.first_lat, t_read > first ? (t_read - first) / 1000 : 0);
        }
    }
    return found;
}

/* Handles one SSE line (without its line terminator). */
static void sse_line(conn *c, const char *p, size_t n, uint64_t t_read)
{
    if (n && p[n - 1] == '\r') n--;
    if (n < 5 || memcmp(p, "data:", 5) != 0) return; /* blank, comment, event:, id: ... */
    p += 5, n -= 5;
    if (n && *p == ' ') p++, n--;
    bool win = in_window(t_read);
    if (win) cnt.data++;
    if (n == 6 && memcmp(p, "[DONE]", 6) == 0) {
        c->saw_done = true;
        return;
    }
    if (n < 2 || p[0] != '{' || p[n - 1] != '}') {
        if (win) cnt.err_malformed++;
        return;
    }
    const char *end = p + n;
    if (n > 9 && memcmp(p, "{\"error\":", 9) == 0) {
        if (win) cnt.err_event++;
        return;
    }
    /* Anthropic Messages: the text is a text_delta's "text"; message_stop ends the stream. */
    static const char key[] = "\"content\":\"", akey[] = "\"text\":\"";
    static const char stop[] = "\"type\":\"message_stop\"";
    const char *q = memmem(p, n, key, sizeof key - 1);
    size_t klen = sizeof key - 1;
    if (!q && (q = memmem(p, n, akey, sizeof akey - 1))) klen = sizeof akey - 1;
    if (!q) {
        if (memmem(p, n, stop, sizeof stop - 1)) c->saw_done = true;
        return;
    }
    if (scan_stamps(q + klen, end, t_read, c) && win) cnt.events++;
}

/* Feeds body bytes to the SSE splitter. Returns 0, or -1 on a runaway line. */
static int sse_feed(conn *c, const char *p, size_t n, uint64_t t_read)
{
    while (n) {
        const char *nl = memchr(p, '\n', n);
        if (!nl) return line_append(c, p, n);
        size_t k = (size_t)(nl - p);
        if (c->llen) {
            if (line_append(c, p, k) < 0) return -1;
            sse_line(c, c->line, c->llen, t_read);
            c->llen = 0;
        } else {
            sse_line(c, p, k, t_read);
        }
        p += k + 1, n -= k + 1;
    }
    return 0;
}

/* One response finished: count it, then send the next request or reconnect. */
static void response_done(conn *c, uint64_t now)
{
    if (in_window(now)) {
        cnt.requests++;
        if (c->status != 200)
            cnt.err_status++;
        else if (!c->saw_done)
            cnt.err_truncated++;
    }
    if (now >= win_end) return;
    if (!c->keep_alive) {
        conn_schedule(c, now);
        return;
    }
    conn_start_request(c, now);
}

/* Parses one response head line. Returns 0, 1 when the head is complete, -1 when bad. */
static int head_line(conn *c, const char *p, size_t n)
{
    if (n && p[n - 1] == '\r') n--;
    if (c->status == 0) {
        if (n < 12 || memcmp(p, "HTTP/1.", 7) != 0) return -1;
        c->status = atoi(p + 9);
        if (p[7] == '0') c->keep_alive = false;
        return c->status >= 100 ? 0 : -1;
    }
    if (n == 0) {
        if (c->status >= 100 && c->status < 200) { /* interim response: read the next head */
            c->status = 0;
            return 0;
        }
        return 1;
    }
    if (n > 15 && strncasecmp(p, "content-length:", 15) == 0) {
        c->framing = BODY_LENGTH;
        c->length = strtoull(p + 15, NULL, 10);
    } else if (n > 18 && strncasecmp(p, "transfer-encoding:", 18) == 0) {
        if (memmem(p, n, "chunked", 7)) c->framing = BODY_CHUNKED;
    } else if (n > 11 && strncasecmp(p, "connection:", 11) == 0) {
        if (memmem(p, n, "close", 5)) c->keep_alive = false;
    }
    return 0;
}

/* Body bytes from the decoder to the SSE splitter (body_data_fn). */
static int body_data(void *ud, const char *p, size_t n)
{
    conn *c = ud;
    return sse_feed(c, p, n, c->t_read);
}

/* Processes bytes read from a connection in C_HEAD or C_BODY. */
static void conn_input(conn *c, const char *p, size_t n, uint64_t t_read)
{
    while (n) {
        if (c->state == C_HEAD) {
            const char *nl = memchr(p, '\n', n);
            size_t k = nl ? (size_t)(nl - p) : n;
            if (line_append(c, p, k) < 0) goto bad;
            if (!nl) return;
            p += k + 1, n -= k + 1;
            int r = head_line(c, c->line, c->llen);
            c->llen = 0;
            if (r < 0) goto bad;
            if (r == 1) {
                c->state = C_BODY;
                if (c->framing == BODY_CLOSE) c->keep_alive = false;
                body_start(&c->body, c->framing, c->length);
                if (body_done(&c->body)) {
                    response_done(c, t_read);
                    return;
                }
            }
            continue;
        }
        c->t_read = t_read;
        if (body_decode(&c->body, p, n, body_data, c) < 0) goto bad;
        if (body_done(&c->body)) {
            response_done(c, t_read);
            return; /* we never pipeline, so nothing can follow the response */
        }
        return;
    }
    return;
bad:
    conn_fail(c, &cnt.err_malformed, t_read);
}

static void conn_event(conn *c, uint32_t events, char *buf)
{
    uint64_t now = now_ns();
    if (c->state == C_WAIT) return; /* failed earlier in this batch of events */
    if (c->state == C_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
            conn_fail(c, &cnt.err_connect, now);
            return;
        }
        conn_start_request(c, now);
        return;
    }
    if ((events & EPOLLOUT) && c->sent < request_len) {
        if (conn_send(c, now) < 0) {
            conn_fail(c, &cnt.err_io, now);
            return;
        }
    }
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return;
    ssize_t n = read(c->fd, buf, READ_BUF);
    now = now_ns(); /* after the read: a stamp is never later than the bytes it is in */
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        conn_fail(c, &cnt.err_io, now);
        return;
    }
    if (n == 0) {
        if (c->state == C_BODY && c->framing == BODY_CLOSE) {
            c->keep_alive = false;
            response_done(c, now);
        } else if (c->state == C_HEAD && c->status == 0 && c->llen == 0 && c->sent == 0) {
            conn_schedule(c, now); /* idle keep-alive connection closed by the server */
        } else {
            conn_fail(c, &cnt.err_io, now);
        }
        return;
    }
    conn_input(c, buf, (size_t)n, now);
}

/* ---- /proc sampling of the watched processes ---- */

/* Returns utime + stime of pid in clock ticks, or 0 when it cannot be read (gone). */
static uint64_t proc_ticks(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may contain spaces */
    if (!p) return 0;
    unsigned long long ut = 0, st = 0;
    /* after ") ": state(3) ... utime is field 14, stime 15 */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return 0;
    return ut + st;
}

/* Returns VmRSS of pid in KiB, or 0. */
static uint64_t proc_rss_kib(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    uint64_t kib = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) kib = strtoull(line + 6, NULL, 10);
    fclose(f);
    return kib;
}

static bool watch_lost; /* a watched process vanished: its CPU and RSS are meaningless */

static uint64_t watch_ticks(void)
{
    uint64_t t = 0;
    for (int i = 0; i < opt.nwatch; i++) {
        uint64_t v = proc_ticks(opt.watch[i]);
        if (v == 0 && kill(opt.watch[i], 0) < 0) watch_lost = true;
        t += v;
    }
    return t;
}

static uint64_t watch_rss(void)
{
    uint64_t r = 0;
    for (int i = 0; i < opt.nwatch; i++)
        r += proc_rss_kib(opt.watch[i]);
    return r;
}

static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* Returns the CPU ticks all cores spent busy since boot (user, nice, system and steal from
 * /proc/stat; irq and softirq are left out because our own loopback traffic lands there),
 * or 0. Over the window it shows how much other work shared the machine with the target,
 * the upstream and us. */
static uint64_t machine_busy_ticks(void)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return 0;
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]);
    fclose(f);
    return n == 8 ? v[0] + v[1] + v[2] + v[7] : 0;
}

/* Returns the nanoseconds the threads of pid spent runnable but waiting for a CPU
 * (the second field of /proc/PID/task/TID/schedstat, summed), or 0. A target whose threads
 * wait a lot was starved of CPU: its latency is queueing for the machine, not its own. */
static uint64_t proc_runq_wait_ns(int pid)
{
    char path[64], file[sizeof path + sizeof((struct dirent *)0)->d_name + sizeof "/schedstat"];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d) return 0;
    uint64_t sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(file, sizeof file, "%s/%s/schedstat", path, e->d_name);
        FILE *f = fopen(file, "r");
        if (!f) continue;
        unsigned long long run, wait;
        if (fscanf(f, "%llu %llu", &run, &wait) == 2) sum += wait;
        fclose(f);
    }
    closedir(d);
    return sum;
}

static uint64_t watch_runq_wait_ns(void)
{
    uint64_t w = 0;
    for (int i = 0; i < opt.nwatch; i++)
        w += proc_runq_wait_ns(opt.watch[i]);
    return w;
}

/* CPU accounting at one instant; the summary reports the differences over the window. */
typedef struct cpu_sample {
    uint64_t target, upstream, machine; /* clock ticks */
    uint64_t target_wait;               /* ns the target's threads waited for a CPU */
    double self;                        /* seconds */
} cpu_sample;

static cpu_sample cpu_now(void)
{
    cpu_sample c = {watch_ticks(), opt.upstream_pid ? proc_ticks(opt.upstream_pid) : 0,
                    machine_busy_ticks(), watch_runq_wait_ns(), self_cpu_s()};
    return c;
}

/* ---- setup ---- */

_Noreturn static void usage(void)
{
    fprintf(stderr,
            "usage: loadgen --url http://127.0.0.1:PORT/PATH [--streams N] [--duration S]\n"
            "               [--warmup S] [--ramp S] [--max-tokens K] [--header 'Name: v']...\n"
            "               [--watch-pid PID]... [--upstream-pid PID] [--label NAME]\n");
    exit(2);
}

/* Parses http://HOST:PORT/PATH (IPv4 literal host). Returns 0 or -1. */
static int parse_url(const char *url)
{
    static char host[64];
    if (strncmp(url, "http://", 7) != 0) return -1;
    const char *h = url + 7, *colon = strchr(h, ':');
    if (!colon || (size_t)(colon - h) >= sizeof host) return -1;
    memcpy(host, h, (size_t)(colon - h));
    host[colon - h] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (port <= 0 || port > 65535) return -1;
    opt.host = host;
    opt.port = (uint16_t)port;
    opt.path = *end == '/' ? end : "/";
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1 ? 0 : -1;
}

static void parse_args(int argc, char **argv)
{
    opt.streams = 100;
    opt.duration_s = 5;
    opt.warmup_s = 1;
    opt.ramp_s = 0;
    opt.max_tokens = 200;
    opt.label = "";
    bool have_url = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n;
        if (!v) usage();
        i++;
        if (!strcmp(a, "--url")) {
            if (parse_url(v) < 0) usage();
            have_url = true;
        } else if (!strcmp(a, "--streams")) {
            if (!lg_parse_ll(v, 1, 1000000, &n)) usage();
            opt.streams = (int)n;
        } else if (!strcmp(a, "--duration")) {
            opt.duration_s = atof(v);
        } else if (!strcmp(a, "--warmup")) {
            opt.warmup_s = atof(v);
        } else if (!strcmp(a, "--ramp")) {
            opt.ramp_s = atof(v);
        } else if (!strcmp(a, "--max-tokens")) {
            if (!lg_parse_ll(v, 1, 1000000, &n)) usage();
            opt.max_tokens = (int)n;
        } else if (!strcmp(a, "--label")) {
            opt.label = v;
        } else if (!strcmp(a, "--header")) {
            int k = snprintf(opt.headers + opt.headers_len, sizeof opt.headers - opt.headers_len,
                             "%s\r\n", v);
            if (k < 0 || (size_t)k >= sizeof opt.headers - opt.headers_len) usage();
            opt.headers_len += (size_t)k;
        } else if (!strcmp(a, "--upstream-pid")) {
            if (!lg_parse_ll(v, 1, INT32_MAX, &n)) usage();
            opt.upstream_pid = (int)n;
        } else if (!strcmp(a, "--watch-pid")) {
            if (opt.nwatch == MAX_WATCH || !lg_parse_ll(v, 1, INT32_MAX, &n)) usage();
            opt.watch[opt.nwatch++] = (int)n;
        } else {
            usage();
        }
    }
    if (!have_url || opt.streams <= 0 || opt.duration_s <= 0 || opt.max_tokens <= 0) usage();
    if (opt.warmup_s < opt.ramp_s) opt.warmup_s = opt.ramp_s;
}

static void build_request(void)
{
    char body[256];
    int blen = snprintf(body, sizeof body,
                        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                        "\"stream\":true,\"max_tokens\":%d}",
                        opt.max_tokens);
    size_t cap = 512 + opt.headers_len + (size_t)blen;
    request = malloc(cap);
    if (!request) abort();
    int n = snprintf(request, cap,
                     "POST %s HTTP/1.1\r\nHost: %s:%u\r\nContent-Type: application/json\r\n"
                     "Accept: text/event-stream\r\nContent-Length: %d\r\n%.*s\r\n%s",
                     opt.path, opt.host, opt.port, blen, (int)opt.headers_len, opt.headers, body);
    request_len = (size_t)n;
}

/* Raises RLIMIT_NOFILE to the hard limit; fails when that is too low for the streams. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) return;
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < (rlim_t)opt.streams + 16) {
        fprintf(stderr, "loadgen: RLIMIT_NOFILE %llu too low for %d streams\n",
                (unsigned long long)rl.rlim_cur, opt.streams);
        exit(2);
    }
}

static void print_summary(double wall_s, cpu_sample a, cpu_sample b, uint64_t rss)
{
    double hz = (double)sysconf(_SC_CLK_TCK);
    if (b.target < a.target) watch_lost = true;
    double cpu_s = hz > 0 && !watch_lost ? (double)(b.target - a.target) / hz : -1;
    uint64_t errors = cnt.err_status + cnt.err_malformed + cnt.err_io + cnt.err_connect +
                      cnt.err_truncated + cnt.err_event;
    printf("{\"label\":\"%s\",\"streams\":%d,\"max_tokens\":%d,\"duration_s\":%.3f,"
           "\"requests\":%" PRIu64 ",\"events\":%" PRIu64 ",\"stamps\":%" PRIu64
           ",\"events_per_s\":%.1f,"
           "\"lat_p50_us\":%" PRIu64 ",\"lat_p99_us\":%" PRIu64 ",\"lat_p999_us\":%" PRIu64
           ",\"lat_max_us\":%" PRIu64 ",\"ttft_p50_us\":%" PRIu64 ",\"ttft_p99_us\":%" PRIu64
           ",\"ttft_up_p50_us\":%" PRIu64 ",\"ttft_up_p99_us\":%" PRIu64
           ",\"first_lat_p50_us\":%" PRIu64 ",\"first_lat_p99_us\":%" PRIu64 ",\"errors\":%" PRIu64
           ",\"err\":{\"status\":%" PRIu64 ",\"malformed\":%" PRIu64 ",\"io\":%" PRIu64
           ",\"connect\":%" PRIu64 ",\"truncated\":%" PRIu64 ",\"error_event\":%" PRIu64
           "},\"negative_latency\":%" PRIu64 ",\"target_cpu_s\":%.3f,\"target_rss_kib\":%" PRIu64
           ",\"target_lost\":%s,\"loadgen_cpu_s\":%.3f,\"upstream_cpu_s\":%.3f,\"target_runq_wait_"
           "s\":%.3f"
           ",\"machine_busy_cpu_s\":%.3f,\"cores\":%ld}\n",
           opt.label, opt.streams, opt.max_tokens, wall_s, cnt.requests, cnt.events, cnt.stamps,
           (double)cnt.events / wall_s, hist_quantile(&cnt.lat, 0.5), hist_quantile(&cnt.lat, 0.99),
           hist_quantile(&cnt.lat, 0.999), cnt.lat.max, hist_quantile(&cnt.ttft, 0.5),
           hist_quantile(&cnt.ttft, 0.99), hist_quantile(&cnt.ttft_up, 0.5),
           hist_quantile(&cnt.ttft_up, 0.99), hist_quantile(&cnt.first_lat, 0.5),
           hist_quantile(&cnt.first_lat, 0.99), errors, cnt.err_status, cnt.err_malformed,
           cnt.err_io, cnt.err_connect, cnt.err_truncated, cnt.err_event, cnt.negative, cpu_s, rss,
           watch_lost ? "true" : "false", b.self - a.self,
           hz > 0 ? (double)(b.upstream - a.upstream) / hz : 0,
           b.target_wait >= a.target_wait ? (double)(b.target_wait - a.target_wait) / 1e9 : 0,
           hz > 0 ? (double)(b.machine - a.machine) / hz : 0, sysconf(_SC_NPROCESSORS_ONLN));
    fflush(stdout);
}

int main(int argc, char **argv)
{
    parse_args(argc, argv);
    raise_nofile();
    build_request();
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) {
        perror("loadgen: epoll_create1");
        return 2;
    }
    conns = calloc((size_t)opt.streams, sizeof *conns);
    char *buf = malloc(READ_BUF);
    struct epoll_event *evs = malloc(sizeof *evs * 1024);
    if (!conns || !buf || !evs) abort();

    uint64_t t0 = now_ns();
    win_start = t0 + (uint64_t)(opt.warmup_s * 1e9);
    win_end = win_start + (uint64_t)(opt.duration_s * 1e9);
    for (int i = 0; i < opt.streams; i++) {
        conns[i].fd = -1;
        conn_schedule(&conns[i], t0 + (uint64_t)(opt.ramp_s * 1e9 * i / opt.streams));
    }

    bool started = false;
    cpu_sample c0 = {0, 0, 0, 0, 0};
    for (;;) {
        uint64_t now = now_ns();
        if (!started && now >= win_start) {
            started = true;
            c0 = cpu_now();
        }
        if (now >= win_end) break;
        if (waiting) {
            for (int i = 0; i < opt.streams; i++)
                if (conns[i].state == C_WAIT && conns[i].open_at <= now) conn_open(&conns[i], now);
        }
        uint64_t until = started ? win_end : win_start;
        int timeout = waiting ? 1 : (int)((until - now) / 1000000 + 1);
        if (timeout > 100) timeout = 100;
        int n = epoll_wait(epfd, evs, 1024, timeout);
        if (n < 0 && errno != EINTR) {
            perror("loadgen: epoll_wait");
            return 2;
        }
        for (int i = 0; i < n; i++)
            conn_event(evs[i].data.ptr, evs[i].events, buf);
    }
    cpu_sample c1 = cpu_now();
    print_summary(opt.duration_s, c0, c1, watch_rss());
    for (int i = 0; i < opt.streams; i++) {
        if (conns[i].fd >= 0) conn_schedule(&conns[i], 0);
        free(conns[i].line);
    }
    free(conns);
    free(buf);
    free(evs);
    close(epfd);
    return 0;
}
