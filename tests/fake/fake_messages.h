/* fake_messages.h — the Anthropic Messages API (/v1/messages) as SGLang and vLLM serve it.
 *
 * Both servers translate their chat stream into Anthropic events (sglang
 * entrypoints/anthropic/serving.py, vllm entrypoints/anthropic/serving.py): each event is
 * `event: NAME\ndata: JSON\n\n`; message_start, then per block content_block_start /
 * content_block_delta / content_block_stop with a running index (a thinking block gets a
 * signature_delta before its stop, as vLLM sends), message_delta with stop_reason and usage,
 * message_stop. No [DONE]. Stop reasons: stop -> end_turn, length -> max_tokens,
 * tool_calls -> tool_use, anything else -> end_turn.
 *
 * The stream state (which block is open) lives in fake_msg; the renderers only append. */
#ifndef FAKE_MESSAGES_H
#define FAKE_MESSAGES_H

#include <stdbool.h>
#include <stddef.h>

#include "fake_buf.h"
#include "fake_dialect.h"

typedef enum { FAKE_BLK_NONE, FAKE_BLK_THINKING, FAKE_BLK_TEXT, FAKE_BLK_TOOL } fake_blk;

typedef struct fake_msg {
    fake_blk open;
    int index; /* the open block's index, or the next one's when none is open */
    char signature[40];
} fake_msg;

/* Appends one event, framed as one HTTP chunk, to out. */
void fake_msg_event(fbuf *out, const char *name, const char *json, size_t n);

/* The events of a stream, each appended (framed) to out; scratch is reused. */
void fake_msg_start(fbuf *out, fbuf *scratch, const fake_ctx *c, long prompt_tokens);
/* One token on block kind k (tool: a new tool_use block when tool_name is set, else an
 * input_json_delta). Opens/closes blocks as needed. */
void fake_msg_token(fbuf *out, fbuf *scratch, fake_msg *m, fake_blk k, const char *text, size_t n,
                    const char *tool_id, const char *tool_name);
/* Closes the open block, then message_delta and message_stop. */
void fake_msg_finish(fbuf *out, fbuf *scratch, fake_msg *m, const char *finish, long prompt_tokens,
                     long completion_tokens);
/* The error event (fault error_event). */
void fake_msg_error(fbuf *out, fbuf *scratch, const char *message);
/* The whole (non-streaming) message. */
void fake_msg_whole(fbuf *b, const fake_ctx *c, const fake_whole *w);
/* The Anthropic error body {"type":"error","error":{"type","message"}}. */
void fake_msg_error_body(fbuf *b, const char *type, const char *message);

#endif
