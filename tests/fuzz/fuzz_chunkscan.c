/* fuzz_chunkscan.c — properties: whenever the fast scanner accepts a chunk, the full dialect
 * parser reads the same fields from the same bytes (usage aside, see chunkscan.h); and a
 * state framed by an earlier chunk reads a chunk as a fresh state does (id, model and
 * created aside, which only a walk reports). The input is two chunks split at its first
 * newline: the first primes a state, the second is scanned by both (the primed one first
 * by chunkscan_frames, which reads it as chunkscan would when it takes it, and takes it
 * only when it holds no CR or LF). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/chunkscan.h"

static bool same(const dl_delta *a, const dl_delta *b)
{
    return a->n_choices == b->n_choices &&
           (a->finish_reason != NULL) == (b->finish_reason != NULL) &&
           (!a->finish_reason || !strcmp(a->finish_reason, b->finish_reason)) &&
           (a->role != NULL) == (b->role != NULL) && a->reasoning_keys == b->reasoning_keys &&
           a->reasoning_len == b->reasoning_len && a->content_len == b->content_len &&
           (!a->reasoning_len || !memcmp(a->reasoning, b->reasoning, a->reasoning_len)) &&
           (!a->content_len || !memcmp(a->content, b->content, a->content_len));
}

/* id, model and created, which only a walk (a fresh state) reports. */
static bool same_meta(const dl_delta *a, const dl_delta *b)
{
    return (a->id != NULL) == (b->id != NULL) && (!a->id || !strcmp(a->id, b->id)) &&
           (a->model != NULL) == (b->model != NULL) && (!a->model || !strcmp(a->model, b->model)) &&
           a->has_created == b->has_created && (!a->has_created || a->created == b->created);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data, *nl = memchr(s, '\n', size);
    size_t first = nl ? (size_t)(nl - s) : 0, off = nl ? first + 1 : 0;
    chunkscan_state fresh = CHUNKSCAN_INIT, primed = CHUNKSCAN_INIT;
    dl_delta fast, framed, full;
    if (nl) (void)chunkscan(s, first, &primed, &framed);
    bool ok = chunkscan(s + off, size - off, &fresh, &fast);
    bool frames = chunkscan_frames(s + off, size - off, &primed, &framed);
    if (frames && (memchr(s + off, '\n', size - off) || memchr(s + off, '\r', size - off))) abort();
    if ((frames || chunkscan(s + off, size - off, &primed, &framed)) != ok ||
        (ok && !same(&fast, &framed)))
        abort();
    dl_parse(s + off, size - off, &full);
    if (ok && (full.kind != DL_CHUNK || full.choice_index != 0 || fast.usage ||
               (full.n_choices && full.usage) || full.n_tools || !same(&fast, &full) ||
               !same_meta(&fast, &full)))
        abort();
    dl_delta_clear(&full);
    chunkscan_free(&fresh);
    chunkscan_free(&primed);
    return 0;
}
