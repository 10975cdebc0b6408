/* assemble.h — the whole (non-streaming) response built from a released stream.
 *
 * loopguard streams from the upstream even when the client asked for one JSON response,
 * so that a loop is cut early. The assembler collects what the proxy released to the
 * client (text per channel, tool calls, metadata, usage) and renders the chat.completion
 * or text_completion object the upstream would have returned whole: id, object, created,
 * model, system_fingerprint (and other top-level fields the chunks carried),
 * choices[0] {index, message {role, content, reasoning per output mode, tool_calls},
 * logprobs null, finish_reason, matched_stop/stop_reason as received}, usage as received. */
#ifndef LG_ASSEMBLE_H
#define LG_ASSEMBLE_H

#include <stdbool.h>
#include <stddef.h>

#include "guard/guard.h"
#include "proxy/dialect.h"

typedef struct lg_assembler lg_assembler;

/* chat: chat.completion, else text_completion. Never NULL (aborts on OOM). */
lg_assembler *asm_new(bool chat);

/* Takes from a parsed chunk: id, model, created, system_fingerprint and other top-level
 * fields, finish_reason and extra choice fields (matched_stop, stop_reason: a later
 * non-null value replaces an earlier one, null never replaces a value), usage (the last
 * non-null one), and tool-call fragments (accumulated by index: id, name, arguments
 * concatenated — unless asm_tool_args_external was set). Does NOT take text: released
 * text comes through asm_text. Ignores chunks that are not DL_CHUNK. */
void asm_meta(lg_assembler *a, const dl_delta *d);

/* Appends released text to a channel: LG_CH_REASONING or LG_CH_CONTENT (LG_CH_TOOL_ARGS:
 * appended to the arguments of the most recent tool call, see asm_tool_args). */
void asm_text(lg_assembler *a, int channel, const char *s, size_t n);

/* When set, asm_meta takes tool ids/names but not arguments; the caller releases them
 * with asm_tool_args (for guarded, held-back tool arguments). */
void asm_tool_args_external(lg_assembler *a, bool external);
/* Appends released arguments to the tool call with this index (created if new). */
void asm_tool_args(lg_assembler *a, int index, const char *s, size_t n);

/* Overrides the finish_reason (e.g. "content_filter"); NULL clears the override. */
void asm_set_finish(lg_assembler *a, const char *finish_reason);

/* Renders the response with reasoning placed per `mode` (lg_reasoning_output): 0
 * message.reasoning_content, 1 message.reasoning, 2 "<think>R</think>\n\n" before the
 * content, 3 dropped. content is "" when empty, null only when there are tool calls and
 * no content. Returns a malloc'd JSON string. */
char *asm_render(const lg_assembler *a, int mode);

/* Bytes released per channel so far (LG_CH_REASONING / LG_CH_CONTENT). */
size_t asm_text_len(const lg_assembler *a, int channel);

/* No-op on NULL. */
void asm_free(lg_assembler *a);

#endif
