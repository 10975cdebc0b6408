/* api.h — one module per generation API that loopguard guards.
 *
 * The guarded exchange (exchange.c, exchange_events.c) knows channels — answer text,
 * reasoning, tool-call arguments — attempts, the guard, holdback and the incident record,
 * and no API's field names. A module maps its API onto those channels and back:
 *
 *   request   parse and validate the client's body; build one attempt's upstream body
 *             (stream forced on, the retry's sampling where this route accepts it, the rid
 *             where the upstream takes one);
 *   events    read each upstream event, feed its text to the exchange's channels
 *             (ex_guard_text), release what the guard cleared (ex_release) and write the
 *             client's events for it in the API's own shape;
 *   ends      the client's stream end, a whole response, the "withheld" answer when every
 *             attempt looped, and errors in the API's error shape.
 *
 * A module keeps its per-exchange state in exchange.api_state and frees it in destroy.
 * Modules: api_chat.c (chat and text completions), api_messages.c (Anthropic Messages),
 * api_responses.c (OpenAI Responses), api_generate.c (SGLang /generate). The route table
 * (route.c) maps a client path to its module. */
#ifndef LG_API_H
#define LG_API_H

#include <stdbool.h>
#include <stddef.h>

#include <cJSON.h>

#include "proxy/metrics.h"
#include "proxy/rewrite.h"
#include "proxy/sse.h"

struct exchange;

typedef struct lg_api {
    const char *route;         /* the client path; names the route in incidents */
    const char *upstream_path; /* where the attempt goes */
    lg_endpoint endpoint;      /* metrics label */
    /* The text is chat-templated model output: the guard's leak detectors and the
     * empty-answer check apply (not to raw completions). */
    bool templated;
    /* Retries may continue the clean prefix the client has (else they restart). */
    bool can_continue;
    /* The route takes SGLang's `rid` (so an attempt can be aborted by /abort_request);
     * without it the cut is the closed connection, which SGLang's streaming response
     * turns into an abort of the request itself. */
    bool takes_rid;

    /* Parses the complete body into ex->req (and the module's state). Returns 0, or -1
     * with *err (the client gets err as a 400 in the API's error shape). */
    int (*parse)(struct exchange *ex, const char *body, size_t len, rw_error *err);
    /* One attempt's upstream body (malloc'd JSON), or NULL with *err. */
    char *(*build)(struct exchange *ex, const rw_opts *o, rw_error *err);
    /* The sampling an attempt ran with, for the incident record (caller owns it): called
     * when the record is written, with the attempt's step, seed and upstream kind in o. */
    cJSON *(*sampling)(const struct exchange *ex, const rw_opts *o);
    /* The prompt for the incident record: the whole of it (full) or the last user text as a
     * string. NULL when there is none. Caller owns it. */
    cJSON *(*prompt)(const struct exchange *ex, bool full);
    /* An attempt begins (ex->attempt is its number). restart: a whole response starts
     * over (the client has seen nothing). */
    void (*attempt_begins)(struct exchange *ex, bool restart);
    /* One upstream SSE event of the current attempt. Returns 1 when a guard tripped (the
     * verdict is taken), else 0. */
    int (*on_event)(struct exchange *ex, const sse_event *ev);
    /* Optional: the attempt's SSE parser's vouch (sse_parser_vouch; ud: the exchange). */
    bool (*vouch)(void *ud, const char *data, size_t len);
    /* Optional: prefetches the lines of the module's state that an event reads, before the
     * worker's read (lg_xfer.warm, exchange.c's ex_warm). */
    void (*warm)(const struct exchange *ex);
    /* The generation ended cleanly (after every attempt): queue the stream's closing
     * events, or render the whole response into ex->cl.final_body. */
    void (*finish)(struct exchange *ex);
    /* Every attempt looped (retry.on_exhausted content_filter): mark the answer as withheld
     * in the API's shape; finish follows. */
    void (*withheld)(struct exchange *ex);
    /* An error once the stream has started: the error event(s), then the stream's end. */
    void (*stream_error)(struct exchange *ex, int status, const char *message, const char *type,
                         const char *code);
    /* The body of an error response (malloc'd JSON). */
    char *(*error_body)(int status, const char *message, const char *type, const char *code);
    /* Optional: the running attempt is abandoned (the client left, a timeout) — queue in
     * ex->at.aborts the rids of what still runs under it that the attempt's own rid does
     * not name (a batch's samples). */
    void (*abandon)(struct exchange *ex);
    /* Frees ex->api_state (may be NULL). */
    void (*destroy)(struct exchange *ex);
} lg_api;

extern const lg_api api_chat, api_completions, api_messages, api_responses, api_generate;

#endif
