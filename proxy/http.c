/* http.c — see http.h. */
#include "proxy/http.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cJSON.h>

#include "proxy/httphead.h"
#include "proxy/num.h"
#include "proxy/xalloc.h"

/* The numeric form of a peer address ("127.0.0.1", "::1"). Returns 0 on success. An IPv4
 * peer (every request's X-Forwarded-For on the usual setup) is written by hand, as
 * inet_ntop writes it (decimal bytes without leading zeros), without the sprintf inet_ntop
 * calls; IPv6 keeps getnameinfo, which also writes a link-local scope. */
static int peer_numeric(const struct sockaddr *sa, char *host, size_t hostlen)
{
    if (sa->sa_family == AF_INET) {
        const unsigned char *b =
            (const unsigned char *)&((const struct sockaddr_in *)(const void *)sa)->sin_addr;
        if (hostlen < INET_ADDRSTRLEN) return -1;
        char *p = host;
        for (int i = 0; i < 4; i++) {
            if (i) *p++ = '.';
            if (b[i] >= 100) *p++ = (char)('0' + b[i] / 100);
            if (b[i] >= 10) *p++ = (char)('0' + b[i] / 10 % 10);
            *p++ = (char)('0' + b[i] % 10);
        }
        *p = '\0';
        return 0;
    }
    socklen_t len =
        sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    return getnameinfo(sa, len, host, (socklen_t)hostlen, NULL, 0, NI_NUMERICHOST);
}

static enum MHD_Result respond_ex(struct MHD_Connection *conn, int status, const char *ctype,
                                  const char *body, bool close)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (close) MHD_add_response_header(resp, "Connection", "close");
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result respond(struct MHD_Connection *conn, int status, const char *ctype,
                               const char *body)
{
    return respond_ex(conn, status, ctype, body, false);
}

enum MHD_Result http_respond_text(struct MHD_Connection *conn, int status, const char *ctype,
                                  const char *body)
{
    return respond(conn, status, ctype, body);
}

enum MHD_Result http_respond_json(struct MHD_Connection *conn, int status, const char *body)
{
    return respond(conn, status, "application/json", body);
}

static enum MHD_Result respond_error(struct MHD_Connection *conn, int status, const char *message,
                                     const char *type, const char *code, bool close)
{
    cJSON *root = lg_xcheck(cJSON_CreateObject());
    cJSON *e = lg_xcheck(cJSON_AddObjectToObject(root, "error"));
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (code)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!body) lg_oom(0);
    enum MHD_Result rc = respond_ex(conn, status, "application/json", body, close);
    free(body);
    return rc;
}

enum MHD_Result http_respond_error(struct MHD_Connection *conn, int status, const char *message,
                                   const char *type, const char *code)
{
    return respond_error(conn, status, message, type, code, false);
}

enum MHD_Result http_respond_error_close(struct MHD_Connection *conn, int status,
                                         const char *message, const char *type, const char *code)
{
    return respond_error(conn, status, message, type, code, true);
}

bool http_client_authorized(const lg_config *cfg, struct MHD_Connection *conn)
{
    if (cfg->n_api_keys == 0) return true;
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    const char *xkey = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
    const char *key = xkey;
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) key = auth + 7;
    if (!key) return false;
    bool ok = false; /* every key is compared, each in constant time */
    for (size_t i = 0; i < cfg->n_api_keys; i++)
        ok |= hh_secret_equal(key, cfg->api_keys[i]);
    return ok;
}

/* Whether `name` is one of the n lower-case names, in any case. The first byte is
 * compared before strcasecmp is called: most names differ there, and a request meets this
 * test some fifty times (each header against both lists, on both sides). */
static bool one_of(const char *name, const char *const *names, size_t n)
{
    char c = (char)tolower((unsigned char)name[0]);
    for (size_t i = 0; i < n; i++)
        if (names[i][0] == c && strcasecmp(name, names[i]) == 0) return true;
    return false;
}

bool http_is_hop_header(const char *name, const char *connection_value)
{
    static const char *const hop[] = {"connection",
                                      "keep-alive",
                                      "proxy-connection",
                                      "proxy-authenticate",
                                      "proxy-authorization",
                                      "te",
                                      "trailer",
                                      "transfer-encoding",
                                      "upgrade"};
    if (one_of(name, hop, sizeof hop / sizeof *hop)) return true;
    return connection_value && hh_list_has(connection_value, strlen(connection_value), name, false);
}

