/* worker.h — the per-thread event loop that every client request lives on.
 *
 * A worker owns one epoll instance, a few libmicrohttpd daemons ("shards") in external-epoll
 * mode without a listening socket of their own, and one libcurl multi handle driven by
 * curl_multi_socket_action from the same loop (a timerfd carries curl's timer). The workers
 * share one listening socket (listener.h): a worker accepts a connection itself and hands it
 * to its shards in turn. A request stays on the worker that accepted it from
 * accept to completion, so nothing on the hot path takes a lock: curl pause/unpause and
 * MHD_resume_connection always run on the owning thread.
 *
 * Why shards: libmicrohttpd (0.9.75, Debian 12) walks every suspended connection of a daemon
 * each time it processes a resume. A streaming proxy keeps nearly all its clients suspended
 * between tokens and resumes one per token, so with one daemon per worker that walk grew with
 * the number of streams and took 10.8 % of the CPU at 1,000 paced streams. Spreading a
 * worker's clients over WORKER_SHARDS daemons divides each walk by as much; only the shards
 * that have a resume or a ready socket run in an iteration, and every shard at each tick
 * (libmicrohttpd's own timeouts are whole seconds). With direct writes (below) a stream
 * resumes at its end, and at 1,000 saturated streams (~60 a shard with 8) the walk still took
 * 3.7-4.0 % of loopguard's samples; with 32 shards 2.4-2.6 %, and paced streams and memory as
 * before (tests/bench/HISTORY.md).
 *
 * Direct writes: between tokens a stream's connection is suspended with libmicrohttpd's
 * write buffer empty, and libmicrohttpd does not touch a suspended socket. Resuming it for
 * every token cost a daemon run (an epoll_wait, the walk above, the state machine) and
 * delayed each token to the end of the loop iteration. So once the content reader is
 * asked for body data (libmicrohttpd has then sent everything before it), the request's
 * output is written straight to the socket as HTTP/1.1 chunks (worker_go_direct,
 * worker_output, worker_write_chunk) until it is resumed (what it queued before the resume,
 * a stream's last events, still goes out so); a chunk the socket takes only in
 * part is finished from the worker's EPOLLOUT before libmicrohttpd may write again; a tail
 * that does not move for client_timeout_s ends the request as a hang-up, as
 * libmicrohttpd's own timeout would.
 *
 * Requests (relay.c, exchange.c, admin.c) embed an lg_req and register it with the worker;
 * the worker tells them when the client went away, when a transfer finished, and ticks them
 * four times a second for timeouts and keep-alives. Per-request memory is released in one
 * place: lg_req_ops.destroy, called by the worker at the end of a loop iteration after the
 * request was retired, so that no event still queued in the same epoll batch can reach
 * freed memory. */
#ifndef LG_WORKER_H
#define LG_WORKER_H

#include <curl/curl.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "proxy/buf.h"
#include "proxy/handoff.h"
#include "proxy/incident.h"
#include "proxy/listener.h"
#include "proxy/metrics.h"
#include "proxy/upbody.h"
#include "proxy/uplink.h"

typedef struct lg_worker lg_worker;
typedef struct lg_req lg_req;
typedef struct lg_shard lg_shard;
typedef struct lg_pool lg_pool;

/* libmicrohttpd daemons per worker (see above). */
#define WORKER_SHARDS 32

/* libcurl easy handles a worker keeps for reuse (worker_easy_get). */
#define WORKER_SPARE_EASY 64

/* Guards a worker keeps for reuse (worker_guard_get). */
#define WORKER_SPARE_GUARDS 16

/* Pool ranges a worker gives back to the kernel in one call at most (worker.c). */
#define WORKER_RELEASES 64

/* Requests whose pool pages a worker keeps resident rather than give back (worker.c,
 * queue_range): at most this many connection pools (max_header_bytes each, 16 KiB by
 * default: 8 MiB). */
#define WORKER_POOLS_KEPT 512

/* Parsed upstream URLs a worker keeps (worker_upstream_url): replicas times API paths. */
#define WORKER_URLS 32

