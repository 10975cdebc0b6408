/* upfail.c — see upfail.h. */
#include "proxy/upfail.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

upf_cause upf_classify(const upf_state *s)
{
    if (s->not_sse) return UPF_NOT_SSE;
    if (s->timed_out || s->rc == CURLE_OPERATION_TIMEDOUT) {
        if (!s->connected) return UPF_CONNECT_TIMEOUT;
        return s->answering ? UPF_IDLE_TIMEOUT : UPF_FIRST_BYTE_TIMEOUT;
    }
    switch (s->rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
        return UPF_DNS;
    case CURLE_COULDNT_CONNECT:
        return s->os_errno == ECONNREFUSED || s->os_errno == 0 ? UPF_REFUSED : UPF_UNREACHABLE;
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_USE_SSL_FAILED:
        return UPF_TLS;
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
        return s->os_errno == ECONNRESET || s->os_errno == EPIPE ? UPF_RESET : UPF_OTHER;
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_OK: /* the transfer ended cleanly, the response did not */
        return UPF_CLOSED;
    default:
        return UPF_OTHER;
    }
}

bool upf_is_timeout(upf_cause c)
{
    return c == UPF_CONNECT_TIMEOUT || c == UPF_FIRST_BYTE_TIMEOUT || c == UPF_IDLE_TIMEOUT;
}

const char *upf_text(upf_cause c)
{
    switch (c) {
    case UPF_REFUSED:
        return "connection refused";
    case UPF_DNS:
        return "DNS lookup failed";
    case UPF_TLS:
        return "TLS handshake failed";
    case UPF_UNREACHABLE:
        return "cannot connect";
    case UPF_CONNECT_TIMEOUT:
        return "no connection within timeouts.connect_ms";
    case UPF_FIRST_BYTE_TIMEOUT:
        return "no response within timeouts.first_byte_ms";
    case UPF_IDLE_TIMEOUT:
        return "no event within timeouts.idle_ms";
    case UPF_RESET:
        return "connection reset";
    case UPF_CLOSED:
        return "connection closed before the response was complete";
    case UPF_NOT_SSE:
        return "answered 200 without an event stream";
    case UPF_OTHER:
        break;
    }
    return "transfer failed";
}

void upf_hostport(char *out, size_t n, const char *base)
{
    const char *p = strstr(base, "://");
    p = p ? p + 3 : base;
    size_t len = strcspn(p, "/?#");
    const char *at = memchr(p, '@', len); /* userinfo: never printed */
    if (at) {
        len -= (size_t)(at + 1 - p);
        p = at + 1;
    }
    snprintf(out, n, "%.*s", (int)len, p);
}

/* Writes base with its userinfo (if any) cut out into out. */
static void safe_url(char *out, size_t n, const char *base)
{
    char hp[300];
    const char *scheme_end = strstr(base, "://");
    const char *rest = scheme_end ? scheme_end + 3 : base;
    upf_hostport(hp, sizeof hp, base);
    snprintf(out, n, "%.*s%s%s", (int)(rest - base), base, hp, rest + strcspn(rest, "/?#"));
}

void upf_report_status(const char *base, int status)
{
    if (status < 500) return;
    char url[1200];
    safe_url(url, sizeof url, base);
    fprintf(stderr, "loopguard: upstream %s answered HTTP %d\n", url, status);
}

upf_cause upf_report(char *msg, size_t n, const char *base, const upf_state *s)
{
    upf_cause c = upf_classify(s);
    char hp[300], detail[200] = "";
    upf_hostport(hp, sizeof hp, base);
    if (c == UPF_UNREACHABLE && s->os_errno)
        snprintf(msg, n, "upstream %s: %s: %s", hp, upf_text(c), strerror((int)s->os_errno));
    else if (c == UPF_OTHER || c == UPF_UNREACHABLE || c == UPF_TLS)
        snprintf(msg, n, "upstream %s: %s (%s)", hp, upf_text(c), curl_easy_strerror(s->rc));
    else
        snprintf(msg, n, "upstream %s: %s", hp, upf_text(c));
    if (s->rc != CURLE_OK)
        snprintf(detail, sizeof detail, " (libcurl: %s%s%s)", curl_easy_strerror(s->rc),
                 s->os_errno ? "; " : "", s->os_errno ? strerror((int)s->os_errno) : "");
    char url[1200];
    safe_url(url, sizeof url, base);
    fprintf(stderr, "loopguard: upstream %s failed: %s%s\n", url, upf_text(c), detail);
    return c;
}
