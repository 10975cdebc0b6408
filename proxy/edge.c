/* edge.c — see edge.h. */
#include "proxy/edge.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "proxy/http.h"
#include "proxy/httphead.h"
#include "proxy/xalloc.h"

/* Pool bytes libmicrohttpd needs per query argument (its header record and the split
 * text, with margin): max_header_bytes / EDGE_ARG_BYTES arguments are accepted. */
#define EDGE_ARG_BYTES 128

struct edge_conn {
    edge_conn *prev, *next; /* the worker's timed list (w->edge_conns; prev NULL at its head) */
    struct MHD_Connection *conn;
    int fd;
    struct ip_count *ip; /* NULL when no per-address cap is configured */
    uint64_t since_ns;   /* accept, or the end of the previous request */
    bool kept_alive;     /* a request completed on this connection before */
    bool in_head;        /* waiting for a request head */
    bool in_body;        /* the head was admitted, the body is not complete */
    bool timed;          /* on the timed list: in_head or in_body (clock_start) */
    uint64_t body_bytes;
    uint64_t body_ns;   /* time spent waiting for body bytes while not suspended */
    uint64_t last_ns;   /* the last tick (or admission) that accounted body_ns */
    bool too_many_args; /* the query string was dropped before libmicrohttpd split it */
    hh_stream stream;   /* the raw bytes libmicrohttpd read from the socket (edge_received) */
    uint64_t admitted;  /* heads that reached edge_admit: the number of the current one */
};

/* ---- connections per client address -------------------------------------------------- */

/* A peer's edge_addr_key (4 or 8 bytes). */
typedef struct ip_key {
    unsigned char b[8];
    unsigned char len;
} ip_key;

typedef struct ip_count {
    ip_key key;
    unsigned n;
    struct ip_count *next;
} ip_count;

#define IP_BUCKETS 4096
static pthread_mutex_t ip_lock = PTHREAD_MUTEX_INITIALIZER;
static ip_count *ip_table[IP_BUCKETS];

size_t edge_addr_key(const struct sockaddr *sa, unsigned char key[8])
{
    if (sa->sa_family == AF_INET) {
        memcpy(key, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 4;
    }
    if (sa->sa_family != AF_INET6) return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a)) { /* an IPv4 client of a dual-stack socket */
        memcpy(key, a->s6_addr + 12, 4);
        return 4;
    }
    memcpy(key, a->s6_addr, 8);
    return 8;
}

static bool ip_key_of(const struct sockaddr *sa, ip_key *k)
{
    memset(k, 0, sizeof *k);
    k->len = (unsigned char)edge_addr_key(sa, k->b);
    return k->len != 0;
}

static ip_count **ip_slot(const ip_key *k)
{
    uint32_t h = 2166136261u;
    for (unsigned i = 0; i < k->len; i++)
        h = (h ^ k->b[i]) * 16777619u;
    ip_count **p = &ip_table[h % IP_BUCKETS];
    while (*p && ((*p)->key.len != k->len || memcmp((*p)->key.b, k->b, k->len) != 0))
        p = &(*p)->next;
    return p;
}

enum MHD_Result edge_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    lg_worker *w = cls;
    unsigned cap = w->srv->cfg->limits.max_conns_per_ip;
    ip_key k;
    (void)addrlen;
    if (!cap || !ip_key_of(addr, &k)) return MHD_YES;
    pthread_mutex_lock(&ip_lock);
    ip_count *c = *ip_slot(&k);
    bool ok = !c || c->n < cap;
    pthread_mutex_unlock(&ip_lock);
    return ok ? MHD_YES : MHD_NO;
}

/* Counts the connection against its address. Returns the entry (NULL without a cap). */
static ip_count *ip_hold(const lg_config *cfg, struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    ip_key k;
    if (!cfg->limits.max_conns_per_ip || !ci || !ci->client_addr || !ip_key_of(ci->client_addr, &k))
        return NULL;
    pthread_mutex_lock(&ip_lock);
    ip_count **p = ip_slot(&k);
    if (!*p) {
        *p = lg_xcalloc(1, sizeof **p);
        (*p)->key = k;
    }
    ip_count *c = *p;
    c->n++;
    pthread_mutex_unlock(&ip_lock);
    return c;
}

static void ip_release(ip_count *c)
{
    if (!c) return;
    pthread_mutex_lock(&ip_lock);
    if (--c->n == 0) {
        ip_count **p = ip_slot(&c->key);
        *p = c->next;
        free(c);
    }
    pthread_mutex_unlock(&ip_lock);
}