/* State shared by all workers; read-only after start except the atomics. */
typedef struct lg_server {
    const lg_config *cfg;
    incident_log *incidents;
    incident_log *access;  /* log.access (accesslog.h); NULL when off */
    struct series *series; /* the status page's per-minute counts (series.h) */
    lg_pool *pool;
    lg_worker **workers;
    size_t n_workers;
    lg_worker *admin;            /* the separate admin listener's worker (admin.listen), or NULL */
    lg_listener *listener;       /* `listen`, which the workers share */
    lg_listener *admin_listener; /* admin.listen's, or NULL */
    int port;                    /* the bound listening port */
    atomic_bool draining;        /* SIGTERM: stop accepting, let streams finish */
    atomic_bool stopping;        /* past the drain deadline: end everything */
    atomic_uint_fast64_t next_id;
    uint64_t started_ns;
} lg_server;

typedef struct lg_req_ops {
    const char *name;
    /* libmicrohttpd's access-handler call for this request after the first one: upload
     * data to consume (set *upload_size to 0) or, with *upload_size == 0, the body is
     * complete and a response may be queued. */
    enum MHD_Result (*access)(lg_req *r, const char *upload, size_t *upload_size);
    /* The client connection closed (detected by the worker while the request may be
     * suspended). Must release upstream resources; the request is retired later by
     * MHD's completion callback. */
    void (*client_gone)(lg_req *r);
    /* Called every ~250 ms with the monotonic time in ns. */
    void (*tick)(lg_req *r, uint64_t now_ns);
    /* Shutdown deadline passed: end the response well-formed now. */
    void (*shutdown)(lg_req *r);
    /* Frees everything the request owns, including itself. Called once. */
    void (*destroy)(lg_req *r);
    /* Direct writes are armed and worker_output was called: write what is queued with
     * worker_write_chunk. NULL for requests that never arm direct writes. */
    void (*flush)(lg_req *r);
} lg_req_ops;

/* Embedded at the start of every request object. The fields a streamed token reads (the
 * worker's clock, the client's socket and state, the unsent tail) come first, in the first
 * 64 bytes: at a decode pace every stream's state is out of cache when its next token comes,
 * and each cache line a token touches is a miss (see exchange_int.h). */
struct lg_req {
    lg_worker *w;
    int client_fd;
    uint32_t gen;      /* distinguishes connections on client_fd in the fd map */
    bool suspended;    /* MHD connection suspended by us */
    bool client_gone;  /* client left; every MHD callback must now end the request */
    bool retired;      /* MHD completed it; destroy pending */
    bool direct;       /* suspended with MHD's buffer drained: we may write the socket */
    bool resume_due;   /* resume MHD once the tail or the queued output is sent */
    bool flush_queued; /* on the worker's flush list */
    uint8_t pages;     /* its pool's pages: 0, waiting in the worker's releases or kept
                          resident (worker.c, queue_range) */
    bool unchunked;    /* not HTTP/1.1: libmicrohttpd sends the body without chunks, so
                          it is never written directly (worker_go_direct) */
    lg_fifo tail;      /* the unsent rest of a directly written chunk (owned by the worker) */
    const lg_req_ops *ops;
    lg_shard *shard; /* the daemon that owns conn */
    struct MHD_Connection *conn;
    lg_req *flush_next;
    uint64_t tail_ns; /* when the tail last shrank or began */
    uint64_t start_ns;
    lg_req *prev, *next; /* worker's live list (ticks) or graveyard */
};

/* The worker's hold on a transfer's socket while its response is read (worker.c, "the
 * response body outside libcurl"); zeroed with its lg_xfer, the worker's alone after that.
 * With `own` the worker speaks HTTP on the connection itself (worker.c, "the worker's own
 * connections"). */
typedef struct lg_xbody {
    bool linked;     /* fd is this transfer's socket, and the worker follows it */
    uint8_t phase;   /* worker.c's XB_* */
    uint8_t matched; /* how many of the response's first bytes matched "HTTP/1.1 " (to 9) */
    bool ends_head;  /* the last bytes libcurl got end a head */
    bool held;       /* paused by the body callback: the socket's input is not watched */
    bool due;        /* queued to be run after the current event (lg_worker.body_due) */
    upbody_head head;
    /* The body's framing (uplink.h's UPLINK_*): an own connection's, from its response head
     * on; UPLINK_CHUNKED (0) for libcurl's transfers, whose bodies the worker takes only so.
     * Kept here, not with the own connection, so that a token's read touches none of that. */
    uint8_t frame;
    int fd;
    uint32_t stash_at; /* (a stash holds a read or two: far less than 4 GiB) */
    upbody dec;
    lg_buf stash;         /* read from the socket and not yet handed on, from stash_at */
    struct lg_uconn *own; /* the worker's own connection (worker_uplink_start), or NULL */
} lg_xbody;

