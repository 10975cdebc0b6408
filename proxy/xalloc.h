/* xalloc.h — allocation that cannot fail, and the one out-of-memory handler.
 *
 * loopguard's error policy on memory: running out aborts the process, the way Redis's
 * zmalloc does. A proxy that cannot allocate a few kilobytes for a request has no useful
 * way to answer it, and an error return for every allocation would be paths that are never
 * tested. So every allocation goes through these (or lg_buf, which uses them), and a
 * library that reports its own allocation failure as NULL (cJSON, curl_slist_append) has
 * that NULL handed to lg_oom. Everything else that can fail at run time (a socket, a
 * system call, bad input) is an error return that the caller handles or counts. */
#ifndef LG_XALLOC_H
#define LG_XALLOC_H

#include <stddef.h>

/* Prints "loopguard: out of memory (N bytes)" to stderr and aborts. */
_Noreturn void lg_oom(size_t size);

/* Like malloc/calloc/realloc/strdup, but never NULL (a size of 0 still returns a unique
 * pointer that free accepts). */
void *lg_xmalloc(size_t size);
void *lg_xcalloc(size_t n, size_t size);
void *lg_xrealloc(void *p, size_t size);
char *lg_xstrdup(const char *s);
/* n zeroed bytes at a 64-byte boundary, for a layout in whole cache lines, placed in a
 * block of n + 63 bytes from lg_xmalloc (so the thread's cache serves it: glibc's
 * aligned_alloc costs some 3,000 instructions more); *block is what lg_xfree takes back. */
void *lg_xcalloc_lines(size_t n, void **block);
/* Like free; the block may be kept as a spare (lg_xalloc_cache_begin). Any malloc'd block
 * may be given, and a block from these functions may go to free as well. */
void lg_xfree(void *p);
/* printf into a malloc'd string the caller frees; never NULL. */
char *lg_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A thread's spare heap blocks. Between lg_xalloc_cache_begin and lg_xalloc_cache_end, the
 * blocks of up to LG_XALLOC_CACHE_MAX bytes that the calling thread gives lg_xfree are kept
 * (at most LG_XALLOC_CACHE_KEEP of each size, LG_XALLOC_CACHE_BYTES in all) and handed to
 * its next lg_xmalloc, lg_xcalloc, lg_xstrdup or growing lg_xrealloc that would have got a
 * block of that size from the allocator, or one 16 bytes larger (as glibc itself gives when
 * the rest of a free chunk is too small to split off). Only sizes these requests ask for
 * are kept, and a size no longer asked for gives its blocks back when the bound is reached
 * (xalloc.c): blocks of a size nobody takes (a library's malloc, a shrunk realloc) never
 * hold the room that the sizes in use need. A worker's
 * request makes and drops about a hundred blocks through libcurl and cJSON (both allocate
 * here) and glibc's own per-thread cache keeps only 7 of a size, of up to 1 KiB: past that,
 * each block goes through its arena's bins and lock. Threads that never begin a cache
 * free as before; so do the sanitizer builds, whose checks of freed memory a kept block
 * would escape. */
/* The sanitizer builds keep nothing: GCC names them __SANITIZE_*__, clang (14) only in
 * __has_feature. Nor does a process under valgrind (lg_xalloc_cache_begin): memcheck too
 * must see every free, or a use after free of a kept block goes unreported. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LG_XALLOC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LG_XALLOC_SANITIZED 1
#endif
#endif
#ifndef LG_XALLOC_SANITIZED
#define LG_XALLOC_SANITIZED 0
#endif
#define LG_XALLOC_CACHE_MAX   4088
#define LG_XALLOC_CACHE_KEEP  64
#define LG_XALLOC_CACHE_BYTES (64u << 10)
void lg_xalloc_cache_begin(void);
/* Frees the calling thread's spare blocks and stops keeping them. */
void lg_xalloc_cache_end(void);
/* The usable bytes of the blocks the calling thread keeps. */
size_t lg_xalloc_cache_kept(void);

/* p itself; lg_oom when p is NULL (a library's allocation that failed). */
static inline void *lg_xcheck(void *p)
{
    if (!p) lg_oom(0);
    return p;
}

#endif
