/* httphead.c — see httphead.h. */
#include "proxy/httphead.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proxy/xalloc.h"

/* RFC 9110 §5.6.2 tchar: a table, as every field name of every request is checked. */
static const bool tchar[256] = {
    ['0' ... '9'] = true, ['a' ... 'z'] = true, ['A' ... 'Z'] = true, ['!'] = true,  ['#'] = true,
    ['$'] = true,         ['%'] = true,         ['&'] = true,         ['\''] = true, ['*'] = true,
    ['+'] = true,         ['-'] = true,         ['.'] = true,         ['^'] = true,  ['_'] = true,
    ['`'] = true,         ['|'] = true,         ['~'] = true,
};

static bool is_token(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (!tchar[(unsigned char)s[i]]) return false;
    return true;
}

/* RFC 9110 §5.5: field-vchar / SP / HTAB; obs-text (0x80-0xff) is kept as nginx and
 * HAProxy keep it. CR, LF, NUL and every other control byte are refused. Eight bytes at a
 * time while none of them is below 0x20 or 0x7f (a tab among them: the bytes one by one). */
static bool value_ok(const char *s, size_t n)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    size_t i = 0;
    for (; n - i >= 8; i += 8) {
        uint64_t w, del;
        memcpy(&w, s + i, 8);
        del = w ^ (ones * 0x7f);
        if ((((w - ones * 0x20) & ~w) | ((del - ones) & ~del)) & highs) break;
    }
    for (; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) return false;
    }
    return true;
}

static bool name_is(const hh_field *f, const char *name)
{
    return f->name_len == strlen(name) && strncasecmp(f->name, name, f->name_len) == 0;
}

static int reject(hh_verdict *v, int status, const char *message, const char *code)
{
    v->status = status;
    v->message = message;
    v->code = code;
    return status;
}

bool hh_parse_length(const char *s, size_t n, long long *out)
{
    if (n == 0 || n > 18) return false;
    long long x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        x = x * 10 + (s[i] - '0');
    }
    *out = x;
    return true;
}

bool hh_list_has(const char *v, size_t n, const char *tok, bool last)
{
    size_t tn = strlen(tok);
    const char *p = v, *e = v + n;
    bool found = false;
    while (p < e) {
        const char *q = memchr(p, ',', (size_t)(e - p));
        const char *end = q ? q : e, *s = p, *t = end;
        while (s < t && (*s == ' ' || *s == '\t'))
            s++;
        while (t > s && (t[-1] == ' ' || t[-1] == '\t'))
            t--;
        bool is = (size_t)(t - s) == tn && strncasecmp(s, tok, tn) == 0;
        if (is && !last) return true;
        if (last && s < t) found = is;
        p = q ? q + 1 : e;
    }
    return found;
}

/* Walks the comma-separated codings of one Transfer-Encoding value. Counts "chunked"
 * (case-insensitive, no parameters) in *chunked and anything else in *other; an empty
 * element counts as other. Returns whether "chunked" was the last element. */
static bool scan_codings(const char *s, size_t n, unsigned *chunked, unsigned *other)
{
    bool last_chunked = false;
    size_t i = 0;
    for (;;) {
        while (i < n && (s[i] == ' ' || s[i] == '\t'))
            i++;
        size_t b = i;
        while (i < n && s[i] != ',')
            i++;
        size_t e = i;
        while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t'))
            e--;
        last_chunked = e - b == 7 && strncasecmp(s + b, "chunked", 7) == 0;
        if (last_chunked)
            (*chunked)++;
        else
            (*other)++;
        if (i >= n) break;
        i++; /* the comma */
    }
    return last_chunked;
}