/* A transfer the worker runs for an owner: on libcurl (CURLOPT_PRIVATE) or on the worker's
 * own connection (worker_uplink_start), who to tell what. */
typedef struct lg_xfer {
    /* The transfer's CURLOPT_WRITEFUNCTION when the worker may read its response body
     * itself (worker_head_complete), called as libcurl calls it, with `owner` as its
     * userdata, on the worker's thread outside libcurl; NULL: libcurl reads every body.
     * (What a token's read touches first: body, owner, warm, body_left, xb.) */
    curl_write_callback body;
    void *owner;
    /* Optional: called with `owner` just before the worker's read of the body's socket, to
     * prefetch the lines that `body` will read (exchange.c's ex_warm). With many streams
     * each token finds its stream's state cold, and a miss that `body` waits for serially
     * (~a dozen a token) overlaps the read's system call instead. Reads what it must to
     * find those lines, nothing else. */
    void (*warm)(void *owner);
    /* During a call of `body` from the worker's read: the data's length when the data ends
     * the read (no more of it comes in this event: one write now is then the event's only
     * one), else the read's bytes from the data on, more than its length and all that the
     * rest of the read can bring; 0 outside such a call. (A read is at most 128 KiB.) */
    uint32_t body_left;
    int os_errno; /* CURLINFO_OS_ERRNO when the transfer ended: why a connect failed */
    lg_xbody xb;
    /* The transfer ended (rc as libcurl reports it). The owner removes it from the multi
     * handle (worker_remove_xfer) or stops it (worker_uplink_stop) before it returns. */
    void (*done)(struct lg_xfer *x, CURLcode rc);
} lg_xfer;

/* A worker's idle connections to one upstream origin (uplink.h), the last one put back on
 * top; since[i] is when fds[i] came back. The arrays grow to UPLINK_IDLE_MAX at most. */
typedef struct lg_idle {
    char *origin;
    size_t n, cap;
    int *fds;
    uint64_t *since;
} lg_idle;

/* One libmicrohttpd daemon of a worker. */
struct lg_shard {
    struct MHD_Daemon *mhd;
    int epfd;      /* the daemon's own epoll set (a suspended client stays in it: worker.c) */
    bool ready;    /* a resume or a ready socket: run the daemon this iteration */
    bool reported; /* the worker's epoll_wait found epfd readable since the daemon's last
                      look into it (worker.c, mhd_aware_epoll_wait) */
};