static edge_conn *edge_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* ---- raw bytes by socket ---------------------------------------------------------------- */

/* The worker this thread runs, set at its first connection: libmicrohttpd runs on its
 * worker's thread only (external epoll loop), so a recv of a client socket there finds
 * the connection in that worker's w->edge_by_fd without a lock. Connections still open
 * when the worker stops are closed by stop_shards at the end of its thread (a worker that
 * never ran: by worker_free on the main thread; their CLOSED notification names the worker
 * by its cls either way). The table is freed when
 * its last connection closes. */
static _Thread_local lg_worker *tl_worker;

static void by_fd_add(lg_worker *w, int fd, edge_conn *e)
{
    if (fd < 0) return;
    if ((size_t)fd >= w->edge_by_fd_cap) {
        size_t cap = w->edge_by_fd_cap ? w->edge_by_fd_cap : 64;
        while (cap <= (size_t)fd)
            cap *= 2;
        w->edge_by_fd = lg_xrealloc(w->edge_by_fd, cap * sizeof *w->edge_by_fd);
        memset(w->edge_by_fd + w->edge_by_fd_cap, 0,
               (cap - w->edge_by_fd_cap) * sizeof *w->edge_by_fd);
        w->edge_by_fd_cap = cap;
    }
    w->edge_by_fd_used += !w->edge_by_fd[fd];
    w->edge_by_fd[fd] = e;
}

static void by_fd_remove(lg_worker *w, int fd, const edge_conn *e)
{
    if (fd < 0 || (size_t)fd >= w->edge_by_fd_cap || w->edge_by_fd[fd] != e) return;
    w->edge_by_fd[fd] = NULL;
    if (--w->edge_by_fd_used == 0) {
        free(w->edge_by_fd);
        w->edge_by_fd = NULL;
        w->edge_by_fd_cap = 0;
    }
}

void edge_received(int fd, const void *buf, size_t n)
{
    lg_worker *w = tl_worker;
    if (!w || fd < 0 || (size_t)fd >= w->edge_by_fd_cap || !w->edge_by_fd[fd]) return;
    hh_stream_feed(&w->edge_by_fd[fd]->stream, buf, n);
}

/* ---- connection lifetime ------------------------------------------------------------- */

/* The worker's timed list holds the connections whose clock runs: those waiting for a
 * request head or for the rest of a body. edge_tick walks only these, so a thousand
 * streams (whose requests were read whole) cost the tick nothing: walking them all took
 * 0.2-0.4 ms of every 250 ms tick at 1,000 paced streams, a stall every stream's next event
 * waited behind (tests/bench/HISTORY.md, issue 28, "tick"). */
static void clock_start(lg_worker *w, edge_conn *e)
{
    if (e->timed) return;
    e->timed = true;
    e->prev = NULL;
    e->next = w->edge_conns;
    if (e->next) e->next->prev = e;
    w->edge_conns = e;
}

static void clock_stop(lg_worker *w, edge_conn *e)
{
    if (!e->timed) return;
    e->timed = false;
    if (e->prev)
        e->prev->next = e->next;
    else
        w->edge_conns = e->next;
    if (e->next) e->next->prev = e->prev;
}

void edge_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                     enum MHD_ConnectionNotificationCode code)
{
    lg_worker *w = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        edge_conn *e = lg_xcalloc(1, sizeof *e);
        const union MHD_ConnectionInfo *fi =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        e->conn = conn;
        e->fd = fi ? fi->connect_fd : -1;
        e->ip = ip_hold(w->srv->cfg, conn);
        e->since_ns = w->now_ns ? w->now_ns : lg_now_ns();
        e->in_head = true;
        clock_start(w, e);
        tl_worker = w;
        by_fd_add(w, e->fd, e);
        *socket_context = e;
        return;
    }
    edge_conn *e = *socket_context;
    if (!e) return;
    *socket_context = NULL;
    by_fd_remove(w, e->fd, e);
    clock_stop(w, e);
    ip_release(e->ip);
    lg_xfree(e);
}

void *edge_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
    lg_worker *w = cls;
    edge_conn *e = edge_of(conn);
    char *q = strchr(uri, '?');
    if (!e || !q) return NULL;
    size_t args = 1;
    for (const char *p = q; (p = strchr(p + 1, '&'));)
        args++;
    if (args <= w->srv->cfg->max_header_bytes / EDGE_ARG_BYTES) return NULL;
    /* libmicrohttpd splits the query into its per-connection pool right after this call,
     * and when the pool runs out it closes the connection without a word. The buffer is
     * libmicrohttpd's own writable read buffer (the const is its API's): ending the
     * query there leaves nothing to split, and edge_admit answers 414. */
    q[1] = '\0';
    e->too_many_args = true;
    return NULL;
}

