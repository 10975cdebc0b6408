/* listener.h — a listening socket and the workers that accept on it.
 *
 * One socket per address (`listen`, and `admin.listen` when set), shared by the workers that
 * serve it. Each worker watches the socket in its own epoll set while it takes connections,
 * with EPOLLEXCLUSIVE as nginx's workers do: a new connection wakes one (rarely more) of the
 * watching workers that wait in epoll_wait. That one accepts it (worker.c, accept_clients)
 * and keeps it or hands it to the worker that holds the fewest (balance.h). SO_REUSEPORT
 * sockets, one per worker, would split connections by a hash, unevenly at a
 * few hundred (and as gladly share the port with another process's listener; a plain
 * socket is refused an address in use).
 *
 * Ownership: the listener owns its socket. A worker that accepts on it joins it once
 * (listener_join) and leaves it once when it stops accepting for good, at a drain
 * (listener_leave); the last to leave closes the socket, so that new connections are refused
 * as soon as no worker will take them. listener_free closes it if no worker did. */
#ifndef LG_LISTENER_H
#define LG_LISTENER_H

#include <stdatomic.h>
#include <stddef.h>

typedef struct lg_listener {
    int fd;            /* -1 once closed (workers keep their own copy: worker_new) */
    int port;          /* the bound port (the one the kernel picked for port 0) */
    atomic_uint users; /* workers that joined and have not left */
} lg_listener;

/* Binds host:port (port 0: the kernel picks one) non-blocking with SO_REUSEADDR and listens.
 * Returns the listener, or NULL with err ("listen HOST:PORT: why"; an address another process
 * listens on is named as such). */
lg_listener *listener_open(const char *host, int port, char *err, size_t errlen);

/* A worker starts accepting on l (before any worker thread runs). */
void listener_join(lg_listener *l);

/* A worker that joined will accept on l no more (it took the socket out of its epoll set
 * first); the last one closes the socket. Thread-safe. */
void listener_leave(lg_listener *l);

/* Closes the socket if it is still open and frees l (NULL: nothing). Only once no worker
 * thread runs. */
void listener_free(lg_listener *l);

#endif
