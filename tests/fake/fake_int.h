/* fake_int.h — the fake upstream's internals, shared by its three parts:
 *
 *   fake_http.c    HTTP/1.1: the request parser (head, chunked bodies) and the response
 *                  writers (status line and headers, JSON, SSE events as chunks);
 *   fake_gen.c     the generator: a generation's plan, pacing, tokens rendered in the
 *                  endpoint's shape, faults, its end and record;
 *   fake_server.c  the endpoints (dispatch) and the epoll loop: connections, timers,
 *                  records, accept, the run.
 *
 * The fake is independent of the code it checks: it links cJSON and nothing of loopguard. */
#ifndef FAKE_INT_H
#define FAKE_INT_H

#include "fake_server.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "fake_buf.h"
#include "fake_dialect.h"
#include "fake_messages.h"
#include "fake_responses.h"
#include "fake_record.h"

#define OUT_HIGH        (256 * 1024)  /* stop producing above this much unsent output */
#define BURST           (64 * 1024)   /* bytes one pump call may add before yielding */
#define MAX_HEAD        (64 * 1024)   /* request line + headers */
#define MAX_BODY        (1024L << 20) /* request body */
#define MAX_HEADERS     128
#define NS_PER_MS       1000000ULL
#define TOKENS_PER_PUMP 4096 /* whole responses: tokens per pump before yielding */

/* ---- types ---- */

typedef enum {
    PH_DELAY,   /* waiting for first_byte_ms */
    PH_HEADERS, /* status line and headers (or a pre-stream fault) */
    PH_START,   /* slow_start wait, then the role chunk */
    PH_TOKENS,
    PH_STALL, /* fault: nothing until the client leaves or the stall ends */
    PH_FINISH,
} gen_phase;

typedef struct gen {
    fake_scenario *sc; /* reference held while running */
    const fake_resp *r;
    int resp_index;
    fake_ctx ctx;
    fbuf head; /* the chunk head ctx.head points into */
    char id[96];
    char *rid;   /* body.rid, owned; NULL when absent */
    char *model; /* owned */
    const char *path;
    bool stream, usage;
    fake_plan plan;
    gen_phase phase;
    gen_phase resume; /* where a timed stall or an abort picks up */
    uint64_t t_start, wake, next_tick, pace_ns;
    long sent, reasoning_sent, prompt_tokens, cap;
    bool fault_done, aborted, finish_sent;
    bool junk_whole;         /* garbage fault on a whole response: junk precedes the JSON */
    const char *finish;      /* final finish_reason */
    char matched_stop[64];   /* JSON text */
    char stop_reason[256];   /* JSON text */
    fbuf ev;                 /* scratch for one event */
    fbuf reasoning, content; /* whole responses and /generate text */
    fbuf *args;              /* per tool call */
    char **tool_ids;
    size_t ntools;
    fake_msg msg;         /* /v1/messages: the open block */
    fake_rsp resp;        /* /v1/responses: sequence, open item, items done */
    size_t gen_text_sent; /* /generate: text and tokens sent in earlier events */
    long gen_ids_sent;
    /* A /generate batch: the parent paces and frames the stream, each sample is a kid of
     * its own (plan, rid, record), generated in turn, one token each per tick. */
    struct gen **kids;
    size_t nkids;
    int index;  /* a kid's place in the batch (-1: not a kid) */
    bool ended; /* a kid's generation ended (and is recorded) */
} gen;

typedef enum {
    C_READ,  /* reading a request */
    C_GEN,   /* a generation is running */
    C_BYTES, /* /_fake/bytes streaming */
    C_SLEEP, /* /_fake/sleep waiting */
    C_DONE,  /* response queued; next request once it is written */
} conn_state;

typedef struct hdr {
    char *name; /* lower-cased, NUL-terminated, inside conn.headbuf */
    char *value;
} hdr;

typedef struct conn {
    int fd;
    conn_state state;
    fbuf in;
    fbuf out;
    size_t out_off;
    bool ev_out;      /* EPOLLOUT registered */
    bool close_after; /* close once out is written */
    /* request */
    bool head_done;
    char *headbuf; /* copy of the head, owned */
    char *method, *path, *query;
    hdr hdrs[MAX_HEADERS];
    int nhdrs;
    bool chunked, keepalive;
    long clen;
    fbuf body;
    int ck_state; /* chunked decoder state */
    long ck_left;
    uint64_t t_req;
    /* work */
    gen *g;
    long bytes_left;
    long sleep_ms;
    uint64_t wake;
    long heap_idx;            /* -1 when not scheduled */
    struct conn *prev, *next; /* every open connection */
} conn;

typedef struct server {
    fake_config cfg;
    int ep, lfd, tfd, sfd;
    int reserve_fd; /* kept open to recover from EMFILE in accept */
    fake_scenario *sc;
    fake_dialect dialect;
    const char *model;
    fake_records rec;
    conn **heap;
    long nheap, capheap;
    uint64_t armed;
    conn *conns;
    uint64_t t0;
    uint64_t rng;
    long n_requests, n_generations, n_tokens, n_active;
    fbuf tmp;
    bool stop;
} server;

/* ---- fake_http.c ---- */

int dechunk(conn *c, size_t *pos);
const char *header(const conn *c, const char *name);
int parse_head(conn *c, size_t n);
void put_event(conn *c, const char *data, size_t n);
void put_head(conn *c, int status, const char *ctype, long clen);
const char *reason_phrase(int status);
void respond(conn *c, int status, const char *ctype, const char *body, size_t n);
void respond_error(server *s, conn *c, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void respond_json(conn *c, int status, const fbuf *b);

/* ---- fake_gen.c ---- */

/* Sets up a generation for the request on c using scenario response ri (-1: the built-in
 * clean answer). Returns NULL on out-of-memory. */
gen *gen_new(server *s, conn *c, const cJSON *body, fake_endpoint ep, int ri);
/* True when a /generate body is a batch: a list of prompts (text, or input_ids lists), or
 * sampling_params.n > 1. */
bool fake_generate_is_batch(const cJSON *body);
/* A /generate batch (fake_generate_is_batch) as SGLang's tokenizer manager expands it: one
 * kid a sample, the prompts in order, each n times; rids as GenerateReqInput's
 * _normalize_rid gives them (a list: one a prompt; a string: "<rid>_<i>"; none: fresh hex),
 * a sample of n > 1 a fresh one. Each sample matches the scenario on its own body. Returns
 * NULL with err set (the request's 400) or, err empty, on out-of-memory. */
gen *gen_new_batch(server *s, conn *c, const cJSON *body, const cJSON *headers, char *err,
                   size_t errn);
/* Advances c's generation as far as pacing, the output budget and faults allow. May close c. */
void gen_pump(server *s, conn *c);
/* Ends c's generation: records it (ended: complete, client_gone, aborted, fault) and frees it. */
void gen_end(server *s, conn *c, const char *ended, bool client_gone);

/* ---- fake_server.c ---- */

void conn_close(server *s, conn *c, bool rst);
bool conn_flush(server *s, conn *c);
size_t pending(const conn *c);
void rand_hex(server *s, char *out, int n);
void record_generation(server *s, const gen *g, const char *ended, bool client_gone);
void schedule(server *s, conn *c, uint64_t when);

#endif
