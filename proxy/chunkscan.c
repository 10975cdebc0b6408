/* chunkscan.c — see chunkscan.h.
 *
 * A recursive-descent walk over the event's JSON that keeps only what a plain text delta
 * carries. Values it does not need are skipped structurally (depth-limited). Any doubt —
 * an unexpected type, a duplicated key, a "\u0000" that cJSON would cut a string at — is a
 * refusal, never a guess: the full parser then decides.
 *
 * The frame (chunkscan_state): a stream's chunks differ in one string, so once a walk has
 * accepted a chunk with one text value, the next chunk is compared with that chunk's bytes
 * before and after the value; when both match and what lies between is exactly one JSON
 * string, the walk would have taken the same steps and the answer is the old one with the
 * new string. That costs three memcmp and one string scan instead of the walk (about 330
 * instead of 2,600 instructions per SGLang event). The frame's bytes are shared by the
 * thread's streams past each one's own first bytes (frame_take): a paced token then reads
 * its stream's few bytes, not the ~220 of a whole frame, four cache lines at a decode pace
 * where each is a miss. */
#include "proxy/chunkscan.h"

#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "proxy/xalloc.h"

#define MAX_DEPTH 32

typedef struct scan {
    const char *p, *end;
    lg_buf *scratch;
    size_t chunk_len; /* the whole chunk's length: no scan decodes more than this */
    const char *lim;  /* the chunk's end (>= end): bytes up to here may be read, not taken */
} scan;

typedef struct str {
    const char *s;
    size_t n;
    bool null; /* the JSON value was null */
} str;

