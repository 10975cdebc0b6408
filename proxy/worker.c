/* worker.c — one event loop per thread: libmicrohttpd (clients) and libcurl (upstream)
 * driven from a single epoll instance. See worker.h for the model.
 *
 * epoll data carries a tag, and for client sockets the fd and a generation number, instead
 * of a pointer: an event that is still queued in the current batch after its request was
 * retired then finds a generation mismatch in the fd map and is ignored. Requests are
 * destroyed only at the end of an iteration for the same reason. */
#include "proxy/worker.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "proxy/admin.h"
#include "proxy/balance.h"
#include "proxy/edge.h"
#include "proxy/http.h"
#include "proxy/route.h"
#include "proxy/upread.h"
#include "proxy/xalloc.h"

enum { TAG_MHD = 1, TAG_CURL_TIMER, TAG_WAKE, TAG_CURL_SOCK, TAG_CLIENT, TAG_LISTEN };

#define TICK_NS          (250ull * 1000 * 1000)
#define MAX_EVENTS       256
#define REQUESTS_WAIT_NS (100ull * 1000) /* longest a batch runs without a look for client input */
#define CLOCK_EVERY      4  /* events of a batch between two reads of the clock for that look */
#define ACCEPT_BATCH     64 /* connections taken per listener event at most (accept_clients) */
#define TICK_SLICE       64 /* live requests a loop iteration checks at most (tick_some) */

/* A client socket the worker watches (fd map entry). The watch belongs to the connection,
 * not to a request: it is registered for the connection's first request and stays
 * registered between keep-alive requests (an EPOLL_CTL_ADD and a DEL per request saved),
 * until the client hangs up or libmicrohttpd closes the connection, whose close takes the
 * socket out of the epoll set (a new connection on the same number starts unwatched:
 * on_connection). */
typedef struct lg_fdslot {
    lg_req *req;                 /* the request on the connection, NULL between requests */
    struct MHD_Connection *conn; /* the connection whose socket is registered; NULL: none */
    uint32_t gen;                /* the registration's tag: a new connection gets a new one */
    bool nodelay;                /* TCP_NODELAY is set on the socket */
    uint32_t pool_len;           /* pool[0..pool_len): the connection's last direct stream's */
    uint32_t ended_ms;           /* its last request's end: worker ms + 1, mod 2^32 (0: none) */
    char *pool;                  /* buffer, in its pool (queue_waiting_pool); NULL: none */
} lg_fdslot;

static uint64_t ev_pack(unsigned tag, uint32_t gen, int fd)
{
    return ((uint64_t)tag << 56) | ((uint64_t)(gen & 0xffffff) << 32) | (uint32_t)fd;
}

/* The C library's clock_gettime, which the executable's (loop_clock_gettime, below) stands
 * in front of; found before main, so before any thread reads it. */
static int (*libc_clock_gettime)(clockid_t, struct timespec *);

__attribute__((constructor)) static void find_libc_clock(void)
{
    libc_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
}

static int real_clock_gettime(clockid_t id, struct timespec *ts)
{
    if (libc_clock_gettime) return libc_clock_gettime(id, ts);
    return (int)syscall(SYS_clock_gettime, id, ts);
}

uint64_t lg_now_ns(void)
{
    struct timespec ts;
    real_clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int ep_ctl(lg_worker *w, int op, int fd, uint32_t events, uint64_t data)
{
    struct epoll_event ev = {.events = events, .data.u64 = data};
    return epoll_ctl(w->epfd, op, fd, &ev);
}

/* ---- libmicrohttpd's epoll set, kept across a suspension ---------------------------- */

/* libmicrohttpd 0.9.75 takes a connection's socket out of its daemon's epoll set when the
 * connection is suspended (EPOLL_CTL_DEL, daemon.c internal_suspend_connection_) and puts
 * it back once it is resumed and a read or write would block (EPOLL_CTL_ADD, edge-triggered,
 * EPOLLIN|EPOLLOUT|EPOLLPRI, connection.c MHD_connection_epoll_update_): two system calls
 * per request, and the ADD of a writable socket raises an EPOLLOUT edge at once, which
 * wakes the worker and runs the daemon for nothing (two more). So the executable defines
 * epoll_ctl and epoll_wait, as it does recv and poll (below), and the registration stays
 * across a suspension:
 * - a client socket's ADD into a shard's set is registered with the socket's number as
 *   its data (MHD_CONN_TAG) instead of libmicrohttpd's connection pointer, which
 *   lg_worker.mhd_conns[fd] keeps;
 * - the DEL of a suspend (worker_suspend) leaves the registration and marks the socket
 *   out (MHD_CONN_OUT); the ADD after the resume finds it registered and clears the mark;
 * - a shard's epoll_wait gives libmicrohttpd its pointer back for every event, and drops
 *   the events of a socket marked out, which libmicrohttpd must not see (a suspended
 *   connection on its ready list is a panic at the resume).
 * Dropping them loses nothing: at a resume libmicrohttpd marks the connection readable and
 * writable ("we might have missed the edge poll event during suspension", daemon.c) and
 * reads or writes until a call would block; it asks for the ADD only after such a call,
 * with no epoll_wait between the two, and any change after it raises a new edge on the
 * registration, which is delivered. A hang-up during a suspension is seen by the worker's
 * own watch (worker_req_init), as before. A socket that closes while marked out is taken
 * out for real first (forget_mhd_conn), as libmicrohttpd does before it closes one.
 * The cost: an edge on a suspended connection's socket (a client that sends during its
 * response, a slow reader's buffer draining) wakes the daemon to drop it.
 *
 * A daemon's run begins with a zero-timeout epoll_wait on its set, and a request takes
 * three or four runs (the request; the response; the passes that end it and look for the
 * next one, see run_mhd), each a system call, though the set is itself in the worker's
 * (level-triggered: readable while anything in it is ready). So such a call is answered
 * "nothing" without a system call unless the worker's epoll_wait reported the set since
 * the daemon last looked into it (lg_shard.reported): what became ready since keeps the
 * set readable, and the worker's next epoll_wait reports it and runs the daemon again.
 *
 * Both are defined under their assembler names: <sys/epoll.h> declares epoll_ctl a leaf
 * function, which this one, reading the worker's state, is not. Under the sanitizers they
 * take the place of the epoll interceptors; epoll_wait calls epoll_pwait, which is
 * intercepted. Every other caller and set passes straight through. */
#define MHD_CONN_TAG     0x7fu /* a tag byte no user-space pointer has */
#define MHD_CONN_OUT     ((uintptr_t)1)
#define MHD_CONN_DRAINED ((uintptr_t)2) /* see mhd_read_known_empty */
#define MHD_CONN_FLAGS   (MHD_CONN_OUT | MHD_CONN_DRAINED)
#define MHD_CONN_EVENTS  (EPOLLIN | EPOLLOUT | EPOLLPRI | EPOLLET) /* libmicrohttpd's mask */

static _Thread_local lg_worker *mhd_worker;  /* this thread's worker (NULL elsewhere) */
static _Thread_local int suspending_fd = -1; /* worker_suspend's socket, while it suspends */

/* libcurl 7.88 reads CLOCK_MONOTONIC (Curl_now) some forty times in a 2-token transfer: at
 * every state of its machine, for its progress times, its timers and its connection cache.
 * On this host a read is ~50 ns (a paravirtualised clock), about 2 us a request. A worker
 * runs a loop pass in one go, and loopguard's own request times are the pass's already
 * (req_now, taken once after each epoll_wait): so, as nginx does with its cached time, the
 * executable defines clock_gettime, and on a worker thread past its first epoll_wait
 * CLOCK_MONOTONIC reads the pass's time. libcurl's timers then fall due against the time
 * the worker arms the timerfd with (on_curl_timer), and a pass cannot wait on the clock:
 * nothing in a pass waits. upstream.c's pool times, read on the worker, are the pass's too.
 * lg_now_ns (which sets the pass's time), other clocks (libmicrohttpd's is
 * CLOCK_MONOTONIC_COARSE) and other threads read the C library's clock. */
int loop_clock_gettime(clockid_t id, struct timespec *ts) __asm__("clock_gettime");
int loop_clock_gettime(clockid_t id, struct timespec *ts)
{
    const lg_worker *w = mhd_worker;
    if (id != CLOCK_MONOTONIC || !w || !w->now_ns || !ts) return real_clock_gettime(id, ts);
    ts->tv_sec = (time_t)(w->now_ns / 1000000000u);
    ts->tv_nsec = (long)(w->now_ns % 1000000000u);
    return 0;
}

/* The shard whose daemon's set epfd is, or NULL (the worker's own set, anything else). */
static lg_shard *shard_of_set(lg_worker *w, int epfd)
{
    if (epfd == w->epfd) return NULL; /* the worker's own wait and watches: no search */
    for (size_t i = 0; i < w->n_shards; i++)
        if (w->shards[i].epfd == epfd) return &w->shards[i];
    return NULL;
}

/* The set of the daemon that serves conn, or -1. */
static int conn_set(lg_worker *w, struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *di = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_DAEMON);
    for (size_t i = 0; di && i < w->n_shards; i++)
        if (w->shards[i].mhd == di->daemon) return w->shards[i].epfd;
    return -1;
}

int mhd_aware_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev) __asm__("epoll_ctl");
int mhd_aware_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
    lg_worker *w = mhd_worker;
    if (!w || fd < 0 || (size_t)fd >= w->fdmap_len || !shard_of_set(w, epfd))
        return (int)syscall(SYS_epoll_ctl, epfd, op, fd, ev);
    uintptr_t *c = &w->mhd_conns[fd];
    if (op == EPOLL_CTL_DEL && fd == suspending_fd && *c && !(*c & MHD_CONN_OUT)) {
        *c |= MHD_CONN_OUT;
        return 0;
    }
    if (op == EPOLL_CTL_ADD && ev && ev->events == MHD_CONN_EVENTS) {
        if ((*c & ~MHD_CONN_FLAGS) == (uintptr_t)ev->data.ptr && (*c & MHD_CONN_OUT)) {
            *c &= ~MHD_CONN_OUT; /* back from a suspension */
            return 0;
        }
        struct epoll_event tagged = {.events = ev->events,
                                     .data.u64 = ev_pack(MHD_CONN_TAG, 0, fd)};
        /* Registered under another connection's pointer: the number was reused. */
        int rc = (int)syscall(SYS_epoll_ctl, epfd, *c ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &tagged);
        if (rc == 0) *c = (uintptr_t)ev->data.ptr;
        return rc;
    }
    if (op == EPOLL_CTL_DEL) *c = 0;
    return (int)syscall(SYS_epoll_ctl, epfd, op, fd, ev);
}

int mhd_aware_epoll_wait(int epfd, struct epoll_event *evs, int max,
                         int timeout_ms) __asm__("epoll_wait");
int mhd_aware_epoll_wait(int epfd, struct epoll_event *evs, int max, int timeout_ms)
{
    lg_worker *w = mhd_worker;
    lg_shard *s = w ? shard_of_set(w, epfd) : NULL;
    if (s && timeout_ms == 0 && !s->reported) return 0; /* nothing new: see above */
    int n = epoll_pwait(epfd, evs, max, timeout_ms, NULL);
    if (s && n < max) s->reported = false;
    if (n <= 0 || !s) return n;
    int k = 0;
    for (int i = 0; i < n; i++) {
        uint64_t d = evs[i].data.u64;
        if ((unsigned)(d >> 56) == MHD_CONN_TAG) {
            int fd = (int)(uint32_t)d;
            if ((size_t)fd >= w->fdmap_len || !w->mhd_conns[fd]) continue;
            if (evs[i].events & ~(uint32_t)EPOLLOUT) w->mhd_conns[fd] &= ~MHD_CONN_DRAINED;
            uintptr_t c = w->mhd_conns[fd];
            if (c & MHD_CONN_OUT) continue; /* suspended: see above */
            evs[i].data.ptr = (void *)(c & ~MHD_CONN_FLAGS);
        }
        evs[k++] = evs[i];
    }
    return k;
}

/* libmicrohttpd reads a connection once more after each response, for the next request,
 * which has usually not come: a recv that fails with EAGAIN, one system call per request.
 * Whether the socket holds anything is often known without it. A recv that took less than
 * it asked for (a stream socket's recv returns less only when it took all the socket held)
 * or found nothing, on a socket registered in its shard's set, marks it drained
 * (MHD_CONN_DRAINED); any input event of the registration, delivered or dropped, clears the
 * mark. While it is set and no shard's set has been reported unread (lg_shard.reported),
 * nothing came since the worker's last epoll_wait: what arrived before it raised an event
 * that cleared the mark or left the set readable. So the read is answered EAGAIN without the
 * system call; input that arrives after it raises an edge, which the worker's next epoll_wait
 * reports (the same race every readiness check has, as for libcurl's parked sockets). */
static bool mhd_read_known_empty(int fd)
{
    const lg_worker *w = mhd_worker;
    if (!w || fd < 0 || (size_t)fd >= w->fdmap_len || !(w->mhd_conns[fd] & MHD_CONN_DRAINED))
        return false;
    for (size_t i = 0; i < w->n_shards; i++)
        if (w->shards[i].reported) return false;
    return true;
}

/* After a real read of fd: whether it left the socket drained (see above). */
static void mhd_note_read(int fd, ssize_t n, size_t len)
{
    lg_worker *w = mhd_worker;
    if (!w || fd < 0 || (size_t)fd >= w->fdmap_len || !w->mhd_conns[fd]) return;
    if ((n > 0 && (size_t)n < len) || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)))
        w->mhd_conns[fd] |= MHD_CONN_DRAINED;
    else
        w->mhd_conns[fd] &= ~MHD_CONN_DRAINED;
}

/* The client on fd hung up between requests: libmicrohttpd may have read the request before
 * the FIN with a short read, which it takes as drained, and gets no new edge for the FIN.
 * Re-arm its registration (EPOLL_CTL_MOD polls the socket anew and queues the readable
 * end-of-file), so that its next run reads 0 and closes. */
static void rearm_mhd_conn(lg_worker *w, struct MHD_Connection *conn, int fd)
{
    uintptr_t c = w->mhd_conns[fd];
    if (!c || (c & MHD_CONN_OUT)) return;
    w->mhd_conns[fd] &= ~MHD_CONN_DRAINED;
    struct epoll_event ev = {.events = MHD_CONN_EVENTS, .data.u64 = ev_pack(MHD_CONN_TAG, 0, fd)};
    int set = conn_set(w, conn);
    if (set >= 0) (void)syscall(SYS_epoll_ctl, set, EPOLL_CTL_MOD, fd, &ev);
}

/* The connection on fd starts or closes: a registration kept while it was suspended is
 * taken out of its shard's set for real before libmicrohttpd closes the socket. */
static void forget_mhd_conn(lg_worker *w, struct MHD_Connection *conn, int fd)
{
    if (!(w->mhd_conns[fd] & MHD_CONN_OUT)) {
        w->mhd_conns[fd] = 0;
        return;
    }
    w->mhd_conns[fd] = 0;
    int set = conn_set(w, conn);
    if (set >= 0) (void)syscall(SYS_epoll_ctl, set, EPOLL_CTL_DEL, fd, NULL);
}

/* ---- requests ---------------------------------------------------------------------- */

static void list_unlink(lg_req *r)
{
    r->prev->next = r->next;
    r->next->prev = r->prev;
    r->prev = r->next = r;
}

static void list_push(lg_req *head, lg_req *r)
{
    r->prev = head->prev;
    r->next = head;
    head->prev->next = r;
    head->prev = r;
}

