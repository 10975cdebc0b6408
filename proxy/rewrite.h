/* rewrite.h — the client's request, validated, and the body loopguard sends upstream.
 *
 * rw_parse checks what loopguard itself relies on — the body is a JSON object; chat:
 * `messages` is an array of objects; completions: `prompt` is present; `stream` absent,
 * null or a boolean; `stream_options` an object when present; `n` a positive integer;
 * `temperature` a number — and keeps every other field untouched. Failures become an
 * OpenAI-style 400 (type "invalid_request_error").
 *
 * rw_build_upstream derives one attempt's upstream body from the parsed request: stream
 * forced on with usage (other stream_options keys kept), SGLang's `rid`, a sampling step
 * of the retry ladder, a continuation of a clean prefix, and the reasoning history moved
 * to the field the upstream reads. The parsed request is never modified, so one request
 * serves any number of attempts. */
#ifndef LG_REWRITE_H
#define LG_REWRITE_H

#include <stdbool.h>
#include <stddef.h>

#include <cJSON.h>

#include "config/config.h"

/* An error for the client. Strings are static. status: 400. */
typedef struct rw_error {
    int status;
    const char *message;
    const char *param; /* the offending field, or NULL */
    const char *code;  /* OpenAI error code, or NULL */
} rw_error;

/* A parsed client request; owns root (read only: see one_block). Borrowed strings point
 * into root. */
typedef struct rw_request {
    cJSON *root;
    /* root's members "messages" and "stream_options" as cJSON's look-up finds them (the
     * first of the name), NULL when absent: found in rw_parse's walk, kept for the build. */
    const cJSON *messages, *stream_options;
    const char *model; /* NULL when absent */
    double temperature;
    int n; /* 1 when absent */
    /* Added: */
    int enable_thinking; /* chat_template_kwargs.enable_thinking: -1 unset, 0 false, 1 true */
    bool chat;
    bool client_stream; /* "stream": true */
    bool client_usage;  /* streaming and stream_options.include_usage true */
    bool has_temperature;
    bool prompt_is_string; /* completions: prompt is a string (continuation possible) */
    bool one_block;        /* root is jt_parse's (jsontree.h): freed whole, never cJSON_Delete */
} rw_request;

/* Parses and validates a request body (need not be NUL-terminated). Returns 0 with *out
 * filled (caller clears it), or -1 with *err filled and *out zeroed. */
int rw_parse(const char *body, size_t len, bool chat, rw_request *out, rw_error *err);

/* LG_UPSTREAM_AUTO (not yet resolved) is treated as a generic OpenAI upstream: no rid,
 * no repetition_penalty, no continuation, history forwarded as sent. */
typedef struct rw_opts {
    int upstream_kind;            /* lg_upstream_kind */
    const char *rid;              /* NULL: no rid (only ever sent to SGLang) */
    const lg_sampling_step *step; /* NULL: the client's sampling */
    unsigned seed;                /* used when step->new_seed */
    const char *continue_text;    /* NULL: restart; else the clean prefix to continue */
    size_t continue_len;
    int history; /* lg_reasoning_history */
    /* Added: */
    long max_tokens; /* > 0: replaces max_tokens / max_completion_tokens (continuation) */
    /* The body rw_parse parsed into req (raw_len bytes), or NULL. With it, an attempt that
     * changes nothing but stream, stream_options and rid gets the client's members as
     * they were written instead of the tree's print: the same JSON value (see
     * rw_build_upstream). */
    const char *raw;
    size_t raw_len;
} rw_opts;

/* The upstream body for one attempt, as a malloc'd JSON string, or NULL with *err (a
 * continuation the upstream cannot do — generic OpenAI upstream, or a non-string prompt:
 * the caller restarts instead). Temperature = client's (1.0 when absent) + the step's add,
 * rounded to 6 decimals and clamped to [0, 2]; penalties as the step sets them;
 * repetition_penalty only for SGLang and vLLM; "seed" when step->new_seed. Chat
 * continuation: an assistant message with the prefix (or, when the client itself ended with
 * an assistant message and continue_final_message, the prefix appended to it) and
 * continue_final_message true (+ add_generation_prompt false for vLLM). Completions:
 * the prefix appended to the string prompt. */
char *rw_build_upstream(const rw_request *req, const rw_opts *o, rw_error *err);
/* Either way the members come in the same order: the client's, less those the attempt
 * sets, then stream, stream_options, rid, then (chat) messages. A spliced body differs
 * from the print only where JSON does not: whitespace, a string's escapes, how a number
 * is written. It is used only when every number in the body reads as the same value and
 * type through cJSON's print (an integer of at most 9 digits, or a finite number with a
 * fraction that is not integral), and when the chat history needs no rewrite. */

/* The effective sampling of an attempt for incident records: temperature, top_p, top_k,
 * presence_penalty, frequency_penalty, repetition_penalty, seed — only those set (by the
 * client or the step). Caller owns the result (cJSON_Delete). */
cJSON *rw_sampling_json(const rw_request *req, const rw_opts *o);

/* A retry step's temperature: the client's (1.0 when absent) + the step's add, clamped to
 * [0, 2] and rounded to 6 decimals (0.6 + 0.2 prints as 0.8). */
double rw_step_temperature(const rw_request *req, const lg_sampling_step *st);

/* The client's body as it came with stream forced on and a retry step's temperature
 * (rw_step_temperature): the upstream body of the routes whose request takes no other
 * retry sampling (Anthropic Messages, OpenAI Responses). A malloc'd JSON string. */
char *rw_build_streamed(const rw_request *req, const rw_opts *o);

/* Frees root and zeroes *r; safe to call twice. */
void rw_request_clear(rw_request *r);

#endif
