/* xalloc.c — see xalloc.h. */
#include "proxy/xalloc.h"

#include <malloc.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Noreturn void lg_oom(size_t size)
{
    /* write(2), not fprintf: stdio may want a buffer, the memory that just ran out. */
    char msg[64];
    int n = snprintf(msg, sizeof msg, "loopguard: out of memory (%zu bytes)\n", size);
    if (n > 0)
        (void)!write(STDERR_FILENO, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    abort();
}

/* The spare blocks of the calling thread (see lg_xalloc_cache_begin). Class k holds blocks
 * whose glibc chunk is k * XA_GRAIN bytes (usable k * XA_GRAIN - 8, the header word before
 * them), each linked to the next through its first word.
 *
 * Which classes hold blocks follows the requests. A request takes from the class of its
 * own chunk or, when that is empty, from the one above: glibc hands out a chunk one grain
 * larger than asked when the rest of a free chunk would be too small to split off, and
 * such a block, kept by its size, would otherwise wait for a request of that size that
 * may never come while its own size's requests went to the allocator for more of them. A
 * freed block is kept only in a class a request looked in since the last sweep (`asked`).
 * When a block that is kept would pass the byte bound, a sweep first frees the blocks of
 * every class no request looked in since the sweep before, and the asking starts anew: a
 * size that stops being asked for (one of start-up, a realloc's) gives its room back
 * instead of holding the cache full, where every later free would go to the allocator.
 * A sweep comes at most once per XA_SWEEP_TAKES look-ups, so that a burst of frees into a
 * full cache does not sweep it empty, and its scan of the classes costs a few instructions
 * a look-up. */
#define XA_GRAIN       16
#define XA_CLASSES     ((LG_XALLOC_CACHE_MAX + 8) / XA_GRAIN + 1)
#define XA_SWEEP_TAKES 256u
typedef struct xa_cache {
    bool on;
    size_t bytes;               /* usable bytes kept, all classes */
    unsigned takes, swept;      /* look-ups, ever and at the last sweep (mod 2^32) */
    void *head[XA_CLASSES + 1]; /* the last one stays empty: the class above the top one */
    unsigned short n[XA_CLASSES];
    bool asked[XA_CLASSES + 1]; /* a request looked in class k since the last sweep */
} xa_cache;
static _Thread_local xa_cache xa;
/* The second word of a kept block (its first is the link): a block given to lg_xfree with
 * it is looked for in its class, and a double free aborts, as glibc's tcache does, rather
 * than handing the block to two requests. */
static const uintptr_t xa_key = (uintptr_t)0x6c67786130666b65ull;

static bool kept_already(const void *p, size_t k)
{
    uintptr_t tag;
    memcpy(&tag, (const char *)p + sizeof p, sizeof tag);
    if (tag != xa_key) return false;
    for (const void *q = xa.head[k]; q; memcpy(&q, q, sizeof q))
        if (q == p) return true;
    return false;
}

#define XA_USABLE (!LG_XALLOC_SANITIZED) /* the sanitizers' allocators see every block */
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define XA_UNDER_VALGRIND() RUNNING_ON_VALGRIND
#else
#define XA_UNDER_VALGRIND() 0
#endif

/* The class glibc's chunk for a request of `size` bytes falls in: the size with its header
 * word, rounded up to the grain, at least 32 (malloc.c's request2size). */
static size_t class_of_request(size_t size)
{
    size_t chunk = (size + 8 + XA_GRAIN - 1) & ~(size_t)(XA_GRAIN - 1);
    return (chunk < 32 ? 32 : chunk) / XA_GRAIN;
}

/* Unlinks class k's first block (there is one). */
static inline void *class_pop(size_t k)
{
    void *p = xa.head[k];
    memcpy(&xa.head[k], p, sizeof p);
    memset((char *)p + sizeof p, 0, sizeof xa_key); /* no longer kept */
    xa.n[k]--;
    xa.bytes -= k * XA_GRAIN - 8;
    return p;
}

/* A kept block for `size` bytes, or NULL (no cache, none in its class or the one above, too
 * large). */
static void *cache_take(size_t size)
{
    if (!xa.on || size > LG_XALLOC_CACHE_MAX) return NULL;
    size_t k = class_of_request(size);
    xa.asked[k] = xa.asked[k + 1] = true; /* it looks in k and k + 1 */
    xa.takes++;
    if (!xa.head[k] && !xa.head[++k]) return NULL;
    return class_pop(k);
}

/* Frees the blocks of every class no request looked in since the last sweep; the asking
 * starts anew. */
__attribute__((noinline, cold)) static void sweep(void)
{
    for (size_t k = 0; k < XA_CLASSES; k++)
        if (!xa.asked[k])
            while (xa.head[k])
                free(class_pop(k));
    memset(xa.asked, 0, sizeof xa.asked);
    xa.swept = xa.takes;
}

void lg_xfree(void *p)
{
    if (!p) return;
    if (XA_USABLE && xa.on) {
        /* A block of usable size u serves the requests whose chunk is at most u + 8: the
         * class below that bound, so a block is never handed to a request larger than it.
         * Under valgrind the usable size is the size asked for: one below the smallest
         * chunk's (24) would serve no request and could not hold the link. */
        size_t u = malloc_usable_size(p), k = (u + 8) / XA_GRAIN, kept = k * XA_GRAIN - 8;
        if (k < 32 / XA_GRAIN || u > LG_XALLOC_CACHE_MAX) {
            free(p);
            return;
        }
        if (kept_already(p, k)) {
            fputs("loopguard: lg_xfree: double free\n", stderr);
            abort();
        }
        if (xa.n[k] < LG_XALLOC_CACHE_KEEP && xa.asked[k]) {
            if (xa.bytes + kept > LG_XALLOC_CACHE_BYTES && xa.takes - xa.swept >= XA_SWEEP_TAKES)
                sweep();
            if (xa.bytes + kept <= LG_XALLOC_CACHE_BYTES) {
                memcpy(p, &xa.head[k], sizeof p);
                memcpy((char *)p + sizeof p, &xa_key, sizeof xa_key);
                xa.head[k] = p;
                xa.n[k]++;
                xa.bytes += kept;
                return;
            }
        }
    }
    free(p);
}

void lg_xalloc_cache_begin(void)
{
    xa.on = XA_USABLE && !XA_UNDER_VALGRIND();
}

void lg_xalloc_cache_end(void)
{
    xa.on = false;
    for (size_t k = 0; k < XA_CLASSES; k++)
        while (xa.head[k]) {
            void *p = xa.head[k];
            memcpy(&xa.head[k], p, sizeof p);
            free(p);
        }
    memset(&xa, 0, sizeof xa);
}

size_t lg_xalloc_cache_kept(void)
{
    return xa.bytes;
}

void *lg_xmalloc(size_t size)
{
    void *p = cache_take(size);
    if (p) return p;
    p = malloc(size ? size : 1);
    if (!p) lg_oom(size);
    return p;
}

void *lg_xcalloc(size_t n, size_t size)
{
    if (size && n <= SIZE_MAX / size) {
        void *p = cache_take(n * size);
        if (p) return memset(p, 0, n * size);
    }
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) lg_oom(n > SIZE_MAX / (size ? size : 1) ? SIZE_MAX : n * size);
    return p;
}

void *lg_xcalloc_lines(size_t n, void **block)
{
    char *b = lg_xmalloc(n + 63);
    *block = b;
    return memset(b + (-(uintptr_t)b & 63), 0, n);
}

void *lg_xrealloc(void *p, size_t size)
{
    if (!p) return lg_xmalloc(size);
    /* A block that grows moves to a kept one of its new size when there is one: libcurl's
     * buffers grow from 32 bytes by doubling, and each size they leave is kept for the next
     * buffer's growth. */
    size_t u;
    if (xa.on && size > (u = malloc_usable_size(p))) {
        void *q = cache_take(size);
        if (q) {
            memcpy(q, p, u);
            lg_xfree(p);
            return q;
        }
    }
    void *q = realloc(p, size ? size : 1);
    if (!q) lg_oom(size);
    return q;
}

char *lg_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(lg_xmalloc(n), s, n);
}

char *lg_xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *s;
    va_start(ap, fmt);
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) lg_oom(0);
    return s;
}
