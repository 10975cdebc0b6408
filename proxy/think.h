/* think.h — split reasoning inline in content (<think>…</think>) into two channels.
 *
 * Servers without a reasoning parser (or llama.cpp --reasoning-format none) stream the
 * model's reasoning inside content between <think> and </think>. The splitter takes the
 * content deltas as they come and emits the reasoning bytes and the content bytes; the
 * output does not depend on how the text was chunked (a tag may be cut at any byte:
 * "</th" + "ink>"), because bytes that may still be part of a tag are held until decided.
 *
 * Rules:
 *  - <think> opens only at the start of the text, after optional whitespace (at most
 *    THINK_MAX_LEAD bytes of it); the whitespace before it is dropped. Without it, the
 *    whole text is content — unless the splitter starts inside (the chat template opened
 *    the tag in the prompt: Qwen3.5/3.6), in which case the text is reasoning until
 *    </think> (a redundant leading <think> is then dropped too).
 *  - Only the first </think> splits; later ones stay in content where the guard's leak
 *    detector sees them. Whitespace right after it (Qwen emits "\n\n") is dropped.
 *  - A generation cut before </think> stays reasoning.
 * Cost: O(len) per feed; at most 8 bytes (or the leading whitespace) are held. */
#ifndef LG_THINK_H
#define LG_THINK_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/buf.h"

#define THINK_MAX_LEAD 64

typedef struct think_split think_split;

/* Never NULL (aborts on OOM). */
think_split *think_new(bool starts_inside);

/* Appends the reasoning part of `len` bytes to r and the content part to c. Bytes that
 * might be a partial tag are held until decided. */
void think_feed(think_split *t, const char *in, size_t len, lg_buf *r, lg_buf *c);

/* End of the text: flushes held bytes to the side they are on (leading whitespace or a
 * partial "<thi" to content, a partial "</th" inside reasoning to reasoning). */
void think_finish(think_split *t, lg_buf *r, lg_buf *c);

/* True while the splitter is (or, still at the start, would be) in the reasoning part. */
bool think_inside(const think_split *t);

/* True once the first </think> has been seen. */
bool think_closed(const think_split *t);

/* No-op on NULL. */
void think_free(think_split *t);

/* Hindsight split of a whole response: like a splitter that starts inside exactly when
 * the text contains "</think>" (a </think> without an opening <think> at the start means
 * the template opened it: everything before it is reasoning). Appends to r and c.
 * Returns true when any reasoning part was found. */
bool think_split_whole(const char *text, size_t len, lg_buf *r, lg_buf *c);

#endif