bool http_forward_header(const char *name, const char *connection_value, bool for_exchange)
{
    /* Framing and routing are loopguard's own: libcurl writes Host, Content-Length or
     * Transfer-Encoding for the body it sends, and X-Forwarded-For is re-built. */
    static const char *const own[] = {"host", "content-length", "expect", "x-forwarded-for"};
    if (one_of(name, own, sizeof own / sizeof *own)) return false;
    if (http_is_hop_header(name, connection_value)) return false;
    /* An exchange writes its own Content-Type and Accept (http_upstream_headers): the
     * client's would go out beside them, twice. */
    static const char *const exchange_own[] = {"accept-encoding", "content-type", "accept"};
    if (for_exchange && (one_of(name, exchange_own, sizeof exchange_own / sizeof *exchange_own) ||
                         strncasecmp(name, "X-Loopguard", 11) == 0))
        return false;
    return true;
}

char *http_xff(const char *client_xff, const char *peer)
{
    lg_buf b = LG_BUF_INIT;
    if (client_xff && *client_xff) lg_buf_append_str(&b, client_xff);
    if (client_xff && *client_xff && peer && *peer) lg_buf_append_str(&b, ", ");
    if (peer) lg_buf_append_str(&b, peer);
    if (!b.len) {
        lg_buf_free(&b);
        return NULL;
    }
    return lg_buf_steal(&b);
}

typedef struct hdr_ctx {
    struct curl_slist *list;
    const char *connection;
    bool for_exchange;
} hdr_ctx;

/* Appends "name: value" ("name;" for an empty value, libcurl's way to send one) to l;
 * the line is built on the stack when it fits, as every ordinary header does. */
static struct curl_slist *append_header(struct curl_slist *l, const char *name, const char *value)
{
    size_t nl = strlen(name), vl = strlen(value), n = nl + vl + 3;
    char small[256];
    char *line = n <= sizeof small ? small : lg_xmalloc(n);
    memcpy(line, name, nl);
    if (vl) {
        memcpy(line + nl, ": ", 2);
        memcpy(line + nl + 2, value, vl + 1);
    } else {
        memcpy(line + nl, ";", 2);
    }
    struct curl_slist *r = curl_slist_append(l, line);
    if (line != small) free(line);
    if (!r) lg_oom(0);
    return r;
}

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value)
{
    hdr_ctx *c = cls;
    (void)kind;
    if (http_forward_header(key, c->connection, c->for_exchange))
        c->list = append_header(c->list, key, value ? value : "");
    return MHD_YES;
}

/* The lines every upstream request ends with, the same for all: "Expect:" with no value
 * stops libcurl from adding its own Expect: 100-continue, and an exchange's Content-Type
 * and Accept. Static nodes that each request's list links to (libcurl only reads header
 * lists): they were three copies a request, each line and node allocated and freed. */
static char expect_line[] = "Expect:", type_line[] = "Content-Type: application/json",
            accept_line[] = "Accept: text/event-stream";
static struct curl_slist relay_tail[] = {{expect_line, NULL}},
                         exchange_tail[] = {{expect_line, &exchange_tail[1]},
                                            {type_line, &exchange_tail[2]},
                                            {accept_line, NULL}};

void http_upstream_headers_free(struct curl_slist *list)
{
    struct curl_slist **end = &list;
    while (*end && *end != exchange_tail && *end != relay_tail)
        end = &(*end)->next;
    *end = NULL;
    curl_slist_free_all(list);
}

struct curl_slist *http_upstream_headers(struct MHD_Connection *conn, bool for_exchange)
{
    hdr_ctx c = {.connection = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Connection"),
                 .for_exchange = for_exchange};
    MHD_get_connection_values(conn, MHD_HEADER_KIND, collect_header, &c);

    /* X-Forwarded-For: the client's list plus the peer address. */
    char addr[64] = "";
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr && peer_numeric(ci->client_addr, addr, sizeof addr) != 0)
        addr[0] = '\0';
    char *xff =
        http_xff(MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Forwarded-For"), addr);
    if (xff) c.list = append_header(c.list, "X-Forwarded-For", xff);
    lg_xfree(xff);
    struct curl_slist *tail = for_exchange ? exchange_tail : relay_tail, **end = &c.list;
    while (*end)
        end = &(*end)->next;
    *end = tail;
    return c.list;
}

/* ---- response heads ---------------------------------------------------------------- */

void http_head_drop_fields(http_head *h)
{
    lg_buf_free(&h->fields);
    h->n = 0;
}

/* A field of h->fields: its name and value (NUL-terminated) and the name's length. */
typedef struct head_field {
    const char *name, *value;
    size_t name_len;
} head_field;

/* The field at *at in h->fields, *at moved past it. */
static head_field next_field(const http_head *h, size_t *at)
{
    uint32_t len[2];
    memcpy(len, h->fields.p + *at, sizeof len);
    const char *name = h->fields.p + *at + sizeof len;
    *at += sizeof len + len[0] + 1 + len[1] + 1;
    return (head_field){name, name + len[0] + 1, len[0]};
}

void http_head_clear(http_head *h)
{
    http_head_drop_fields(h);
    lg_xfree(h->content_type);
    memset(h, 0, sizeof *h);
    h->content_length = -1;
}