void worker_req_init(lg_worker *w, lg_req *r, const lg_req_ops *ops, struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);

    const union MHD_ConnectionInfo *di = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_DAEMON);
    r->ops = ops;
    r->w = w;
    r->shard = &w->shards[0];
    for (size_t i = 0; di && i < w->n_shards; i++)
        if (w->shards[i].mhd == di->daemon) r->shard = &w->shards[i];
    r->conn = conn;
    r->client_fd = ci ? ci->connect_fd : -1;
    r->start_ns = w->now_ns ? w->now_ns : lg_now_ns();
    list_push(&w->live, r);
    w->n_live++;

    /* Watch the client socket for hang-ups ourselves: a suspended connection is out of
     * libmicrohttpd's epoll set and would not notice the client leaving. */
    if (r->client_fd < 0 || (size_t)r->client_fd >= w->fdmap_len) return;
    lg_fdslot *s = &w->fdmap[r->client_fd];
    if (s->conn == conn) { /* a keep-alive connection's next request: already watched */
        s->req = r;
        r->gen = s->gen;
        return;
    }
    r->gen = ++w->last_gen;
    *s = (lg_fdslot){.req = r, .conn = conn, .gen = r->gen, .ended_ms = s->ended_ms};
    if (ep_ctl(w, EPOLL_CTL_ADD, r->client_fd, EPOLLRDHUP,
               ev_pack(TAG_CLIENT, r->gen, r->client_fd)) != 0)
        *s = (lg_fdslot){0};
}

static void suspend_conn(lg_req *r)
{
    suspending_fd = r->client_fd; /* its DEL keeps the registration (see above) */
    MHD_suspend_connection(r->conn);
    suspending_fd = -1;
    r->suspended = true;
}

static void queue_waiting_pool(lg_req *r); /* see worker_go_direct */

void worker_suspend(lg_req *r)
{
    if (r->suspended || r->retired) return;
    suspend_conn(r);
    if (!r->direct) queue_waiting_pool(r);
}

/* lg_req.pages: where its pool's pages stand (queue_range). */
enum { PAGES_NONE, PAGES_QUEUED, PAGES_KEPT };

static void unqueue_release(lg_req *r); /* see worker_go_direct */

void worker_resume(lg_req *r)
{
    if (!r->suspended || r->retired) return;
    if (r->direct && r->flush_queued) {
        /* Output queued for a direct write (a stream's last events) goes out as one, in
         * flush_all, which then resumes: libmicrohttpd only adds the last chunk, in the
         * same daemon run, rather than copying the events into its buffer and sending
         * them and the last chunk in two. */
        r->resume_due = true;
        return;
    }
    r->direct = false;
    if (lg_fifo_len(&r->tail)) { /* libmicrohttpd must not write inside our chunk */
        r->resume_due = true;
        return;
    }
    if (r->pages == PAGES_QUEUED) unqueue_release(r); /* libmicrohttpd uses the pool again */
    r->suspended = false;
    MHD_resume_connection(r->conn);
    r->shard->ready = true;
    r->w->mhd_dirty = true;
}

/* The worker watches r's client socket (the fd map holds r). */
static bool watched(const lg_req *r)
{
    const lg_worker *w = r->w;
    return r->client_fd >= 0 && (size_t)r->client_fd < w->fdmap_len &&
           w->fdmap[r->client_fd].req == r;
}

/* The socket's watch ends: the client hung up (or its request ends with a chunk unsent). */
static void unwatch_socket(lg_worker *w, int fd)
{
    w->fdmap[fd] = (lg_fdslot){0};
    (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, fd, NULL); /* fd may be closing */
}

static void unwatch_client(lg_worker *w, lg_req *r)
{
    if (watched(r)) unwatch_socket(w, r->client_fd);
}

/* The watched slot behind a client-socket event, or NULL when its connection is gone. */
static lg_fdslot *client_slot(lg_worker *w, int fd, uint32_t gen)
{
    if (fd < 0 || (size_t)fd >= w->fdmap_len) return NULL;
    lg_fdslot *s = &w->fdmap[fd];
    return s->conn && (s->gen & 0xffffff) == gen ? s : NULL;
}

static void client_hung_up(lg_worker *w, lg_req *r)
{
    unwatch_client(w, r);
    lg_fifo_free(&r->tail); /* nobody reads it now */
    r->direct = false;
    if (!r->client_gone) {
        r->client_gone = true;
        r->ops->client_gone(r);
    }
    /* Let libmicrohttpd see the closed socket and complete the request. */
    worker_resume(r);
}

/* ---- direct writes (see worker.h) --------------------------------------------------- */

static void watch_writable(lg_req *r, bool on)
{
    (void)ep_ctl(r->w, EPOLL_CTL_MOD, r->client_fd, EPOLLRDHUP | (on ? EPOLLOUT : 0u),
                 ev_pack(TAG_CLIENT, r->gen, r->client_fd));
}

/* The whole pages inside buf[0..n): [*lo, *hi), empty when *hi <= *lo. Returns the page
 * size. */
static size_t whole_pages(const char *buf, size_t n, uintptr_t *lo, uintptr_t *hi)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    *lo = ((uintptr_t)buf + page - 1) & ~(uintptr_t)(page - 1);
    *hi = ((uintptr_t)buf + n) & ~(uintptr_t)(page - 1);
    return page;
}

/* A directly written stream's pool pages go back to the kernel in batches. Each
 * MADV_DONTNEED of the process's memory makes the kernel flush the TLB of every core that
 * runs one of its threads: an interrupt to the other workers' cores and a wait for their
 * answer. One call per stream and request was a tenth of loopguard's CPU at 1,000 paced
 * streams; process_madvise takes a batch of ranges in one call and one flush. A range waits
 * at most RELEASE_WAIT_NS (or until WORKER_RELEASES wait); a request that resumes or ends
 * before then takes its range out unreleased (unqueue_release). */
#define RELEASE_WAIT_NS (10ull * 1000 * 1000)

/* This process, for process_madvise: opened once, kept for the process's life; -1 when
 * pidfd_open is not available. Set to -1 again by the first worker that sees the kernel
 * refuse MADV_DONTNEED through process_madvise (EINVAL: an older kernel, which allows only
 * a few advice values there; ENOSYS, EPERM: not built in, or a seccomp filter), so that
 * such a kernel pays the failed call once, not once per batch. The descriptor is then left
 * open, unused. */
static _Atomic int self_pidfd = -1;
static pthread_once_t self_pidfd_once = PTHREAD_ONCE_INIT;

static void open_self_pidfd(void)
{
    atomic_store(&self_pidfd, (int)syscall(SYS_pidfd_open, getpid(), 0));
}

/* iov[0..n) go back now: in one process_madvise, or (a kernel without it for
 * MADV_DONTNEED) one madvise each. MADV_DONTNEED on private anonymous memory (the heap)
 * makes the pages read as zeros when next touched. */
static void give_back(const struct iovec *iov, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += iov[i].iov_len;
    if (!n) return;
    pthread_once(&self_pidfd_once, open_self_pidfd);
    int pidfd = atomic_load(&self_pidfd);
    if (pidfd >= 0) {
        long done = syscall(SYS_process_madvise, pidfd, iov, n, MADV_DONTNEED, 0);
        if (done == (long)total) return;
        if (done < 0 && (errno == EINVAL || errno == ENOSYS || errno == EPERM))
            atomic_store(&self_pidfd, -1);
    }
    for (size_t i = 0; i < n; i++) /* again where a part went back: it reads zeros anyway */
        (void)madvise(iov[i].iov_base, iov[i].iov_len, MADV_DONTNEED);
}

/* The queued ranges go back now (give_back). */
static void release_queued(lg_worker *w)
{
    size_t n = w->n_releases;
    struct iovec iov[WORKER_RELEASES];
    for (size_t i = 0; i < n; i++) {
        iov[i] = (struct iovec){w->releases[i].at, w->releases[i].len};
        w->releases[i].r->pages = PAGES_NONE;
    }
    w->n_releases = 0;
    give_back(iov, n);
}

/* r's pool is libmicrohttpd's again (its request resumed or ended) before its pages went
 * back: they leave the queue unreleased. Giving them back now would only have libmicrohttpd
 * fault them in again (it zeroes the pool for the next request), and a short answer, ended
 * within RELEASE_WAIT_NS, costs no system call. */
static void unqueue_release(lg_req *r)
{
    lg_worker *w = r->w;
    for (size_t i = 0; i < w->n_releases; i++)
        if (w->releases[i].r == r) {
            w->releases[i] = w->releases[--w->n_releases];
            break;
        }
    r->pages = PAGES_NONE;
}

/* A connection's request that starts within this long of the end of the one before it is
 * back to back (queue_range). */
#define BACK_TO_BACK_MS 50

/* Queues the pages [lo, hi) of r's pool (r is suspended and watched; one range a request),
 * or keeps them. libmicrohttpd zeroes a connection's pool for each request, so the pages of
 * a connection whose requests follow each other come back as page faults at once, and the
 * release itself interrupts the other workers' cores (give_back): at 1,000 saturated
 * streams that was ~5 faults a request (0.01 an event) and a sixth of loopguard's system
 * time per event. So the pool pages of a request that came back to back are kept resident
 * until it ends, for up to WORKER_POOLS_KEPT requests of a worker: the bound caps what many
 * paced streams keep (at 5,000 streams on 2 workers at most 3.4 KiB a stream more). A
 * connection's first request, or one after a pause, gives them back as before. */
static void queue_range(lg_req *r, uintptr_t lo, uintptr_t hi)
{
    lg_worker *w = r->w;
    if (hi <= lo || r->pages == PAGES_KEPT) return;
    uint32_t start_ms = (uint32_t)(r->start_ns / 1000000), ended = w->fdmap[r->client_fd].ended_ms;
    if (ended && start_ms + 1 - ended < BACK_TO_BACK_MS && w->pools_kept < WORKER_POOLS_KEPT) {
        r->pages = PAGES_KEPT;
        w->pools_kept++;
        return;
    }
    if (w->n_releases == WORKER_RELEASES) release_queued(w);
    if (!w->n_releases) w->releases_since = w->now_ns;
    w->releases[w->n_releases++] = (struct lg_release){r, (void *)lo, hi - lo};
    r->pages = PAGES_QUEUED;
}

/* Queues the whole pages of buf[0..n) of r's pool: a stream's connection pool is mostly
 * this buffer (max_header_bytes, 16 KiB by default), and between its head and its end a
 * directly written stream never uses it. */
static void queue_release(lg_req *r, char *buf, size_t n)
{
    uintptr_t lo, hi;
    whole_pages(buf, n, &lo, &hi);
    queue_range(r, lo, hi);
}

static bool page_zero(uintptr_t p, size_t page)
{
    const unsigned char *c = (const unsigned char *)p;
    return c[0] == 0 && memcmp(c, c + 1, page - 1) == 0;
}

/* Runs of zero pages found at one tick, given back together at its end (give_back): one
 * system call and one TLB flush of the other workers' cores instead of one per run. */
#define ZERO_RUNS 64
typedef struct lg_zero_runs {
    struct iovec iov[ZERO_RUNS];
    size_t n;
} lg_zero_runs;

static void zero_runs_add(lg_zero_runs *z, uintptr_t lo, uintptr_t hi)
{
    if (z->n == ZERO_RUNS) {
        give_back(z->iov, z->n);
        z->n = 0;
    }
    z->iov[z->n++] = (struct iovec){(void *)lo, hi - lo};
}

/* The whole pages of buf[0..n) that hold only zeros join z, in runs. They read the same
 * once given back, so this is safe whoever uses the memory on this thread, as long as
 * nothing writes them before z goes back: between the two only other requests' ticks run,
 * and libmicrohttpd writes a connection's pool only inside its own calls. */
static void release_zero_pages(lg_zero_runs *z, char *buf, size_t n)
{
    uintptr_t p, hi;
    const size_t page = whole_pages(buf, n, &p, &hi);
    uintptr_t run = 0; /* the first zero page of the current run, 0 when none */
    for (; p < hi; p += page) {
        bool zero = page_zero(p, page);
        if (zero && !run) run = p;
        if (!zero && run) {
            zero_runs_add(z, run, p);
            run = 0;
        }
    }
    if (run) zero_runs_add(z, run, hi);
}

/* libmicrohttpd zeroes a connection's whole pool after each request (max_header_bytes,
 * 16 KiB by default), so a request that waits (for its upstream's first output, a busy
 * host) would keep all of it resident until it writes directly. When it suspends, the
 * longest run of zero pages in the buffer of its connection's last direct stream (most of
 * the pool, which this request's head and libmicrohttpd's records share with it) is
 * queued like a direct stream's pages: it goes back within RELEASE_WAIT_NS, or not at all
 * when the request resumes first (unqueue_release). The pages are tested now and still
 * hold zeros when released: libmicrohttpd leaves a suspended connection's pool alone. */
static void queue_waiting_pool(lg_req *r)
{
    if (r->pages || !watched(r)) return;
    lg_fdslot *s = &r->w->fdmap[r->client_fd];
    if (!s->pool) return;
    uintptr_t p, end, lo = 0, hi = 0, run = 0;
    const size_t page = whole_pages(s->pool, s->pool_len, &p, &end);
    for (; p <= end; p += page) {
        if (p < end && page_zero(p, page)) {
            if (!run) run = p;
        } else if (run) {
            if (p - run > hi - lo) lo = run, hi = p;
            run = 0;
        }
    }
    s->pool = NULL; /* once a request: the stream's own buffer is learned when it goes direct */
    queue_range(r, lo, hi);
}

