/* incident.c — the incident log: a bounded hand-off queue from the workers to one writer
 * thread that appends JSON Lines to a file, and a ring of recent records.
 *
 * A record is shared by the queue (until the writer has written it) and the recent ring
 * (until newer records push it out), so it carries a reference count; whoever drops the
 * last reference frees it. Workers hold the mutex only for a few pointer moves: truncating
 * an oversized record happens before, freeing evicted records after. The writer takes the
 * whole queue in one go and writes it with as few write(2) calls as possible (one buffer
 * per batch), so a burst of incidents costs one system call, not one per record.
 *
 * Failure policy: the file is opened O_APPEND (several processes and logrotate's
 * copytruncate stay safe); a failed write closes the file and reopens it after a back-off,
 * counting every record it could not write as a write error. A write that stopped in the
 * middle of a line (disk full) is followed by a newline before the next record, so one
 * torn line never corrupts the next. */
#include "proxy/incident.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "proxy/xalloc.h"

#define QUEUE_MAX_RECORDS   4096
#define QUEUE_MAX_BYTES     (32u << 20) /* what may wait for the disk at most */
#define REOPEN_BACKOFF_MS   1000        /* after a failed open or write */
#define TRUNCATE_MARK       "...[cut]"
#define TRUNCATE_MAX_ROUNDS 4

/* One record; `text` has no newline. Shared by the queue and the recent ring. */
typedef struct rec {
    atomic_uint refs;
    size_t len;
    char *text;
} rec;

struct incident_log {
    char *path; /* NULL: no file, no thread */
    pthread_mutex_t mu;
    pthread_cond_t wake; /* the writer waits for records, a reopen or stop */
    pthread_cond_t done; /* flushers wait for the writer to catch up */
    pthread_t thread;

    /* Guarded by mu. */
    rec *queue[QUEUE_MAX_RECORDS]; /* ring: head .. head+q_len */
    size_t q_head, q_len, q_bytes;
    rec **recent; /* ring of n_recent slots, next is the oldest once full */
    unsigned n_recent, recent_next, recent_len;
    uint64_t seq_queued, seq_done; /* records queued / taken off and finished by the writer */
    bool reopen_req, stop;

    /* Writer-thread only. */
    int fd;                   /* -1 while the file is not open */
    bool torn;                /* the file does not end in a newline */
    struct timespec retry_at; /* no open attempt before this (back-off) */

    size_t max_record_bytes; /* 0: no limit */
    _Atomic uint64_t submitted, written, dropped, write_errors, reopens, truncated;
};

static void rec_unref(rec *r)
{
    if (r && atomic_fetch_sub_explicit(&r->refs, 1, memory_order_acq_rel) == 1) {
        free(r->text);
        free(r);
    }
}