struct lg_worker {
    lg_server *srv;
    int id;
    bool admin_only; /* serves only /loopguard/ on the admin listener */
    pthread_t thread;
    int epfd;
    int shards_epfd; /* the shards' sets alone: a batch looks for client input (worker.c) */
    int curl_timerfd;
    uint64_t curl_deadline_ms; /* what the timerfd is armed for (0: not armed) */
    bool curl_due;             /* libcurl's timeout action is due ("now", or the timerfd fired) */
    int curl_alive; /* transfers libcurl last said were running, plus those added since */
    bool curl_msgs; /* a transfer may have ended: curl_multi_info_read has work */
    bool proxy_env; /* a proxy variable is set: libcurl reads them (add_xfer) */
    int wake_fd;    /* eventfd: main thread pokes it on drain/stop */
    lg_shard shards[WORKER_SHARDS];
    size_t n_shards;
    size_t next_shard;     /* the shard the next accepted connection goes to */
    lg_listener *listener; /* the socket it accepts on (the server's) */
    int listen_fd;         /* its socket, read here only: the last worker to leave closes it */
    bool accepting;        /* the listener is in the epoll set (worker.c, accept_clients) */
    bool left;             /* draining: left the listener for good */
    lg_worker *before;     /* the worker created before this one on its listener; NULL: the first */
    lg_worker *after;      /* the one created after it; NULL: the last */
    atomic_uint load;      /* its clients as the others place connections (publish_load) */
    lg_handoff handoff;    /* connections other workers accepted for it (hand_over) */
    uint64_t tick_cpu_ns;  /* its thread's CPU time at the last tick (tick_measure) */
    uint64_t tick_ns;      /* and the time of that tick */
    atomic_uint clients;   /* its client connections (libmicrohttpd's, open; written here) */
    unsigned max_clients;  /* its share of max_connections: it accepts no more past it */
    atomic_uint permille;  /* the share of a core it used over the last tick (tick_measure) */
    unsigned shed;         /* connections it still closes after their response (worker_shed) */
    bool shedding;         /* it sheds: the listener is left to the others until its next tick */
    unsigned share_before; /* its share over the tick before the last (shed_measure) */
    CURLM *multi;
    lg_metrics *metrics;
    struct lg_fdslot *fdmap; /* indexed by client fd */
    size_t fdmap_len;
    uint32_t last_gen;    /* the last lg_req.gen handed out: the worker's own fd map's */
    uint8_t *curl_fds;    /* per fd: how an upstream socket is in the epoll set (worker.c) */
    lg_xfer **up_xfers;   /* per fd: the transfer whose response the worker follows */
    lg_buf body_due;      /* sockets (int) whose transfer's body is to be run (worker.c) */
    char *body_buf;       /* the worker's reads of response bodies (BODY_READ bytes) */
    uintptr_t *mhd_conns; /* per fd: a client socket's registration in its shard's set */
    CURL **unwatched;     /* transfers whose socket epoll refused, to be failed */
    size_t n_unwatched;
    lg_req live;       /* sentinel of the circular list of live requests */
    lg_req *tick_next; /* the next live request the tick's round checks (&live: no round) */
    lg_req graveyard;  /* sentinel: retired, destroyed at the end of the iteration */
    size_t n_live;
    struct lg_detached *detached;   /* pending fire-and-forget transfers */
    CURL *spare[WORKER_SPARE_EASY]; /* easy handles kept for the next transfers */
    size_t n_spare;
    guard *spare_guards[WORKER_SPARE_GUARDS]; /* reset, each for its own params and channel */
    guard_store *guard_store;                 /* the tables its guards share (guard.h) */
    size_t n_spare_guards;
    lg_buf ended; /* lg_conn_ended records: connections whose request ended since the tick */
    struct lg_release {
        lg_req *r;
        void *at;
        size_t len;
    } releases[WORKER_RELEASES]; /* pool pages that go back together (worker.c) */
    size_t n_releases;
    uint64_t releases_since; /* when the oldest of them was queued */
    unsigned pools_kept;     /* its live requests whose pool pages are kept */
    struct lg_url {
        char *url;
        CURLU *parsed;
        bool own;     /* the worker may speak for it (uplink_target_init) */
        uint8_t idle; /* then its origin's lg_worker.idle entry */
        uplink_target target;
    } urls[WORKER_URLS]; /* worker_upstream_url's */
    size_t n_urls;
    lg_idle idle[WORKER_URLS]; /* the own connections' idle pools, one per origin */
    size_t n_idle;
    bool mhd_dirty;                  /* some shard is ready: run MHD again this iteration */
    lg_req *flush_head, *flush_tail; /* requests with output for a direct write */
    struct edge_conn *edge_conns;    /* the connections edge_tick times (edge.c) */
    struct edge_conn **edge_by_fd;   /* the same by socket, for edge_received (edge.c) */
    size_t edge_by_fd_cap, edge_by_fd_used;
    uint64_t now_ns; /* cached loop time */
};

/* What a request handler uses of the worker it lives on; handlers reach nothing else of
 * lg_worker or lg_server (inline: these are on the per-token path). */
static inline const lg_config *req_config(const lg_req *r)
{
    return r->w->srv->cfg;
}
static inline lg_pool *req_pool(const lg_req *r)
{
    return r->w->srv->pool;
}
static inline lg_metrics *req_metrics(const lg_req *r)
{
    return r->w->metrics;
}
static inline incident_log *req_incidents(const lg_req *r)
{
    return r->w->srv->incidents;
}
/* The access log (accesslog.h), or NULL when log.access is off. */
static inline incident_log *req_access(const lg_req *r)
{
    return r->w->srv->access;
}
/* The status page's per-minute counts (series.h). */
static inline struct series *req_series(const lg_req *r)
{
    return r->w->srv->series;
}
/* The worker loop's time (monotonic ns), taken once per loop iteration. */
static inline uint64_t req_now(const lg_req *r)
{
    return r->w->now_ns;
}