bool worker_go_direct(lg_req *r, char *buf, size_t max)
{
    if (r->unchunked || r->client_gone || r->retired || !watched(r)) return false;
    if (!r->suspended) suspend_conn(r);
    queue_release(r, buf, max);
    lg_fdslot *s = &r->w->fdmap[r->client_fd];
    s->pool = buf;
    s->pool_len = max > UINT32_MAX ? UINT32_MAX : (uint32_t)max;
    if (!s->nodelay) { /* a token must not wait for the client's delayed ACK */
        int one = 1;
        (void)setsockopt(r->client_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        s->nodelay = true;
    }
    r->direct = true;
    return true;
}

void worker_output(lg_req *r)
{
    lg_worker *w = r->w;
    if (!r->direct) {
        worker_resume(r);
        return;
    }
    if (r->flush_queued) return;
    r->flush_queued = true;
    r->flush_next = NULL;
    if (w->flush_tail)
        w->flush_tail->flush_next = r;
    else
        w->flush_head = r;
    w->flush_tail = r;
}

/* Runs ops->flush of every request that queued output for a direct write. */
static void flush_queued(lg_worker *w)
{
    while (w->flush_head) {
        lg_req *r = w->flush_head;
        w->flush_head = r->flush_next;
        if (!w->flush_head) w->flush_tail = NULL;
        r->flush_queued = false;
        if (r->direct && !r->retired && !lg_fifo_len(&r->tail)) r->ops->flush(r);
        if (r->resume_due && !lg_fifo_len(&r->tail)) { /* see worker_resume */
            r->resume_due = false;
            worker_resume(r);
        }
    }
}

/* flush_queued, whose list is empty after most events (their output went out from the
 * read, ex_out_settle): the test inline, the call not. */
static inline void flush_all(lg_worker *w)
{
    if (w->flush_head) flush_queued(w);
}

/* A token's two system calls, the upstream read and the client write, made directly: glibc's
 * recvfrom and sendmsg are cancellation points, and bracket the call with two calls into
 * its cancellation state (about 35 instructions of a token's few thousand) for a feature no
 * worker uses (no thread is ever cancelled). Results and errno as the wrappers give them;
 * epoll_ctl goes the same way above. */
static ssize_t sys_recv(int fd, void *buf, size_t len)
{
    return (ssize_t)syscall(SYS_recvfrom, fd, buf, len, 0, NULL, NULL);
}

static ssize_t sys_sendmsg(int fd, const struct msghdr *msg, int flags)
{
    return (ssize_t)syscall(SYS_sendmsg, fd, msg, flags);
}

/* A chunk's size line, "<hex>\r\n", written at the end of head[0..24); returns where it
 * starts. Once per token, where snprintf's format machinery costs hundreds of instructions. */
static char *chunk_size_line(char head[24], size_t n)
{
    static const char hex[] = "0123456789abcdef";
    char *s = head + 24;
    *--s = '\n';
    *--s = '\r';
    do {
        *--s = hex[n & 15];
        n >>= 4;
    } while (n);
    return s;
}

/* worker_write_chunk's write; false (nothing written) when the client is gone. */
static bool write_chunk(lg_req *r, const char *p, size_t n)
{
    char head[24];
    char *line = chunk_size_line(head, n);
    struct iovec iov[3] = {
        {line, (size_t)(head + sizeof head - line)}, {(void *)p, n}, {"\r\n", 2}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 3};
    ssize_t k = sys_sendmsg(r->client_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    size_t sent = k < 0 ? 0 : (size_t)k;
    if (sent == iov[0].iov_len + n + 2) return true; /* all of it: the usual case */
    for (size_t i = 0; i < 3; i++) {
        size_t skip = sent < iov[i].iov_len ? sent : iov[i].iov_len;
        sent -= skip;
        lg_fifo_append(&r->tail, (const char *)iov[i].iov_base + skip, iov[i].iov_len - skip);
    }
    if (lg_fifo_len(&r->tail)) {
        r->tail_ns = r->w->now_ns;
        watch_writable(r, true);
    }
    return true;
}

void worker_write_chunk(lg_req *r, const char *p, size_t n)
{
    if (!write_chunk(r, p, n)) client_hung_up(r->w, r);
}

bool worker_write_now(lg_req *r, const char *p, size_t n)
{
    return r->direct && !r->retired && !lg_fifo_len(&r->tail) && write_chunk(r, p, n);
}

/* The client socket can take more of the tail; once it is sent, MHD may be resumed or the
 * output queued meanwhile written. */
static void send_tail(lg_worker *w, lg_req *r)
{
    size_t n;
    const char *p = lg_fifo_peek(&r->tail, &n);
    if (!n) return;
    ssize_t k = send(r->client_fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) client_hung_up(w, r);
        return;
    }
    lg_fifo_drop(&r->tail, (size_t)k);
    r->tail_ns = w->now_ns;
    if (lg_fifo_len(&r->tail)) return;
    lg_fifo_free(&r->tail); /* tails are rare: keep no memory for the next one */
    watch_writable(r, false);
    if (r->resume_due) {
        r->resume_due = false;
        worker_resume(r);
    } else {
        worker_output(r);
    }
}

/* A keep-alive connection whose request ended, as the fd map knew it (see idle_pools). */
typedef struct lg_conn_ended {
    int fd;
    uint32_t gen;
} lg_conn_ended;

static void note_ended(lg_worker *w, const lg_req *r)
{
    if (!w->fdmap[r->client_fd].pool) return;
    lg_conn_ended e = {r->client_fd, r->gen};
    lg_buf_append(&w->ended, (const char *)&e, sizeof e);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    lg_worker *w = cls;
    lg_req *r = *con_cls;

    edge_request_done(w, conn);
    if (!r) return;
    *con_cls = NULL;
    bool was_watched = watched(r);
    if (lg_fifo_len(&r->tail))
        unwatch_client(w, r); /* watched for EPOLLOUT too: the next request starts afresh */
    else if (was_watched) {
        w->fdmap[r->client_fd].req = NULL; /* the watch stays for the next request */
        note_ended(w, r);
    }
    if (was_watched) /* kept by an unwatched slot too, for the connection's next request */
        w->fdmap[r->client_fd].ended_ms = (uint32_t)(w->now_ns / 1000000) + 1;
    if (r->pages == PAGES_QUEUED) unqueue_release(r); /* the queue must not outlive r */
    if (r->pages == PAGES_KEPT) w->pools_kept--;
    r->pages = PAGES_NONE;
    r->retired = true;
    r->suspended = false;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !r->client_gone) {
        r->client_gone = true;
        r->ops->client_gone(r);
    }
    if (w->tick_next == r) w->tick_next = r->next; /* the round goes on past r */
    list_unlink(r);
    w->n_live--;
    list_push(&w->graveyard, r);
}

/* What the other workers see of this one when they place a connection (balance.h): its
 * connections, or UINT_MAX while it takes none (at its limit, draining or shedding). */
static void publish_load(lg_worker *w)
{
    unsigned clients = atomic_load_explicit(&w->clients, memory_order_relaxed);
    bool takes = !w->left && !w->shedding && clients < w->max_clients;
    atomic_store_explicit(&w->load, takes ? clients : UINT_MAX, memory_order_relaxed);
}

/* libmicrohttpd's connection notification: the worker's count of its connections
 * (accept_clients), edge.c's bookkeeping, and the fd map forgets a
 * connection's socket when it closes (libmicrohttpd closes it right after this call, which
 * takes it out of the epoll set) and when a new one starts on its number. The daemons run
 * between the events of a batch (worker_main), so an event of the batch may still name a
 * closed socket whose number a new socket (libcurl's, or a client's) took since: with the
 * slot forgotten, client_slot ignores it rather than unwatching the new socket. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    lg_worker *w = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        atomic_fetch_add_explicit(&w->clients, 1, memory_order_relaxed);
    else if (code == MHD_CONNECTION_NOTIFY_CLOSED)
        atomic_fetch_sub_explicit(&w->clients, 1, memory_order_relaxed);
    publish_load(w);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci && ci->connect_fd >= 0 && (size_t)ci->connect_fd < w->fdmap_len) {
        forget_mhd_conn(w, conn, ci->connect_fd);
        if (code == MHD_CONNECTION_NOTIFY_STARTED || w->fdmap[ci->connect_fd].conn == conn)
            w->fdmap[ci->connect_fd] = (lg_fdslot){0};
    }
    edge_connection(cls, conn, socket_context, code);
}

static void bury_the_dead(lg_worker *w)
{
    while (w->graveyard.next != &w->graveyard) {
        lg_req *r = w->graveyard.next;
        list_unlink(r);
        lg_fifo_free(&r->tail);
        r->ops->destroy(r);
    }
}

static bool is_admin_path(const char *url)
{
    return strncmp(url, "/loopguard/", 11) == 0 || strcmp(url, "/loopguard") == 0;
}

/* Counts a request answered before any handler took it, as the handlers count theirs:
 * under the endpoint its path would have reached. */
static void count_early(lg_worker *w, const char *method, const char *url, int status)
{
    const lg_api *api = route_api(method, url);
    metrics_request(w->metrics,
                    is_admin_path(url) ? LG_EP_ADMIN
                    : api              ? api->endpoint
                                       : LG_EP_PASSTHROUGH,
                    status);
}

/* Answers a request refused before any handler took it (counted by count_early). */
static enum MHD_Result reject(lg_worker *w, struct MHD_Connection *conn, const char *method,
                              const char *url, int status, const char *message, const char *type,
                              const char *code)
{
    count_early(w, method, url, status);
    return http_respond_error(conn, status, message, type, code);
}

/* Chooses the request's handler for `url` (normalised) and registers it in *con_cls. */
static enum MHD_Result route(lg_worker *w, struct MHD_Connection *conn, const char *url,
                             const char *method, void **con_cls)
{
    lg_req *r;
    /* With a separate admin listener, each listener answers only its own paths. */
    bool split = w->srv->admin != NULL;
    if (is_admin_path(url) && (!split || w->admin_only)) return admin_handle(w, conn, url, method);
    if (w->admin_only || is_admin_path(url))
        return reject(w, conn, method, url, 404, "not found", "invalid_request_error", "not_found");
    if (!http_client_authorized(w->srv->cfg, conn))
        return reject(w, conn, method, url, 401, "missing or invalid API key",
                      "authentication_error", "invalid_api_key");

    /* What no guarded API takes is relayed only from the allow-list (edge.h). */
    if (!route_api(method, url) && !edge_passthrough_allowed(w->srv->cfg, method, url))
        return reject(w, conn, method, url, 404,
                      "no such route (loopguard relays only its allow-list; see "
                      "passthrough.allow)",
                      "invalid_request_error", "route_not_allowed");
    r = route_request(w, conn, method, url);
    if (!r) return MHD_NO;
    *con_cls = r;
    return MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls)
{
    lg_worker *w = cls;
    lg_req *r = *con_cls;

    if (r) {
        if (r->client_gone) return MHD_NO;
        edge_body(w, conn, *upload_size);
        return r->ops->access(r, upload, upload_size);
    }
    if (atomic_load(&w->srv->stopping))
        return reject(w, conn, method, url, 503, "loopguard is shutting down", "server_error",
                      "shutting_down");
    /* The head is judged before anything is routed; from here on `url` is the normalised
     * path (origin-form only: an absolute-form target must never choose the upstream). */
    char *path;
    enum MHD_Result rc;
    int refused = edge_admit(w, conn, url, method, version, &path, &rc);
    if (refused) {
        count_early(w, method, url, refused);
        return rc;
    }
    rc = route(w, conn, path, method, con_cls);
    lg_xfree(path);
    if (*con_cls) ((lg_req *)*con_cls)->unchunked = strcmp(version, MHD_HTTP_VERSION_1_1) != 0;
    return rc;
}

/* ---- libcurl glue ------------------------------------------------------------------ */

/* libcurl's readiness poll. libcurl 7.88 reads a transfer's socket and then, before it
 * leaves its read loop, asks poll(fd, 0 ms) whether more is pending (transfer.c,
 * data_pending): at a decode pace one system call per token, as many as the reads. After
 * a short read the answer is known: a stream socket's recv returns less than it was asked
 * for only when it took all the socket held. So the executable defines recv and poll,
 * which take the C library's place for libcurl (an executable's symbols come first):
 * while the worker runs libcurl for a readable socket, recv notes a short read of that
 * socket, and the zero-timeout read check that follows is answered "nothing pending"
 * without a system call. Data that arrives in between is not lost: the worker's epoll is
 * level-triggered and reports the socket again. Everything else (full reads, other
 * sockets, writability, a call outside that socket action (but see parked sockets below),
 * other libraries, a peek, which takes nothing) goes to the kernel as before. Under the
 * sanitizers these definitions also take the place of their recv and poll interceptors,
 * and call recvfrom and ppoll, which are intercepted: ASan still checks the buffer and
 * TSan still sees the socket's synchronisation (recvfrom's interceptor does what recv's would).
 * Both are defined
 * under their assembler names because <sys/socket.h> and <poll.h> declare their buffers
 * write-only, which a definition that reads fds[0] would contradict. */
static _Thread_local int curl_read_fd = -1; /* the socket of this thread's socket action */
static _Thread_local bool curl_drained;     /* its last recv was short */
/* This thread's worker's lg_worker.curl_fds (NULL outside a worker): which upstream
 * sockets are parked (see the next part), for the poll below. */
static _Thread_local const uint8_t *curl_fd_state;
static _Thread_local size_t curl_fd_len;

/* ---- the response body outside libcurl ---------------------------------------------
 *
 * libcurl spends some 2,500 instructions on every read of a streamed response (its socket
 * action, the transfer's state machine, its chunk decoder, progress and timer upkeep): at a
 * decode pace, one read per token. For the common case, a plain-text HTTP/1.1 response with
 * Transfer-Encoding: chunked whose body goes to a callback (lg_xfer.body), the worker reads
 * the body itself; libcurl keeps everything else (connecting, TLS, proxies, the request,
 * the response head, the connection pool) and sees, of the body, only its end.
 *
 * - Linking: when libcurl asks to watch a connection's socket for such a transfer
 *   (on_curl_socket), the worker follows it (lg_worker.up_xfers[fd], lg_xfer.xb) until
 *   the transfer is removed, its socket is closed or libcurl stops watching it.
 * - The head (XB_HEAD): libcurl reads the socket through the executable's recv, which
 *   reads what the socket holds (recv_head), hands libcurl the bytes up to the end of a
 *   head (upbody_head_end, libcurl's own rule) and keeps the rest (xb.stash), to be handed
 *   out by the next recv, so that libcurl never holds a byte of the body when the head's
 *   last line reaches the header callback. An interim 1xx head is cut the same way; the
 *   bytes after it are the next recv's. The poll after a read says "pending" while the
 *   stash holds bytes. A response that does not begin with "HTTP/1.1 " (TLS, a proxy's
 *   tunnel, another version) is libcurl's alone (XB_CURL).
 * - The body (XB_BODY): once the final head is complete and its owner takes the body
 *   (worker_head_complete, from the header callback, when the head is exactly what libcurl
 *   got), libcurl's reads of the socket find nothing (recv: EAGAIN, poll: not readable),
 *   and at each of the socket's input events the worker reads it (read_body), decodes the
 *   chunked framing (upbody.h) and calls lg_xfer.body with the data as libcurl would:
 *   CURL_WRITEFUNC_PAUSE keeps the data and stops watching the socket's input until
 *   worker_body_resume; any other short count ends the transfer with CURLE_WRITE_ERROR.
 * - The end: at the terminal chunk's size line the worker gives libcurl "0\r\n" and what
 *   followed it (the trailers, the final CRLF) through recv and runs its socket action:
 *   libcurl completes an empty chunked body as it would any other, calls the header
 *   callback with the trailers, and keeps the connection for the next transfer.
 * - Failures end the transfer as libcurl would have ended it, through lg_xfer.done (whose
 *   owner removes the transfer, and libcurl closes the connection of a transfer removed
 *   unfinished): the upstream's close before the terminal chunk is CURLE_PARTIAL_FILE, a
 *   read error CURLE_RECV_ERROR with its errno (CURLINFO_OS_ERRNO), a broken framing
 *   CURLE_RECV_ERROR (libcurl's "Failed reading the chunked-encoded stream").
 * libcurl sets no timer of its own on a transfer in its body without CURLOPT_TIMEOUT or a
 * low-speed limit, which the transfers read so set none of: no libcurl timeout fires while
 * it sees no body bytes. */
enum { XB_HEAD, XB_BODY, XB_CURL, XB_CONNECT, XB_REPLY, XB_TRAILERS }; /* the last three: own */

/* The worker's read of a body: what a burst brings at once. A saturated upstream keeps
 * more than this queued on each stream's socket, so the size sets how many events one
 * recvfrom, one pass over the events and one sendmsg to the client carry (~330-byte chat
 * events: ~400 at 128 KiB, ~50 at 16 KiB), and each pair of calls has a fixed cost in the
 * kernel. At 1,000 saturated streams, 16 KiB reads spent 0.33-0.36 us of system time an
 * event, 64 KiB 0.19-0.23, 128 KiB 0.16-0.19, 256 KiB no less (tests/bench/HISTORY.md). A
 * paced stream's read is one event whatever the size; the buffer is the worker's, one for
 * all its streams. */
#define BODY_READ (128 * 1024)
_Static_assert(BODY_READ <= UINT32_MAX, "lg_xfer.body_left holds what a read brings");

static lg_xfer *up_xfer(int fd)
{
    const lg_worker *w = mhd_worker;
    return w && w->up_xfers && fd >= 0 && (size_t)fd < w->fdmap_len ? w->up_xfers[fd] : NULL;
}

static size_t stash_len(const lg_xbody *b)
{
    return b->stash.len - b->stash_at;
}

static void stash_put(lg_xbody *b, const char *p, size_t n)
{
    if (!stash_len(b)) {
        lg_buf_reset(&b->stash);
        b->stash_at = 0;
    }
    lg_buf_append(&b->stash, p, n);
}

/* n bytes of a response head reached buf (from the socket or the stash) for libcurl:
 * how many of them libcurl gets, up to the end of a head. */
static size_t cut_head(lg_xbody *b, const char *buf, size_t n)
{
    static const char prefix[] = "HTTP/1.1 ";
    if (b->matched < sizeof prefix - 1) { /* the prefix may come over several reads */
        size_t k = sizeof prefix - 1 - b->matched;
        if (k > n) k = n;
        if (memcmp(buf, prefix + b->matched, k) != 0) {
            b->phase = XB_CURL;
            return n;
        }
        b->matched = (uint8_t)(b->matched + k);
    }
    size_t end = upbody_head_end(&b->head, buf, n);
    b->ends_head = end != 0;
    return end ? end : n;
}

/* libcurl's read of a socket whose stash holds bytes: from the stash, without a system
 * call. */
