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

void fbuf_reserve(fbuf *b, size_t extra)
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

const char fake_hex_digits[16] = "0123456789abcdef";

/* "00" "01" ... "99": two digits a division. */
static const char pairs[] = "0001020304050607080910111213141516171819"
                            "2021222324252627282930313233343536373839"
                            "4041424344454647484950515253545556575859"
                            "6061626364656667686970717273747576777879"
                            "8081828384858687888990919293949596979899";

/* Writes the two digits of v < 100 at out. */
static void put2(char *out, uint32_t v)
{
    memcpy(out, pairs + 2 * v, 2);
}

size_t fake_dec_u64(char *out, uint64_t v)
{
    char tmp[20]; /* UINT64_MAX has 20 digits */
    size_t i = sizeof tmp;
    /* The low eight digits in 32-bit pieces that do not wait on each other (a stamp has
     * fourteen: one 64-bit division, not seven in a chain). */
    while (v >= 100000000) {
        uint32_t lo = (uint32_t)(v % 100000000), hi4 = lo / 10000, lo4 = lo % 10000;
        v /= 100000000;
        i -= 8;
        put2(tmp + i, hi4 / 100), put2(tmp + i + 2, hi4 % 100);
        put2(tmp + i + 4, lo4 / 100), put2(tmp + i + 6, lo4 % 100);
    }
    uint32_t w = (uint32_t)v; /* < 100000000 */
    for (; w >= 100; w /= 100)
        put2(tmp + (i -= 2), w % 100);
    if (w >= 10)
        put2(tmp + (i -= 2), w);
    else
        tmp[--i] = (char)('0' + w);
    memcpy(out, tmp + i, sizeof tmp - i);
    return sizeof tmp - i;
}

void fbuf_put_long(fbuf *b, long v)
{
    char d[21];
    size_t n = 0;
    if (v < 0) d[n++] = '-';
    /* the magnitude as unsigned: -LONG_MIN does not fit a long */
    n += fake_dec_u64(d + n, v < 0 ? 0 - (uint64_t)v : (uint64_t)v);
    fbuf_put(b, d, n);
}

void fbuf_put_hex(fbuf *b, size_t v)
{
    char tmp[2 * sizeof v];
    size_t i = sizeof tmp;
    do {
        tmp[--i] = fake_hex_digits[v & 15];
        v >>= 4;
    } while (v);
    fbuf_put(b, tmp + i, sizeof tmp - i);
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

/* 1: the byte stands for itself inside a JSON string (printable ASCII and DEL, but '"'
 * and '\\'); 0: a control character to escape, or a byte of a UTF-8 sequence. */
static const unsigned char plain[256] = {
    [0x20] = 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* '"' */
    [0x30] = 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    [0x40] = 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    [0x50] = 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, /* '\\' */
    [0x60] = 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    [0x70] = 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

/* Appends the escaped form of the character at u (n > 0 bytes left, u[0] not plain) and
 * returns how many bytes of u it stood for. */
static size_t put_escaped(fbuf *b, const unsigned char *u, size_t n, bool ascii)
{
    unsigned c = u[0];
    char esc[12];
    if (c == '"' || c == '\\') {
        esc[0] = '\\', esc[1] = (char)c;
        fbuf_put(b, esc, 2);
        return 1;
    }
    if (c < 0x20) {
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
            esc[4] = fake_hex_digits[c >> 4], esc[5] = fake_hex_digits[c & 15];
            fbuf_put(b, esc, 6);
        }
        return 1;
    }
    unsigned cp;
    size_t len = fake_utf8_len(u, n, &cp);
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
        fbuf_put(b, u, len);
    }
    return len;
}

void fbuf_json_str(fbuf *b, const char *s, size_t n, bool ascii)
{
    if (!s) {
        fbuf_put(b, "null", 4);
        return;
    }
    const unsigned char *u = (const unsigned char *)s;
    fbuf_put(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        /* A run of plain bytes is copied in one go, then one escaped character. */
        size_t j = i;
        while (j < n && plain[u[j]])
            j++;
        fbuf_put(b, s + i, j - i);
        if (j < n) j += put_escaped(b, u + j, n - j, ascii);
        i = j;
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
