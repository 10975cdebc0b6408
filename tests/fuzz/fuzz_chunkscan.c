/* fuzz_chunkscan.c — property: whenever the fast scanner accepts a chunk, the full dialect
 * parser reads the same fields from the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/chunkscan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lg_buf scratch = LG_BUF_INIT;
    dl_delta fast, full;
    const char *s = (const char *)data;
    bool ok = chunkscan(s, size, &scratch, &fast);
    dl_parse(s, size, &full);
    if (ok &&
        (full.kind != DL_CHUNK || full.n_choices != 1 || full.choice_index != 0 ||
         full.finish_reason || full.usage || full.n_tools ||
         (fast.role != NULL) != (full.role != NULL) ||
         fast.reasoning_keys != full.reasoning_keys ||
         fast.reasoning_len != full.reasoning_len || fast.content_len != full.content_len ||
         (fast.reasoning_len && memcmp(fast.reasoning, full.reasoning, fast.reasoning_len)) ||
         (fast.content_len && memcmp(fast.content, full.content, fast.content_len))))
        abort();
    dl_delta_clear(&full);
    lg_buf_free(&scratch);
    return 0;
}