static ssize_t recv_stash(lg_xbody *b, char *buf, size_t len)
{
    size_t n = stash_len(b) < len ? stash_len(b) : len;
    memcpy(buf, b->stash.p + b->stash_at, n);
    if (b->phase == XB_HEAD) n = cut_head(b, buf, n);
    b->stash_at += (uint32_t)n;
    if (!stash_len(b)) { /* a stream that libcurl reads on keeps no buffer (recv_head) */
        lg_buf_free(&b->stash);
        b->stash_at = 0;
    }
    return (ssize_t)n;
}

static bool parked(int fd);
static bool conn_socket(int fd);

/* libcurl's read of a response head (the stash empty): the worker reads what the socket
 * holds, up to BODY_READ into its body buffer, not only what libcurl's buffer takes, so a
 * short answer comes in one read however small that buffer (a body the worker reads gets
 * libcurl's smallest, UPREAD_HEAD). libcurl gets its part, cut at the head's end; only the
 * rest, if any, is stashed. */
static ssize_t recv_head(lg_xfer *x, int fd, char *buf, size_t len)
{
    lg_worker *w = mhd_worker;
    ssize_t n = recvfrom(fd, w->body_buf, BODY_READ, 0, NULL, NULL);
    if (fd == curl_read_fd) {
        curl_drained = n > 0 && n < BODY_READ;
        if (n > 0) upread_note_read((size_t)n);
    }
    if (n <= 0) return n;
    size_t k = (size_t)n < len ? (size_t)n : len;
    memcpy(buf, w->body_buf, k);
    k = cut_head(&x->xb, buf, k);
    if (k < (size_t)n) stash_put(&x->xb, w->body_buf + k, (size_t)n - k);
    return (ssize_t)k;
}

/* libcurl's liveness check of a pooled connection (Curl_connalive) peeks one byte and takes
 * the connection for alive unless the peek reads the end of the stream; libcurl peeks for
 * nothing else. But an idle HTTP/1.1 connection has nothing to say: bytes that arrive on it
 * answer no request, and the next transfer, another client's perhaps, would read them as
 * its response. So a peek that finds bytes on a connection's socket that no transfer reads
 * here reads as the end of the stream: libcurl closes that connection and opens another. */
static bool unasked_bytes(int fd, ssize_t n, int flags)
{
    return (flags & MSG_PEEK) && n > 0 && conn_socket(fd) && !up_xfer(fd);
}

ssize_t curl_aware_recv(int fd, void *buf, size_t len, int flags) __asm__("recv");
ssize_t curl_aware_recv(int fd, void *buf, size_t len, int flags)
{
    if (!(flags & MSG_PEEK) && mhd_read_known_empty(fd)) {
        errno = EAGAIN;
        return -1;
    }
    lg_xfer *x = flags & MSG_PEEK ? NULL : up_xfer(fd); /* see "the response body" above */
    if (x && x->xb.phase == XB_BODY) {
        errno = EAGAIN; /* the worker's to read */
        return -1;
    }
    if (x && stash_len(&x->xb)) return recv_stash(&x->xb, buf, len);
    if (x && x->xb.phase == XB_HEAD) return recv_head(x, fd, buf, len);
    ssize_t n = recvfrom(fd, buf, len, flags, NULL, NULL);
    if (unasked_bytes(fd, n, flags)) return 0;
    if (!(flags & MSG_PEEK)) mhd_note_read(fd, n, len);
    if (fd == curl_read_fd && !(flags & MSG_PEEK)) {
        curl_drained = n > 0 && (size_t)n < len;
        if (n > 0) upread_note_read((size_t)n); /* sizes the next transfers' buffers */
    }
    /* libmicrohttpd reads its clients through this recv too: the edge follows those
     * bytes for what libmicrohttpd's parser hides (edge.h). */
    if (n > 0 && !(flags & MSG_PEEK)) edge_received(fd, buf, (size_t)n);
    return n;
}

/* A parked socket's zero-timeout read check is answered too. libcurl makes two on a pooled
 * connection that a transfer takes: whether it is still alive (a connection that reads as
 * readable is closed or unusable), and, once the request is sent, whether the response is
 * already there. Both come before libcurl tells the socket callback what it now waits for,
 * so the socket is still parked: registered for input in the worker's epoll set, which
 * unparks it as soon as it reports anything. "Nothing pending" is then what the kernel said
 * at the last epoll_wait: a response that came since is reported by the next one (the
 * watch is level-triggered and stays), and a close that came since is the race every
 * liveness check has: libcurl retries a request on a fresh connection when a reused one
 * dies before any byte of the response. Two system calls per request. */
int curl_aware_poll(struct pollfd *fds, nfds_t n, int timeout_ms) __asm__("poll");
int curl_aware_poll(struct pollfd *fds, nfds_t n, int timeout_ms)
{
    if (n == 1 && timeout_ms == 0 && !(fds[0].events & POLLOUT)) {
        const lg_xfer *x = up_xfer(fds[0].fd);
        if (x && (x->xb.phase == XB_BODY || stash_len(&x->xb))) { /* the stash or the worker's */
            fds[0].revents = x->xb.phase == XB_BODY ? 0 : (short)(fds[0].events & POLLIN);
            return fds[0].revents != 0;
        }
        bool drained = curl_drained && fds[0].fd == curl_read_fd;
        if (drained) curl_drained = false;
        if (drained || parked(fds[0].fd)) {
            fds[0].revents = 0;
            return 0;
        }
    }
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    return ppoll(fds, n, timeout_ms < 0 ? NULL : &ts, NULL);
}

/* Upstream sockets in the epoll set (lg_worker.curl_fds, per fd). A pooled connection's
 * socket stays registered between its transfers ("parked"): libcurl asks to stop watching
 * it when a transfer ends and to watch it again when the next one reuses the connection,
 * an EPOLL_CTL_DEL and an ADD per request that parking saves. Only the sockets libcurl
 * opens and closes through on_curl_open and on_curl_close are parked, so that a number
 * is never taken for registered after its socket was closed (the close takes it out of
 * the set); the threaded resolver's pipe is unregistered as before. A parked socket that
 * becomes readable (the upstream closed an idle connection) is unregistered then, before
 * level-triggered epoll reports it again; libcurl finds the connection dead when it next
 * checks it. */
enum {
    CFD_IN = 1,     /* registered for EPOLLIN */
    CFD_OUT = 2,    /* registered for EPOLLOUT */
    CFD_CONN = 4,   /* a connection's socket, opened through on_curl_open */
    CFD_PARKED = 8, /* registered (for EPOLLIN only) while libcurl waits for nothing on it */
    CFD_OWN = 16,   /* the worker's own connection: libcurl no longer has it */
};

/* Whether the socket is watched while x's body is the worker's: a paused body callback
 * (worker_body_resume) takes it out of the set, as libcurl's pause would (an error or a
 * hang-up is reported even for a registration that asks for nothing), and its resume, or
 * the end of the worker's hold, puts it back as libcurl asked for it (lg_worker.curl_fds). */
static void watch_body_input(lg_worker *w, lg_xbody *b, bool on)
{
    uint8_t st = w->curl_fds[b->fd];
    uint32_t ev = (st & CFD_IN ? EPOLLIN : 0) | (st & CFD_OUT ? EPOLLOUT : 0);
    b->held = !on;
    if (ev)
        (void)ep_ctl(w, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, b->fd, ev,
                     ev_pack(TAG_CURL_SOCK, 0, b->fd));
}

static void own_release(lg_worker *w, lg_xfer *x);

/* The worker stops following x's socket (see "the response body outside libcurl"); an own
 * transfer's connection is closed. */
static void unlink_body(lg_worker *w, lg_xfer *x)
{
    lg_xbody *b = &x->xb;
    if (b->own) {
        own_release(w, x);
        return;
    }
    if (!b->linked) return;
    if (b->held) watch_body_input(w, b, true);
    if (w->up_xfers[b->fd] == x) w->up_xfers[b->fd] = NULL;
    lg_buf_free(&b->stash);
    *b = (lg_xbody){0};
}

/* libcurl watches socket s for easy's transfer: the worker follows it when the transfer's
 * body may be the worker's (lg_xfer.body), from the response's first byte. */
static void link_body(lg_worker *w, CURL *easy, curl_socket_t s)
{
    lg_xfer *x = NULL, *was = w->up_xfers[s];
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
    if (!x || !x->body || was == x || x->xb.own) return;
    if (was) unlink_body(w, was);
    unlink_body(w, x);
    x->xb = (lg_xbody){.linked = true, .phase = XB_HEAD, .fd = s};
    w->up_xfers[s] = x;
}

static curl_socket_t on_curl_open(void *userp, curlsocktype purpose, struct curl_sockaddr *a)
{
    lg_worker *w = userp;
    (void)purpose;
    int s = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
    if (s >= 0 && (size_t)s < w->fdmap_len) w->curl_fds[s] = CFD_CONN;
    return s < 0 ? CURL_SOCKET_BAD : s;
}

static int on_curl_close(void *userp, curl_socket_t s)
{
    lg_worker *w = userp;
    if (s >= 0 && (size_t)s < w->fdmap_len) {
        if (w->curl_fds[s] & CFD_OWN) return 0; /* taken over by the worker (own_connected) */
        if (w->up_xfers[s]) unlink_body(w, w->up_xfers[s]);
        w->curl_fds[s] = 0;
    }
    return close(s);
}

/* Registers upstream socket s (whose lg_worker.curl_fds state is st) for ev. False, said
 * on stderr, when epoll refuses (ENOMEM, ENOSPC: fs.epoll.max_user_watches). */
static bool watch_upstream(lg_worker *w, int s, uint8_t st, uint32_t ev)
{
    uint64_t data = ev_pack(TAG_CURL_SOCK, 0, s);
    int op = st & (CFD_IN | CFD_OUT) ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
    /* The fd may already be (ADD: EEXIST) or no longer be (MOD: ENOENT) in the set. */
    if (ep_ctl(w, op, s, ev, data) == 0 ||
        (errno == (op == EPOLL_CTL_ADD ? EEXIST : ENOENT) &&
         ep_ctl(w, op == EPOLL_CTL_ADD ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, s, ev, data) == 0))
        return true;
    fprintf(stderr, "loopguard: worker %d: cannot watch an upstream socket: %s\n", w->id,
            strerror(errno));
    return false;
}

static int on_curl_socket(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    lg_worker *w = userp;
    uint8_t spare = 0, *st = s >= 0 && (size_t)s < w->fdmap_len ? &w->curl_fds[s] : &spare;
    (void)socketp;

    if (*st & CFD_OWN) return 0; /* the worker's now, whatever libcurl still says of it */
    /* libcurl changes what it waits for on the socket being read (a transfer ended): a poll
     * of it that follows is not its read loop's check, which never comes after this. */
    if (s == curl_read_fd) curl_drained = false;
    if (*st & CFD_CONN) {
        if (what == CURL_POLL_REMOVE && w->up_xfers[s])
            unlink_body(w, w->up_xfers[s]); /* the transfer is over (or moved on) */
        else if (what != CURL_POLL_REMOVE && easy)
            link_body(w, easy, s);
    }
    if (what == CURL_POLL_REMOVE) {
        if ((*st & ~CFD_PARKED) == (CFD_CONN | CFD_IN)) {
            *st |= CFD_PARKED;
            return 0;
        }
        (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, s, NULL);
        *st &= CFD_CONN;
        return 0;
    }
    uint8_t want = (what & CURL_POLL_IN ? CFD_IN : 0) | (what & CURL_POLL_OUT ? CFD_OUT : 0);
    if ((*st & (CFD_IN | CFD_OUT)) == want) { /* registered so already: a parked socket */
        *st &= (uint8_t)~CFD_PARKED;
        return 0;
    }
    uint32_t ev = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
    if (!watch_upstream(w, s, *st, ev)) {
        /* The transfer would wait for its timeout: it fails now instead (fail_unwatched).
         * Returning -1 would make libcurl fail every transfer of the worker. */
        if (easy) {
            w->unwatched = lg_xrealloc(w->unwatched, (w->n_unwatched + 1) * sizeof *w->unwatched);
            w->unwatched[w->n_unwatched++] = easy;
        }
        *st &= CFD_CONN;
        return 0;
    }
    *st = (uint8_t)((*st & CFD_CONN) | want);
    return 0;
}

static bool conn_socket(int fd)
{
    return curl_fd_state && fd >= 0 && (size_t)fd < curl_fd_len && (curl_fd_state[fd] & CFD_CONN);
}

static bool parked(int fd)
{
    return curl_fd_state && fd >= 0 && (size_t)fd < curl_fd_len && (curl_fd_state[fd] & CFD_PARKED);
}

/* A parked socket reported an event: see above. */
static bool curl_unpark(lg_worker *w, int fd)
{
    if (fd < 0 || (size_t)fd >= w->fdmap_len || !(w->curl_fds[fd] & CFD_PARKED)) return false;
    (void)epoll_ctl(w->epfd, EPOLL_CTL_DEL, fd, NULL);
    w->curl_fds[fd] = CFD_CONN;
    return true;
}

/* Ends the transfers whose socket could not be watched (on_curl_socket) as failed. */
static void fail_unwatched(lg_worker *w)
{
    while (w->n_unwatched) {
        CURL *easy = w->unwatched[--w->n_unwatched];
        lg_xfer *x = NULL;
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
        if (x && x->done) x->done(x, CURLE_ABORTED_BY_CALLBACK);
    }
}

static int on_curl_timer(CURLM *multi, long timeout_ms, void *userp)
{
    lg_worker *w = userp;
    struct itimerspec its = {0};
    (void)multi;

    if (timeout_ms == 0) {
        /* "Now" (a transfer was added, a connection came free): run_pending acts on it in
         * this loop iteration, without a timerfd round trip through epoll. */
        w->curl_due = true;
        return 0;
    }
    /* timeout_ms counts from libcurl's "now", the clock it reads (a worker's pass time, see
     * loop_clock_gettime): the timerfd is armed at that time plus timeout_ms. libcurl
     * re-announces nearly the same deadline many times a second; re-arming the timerfd for
     * a change under a millisecond is a syscall for nothing. */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t now_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    uint64_t deadline = timeout_ms < 0 ? 0 : now_ns / 1000000u + (uint64_t)timeout_ms;
    if (deadline == w->curl_deadline_ms) return 0;
    w->curl_deadline_ms = deadline;
    if (timeout_ms > 0) {
        uint64_t at = now_ns + (uint64_t)timeout_ms * 1000000u;
        its.it_value.tv_sec = (time_t)(at / 1000000000u);
        its.it_value.tv_nsec = (long)(at % 1000000000u);
    }
    return timerfd_settime(w->curl_timerfd, TFD_TIMER_ABSTIME, &its, NULL) == 0 ? 0 : -1;
}

/* Runs a socket action of libcurl's. A transfer that ends leaves libcurl's count of running
 * transfers, the only way one leaves it apart from curl_multi_remove_handle (which takes
 * its message too): a count below what the worker expects (the last count plus the
 * transfers added since, add_xfer) tells drain_curl_messages that messages may wait, so
 * that the other actions, one per upstream read, skip curl_multi_info_read. */
static void curl_action(lg_worker *w, curl_socket_t s, int flags)
{
    int running = w->curl_alive;
    curl_multi_socket_action(w->multi, s, flags, &running);
    if (running < w->curl_alive) w->curl_msgs = true;
    w->curl_alive = running;
}

/* x's transfer ends here, as libcurl would have ended it (see "the response body"). */
static void end_body(lg_worker *w, lg_xfer *x, CURLcode rc, long os_errno)
{
    unlink_body(w, x);
    x->os_errno = (int)os_errno;
    x->done(x, rc);
}

/* The terminal chunk's size line was read; rest[0..n) followed it: libcurl gets the
 * terminal chunk from here on and ends the transfer. */
static void body_to_curl(lg_worker *w, lg_xfer *x, const char *rest, size_t n)
{
    lg_xbody *b = &x->xb;
    int fd = b->fd;
    b->phase = XB_CURL;
    stash_put(b, "0\r\n", 3);
    stash_put(b, rest, n);
    curl_read_fd = fd;
    curl_action(w, fd, CURL_CSELECT_IN);
    curl_read_fd = -1;
    curl_drained = false;
}

