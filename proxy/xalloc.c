/* xalloc.c — see xalloc.h. */
#include "proxy/xalloc.h"

#include <stdarg.h>
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

void *lg_xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p) lg_oom(size);
    return p;
}

void *lg_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) lg_oom(n > SIZE_MAX / (size ? size : 1) ? SIZE_MAX : n * size);
    return p;
}

void *lg_xrealloc(void *p, size_t size)
{
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
