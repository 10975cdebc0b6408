/* uplink.h — HTTP/1.1 spoken by the worker itself on plain-HTTP upstream connections: the
 * request head it writes, the response head it reads, and the framing that decides where a
 * response ends and whether its connection may carry another request.
 *
 * Why: libcurl 7.88 spends some 57,000 instructions of a 2-token request's ~158,000 in its
 * HTTP layer (building the request head through its printf, making and dropping a
 * connectdata per transfer, parsing the response head, its multi state machine). The
 * exchange's attempts on an http:// upstream with no proxy (worker.h, worker_uplink_start)
 * go over connections that libcurl opens (a CURLOPT_CONNECT_ONLY transfer: DNS, connect, its
 * errors) and that the worker then owns, pools and speaks on; everything else stays
 * libcurl's. The socket side (writing, reading, the idle pool) is worker.c's; this module is
 * the protocol alone, without I/O, so that it can be tested byte by byte.
 *
 * The request is what libcurl 7.88 writes for the same transfer (a POST of CURLOPT_POSTFIELDS
 * with a CURLOPT_HTTPHEADER list, checked against its bytes on the wire): the request line,
 * Host, libcurl's default Accept (any type) unless the list has an Accept, the list's lines in order ("Name:"
 * with nothing after the colon removes a header and is not sent; "Name;" sends "Name:"),
 * Content-Length, the empty line.
 *
 * The response head is taken as libcurl takes it: a line runs to its LF, a line whose first
 * byte is CR or LF ends the head (upbody.h), every line (the status line, each field with its
 * CRLF, the empty line, and those of interim 1xx heads; of a chunked body's trailer section
 * its fields, not the empty line that ends it) goes to the header callback as libcurl 7.88
 * hands them (http.c, http_chunks.c). The framing follows RFC 9112 §6.3: a
 * Transfer-Encoding whose last coding is chunked wins over Content-Length; another
 * Transfer-Encoding, a Content-Length with more than digits (or two that differ) or neither
 * means a body read until the connection closes (one that does not begin with a digit fails
 * the response, as libcurl fails it); 1xx, 204 and 304 have none. A connection is reused only after an
 * HTTP/1.1 response with no "Connection: close", framed by exactly one of chunked or a
 * valid Content-Length (never both), and with no byte after it (the worker's rule,
 * worker.c). */
#ifndef LG_UPLINK_H
#define LG_UPLINK_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proxy/buf.h"
#include "proxy/upbody.h"

/* Idle connections a worker keeps per upstream origin (nginx's upstream `keepalive`, which
 * the bench sets to 8,192; libcurl kept up to four per transfer it had): a thousand streams'
 * connections come back idle in a burst and are taken again by the next requests; more are
 * closed. */
#define UPLINK_IDLE_MAX 1024
/* An idle connection is closed after this long unused (nginx's keepalive_timeout 60 s;
 * libcurl closed its pooled ones after 118 s). An upstream that closes it sooner is seen at
 * once (the worker watches idle connections), and a request that loses the race is retried
 * on a new connection. */
#define UPLINK_IDLE_NS (60ull * 1000 * 1000 * 1000)
/* A response head's bounds: a line past UPLINK_LINE_MAX fails the transfer with
 * CURLE_OUT_OF_MEMORY, as libcurl 7.88 fails one past its CURL_MAX_HTTP_HEADER (100 KiB);
 * libcurl 7.88 has no bound on the whole head (later versions fail past 300 KiB), the worker
 * fails all the lines of a response's heads past UPLINK_HEAD_MAX the same way. */
#define UPLINK_LINE_MAX (100u * 1024)
#define UPLINK_HEAD_MAX (300u * 1024)

/* Where a request goes, made once per URL (uplink_target_init). */
typedef struct uplink_target {
    char *start; /* "POST <path> HTTP/1.1\r\nHost: <host[:port]>\r\n" */
    size_t start_len;
    char *origin; /* "host:port": the idle pool the target's connections go back to */
} uplink_target;

/* Fills t for url (parsed by libcurl): true when the worker may speak for it, an http://
 * URL without user info or a zone id; false, t untouched, otherwise. */
bool uplink_target_init(uplink_target *t, CURLU *url);
void uplink_target_free(uplink_target *t);

/* Whether libcurl would write the request for this list as uplink_request_head does: false
 * when the list carries a line libcurl treats apart (Host, Content-Length,
 * Transfer-Encoding), which the exchange's lists never do (http_forward_header). */
bool uplink_headers_plain(const struct curl_slist *headers);

/* Appends the request head of a POST of body_len bytes to t with the header list to out. */
void uplink_request_head(lg_buf *out, const uplink_target *t, const struct curl_slist *headers,
                         size_t body_len);

/* The body's framing once the final head is read. */
enum { UPLINK_CHUNKED, UPLINK_LENGTH, UPLINK_CLOSE, UPLINK_NONE };

/* A response's heads being read. Starts zeroed. */
typedef struct uplink_resp {
    uint32_t bytes;  /* of all heads so far (UPLINK_HEAD_MAX) */
    uint16_t status; /* the current head's */
    bool started;    /* the current head's status line was read */
    bool lines;      /* a whole line came (libcurl's "empty reply" is a response without) */
    bool http10;     /* the final head said HTTP/1.0 */
    bool te;         /* a Transfer-Encoding field came */
    bool chunked;    /* the last one's last coding is chunked */
    bool has_len;    /* a valid Content-Length came */
    bool bad_len;    /* an invalid one, or two that differ */
    bool close;      /* Connection: close */
    bool folded;     /* an obsolete folded line (never reused after) */
    bool fields;     /* the current head had a field line */
    bool done;       /* the final head ended */
    uint64_t len;    /* Content-Length */
} uplink_resp;

/* A line of a head for the header callback (libcurl's CURLOPT_HEADERFUNCTION contract):
 * returns len to go on, anything else fails the transfer (CURLE_WRITE_ERROR). */
typedef size_t (*uplink_line_fn)(char *line, size_t size, size_t len, void *ud);

/* Takes bytes p[0..n) of a response's heads (trailers: of a chunked body's trailer
 * section, which has no status line). Each complete line goes to fn; a line cut by the end
 * of p is kept in `line` and completed by the next call (the others are handed in place:
 * fn may write them, as it may libcurl's copy). Returns the bytes taken: all of n,
 * or fewer when the final head (the trailer section) ended with them (r->done), the rest
 * being the body's (what follows the response). -1 with *rc on a failure: a status line that
 * is not "HTTP/1.x NNN" (CURLE_UNSUPPORTED_PROTOCOL, libcurl's code for a response that is
 * not HTTP/1), a NUL in a head's line, a field line without a colon that folds onto no
 * field or a Content-Length that does not begin with a digit (CURLE_WEIRD_SERVER_REPLY, as
 * libcurl 7.88), a line or heads past their bounds
 * (CURLE_OUT_OF_MEMORY), fn refusing a line
 * (CURLE_WRITE_ERROR). After an interim head the state is ready for the next one. */
ssize_t uplink_head_take(uplink_resp *r, lg_buf *line, bool trailers, char *p, size_t n,
                         uplink_line_fn fn, void *ud, CURLcode *rc);

/* The final head's framing (UPLINK_*), and whether the connection may be reused after the
 * body (the rules above; the caller adds "no byte after it" and "the request was sent"). */
int uplink_framing(const uplink_resp *r, bool *reusable);

#endif
