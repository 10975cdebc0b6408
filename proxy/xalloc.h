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
/* printf into a malloc'd string the caller frees; never NULL. */
char *lg_xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* p itself; lg_oom when p is NULL (a library's allocation that failed). */
static inline void *lg_xcheck(void *p)
{
    if (!p) lg_oom(0);
    return p;
}

#endif
