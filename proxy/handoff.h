/* handoff.h — a worker's queue of the client connections other workers accepted for it.
 *
 * The worker a new connection wakes accepts it and hands it to the worker that holds the
 * fewest when that is not itself (balance.h, worker.c accept_clients). The receiver takes its
 * queue at its next wake-up. Once it has left the listener (a drain) it shuts the queue with
 * its last take: a shut queue refuses every later connection, which the accepting worker then
 * keeps, so that no connection waits in the queue of a worker that no longer runs its loop
 * (it would stay open, unanswered, until the process exits).
 *
 * Threads: any worker puts, the owner takes; the lock guards the array, and nothing else
 * runs under it (the owner adds or closes what it took outside it). Ownership: a queued
 * socket is the queue's until taken; handoff_free closes what was never taken (a worker that
 * never ran). */
#ifndef LG_HANDOFF_H
#define LG_HANDOFF_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

typedef struct lg_handed {
    int fd;
    socklen_t len;
    struct sockaddr_storage sa; /* the peer's address, as accept4 gave it */
} lg_handed;

typedef struct lg_handoff {
    pthread_mutex_t lock; /* guards q, n, cap and shut */
    lg_handed *q;
    size_t n, cap;
    bool shut;         /* takes no more (handoff_take with shut) */
    atomic_uint count; /* n, for other threads to read without the lock (handoff_count) */
} lg_handoff;

void handoff_init(lg_handoff *h);

/* Closes the sockets never taken and frees the queue. */
void handoff_free(lg_handoff *h);

/* Queues connection fd (peer sa, len bytes) for h's worker: true, and the queue owns the
 * socket; false when h is shut, and the caller keeps it. The caller wakes the worker. */
bool handoff_put(lg_handoff *h, int fd, const struct sockaddr_storage *sa, socklen_t len);

/* Takes every queued connection, in the order they came: returns how many, in *out (the
 * caller owns the array, lg_xfree, and the sockets; NULL when none). With shut, the queue is
 * shut in the same step: nothing can enter it after what this take returns. */
size_t handoff_take(lg_handoff *h, bool shut, lg_handed **out);

/* How many connections wait in h, as of some recent moment (for placing: balance.h). */
unsigned handoff_count(const lg_handoff *h);

#endif