/* An own connection and the request on it (see "the worker's own connections" below),
 * the worker's, made by worker_uplink_start and freed when the transfer ends (own_release). */
typedef struct lg_uconn {
    bool reused;      /* it served a request before: a failure before any byte of the response
                      is retried once on a new connection */
    bool answered;    /* a byte of the response came */
    bool reusable;    /* the response's framing lets the connection serve another request */
    uint8_t url;      /* the target's lg_worker.urls entry */
    uint64_t left;    /* UPLINK_LENGTH: body bytes still to come */
    CURL *connect;    /* the connect-only transfer opening the connection, or NULL */
    lg_buf req;       /* the request head (freed once answered: no retry after that) */
    const char *body; /* the request body (the caller's, alive until worker_uplink_stop) */
    size_t body_len;
    size_t sent;                /* of the head and the body */
    size_t total;               /* their length */
    uplink_resp resp;           /* the response's heads, then its trailers */
    lg_buf line;                /* a head's line cut by a read */
    curl_write_callback header; /* lg_uplink_req's */
    void (*connected)(lg_xfer *x);
} lg_uconn;

/* The body's next data in p[0..n) under its framing (upbody_next's contract): a chunked
 * body is decoded, a Content-Length or a close-delimited one is its bytes. */
static ssize_t body_next(lg_xbody *b, const char *p, size_t n, const char **data, size_t *len)
{
    uint8_t f = b->frame;
    if (f == UPLINK_CHUNKED) return upbody_next(&b->dec, p, n, data, len);
    size_t k = f == UPLINK_LENGTH && b->own->left < n ? (size_t)b->own->left : n;
    if (f == UPLINK_LENGTH) b->own->left -= k;
    *data = p;
    *len = k;
    return (ssize_t)k;
}

/* body_next's last len data bytes were not taken (upbody_unread's contract). */
static void body_unread(lg_xbody *b, size_t len)
{
    uint8_t f = b->frame;
    if (f == UPLINK_CHUNKED)
        upbody_unread(&b->dec, len);
    else if (f == UPLINK_LENGTH)
        b->own->left += len;
}

/* Whether the body ended (a chunked one: at its terminal chunk's size line). */
static bool body_ended(const lg_xbody *b)
{
    uint8_t f = b->frame;
    return f == UPLINK_CHUNKED ? upbody_ended(&b->dec) : f == UPLINK_LENGTH && !b->own->left;
}

static void own_body_ended(lg_worker *w, lg_xfer *x, char *rest, size_t n);
static void own_done(lg_worker *w, lg_xfer *x, bool clean);
static void own_event(lg_worker *w, lg_xfer *x, uint32_t events);
static void own_connected(lg_worker *w, lg_xfer *x, CURLcode rc);

/* Raw body bytes p[0..n) of x's socket, decoded and handed to x->body. */
static void feed_body(lg_worker *w, lg_xfer *x, char *p, size_t n)
{
    lg_xbody *b = &x->xb;
    while (n) {
        const char *data;
        size_t len;
        ssize_t k = body_next(b, p, n, &data, &len);
        if (k == UPBODY_BAD) {
            end_body(w, x, CURLE_RECV_ERROR, 0);
            return;
        }
        if (len) {
            x->body_left = (uint32_t)((size_t)k == n ? len : (size_t)(p + n - data)); /* worker.h */
            size_t took = x->body((char *)data, 1, len, x->owner);
            x->body_left = 0;
            if (took == CURL_WRITEFUNC_PAUSE) {
                body_unread(b, len);
                stash_put(b, data, (size_t)(p + n - data));
                watch_body_input(w, b, false);
                return;
            }
            if (took != len) {
                end_body(w, x, CURLE_WRITE_ERROR, 0);
                return;
            }
        }
        p += k;
        n -= (size_t)k;
        if (body_ended(b)) {
            if (b->own)
                own_body_ended(w, x, p, n);
            else
                body_to_curl(w, x, p, n);
            return;
        }
    }
}

/* What x's socket holds (the stash first): the worker's read of the body. */
static void read_body(lg_worker *w, lg_xfer *x)
{
    lg_xbody *b = &x->xb;
    if (b->held) return;
    if (stash_len(b)) {
        lg_buf kept = b->stash; /* fed from here: feed_body may stash the rest anew */
        size_t at = b->stash_at;
        b->stash = (lg_buf)LG_BUF_INIT;
        b->stash_at = 0;
        feed_body(w, x, kept.p + at, kept.len - at);
        lg_buf_free(&kept);
        return; /* the socket's own input, if any, is reported again (level-triggered) */
    }
    if (x->warm) x->warm(x->owner); /* its misses overlap the read (worker.h) */
    ssize_t n = sys_recv(b->fd, w->body_buf, BODY_READ);
    if (n > 0)
        feed_body(w, x, w->body_buf, (size_t)n);
    else if (n == 0 && b->frame == UPLINK_CLOSE)
        own_done(w, x, false); /* the end of a close-delimited body */
    else if (n == 0)
        end_body(w, x, CURLE_PARTIAL_FILE, 0);
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        end_body(w, x, CURLE_RECV_ERROR, errno);
}

/* The bodies queued by worker_head_complete (the bytes after the head) and
 * worker_body_resume, run after the event that queued them, outside libcurl. */
static void run_due_bodies(lg_worker *w)
{
    while (w->body_due.len) {
        int fd;
        w->body_due.len -= sizeof fd;
        memcpy(&fd, w->body_due.p + w->body_due.len, sizeof fd);
        lg_xfer *x = w->up_xfers[fd];
        if (!x || !x->xb.due) continue;
        x->xb.due = false;
        if (x->xb.phase == XB_BODY)
            read_body(w, x);
        else if (x->xb.phase == XB_REPLY)
            own_event(w, x, 0); /* an own connection's request to send */
    }
}

static void body_due(lg_worker *w, lg_xbody *b)
{
    if (b->due) return;
    b->due = true;
    lg_buf_append(&w->body_due, &b->fd, sizeof b->fd);
}

bool worker_head_complete(lg_worker *w, lg_xfer *x, CURL *easy, bool take_body)
{
    lg_xbody *b = &x->xb;
    long version = 0;
    if (b->own) return true; /* the worker reads all of it */
    if (!b->linked || b->phase != XB_HEAD) return false;
    /* The head libcurl parsed is exactly what it got (see cut_head), and was HTTP/1.1;
     * libcurl sends nothing more (the rest of a request body would share the socket's
     * events). */
    if (!take_body || !b->ends_head || (w->curl_fds[b->fd] & CFD_OUT) ||
        curl_easy_getinfo(easy, CURLINFO_HTTP_VERSION, &version) != CURLE_OK ||
        version != CURL_HTTP_VERSION_1_1) {
        b->phase = XB_CURL;
        return false;
    }
    b->phase = XB_BODY;
    if (stash_len(b)) body_due(w, b);
    return true;
}

bool worker_body_resume(lg_worker *w, lg_xfer *x)
{
    lg_xbody *b = &x->xb;
    if (!b->linked || b->phase != XB_BODY) return false;
    if (b->held) watch_body_input(w, b, true);
    body_due(w, b);
    return true;
}

/* The bodies due (run_due_bodies), the transfers that could not be watched, and the
 * messages of the transfers that left libcurl's running count: each to its owner. */
static void drain_due(lg_worker *w)
{
    CURLMsg *msg;
    int left;
    run_due_bodies(w); /* the worker's own reads of bodies, which may end transfers too */
    fail_unwatched(w);
    if (!w->curl_msgs) return;
    w->curl_msgs = false;
    while ((msg = curl_multi_info_read(w->multi, &left))) {
        if (msg->msg != CURLMSG_DONE) continue;
        lg_xfer *x = NULL;
        CURL *easy = msg->easy_handle;
        CURLcode rc = msg->data.result;
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
        if (x && x->xb.own && x->xb.own->connect == easy) {
            own_connected(w, x, rc);
            continue;
        }
        long os_errno = 0;
        if (x && curl_easy_getinfo(easy, CURLINFO_OS_ERRNO, &os_errno) == CURLE_OK)
            x->os_errno = (int)os_errno;
        if (x && x->done) x->done(x, rc);
    }
}

/* What drain_due does, which after most events is nothing: the test inline, the call not. */
static inline void drain_curl_messages(lg_worker *w)
{
    if (w->body_due.len || w->n_unwatched || w->curl_msgs) drain_due(w);
}

/* A transfer's handle is reused rather than made anew: curl_easy_init allocates and sets
 * up about 5 KiB, and the first transfer on it its read buffer; a kept handle has both.
 * A kept handle keeps its last transfer's options (no curl_easy_reset): the contract in
 * worker.h says which ones its users set again. */
CURL *worker_easy_get(lg_worker *w, bool *fresh)
{
    *fresh = w->n_spare == 0;
    return *fresh ? lg_xcheck(curl_easy_init()) : w->spare[--w->n_spare];
}

void worker_easy_put(lg_worker *w, CURL *easy)
{
    /* The next user may give libcurl a URL string only, which a URL handle would override. */
    curl_easy_setopt(easy, CURLOPT_CURLU, NULL);
    if (w->n_spare < WORKER_SPARE_EASY)
        w->spare[w->n_spare++] = easy;
    else
        curl_easy_cleanup(easy);
}

/* A spare is reset when it comes back, while its params are surely alive, so that it keeps
 * only what guard_reset keeps; one for the same params and channel is ready as it is. */
guard *worker_guard_get(lg_worker *w, const guard_params *p, lg_channel ch)
{
    if (!w->n_spare_guards) {
        guard *g = guard_new(p, ch);
        guard_use_store(g, w->guard_store);
        return g;
    }
    guard *g = w->spare_guards[--w->n_spare_guards];
    if (guard_channel(g) != ch || guard_params_of(g) != p) guard_reset(g, p, ch);
    return g;
}

void worker_guard_put(lg_worker *w, guard *g)
{
    if (!g) return;
    if (w->n_spare_guards == WORKER_SPARE_GUARDS) {
        guard_free(g);
        return;
    }
    guard_reset(g, guard_params_of(g), guard_channel(g));
    w->spare_guards[w->n_spare_guards++] = g;
}

/* libcurl 7.88 parses CURLOPT_URL with these flags (url.c, parseurlandfillconn) when the
 * transfer sets neither CURLOPT_PATH_AS_IS nor CURLOPT_DISALLOW_USERNAME_IN_URL, as the
 * exchange's do not; a URL handle parsed with them holds what libcurl would parse. libcurl
 * reads the handle and never changes it (CURLOPT_CURLU), so one serves every transfer. */
/* The worker's entry for url (worker_upstream_url's contract), or NULL. */
static struct lg_url *find_url(lg_worker *w, const char *url)
{
    for (size_t i = 0; i < w->n_urls; i++)
        if (strcmp(w->urls[i].url, url) == 0) return &w->urls[i];
    if (w->n_urls == WORKER_URLS) return NULL;
    CURLU *u = curl_url();
    if (!u || curl_url_set(u, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME)) {
        curl_url_cleanup(u);
        return NULL;
    }
    struct lg_url *e = &w->urls[w->n_urls++];
    *e = (struct lg_url){.url = lg_xstrdup(url), .parsed = u};
    e->own = uplink_target_init(&e->target, u);
    if (e->own) { /* its origin's idle pool, shared by the origin's paths */
        size_t k = 0;
        while (k < w->n_idle && strcmp(w->idle[k].origin, e->target.origin) != 0)
            k++;
        if (k == w->n_idle) w->idle[w->n_idle++].origin = lg_xstrdup(e->target.origin);
        e->idle = (uint8_t)k;
    }
    return e;
}

CURLU *worker_upstream_url(lg_worker *w, const char *url)
{
    const struct lg_url *e = find_url(w, url);
    return e ? e->parsed : NULL;
}

/* libcurl 7.88 picks a transfer's proxy from the environment each time it sets up a
 * connection, a reused one too (url.c, create_conn_helper_init_proxy and detect_proxy):
 * no_proxy, NO_PROXY, then <scheme>_proxy (and HTTPS_PROXY for https; not HTTP_PROXY),
 * all_proxy, ALL_PROXY, each a walk of the environment, and an empty value counts as
 * unset. When none of them is set the answer is "no proxy" for every transfer, which the
 * options say without the walks: CURLOPT_PROXY "" (libcurl's documented "no proxy, whatever
 * the environment says") and CURLOPT_NOPROXY "" (an empty list excludes no host). When any
 * is set, both options stay NULL and libcurl reads the environment as before. loopguard
 * never changes its environment, so it is read once, when the worker is made. */
static bool proxy_env_set(void)
{
    static const char *const names[] = {"no_proxy",    "NO_PROXY",  "http_proxy", "https_proxy",
                                        "HTTPS_PROXY", "all_proxy", "ALL_PROXY"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) return true;
    }
    return false;
}

/* Every transfer of the worker's multi handle opens and closes its sockets through the
 * worker (see on_curl_open), and takes its proxy as above. A kept handle (worker_easy_get)
 * has these options from its first transfer: they are set on the others only (two are
 * strings, which libcurl copies at each setting). */
static CURLMcode add_xfer(lg_worker *w, CURL *easy, bool kept)
{
    if (!kept) {
        curl_easy_setopt(easy, CURLOPT_PROXY, w->proxy_env ? NULL : "");
        curl_easy_setopt(easy, CURLOPT_NOPROXY, w->proxy_env ? NULL : "");
        curl_easy_setopt(easy, CURLOPT_OPENSOCKETFUNCTION, on_curl_open);
        curl_easy_setopt(easy, CURLOPT_OPENSOCKETDATA, w);
        curl_easy_setopt(easy, CURLOPT_CLOSESOCKETFUNCTION, on_curl_close);
        curl_easy_setopt(easy, CURLOPT_CLOSESOCKETDATA, w);
    }
    CURLMcode rc = curl_multi_add_handle(w->multi, easy);
    if (rc == CURLM_OK) w->curl_alive++;
    return rc;
}

int worker_add_xfer(lg_worker *w, CURL *easy)
{
    return add_xfer(w, easy, false) == CURLM_OK ? 0 : -1;
}

int worker_add_kept_xfer(lg_worker *w, CURL *easy)
{
    return add_xfer(w, easy, true) == CURLM_OK ? 0 : -1;
}

/* Takes easy off the multi handle, and off the transfers to be failed (fail_unwatched). */
static void remove_easy(lg_worker *w, CURL *easy)
{
    for (size_t i = 0; i < w->n_unwatched;)
        if (w->unwatched[i] == easy)
            w->unwatched[i] = w->unwatched[--w->n_unwatched];
        else
            i++;
    curl_multi_remove_handle(w->multi, easy);
}

void worker_remove_xfer(lg_worker *w, CURL *easy)
{
    lg_xfer *x = NULL;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, (char **)&x);
    if (x) unlink_body(w, x);
    remove_easy(w, easy);
}

