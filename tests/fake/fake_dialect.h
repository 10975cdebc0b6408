/* fake_dialect.h — the byte shapes of SGLang, vLLM and OpenAI responses.
 *
 * Each function appends one JSON document (an SSE event's data, or a whole body) in the
 * exact key order and spacing the real server produces; the shapes are listed in
 * tests/fake/README.md. No I/O and no state: the server decides what to send, this module
 * only decides how it looks. */
#ifndef FAKE_DIALECT_H
#define FAKE_DIALECT_H

#include <stdbool.h>
#include <stddef.h>

#include "fake_buf.h"

typedef enum {
    FAKE_D_SGLANG,
    FAKE_D_SGLANG_PYDANTIC,
    FAKE_D_SGLANG_OLD,
    FAKE_D_VLLM,
    FAKE_D_VLLM_OLD,
    FAKE_D_VLLM_BOTH,
    FAKE_D_OPENAI,
    FAKE_D_INLINE,
} fake_dialect;

typedef enum {
    FAKE_EP_CHAT,
    FAKE_EP_COMPLETION,
    FAKE_EP_GENERATE,
    FAKE_EP_MESSAGES,
    FAKE_EP_RESPONSES
} fake_endpoint;

/* Parses a dialect name; returns -1 when unknown. */
int fake_dialect_parse(const char *name);
const char *fake_dialect_name(fake_dialect d);
bool fake_dialect_is_sglang(fake_dialect d);
bool fake_dialect_is_vllm(fake_dialect d);
/* True when finish_reason travels in a chunk of its own after the last token (chat on
 * sglang, sglang-pydantic, openai, inline) rather than on the last token's delta. */
bool fake_dialect_separate_finish(fake_dialect d, fake_endpoint ep);

/* What every chunk of one response shares. Strings are borrowed. head: the chunk head
 * (fake_render_chunk_head's bytes) when the caller keeps a copy, which spares rendering it
 * again in every chunk; NULL: rendered each time. */
typedef struct fake_ctx {
    fake_dialect d;
    fake_endpoint ep;
    const char *id;
    const char *model;
    long created;
    const char *head;
    size_t head_len;
} fake_ctx;

/* One delta. Unused text pointers are NULL. */
typedef struct fake_delta {
    bool role; /* the first chunk: role "assistant", content "" */
    const char *reasoning;
    size_t rn;
    const char *content;
    size_t cn;
    int tool; /* -1: no tool delta */
    const char *tool_id;
    const char *tool_name; /* non-NULL on the header delta of a call */
    const char *args;
    size_t an;
    const char *finish;       /* NULL: not finished */
    const char *matched_stop; /* JSON text for SGLang's matched_stop when finished */
    const char *stop_reason;  /* JSON text for vLLM's stop_reason when finished */
} fake_delta;

typedef struct fake_usage {
    long prompt, completion, reasoning;
} fake_usage;

/* What every streamed chunk and usage chunk of c starts with:
 * {"id":…,"object":"chat.completion.chunk" (text_completion on /v1/completions),
 * "created":…,"model":… */
void fake_render_chunk_head(fbuf *b, const fake_ctx *c);
/* One streamed chunk (chat.completion.chunk or text_completion; /generate is rendered by
 * fake_render_generate). */
void fake_render_chunk(fbuf *b, const fake_ctx *c, const fake_delta *d);
/* The usage chunk: "choices":[] and the usage object. */
void fake_render_usage_chunk(fbuf *b, const fake_ctx *c, const fake_usage *u);
/* The mid-stream error event's data (Python json.dumps spacing). */
void fake_render_error_event(fbuf *b, fake_dialect d, const char *msg, const char *type, int code);
/* An HTTP error body as the server writes it. */
void fake_render_error_body(fbuf *b, fake_dialect d, const char *msg, const char *type, int code);

/* A whole (non-streaming) response. Tool call i has id ids[i], name names[i] and
 * arguments args[i] (fbuf each). reasoning NULL: none. */
typedef struct fake_whole {
    const fbuf *reasoning;
    const fbuf *content;
    size_t ntools;
    const char *const *ids;
    const char *const *names;
    const fbuf *args;
    const char *finish;
    const char *matched_stop;
    const char *stop_reason;
    fake_usage usage;
    double latency_s; /* /generate meta_info */
} fake_whole;

void fake_render_whole(fbuf *b, const fake_ctx *c, const fake_whole *w);
/* One /generate event (or the whole body): text[from..] (the text so far, or the new text
 * of an incremental stream), output_ids for tokens [ids_from, ids_to) (the fake's token id
 * of token i is 1000 + i), finish NULL until the end; index >= 0: a batch stream's event of
 * sample `index` (SGLang adds "index" last). */
void fake_render_generate(fbuf *b, const fake_ctx *c, const fbuf *text, size_t from, long ids_from,
                          long ids_to, const char *finish, long length_cap, const fake_usage *u,
                          double latency_s, int index);

#endif
