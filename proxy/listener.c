/* listener.c — a listening socket shared by the workers (see listener.h). */
#include "proxy/listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proxy/xalloc.h"

/* The kernel's queue of connections not yet accepted (capped by net.core.somaxconn). */
#define LISTEN_BACKLOG 4096

/* A socket bound to host:port and listening, or -1 with err. */
static int listening_socket(const char *host, int port, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char portstr[16];
    int fd = -1, one = 1;

    snprintf(portstr, sizeof portstr, "%d", port);
    int rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0) {
        snprintf(err, errlen, "listen %s:%d: %s", host, port, gai_strerror(rc));
        return -1;
    }
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, LISTEN_BACKLOG) != 0) {
        if (errno == EADDRINUSE)
            snprintf(err, errlen,
                     "listen %s:%d: address already in use: another process (another "
                     "loopguard?) listens there; stop it or choose another port",
                     host, port);
        else
            snprintf(err, errlen, "listen %s:%d: %s", host, port, strerror(errno));
        if (fd >= 0) close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

lg_listener *listener_open(const char *host, int port, char *err, size_t errlen)
{
    int fd = listening_socket(host, port, err, errlen);
    if (fd < 0) return NULL;
    lg_listener *l = lg_xcalloc(1, sizeof *l);
    l->fd = fd;
    l->port = bound_port(fd);
    atomic_init(&l->users, 0);
    return l;
}

void listener_join(lg_listener *l)
{
    atomic_fetch_add(&l->users, 1);
}

void listener_leave(lg_listener *l)
{
    if (atomic_fetch_sub(&l->users, 1) == 1) {
        close(l->fd);
        l->fd = -1;
    }
}

void listener_free(lg_listener *l)
{
    if (!l) return;
    if (l->fd >= 0) close(l->fd);
    free(l);
}
