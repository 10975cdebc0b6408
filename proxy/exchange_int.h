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
#include "proxy/api.h"
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

/* One channel of the current attempt: its guard (made when first needed) and the text fed
 * to it but not yet released. */
typedef struct chan {
    guard *g;
    lg_buf held; /* fed to the guard, not yet released */
    uint64_t attempt_bytes;
    token_run run;
} chan;

typedef enum { PHASE_BODY, PHASE_RUNNING, PHASE_DONE } ex_phase;

/* One upstream attempt: everything here lives from start_attempt to the attempt's end and
 * is freed and zeroed in one place, exchange.c's attempt_reset. */
typedef struct ex_attempt {
    CURL *easy;
    struct curl_slist *headers;
    char *up_body;
    char rid[80]; /* SGLang's rid for this attempt ("" when the route takes none) */
    http_head head;
    lg_buf errbody;
    sse_parser *sse;
    think_split *think;
    bool think_hindsight; /* whole response: reasoning until proven otherwise */
    bool think_explicit;  /* the content opened with <think> itself */
    chan ch[LG_CH_COUNT];
    bool guarded;
    uint64_t tokens;
    uint64_t tokens_after_trip;
    uint64_t start_ns, last_event_ns;
    bool first_byte;
    bool connected;    /* libcurl is sending the request: timeouts.connect_ms is over */
    bool finished_gen; /* the generation's end arrived (finish_reason, message_stop, ...) */
    bool saw_done;
    bool trip_pending;
    bool up_paused; /* the transfer is paused until the client drains `out` */
    bool not_sse;   /* 200 without text/event-stream: a broken upstream */
    bool raw_body;  /* 200 without text/event-stream to a passthrough request: its answer */
    bool timed_out;
    guard_verdict verdict;
    char verdict_unit[260];
    char verdict_detector[64];
    cJSON *sampling;
} ex_attempt;

/* The client side: lives from the request to its destroy. */
typedef struct ex_client {
    bool stream_ready; /* streaming response may be queued */
    bool queued;
    bool ended; /* everything is in `out` (the stream's last event included) */
    lg_fifo out;
    uint64_t out_since_ns, last_out_ns;
    lg_buf sent[LG_CH_COUNT]; /* released to the client, all attempts */
    int final_status;
    char *final_body;
    char *final_ctype;
    bool counted_stream;
    /* One event's text per channel (as split, then as released), kept between events so
     * that a token costs no malloc: EX_TEXT_R, EX_TEXT_C. */
    lg_buf text[2];
} ex_client;

/* The incident record: lives from the request until the incident is written. */
typedef struct ex_record {
    unsigned trips;
    cJSON *attempts; /* NULL once the incident is written (record_open says which) */
    bool written;
    char *excerpt;
    const char *outcome;
    uint64_t trip_ns; /* the last trip (retry latency) */
} ex_record;

typedef struct exchange {
    lg_req base;
    lg_xfer xfer;
    ex_phase phase;
    const lg_api *api;
    void *api_state; /* the API module's own state (api->destroy frees it) */
    lg_buf body;
    bool body_too_big;

    rw_request req;
    const lg_model_rule *rule;
    lg_reasoning_output mode;
    bool guard_on;
    bool think_opened;
    bool think_inline; /* this exchange's upstream sends <think> inside content */
    /* Set by the module's parse: the request is not guarded and the upstream's answer is
     * the client's, byte for byte (a whole answer need not be an event stream). */
    bool passthrough;
    char id[40];

    unsigned attempt;         /* attempts started */
    size_t replica;           /* the current (or last) attempt's replica */
    bool have_replica;        /* ... and it is acquired */
    bool avoid_replica;       /* the next attempt must prefer another replica */
    unsigned connect_retries; /* attempts re-sent because a replica never answered */

    ex_attempt at;
    ex_client cl;
    ex_record rec;
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
    if (!ex->req.client_stream || ex->cl.ended) return;
    if (lg_fifo_len(&ex->cl.out) == 0) ex->cl.out_since_ns = ex->base.w->now_ns;
    lg_fifo_append(&ex->cl.out, s, n);
    worker_output(&ex->base);
}

/* ---- exchange_events.c: the channels, for the API modules ----------------------------- */

/* libcurl's header and body callbacks of an attempt's transfer, and the SSE parser's event
 * callback that the body goes to (ud: the exchange; it calls api->on_event). */
size_t ex_on_header(char *line, size_t size, size_t n, void *ud);
size_t ex_on_write(char *data, size_t size, size_t n, void *ud);
int ex_on_event(void *ud, const sse_event *ev);
/* Queues one `data: json` event for a streaming client. */
void ex_out_event(exchange *ex, const char *json);
/* Feeds one delta of channel ch to its guard (made when first needed) and to the
 * token-run check, and holds it. Returns true when either tripped (the verdict is taken);
 * the caller returns 1 from on_event. */
bool ex_guard_text(exchange *ex, lg_channel ch, const char *s, size_t n);
/* Held bytes of channel ch that the guard has cleared. */
size_t ex_releasable(const exchange *ex, lg_channel ch);
/* Moves n held bytes of channel ch to the client's sent text (and to *into when given). */
void ex_release(exchange *ex, lg_channel ch, size_t n, lg_buf *into);
/* The generation of this attempt ended: the guards' last checks (and the empty-answer
 * check when answer_expected and the API is templated). True when one tripped. */
bool ex_end_checks(exchange *ex, bool answer_expected);
/* The per-event text buffers (EX_TEXT_R, EX_TEXT_C), lent empty and taken back. */
lg_buf ex_text_borrow(exchange *ex, int i);
void ex_text_return(exchange *ex, int i, lg_buf *b);

/* ---- exchange.c: the exchange's life, for the API modules ------------------------------ */

/* The exchange's fate is decided: no more attempts. The incident is written now, before
 * the client has its answer, so whoever reads /loopguard/incidents after the response
 * finds it. */
void ex_conclude(exchange *ex);
/* Sets the exchange's outcome unless one is set already (the first cause wins); counted in
 * the metrics when the exchange tripped. */
void ex_set_outcome(exchange *ex, const char *outcome);
/* Appends the current attempt's record (v: its verdict, or NULL) to the incident record. */
void ex_record_attempt(exchange *ex, const guard_verdict *v);
/* True once the client's streaming response exists or is about to be queued: from then on,
 * every end is written into the stream. */
bool ex_streaming_started(const exchange *ex);
/* Ends the exchange with an error: an error response in the API's shape when nothing was
 * sent yet, else the API's error event and the stream's end. */
void ex_fail(exchange *ex, int status, const char *message, const char *type, const char *code);
/* An upstream error event before the client's stream started: the exchange ends with
 * `status` and `body` (malloc'd, taken). */
void ex_fail_whole(exchange *ex, int status, char *body);
/* The last bytes of a client stream: loopguard's X-Loopguard-* comments when it tripped,
 * then last[0..n); the stream is then complete. */
void ex_end_stream(exchange *ex, const char *last, size_t n);
/* Fresh hex digits (2 * nbytes + NUL into out): ids and rids. */
void ex_random_hex(char *out, size_t nbytes);

#endif