void edge_body(lg_worker *w, struct MHD_Connection *conn, size_t upload_size)
{
    edge_conn *e = edge_of(conn);
    if (!e || !e->in_body) return;
    if (upload_size) {
        e->body_bytes += upload_size;
        return;
    }
    e->in_body = false;
    clock_stop(w, e);
}

void edge_request_done(lg_worker *w, struct MHD_Connection *conn)
{
    edge_conn *e = edge_of(conn);
    if (!e) return;
    e->in_head = true;
    e->in_body = false;
    e->kept_alive = true;
    e->since_ns = w->now_ns ? w->now_ns : lg_now_ns();
    clock_start(w, e);
}

/* Ends the connection: libmicrohttpd sees the socket fail on its next read and closes it
 * (its completion and close notifications then run as for a client that left). */
static void cut(lg_worker *w, edge_conn *e)
{
    if (e->fd >= 0) shutdown(e->fd, SHUT_RDWR);
    e->in_head = e->in_body = false;
    clock_stop(w, e);
}

void edge_tick(lg_worker *w)
{
    const lg_config *cfg = w->srv->cfg;
    uint64_t now = w->now_ns;
    uint64_t head = (uint64_t)cfg->limits.header_timeout_ms * 1000000ull;
    uint64_t idle = (uint64_t)cfg->client_timeout_s * 1000000000ull;
    uint64_t grace = (uint64_t)cfg->limits.body_timeout_ms * 1000000ull;
    for (edge_conn *e = w->edge_conns, *next; e; e = next) {
        next = e->next; /* cut takes e off the list */
        if (e->in_head && head) {
            /* A kept-alive connection may first sit idle (client_timeout_s, which
             * libmicrohttpd enforces); the head must then arrive within the deadline. */
            uint64_t limit = head + (e->kept_alive ? idle : 0);
            if (now > e->since_ns && now - e->since_ns > limit) cut(w, e);
        } else if (e->in_body && grace) {
            const union MHD_ConnectionInfo *si =
                MHD_get_connection_info(e->conn, MHD_CONNECTION_INFO_CONNECTION_SUSPENDED);
            /* Time the connection spends suspended is ours (the upstream is slower than
             * the client): only waiting on the client counts. */
            if (!(si && si->suspended) && now > e->last_ns) e->body_ns += now - e->last_ns;
            e->last_ns = now;
            /* mod_reqtimeout's rule: body_timeout_ms, plus one second per body_min_rate
             * bytes received. */
            unsigned rate = cfg->limits.body_min_rate;
            uint64_t allowed =
                grace + (rate ? e->body_bytes * 1000000000ull / rate : UINT64_MAX / 2);
            if (e->body_ns > allowed) cut(w, e);
        }
    }
}

/* ---- the request head ------------------------------------------------------------------ */

/* The head's fields for hh_check: in `first` while they fit (an ordinary request's do), on
 * the heap past that. */
typedef struct field_list {
    hh_field *f;
    size_t n, cap;
    hh_field first[32];
} field_list;

static enum MHD_Result add_field(void *cls, enum MHD_ValueKind kind, const char *key,
                                 size_t key_size, const char *value, size_t value_size)
{
    field_list *l = cls;
    (void)kind;
    if (l->n == l->cap) {
        hh_field *grown = lg_xmalloc(2 * l->cap * sizeof *grown);
        memcpy(grown, l->f, l->n * sizeof *grown);
        if (l->f != l->first) lg_xfree(l->f);
        l->f = grown;
        l->cap *= 2;
    }
    l->f[l->n++] = (hh_field){key, key_size, value ? value : "", value ? value_size : 0};
    return MHD_YES;
}

static enum MHD_Result check_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                 size_t key_size, const char *value, size_t value_size)
{
    bool *ok = cls;
    (void)kind;
    if (!hh_query_piece_ok(key, key_size) || (value && !hh_query_piece_ok(value, value_size))) {
        *ok = false;
        return MHD_NO;
    }
    return MHD_YES;
}

/* Queues a head rejection. The connection closes after it: what follows the head on the
 * wire (a body whose framing we refused) must never be read as another request. */
static enum MHD_Result refuse(struct MHD_Connection *conn, int status, const char *message,
                              const char *code)
{
    return http_respond_error_close(conn, status, message, "invalid_request_error", code);
}

