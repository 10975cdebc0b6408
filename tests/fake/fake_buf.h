/* fake_buf.h — growable byte buffer and JSON string writer for the fake upstream.
 *
 * Everything the fake upstream sends is assembled in these buffers: SSE events, HTTP
 * heads, JSON bodies and records. The JSON writer exists because the dialects must match
 * the real servers byte for byte (key order, compact separators, which characters are
 * escaped), which a generic printer such as cJSON_PrintUnformatted does not promise. */
#ifndef FAKE_BUF_H
#define FAKE_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fbuf {
    char *p;    /* bytes; NUL-terminated whenever len < cap (always after a put) */
    size_t len; /* bytes in use */
    size_t cap; /* bytes allocated */
} fbuf;

/* Makes room for extra more bytes and the NUL. Aborts the process on out-of-memory: the
 * fake is a test tool and a half-written event would only hide the real failure. */
void fbuf_reserve(fbuf *b, size_t extra);
/* Appends n bytes (s may be NULL when n is 0). Inline, as is fbuf_puts (whose strlen of a
 * literal then folds to a constant): a streamed token's event is some twenty pieces. */
static inline void fbuf_put(fbuf *b, const void *s, size_t n)
{
    if (b->cap - b->len <= n) fbuf_reserve(b, n); /* cap 0 (no storage) always reserves */
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}
static inline void fbuf_puts(fbuf *b, const char *s)
{
    fbuf_put(b, s, strlen(s));
}
/* Appends v in decimal, as printf's %ld writes it. */
void fbuf_put_long(fbuf *b, long v);
/* Appends v in lower-case hex without a prefix, as printf's %zx writes it (chunk sizes). */
void fbuf_put_hex(fbuf *b, size_t v);
/* printf-style append: for the cold paths (heads, records, whole bodies); the per-token
 * path appends with the functions above. */
void fbuf_printf(fbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends s[0..n) as a quoted JSON string. Escapes '"', '\\' and control characters the
 * way Python's json and pydantic do (\n \r \t \b \f, else \u00XX). ascii: also escape
 * every non-ASCII character as \uXXXX (surrogate pairs above U+FFFF), as json.dumps does
 * by default. Invalid UTF-8 bytes become U+FFFD either way. s may be NULL: writes null. */
void fbuf_json_str(fbuf *b, const char *s, size_t n, bool ascii);
/* Removes the first n bytes (consumed output). */
void fbuf_consume(fbuf *b, size_t n);
void fbuf_reset(fbuf *b);
/* Frees the storage; the struct is left empty and reusable. fbuf_free(NULL) is a no-op. */
void fbuf_free(fbuf *b);

/* "0123456789abcdef" (no NUL): chunk sizes, \u escapes, random ids. */
extern const char fake_hex_digits[16];
/* Writes v in decimal at out (room for 20 digits; no NUL) and returns the digit count. */
size_t fake_dec_u64(char *out, uint64_t v);

/* Length in bytes of the UTF-8 sequence starting at s (at most n bytes available), or 0
 * when the bytes there are not valid UTF-8. */
size_t fake_utf8_len(const unsigned char *s, size_t n, unsigned *cp);

#endif