/* Creates a worker with n_shards daemons (1 to WORKER_SHARDS) that accepts on `ls` (joined
 * here, left at a drain; ls stays the caller's and must outlive the worker). `before` is the
 * worker created before it on ls (the workers of a listener share new connections:
 * worker.c, accept_clients), or NULL for the first; it must outlive this one's thread. Returns
 * NULL with err on failure. */
lg_worker *worker_new(lg_server *srv, int id, lg_listener *ls, lg_worker *before, size_t n_shards,
                      char *err, size_t errlen);
int worker_start(lg_worker *w);
/* Wakes the worker so that it notices srv->draining / srv->stopping. Thread-safe. */
void worker_wake(lg_worker *w);
void worker_join(lg_worker *w);
void worker_free(lg_worker *w);

/* Request plumbing for relay.c, exchange.c and admin.c; owning thread only. */
void worker_req_init(lg_worker *w, lg_req *r, const lg_req_ops *ops, struct MHD_Connection *conn);
void worker_suspend(lg_req *r);
/* Resumes the MHD connection (direct writes end; output queued for a direct write is
 * written first, and a pending tail sent first). */
void worker_resume(lg_req *r);
/* Whether the response about to be queued on worker w closes its connection (its head then
 * says "Connection: close"): the worker sheds connections to a less busy one (worker.c,
 * shed_measure). Counts the connection as shed. */
bool worker_shed(lg_worker *w);
/* From the content reader, which then returns 0: suspends the connection and arms direct
 * writes. libmicrohttpd asks for body data only with its write buffer empty (after it sent
 * the response head, and after it sent all the reader gave it), so the worker may write
 * the socket from here on. buf[0..max) is the reader's buffer (for a chunked response,
 * libmicrohttpd's write buffer in the connection's pool), which the reader may fill with
 * anything and which nothing reads while the stream is direct: its whole pages are given
 * back to the kernel (they read as zeros, and are touched again only when the stream
 * ends). Returns false, and does nothing, when direct writes are not possible (the client
 * left, its socket is not watched, or it is an HTTP/1.0 client, whose body goes unchunked);
 * the reader must then give its data to libmicrohttpd. */
bool worker_go_direct(lg_req *r, char *buf, size_t max);
/* The request queued output for the client: with direct writes armed, its ops->flush runs
 * after the event being handled; otherwise MHD is resumed to call the content reader. */
void worker_output(lg_req *r);
/* From ops->flush only: writes p[0..n) (n > 0) as one chunk to the client socket. What the
 * socket does not take is kept and sent before anything else. A client that is gone is
 * handled as a hang-up. */
void worker_write_chunk(lg_req *r, const char *p, size_t n);
/* From the body callback of the worker's read (lg_xfer.body_left): writes p[0..n) (n > 0)
 * as one chunk now, as ops->flush would, when direct writes are armed and nothing is
 * queued before it. False, and nothing written, otherwise (a client found gone included,
 * which is left to the flush that follows: no hang-up runs inside the read). */
bool worker_write_now(lg_req *r, const char *p, size_t n);
/* A libcurl easy handle: a kept one, which still has the options of its last transfer
 * except CURLOPT_CURLU (worker_easy_put clears it), or a new one with libcurl's defaults
 * (*fresh). So a caller sets the options that differ between its transfers every time and
 * the others on a fresh handle, which it adds with worker_add_xfer, a kept one with
 * worker_add_kept_xfer (the exchange's attempts, the only users, all set the same list);
 * the kept handle skips curl_easy_reset's rebuild of libcurl's whole option set. Aborts
 * when libcurl cannot allocate a handle. */
CURL *worker_easy_get(lg_worker *w, bool *fresh);
/* Takes back a handle from worker_easy_get that is not on the multi handle (removed, or
 * never added): kept for the next transfer, or cleaned up when enough are kept. */
void worker_easy_put(lg_worker *w, CURL *easy);
/* A guard for channel ch under params p (which live as long as the configuration): a kept
 * one when there is, returned to guard_new(p, ch)'s state by guard_reset, or a new one. A
 * request's guard is made per answer and channel; reuse skips guard_new's allocations and
 * the zeroing of the 8-gram table. Never NULL. */