/* The status code of a status line "HTTP/x SP code [SP reason]" (RFC 9112 §4): exactly three
 * digits within 100..599, else 0 (no response head; the transfer then fails as one without
 * an answer). */
static int status_code(const char *line, size_t len)
{
    const char *sp = memchr(line, ' ', len);
    if (!sp) return 0;
    size_t rest = len - (size_t)(sp + 1 - line), n = 0;
    while (n < rest && sp[1 + n] != ' ')
        n++;
    char code[4];
    long long v;
    if (n != 3) return 0;
    memcpy(code, sp + 1, 3);
    code[3] = '\0';
    return lg_parse_ll(code, 100, 599, &v) ? (int)v : 0;
}

/* strcasecmp(name, lower) == 0 for a name of nlen bytes up to its NUL (it may hold an
 * earlier NUL: then it reads as the name before it, as strcasecmp reads it) and a
 * lower-case `lower` of n bytes; its first byte and the length are compared first, as
 * most names differ there. */
static bool name_is(const char *name, size_t nlen, const char *lower, size_t n)
{
    return nlen >= n && name[n] == '\0' && (name[0] | 0x20) == lower[0] &&
           strncasecmp(name, lower, n) == 0;
}

void http_head_line(http_head *h, const char *line, size_t len)
{
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    if (len >= 5 && strncmp(line, "HTTP/", 5) == 0) {
        http_head_clear(h);
        h->status = status_code(line, len);
        return;
    }
    if (len == 0) {
        if (h->status >= 200) h->complete = true;
        return;
    }
    const char *colon = memchr(line, ':', len);
    if (!colon || h->status < 200) return;
    size_t nlen = (size_t)(colon - line);
    const char *v = colon + 1;
    size_t vlen = len - nlen - 1;
    while (vlen && (*v == ' ' || *v == '\t'))
        v++, vlen--;
    while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
        vlen--;
    /* Appended to the head's one block (a whole ordinary head in its first 256 bytes). */
    uint32_t lens[2] = {(uint32_t)nlen, (uint32_t)vlen};
    if (h->too_big || h->fields.len + nlen + vlen > HTTP_HEAD_FIELDS_MAX) {
        h->too_big = true;
        return;
    }
    lg_buf_reserve(&h->fields, sizeof lens + nlen + vlen + 2 + (h->fields.cap ? 0 : 200));
    char *rec = h->fields.p + h->fields.len, *name = rec + sizeof lens, *value = name + nlen + 1;
    memcpy(rec, lens, sizeof lens);
    memcpy(name, line, nlen);
    name[nlen] = '\0';
    memcpy(value, v, vlen);
    value[vlen] = '\0';
    h->fields.len += sizeof lens + nlen + vlen + 2;
    h->fields.p[h->fields.len] = '\0'; /* lg_buf's own NUL after its bytes */
    /* A malformed length leaves the size unknown: the body is then relayed as it comes. */
    if (name_is(name, nlen, "content-length", 14) &&
        !lg_parse_ll(value, 0, LLONG_MAX, &h->content_length))
        h->content_length = -1;
    if (name_is(name, nlen, "transfer-encoding", 17) && hh_list_has(value, vlen, "chunked", false))
        h->chunked = true;
    if (name_is(name, nlen, "content-type", 12)) {
        lg_xfree(h->content_type);
        h->content_type = lg_xstrdup(value);
    }
    h->n++;
}

void http_head_apply(const http_head *h, struct MHD_Response *resp, bool own_type)
{
    const char *connection = NULL;
    for (size_t i = 0, at = 0; i < h->n; i++) {
        head_field f = next_field(h, &at);
        if (name_is(f.name, f.name_len, "connection", 10)) connection = f.value;
    }
    for (size_t i = 0, at = 0; i < h->n; i++) {
        head_field f = next_field(h, &at);
        if (http_is_hop_header(f.name, connection) ||
            name_is(f.name, f.name_len, "content-length", 14) ||
            (own_type && name_is(f.name, f.name_len, "content-type", 12)))
            continue;
        MHD_add_response_header(resp, f.name, f.value);
    }
}

size_t http_keep_escaped(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls, (void)conn;
    return strlen(s);
}

typedef struct query_ctx {
    lg_buf *url;
    bool first;
} query_ctx;

static enum MHD_Result add_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *value)
{
    query_ctx *q = cls;
    (void)kind;
    lg_buf_append_str(q->url, q->first ? "?" : "&");
    q->first = false;
    lg_buf_append_str(q->url, key);
    if (value) {
        lg_buf_append_str(q->url, "=");
        lg_buf_append_str(q->url, value);
    }
    return MHD_YES;
}

void http_append_query(lg_buf *url, struct MHD_Connection *conn)
{
    query_ctx q = {url, true};
    MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, add_arg, &q);
}
