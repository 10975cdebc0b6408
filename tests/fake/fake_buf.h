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

typedef struct fbuf {
    char *p;    /* bytes; NUL-terminated whenever len < cap (always after a put) */
    size_t len; /* bytes in use */
    size_t cap; /* bytes allocated */
} fbuf;

/* Appends n bytes. Aborts the process on out-of-memory: the fake is a test tool and a
 * half-written event would only hide the real failure. */
void fbuf_put(fbuf *b, const void *s, size_t n);
void fbuf_puts(fbuf *b, const char *s);
/* printf-style append. */
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

/* Length in bytes of the UTF-8 sequence starting at s (at most n bytes available), or 0
 * when the bytes there are not valid UTF-8. */
size_t fake_utf8_len(const unsigned char *s, size_t n, unsigned *cp);

#endif