static void count(_Atomic uint64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* ------------------------------------------------------------------------------------- */
/* Truncation (runs on the submitting thread, outside the lock)                           */

/* Collects the string nodes under `j` into *v (grown as needed). O(nodes). */
static void collect_strings(cJSON *j, cJSON ***v, size_t *n, size_t *cap)
{
    for (cJSON *c = j->child; c; c = c->next) {
        if (cJSON_IsString(c)) {
            if (*n == *cap) {
                *cap = *cap ? *cap * 2 : 16;
                *v = lg_xrealloc(*v, *cap * sizeof **v);
            }
            (*v)[(*n)++] = c;
        } else {
            collect_strings(c, v, n, cap);
        }
    }
}

/* How many bytes cutting every string longer than keep + mark to `keep` bytes plus the
 * mark saves. */
static size_t cut_saving(const size_t *lens, size_t n, size_t keep, size_t mark)
{
    size_t saved = 0;
    for (size_t i = 0; i < n; i++)
        if (lens[i] > keep + mark) saved += lens[i] - keep - mark;
    return saved;
}

/* Cuts the longest strings of the record (JSON object text) to a common length, the
 * largest that brings the record within `max` bytes ("water-filling": an excerpt and a
 * prompt both keep their beginnings rather than one vanishing), marks each cut string
 * with TRUNCATE_MARK and the record with "truncated": true. Removing raw bytes removes at
 * least as many printed ones (escapes only lengthen), so one round normally fits; a second
 * handles rounding. Returns the new malloc'd text (the old is freed) with *len updated, or
 * NULL when the text is not a JSON object or cannot be made to fit (keys and numbers
 * alone too long); the old text is freed then too. O(size × log size). */
static char *truncate_record(char *text, size_t *len, size_t max)
{
    static const size_t mark = sizeof TRUNCATE_MARK - 1;
    cJSON *j = cJSON_ParseWithLength(text, *len), **strs = NULL;
    size_t n = 0, cap = 0, *lens = NULL;
    free(text);
    text = NULL;
    if (!cJSON_IsObject(j)) goto done;
    cJSON_DeleteItemFromObjectCaseSensitive(j, "truncated");
    if (!cJSON_AddTrueToObject(j, "truncated")) lg_oom(0);
    collect_strings(j, &strs, &n, &cap);
    if (n) lens = lg_xmalloc(n * sizeof *lens);
    for (int round = 0; round < TRUNCATE_MAX_ROUNDS; round++) {
        text = lg_xcheck(cJSON_PrintUnformatted(j));
        *len = strlen(text);
        if (*len <= max) goto done;
        free(text);
        text = NULL;
        size_t excess = *len - max, hi = 0, lo = 0;
        for (size_t i = 0; i < n; i++)
            if ((lens[i] = strlen(strs[i]->valuestring)) > hi) hi = lens[i];
        if (cut_saving(lens, n, 0, mark) < excess) goto done; /* cannot fit */
        while (lo < hi) { /* the largest keep whose saving still covers the excess */
            size_t mid = lo + (hi - lo + 1) / 2;
            if (cut_saving(lens, n, mid, mark) >= excess)
                lo = mid;
            else
                hi = mid - 1;
        }
        for (size_t i = 0; i < n; i++) {
            if (lens[i] <= lo + mark) continue;
            size_t keep = lo;
            while (keep > 0 && ((unsigned char)strs[i]->valuestring[keep] & 0xC0) == 0x80)
                keep--; /* never split a UTF-8 sequence */
            memcpy(strs[i]->valuestring + keep, TRUNCATE_MARK, mark + 1);
        }
    }
done:
    free(strs);
    free(lens);
    cJSON_Delete(j);
    return text;
}

/* ------------------------------------------------------------------------------------- */
/* The writer thread                                                                      */

static void now_plus_ms(struct timespec *ts, long ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) ts->tv_sec++, ts->tv_nsec -= 1000000000L;
}

static bool backoff_over(const struct timespec *at)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > at->tv_sec || (now.tv_sec == at->tv_sec && now.tv_nsec >= at->tv_nsec);
}

/* Opens the log for appending and sets *torn when the file does not end in a newline (a
 * write cut short by a full disk, or a crash): the next record then starts on a fresh
 * line. Read access is only wanted for that check. Returns the fd or -1 (errno set). */
