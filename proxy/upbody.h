/* upbody.h — an upstream response's framing, read outside libcurl: where a response head
 * ends, and the chunked transfer coding of the body after it (RFC 9112 §7.1).
 *
 * Both are streaming: the input may be split at any byte, and each call takes what it is
 * given and keeps the little state it needs (no buffering, no allocation).
 *
 * The head's end is found as libcurl 7.88 finds it (http.c, Curl_http_readwrite_headers):
 * a header line is a run of bytes up to LF, and a line whose first byte is CR or LF ends
 * the head. The worker cuts what it hands libcurl there (worker.c), so the two must agree.
 *
 * The chunk decoder takes what libcurl 7.88's takes (http_chunks.c), since it takes its
 * place: an upstream that streamed through libcurl must stream the same. A size line is 1
 * to 16 hex digits (a size above INT64_MAX is an error), then anything up to an LF (an
 * extension, a CR: skipped); a chunk's data is followed by any number of CRs and an LF.
 * Anything else is an error.
 * The decoder stops at the terminal chunk's size line ("0\r\n"): the trailer section and
 * the final CRLF are left to the caller (the worker hands them to libcurl, which ends the
 * transfer and keeps the connection). */
#ifndef LG_UPBODY_H
#define LG_UPBODY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Where a response head ends. Starts zeroed, one per head (reset it after an end). */
typedef struct upbody_head {
    uint8_t at; /* 0: inside a line; 1: at a line's start; 2: in a line that began with CR */
} upbody_head;

/* The offset just past the end of the head in p[0..n) (the LF of the line that ends it),
 * or 0 when the head does not end in it (the state carries over to the next bytes). After
 * an end the state is reset for the next head. */
size_t upbody_head_end(upbody_head *h, const char *p, size_t n);

/* A chunked body's decoder. Starts zeroed, at the first chunk's size line. */
typedef struct upbody {
    uint8_t state;
    uint8_t digits;
    uint64_t left; /* the size being read, then the current chunk's data still to come */
} upbody;

#define UPBODY_BAD ((ssize_t)-1)

/* Decodes p[0..n) up to the end of its next data run (and the CR LF after it, when the run
 * ends its chunk and p holds them). Returns the bytes consumed: framing, then *len data
 * bytes at *data (inside the consumed span, followed only by framing; *len is 0 when the
 * consumed bytes hold no data). Returns fewer than n only when it stopped after a data run
 * or at the terminal chunk (upbody_ended). UPBODY_BAD: the framing is broken (the state is
 * then undefined). */
ssize_t upbody_next(upbody *d, const char *p, size_t n, const char **data, size_t *len);

/* The last `len` data bytes upbody_next handed out were not taken: they are still due, and
 * the next input is to start at them (*data): the framing consumed after them comes again. */
void upbody_unread(upbody *d, size_t len);

/* The terminal chunk's size line was consumed: what follows is the trailer section. */
bool upbody_ended(const upbody *d);

/* True when p[0..n), the bytes of a read after a chunk's data, certainly hold another chunk's
 * data: the data's line end, a whole size line that does not start with 0 (the terminal
 * chunk's may), and a byte of its data. In doubt, false (the exchange's bursts of tokens
 * must not outlive the read: exchange_int.h). */
bool upbody_data_follows(const char *p, size_t n);

#endif
