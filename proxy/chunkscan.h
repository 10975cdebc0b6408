/* chunkscan.h — the fast path for the commonest upstream event: one text delta.
 *
 * Nearly every event of a generation is a chunk whose only news is a few bytes of reasoning
 * or content. Building a cJSON tree for each and freeing it again was a third of the proxy's
 * CPU (bench profile), so this scanner walks the JSON once without allocating and fills a
 * dl_delta (root NULL) for exactly that shape: choices[0] with index 0 and a delta of
 * role / content / reasoning_content / reasoning, no finish_reason, tool calls, usage or
 * error. Anything else returns false and the caller takes the full dialect parser
 * (dl_parse), which stays the single authority on meaning: whenever chunkscan accepts a
 * chunk it reports the same fields dl_parse would (checked by tests/unit/test_chunkscan.c and
 * the fuzz target). */
#ifndef LG_CHUNKSCAN_H
#define LG_CHUNKSCAN_H

#include <stdbool.h>
#include <stddef.h>

#include "proxy/buf.h"
#include "proxy/dialect.h"

/* Scans data[0..len). On true, *out describes the chunk (kind DL_CHUNK, root NULL, no
 * owned parts: dl_delta_clear is not needed); text pointers point into `data` or into
 * `scratch`, which the call resets and which must outlive the use of *out. On false, *out is
 * zeroed and the chunk needs dl_parse. O(len), no allocation once scratch has grown. */
bool chunkscan(const char *data, size_t len, lg_buf *scratch, dl_delta *out);

#endif
