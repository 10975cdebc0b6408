/* httphead.h — the strict checks loopguard applies to a client's request head before
 * anything is routed or forwarded (RFC 9112 §2.2, §3, §5, §6.1, §6.3; HAProxy and nginx
 * reject the same things).
 *
 * libmicrohttpd parses the head itself and is lenient: it keeps a bare CR inside a field
 * value, a field name with whitespace or control bytes in it ("Transfer-Encoding :"), a
 * space or tab inside the request target, duplicate Content-Length and Host fields, any
 * Transfer-Encoding value, and versions such as HTTP/1.2. These functions judge what it
 * parsed; they are pure (no libmicrohttpd, no allocation except hh_path_normalize's
 * result) so that unit tests and the fuzzer drive them directly. What libmicrohttpd loses
 * before we see it (a NUL truncates the line at the NUL; an obs-fold line is glued onto
 * the previous field's name) is consistent between what loopguard routes and what it
 * forwards, because the relay re-creates every header from the parsed values. */
#ifndef LG_HTTPHEAD_H
#define LG_HTTPHEAD_H

#include <stdbool.h>
#include <stddef.h>

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

/* Normalises an origin-form path (RFC 3986 §6.2.2): percent-encoded unreserved characters
 * are decoded ("%2e" -> ".", "%69" -> "i") so the upstream's router and ours see the same
 * path. Rejects (returns -1, *out untouched) a path that does not start with '/', holds a
 * byte outside pchar / '/' (controls, space, '#', '\\', non-ASCII, ...), a malformed
 * escape, an encoded '/', '\\' or control byte, or a "." or ".." segment after decoding.
 * On success returns 0 with *out a malloc'd NUL-terminated path (caller frees), never
 * longer than the input. */
int hh_path_normalize(const char *path, char **out);

/* Constant-time comparison of two NUL-terminated secrets: the time depends only on the
 * length of `given` (the attacker's input), never on where the first difference is.
 * False when either is NULL. */
bool hh_secret_equal(const char *given, const char *secret);

#endif
