/* chunkscan.h — the fast path for the commonest upstream event: one text delta.
 *
 * Nearly every event of a generation is a chunk whose only news is a few bytes of reasoning
 * or content. Building a cJSON tree for each and freeing it again was a third of the proxy's
 * CPU (bench profile), so this scanner walks the JSON once without allocating and fills a
 * dl_delta (root NULL) for exactly that shape: choices[0] with index 0 and a delta of
 * role / content / reasoning_content / reasoning, maybe a finish_reason, no tool calls,
 * usage or error. Two more shapes end every stream and are taken too: the last chunk
 * (finish_reason, usually no text) and the usage chunk ("choices":[] and a usage object),
 * which would otherwise cost a tree each per request. Anything else returns false and the
 * caller takes the full dialect parser (dl_parse), which stays the single authority on
 * meaning: whenever chunkscan accepts a chunk it reports the same fields dl_parse would,
 * except `usage`, which needs a tree and is left NULL (a chunk with usage is accepted only
 * without choices, n_choices 0, where the exchange does not read it), and a framed reading
 * (below) the same as a fresh walk, except id, model and created, which only a walk reports
 * (a framed chunk has the frame's, which its caller got from the walk that made the frame);
 * both checked by tests/unit/test_chunkscan.c and the fuzz target. */
#ifndef LG_CHUNKSCAN_H
#define LG_CHUNKSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proxy/buf.h"
#include "proxy/dialect.h"

#define CHUNKSCAN_FINISH_MAX 32 /* a longer finish_reason is left to dl_parse */

/* A frame's bytes (its head, then its tail), shared by the states of one thread whose
 * frames are the same bytes past their first few (chunkscan.c). */
struct chunkscan_frame;

/* The most bytes at a frame's start that a state keeps of its own (CHUNKSCAN_OWN_MAX, one
 * cache line): the bytes up to the last where its frame differs from the frame its
 * thread's streams share, a stream's id in the chunks of SGLang and vLLM. A stream whose
 * created time differs too (~98 bytes) makes a frame of its own, which the next streams
 * started in the same second share. */
#define CHUNKSCAN_OWN_MAX 64

/* Per stream: the buffer escaped strings are decoded into, and the frame of the last chunk
 * with exactly one text value — its bytes before and after that value's token. The next
 * chunk that has the same bytes around a new string (a stream's chunks nearly always do)
 * is read by comparisons and a string scan instead of the walk. The frame's bytes are its
 * first `own` bytes, kept in `own_block`, and the rest of `shared`'s: a thread's streams
 * (same model, same server) share one frame, which their tokens keep in cache, and each
 * reads its own few bytes (0 when the frame is its own). Zero-initialise (CHUNKSCAN_INIT);
 * chunkscan_free releases it, on the thread that read its chunks or after that thread
 * ended (the shared frames are the thread's). */
typedef struct chunkscan_state {
    /* What a framed reading touches, first and in 44 bytes (the exchange's layout note,
     * exchange_int.h; a holder may put them on one cache line with 8 bytes of its own). */
    struct chunkscan_frame *shared; /* NULL: no frame */
    char *own_block; /* CHUNKSCAN_OWN_MAX bytes from its first 64-byte boundary (NULL: none) */
    lg_buf scratch;  /* its memory is touched only by a reading that decodes an escape */
    uint8_t own;     /* the frame's first bytes that are the state's own (in own_block) */
    uint8_t field;   /* 0: no frame; else which key holds the text (1 content, 2
                        reasoning_content, 3 reasoning) */
    bool role;       /* the framed chunk had a role */
    /* in_frame: the last chunk accepted is the current frame around one string (read by
     * the frame, or the walk that made it), so its tree differs from the frame's first
     * chunk's only in that string's value. frame_gen: the frame's identity, a new number
     * whenever a walk makes a new frame (0: none yet). */
    bool in_frame;
    unsigned frame_gen;
    lg_buf meta;                       /* the last walk's id and model, each NUL-terminated */
    char finish[CHUNKSCAN_FINISH_MAX]; /* the last chunk's finish_reason, NUL-terminated */
    /* The lead: the last walk's bytes before its top-level "choices" key, and what the walk
     * had read by then (id and model as offsets into those bytes). A chunk that starts with
     * the same bytes — a stream's chunks share id, object, created and model — resumes the
     * walk at that key: the first text, the last and the usage chunk skip a third of it. */
    lg_buf lead;
    struct chunkscan_lead {
        size_t id_at, id_n, model_at, model_n;
        long long created;
        bool has_created, usage;
        unsigned seen;
    } lead_view;
} chunkscan_state;

#define CHUNKSCAN_INIT                                                                             \
    {                                                                                              \
        .scratch = LG_BUF_INIT, .meta = LG_BUF_INIT, .lead = LG_BUF_INIT                           \
    }

/* Scans data[0..len). On true, *out describes the chunk (kind DL_CHUNK, root NULL, no
 * owned parts: dl_delta_clear is not needed); text pointers point into `data` or into
 * st's scratch, finish_reason, id and model into st, all valid until the next call. `role` is non-NULL exactly when the delta has a
 * role, and points at no role text: test it for NULL only. On false, *out is zeroed and the
 * chunk needs dl_parse. O(len), no allocation once the buffers have grown. */
bool chunkscan(const char *data, size_t len, chunkscan_state *st, dl_delta *out);

/* chunkscan's first reading alone, for an SSE parser's vouch (sse_parser_vouch): true when
 * data is st's frame around one new JSON string, with *out and st as chunkscan leaves them
 * (chunkscan need not be called); data then holds no CR or LF (the frame's bytes came from
 * chunks that held none, and the string holds no control byte). False: *out is undefined,
 * and st is as chunkscan finds it. */
bool chunkscan_frames(const char *data, size_t len, chunkscan_state *st, dl_delta *out);

/* Prefetches what a framed reading (chunkscan_frames) reads beyond st's first 44 bytes:
 * the frame's own bytes. Reads st's first line. */
void chunkscan_warm(const chunkscan_state *st);

void chunkscan_free(chunkscan_state *st);

#endif
