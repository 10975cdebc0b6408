/* http.h — small HTTP helpers shared by the relay, the exchange and the admin endpoints:
 * OpenAI-shaped error responses, hop-by-hop header rules (RFC 9110 §7.6.1), copying
 * client headers onto an upstream request and collecting upstream response headers. */
#ifndef LG_HTTP_H
#define LG_HTTP_H

#include <curl/curl.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "proxy/buf.h"

/* Queues {"error":{"message","type","code"}} with `status`. Returns MHD's result. */
enum MHD_Result http_respond_error(struct MHD_Connection *conn, int status, const char *message,
                                   const char *type, const char *code);

/* Same, with Connection: close: for a request whose head was refused, so that nothing
 * after it on the connection is read as another request. */
enum MHD_Result http_respond_error_close(struct MHD_Connection *conn, int status,
                                         const char *message, const char *type, const char *code);

/* Queues `body` (copied) as application/json with `status`. */
enum MHD_Result http_respond_json(struct MHD_Connection *conn, int status, const char *body);

/* Queues `body` (copied) with the given content type. */
enum MHD_Result http_respond_text(struct MHD_Connection *conn, int status, const char *ctype,
                                  const char *body);

/* True when the request carries one of cfg->api_keys (Authorization: Bearer or x-api-key),
 * or when no keys are configured. Keys are compared in constant time. */
bool http_client_authorized(const lg_config *cfg, struct MHD_Connection *conn);

/* True for headers a proxy must not forward: the RFC 9110 hop-by-hop set, plus any header
 * named in `connection_value` (the message's Connection header, may be NULL). */
bool http_is_hop_header(const char *name, const char *connection_value);

/* Whether a client header named `name` is forwarded upstream: never the hop-by-hop set
 * (Connection, Transfer-Encoding, TE, ... and what Connection names), Host,
 * Content-Length, Expect or X-Forwarded-For, which loopguard writes itself; with
 * `for_exchange`, not Accept-Encoding, Content-Type, Accept or X-Loopguard-* either. */
bool http_forward_header(const char *name, const char *connection_value, bool for_exchange);

/* The X-Forwarded-For value to send: the client's list (may be NULL) with the peer address
 * appended, at any length. malloc'd (caller frees); NULL when both are empty. */
char *http_xff(const char *client_xff, const char *peer);

/* Builds the upstream request headers from the client's (http_forward_header decides),
 * X-Forwarded-For appended.
 * With `for_exchange`, Accept-Encoding is dropped too (loopguard must read the stream) and
 * Content-Type and Accept are loopguard's (application/json, text/event-stream). The list
 * ends in lines that never change, static nodes shared by every list: nothing may be
 * appended to it, and the caller frees it with http_upstream_headers_free (never NULL). */
struct curl_slist *http_upstream_headers(struct MHD_Connection *conn, bool for_exchange);
/* Frees what http_upstream_headers allocated of `list` (NULL: nothing). */
void http_upstream_headers_free(struct curl_slist *list);

/* Appends the request's query string ("?a=1&b") to `url` as the client sent it; the worker
 * installs an identity unescaper so libmicrohttpd keeps arguments (and the path) raw. */
void http_append_query(lg_buf *url, struct MHD_Connection *conn);

/* libmicrohttpd unescape callback that leaves the text as it came (transparent proxying). */
size_t http_keep_escaped(void *cls, struct MHD_Connection *conn, char *s);

/* Upstream response head, filled line by line from CURLOPT_HEADERFUNCTION. */
typedef struct http_head {
    int status;
    /* The n fields one after another, each "name\0value\0" after the two lengths (a
     * uint32_t each, not counting the NULs): one block for a whole head. */
    lg_buf fields;
    size_t n;
    long long content_length; /* -1 when absent */
    bool chunked;
    bool complete; /* the blank line after the final (non-1xx) head was seen */
    bool too_big;  /* its fields passed HTTP_HEAD_FIELDS_MAX: the rest were not kept */
    char *content_type;
} http_head;

/* The bytes of a final head's fields kept for the client's response (names and values).
 * They are copied onto loopguard's own response head, which libmicrohttpd builds inside the
 * connection's pool (max_header_bytes, 16 KiB by default): a larger upstream head cannot be
 * passed on, and the response fails as nginx's "upstream sent too big header" does (502).
 * 8 KiB is nginx's proxy_buffer_size on 8 KiB pages; inference servers send a few hundred
 * bytes. */
#define HTTP_HEAD_FIELDS_MAX 8192

/* Feeds one raw header line (with CRLF) as libcurl delivers it. A status line starts a new
 * head (interim 1xx heads are discarded). A field past HTTP_HEAD_FIELDS_MAX sets too_big;
 * the caller fails the response (502). */
void http_head_line(http_head *h, const char *line, size_t len);
/* Adds the end-to-end headers of `h` to `resp` (hop-by-hop and Content-Length skipped, and
 * Content-Type too when `own_type`: the response's body is not the upstream's). */
void http_head_apply(const http_head *h, struct MHD_Response *resp, bool own_type);
void http_head_clear(http_head *h);
/* Frees h's fields once they are applied to a response; its status, framing, content type
 * and completeness stay (a stream keeps its exchange, and with it the head, to its end). */
void http_head_drop_fields(http_head *h);

#endif
