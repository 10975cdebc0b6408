/* httphead.h — the strict checks loopguard applies to a client's request head before
 * anything is routed or forwarded (RFC 9112 §2.2, §3, §5, §6.1, §6.3; HAProxy and nginx
 * reject the same things).
 *
 * libmicrohttpd parses the head itself and is lenient: it keeps a bare CR inside a field
 * value, a field name with whitespace or control bytes in it ("Transfer-Encoding :"), a
 * space or tab inside the request target, duplicate Content-Length and Host fields, any
 * Transfer-Encoding value, and versions such as HTTP/1.2. These functions judge what it
 * parsed; they are pure (no libmicrohttpd, no allocation except hh_path_normalize's
 * result) so that unit tests and the fuzzer drive them directly. What libmicrohttpd hides
 * from the access handler (a NUL cuts a line short; an obs-fold line is glued onto the
 * previous field) is caught on the raw bytes by hh_stream below. */
#ifndef LG_HTTPHEAD_H
#define LG_HTTPHEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One header field as parsed (not NUL-terminated as far as these functions care). */
typedef struct hh_field {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
} hh_field;

typedef struct hh_request {
    const char *method;  /* NUL-terminated */
    const char *target;  /* the path as parsed (query string separate), NUL-terminated */
    const char *version; /* "HTTP/1.1" */
    const hh_field *fields;
    size_t n_fields;
} hh_request;

typedef struct hh_verdict {
    int status;               /* 0: acceptable; otherwise 400, 501 or 505 */
    const char *message;      /* static text for the error body (status != 0) */
    const char *code;         /* static OpenAI-style error code (status != 0) */
    bool chunked;             /* the body is framed by Transfer-Encoding: chunked */
    long long content_length; /* -1 when absent */
} hh_verdict;

/* Judges the request head. Returns v->status (0 when acceptable). Rejected: a method that
 * is not a token; a version other than HTTP/1.0 or HTTP/1.1 (505); a field name that is
 * empty or not a token (whitespace before the colon, control bytes, a folded line's
 * leftovers); a value holding CR, LF, NUL or another control byte except HTAB; no Host
 * in HTTP/1.1 or more than one Host; more than one Content-Length or one that is not a
 * plain decimal; Transfer-Encoding in HTTP/1.0, together with Content-Length, repeated,
 * or naming any coding but a single "chunked" (501 for an unknown coding). */
int hh_check(const hh_request *req, hh_verdict *v);

/* True when the query-string piece s[0..n) (a key or value as the client sent it) holds
 * only bytes allowed in a request target: no controls, space, '#', or non-ASCII. */
bool hh_query_piece_ok(const char *s, size_t n);

/* Whether the comma-separated list v[0..n) (a Connection or Transfer-Encoding value) has
 * `tok`, compared without case and without the white space around elements: as its last
 * non-empty element when `last` (a Transfer-Encoding's final coding), else as any. */
bool hh_list_has(const char *v, size_t n, const char *tok, bool last);
/* A Content-Length value s[0..n): 1*DIGIT (RFC 9110 §8.6), at most 18 digits so that it fits
 * a long long. True with *out set, else false. */
bool hh_parse_length(const char *s, size_t n, long long *out);

/* Normalises an origin-form path (RFC 3986 §6.2.2): percent-encoded unreserved characters
 * are decoded ("%2e" -> ".", "%69" -> "i") so the upstream's router and ours see the same
 * path. Rejects (returns -1, *out untouched) a path that does not start with '/', holds a
 * byte outside pchar / '/' (controls, space, '#', '\\', non-ASCII, ...), a malformed
 * escape, an encoded '/', '\\' or control byte, or a "." or ".." segment after decoding.
 * On success returns 0 with *out a malloc'd NUL-terminated path (caller frees), never
 * longer than the input. */
int hh_path_normalize(const char *path, char **out);

/* ---- the raw request stream of one connection ------------------------------------------ */

/* libmicrohttpd 0.9.75 (Debian 12's) parses a head in place and hands the access handler
 * only what survives: a NUL ends the string it is in (the rest of that line is lost), and
 * an obs-fold line (one starting with SP or HTAB) is appended to the previous field with
 * no trace. RFC 9112 §5.2 and RFC 9110 §5.5 let a server reject both with 400, as HAProxy
 * and nginx do, and no option or value length of libmicrohttpd 0.9.75 reveals them. So the
 * edge follows the bytes libmicrohttpd reads from each client socket (edge_received) with
 * this tracker, which frames requests as libmicrohttpd does for every head hh_check
 * accepts: lines end at LF, a CR right before it dropped; empty lines before a request
 * line are skipped; the head ends at the first empty line; the body is Content-Length
 * bytes, or chunks (hex size, an extension after ';', CRLF or LF, the data, CRLF or LF)
 * up to a zero-size one and the trailer lines after it. Pipelined requests in one read
 * are followed too. Heads are numbered from 1 in the order they begin; refuse_from names
 * the first one to refuse:
 *  - a NUL anywhere in a head or in the empty lines before it, or a line of the field
 *    section that starts with SP or HTAB (obs-fold, also whitespace right after the
 *    request line): that head;
 *  - framing other than none, one Content-Length of 1-18 digits, or one Transfer-Encoding
 *    of exactly "chunked" (what hh_check lets through but libmicrohttpd would frame
 *    differently, e.g. "chunked " with a trailing blank): that head;
 *  - a NUL or obs-fold in the trailer section, or a chunk framing error (libmicrohttpd
 *    then answers 400 and closes): the head after it, as the tracker stops there.
 * Constant memory; O(1) per read for body bytes, one pass over head, chunk-size and
 * trailer bytes. The caller refuses a head with a number >= refuse_from (and closes). */
typedef struct hh_stream {
    uint64_t heads;       /* request heads begun so far */
    uint64_t refuse_from; /* 0, or the number of the first head to refuse */
    const char *why;      /* its reason and OpenAI-style error code (static; refuse_from != 0) */
    const char *code;
    uint64_t left;   /* body or chunk bytes still to pass over; a chunk size being read */
    uint64_t length; /* the Content-Length of the head being read */
    uint8_t state;   /* where in the stream (httphead.c's hs_state) */
    bool in_line;    /* the current line has content */
    bool cr;         /* a CR was read and is held back: it is dropped if LF follows */
    uint8_t fcand;   /* framing names the current field name can still be (bit mask) */
    uint8_t fkind;   /* the framing field whose value is being read, 0 none */
    uint8_t fpos;    /* bytes matched of the name or of "chunked", digits of a length;
                      * in a chunk size line, whether a digit was read */
    uint8_t fphase;  /* name, blanks before the value, value, ignored */
    bool fbad;       /* a framing value not of the one accepted form */
    uint8_t lengths; /* Content-Length and Transfer-Encoding fields of this head */
    uint8_t codings;
} hh_stream;

/* Follows n more bytes read from the connection (s zero-initialised at accept). */
void hh_stream_feed(hh_stream *s, const char *buf, size_t n);

/* Constant-time comparison of two NUL-terminated secrets: the time depends only on the
 * length of `given` (the attacker's input), never on where the first difference is.
 * False when either is NULL. */
bool hh_secret_equal(const char *given, const char *secret);

#endif