int hh_check(const hh_request *req, hh_verdict *v)
{
    *v = (hh_verdict){.content_length = -1};
    if (!is_token(req->method, strlen(req->method)))
        return reject(v, 400, "malformed request method", "bad_request_line");
    bool http11 = strcmp(req->version, "HTTP/1.1") == 0;
    if (!http11 && strcmp(req->version, "HTTP/1.0") != 0)
        return reject(v, 505, "only HTTP/1.0 and HTTP/1.1 are served", "http_version");

    unsigned hosts = 0, lengths = 0, te_fields = 0, chunked = 0, other = 0;
    bool chunked_last = false;
    for (size_t i = 0; i < req->n_fields; i++) {
        const hh_field *f = &req->fields[i];
        if (!is_token(f->name, f->name_len))
            return reject(v, 400, "malformed header field name", "bad_header");
        if (!value_ok(f->value, f->value_len))
            return reject(v, 400, "header field value holds a control character (CR, LF, NUL)",
                          "bad_header");
        if (name_is(f, "Host")) {
            hosts++;
        } else if (name_is(f, "Content-Length")) {
            if (++lengths > 1) return reject(v, 400, "more than one Content-Length", "bad_framing");
            if (!hh_parse_length(f->value, f->value_len, &v->content_length))
                return reject(v, 400, "malformed Content-Length", "bad_framing");
        } else if (name_is(f, "Transfer-Encoding")) {
            te_fields++;
            chunked_last = scan_codings(f->value, f->value_len, &chunked, &other);
        }
    }
    if (hosts > 1) return reject(v, 400, "more than one Host header", "bad_header");
    if (http11 && hosts == 0) return reject(v, 400, "HTTP/1.1 request without Host", "bad_header");
    if (te_fields) {
        if (!http11)
            return reject(v, 400, "Transfer-Encoding in an HTTP/1.0 request", "bad_framing");
        if (lengths)
            return reject(v, 400, "both Content-Length and Transfer-Encoding", "bad_framing");
        if (other)
            return reject(v, 501, "unsupported transfer coding (only chunked is accepted)",
                          "unsupported_transfer_coding");
        if (chunked != 1 || !chunked_last)
            return reject(v, 400, "chunked must be applied exactly once", "bad_framing");
        v->chunked = true;
    }
    return 0;
}

/* Bytes RFC 3986 allows in a path segment besides '%' escapes (pchar) and '/': a table, as
 * every byte of every request's path is checked. */
static const bool path_char[256] = {
    ['0' ... '9'] = true, ['a' ... 'z'] = true, ['A' ... 'Z'] = true, ['-'] = true, ['.'] = true,
    ['_'] = true,         ['~'] = true,         ['!'] = true,         ['$'] = true, ['&'] = true,
    ['\''] = true,        ['('] = true,         [')'] = true,         ['*'] = true, ['+'] = true,
    [','] = true,         [';'] = true,         ['='] = true,         [':'] = true, ['@'] = true,
    ['/'] = true,
};

static bool is_unreserved(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool hh_query_piece_ok(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f || c == '#') return false;
    }
    return true;
}

