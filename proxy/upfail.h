/* upfail.h — why an upstream attempt failed, in words an operator can act on.
 *
 * One place turns what is known when an attempt fails (libcurl's result, the socket's
 * errno, whether loopguard's own timer ended it, and how far the attempt got) into a cause:
 * connection refused, DNS, TLS, connect / first-byte / idle timeout, reset, closed early.
 * upf_report() then writes it twice: into the client's error message with the upstream's
 * HOST:PORT ("upstream 10.0.0.5:30000: connection refused"), and at once as one stderr
 * line with the upstream's URL. Neither carries credentials: the URL's userinfo, if any, is
 * cut out (config refuses URLs with credentials; this holds whatever the URL). */
#ifndef LG_UPFAIL_H
#define LG_UPFAIL_H

#include <stdbool.h>
#include <stddef.h>

#include <curl/curl.h>

typedef enum {
    UPF_REFUSED,            /* nothing listens there */
    UPF_DNS,                /* the host name does not resolve */
    UPF_TLS,                /* handshake or certificate */
    UPF_UNREACHABLE,        /* another connect error (no route, network down, ...) */
    UPF_CONNECT_TIMEOUT,    /* no connection within timeouts.connect_ms */
    UPF_FIRST_BYTE_TIMEOUT, /* connected, no response within timeouts.first_byte_ms */
    UPF_IDLE_TIMEOUT,       /* answering, then silent for timeouts.idle_ms */
    UPF_RESET,              /* the connection was reset */
    UPF_CLOSED,             /* closed before the response was complete */
    UPF_NOT_SSE,            /* a 200 that is not an event stream */
    UPF_OTHER,              /* anything else: libcurl's own words */
} upf_cause;

/* What the attempt knew when it failed. `timed_out`: loopguard's own timer ended it
 * (first-byte or idle); `connected`: a connection was up and the request being sent;
 * `answering`: response bytes had arrived. */
typedef struct upf_state {
    CURLcode rc;
    long os_errno; /* CURLINFO_OS_ERRNO, 0 when unknown */
    bool timed_out, connected, answering, not_sse;
} upf_state;

upf_cause upf_classify(const upf_state *s);

/* True for the three timeouts (the client gets 504; every other cause 502). */
bool upf_is_timeout(upf_cause c);

/* The cause in words ("connection refused", "no response within timeouts.first_byte_ms"). */
const char *upf_text(upf_cause c);

/* Writes "upstream HOST:PORT: CAUSE" into msg (truncated to n) and logs
 * "loopguard: upstream URL failed: CAUSE (libcurl: ...; errno text)" to stderr, both for
 * the upstream base URL `base`. Returns the cause. Thread-safe. */
upf_cause upf_report(char *msg, size_t n, const char *base, const upf_state *s);

/* Logs "loopguard: upstream URL answered HTTP STATUS" for a 5xx (the answer itself goes to
 * the client as it came). */
void upf_report_status(const char *base, int status);

/* Writes base's "HOST:PORT" (no scheme, no userinfo, no path) into out. */
void upf_hostport(char *out, size_t n, const char *base);

#endif