/* ---- the worker's own connections ---------------------------------------------------
 *
 * An exchange's attempt on an http:// upstream with no proxy in the environment (uplink.h)
 * is the worker's from the connection on (worker_uplink_start): libcurl opens the
 * connection and the worker speaks HTTP/1.1 on it, then keeps it for the next attempts.
 * - Connecting (XB_CONNECT) stays libcurl's, with its DNS, its errors and their os_errno: a
 *   CURLOPT_CONNECT_ONLY transfer on the worker's multi handle, which libcurl 7.88 ends as
 *   CURLMSG_DONE once connected (own_connected). The worker then takes its socket
 *   (CURLINFO_ACTIVESOCKET, marked CFD_OWN): libcurl, which closes a connect-only
 *   connection when its transfer is removed (multi.c, curl_multi_remove_handle), gets its
 *   close callback answered without a close, and its socket callback ignored from then on.
 * - The request (XB_REPLY, while `sent` is short of it all) goes out in one sendmsg of the
 *   head (uplink_request_head) and the body; what the socket does not take goes on
 *   EPOLLOUT. An attempt on an idle connection sends after the event that started it
 *   (body_due), so that a failure reaches the owner outside its start.
 * - The response's heads (XB_REPLY) go line by line to x->header (uplink_head_take); the
 *   body (XB_BODY) is read by read_body and handed to x->body, as libcurl's chunked bodies
 *   are (pauses included), under the framing of uplink_framing; a chunked body's trailers
 *   (XB_TRAILERS) go to x->header too.
 * - The end (own_done): a connection whose response was complete, reusable (uplink.h),
 *   wholly sent and followed by no byte goes back idle (idle_put); any other is closed.
 * - Idle connections stay registered for input (level-triggered), so reusing one takes no
 *   system call before the request's sendmsg; any event on an idle one (the upstream
 *   closed it, or sent bytes nobody asked for) closes it (idle_event), and one idle for
 *   UPLINK_IDLE_NS is closed at a tick (idle_expire).
 * - Failures end the transfer with libcurl's codes for the same cases: a send error
 *   CURLE_SEND_ERROR and a read error CURLE_RECV_ERROR with their errno, the end of the
 *   stream before a whole line of the head CURLE_GOT_NOTHING (after one, CURLE_OK with the
 *   head incomplete, as libcurl 7.88), before the body's end CURLE_PARTIAL_FILE. A
 *   connection that served a request before and fails before any byte of the response
 *   (the upstream closed it meanwhile) is replaced by a new one once, as libcurl and nginx
 *   retry (own_broken). */

/* The socket of an own connection that no transfer holds: closed (the close takes it out
 * of the epoll set). */
static void own_close(lg_worker *w, int fd)
{
    w->curl_fds[fd] = 0;
    w->up_xfers[fd] = NULL;
    close(fd);
}

/* An idle connection of pool `idle`, the last one back, or -1. */
static int idle_take(lg_worker *w, uint8_t idle)
{
    lg_idle *p = &w->idle[idle];
    return p->n ? p->fds[--p->n] : -1;
}

/* Connection fd is free for another request: kept idle, or closed when its pool is full. */
static void idle_put(lg_worker *w, uint8_t idle, int fd)
{
    lg_idle *p = &w->idle[idle];
    if (p->n == UPLINK_IDLE_MAX) {
        own_close(w, fd);
        return;
    }
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->fds = lg_xrealloc(p->fds, p->cap * sizeof *p->fds);
        p->since = lg_xrealloc(p->since, p->cap * sizeof *p->since);
    }
    w->up_xfers[fd] = NULL;
    p->fds[p->n] = fd;
    p->since[p->n++] = w->now_ns;
}

/* Pool p's i-th idle connection is closed. */
static void idle_drop(lg_worker *w, lg_idle *p, size_t i)
{
    own_close(w, p->fds[i]);
    p->n--;
    memmove(&p->fds[i], &p->fds[i + 1], (p->n - i) * sizeof *p->fds);
    memmove(&p->since[i], &p->since[i + 1], (p->n - i) * sizeof *p->since);
}

/* An event on idle connection fd: closed (see above). */
static void idle_event(lg_worker *w, int fd)
{
    for (size_t k = 0; k < w->n_idle; k++)
        for (size_t i = 0; i < w->idle[k].n; i++)
            if (w->idle[k].fds[i] == fd) {
                idle_drop(w, &w->idle[k], i);
                return;
            }
}

/* At a tick: the connections idle for UPLINK_IDLE_NS are closed (the oldest are first). */
static void idle_expire(lg_worker *w)
{
    for (size_t k = 0; k < w->n_idle; k++)
        while (w->idle[k].n && w->now_ns - w->idle[k].since[0] >= UPLINK_IDLE_NS)
            idle_drop(w, &w->idle[k], 0);
}

/* The own connection's registration: input always (an error or hang-up is reported with
 * it), and EPOLLOUT while the request is not all sent. Not while the body is held
 * (watch_body_input owns the registration then). */
static void own_watch(lg_worker *w, lg_xbody *b, bool out)
{
    uint8_t *st = &w->curl_fds[b->fd];
    uint8_t want = (uint8_t)(CFD_IN | (out ? CFD_OUT : 0));
    if (b->held || (*st & (CFD_IN | CFD_OUT)) == want) return;
    (void)ep_ctl(w, EPOLL_CTL_MOD, b->fd, EPOLLIN | (out ? EPOLLOUT : 0),
                 ev_pack(TAG_CURL_SOCK, 0, b->fd));
    *st = (uint8_t)((*st & ~(CFD_IN | CFD_OUT)) | want);
}

void worker_uplink_stop(lg_worker *w, lg_xfer *x)
{
    if (x->xb.own) own_release(w, x);
}

static void own_release(lg_worker *w, lg_xfer *x)
{
    lg_xbody *b = &x->xb;
    lg_uconn *c = b->own;
    if (c->connect) { /* libcurl closes the connection it was opening */
        remove_easy(w, c->connect);
        curl_easy_cleanup(c->connect);
    }
    if (b->linked) own_close(w, b->fd);
    lg_buf_free(&b->stash);
    lg_buf_free(&c->req);
    lg_buf_free(&c->line);
    lg_xfree(c);
    *b = (lg_xbody){0};
}

/* x's response ended complete (rest: bytes followed it): its connection goes back idle
 * when it may serve another request (see above), and x is done. */
static void own_done(lg_worker *w, lg_xfer *x, bool clean)
{
    lg_xbody *b = &x->xb;
    const lg_uconn *c = b->own;
    if (clean && c->reusable && c->sent == c->total && !b->held) {
        idle_put(w, w->urls[c->url].idle, b->fd);
        b->linked = false;
    }
    own_release(w, x);
    x->os_errno = 0;
    x->done(x, CURLE_OK);
}

static bool own_connect(lg_worker *w, lg_xfer *x);
static bool own_send(lg_worker *w, lg_xfer *x);

/* x's connection failed (rc, errno err): retried once on a new connection when it was a
 * reused one and no byte of the response came (see above), else the transfer ends so. */
static void own_broken(lg_worker *w, lg_xfer *x, CURLcode rc, long err)
{
    lg_xbody *b = &x->xb;
    lg_uconn *c = b->own;
    if (!c->reused || c->answered) {
        end_body(w, x, rc, err);
        return;
    }
    own_close(w, b->fd);
    b->linked = c->reused = false;
    c->sent = 0;
    c->resp = (uplink_resp){0};
    lg_buf_reset(&c->line);
    if (!own_connect(w, x)) end_body(w, x, CURLE_FAILED_INIT, 0);
}

/* Writes what is left of x's request from `sent`; false on a failed write (errno says why),
 * which the caller handles. */
static bool own_write(lg_worker *w, lg_xfer *x)
{
    lg_xbody *b = &x->xb;
    lg_uconn *c = b->own;
    size_t head = c->req.len;
    struct iovec iov[2];
    int k = 0;
    if (c->sent < head) iov[k++] = (struct iovec){c->req.p + c->sent, head - c->sent};
    size_t at = c->sent > head ? c->sent - head : 0;
    if (at < c->body_len) iov[k++] = (struct iovec){(char *)c->body + at, c->body_len - at};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)k};
    ssize_t n = k ? sys_sendmsg(b->fd, &m, MSG_NOSIGNAL) : 0;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (n > 0) c->sent += (size_t)n;
    own_watch(w, b, c->sent < c->total);
    return true;
}

/* x's request goes on from `sent` (see above). False when the connection failed (x ended,
 * or went on to a new connection). */
static bool own_send(lg_worker *w, lg_xfer *x)
{
    if (own_write(w, x)) return true;
    own_broken(w, x, CURLE_SEND_ERROR, errno);
    return false;
}

/* x has connection fd (reused: from its idle pool): the request goes out now. With send_now
 * false (a connection from the idle pool, inside the exchange's start) a failed write is not
 * handled here, where it would end x inside its owner's call: x's due run after the current
 * event writes again and handles the failure (own_event). The write itself does not wait
 * for that run: the exchange starts inside a daemon's run, and a request that waited for the
 * rest of the daemons' runs (the batch's other requests, its resumed connections) reached
 * the upstream tens of microseconds later at p90 (tests/bench/HISTORY.md, issue 28, ttft2). */
static void own_begin(lg_worker *w, lg_xfer *x, int fd, bool reused, bool send_now)
{
    lg_xbody *b = &x->xb;
    b->fd = fd;
    b->linked = true;
    b->own->reused = reused;
    b->phase = XB_REPLY;
    w->up_xfers[fd] = x;
    if (b->own->connected) b->own->connected(x);
    if (send_now)
        (void)own_send(w, x);
    else if (!own_write(w, x))
        body_due(w, b);
}

/* A connect-only transfer for x (see above); false when libcurl would not take it. */
static bool own_connect(lg_worker *w, lg_xfer *x)
{
    CURL *e = curl_easy_init();
    if (!e) return false;
    curl_easy_setopt(e, CURLOPT_CURLU, w->urls[x->xb.own->url].parsed);
    curl_easy_setopt(e, CURLOPT_CONNECT_ONLY, 1L);
    curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L); /* never one of libcurl's pooled ones */
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    if (add_xfer(w, e, false) != CURLM_OK) {
        curl_easy_cleanup(e);
        return false;
    }
    x->xb.own->connect = e;
    x->xb.phase = XB_CONNECT;
    return true;
}

/* x's connect-only transfer ended with rc (see above). */
static void own_connected(lg_worker *w, lg_xfer *x, CURLcode rc)
{
    lg_xbody *b = &x->xb;
    CURL *e = b->own->connect;
    curl_socket_t s = CURL_SOCKET_BAD;
    long err = 0;
    b->own->connect = NULL;
    curl_easy_getinfo(e, CURLINFO_OS_ERRNO, &err);
    if (rc == CURLE_OK && (curl_easy_getinfo(e, CURLINFO_ACTIVESOCKET, &s) != CURLE_OK || s < 0 ||
                           (size_t)s >= w->fdmap_len))
        rc = CURLE_COULDNT_CONNECT;
    if (rc == CURLE_OK) w->curl_fds[s] |= CFD_OWN; /* libcurl's close leaves it open */
    remove_easy(w, e);
    curl_easy_cleanup(e);
    if (rc != CURLE_OK) {
        end_body(w, x, rc, err);
        return;
    }
    if (!watch_upstream(w, s, w->curl_fds[s], EPOLLIN)) {
        own_close(w, s);
        end_body(w, x, CURLE_ABORTED_BY_CALLBACK, 0);
        return;
    }
    w->curl_fds[s] = CFD_CONN | CFD_OWN | CFD_IN;
    own_begin(w, x, s, false, true);
}

/* Bytes p[0..n) of x's heads or trailers (see above). */
static void own_head(lg_worker *w, lg_xfer *x, char *p, size_t n)
{
    lg_xbody *b = &x->xb;
    lg_uconn *c = b->own;
    CURLcode rc = CURLE_OK;
    bool trailers = b->phase == XB_TRAILERS;
    ssize_t k = uplink_head_take(&c->resp, &c->line, trailers, p, n, c->header, x->owner, &rc);
    if (k < 0) {
        end_body(w, x, rc, 0);
        return;
    }
    if (!c->resp.done) return;
    size_t rest = n - (size_t)k;
    if (trailers) {
        own_done(w, x, rest == 0);
        return;
    }
    bool reusable;
    lg_buf_free(&c->line); /* a stream keeps no buffer it no longer needs */
    b->frame = (uint8_t)uplink_framing(&c->resp, &reusable);
    c->reusable = reusable;
    c->left = c->resp.len;
    if (b->frame == UPLINK_NONE || (b->frame == UPLINK_LENGTH && !c->left)) {
        own_done(w, x, rest == 0);
        return;
    }
    b->phase = XB_BODY;
    if (rest) feed_body(w, x, p + k, rest);
}

/* The terminal chunk's size line was read; rest[0..n) followed it: the trailers. A body
 * of another framing ended with its last byte. */
static void own_body_ended(lg_worker *w, lg_xfer *x, char *rest, size_t n)
{
    lg_xbody *b = &x->xb;
    if (b->frame != UPLINK_CHUNKED) {
        own_done(w, x, n == 0);
        return;
    }
    b->phase = XB_TRAILERS;
    b->own->resp = (uplink_resp){0};
    if (n) own_head(w, x, rest, n);
}

/* An event of x's own connection (events: epoll's), or its due run (0). A token's input
 * event reads nothing of the connection (*b->own) on its way to read_body. */
static void own_event(lg_worker *w, lg_xfer *x, uint32_t events)
{
    lg_xbody *b = &x->xb;
    lg_uconn *c = b->own;
    if ((!events || (events & EPOLLOUT)) && c->sent < c->total && !own_send(w, x)) return;
    if (!(events & ~(uint32_t)EPOLLOUT)) return;
    if (b->phase == XB_BODY) {
        read_body(w, x);
        return;
    }
    ssize_t n = sys_recv(b->fd, w->body_buf, BODY_READ);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n < 0)
        own_broken(w, x, CURLE_RECV_ERROR, errno);
    else if (n == 0 && !c->answered)
        own_broken(w, x, CURLE_GOT_NOTHING, 0);
    else if (n == 0)
        end_body(w, x,
                 b->phase == XB_TRAILERS ? CURLE_PARTIAL_FILE
                 : c->resp.lines         ? CURLE_OK
                                         : CURLE_GOT_NOTHING,
                 0);
    else {
        c->answered = true;
        if (c->sent == c->total) lg_buf_free(&c->req); /* no retry after an answer */
        own_head(w, x, w->body_buf, (size_t)n);
    }
}

bool worker_uplink_start(lg_worker *w, lg_xfer *x, const lg_uplink_req *rq)
{
    const struct lg_url *e = w->proxy_env ? NULL : find_url(w, rq->url);
    if (!e || !e->own || !uplink_headers_plain(rq->headers)) return false;
    size_t u = (size_t)(e - w->urls);
    lg_uconn *c = lg_xmalloc(sizeof *c);
    *c = (lg_uconn){.url = (uint8_t)u,
                    .body = rq->body,
                    .body_len = rq->body_len,
                    .header = rq->header,
                    .connected = rq->connected};
    x->xb = (lg_xbody){.own = c};
    uplink_request_head(&c->req, &e->target, rq->headers, rq->body_len);
    c->total = c->req.len + c->body_len;
    int fd = idle_take(w, e->idle);
    if (fd >= 0)
        own_begin(w, x, fd, true, false);
    else if (!own_connect(w, x)) {
        own_release(w, x);
        return false;
    }
    return true;
}

/* ---- fire-and-forget transfers ------------------------------------------------------ */

typedef struct lg_detached {
    lg_xfer xfer;
    lg_worker *w;
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    struct lg_detached *prev, *next;
} lg_detached;

static size_t discard_body(char *p, size_t size, size_t n, void *ud)
{
    (void)p, (void)ud;
    return size * n;
}

static void detached_free(lg_detached *d)
{
    lg_worker *w = d->w;
    if (d->prev)
        d->prev->next = d->next;
    else if (w->detached == d)
        w->detached = d->next;
    if (d->next) d->next->prev = d->prev;
    curl_multi_remove_handle(w->multi, d->easy);
    curl_easy_cleanup(d->easy);
    curl_slist_free_all(d->headers);
    free(d->body);
    free(d);
}

static void detached_done(lg_xfer *x, CURLcode rc)
{
    (void)rc;
    detached_free(x->owner);
}

