/* fake_server.h — the fake upstream's HTTP/1.1 server and generation engine.
 *
 * One thread, one epoll loop over raw non-blocking sockets, a timerfd for pacing and a
 * signalfd for SIGTERM/SIGINT. Contract and behaviour: tests/fake/README.md. */
#ifndef FAKE_SERVER_H
#define FAKE_SERVER_H

#include <stdbool.h>

#include "fake_scenario.h"

typedef enum { FAKE_KIND_SGLANG, FAKE_KIND_VLLM, FAKE_KIND_OPENAI } fake_kind;

typedef struct fake_config {
    const char *host; /* numeric IPv4 address */
    int port;         /* 0: any free port */
    fake_kind kind;
    int dialect;             /* fake_dialect, or -1: from the kind */
    const char *model;       /* default model name */
    bool stamp;              /* content tokens become w<ns> stamps */
    bool incremental;        /* /generate streams new text only (SGLang's
                                --incremental-streaming-output), else the text so far */
    long pace_ms;            /* default pace */
    long max_records;        /* record ring size; 0 disables recording */
    fake_scenario *scenario; /* owned reference (the server takes it) */
} fake_config;

/* Listens, prints "listening on HOST:PORT\n" to stdout, and serves until SIGTERM or
 * SIGINT. Returns 0 on a clean stop, 1 when it could not start (message on stderr). Takes
 * ownership of cfg->scenario. */
int fake_server_run(fake_config *cfg);

#endif
