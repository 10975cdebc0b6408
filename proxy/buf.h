/* buf.h — a growable byte buffer.
 *
 * Every protocol module of the proxy accumulates bytes somewhere: the SSE parser keeps the
 * incomplete tail of the stream, the think-tag splitter emits reasoning and content, the
 * exchange queues output for the client. lg_buf is that one buffer type. Memory grows
 * geometrically (amortised O(1) per appended byte) and running out of it aborts the process:
 * a proxy that cannot allocate a few kilobytes has no useful way to continue.
 *
 * Whenever p is non-NULL, p[len] is a NUL byte, so a buffer holding text can be passed to
 * string functions directly. A zeroed struct (LG_BUF_INIT) is an empty buffer. */
#ifndef LG_BUF_H
#define LG_BUF_H

#include <stddef.h>
#include <string.h>

typedef struct lg_buf {
    char *p;
    size_t len, cap;
} lg_buf;

#define LG_BUF_INIT                                                                                \
    {                                                                                              \
        NULL, 0, 0                                                                                 \
    }

/* Makes room for `extra` more bytes (plus the NUL) without changing len. */
void lg_buf_reserve(lg_buf *b, size_t extra);
/* Appends n bytes from s (s may be NULL when n is 0). Inline when they fit, the usual
 * case of a buffer that is reused: a token's few bytes pass through several. */
void lg_buf_append_grow(lg_buf *b, const void *s, size_t n);
static inline void lg_buf_append(lg_buf *b, const void *s, size_t n)
{
    if (n >= b->cap - b->len) { /* strict: one byte stays for the NUL (and cap 0: no block) */
        lg_buf_append_grow(b, s, n);
        return;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}
/* Appends a NUL-terminated string. */
void lg_buf_append_str(lg_buf *b, const char *s);
/* Appends the code point cp (at most U+10FFFF) in UTF-8. */
void lg_buf_append_utf8(lg_buf *b, unsigned cp);
/* Appends printf-formatted text. */
void lg_buf_printf(lg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes (all of them when n >= len). O(len - n): the rest is moved to the
 * front, so a queue drained in small pieces wants an lg_fifo (below). */
void lg_buf_consume(lg_buf *b, size_t n);
/* Empties the buffer and keeps its memory for reuse. Inline: several per token. */
static inline void lg_buf_reset(lg_buf *b)
{
    b->len = 0;
    if (b->p) b->p[0] = '\0';
}
/* Returns the contents as a malloc'd NUL-terminated string (never NULL; "" when empty) that
 * the caller owns, and leaves the buffer empty with no memory. */
char *lg_buf_steal(lg_buf *b);
/* Frees the memory and leaves an empty buffer; no-op on NULL or an empty buffer. */
void lg_buf_free(lg_buf *b);

/* A thread's spare buffer memory. Between lg_buf_cache_begin and lg_buf_cache_end, the
 * calling thread keeps the blocks of up to 128 KiB that its buffers give up (lg_buf_free,
 * lg_fifo_free, the old block of a buffer that grows) and hands them to the next buffers
 * that start or grow on it, instead of freeing them and asking the allocator again: a
 * worker's requests each make and drop a dozen small buffers, and at saturation each
 * upstream read of a stream grows its output queue to the read's size (up to 128 KiB) and
 * drops it once written, a malloc and a free a read. A block is given only to a buffer
 * that would have got a block of that very size from the allocator (the capacities are the
 * ones growth from empty gives), so a live buffer holds no more memory than without the
 * cache; a thread keeps at most LG_BUF_CACHE_KEEP blocks of each size up to 2 KiB (about
 * 64 KiB in all) and LG_BUF_CACHE_KEEP_BIG of each larger size (504 KiB), whatever the
 * number of streams. A block comes as an empty buffer (its first byte the NUL); like memory from
 * malloc, it holds its last user's bytes past that, which no lg_buf function reads.
 * Threads that never begin a cache free as before. */
#define LG_BUF_CACHE_KEEP     16
#define LG_BUF_CACHE_KEEP_BIG 2
void lg_buf_cache_begin(void);
/* Frees the calling thread's spare blocks and stops keeping them. */
void lg_buf_cache_end(void);

/* A byte queue: appended at the back, taken from the front. Taking moves a read offset;
 * the bytes still queued are moved down only once the taken ones outnumber them, so a
 * queue drained in small pieces costs O(1) per byte however long it grows (lg_buf_consume
 * on a plain buffer would move the whole rest each time). A zeroed struct is empty. */
typedef struct lg_fifo {
    lg_buf b; /* b.p[off .. b.len) is queued */
    size_t off;
} lg_fifo;

/* Bytes queued. */
static inline size_t lg_fifo_len(const lg_fifo *f)
{
    return f->b.len - f->off;
}
/* Queues n bytes from s (s may be NULL when n is 0). */
static inline void lg_fifo_append(lg_fifo *f, const void *s, size_t n)
{
    lg_buf_append(&f->b, s, n);
}
/* The queued bytes in place: *n of them at the returned pointer (NULL when empty), valid
 * until the queue changes. */
static inline const char *lg_fifo_peek(const lg_fifo *f, size_t *n)
{
    *n = lg_fifo_len(f);
    return *n ? f->b.p + f->off : NULL;
}
/* Drops the first n bytes (n <= lg_fifo_len). */
void lg_fifo_drop(lg_fifo *f, size_t n);
/* Takes back the bytes queued after the first `keep` (keep <= lg_fifo_len). */
static inline void lg_fifo_cut(lg_fifo *f, size_t keep)
{
    f->b.len = f->off + keep;
}
/* Moves up to `max` bytes from the front of the queue into dst; returns how many. */
size_t lg_fifo_take(lg_fifo *f, void *dst, size_t max);
/* Frees the memory and leaves an empty queue. */
void lg_fifo_free(lg_fifo *f);
/* Frees the memory of an empty queue that holds more than `keep` bytes of it: a queue that
 * grew for a burst keeps no more than a steady trickle needs once the burst has left. */
void lg_fifo_shrink(lg_fifo *f, size_t keep);

#endif
