/* buf.c — the growable byte buffer (see buf.h). */
#include "proxy/buf.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/xalloc.h"

/* The calling thread's spare blocks (see lg_buf_cache_begin): class k holds blocks of
 * exactly 64 << k bytes, the capacities lg_buf_reserve gives a buffer grown from empty, at
 * most cache_keep(k) of them. */
#define CACHE_CLASSES 12 /* 64 .. 131072 bytes */
#define CACHE_SMALL   6  /* 64 .. 2048: LG_BUF_CACHE_KEEP each; larger: LG_BUF_CACHE_KEEP_BIG */
typedef struct buf_cache {
    bool on;
    unsigned n[CACHE_CLASSES];
    char *blk[CACHE_CLASSES][LG_BUF_CACHE_KEEP];
} buf_cache;
static _Thread_local buf_cache cache;

/* The class of a block of `cap` bytes, or -1 when the cache keeps no such blocks (off, or a
 * capacity growth from empty does not give). */
static int cache_class(size_t cap)
{
    if (!cache.on) return -1;
    for (int k = 0; k < CACHE_CLASSES; k++)
        if (cap == (size_t)64 << k) return k;
    return -1;
}

static unsigned cache_keep(int k)
{
    return k < CACHE_SMALL ? LG_BUF_CACHE_KEEP : LG_BUF_CACHE_KEEP_BIG;
}

/* Takes ownership of block p of `cap` bytes: kept as a spare, or freed. */
static void cache_put(char *p, size_t cap)
{
    int k = cache_class(cap);
    if (k >= 0 && cache.n[k] < cache_keep(k))
        cache.blk[k][cache.n[k]++] = p;
    else
        free(p);
}

void lg_buf_cache_begin(void)
{
    cache.on = true;
}

void lg_buf_cache_end(void)
{
    for (int k = 0; k < CACHE_CLASSES; k++)
        while (cache.n[k])
            free(cache.blk[k][--cache.n[k]]);
    cache.on = false;
}

void lg_buf_reserve(lg_buf *b, size_t extra)
{
    if (extra < b->cap - b->len) return; /* strict: one byte stays for the NUL */
    size_t need = b->len + extra + 1;
    if (need < b->len) lg_oom(SIZE_MAX); /* size_t overflow */
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) {
            cap = need;
            break;
        }
        cap *= 2;
    }
    int k = cache_class(cap);
    if (k >= 0 && cache.n[k]) { /* a spare of the size the allocator would give */
        char *p = cache.blk[k][--cache.n[k]];
        if (b->p) {
            memcpy(p, b->p, b->len); /* the NUL is written below */
            cache_put(b->p, b->cap);
        }
        b->p = p;
    } else {
        b->p = lg_xrealloc(b->p, cap);
    }
    b->cap = cap;
    b->p[b->len] = '\0'; /* a new block holds no text yet, whoever had it last */
}

void lg_buf_append_grow(lg_buf *b, const void *s, size_t n)
{
    lg_buf_reserve(b, n);
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void lg_buf_append_str(lg_buf *b, const char *s)
{
    lg_buf_append(b, s, strlen(s));
}

void lg_buf_append_utf8(lg_buf *b, unsigned cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3f)), n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f)), n = 3;
    } else {
        u[0] = (char)(0xf0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (char)(0x80 | (cp & 0x3f)), n = 4;
    }
    lg_buf_append(b, u, n);
}

void lg_buf_printf(lg_buf *b, const char *fmt, ...)
{
    va_list ap, ap2;
    lg_buf_reserve(b, 64);
    va_start(ap, fmt);
    va_copy(ap2, ap);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->p + b->len, room, fmt, ap);
    va_end(ap);
    if (n < 0) abort();
    if ((size_t)n >= room) { /* did not fit: grow once and format again */
        lg_buf_reserve(b, (size_t)n);
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap2);
    }
    va_end(ap2);
    b->len += (size_t)n;
}

void lg_buf_consume(lg_buf *b, size_t n)
{
    if (n >= b->len) {
        lg_buf_reset(b);
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = '\0';
}

char *lg_buf_steal(lg_buf *b)
{
    if (!b->p) lg_buf_reserve(b, 0);
    char *p = b->p;
    p[b->len] = '\0';
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void lg_buf_free(lg_buf *b)
{
    if (!b) return;
    if (b->p) cache_put(b->p, b->cap);
    b->p = NULL;
    b->len = b->cap = 0;
}

void lg_fifo_drop(lg_fifo *f, size_t n)
{
    f->off += n;
    if (f->off == f->b.len) { /* drained: start over at the front */
        lg_buf_reset(&f->b);
        f->off = 0;
    } else if (f->off >= f->b.len - f->off) { /* moves at most as many bytes as were dropped */
        lg_buf_consume(&f->b, f->off);
        f->off = 0;
    }
}

size_t lg_fifo_take(lg_fifo *f, void *dst, size_t max)
{
    size_t len = lg_fifo_len(f), k = len < max ? len : max;
    if (k) memcpy(dst, f->b.p + f->off, k);
    lg_fifo_drop(f, k);
    return k;
}

void lg_fifo_free(lg_fifo *f)
{
    lg_buf_free(&f->b);
    f->off = 0;
}

void lg_fifo_shrink(lg_fifo *f, size_t keep)
{
    if (!lg_fifo_len(f) && f->b.cap > keep) lg_fifo_free(f);
}
