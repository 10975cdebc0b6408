/* exchange_int.h — the guarded exchange's state, shared by its two halves and private to them:
 *
 *   exchange.c         a request's life: the body, the attempts and the retry ladder, the
 *                      incident record, the client side (streamed or whole), timeouts;
 *   exchange_events.c  the upstream's events: SSE and dialect parsing, the think splitter, the
 *                      guard per channel, holdback and release, the chunks for the client.
 *
 * Memory: everything an exchange owns is freed in one place, exchange.c's ex_destroy. */
#ifndef LG_EXCHANGE_INT_H
#define LG_EXCHANGE_INT_H

#include <cJSON.h>

#include "guard/guard.h"
#include "proxy/assemble.h"
#include "proxy/buf.h"
#include "proxy/chunkscan.h"
#include "proxy/dialect.h"
#include "proxy/http.h"
#include "proxy/rewrite.h"
#include "proxy/sse.h"
#include "proxy/think.h"
#include "proxy/upstream.h"
#include "proxy/worker.h"

/* A slow client: the upstream transfer is paused while this much output waits for it. */
#define EX_OUT_HIGH (256 * 1024)

/* The same delta text again and again: a model whose logits went bad emits one token
 * (often id 0, "!") forever. The byte-level guard needs many copies of a one-character unit
 * before it may call it a loop (real text has rules of "!" and "=" dozens long), but 32
 * identical consecutive tokens do not occur in real generations. Token boundaries are the
 * exchange's knowledge, not the guard's, so this signal lives here. */
#define RUN_MAX_TOKEN 64
#define RUN_TRIP 32

typedef struct token_run {
    char last[RUN_MAX_TOKEN];
    size_t len;     /* 0: no run */
    unsigned count; /* consecutive deltas equal to `last` */
    uint64_t start; /* channel offset (this attempt) of the run's first delta */
} token_run;

typedef struct chan {
    guard *g;
    lg_buf held; /* fed to the guard, not yet released */
    lg_buf sent; /* released to the client, all attempts */
    uint64_t attempt_bytes;
    token_run run;
} chan;

typedef enum { PHASE_BODY, PHASE_RUNNING, PHASE_DONE } ex_phase;

typedef struct exchange {
    lg_req base;
    lg_xfer xfer;
    ex_phase phase;
    bool chat;
    const char *endpoint;
    lg_buf body;
    bool body_too_big;

    rw_request req;
    const lg_model_rule *rule;
    lg_reasoning_output mode;
    bool guard_on;
    bool think_opened;
    char id[40];

    /* the current attempt */
    unsigned attempt;
    CURL *easy;
    struct curl_slist *headers;
    char *up_body;
    char rid[33];
    size_t replica;
    bool have_replica;
    http_head head;
    lg_buf errbody;
    sse_parser *sse;
    think_split *think;
    bool think_inline;    /* this exchange's upstream sends <think> inside content */
    bool think_hindsight; /* whole response: reasoning until proven otherwise */
    bool think_explicit;  /* the content opened with <think> itself */
    chan ch[LG_CH_COUNT];
    bool attempt_guarded;
    uint64_t tokens;
    uint64_t attempt_start_ns, last_event_ns, trip_ns;
    bool first_byte;
    bool connected;    /* libcurl is sending the request: timeouts.connect_ms is over */
    bool finished_gen; /* a finish_reason arrived */
    bool saw_done;
    bool trip_pending;
    bool up_paused; /* the transfer is paused until the client drains `out` */
    bool not_sse;   /* 200 without text/event-stream: a broken upstream */
    bool timed_out;
    bool avoid_replica;       /* the next attempt must prefer another replica */
    unsigned connect_retries; /* attempts re-sent because a replica never answered */
    guard_verdict verdict;
    char verdict_unit[260];
    char verdict_detector[64];
    uint64_t tokens_after_trip;
    cJSON *sampling;
    size_t write_rest; /* bytes of the current write not yet parsed (tokens_after_trip) */
    const char *write_rest_p;
    int inline_state; /* LG_REASONING_INLINE output: 0 nothing, 1 <think> open, 2 closed */

    /* the client side */
    bool stream_ready;  /* streaming response may be queued */
    bool queued;
    bool ended;         /* everything is in `out` ([DONE] included) */
    lg_fifo out;
    uint64_t out_since_ns, last_out_ns;
    lg_assembler *as;
    int final_status;
    char *final_body;
    char *final_ctype;
    char *c_id, *c_model;
    long long c_created;
    lg_buf done_raw;
    chunkscan_state scan; /* the fast path's buffers and the stream's chunk frame */
    /* One event's reasoning and content text (on_chunk: first as split, then as released),
     * kept between events so that a token costs no malloc: EX_TEXT_R, EX_TEXT_C. */
    lg_buf text[2];

    /* the record */
    unsigned trips;
    cJSON *attempts;
    char *excerpt;
    const char *outcome;
    bool counted_stream;
} exchange;

/* The per-event text buffers (exchange.text). */
enum { EX_TEXT_R, EX_TEXT_C };

static inline const lg_config *cfg_of(const exchange *ex)
{
    return ex->base.w->srv->cfg;
}

static inline double seconds_since(uint64_t then, uint64_t now)
{
    return now > then ? (double)(now - then) / 1e9 : 0.0;
}

/* Queues bytes for a streaming client (nothing once the stream ended). */
static inline void out_append(exchange *ex, const char *s, size_t n)
{
    if (!ex->req.client_stream || ex->ended) return;
    if (lg_fifo_len(&ex->out) == 0) ex->out_since_ns = ex->base.w->now_ns;
    lg_fifo_append(&ex->out, s, n);
    worker_output(&ex->base);
}

/* ---- exchange_events.c ------------------------------------------------------------- */

/* libcurl's header and body callbacks of an attempt's transfer, and the SSE parser's event
 * callback that the body goes to (ud: the exchange). */
size_t ex_on_header(char *line, size_t size, size_t n, void *ud);
size_t ex_on_write(char *data, size_t size, size_t n, void *ud);
int ex_on_event(void *ud, const sse_event *ev);
/* Queues one `data: json` event for a streaming client. */
void ex_out_event(exchange *ex, const char *json);
/* Emits released text (and the chunk's own non-text fields when tmpl is given) to a
 * streaming client, reshaped for the output mode. */
void ex_emit_chunk(exchange *ex, const dl_delta *tmpl, const char *r, size_t rn, const char *c,
                   size_t cn, const char *finish);

/* ---- exchange.c -------------------------------------------------------------------- */

/* The exchange's fate is decided: no more attempts. The incident is written now, before
 * the client has its answer, so whoever reads /loopguard/incidents after the response
 * finds it. */
void ex_conclude(exchange *ex);
/* Sets the exchange's outcome unless one is set already (the first cause wins); counted in
 * the metrics when the exchange tripped. */
void ex_set_outcome(exchange *ex, const char *outcome);
/* Appends the current attempt's record (v: its verdict, or NULL) to ex->attempts. */
void ex_record_attempt(exchange *ex, const guard_verdict *v);
/* True once the client's streaming response exists or is about to be queued: from then on,
 * every end is written into the stream (error event, then [DONE]). */
bool ex_streaming_started(const exchange *ex);
/* Ends the exchange with an error: a JSON error response when nothing was sent yet, else
 * an error event then [DONE]. */
void ex_fail(exchange *ex, int status, const char *message, const char *type, const char *code);

#endif