static int open_log(const char *path, bool *torn)
{
    /* The process's own stdout or stderr, duplicated: open(2) on /dev/std* fails where they
     * are sockets (journald, a container runtime's or node's pipes), and a line written to
     * them is never torn by this process. */
    bool out = !strcmp(path, "/dev/stdout"), err = !strcmp(path, "/dev/stderr");
    if (out || err) {
        *torn = false;
        return fcntl(out ? STDOUT_FILENO : STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    }
    const int flags = O_APPEND | O_CREAT | O_CLOEXEC;
    int fd = open(path, O_RDWR | flags, 0640);
    if (fd < 0 && errno == EACCES) fd = open(path, O_WRONLY | flags, 0640);
    *torn = false;
    if (fd < 0) return -1;
    off_t end = lseek(fd, 0, SEEK_END);
    char last;
    if (end > 0 && pread(fd, &last, 1, end - 1) == 1) *torn = last != '\n';
    return fd;
}

/* Closes the file (if open) and opens `path` again; on failure the next attempt waits
 * for the back-off. */
static void writer_reopen(incident_log *l)
{
    if (l->fd >= 0) close(l->fd);
    l->fd = open_log(l->path, &l->torn);
    if (l->fd < 0) now_plus_ms(&l->retry_at, REOPEN_BACKOFF_MS);
}

/* Appends the batch as one buffer. Records the file took whole count as written, the
 * rest as write errors. */
static void writer_write(incident_log *l, rec **batch, size_t n)
{
    if (l->fd < 0 && backoff_over(&l->retry_at)) writer_reopen(l);
    if (l->fd < 0) {
        count(&l->write_errors, n);
        return;
    }
    size_t total = l->torn ? 1 : 0, off = 0;
    for (size_t i = 0; i < n; i++)
        total += batch[i]->len + 1;
    char *buf = lg_xmalloc(total);
    if (l->torn) buf[off++] = '\n';
    size_t start = off; /* bytes before the first record */
    for (size_t i = 0; i < n; i++) {
        memcpy(buf + off, batch[i]->text, batch[i]->len);
        off += batch[i]->len;
        buf[off++] = '\n';
    }
    size_t done = 0;
    while (done < total) {
        ssize_t w = write(l->fd, buf + done, total - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    free(buf);
    /* Which records ended within `done` bytes? */
    size_t whole = 0, end = start;
    while (whole < n && (end += batch[whole]->len + 1) <= done)
        whole++;
    count(&l->written, whole);
    if (done < total) {
        count(&l->write_errors, n - whole);
        /* Closed and reopened after the back-off; open_log sees whether a line was torn. */
        close(l->fd);
        l->fd = -1;
        now_plus_ms(&l->retry_at, REOPEN_BACKOFF_MS);
    } else {
        l->torn = false;
    }
}

static void *writer_main(void *arg)
{
    incident_log *l = arg;
    rec *batch[QUEUE_MAX_RECORDS];
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->q_len && !l->reopen_req && !l->stop)
            pthread_cond_wait(&l->wake, &l->mu);
        if (!l->q_len && !l->reopen_req) break; /* stop, and nothing left */
        size_t n = l->q_len;
        for (size_t i = 0; i < n; i++)
            batch[i] = l->queue[(l->q_head + i) % QUEUE_MAX_RECORDS];
        l->q_head = (l->q_head + n) % QUEUE_MAX_RECORDS;
        l->q_len = 0;
        l->q_bytes = 0;
        bool reopen = l->reopen_req;
        l->reopen_req = false;
        pthread_mutex_unlock(&l->mu);

        /* Reopen first: after logrotate renamed the file, what is queued goes to the new. */
        if (reopen) {
            writer_reopen(l);
            count(&l->reopens, 1);
        }
        if (n) writer_write(l, batch, n);
        for (size_t i = 0; i < n; i++)
            rec_unref(batch[i]);

        pthread_mutex_lock(&l->mu);
        l->seq_done += n;
        pthread_cond_broadcast(&l->done);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ------------------------------------------------------------------------------------- */
/* Public API                                                                             */

incident_log *incident_log_open(const char *path, unsigned recent, size_t max_record_bytes,
                                char *err, size_t errlen)
{
    incident_log *l = lg_xcalloc(1, sizeof *l);
    l->fd = -1;
    l->max_record_bytes = max_record_bytes;
    l->n_recent = recent;
    if (recent) l->recent = lg_xcalloc(recent, sizeof *l->recent);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->wake, NULL);
    pthread_cond_init(&l->done, NULL);
    if (!path) return l;

    l->path = lg_xstrdup(path);
    if ((l->fd = open_log(path, &l->torn)) < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        goto error;
    }
    int rc = pthread_create(&l->thread, NULL, writer_main, l);
    if (rc != 0) {
        snprintf(err, errlen, "incident writer thread: %s", strerror(rc));
        goto error;
    }
    return l;
error:
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
    free(l->path);
    l->path = NULL; /* no thread to stop */
    incident_log_close(l);
    return NULL;
}

void incident_log_submit(incident_log *l, char *line)
{
    if (!l || !line) {
        free(line);
        return;
    }
    size_t len = strlen(line);
    count(&l->submitted, 1);
    if (l->max_record_bytes && len > l->max_record_bytes) {
        if (!(line = truncate_record(line, &len, l->max_record_bytes))) {
            count(&l->dropped, 1);
            return;
        }
        count(&l->truncated, 1);
    }
    rec *r = lg_xmalloc(sizeof *r), *evicted = NULL;
    r->text = line;
    r->len = len;
    atomic_init(&r->refs, 1); /* the submitter's, given up below */

    pthread_mutex_lock(&l->mu);
    if (l->path) {
        if (l->q_len < QUEUE_MAX_RECORDS && l->q_bytes + len <= QUEUE_MAX_BYTES) {
            atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
            l->queue[(l->q_head + l->q_len++) % QUEUE_MAX_RECORDS] = r;
            l->q_bytes += len;
            l->seq_queued++;
            pthread_cond_signal(&l->wake);
        } else {
            count(&l->dropped, 1);
        }
    }
    if (l->n_recent) {
        atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
        evicted = l->recent[l->recent_next]; /* NULL until the ring is full */
        l->recent[l->recent_next] = r;
        l->recent_next = (l->recent_next + 1) % l->n_recent;
        if (l->recent_len < l->n_recent) l->recent_len++;
    }
    pthread_mutex_unlock(&l->mu);
    rec_unref(evicted);
    rec_unref(r);
}

void incident_log_reopen(incident_log *l)
{
    if (!l || !l->path) return;
    pthread_mutex_lock(&l->mu);
    l->reopen_req = true;
    pthread_cond_signal(&l->wake);
    pthread_mutex_unlock(&l->mu);
}

void incident_log_flush(incident_log *l)
{
    if (!l || !l->path) return;
    pthread_mutex_lock(&l->mu);
    uint64_t target = l->seq_queued;
    while (l->seq_done < target)
        pthread_cond_wait(&l->done, &l->mu);
    pthread_mutex_unlock(&l->mu);
}

char *incident_log_recent_json(incident_log *l)
{
    unsigned n = 0;
    rec **snap = NULL;
    if (l && l->n_recent) {
        snap = lg_xmalloc(l->n_recent * sizeof *snap);
        pthread_mutex_lock(&l->mu);
        n = l->recent_len;
        unsigned first = (l->recent_next + l->n_recent - n) % l->n_recent; /* the oldest */
        for (unsigned i = 0; i < n; i++) {
            snap[i] = l->recent[(first + i) % l->n_recent];
            atomic_fetch_add_explicit(&snap[i]->refs, 1, memory_order_relaxed);
        }
        pthread_mutex_unlock(&l->mu);
    }
    size_t total = 3, off = 0;
    for (unsigned i = 0; i < n; i++)
        total += snap[i]->len + 1;
    char *out = lg_xmalloc(total);
    out[off++] = '[';
    for (unsigned i = 0; i < n; i++) {
        if (i) out[off++] = ',';
        memcpy(out + off, snap[i]->text, snap[i]->len);
        off += snap[i]->len;
        rec_unref(snap[i]);
    }
    out[off++] = ']';
    out[off] = '\0';
    free(snap);
    return out;
}

void incident_log_stats(incident_log *l, incident_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!l) return;
    out->submitted = atomic_load_explicit(&l->submitted, memory_order_relaxed);
    out->written = atomic_load_explicit(&l->written, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&l->dropped, memory_order_relaxed);
    out->write_errors = atomic_load_explicit(&l->write_errors, memory_order_relaxed);
    out->reopens = atomic_load_explicit(&l->reopens, memory_order_relaxed);
    out->truncated = atomic_load_explicit(&l->truncated, memory_order_relaxed);
}

void incident_log_close(incident_log *l)
{
    if (!l) return;
    if (l->path) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_signal(&l->wake);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL); /* the writer drains the queue before it returns */
        if (l->fd >= 0) close(l->fd);
        free(l->path);
    }
    for (unsigned i = 0; i < l->n_recent; i++)
        rec_unref(l->recent[i]);
    free(l->recent);
    pthread_cond_destroy(&l->wake);
    pthread_cond_destroy(&l->done);
    pthread_mutex_destroy(&l->mu);
    free(l);
}
