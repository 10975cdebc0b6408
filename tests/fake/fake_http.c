/* fake_http.c — the fake upstream's HTTP/1.1: request parsing and response writing (see
 * fake_int.h). */
#include "fake_int.h"

/* ---- responses ---- */

const char *reason_phrase(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 413:
        return "Request Entity Too Large";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return "Unknown";
    }
}

/* Status line and headers as uvicorn writes them. clen < 0: chunked. */
void put_head(conn *c, int status, const char *ctype, long clen)
{
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    fbuf_printf(&c->out, "HTTP/1.1 %d %s\r\ndate: %s\r\nserver: uvicorn\r\n", status,
                reason_phrase(status), date);
    if (clen >= 0) fbuf_printf(&c->out, "content-length: %ld\r\n", clen);
    fbuf_printf(&c->out, "content-type: %s\r\n", ctype);
    if (clen < 0) fbuf_puts(&c->out, "transfer-encoding: chunked\r\n");
    if (!c->keepalive) fbuf_puts(&c->out, "connection: close\r\n");
    fbuf_puts(&c->out, "\r\n");
}

/* Queues a complete response; the connection moves to C_DONE. */
void respond(conn *c, int status, const char *ctype, const char *body, size_t n)
{
    put_head(c, status, ctype, (long)n);
    fbuf_put(&c->out, body, n);
    c->state = C_DONE;
}

void respond_json(conn *c, int status, const fbuf *b)
{
    respond(c, status, "application/json", b->p ? b->p : "", b->len);
}

void respond_error(server *s, conn *c, int status, const char *type, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fbuf_reset(&s->tmp);
    /* Routing errors always use the OpenAI shape: FastAPI's 404 would differ per server,
     * and tests only need a well-formed error. */
    fake_render_error_body(&s->tmp, FAKE_D_OPENAI, msg, type, status);
    respond_json(c, status, &s->tmp);
}

/* Frames one SSE event (data: JSON\n\n) as one HTTP chunk. */
void put_event(conn *c, const char *data, size_t n)
{
    fbuf_put_hex(&c->out, n + 8);
    fbuf_puts(&c->out, "\r\ndata: ");
    fbuf_put(&c->out, data, n);
    fbuf_put(&c->out, "\n\n\r\n", 4);
}

const char *header(const conn *c, const char *name)
{
    for (int i = 0; i < c->nhdrs; i++)
        if (!strcmp(c->hdrs[i].name, name)) return c->hdrs[i].value;
    return NULL;
}

/* ---- request parsing ---- */

/* Parses the head in c->in[0..n). Returns 0, or an HTTP status for a bad request. */
int parse_head(conn *c, size_t n)
{
    c->headbuf = malloc(n + 1);
    if (!c->headbuf) return 500;
    memcpy(c->headbuf, c->in.p, n);
    c->headbuf[n] = '\0';
    char *save = NULL;
    char *line = strtok_r(c->headbuf, "\r\n", &save);
    if (!line) return 400;
    char *sp1 = strchr(line, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2) return 400;
    *sp1 = *sp2 = '\0';
    c->method = line;
    c->path = sp1 + 1;
    const char *version = sp2 + 1;
    if (strncmp(version, "HTTP/1.", 7)) return 400;
    char *q = strchr(c->path, '?');
    if (q) *q = '\0', c->query = q + 1;
    c->keepalive = strcmp(version, "HTTP/1.0") != 0;
    c->clen = 0;
    while ((line = strtok_r(NULL, "\r\n", &save))) {
        char *colon = strchr(line, ':');
        if (!colon || c->nhdrs == MAX_HEADERS) return colon ? 431 : 400;
        *colon = '\0';
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        size_t vl = strlen(v);
        while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
            v[--vl] = '\0';
        for (char *k = line; *k; k++)
            *k = (char)tolower((unsigned char)*k);
        c->hdrs[c->nhdrs++] = (hdr){line, v};
        if (!strcmp(line, "content-length")) {
            char *end;
            c->clen = strtol(v, &end, 10);
            if (*end || c->clen < 0) return 400;
        } else if (!strcmp(line, "transfer-encoding")) {
            c->chunked = strcasestr(v, "chunked") != NULL;
        } else if (!strcmp(line, "connection")) {
            if (strcasestr(v, "close"))
                c->keepalive = false;
            else if (strcasestr(v, "keep-alive"))
                c->keepalive = true;
        }
    }
    if (c->clen > MAX_BODY) return 413;
    return 0;
}

/* Decodes chunked body bytes from c->in starting at *pos. Returns 1 when the body is
 * complete, 0 when more input is needed, -1 on a framing error. */
int dechunk(conn *c, size_t *pos)
{
    enum { CK_SIZE, CK_DATA, CK_DATA_CRLF, CK_TRAILER };
    for (;;) {
        const char *base = c->in.p + *pos;
        size_t avail = c->in.len - *pos;
        switch (c->ck_state) {
        case CK_SIZE:
        case CK_TRAILER: {
            const char *nl = memchr(base, '\n', avail);
            if (!nl) return avail > 4096 ? -1 : 0;
            size_t ll = (size_t)(nl - base) + 1;
            if (c->ck_state == CK_SIZE) {
                char *end;
                long n = strtol(base, &end, 16);
                if (end == base || n < 0 || (long)c->body.len + n > MAX_BODY) return -1;
                c->ck_left = n;
                c->ck_state = n ? CK_DATA : CK_TRAILER;
            } else if (ll <= 2) {
                *pos += ll;
                return 1;
            }
            *pos += ll;
            break;
        }
        case CK_DATA: {
            if (!avail) return 0;
            size_t take = avail < (size_t)c->ck_left ? avail : (size_t)c->ck_left;
            fbuf_put(&c->body, base, take);
            *pos += take;
            c->ck_left -= (long)take;
            if (!c->ck_left) c->ck_state = CK_DATA_CRLF;
            break;
        }
        case CK_DATA_CRLF: {
            const char *nl = memchr(base, '\n', avail);
            if (!nl) return avail > 2 ? -1 : 0;
            *pos += (size_t)(nl - base) + 1;
            c->ck_state = CK_SIZE;
            break;
        }
        }
    }
}

/* Parses as much of the buffered request as there is; dispatches it when complete. */
