/* fake_responses.h — the OpenAI Responses API (/v1/responses) as vLLM (and SGLang, whose
 * serving_responses follows vLLM's) streams it without harmony: `event: TYPE` +
 * `data: JSON`, every event with a sequence_number from 0: response.created,
 * response.in_progress; per output item response.output_item.added, then for reasoning
 * response.reasoning_part.added / response.reasoning_text.delta / .done /
 * response.reasoning_part.done, for the message response.content_part.added /
 * response.output_text.delta / .done / response.content_part.done, for a function call
 * response.function_call_arguments.delta / .done; response.output_item.done; then
 * response.completed (response.incomplete with incomplete_details.reason
 * "max_output_tokens" when the length cap cut it). No [DONE].
 *
 * fake_rsp keeps the stream's state (sequence, open item, the items done so far). */
#ifndef FAKE_RESPONSES_H
#define FAKE_RESPONSES_H

#include <stdbool.h>
#include <stddef.h>

#include "fake_buf.h"
#include "fake_dialect.h"

typedef enum { FAKE_ITEM_NONE, FAKE_ITEM_REASONING, FAKE_ITEM_MESSAGE, FAKE_ITEM_CALL } fake_item;

typedef struct fake_rsp {
    long seq;  /* the next sequence_number */
    int index; /* the open item's output_index, or the next one's */
    fake_item open;
    char item_id[48];
    char call_id[48];
    char *name;      /* the open function call's name (owned) */
    fbuf text;       /* the open item's text so far */
    fbuf items;      /* the output items done so far, comma-separated JSON */
    unsigned serial; /* item ids */
} fake_rsp;

/* response.created and response.in_progress. */
void fake_resp_start(fbuf *out, fbuf *scratch, fake_rsp *r, const fake_ctx *c, long max_tokens);
/* One token on item kind k (a call: a new item when name is set, else an arguments delta). */
void fake_resp_token(fbuf *out, fbuf *scratch, fake_rsp *r, fake_item k, const char *text, size_t n,
                     const char *call_id, const char *name);
/* Closes the open item; response.completed (or .incomplete for "length"). */
void fake_resp_finish(fbuf *out, fbuf *scratch, fake_rsp *r, const fake_ctx *c, const char *finish,
                      long prompt, long completion, long reasoning);
/* The whole response object (every item, status completed/incomplete). The caller renders
 * the items with fake_resp_token into a scratch stream first; out gets the object. */
void fake_resp_object(fbuf *b, fake_rsp *r, const fake_ctx *c, const char *status,
                      const char *finish, long prompt, long completion, long reasoning);
/* The error event {"type":"error","code","message","param":null,"sequence_number"}. */
void fake_resp_error(fbuf *out, fbuf *scratch, fake_rsp *r, const char *message);
void fake_resp_free(fake_rsp *r);

#endif