void worker_post_detached(lg_worker *w, const char *url, const char *json)
{
    lg_detached *d = lg_xcalloc(1, sizeof *d);
    d->w = w;
    d->xfer = (lg_xfer){.done = detached_done, .owner = d};
    d->body = lg_xstrdup(json);
    d->headers = lg_xcheck(curl_slist_append(NULL, "Content-Type: application/json"));
    d->easy = lg_xcheck(curl_easy_init());
    curl_easy_setopt(d->easy, CURLOPT_URL, url);
    curl_easy_setopt(d->easy, CURLOPT_PRIVATE, &d->xfer);
    curl_easy_setopt(d->easy, CURLOPT_HTTPHEADER, d->headers);
    curl_easy_setopt(d->easy, CURLOPT_POSTFIELDS, d->body);
    curl_easy_setopt(d->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(d->easy, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(d->easy, CURLOPT_WRITEFUNCTION, discard_body);
    d->next = w->detached;
    if (w->detached) w->detached->prev = d;
    w->detached = d;
    if (add_xfer(w, d->easy, false) != CURLM_OK) detached_free(d);
}

/* ---- the loop ---------------------------------------------------------------------- */

/* Runs the ready shards. A resume inside MHD's own callbacks needs one more pass to take
 * effect, and so does a connection libmicrohttpd leaves on its ready list (after each
 * response, until a read of the next request would block: its timeout is then 0), so up to
 * four passes while some shard is ready again, without an epoll_wait of the worker's in
 * between. */
static void run_mhd(lg_worker *w)
{
    for (int pass = 0; pass < 4 && w->mhd_dirty; pass++) {
        w->mhd_dirty = false;
        for (size_t i = 0; i < w->n_shards; i++) {
            lg_shard *s = &w->shards[i];
            if (!s->ready) continue;
            s->ready = false;
            MHD_run(s->mhd);
            MHD_UNSIGNED_LONG_LONG to;
            if (MHD_get_timeout(s->mhd, &to) == MHD_YES && to == 0) {
                s->ready = true;
                w->mhd_dirty = true;
            }
        }
    }
}

/* Runs the daemons that are due and the timeout action libcurl asked for "now"
 * (on_curl_timer) until neither has more to do: a request libmicrohttpd hands over starts its
 * transfer, and the response head that transfer may bring reaches libmicrohttpd, in the same
 * iteration. Bounded; what is left runs in the next iteration, whose epoll_wait then does
 * not block. */
static void run_pending(lg_worker *w)
{
    for (int pass = 0; pass < 4 && (w->mhd_dirty || w->curl_due); pass++) {
        run_mhd(w);
        drain_curl_messages(w); /* an own connection's request to send (worker_uplink_start) */
        if (w->curl_due) {
            w->curl_due = false;
            curl_action(w, CURL_SOCKET_TIMEOUT, 0);
            drain_curl_messages(w);
            flush_all(w);
        }
    }
}

static void ready_all(lg_worker *w)
{
    for (size_t i = 0; i < w->n_shards; i++)
        w->shards[i].ready = true;
    w->mhd_dirty = true;
}

/* Between two requests a keep-alive connection holds its pool zeroed whole, for as long as
 * its client waits (an SDK's pool of idle connections: seconds to minutes). At the tick
 * after a request ended, a connection that is still open (its fd slot unchanged: a close
 * forgets it, see on_connection) and has no new request gives back the zero pages of its
 * last direct stream's buffer, as a waiting request does (queue_waiting_pool), in z. */
static void idle_pools(lg_worker *w, lg_zero_runs *z)
{
    const lg_conn_ended *e = (const lg_conn_ended *)w->ended.p;
    for (size_t i = 0; i < w->ended.len / sizeof *e; i++) {
        lg_fdslot *s = &w->fdmap[e[i].fd];
        if (!s->conn || s->gen != e[i].gen || s->req || !s->pool) continue;
        release_zero_pages(z, s->pool, s->pool_len);
        s->pool = NULL;
    }
    lg_buf_reset(&w->ended);
}

/* The tick's checks of each live request (ops->tick: an upstream's timeouts, a keep-alive
 * comment, a slow client's stuck tail) run in rounds: tick_all starts one at each tick (one
 * still running goes on instead), and each loop iteration checks the next TICK_SLICE
 * requests from the cursor w->tick_next (on_completed moves it past a request that leaves).
 * Checking all at once cost 0.23-0.39 ms at 1,000 paced streams, a few cache misses each,
 * and every stream's next event waited behind it four times a second (tests/bench/
 * HISTORY.md, issue 28, "tick"); a slice costs ~20 us. A round ends within live /
 * TICK_SLICE iterations: the loop does not block meanwhile. */
static void tick_some(lg_worker *w)
{
    uint64_t stuck = (uint64_t)w->srv->cfg->client_timeout_s * 1000000000ull;
    for (int i = 0; i < TICK_SLICE && w->tick_next != &w->live; i++) {
        lg_req *r = w->tick_next;
        w->tick_next = r->next; /* before the tick, which may retire r */
        if (lg_fifo_len(&r->tail) && w->now_ns - r->tail_ns > stuck)
            client_hung_up(w, r); /* the client stopped reading mid-chunk */
        else if (r->ops->tick)
            r->ops->tick(r, w->now_ns);
    }
}

static void tick_all(lg_worker *w)
{
    lg_zero_runs z = {.n = 0};
    if (w->tick_next == &w->live) w->tick_next = w->live.next; /* else the last one goes on */
    idle_pools(w, &z);
    give_back(z.iov, z.n);
    idle_expire(w);
}

static void shutdown_all(lg_worker *w)
{
    lg_req *r = w->live.next;
    while (r != &w->live) {
        lg_req *next = r->next;
        if (r->ops->shutdown) r->ops->shutdown(r);
        r = next;
    }
}

/* Stops the shards' daemons, closing their connections (their requests complete through
 * on_completed); afterwards the worker has none. */
static void stop_shards(lg_worker *w)
{
    for (size_t i = 0; i < w->n_shards; i++)
        MHD_stop_daemon(w->shards[i].mhd);
    w->n_shards = 0;
}

/* Before the daemons stop: every connection resumed, unsent tails dropped. */
static void resume_all(lg_worker *w)
{
    for (lg_req *r = w->live.next; r != &w->live; r = r->next) {
        lg_fifo_free(&r->tail);
        r->direct = false;
        worker_resume(r);
    }
}

/* Shard s's set is readable: its daemon runs in this pass (run_mhd). */
static void shard_reported(lg_worker *w, size_t s)
{
    w->shards[s].ready = w->shards[s].reported = true;
    w->mhd_dirty = true;
}

/* ---- accepting clients (listener.h) --------------------------------------------------- */

/* Starts or stops watching the listener: EPOLLEXCLUSIVE, so that a new connection wakes one
 * (rarely more) of the workers waiting in epoll_wait (listener.h). A watch that cannot be
 * taken out counts as out: the socket leaves the set when the last worker closes it. */
static void watch_listener(lg_worker *w, bool on)
{
    if (w->accepting == on) return;
    int fd = w->listen_fd;
    if (on ? ep_ctl(w, EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLEXCLUSIVE, ev_pack(TAG_LISTEN, 0, fd))
           : epoll_ctl(w->epfd, EPOLL_CTL_DEL, fd, NULL)) {
        perror("loopguard: epoll_ctl (listener)");
        if (on) return;
    }
    w->accepting = on;
}

/* The first of the workers that share w's listener (worker_new's `before` chain). */
static lg_worker *first_worker(lg_worker *w)
{
    while (w->before)
        w = w->before;
    return w;
}

/* A worker's connections as the others see them when they place one: its own (UINT_MAX
 * while it takes none) and those handed to it and not yet taken. */
static unsigned placed(lg_worker *o)
{
    unsigned n = atomic_load_explicit(&o->load, memory_order_relaxed);
    return n == UINT_MAX ? n : n + handoff_count(&o->handoff);
}

/* The other worker with room that holds the fewest connections (balance.h), as each
 * published them (publish_load), and that count in *fewest; NULL (and UINT_MAX) when no
 * other takes connections. */
static lg_worker *least_other(lg_worker *w, unsigned *fewest)
{
    lg_worker *least = NULL;
    *fewest = UINT_MAX;
    for (lg_worker *o = first_worker(w); o; o = o->after) {
        unsigned n = o == w ? UINT_MAX : placed(o);
        if (n < *fewest) *fewest = n, least = o;
    }
    return least;
}

/* Whether the worker watches the listener: while it takes connections (under its limit, not
 * draining, not shedding). Where a connection goes is accept_clients' choice (balance.h). */
static void watch_while_taking(lg_worker *w)
{
    watch_listener(w, atomic_load_explicit(&w->load, memory_order_relaxed) != UINT_MAX);
}

/* This thread's CPU time (user and system), in ns. */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    real_clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Whether the worker sheds connections over the next tick, and how many (balance.h): the
 * other workers' shares are read as they published them at their own last ticks. */
static void shed_measure(lg_worker *w, unsigned permille)
{
    unsigned least = permille; /* over the workers that take connections (publish_load) */
    for (const lg_worker *o = first_worker(w); o; o = o->after)
        if (o != w && atomic_load_explicit(&o->load, memory_order_relaxed) != UINT_MAX) {
            unsigned p = atomic_load_explicit(&o->permille, memory_order_relaxed);
            if (p < least) least = p;
        }
    w->shed = balance_shed(atomic_load_explicit(&w->clients, memory_order_relaxed), permille,
                           w->share_before, least);
    w->shedding = w->shed > 0;
    w->share_before = permille;
    publish_load(w);
}

bool worker_shed(lg_worker *w)
{
    if (!w->shed) return false;
    w->shed--;
    return true;
}

/* Measured at each tick: the share of a core the worker used, whether it sheds, and so
 * whether it watches the listener. The measure is the worker's own work, not the time it
 * was out of epoll_wait: that counts the waits for a core that other processes cause (an
 * inference server's own threads), which another worker on the same cores would not
 * shorten. */
static void tick_measure(lg_worker *w)
{
    uint64_t cpu = thread_cpu_ns(), wall = w->now_ns - w->tick_ns;
    unsigned permille = wall ? (unsigned)((cpu - w->tick_cpu_ns) * 1000 / wall) : 0;
    w->tick_cpu_ns = cpu;
    w->tick_ns = w->now_ns;
    atomic_store_explicit(&w->permille, permille, memory_order_relaxed);
    shed_measure(w, permille);
    watch_while_taking(w);
}

/* accept4's errors that are a connection's, not the listener's: Linux passes a new
 * connection's pending network error to accept (accept(2)), and the next one may be fine. */
static bool accept_retry(int err)
{
    switch (err) {
    case EINTR:
    case ECONNABORTED:
    case EPROTO:
    case ENETDOWN:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case ENONET:
    case EHOSTUNREACH:
    case EOPNOTSUPP:
    case ENETUNREACH:
        return true;
    default:
        return false;
    }
}

/* A connection accepted here, or handed here, goes to the next shard in turn.
 * MHD_add_connection applies edge_accept (the per-address cap) and the shard's limit, and
 * closes a socket it refuses. */
static void add_client(lg_worker *w, int fd, const struct sockaddr_storage *sa, socklen_t len)
{
    lg_shard *s = &w->shards[w->next_shard];
    w->next_shard = (w->next_shard + 1) % w->n_shards;
    if (MHD_add_connection(s->mhd, fd, (const struct sockaddr *)sa, len) == MHD_YES) {
        s->ready = true; /* its first read, if the request is there already */
        w->mhd_dirty = true;
    }
}

/* Hands connection fd, accepted by another worker, to o (balance.h), which takes it at its
 * next wake-up (take_handed): true, and o owns the socket from here on; false when o has
 * left the listener since its load was read (handoff.h), and the caller keeps it. */
static bool hand_over(lg_worker *o, int fd, const struct sockaddr_storage *sa, socklen_t len)
{
    if (!handoff_put(&o->handoff, fd, sa, len)) return false;
    worker_wake(o);
    return true;
}

/* Takes the connections other workers handed to this one: its own, or closed once it has
 * left the listener (a drain refuses new connections), which also shuts its queue. */
static void take_handed(lg_worker *w)
{
    lg_handed *q;
    size_t n = handoff_take(&w->handoff, w->left, &q);
    for (size_t i = 0; i < n; i++) {
        if (w->left)
            close(q[i].fd);
        else
            add_client(w, q[i].fd, &q[i].sa, q[i].len);
    }
    lg_xfree(q);
}

/* Takes up to ACCEPT_BATCH connections waiting on the listener (what is left wakes a worker
 * again: the watch is level-triggered). Each goes to the worker that holds the fewest: this
 * one while it holds no more than any other, else handed over (hand_over), as HAProxy's
 * accepting thread dispatches to the least loaded one. At the worker's own limit
 * (max_connections over the workers) it stops watching until a tick finds room; meanwhile
 * the kernel holds new connections in its backlog, as nginx and HAProxy leave them there at
 * worker_connections or maxconn. Out of descriptors or memory (EMFILE, ENFILE, ENOBUFS,
 * ENOMEM: the process's, not the worker's), it stops watching until its next tick, and says
 * so each time, as nginx pauses its accepts and logs. */
static void accept_clients(lg_worker *w)
{
    for (int i = 0; i < ACCEPT_BATCH && w->accepting; i++) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;
        int fd = accept4(w->listen_fd, (struct sockaddr *)&sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (accept_retry(errno)) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                perror("loopguard: accept");
                watch_listener(w, false);
            }
            return;
        }
        unsigned others;
        lg_worker *o = least_other(w, &others);
        if (!o || balance_takes(placed(w), others) || !hand_over(o, fd, &sa, len))
            add_client(w, fd, &sa, len);
        watch_while_taking(w); /* at its limit it stops */
    }
}

/* At a drain: the worker accepts no more, and leaves the listener (the last closes it). */
static void stop_accepting(lg_worker *w)
{
    if (w->left) return;
    watch_listener(w, false);
    w->left = true;
    publish_load(w);
    take_handed(w); /* closes them: a drain refuses new connections */
    listener_leave(w->listener);
}

/* A batch's client input runs before its upstream reads. The daemons' events (TAG_MHD: new
 * connections, new requests, a keep-alive client's next request) mark their shards ready and
 * are taken out of the batch (tag 0: no event); the daemons then run, with libcurl's "now"
 * action (run_pending), so a request read in this batch goes upstream before the batch's
 * token reads, each of which costs a token's way through the guard and out (~15-30 us; a
 * batch holds up to MAX_EVENTS). Taken in the batch's order instead, a request waited for
 * its place behind the reads, which made loopguard's added time to first token at 1,000
 * paced streams several times nginx's while its added latency per event was not
 * (tests/bench/HISTORY.md, issue 28). A token read later in the batch waits behind the
 * batch's requests instead, which are few (one per stream every ~60 tokens). What the
 * daemons see of a connection is the same either way: a client's hang-up during its request
 * reaches the worker's own watch (TAG_CLIENT, below), and an event of the batch that names a
 * connection the daemons closed meanwhile finds its slot changed (client_slot). */
static void requests_first(lg_worker *w, struct epoll_event *evs, int n)
{
    for (int i = 0; i < n; i++) {
        uint64_t d = evs[i].data.u64;
        if ((unsigned)(d >> 56) != TAG_MHD) continue;
        shard_reported(w, (d >> 32) & 0xffffff);
        evs[i].data.u64 = 0;
    }
    run_pending(w);
    flush_all(w);
}

/* Client input that came during a long batch: once the batch has run REQUESTS_WAIT_NS since
 * it began or since its last look (`looked`; the clock is read every CLOCK_EVERY events), the
 * worker looks into the shards' sets (one zero-timeout epoll_wait of shards_epfd, which holds
 * them and nothing else) and runs the daemons whose set is readable, as requests_first does,
 * so a request that arrives mid-batch waits for at most about that long rather than for the
 * rest of the batch (a keep-alive client sends its next request some 40 us after its last
 * response ended, often while the batch that ended it still runs). The bound is a time, not a
 * count of events: an event costs from a few microseconds to tens (a token, a stream's end,
 * a request's start), and a count of 64 let a request wait ~1 ms behind a long batch
 * (tests/bench/HISTORY.md, issue 28, ttft3). Short batches (the usual case at a paced load)
 * never read the clock. The worker's own set still holds the shards' sets (level-triggered):
 * a set the daemon has emptied here is not reported by the next epoll_wait, one with work
 * left is. Returns the time of the last look. */
static uint64_t requests_between(lg_worker *w, uint64_t looked)
{
    uint64_t now = lg_now_ns();
    if (now - looked < REQUESTS_WAIT_NS) return looked;
    struct epoll_event evs[WORKER_SHARDS];
    int n = epoll_pwait(w->shards_epfd, evs, WORKER_SHARDS, 0, NULL);
    for (int i = 0; i < n; i++)
        shard_reported(w, evs[i].data.u32);
    run_pending(w);
    flush_all(w);
    return now;
}

