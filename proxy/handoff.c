/* handoff.c — see handoff.h. */
#include "proxy/handoff.h"

#include <unistd.h>

#include "proxy/xalloc.h"

void handoff_init(lg_handoff *h)
{
    *h = (lg_handoff){0};
    pthread_mutex_init(&h->lock, NULL);
    atomic_init(&h->count, 0);
}

void handoff_free(lg_handoff *h)
{
    for (size_t i = 0; i < h->n; i++)
        close(h->q[i].fd);
    lg_xfree(h->q);
    pthread_mutex_destroy(&h->lock);
}

bool handoff_put(lg_handoff *h, int fd, const struct sockaddr_storage *sa, socklen_t len)
{
    pthread_mutex_lock(&h->lock);
    bool queued = !h->shut;
    if (queued) {
        if (h->n == h->cap) {
            h->cap = h->cap ? 2 * h->cap : 64;
            h->q = lg_xrealloc(h->q, h->cap * sizeof *h->q);
        }
        h->q[h->n++] = (lg_handed){fd, len, *sa};
        atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&h->lock);
    return queued;
}

size_t handoff_take(lg_handoff *h, bool shut, lg_handed **out)
{
    pthread_mutex_lock(&h->lock);
    size_t n = h->n;
    *out = h->q;
    h->q = NULL;
    h->n = h->cap = 0;
    h->shut = h->shut || shut;
    atomic_fetch_sub_explicit(&h->count, (unsigned)n, memory_order_relaxed);
    pthread_mutex_unlock(&h->lock);
    return n;
}

unsigned handoff_count(const lg_handoff *h)
{
    return atomic_load_explicit(&h->count, memory_order_relaxed);
}
