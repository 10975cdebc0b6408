/* chunked.h — the HTTP/1.1 response body decoder of the load tools (loadgen, soakload):
 * chunked transfer coding (RFC 9112 section 7.1), Content-Length, or until the connection
 * closes. Incremental: the bytes may arrive split anywhere.
 *
 * Strict, because the tools are there to notice a proxy that breaks framing: a chunk-size
 * line needs at least one hex digit and ends in CR LF (an extension after ';' or
 * whitespace is skipped), chunk data is followed by CR LF, a chunk of 2^40 bytes or more
 * is an error. Trailer fields are skipped up to the empty line. */
#ifndef LG_BENCH_CHUNKED_H
#define LG_BENCH_CHUNKED_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum { BODY_CLOSE, BODY_LENGTH, BODY_CHUNKED } body_framing;

typedef struct body_decoder {
    int state;
    uint64_t left;     /* bytes of the chunk or of the Content-Length still to come */
    unsigned digits;   /* hex digits of the chunk-size line so far */
    uint64_t line_len; /* bytes of the trailer line so far */
} body_decoder;

/* Body bytes for the tool: returns 0, or < 0 to stop decoding with an error (a body too
 * large for the tool, a runaway line in it). */
typedef int (*body_data_fn)(void *ud, const char *p, size_t n);

/* Starts a body with the given framing (`length` only for BODY_LENGTH). A Content-Length
 * of 0 is complete at once. */
void body_start(body_decoder *d, body_framing f, uint64_t length);
/* Decodes up to n bytes at p, giving the body bytes to data(ud, ...). Returns the bytes
 * consumed (fewer than n only when the body ended inside them: the rest is not this
 * body's), or -1 on a framing error or when data returned < 0. */
ssize_t body_decode(body_decoder *d, const char *p, size_t n, body_data_fn data, void *ud);
/* The body is complete (never for BODY_CLOSE: that one ends with the connection). */
bool body_done(const body_decoder *d);

#endif