static void ws(scan *c)
{
    /* Compact JSON has no whitespace between tokens: one test decides the common case. */
    while (c->p < c->end && (unsigned char)*c->p <= ' ' &&
           (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool eat(scan *c, char ch)
{
    if (c->p < c->end && *c->p == ch) { /* compact JSON: the byte is right there */
        c->p++;
        return true;
    }
    ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

static int hexval(char h)
{
    return h >= '0' && h <= '9'   ? h - '0'
           : h >= 'a' && h <= 'f' ? h - 'a' + 10
           : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                  : -1;
}

static bool hex4(scan *c, unsigned *out)
{
    if (c->end - c->p < 4) return false;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(c->p[i]);
        if (h < 0) return false;
        v = v << 4 | (unsigned)h;
    }
    c->p += 4;
    *out = v;
    return true;
}

static bool string_stop(char ch)
{
    return ch == '"' || ch == '\\' || (unsigned char)ch < 0x20;
}

/* The first byte of [p, end) that ends a plain run of string characters — '"', '\\' or a
 * control character — or end. Where SSE2 exists (every x86-64) sixteen bytes are tested per
 * step while sixteen may be read (up to lim, the chunk's end, which may lie past end: a
 * framed text's end is the frame's tail, and a token's text is shorter than sixteen), and
 * the lowest set bit of the mask is the first such byte (end when it lies past end); the
 * byte loop takes the rest (and everything elsewhere). Keys and short texts then cost one
 * step instead of two library calls and a byte loop. */
static const char *plain_run(const char *p, const char *end, const char *lim)
{
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    const __m128i below_space = _mm_set1_epi8(0x1f);
    while (p < end && lim - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i stop = _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash));
        /* unsigned v <= 0x1f exactly when max(v, 0x1f) == 0x1f */
        stop = _mm_or_si128(stop, _mm_cmpeq_epi8(_mm_max_epu8(v, below_space), below_space));
        unsigned mask = (unsigned)_mm_movemask_epi8(stop);
        if (mask) return end - p > __builtin_ctz(mask) ? p + __builtin_ctz(mask) : end;
        if (end - p <= 16) return end;
        p += 16;
    }
#else
    (void)lim;
#endif
    while (p < end && !string_stop(*p))
        p++;
    return p;
}

/* One escape sequence at c->p (after the backslash), decoded onto scratch. */
static bool escape(scan *c)
{
    if (c->p >= c->end) return false;
    char e = *c->p++, lit;
    switch (e) {
    case '"':
    case '\\':
    case '/':
        lit = e;
        break;
    case 'b':
        lit = '\b';
        break;
    case 'f':
        lit = '\f';
        break;
    case 'n':
        lit = '\n';
        break;
    case 'r':
        lit = '\r';
        break;
    case 't':
        lit = '\t';
        break;
    case 'u': {
        unsigned cp, lo;
        if (!hex4(c, &cp) || cp == 0) return false;
        if (cp >= 0xdc00 && cp <= 0xdfff) return false;
        if (cp >= 0xd800 && cp <= 0xdbff) {
            if (c->end - c->p < 2 || c->p[0] != '\\' || c->p[1] != 'u') return false;
            c->p += 2;
            if (!hex4(c, &lo) || lo < 0xdc00 || lo > 0xdfff) return false;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        lg_buf_append_utf8(c->scratch, cp);
        return true;
    }
    default:
        return false;
    }
    lg_buf_append(c->scratch, &lit, 1);
    return true;
}

/* A JSON string at c->p (after whitespace). Without escapes it points into the input; with
 * them it is decoded into scratch (see below: earlier pointers stay valid). */
static bool string(scan *c, str *out)
{
    if (!eat(c, '"')) return false;
    const char *run = c->p;
    c->p = plain_run(run, c->end, c->lim);
    if (c->p < c->end && *c->p == '"') { /* the common case: no escapes */
        *out = (str){run, (size_t)(c->p - run), false};
        c->p++;
        return true;
    }
    /* The first escape of a scan reserves room for everything the scan can decode, so
     * no later append moves the strings already decoded; a stream without escapes never
     * allocates scratch at all. */
    if (!c->scratch->len) lg_buf_reserve(c->scratch, c->chunk_len);
    size_t at = c->scratch->len;
    for (;;) {
        lg_buf_append(c->scratch, run, (size_t)(c->p - run));
        /* the closing quote, a control byte or the end */
        if (c->p >= c->end || *c->p != '\\') break;
        c->p++;
        if (!escape(c)) return false;
        run = c->p;
        c->p = plain_run(run, c->end, c->lim);
    }
    if (c->p >= c->end || *c->p != '"') return false;
    c->p++;
    *out = (str){c->scratch->p + at, c->scratch->len - at, false};
    return true;
}

static bool literal(scan *c, const char *word)
{
    size_t n = strlen(word);
    ws(c);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return false;
    c->p += n;
    return true;
}

/* A string or null. */
static bool string_or_null(scan *c, str *out)
{
    if (literal(c, "null")) {
        *out = (str){NULL, 0, true};
        return true;
    }
    return string(c, out);
}

static bool digits(scan *c)
{
    const char *s = c->p;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9')
        c->p++;
    return c->p > s;
}

/* A JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static bool number(scan *c)
{
    if (c->p < c->end && *c->p == '-') c->p++;
    if (c->p < c->end && *c->p == '0')
        c->p++;
    else if (!digits(c))
        return false;
    if (c->p < c->end && *c->p == '.' && (c->p++, !digits(c))) return false;
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
        if (!digits(c)) return false;
    }
    return true;
}

static bool skip_value(scan *c, int depth);

/* Calls member(c, key, ud) for each key of an object; the callback consumes the value. */
typedef bool (*member_fn)(scan *c, str key, void *ud, int depth);

/* An object's members from the first key on (its '{' read, not empty), and its '}'. */
static bool members(scan *c, member_fn member, void *ud, int depth)
{
    do {
        str key;
        if (!string(c, &key) || !eat(c, ':') || !member(c, key, ud, depth + 1)) return false;
    } while (eat(c, ','));
    return eat(c, '}');
}

static bool object(scan *c, member_fn member, void *ud, int depth)
{
    if (depth > MAX_DEPTH || !eat(c, '{')) return false;
    if (eat(c, '}')) return true;
    return members(c, member, ud, depth);
}

static bool skip_member(scan *c, str key, void *ud, int depth)
{
    (void)key, (void)ud;
    return skip_value(c, depth);
}

static bool skip_value(scan *c, int depth)
{
    str s;
    ws(c);
    if (c->p >= c->end || depth > MAX_DEPTH) return false;
    switch (*c->p) {
    case '"':
        return string(c, &s);
    case '{':
        return object(c, skip_member, NULL, depth);
    case '[':
        c->p++;
        if (eat(c, ']')) return true;
        do {
            if (!skip_value(c, depth + 1)) return false;
        } while (eat(c, ','));
        return eat(c, ']');
    case 't':
        return literal(c, "true");
    case 'f':
        return literal(c, "false");
    case 'n':
        return literal(c, "null");
    default:
        return number(c);
    }
}

static bool key_is(str k, const char *name)
{
    return k.n == strlen(name) && memcmp(k.s, name, k.n) == 0;
}

/* ---- the shape we accept ----------------------------------------------------------- */

/* The keys that carry text, as indexes of view.text and values of chunkscan_state.field. */
enum { F_CONTENT, F_RC, F_R, F_COUNT };

typedef struct view {
    str role, text[F_COUNT], finish, id, model;
    long long created;
    bool has_created;
    const char *tok[F_COUNT], *tok_end[F_COUNT]; /* where each text key's value token lies */
    unsigned seen;                               /* one bit per key we read, to refuse duplicates */
    bool choices_seen;
    size_t n_choices; /* 0 or 1 */
    bool usage;       /* a usage object (accepted only without choices) */
    /* Where the top-level key "choices" began (its quote; NULL: not seen, or escaped) and
     * the view as it was there: what a walk resumed at that byte starts from. */
    const char *lead_end;
    struct lead_view {
        str id, model;
        long long created;
        bool has_created, usage;
        unsigned seen;
    } lead;
} view;

enum {
    K_ROLE = 1,
    K_CONTENT = 2,
    K_RC = 4,
    K_R = 8,
    K_INDEX = 16,
    K_DELTA = 32,
    K_FINISH = 64,
    K_ID = 128,
    K_MODEL = 256,
    K_CREATED = 512,
};

static bool once(view *v, unsigned bit)
{
    if (v->seen & bit) return false;
    v->seen |= bit;
    return true;
}

/* A text key's value, a string or null, remembering where its token lies. */
static bool text_value(scan *c, view *v, int f)
{
    ws(c);
    v->tok[f] = c->p;
    bool ok = string_or_null(c, &v->text[f]);
    v->tok_end[f] = c->p;
    return ok;
}

static bool delta_member(scan *c, str key, void *ud, int depth)
{
    view *v = ud;
    if (key_is(key, "role")) return once(v, K_ROLE) && string_or_null(c, &v->role);
    if (key_is(key, "content")) return once(v, K_CONTENT) && text_value(c, v, F_CONTENT);
    if (key_is(key, "reasoning_content")) return once(v, K_RC) && text_value(c, v, F_RC);
    if (key_is(key, "reasoning")) return once(v, K_R) && text_value(c, v, F_R);
    if (key_is(key, "tool_calls") || key_is(key, "function_call")) {
        ws(c);
        return literal(c, "null") || (eat(c, '[') && eat(c, ']'));
    }
    return skip_value(c, depth);
}

static bool number_zero(scan *c)
{
    ws(c);
    const char *s = c->p;
    return number(c) && c->p - s == 1 && *s == '0';
}

static bool choice_member(scan *c, str key, void *ud, int depth)
{
    view *v = ud;
    if (key_is(key, "index")) return once(v, K_INDEX) && number_zero(c);
    if (key_is(key, "delta")) return once(v, K_DELTA) && object(c, delta_member, v, depth);
    if (key_is(key, "finish_reason"))
        return once(v, K_FINISH) && string_or_null(c, &v->finish) &&
               v->finish.n < CHUNKSCAN_FINISH_MAX;
    if (key_is(key, "text")) return false; /* a text completion: the full parser */
    return skip_value(c, depth);
}

/* id or model: a string with text, or anything else, which dl_parse reads as none. */
static bool meta_string(scan *c, str *out, int depth)
{
    ws(c);
    if (c->p < c->end && *c->p == '"') return string(c, out);
    return skip_value(c, depth);
}

/* created: an integer of up to 15 digits, which a double holds exactly, so that it reads as
 * dl_parse's (long long)valuedouble; another number is refused (the full parser decides);
 * anything else is no time, as for dl_parse. */
static bool created(scan *c, view *v, int depth)
{
    ws(c);
    const char *s = c->p;
    if (c->p >= c->end || (*c->p != '-' && (*c->p < '0' || *c->p > '9')))
        return skip_value(c, depth);
    if (!number(c)) return false;
    bool neg = *s == '-';
    size_t n = (size_t)(c->p - s) - neg;
    long long t = 0;
    for (size_t i = 0; i < n; i++) {
        if (n > 15 || s[neg + i] < '0' || s[neg + i] > '9') return false; /* fraction, exponent */
        t = t * 10 + (s[neg + i] - '0');
    }
    v->created = neg ? -t : t;
    v->has_created = true;
    return true;
}

static bool top_member(scan *c, str key, void *ud, int depth)
{
    view *v = ud;
    str o;
    if (key_is(key, "id")) return once(v, K_ID) && meta_string(c, &v->id, depth);
    if (key_is(key, "model")) return once(v, K_MODEL) && meta_string(c, &v->model, depth);
    if (key_is(key, "created")) return once(v, K_CREATED) && created(c, v, depth);
    if (key_is(key, "choices")) {
        if (!v->choices_seen && key.s > c->end - c->chunk_len && key.s < c->end) {
            v->lead_end = key.s - 1;
            v->lead =
                (struct lead_view){v->id, v->model, v->created, v->has_created, v->usage, v->seen};
        }
        if (v->choices_seen || !eat(c, '[')) return false;
        v->choices_seen = true;
        if (eat(c, ']')) return true; /* none: a usage chunk */
        v->n_choices = 1;
        return object(c, choice_member, v, depth) && eat(c, ']'); /* at most one choice */
    }
    if (key_is(key, "usage")) {
        ws(c);
        if (literal(c, "null")) return true;
        v->usage = true;
        return c->p < c->end && *c->p == '{' && skip_value(c, depth);
    }
    if (key_is(key, "error")) return false;
    if (key_is(key, "object")) return string(c, &o) && key_is(o, "chat.completion.chunk");
    return skip_value(c, depth);
}

/* Fills *out from an accepted view with one choice. `role` stands for the role's presence:
 * the exchange only tests it for NULL. */
static void fill(dl_delta *out, const char *role, const str *text)
{
    const str *rc = &text[F_RC], *r = &text[F_R], *content = &text[F_CONTENT];
    out->kind = DL_CHUNK;
    out->chat = true;
    out->n_choices = 1;
    out->role = role;
    out->content = content->n ? content->s : NULL;
    out->content_len = content->n;
    out->reasoning = rc->n ? rc->s : r->n ? r->s : NULL;
    out->reasoning_len = rc->n ? rc->n : r->n;
    out->reasoning_keys = (rc->n ? DL_KEY_REASONING_CONTENT : 0) | (r->n ? DL_KEY_REASONING : 0);
}

/* The chunk's id, model and created into *out, the strings copied into st->meta. */
static void fill_meta(dl_delta *out, const view *v, chunkscan_state *st)
{
    lg_buf_reset(&st->meta);
    lg_buf_append(&st->meta, v->id.s, v->id.n);
    lg_buf_append(&st->meta, "", 1);
    lg_buf_append(&st->meta, v->model.s, v->model.n);
    lg_buf_append(&st->meta, "", 1);
    out->id = v->id.n ? st->meta.p : NULL;
    out->model = v->model.n ? st->meta.p + v->id.n + 1 : NULL;
    out->created = v->created;
    out->has_created = v->has_created;
}

/* ---- frames ---------------------------------------------------------------------------- */

struct chunkscan_frame {
    unsigned refs; /* the states whose frame it is */
    uint32_t len;  /* of bytes[] */
    uint32_t head; /* bytes before the text token */
    bool breaks;   /* bytes[] holds a CR or an LF (JSON whitespace) */
    char bytes[];  /* the head, then the tail */
};

/* The frame this thread's last new frame was made into, offered to the next state that
 * makes one: not a reference (the last state to drop it clears it). */
static _Thread_local struct chunkscan_frame *offered;

static void frame_put(struct chunkscan_frame *f)
{
    if (!f || --f->refs) return;
    if (offered == f) offered = NULL;
    lg_xfree(f);
}

static char *own_bytes(const chunkscan_state *st)
{
    return st->own_block + (-(uintptr_t)st->own_block & 63);
}

static bool same_word(const char *a, const char *b)
{
    uint64_t x, y;
    memcpy(&x, a, sizeof x);
    memcpy(&y, b, sizeof y);
    return x == y;
}

/* a[0..n) == b[0..n) for a state's own bytes (n <= CHUNKSCAN_OWN_MAX): where SSE2 exists
 * and n >= 16, up to four 16-byte loads of each (the first and the last sixteen bytes,
 * past 32 the two between), cheaper than memcmp's call for these few bytes. */
static bool same_own(const char *a, const char *b, size_t n)
{
#ifdef __SSE2__
    _Static_assert(CHUNKSCAN_OWN_MAX <= 64, "four loads cover the own bytes");
    if (n >= 16) {
#define DIFF(at)                                                                                   \
    _mm_xor_si128(_mm_loadu_si128((const __m128i *)(const void *)(a + (at))),                      \
                  _mm_loadu_si128((const __m128i *)(const void *)(b + (at))))
        __m128i d = _mm_or_si128(DIFF(0), DIFF(n - 16));
        if (n > 32) d = _mm_or_si128(d, _mm_or_si128(DIFF(16), DIFF(n - 32)));
#undef DIFF
        return _mm_movemask_epi8(_mm_cmpeq_epi8(d, _mm_setzero_si128())) == 0xffff;
    }
#endif
    return memcmp(a, b, n) == 0;
}

/* s[0..n) holds a CR or an LF. */
static bool has_break(const char *s, size_t n)
{
    return memchr(s, '\n', n) || memchr(s, '\r', n);
}

/* The frame of a chunk data[0..head) "text" tail[0..tail) becomes st's: the thread's
 * offered frame when it has the same head and tail lengths and the same tail, and differs
 * in the head's first CHUNKSCAN_OWN_MAX bytes at most, which hold no CR or LF (st then
 * keeps them as its own, and the frame's `breaks` speaks for all of st's frame bytes);
 * else a new frame of st's alone, offered from now on. */
static void frame_take(chunkscan_state *st, const char *data, size_t head, const char *tail,
                       size_t tail_len)
{
    struct chunkscan_frame *f = offered;
    size_t own = head; /* past the last byte where the heads differ */
    bool shares = f && f->head == head && f->len == head + tail_len &&
                  memcmp(f->bytes + head, tail, tail_len) == 0;
    while (shares && own >= 8 && same_word(f->bytes + own - 8, data + own - 8))
        own -= 8; /* a word at a time, then bytes */
    while (shares && own && f->bytes[own - 1] == data[own - 1])
        own--;
    if (!shares || own > CHUNKSCAN_OWN_MAX || has_break(data, own)) {
        f = lg_xmalloc(sizeof *f + head + tail_len);
        f->refs = 0;
        f->len = (uint32_t)(head + tail_len);
        f->head = (uint32_t)head;
        memcpy(f->bytes, data, head);
        memcpy(f->bytes + head, tail, tail_len);
        f->breaks = has_break(f->bytes, f->len);
        offered = f;
        own = 0;
    }
    f->refs++; /* before the old frame goes: it may be this one */
    frame_put(st->shared);
    st->shared = f;
    st->own = (uint8_t)own;
    if (own && !st->own_block) st->own_block = lg_xmalloc(CHUNKSCAN_OWN_MAX + 63);
    if (own) memcpy(own_bytes(st), data, own);
}

/* The whole walk. On acceptance with exactly one text key holding text and no
 * finish_reason, the chunk's bytes around that value become st's frame (a framed reading
 * reports texts only). */
static bool accept(const char *data, size_t len, chunkscan_state *st, dl_delta *out, scan c,
                   const view *vp);

/* A string of the lead's bytes as an offset, or false when it lies elsewhere (decoded into
 * scratch): such a lead is not kept. */
static bool lead_at(const str *s, const char *data, size_t lead_len, size_t *at)
{
    *at = 0;
    if (!s->n) return true;
    if (s->s < data || s->s + s->n > data + lead_len) return false;
    *at = (size_t)(s->s - data);
    return true;
}

/* Keeps the bytes before v's "choices" key and the view there as st's lead. */
static void keep_lead(const char *data, const view *v, chunkscan_state *st)
{
    lg_buf_reset(&st->lead);
    if (!v->lead_end) return;
    size_t n = (size_t)(v->lead_end - data);
    struct chunkscan_lead *l = &st->lead_view;
    if (!lead_at(&v->lead.id, data, n, &l->id_at) ||
        !lead_at(&v->lead.model, data, n, &l->model_at))
        return;
    l->id_n = v->lead.id.n;
    l->model_n = v->lead.model.n;
    l->created = v->lead.created;
    l->has_created = v->lead.has_created;
    l->usage = v->lead.usage;
    l->seen = v->lead.seen;
    lg_buf_append(&st->lead, data, n);
}

/* The walk resumed after st's lead, for a chunk that starts with the lead's bytes: the
 * walk over them would take the same steps and reach the same view. */
static bool resumed(const char *data, size_t len, chunkscan_state *st, dl_delta *out)
{
    size_t n = st->lead.len;
    if (!n || len <= n || memcmp(data, st->lead.p, n) != 0) return false;
    const struct chunkscan_lead *l = &st->lead_view;
    scan c = {data + n, data + len, &st->scratch, len, data + len};
    view v = {0};
    v.id = (str){l->id_n ? data + l->id_at : NULL, l->id_n, false};
    v.model = (str){l->model_n ? data + l->model_at : NULL, l->model_n, false};
    v.created = l->created;
    v.has_created = l->has_created;
    v.usage = l->usage;
    v.seen = l->seen;
    if (!members(&c, top_member, &v, 0)) return false;
    return accept(data, len, st, out, c, &v);
}

static bool scan_chunk(const char *data, size_t len, chunkscan_state *st, dl_delta *out)
{
    scan c = {data, data + len, &st->scratch, len, data + len};
    view v = {0};
    if (!object(&c, top_member, &v, 0)) return false;
    if (!accept(data, len, st, out, c, &v)) return false;
    keep_lead(data, &v, st);
    return true;
}

/* The end of a walk that read the top-level object: the rest of the chunk, and whether
 * the view is a shape this scanner takes. */
static bool accept(const char *data, size_t len, chunkscan_state *st, dl_delta *out, scan c,
                   const view *vp)
{
    const view v = *vp;
    ws(&c);
    if (c.p != c.end || !v.choices_seen) return false;
    if (!v.n_choices) { /* no choice (the usage chunk): only its identity is read */
        out->kind = DL_CHUNK;
        out->chat = true;
        fill_meta(out, &v, st);
        return true;
    }
    /* With a choice: its delta, and the usage that dl_delta reports as a tree. Both
     * reasoning keys with text: the full parser decides how they combine. */
    if (!(v.seen & K_DELTA) || v.usage || (v.text[F_RC].n && v.text[F_R].n)) return false;
    fill(out, v.role.n ? data : NULL, v.text);
    fill_meta(out, &v, st);
    if (v.finish.n) {
        memcpy(st->finish, v.finish.s, v.finish.n);
        st->finish[v.finish.n] = '\0';
        out->finish_reason = st->finish;
        return true;
    }
    int with_text = 0, f = 0;
    for (int i = 0; i < F_COUNT; i++)
        if (v.text[i].n) with_text++, f = i;
    size_t head = with_text == 1 ? (size_t)(v.tok[f] - data) : 0;
    if (with_text == 1 && len <= UINT32_MAX) {
        frame_take(st, data, head, v.tok_end[f], len - (size_t)(v.tok_end[f] - data));
        st->field = (uint8_t)(f + 1);
        st->role = v.role.n > 0;
        st->frame_gen++;
        st->in_frame = true;
    }
    return true;
}

/* data's bytes before and after its text token are those of the chunk st's frame was
 * taken from (a framed reading's first test; read_frame is its second). */
static bool frame_fits(const char *data, size_t len, const chunkscan_state *st)
{
    if (!st->field) return false;
    const struct chunkscan_frame *f = st->shared;
    size_t own = st->own, head = f->head, tail = f->len - head;
    return len >= f->len + 2 && (!own || same_own(data, own_bytes(st), own)) &&
           memcmp(data + own, f->bytes + own, head - own) == 0 &&
           memcmp(data + len - tail, f->bytes + head, tail) == 0;
}

/* *out, whole, for a framed chunk: the frame's one text key (st->field) holding t, as fill
 * writes it, and zeros elsewhere. Not zeroed first: a memset of the delta (or a compound
 * literal) compiles to a `rep stos`, whose stores the event's next reads of the delta
 * (on_chunk's) wait for, at every saturated event. */
static void framed_delta(dl_delta *out, const chunkscan_state *st, const char *data, str t)
{
    _Static_assert(sizeof(dl_delta) == 184, "every field of dl_delta is written here or by fill");
    str text[F_COUNT] = {{0}};
    text[st->field - 1] = t;
    out->root = out->usage = out->choice = NULL;
    out->finish_reason = out->error_message = out->error_type = out->id = out->model = NULL;
    out->tools = NULL, out->n_tools = 0, out->own_text = NULL, out->created = 0;
    out->choice_index = out->error_code = 0, out->has_created = false;
    fill(out, st->role ? data : NULL, text);
}

/* The chunk, which frame_fits took, is st's frame around one new string: the walk would
 * take every step it took on the frame's chunk and differ only in that string's value.
 * The usual string, without escapes, is one plain run from its opening quote to the quote
 * that ends the token (what string() would find, without the scan it sets up); any other
 * goes through string(). */
static bool read_frame(const char *data, size_t len, chunkscan_state *st, dl_delta *out)
{
    size_t head = st->shared->head, tail = st->shared->len - head;
    const char *open = data + head, *end = data + len - tail; /* the token: [open, end) */
    if (*open != '"') return false;
    str t;
    const char *stop = plain_run(open + 1, end, data + len);
    if (stop == end - 1 && *stop == '"') {
        t = (str){open + 1, (size_t)(stop - open - 1), false};
    } else {
        scan c = {open, end, &st->scratch, len, data + len};
        if (!string(&c, &t) || c.p != c.end) return false;
    }
    framed_delta(out, st, data, t);
    st->in_frame = true;
    return true;
}

/* The chunk is st's frame around one new string. */
static bool framed(const char *data, size_t len, chunkscan_state *st, dl_delta *out)
{
    return frame_fits(data, len, st) && read_frame(data, len, st, out);
}

/* Empties the scratch buffer; an empty one is left untouched (its NUL is in place), so a
 * reading with no escape touches none of its memory. */
static void scratch_reset(chunkscan_state *st)
{
    if (st->scratch.len) lg_buf_reset(&st->scratch);
}

bool chunkscan(const char *data, size_t len, chunkscan_state *st, dl_delta *out)
{
    memset(out, 0, sizeof *out);
    scratch_reset(st);
    st->in_frame = false;
    if (framed(data, len, st, out)) return true;
    scratch_reset(st); /* each reading writes *out only when it accepts */
    if (resumed(data, len, st, out)) return true;
    scratch_reset(st);
    return scan_chunk(data, len, st, out);
}

bool chunkscan_frames(const char *data, size_t len, chunkscan_state *st, dl_delta *out)
{
    if (!frame_fits(data, len, st) || st->shared->breaks) return false;
    scratch_reset(st);
    return read_frame(data, len, st, out); /* which writes all of *out when it accepts */
}

void chunkscan_warm(const chunkscan_state *st)
{
    if (st->own) __builtin_prefetch(own_bytes(st));
}

void chunkscan_free(chunkscan_state *st)
{
    lg_buf_free(&st->scratch);
    frame_put(st->shared);
    lg_xfree(st->own_block);
    lg_buf_free(&st->meta);
    lg_buf_free(&st->lead);
    memset(st, 0, sizeof *st);
}