/* The calling worker's thread takes the configured scheduling policy (worker_scheduling).
 * At a paced load a token wakes a worker that has nothing else to do: under SCHED_OTHER
 * the wake-up preempts whatever runs on that core (the inference server's own threads, the
 * client), the worker relays the one token and sleeps again. Under SCHED_BATCH a wake-up
 * does not preempt (sched(7): the policy "without interactivity causing extra preemptions";
 * a woken worker still runs at once on an idle core, else when the running task sleeps or
 * at the scheduler's tick), so a worker finds the tokens that came meanwhile and relays
 * them in one pass. At 1,000 paced streams on make bench's 2-core host this cut the
 * worker's sleeps per event from 0.43 to 0.39 (nginx's: 0.39) and its CPU per event by 4 %,
 * with no rise in the added p50 or p99, and with both cores kept busy by other processes
 * its latency was no worse than SCHED_OTHER's (tests/bench/HISTORY.md, issue 28, sched);
 * "normal" stays for a host where that measures otherwise. Refusal (a sandbox that filters
 * sched_setscheduler) is reported once and the worker runs as it started. */
static void set_scheduling(const lg_worker *w)
{
    if (w->srv->cfg->worker_scheduling != LG_SCHED_BATCH) return;
    struct sched_param sp = {.sched_priority = 0};
    int rc = pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
    static atomic_flag told = ATOMIC_FLAG_INIT;
    if (rc && !atomic_flag_test_and_set(&told))
        fprintf(stderr, "loopguard: worker_scheduling batch refused (%s): workers run as started\n",
                strerror(rc));
}

static void *worker_main(void *arg)
{
    lg_worker *w = arg;
    struct epoll_event evs[MAX_EVENTS];
    uint64_t next_tick = lg_now_ns() + TICK_NS;
    bool shut = false;
    uint64_t stop_at = 0;
    curl_fd_state = w->curl_fds;
    curl_fd_len = w->fdmap_len;
    mhd_worker = w;
    set_scheduling(w);
    lg_buf_cache_begin();    /* the small buffers of one request serve the next (buf.h) */
    lg_xalloc_cache_begin(); /* and the blocks libcurl and cJSON drop (xalloc.h) */

    for (;;) {
        /* libmicrohttpd's own timeouts (an idle or stalled client, client_timeout_s) are
         * whole seconds: every shard runs at each tick for them (below) rather than asking
         * each daemon for its timeout in every iteration. A shard with work left after a
         * run (timeout 0) is marked ready by run_mhd. */
        uint64_t left = next_tick > w->now_ns ? next_tick - w->now_ns : 0;
        int timeout = left < TICK_NS ? (int)((left + 999999) / 1000000) : (int)(TICK_NS / 1000000);
        if (w->n_releases) { /* queued pool pages go back within RELEASE_WAIT_NS */
            uint64_t due = w->releases_since + RELEASE_WAIT_NS;
            uint64_t wait_ms = due > w->now_ns ? (due - w->now_ns + 999999) / 1000000 : 0;
            if (wait_ms < (uint64_t)timeout) timeout = (int)wait_ms;
        }
        if (w->curl_due || w->mhd_dirty || w->flush_head || w->body_due.len ||
            w->tick_next != &w->live)
            timeout = 0; /* work left or due now (a tick's round, tick_some): do not block */
        int n = epoll_wait(w->epfd, evs, MAX_EVENTS, timeout);
        if (n < 0 && errno != EINTR) {
            perror("loopguard: epoll_wait");
            break;
        }
        w->now_ns = lg_now_ns();
        /* Parked sockets that reported anything are unparked before any event of the batch
         * runs libcurl (events run libcurl's "now" action too, see below): a parked
         * socket's read checks are answered from its being parked (curl_aware_poll), which
         * must mean that this epoll_wait reported nothing for it. Tag 0 is no event. */
        for (int i = 0; i < n; i++)
            if ((unsigned)(evs[i].data.u64 >> 56) == TAG_CURL_SOCK &&
                curl_unpark(w, (int)(uint32_t)evs[i].data.u64))
                evs[i].data.u64 = 0;
        requests_first(w, evs, n);
        uint64_t looked = w->now_ns; /* the batch's last look for client input */
        for (int i = 0; i < n; i++) {
            if (i && i % CLOCK_EVERY == 0) looked = requests_between(w, looked);
            uint64_t d = evs[i].data.u64;
            unsigned tag = (unsigned)(d >> 56);
            int fd = (int)(uint32_t)d;
            uint64_t buf;
            switch (tag) { /* TAG_MHD: requests_first */
            case TAG_CURL_TIMER:
                if (read(w->curl_timerfd, &buf, sizeof buf) < 0 && errno != EAGAIN)
                    perror("loopguard: timerfd read");
                w->curl_deadline_ms = 0; /* fired: the next announcement must re-arm */
                w->curl_due = true;      /* run_pending calls libcurl */
                break;
            case TAG_LISTEN:
                accept_clients(w);
                break;
            case TAG_WAKE: /* a drain, a stop, or connections handed over (hand_over) */
                if (read(w->wake_fd, &buf, sizeof buf) < 0 && errno != EAGAIN)
                    perror("loopguard: eventfd read");
                take_handed(w);
                watch_while_taking(w);
                break;
            case TAG_CURL_SOCK: {
                if (curl_unpark(w, fd)) break; /* parked since the batch began */
                lg_xfer *x = w->up_xfers[fd];
                if (x && x->xb.own) {
                    own_event(w, x, evs[i].events);
                    break;
                }
                if (!x && (w->curl_fds[fd] & CFD_OWN)) {
                    idle_event(w, fd);
                    break;
                }
                if (x && x->xb.phase == XB_BODY) { /* the worker reads the body */
                    read_body(w, x);
                    break;
                }
                int flags = (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                            (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                            (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
                curl_read_fd = flags & CURL_CSELECT_IN ? fd : -1;
                curl_action(w, fd, flags);
                curl_read_fd = -1;
                curl_drained = false;
                break;
            }
            case TAG_CLIENT: {
                lg_fdslot *s = client_slot(w, fd, (uint32_t)(d >> 32) & 0xffffff);
                lg_req *r = s ? s->req : NULL;
                if (s && !r) {
                    /* Hung up between requests: libmicrohttpd closes it once it reads
                     * the end (rearmed, see above); the level-triggered watch must not
                     * report it again meanwhile. */
                    rearm_mhd_conn(w, s->conn, fd);
                    unwatch_socket(w, fd);
                } else if (r && (evs[i].events & ~(uint32_t)EPOLLOUT))
                    client_hung_up(w, r);
                else if (r)
                    send_tail(w, r);
                break;
            }
            }
            drain_curl_messages(w);
            flush_all(w); /* each event's tokens leave now, not at the end of the batch */
            /* And what the event made due runs now too, in the order the events came: a
             * response head or a stream's end reaches the client without waiting behind the
             * rest of the batch. */
            if (w->mhd_dirty || w->curl_due) {
                run_pending(w);
                flush_all(w);
            }
        }
        tick_some(w);
        drain_curl_messages(w);
        flush_all(w);
        run_pending(w);
        if (w->now_ns >= next_tick) {
            next_tick = w->now_ns + TICK_NS;
            tick_all(w);
            edge_tick(w);
            tick_measure(w);
            ready_all(w); /* libmicrohttpd's timeouts, see above */
            run_pending(w);
        }
        if (w->n_releases && w->now_ns - w->releases_since >= RELEASE_WAIT_NS) release_queued(w);
        flush_all(w); /* before the dead are freed: nothing on the list may outlive them */
        bury_the_dead(w);

        if (atomic_load(&w->srv->draining)) stop_accepting(w);
        if (atomic_load(&w->srv->stopping) && !shut) {
            shut = true;
            stop_at = w->now_ns + 2000000000ull;
            shutdown_all(w);
            flush_all(w); /* the streams' last events, and their resumes (worker_resume) */
            ready_all(w);
            run_mhd(w);
        }
        /* Pending aborts still matter at shutdown: they free GPUs. */
        if (w->left && ((w->n_live == 0 && !w->detached) || (shut && w->now_ns > stop_at))) break;
    }
    stop_accepting(w); /* (left already, unless epoll_wait failed) */
    resume_all(w);
    /* The connections left (idle between requests, or accepted with no request yet) close
     * now, as nginx closes idle connections at a graceful stop: a request sent on one after
     * this worker is done must not wait unanswered for the other workers' streams. */
    stop_shards(w);
    lg_buf_cache_end();
    lg_xalloc_cache_end();
    return NULL;
}

/* Starts the daemon of shard i, which takes the connections accept_clients gives it. */
static int shard_start(lg_worker *w, size_t i, char *err, size_t errlen)
{
    const lg_config *cfg = w->srv->cfg;
    lg_shard *s = &w->shards[i];
    /* A shard may hold all of the worker's connections: accept_clients keeps the limit. */
    s->mhd = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_USE_NO_LISTEN_SOCKET | MHD_ALLOW_SUSPEND_RESUME |
            MHD_USE_SUPPRESS_DATE_NO_CLOCK | MHD_USE_TURBO,
        0, edge_accept, w, on_access, w, MHD_OPTION_NOTIFY_COMPLETED, on_completed, w,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, w, MHD_OPTION_URI_LOG_CALLBACK, edge_uri, w,
        MHD_OPTION_CONNECTION_LIMIT, w->max_clients, MHD_OPTION_CONNECTION_TIMEOUT,
        cfg->client_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, cfg->max_header_bytes,
        MHD_OPTION_UNESCAPE_CALLBACK, http_keep_escaped, NULL, MHD_OPTION_END);
    if (!s->mhd) {
        snprintf(err, errlen, "worker %d: libmicrohttpd failed to start", w->id);
        return -1;
    }
    w->n_shards = i + 1;
    /* The daemon's own epoll fd, watched by the worker's; the tag carries the shard. */
    int epfd = s->epfd = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD)->epoll_fd;
    struct epoll_event alone = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
    if (ep_ctl(w, EPOLL_CTL_ADD, epfd, EPOLLIN, ev_pack(TAG_MHD, (uint32_t)i, epfd)) ||
        epoll_ctl(w->shards_epfd, EPOLL_CTL_ADD, epfd, &alone)) {
        snprintf(err, errlen, "worker %d: epoll_ctl: %s", w->id, strerror(errno));
        return -1;
    }
    return 0;
}

lg_worker *worker_new(lg_server *srv, int id, lg_listener *ls, lg_worker *before, size_t n_shards,
                      char *err, size_t errlen)
{
    const lg_config *cfg = srv->cfg;
    lg_worker *w = lg_xcalloc(1, sizeof *w);
    handoff_init(&w->handoff);
    w->srv = srv;
    w->id = id;
    w->live.prev = w->live.next = &w->live;
    w->tick_next = &w->live;
    w->graveyard.prev = w->graveyard.next = &w->graveyard;
    w->guard_store = guard_store_new();
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    w->shards_epfd = epoll_create1(EPOLL_CLOEXEC);
    w->curl_timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    w->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    w->fdmap_len = cfg->rlimit_nofile ? cfg->rlimit_nofile : 65536;
    w->fdmap = calloc(w->fdmap_len, sizeof *w->fdmap);
    w->curl_fds = calloc(w->fdmap_len, sizeof *w->curl_fds);
    w->up_xfers = calloc(w->fdmap_len, sizeof *w->up_xfers);
    w->body_buf = malloc(BODY_READ);
    w->mhd_conns = calloc(w->fdmap_len, sizeof *w->mhd_conns);
    w->metrics = metrics_new(srv->cfg->n_upstreams);
    if (w->epfd < 0 || w->shards_epfd < 0 || w->curl_timerfd < 0 || w->wake_fd < 0 || !w->fdmap ||
        !w->curl_fds || !w->mhd_conns || !w->up_xfers || !w->body_buf) {
        snprintf(err, errlen, "worker %d: %s", id, strerror(errno));
        goto fail;
    }

    /* The connection limit is spread evenly over the workers: one that reaches its share
     * leaves the next connections to the others (accept_clients). */
    unsigned limit = cfg->max_connections / (unsigned)srv->n_workers;
    w->max_clients = limit ? limit : 1u;
    for (size_t i = 0; i < n_shards; i++)
        if (shard_start(w, i, err, errlen) != 0) goto fail;

    w->proxy_env = proxy_env_set();
    w->multi = curl_multi_init();
    if (!w->multi) {
        snprintf(err, errlen, "worker %d: curl_multi_init failed", id);
        goto fail;
    }
    curl_multi_setopt(w->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
    curl_multi_setopt(w->multi, CURLMOPT_SOCKETDATA, w);
    curl_multi_setopt(w->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
    curl_multi_setopt(w->multi, CURLMOPT_TIMERDATA, w);
    /* Keep-alive pool to the upstreams: one connection per concurrent stream. */
    curl_multi_setopt(w->multi, CURLMOPT_MAXCONNECTS, (long)w->max_clients);

    if (ep_ctl(w, EPOLL_CTL_ADD, w->curl_timerfd, EPOLLIN,
               ev_pack(TAG_CURL_TIMER, 0, w->curl_timerfd)) ||
        ep_ctl(w, EPOLL_CTL_ADD, w->wake_fd, EPOLLIN, ev_pack(TAG_WAKE, 0, w->wake_fd))) {
        snprintf(err, errlen, "worker %d: epoll_ctl: %s", id, strerror(errno));
        goto fail;
    }
    /* Every worker watches the listener from the start, holding no connection yet
     * (watch_while_taking); those watching are woken in the order they registered. */
    w->listener = ls;
    w->listen_fd = ls->fd;
    w->before = before;
    if (before) before->after = w;
    watch_listener(w, true);
    if (!w->accepting) {
        snprintf(err, errlen, "worker %d: epoll_ctl: %s", id, strerror(errno));
        goto fail;
    }
    listener_join(ls);
    return w;
fail:
    worker_free(w);
    return NULL;
}

int worker_start(lg_worker *w)
{
    return pthread_create(&w->thread, NULL, worker_main, w) == 0 ? 0 : -1;
}

void worker_wake(lg_worker *w)
{
    uint64_t one = 1;
    if (write(w->wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        perror("loopguard: eventfd write");
}

void worker_join(lg_worker *w)
{
    pthread_join(w->thread, NULL);
}

void worker_free(lg_worker *w)
{
    if (!w) return;
    handoff_free(&w->handoff); /* what was handed to a worker that never ran */
    stop_shards(w);            /* a worker that never ran */
    bury_the_dead(w);
    while (w->detached)
        detached_free(w->detached);
    while (w->n_spare)
        curl_easy_cleanup(w->spare[--w->n_spare]);
    while (w->n_spare_guards)
        guard_free(w->spare_guards[--w->n_spare_guards]);
    guard_store_free(w->guard_store);
    while (w->n_urls) {
        struct lg_url *u = &w->urls[--w->n_urls];
        curl_url_cleanup(u->parsed);
        free(u->url);
        uplink_target_free(&u->target);
    }
    while (w->n_idle) {
        lg_idle *p = &w->idle[--w->n_idle];
        while (p->n)
            close(p->fds[--p->n]);
        free(p->origin);
        lg_xfree(p->fds);
        lg_xfree(p->since);
    }
    if (w->multi) curl_multi_cleanup(w->multi);
    if (w->epfd >= 0) close(w->epfd);
    if (w->shards_epfd >= 0) close(w->shards_epfd);
    if (w->curl_timerfd >= 0) close(w->curl_timerfd);
    if (w->wake_fd >= 0) close(w->wake_fd);
    metrics_free(w->metrics);
    free(w->unwatched);
    lg_buf_free(&w->ended);
    free(w->fdmap);
    free(w->curl_fds);
    free(w->up_xfers);
    free(w->body_buf);
    lg_buf_free(&w->body_due);
    free(w->mhd_conns);
    free(w);
}
