/* fake_buf.c — growable byte buffer and a Python-compatible JSON string writer.
 *
 * Buffers grow geometrically, so appending n bytes costs amortised O(n). fbuf_consume is
 * a memmove: callers that drain a buffer in small pieces should drain it whole and reset
 * instead (the server does: it writes everything it can, then consumes once). */
#include "fake_buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fbuf_reserve(fbuf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        fprintf(stderr, "fake_upstream: out of memory\n");
        abort();
    }
    b->p = p;
    b->cap = cap;
}

void fbuf_put(fbuf *b, const void *s, size_t n)
{
    fbuf_reserve(b, n);
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void fbuf_puts(fbuf *b, const char *s)
{
    fbuf_put(b, s, strlen(s));
}

void fbuf_printf(fbuf *b, const char *fmt, ...)
{
    /* Most pieces are short: format on the stack first, into the buffer only if needed. */
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        fbuf_put(b, small, (size_t)n);
        return;
    }
    fbuf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

size_t fake_utf8_len(const unsigned char *s, size_t n, unsigned *cp)
{
    unsigned c = s[0], v;
    size_t len;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        len = 2, v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07;
    } else {
        return 0;
    }
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3F);
    }
    /* Overlong forms, surrogates and values past U+10FFFF are not UTF-8. */
    if ((len == 3 && v < 0x800) || (len == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

void fbuf_json_str(fbuf *b, const char *s, size_t n, bool ascii)
{
    if (!s) {
        fbuf_put(b, "null", 4);
        return;
    }
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    fbuf_reserve(b, n + 2);
    b->p[b->len++] = '"';
    size_t i = 0;
    while (i < n) {
        /* Fast path: a run of plain printable ASCII is copied in one go. */
        size_t j = i;
        while (j < n && u[j] >= 0x20 && u[j] < 0x80 && u[j] != '"' && u[j] != '\\')
            j++;
        if (j > i) {
            fbuf_put(b, s + i, j - i);
            i = j;
            continue;
        }
        unsigned c = u[i];
        char esc[12];
        if (c == '"' || c == '\\') {
            esc[0] = '\\', esc[1] = (char)c;
            fbuf_put(b, esc, 2);
            i++;
        } else if (c < 0x20) {
            const char *named = c == '\n'   ? "\\n"
                                : c == '\r' ? "\\r"
                                : c == '\t' ? "\\t"
                                : c == '\b' ? "\\b"
                                : c == '\f' ? "\\f"
                                            : NULL;
            if (named) {
                fbuf_put(b, named, 2);
            } else {
                memcpy(esc, "\\u00", 4);
                esc[4] = hex[c >> 4], esc[5] = hex[c & 15];
                fbuf_put(b, esc, 6);
            }
            i++;
        } else {
            unsigned cp;
            size_t len = fake_utf8_len(u + i, n - i, &cp);
            bool bad = len == 0;
            if (bad) cp = 0xFFFD, len = 1;
            if (ascii) {
                unsigned units[2] = {cp, 0};
                int nu = 1;
                if (cp >= 0x10000) {
                    units[0] = 0xD800 + ((cp - 0x10000) >> 10);
                    units[1] = 0xDC00 + ((cp - 0x10000) & 0x3FF);
                    nu = 2;
                }
                for (int k = 0; k < nu; k++) {
                    snprintf(esc, sizeof esc, "\\u%04x", units[k]);
                    fbuf_put(b, esc, 6);
                }
            } else if (bad) {
                fbuf_put(b, "\xEF\xBF\xBD", 3);
            } else {
                fbuf_put(b, s + i, len);
            }
            i += len;
        }
    }
    fbuf_put(b, "\"", 1);
}

void fbuf_consume(fbuf *b, size_t n)
{
    if (n >= b->len) {
        fbuf_reset(b);
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = '\0';
}

void fbuf_reset(fbuf *b)
{
    b->len = 0;
    if (b->p) b->p[0] = '\0';
}

void fbuf_free(fbuf *b)
{
    if (!b) return;
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}