int hh_path_normalize(const char *path, char **out)
{
    size_t n = strlen(path);
    if (n == 0 || path[0] != '/') return -1;
    char *p = lg_xmalloc(n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)path[i];
        if (c == '%') {
            if (i + 2 >= n) goto bad;
            int hi = hexval(path[i + 1]), lo = hexval(path[i + 2]);
            if (hi < 0 || lo < 0) goto bad;
            unsigned char d = (unsigned char)(hi * 16 + lo);
            if (d == '/' || d == '\\' || d < 0x20 || d == 0x7f) goto bad;
            if (is_unreserved(d)) {
                p[k++] = (char)d;
            } else {
                memcpy(p + k, path + i, 3);
                k += 3;
            }
            i += 2;
            continue;
        }
        if (!path_char[c]) goto bad;
        p[k++] = (char)c;
    }
    p[k] = '\0';
    /* No "." or ".." segment: the upstream (or libcurl) would resolve it and serve a path
     * other than the one routed. */
    for (const char *s = p; *s;) {
        const char *seg = s + 1, *e = strchr(seg, '/');
        size_t len = e ? (size_t)(e - seg) : strlen(seg);
        if ((len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.')) goto bad;
        if (!e) break;
        s = e;
    }
    *out = p;
    return 0;
bad:
    free(p);
    return -1;
}

/* ---- hh_stream ----------------------------------------------------------------------- */

enum hs_state {
    HS_IDLE,       /* before a request line (empty lines are skipped) */
    HS_REQLINE,    /* in the request line */
    HS_FIELDS,     /* in the field section */
    HS_BODY,       /* passing over Content-Length bytes (left) */
    HS_CHUNK_SIZE, /* reading a chunk size into left */
    HS_CHUNK_EXT,  /* passing over a chunk extension to the LF */
    HS_CHUNK_DATA, /* passing over chunk data (left) */
    HS_CHUNK_END,  /* expecting the CRLF or LF after chunk data */
    HS_TRAILERS,   /* in the trailer section */
    HS_STOPPED,    /* framing lost; libmicrohttpd answers 400 and closes */
};

enum { F_NAME, F_BLANKS, F_VALUE, F_IGNORED };
enum { FK_LENGTH = 1, FK_CODING = 2 };

static bool is_blank(unsigned char c)
{
    return c == ' ' || c == '\t';
}

/* Refuses head number `head` (or an earlier one already named) for `why`. */
static void hs_refuse(hh_stream *s, uint64_t head, const char *why, const char *code)
{
    if (s->refuse_from && s->refuse_from <= head) return;
    s->refuse_from = head;
    s->why = why;
    s->code = code;
}

static const char cl[] = "content-length", te[] = "transfer-encoding";

/* The framing value forms hh_stream follows: Content-Length 1-18 digits, Transfer-Encoding
 * exactly "chunked"; blanks before either (libmicrohttpd skips them), none after (it keeps
 * them, and then reads neither as a length nor as chunked). */
static void field_byte(hh_stream *s, unsigned char c)
{
    switch (s->fphase) {
    case F_NAME: {
        if (c == ':') {
            s->fkind = (s->fcand & FK_LENGTH) && s->fpos == sizeof cl - 1   ? FK_LENGTH
                       : (s->fcand & FK_CODING) && s->fpos == sizeof te - 1 ? FK_CODING
                                                                            : 0;
            s->lengths += s->fkind == FK_LENGTH;
            s->codings += s->fkind == FK_CODING;
            s->fphase = s->fkind ? F_BLANKS : F_IGNORED;
            s->fpos = 0;
            if (s->fkind == FK_LENGTH) s->length = 0;
            return;
        }
        unsigned char l = (unsigned char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
        if (s->fpos >= sizeof cl - 1 || (unsigned char)cl[s->fpos] != l) s->fcand &= ~FK_LENGTH;
        if (s->fpos >= sizeof te - 1 || (unsigned char)te[s->fpos] != l) s->fcand &= ~FK_CODING;
        if (s->fcand)
            s->fpos++;
        else
            s->fphase = F_IGNORED; /* names no framing field: the rest is skipped */
        return;
    }
    case F_BLANKS:
        if (is_blank(c)) return;
        s->fphase = F_VALUE;
        /* fall through */
    case F_VALUE:
        if (s->fkind == FK_LENGTH) {
            if (c >= '0' && c <= '9' && s->fpos < 18) {
                s->length = s->length * 10 + (c - '0');
                s->fpos++;
            } else {
                s->fbad = true;
            }
        } else {
            unsigned char l = (unsigned char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
            if (s->fpos < 7 && (unsigned char)"chunked"[s->fpos] == l)
                s->fpos++;
            else
                s->fbad = true;
        }
        return;
    default:
        return;
    }
}

/* A content byte of a line (CR included when no LF follows it). */
static void line_byte(hh_stream *s, unsigned char c)
{
    bool first = !s->in_line;
    s->in_line = true;
    switch (s->state) {
    case HS_IDLE:
        s->heads++;
        s->state = HS_REQLINE;
        /* fall through */
    case HS_REQLINE:
        if (!c) hs_refuse(s, s->heads, "NUL byte in the request line", "bad_request_line");
        return;
    case HS_FIELDS:
        if (!c) hs_refuse(s, s->heads, "NUL byte in a header field", "bad_header");
        if (first && is_blank(c))
            hs_refuse(s, s->heads, "obs-fold: a header line starts with a space or tab",
                      "bad_header");
        field_byte(s, c);
        return;
    default: /* HS_TRAILERS */
        if (!c || (first && is_blank(c)))
            hs_refuse(s, s->heads + 1, "NUL byte or obs-fold in the previous request's trailer",
                      "bad_header");
        return;
    }
}

/* The end of a head: picks the body framing libmicrohttpd will use. */
static void head_end(hh_stream *s)
{
    if (s->fbad || s->lengths > 1 || s->codings > 1 || (s->lengths && s->codings)) {
        hs_refuse(s, s->heads, "request framing other than one Content-Length or chunked",
                  "bad_framing");
        s->state = HS_STOPPED;
    } else if (s->codings) {
        s->state = HS_CHUNK_SIZE;
        s->left = 0;
        s->fpos = 0;
    } else if (s->length) {
        s->state = HS_BODY;
        s->left = s->length;
    } else {
        s->state = HS_IDLE;
    }
}

static void line_end(hh_stream *s)
{
    bool empty = !s->in_line;
    switch (s->state) {
    case HS_REQLINE:
        s->state = HS_FIELDS;
        s->lengths = s->codings = 0;
        s->fbad = false;
        s->length = 0;
        break;
    case HS_FIELDS:
        if (empty) {
            head_end(s);
        } else if ((s->fkind == FK_LENGTH && s->fpos == 0) ||
                   (s->fkind == FK_CODING && s->fpos != 7)) {
            s->fbad = true;
        }
        break;
    case HS_TRAILERS:
        if (empty) s->state = HS_IDLE;
        break;
    default: /* HS_IDLE: an empty line before a request line */
        break;
    }
    s->in_line = s->cr = false;
    s->fcand = FK_LENGTH | FK_CODING;
    s->fkind = 0;
    s->fpos = 0;
    s->fphase = F_NAME;
}

static int hexdigit(unsigned char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* A byte of chunk framing (libmicrohttpd's process_request_body rules). */
static void chunk_byte(hh_stream *s, unsigned char c)
{
    bool lf = c == '\n', cr = s->cr;
    s->cr = c == '\r' && !cr;
    if (s->state == HS_CHUNK_EXT) {
        if (lf) goto size_done;
        return;
    }
    if (s->state == HS_CHUNK_END) {
        if (lf) {
            s->state = HS_CHUNK_SIZE;
            s->left = 0;
            s->fpos = 0;
            s->cr = false;
        } else if (!s->cr) {
            goto lost;
        }
        return;
    }
    /* HS_CHUNK_SIZE: 1*HEXDIG (no overflow), then ';' or [CR] LF */
    int d = hexdigit(c);
    if (d >= 0 && !cr && s->left <= UINT64_MAX >> 4) {
        s->left = s->left * 16 + (unsigned)d;
        s->fpos = 1;
        return;
    }
    if (s->fpos && !cr && c == ';') {
        s->state = HS_CHUNK_EXT;
        return;
    }
    if (s->fpos && lf) goto size_done;
    if (s->fpos && s->cr) return;
lost:
    hs_refuse(s, s->heads + 1, "malformed chunked body before this request", "bad_framing");
    s->state = HS_STOPPED;
    return;
size_done:
    s->cr = false;
    if (s->left) {
        s->state = HS_CHUNK_DATA;
    } else {
        s->state = HS_TRAILERS;
        s->in_line = false;
        s->fphase = F_NAME;
    }
}

/* The rest of a line nothing more is read from (the request line, a field that frames
 * nothing, a trailer) once it has content: only a NUL and its end matter, found with
 * memchr rather than byte by byte. Returns where the line's end left p. */
static const unsigned char *skip_line(hh_stream *s, const unsigned char *p,
                                      const unsigned char *end)
{
    const unsigned char *lf = memchr(p, '\n', (size_t)(end - p)), *e = lf ? lf : end;
    if (memchr(p, '\0', (size_t)(e - p))) line_byte(s, '\0');
    if (lf) {
        line_end(s);
        return lf + 1;
    }
    s->cr = e[-1] == '\r'; /* held back: dropped if the next read starts with LF */
    return end;
}

/* Past a field name's first byte, the bytes that go on spelling the one framing name still
 * possible, at once: what field_byte does to each of them is fpos++ (a letter or '-' is no
 * NUL, blank or line end for line_byte to look at). The rest goes byte by byte. Returns
 * where the run stopped. */
static const unsigned char *name_run(hh_stream *s, const unsigned char *p, const unsigned char *end)
{
    const char *name = s->fcand == FK_LENGTH ? cl : s->fcand == FK_CODING ? te : NULL;
    if (!name) return p;
    size_t len = s->fcand == FK_LENGTH ? sizeof cl - 1 : sizeof te - 1;
    while (p < end && s->fpos < len &&
           (unsigned char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p) == (unsigned char)name[s->fpos]) {
        s->fpos++;
        p++;
    }
    return p;
}

void hh_stream_feed(hh_stream *s, const char *buf, size_t n)
{
    const unsigned char *p = (const unsigned char *)buf, *end = p + n;
    while (p < end) {
        switch (s->state) {
        case HS_STOPPED:
            return;
        case HS_BODY:
        case HS_CHUNK_DATA: {
            uint64_t k = (uint64_t)(end - p) < s->left ? (uint64_t)(end - p) : s->left;
            p += k;
            s->left -= k;
            if (!s->left) s->state = s->state == HS_BODY ? HS_IDLE : HS_CHUNK_END;
            break;
        }
        case HS_CHUNK_SIZE:
        case HS_CHUNK_EXT:
        case HS_CHUNK_END:
            chunk_byte(s, *p++);
            break;
        default: { /* a line: IDLE, REQLINE, FIELDS, TRAILERS */
            if (s->in_line && (s->state == HS_REQLINE || s->state == HS_TRAILERS ||
                               (s->state == HS_FIELDS && s->fphase == F_IGNORED))) {
                p = skip_line(s, p, end);
                break;
            }
            if (s->state == HS_FIELDS && s->fphase == F_NAME && s->fpos && !s->cr) {
                p = name_run(s, p, end);
                if (p == end) break;
            }
            unsigned char c = *p++;
            if (c == '\n') {
                line_end(s);
                break;
            }
            if (s->cr) line_byte(s, '\r');
            s->cr = c == '\r';
            if (!s->cr) line_byte(s, c);
            break;
        }
        }
    }
}

bool hh_secret_equal(const char *given, const char *secret)
{
    if (!given || !secret) return false;
    size_t gl = strlen(given), sl = strlen(secret);
    volatile unsigned char d = gl != sl;
    for (size_t i = 0; i < gl; i++)
        d |= (unsigned char)(given[i] ^ secret[sl ? i % sl : 0]);
    return d == 0;
}