guard *worker_guard_get(lg_worker *w, const guard_params *p, lg_channel ch);
/* Takes back a guard from worker_guard_get (NULL: nothing): reset and kept, or freed when
 * enough are kept. Its verdict's strings die here. */
void worker_guard_put(lg_worker *w, guard *g);
/* `url` parsed as libcurl parses CURLOPT_URL, for CURLOPT_CURLU (which overrides
 * CURLOPT_URL): parsed once and kept by the worker for its lifetime, so that a transfer
 * skips libcurl's parse of the URL and the normalised copy it prints of it (about 12,000
 * instructions per transfer). NULL when `url` does not parse or the worker keeps
 * WORKER_URLS already: the transfer then gives libcurl the string alone. The worker also
 * keeps what worker_uplink_start needs of it (uplink_target_init). */
CURLU *worker_upstream_url(lg_worker *w, const char *url);
/* Adds/removes a libcurl easy handle on the worker's multi handle: worker_add_xfer gives
 * it the worker's own options first (its sockets, its proxy), which a kept handle from
 * worker_easy_get has already (worker_add_kept_xfer). */
int worker_add_xfer(lg_worker *w, CURL *easy);
int worker_add_kept_xfer(lg_worker *w, CURL *easy);
void worker_remove_xfer(lg_worker *w, CURL *easy);
/* From x's header callback, once the final head of its response is complete: when
 * `take_body` (the caller's own conditions hold: a response whose body goes to x->body
 * and that declared Transfer-Encoding: chunked), the worker reads the body itself if it
 * can (a plain-text HTTP/1.1 response on a connection the worker follows) and hands libcurl
 * only its end; otherwise, or without take_body, libcurl reads it. Returns whether the
 * worker took it: a pause of x->body is then undone by worker_body_resume, not by
 * curl_easy_pause. On the worker's own connection (worker_uplink_start) the worker reads
 * every body: true, nothing done. */
bool worker_head_complete(lg_worker *w, lg_xfer *x, CURL *easy, bool take_body);
/* What an attempt on the worker's own connection sends, and the two callbacks libcurl's
 * options would name: the CURLOPT_HEADERFUNCTION, called with the lg_xfer's owner as
 * libcurl calls it (each line of every head, the trailers), and what the
 * CURLOPT_PREREQFUNCTION is for (the connection is there, the request goes out). */
typedef struct lg_uplink_req {
    const char *url;
    const struct curl_slist *headers; /* read by worker_uplink_start only */
    const char *body;                 /* the caller's, alive until worker_uplink_stop */
    size_t body_len;
    curl_write_callback header;
    void (*connected)(lg_xfer *x);
} lg_uplink_req;

/* The exchange's attempt x on the worker's own connection (worker.c, "the worker's own
 * connections"): a POST of rq's body with its headers to its url, the same request libcurl
 * would send. True when started (on a kept connection the request is written before this
 * returns): x->done comes later, never from here; rq->header gets the
 * response's lines, x->body its body (a pause is undone by worker_body_resume),
 * rq->connected the connection. False, and nothing done, when the transfer is not one the
 * worker speaks for: the caller runs it on libcurl. Speaks for an http:// URL with no proxy
 * in the environment (worker.c). */
bool worker_uplink_start(lg_worker *w, lg_xfer *x, const lg_uplink_req *rq);
/* Whether x is a transfer of worker_uplink_start's that has not ended. */
static inline bool worker_uplink_running(const lg_xfer *x)
{
    return x->xb.own != NULL;
}
/* Ends x's transfer started by worker_uplink_start (done or not; called again, nothing):
 * its connection is closed unless its response was complete and it went back idle. */
void worker_uplink_stop(lg_worker *w, lg_xfer *x);
/* x->body paused its transfer (CURL_WRITEFUNC_PAUSE) and may take data again: returns true
 * when the worker reads x's body (the data follows after the current event), false when
 * libcurl does (the caller unpauses it: curl_easy_pause). */
bool worker_body_resume(lg_worker *w, lg_xfer *x);
/* A fire-and-forget POST of `json` to `url` (SGLang's /abort_request): owned by the worker,
 * bounded by a 5 s timeout; the loop waits for pending ones when it shuts down. */
void worker_post_detached(lg_worker *w, const char *url, const char *json);

/* Monotonic nanoseconds. */
uint64_t lg_now_ns(void);

#endif