int edge_admit(lg_worker *w, struct MHD_Connection *conn, const char *url, const char *method,
               const char *version, char **path, enum MHD_Result *rc)
{
    edge_conn *e = edge_of(conn);
    bool too_many_args = e && e->too_many_args;
    if (e) {
        e->admitted++;
        e->too_many_args = false;
        e->in_head = false;
        e->in_body = true;
        e->body_bytes = e->body_ns = 0;
        e->last_ns = w->now_ns;
        clock_start(w, e); /* on the list already, from its head's wait */
    }
    field_list l;
    l.f = l.first;
    l.n = 0;
    l.cap = sizeof l.first / sizeof l.first[0];
    MHD_get_connection_values_n(conn, MHD_HEADER_KIND, add_field, &l);
    hh_request req = {
        .method = method, .target = url, .version = version, .fields = l.f, .n_fields = l.n};
    hh_verdict v;
    int st = hh_check(&req, &v);
    if (l.f != l.first) lg_xfree(l.f);
    if (st) {
        *rc = refuse(conn, st, v.message, v.code);
        return st;
    }
    /* What libmicrohttpd hid of this head (or of the stream before it): NUL, obs-fold. */
    if (e && e->stream.refuse_from && e->admitted >= e->stream.refuse_from) {
        *rc = refuse(conn, 400, e->stream.why, e->stream.code);
        return 400;
    }
    if (too_many_args) {
        *rc = refuse(conn, 414, "too many query arguments", "uri_too_long");
        return 414;
    }
    bool args_ok = true;
    MHD_get_connection_values_n(conn, MHD_GET_ARGUMENT_KIND, check_arg, &args_ok);
    if (!args_ok || hh_path_normalize(url, path) != 0) {
        *rc = refuse(conn, 400,
                     "malformed request target (control bytes, spaces, '#', dot segments, "
                     "encoded '/' or a bad escape)",
                     "bad_target");
        return 400;
    }
    return 0;
}

/* ---- the pass-through allow-list ------------------------------------------------------- */

bool edge_route_match(const char *pattern, const char *path)
{
    size_t n = strlen(pattern);
    if (n && pattern[n - 1] == '*') return strncmp(pattern, path, n - 1) == 0;
    return strcmp(pattern, path) == 0;
}

/* Routes every OpenAI-compatible server answers (OpenAI's own list, the Anthropic Messages
 * API that SGLang, vLLM and llama.cpp serve) and the SGLang/vLLM routes that read state
 * or compute without changing the server. Administrative routes (SGLang's /abort_request,
 * /flush_cache, /update_weights*, /start_profile, ...; vLLM's /v1/load_lora_adapter,
 * /reset_prefix_cache, /sleep, ...) are absent: an operator opens them with
 * passthrough.allow. The guarded routes (route.h) never reach this list. */
static const struct {
    const char *method; /* "GET" also admits HEAD */
    const char *path;
} builtin_routes[] = {
    {"GET", "/v1/models"},
    {"GET", "/v1/models/*"},
    {"POST", "/v1/embeddings"},
    {"POST", "/v1/messages"},
    {"POST", "/v1/messages/count_tokens"},
    {"POST", "/v1/responses"},
    {"GET", "/v1/responses/*"},
    {"POST", "/v1/audio/transcriptions"},
    {"POST", "/v1/audio/translations"},
    {"POST", "/v1/rerank"},
    {"POST", "/v2/rerank"},
    {"POST", "/rerank"},
    {"POST", "/v1/score"},
    {"POST", "/score"},
    {"POST", "/classify"},
    {"POST", "/pooling"},
    {"POST", "/encode"},
    {"POST", "/tokenize"},
    {"POST", "/detokenize"},
    {"GET", "/health"},
    {"GET", "/health_generate"},
    {"GET", "/ping"},
    {"GET", "/version"},
    {"GET", "/metrics"},
    {"GET", "/load"},
    {"GET", "/get_model_info"},
    {"GET", "/get_server_info"},
    {"GET", "/model_info"},
    {"GET", "/server_info"},
};

bool edge_passthrough_allowed(const lg_config *cfg, const char *method, const char *path)
{
    for (size_t i = 0; i < cfg->passthrough.n_allow; i++)
        if (edge_route_match(cfg->passthrough.allow[i], path)) return true;
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    for (size_t i = 0; i < sizeof builtin_routes / sizeof *builtin_routes; i++) {
        const char *m = builtin_routes[i].method;
        if (strcmp(m, method) != 0 && !(get && strcmp(m, "GET") == 0)) continue;
        if (edge_route_match(builtin_routes[i].path, path)) return true;
    }
    return false;
}
