/* edge.h — what loopguard checks of a client before any request reaches a route: the
 * request head (proxy/httphead.h over what libmicrohttpd parsed), the path it routes on,
 * the pass-through allow-list, and the per-connection limits that libmicrohttpd's idle
 * timeout does not give: a deadline for the request head, a minimum request-body rate
 * and a cap on connections per client address (config `limits`, README "Security").
 *
 * The worker wires it in at seven points: the accept policy and connection notifications
 * of every daemon (edge_accept, edge_connection), the bytes read from a client socket
 * (edge_received), the request line (edge_uri), the first access-handler call of a
 * request (edge_admit), each later one (edge_body), the request's completion
 * (edge_request_done) and its 250 ms tick (edge_tick). Everything runs on the worker
 * that owns the connection, except the per-address counts, which are process-wide under
 * one mutex (taken once per connection, never per request). */
#ifndef LG_EDGE_H
#define LG_EDGE_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>

#include "proxy/worker.h"

/* Per-connection state (libmicrohttpd's socket context), freed at the connection's close
 * notification. */
typedef struct edge_conn edge_conn;

/* libmicrohttpd accept policy: refuses a connection from an address (an IPv6 /64, see
 * edge_addr_key) that already holds limits.max_conns_per_ip connections (0: no cap). cls
 * is the worker. */
enum MHD_Result edge_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);

/* libmicrohttpd connection notification: tracks the connection (started) and releases it
 * (closed). cls is the worker. */
void edge_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                     enum MHD_ConnectionNotificationCode code);

/* The process's recv calls this with every n > 0 bytes it read from socket fd. When fd is
 * a client connection of this thread's worker, the bytes are followed (hh_stream) so
 * that edge_admit can refuse what libmicrohttpd hides: a NUL or an obs-fold line in the
 * head. Any other socket costs one bounds check. */
void edge_received(int fd, const void *buf, size_t n);

/* The key a client address is counted under for limits.max_conns_per_ip, written to key:
 * an IPv4 address (4 bytes; also an IPv4-mapped IPv6 address), or the /64 prefix of an
 * IPv6 address (8 bytes: one host is commonly given a whole /64, RFC 7421 §1). Returns its
 * length, 0 for another address family. */
size_t edge_addr_key(const struct sockaddr *sa, unsigned char key[8]);

/* libmicrohttpd URI log callback (cls is the worker): a query string with more arguments
 * than max_header_bytes / 128 is dropped before libmicrohttpd splits it (it would run out
 * of pool memory and close the connection silently) and the request gets 414. Returns
 * NULL (no request context). */
void *edge_uri(void *cls, const char *uri, struct MHD_Connection *conn);

/* First access-handler call of a request. Returns 0 when the request may be routed, with
 * *path the normalised path to route on and forward (malloc'd; the caller frees it).
 * Otherwise returns the status of the error response it queued (400, 414, 501 or 505,
 * with Connection: close), and *rc holds libmicrohttpd's result. */
int edge_admit(lg_worker *w, struct MHD_Connection *conn, const char *url, const char *method,
               const char *version, char **path, enum MHD_Result *rc);

/* A later access-handler call: `upload_size` body bytes arrived (0: the body is complete). */
void edge_body(lg_worker *w, struct MHD_Connection *conn, size_t upload_size);

/* The request on `conn` completed; the connection may carry another one. */
void edge_request_done(lg_worker *w, struct MHD_Connection *conn);

/* Ends connections whose request head or body is overdue (see config `limits`). */
void edge_tick(lg_worker *w);

/* True when `method path` may be relayed: the built-in allow-list of OpenAI-compatible,
 * Anthropic and SGLang/vLLM read-only routes, plus cfg->passthrough.allow. */
bool edge_passthrough_allowed(const lg_config *cfg, const char *method, const char *path);

/* Pass-through allow-list matching for one pattern: exact, or a prefix when the pattern
 * ends with '*' ("*" alone matches every path). Exposed for the unit tests. */
bool edge_route_match(const char *pattern, const char *path);

#endif
