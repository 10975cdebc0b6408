/* fake_scenario.c — scenario parsing, request matching and token plans.
 *
 * Parsing borrows every string from the cJSON tree it keeps, so a scenario is one tree
 * plus small arrays. Token counts of text segments are computed once at load (O(text)),
 * which lets a plan know its exact length and where the max_tokens cap falls before the
 * first token is sent — the dialects need that to put finish_reason on the last delta. */
#include "fake_scenario.h"
#include "fake_buf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_CAP 4096

uint64_t fake_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- tokenisation ---- */

static bool is_ws(char c)
{
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

/* Length of the token starting at s[off] in a text of len bytes (> 0 unless off == len). */
static size_t tok_len(const char *s, size_t len, size_t off, fake_tok_mode mode, long nbytes)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = off;
    unsigned cp;
    switch (mode) {
    case FAKE_TOK_WORDS:
        while (i < len && !is_ws(s[i]))
            i++;
        while (i < len && is_ws(s[i]))
            i++;
        return i - off;
    case FAKE_TOK_CHARS: {
        size_t n = fake_utf8_len(u + off, len - off, &cp);
        return n ? n : 1;
    }
    case FAKE_TOK_BYTES:
        i = off + (size_t)nbytes < len ? off + (size_t)nbytes : len;
        /* Never end inside a UTF-8 sequence: extend over continuation bytes. */
        while (i < len && (u[i] & 0xC0) == 0x80)
            i++;
        return i - off;
    }
    return len - off;
}

static long text_count(const char *s, size_t len, fake_tok_mode mode, long nbytes)
{
    long n = 0;
    for (size_t off = 0; off < len; off += tok_len(s, len, off, mode, nbytes))
        n++;
    return n;
}

/* Tokens of one segment; LONG_MAX when it never ends. */
static long seg_count(const fake_seg *g)
{
    switch (g->kind) {
    case FAKE_SEG_TEXT:
        return g->ntok;
    case FAKE_SEG_REPEAT:
        if (g->times < 0) return g->ntok ? LONG_MAX : 0;
        if (g->ntok && g->times > LONG_MAX / g->ntok) return LONG_MAX;
        return g->times * g->ntok;
    case FAKE_SEG_TOKENS:
        return cJSON_GetArraySize(g->toks);
    case FAKE_SEG_STAMP:
    case FAKE_SEG_VARIED:
        return g->times < 0 ? LONG_MAX : g->times;
    }
    return 0;
}

static long segs_count(const fake_segs *s)
{
    long n = 0;
    for (size_t i = 0; i < s->n; i++) {
        long c = seg_count(&s->v[i]);
        if (c == LONG_MAX || n > LONG_MAX - c) return LONG_MAX;
        n += c;
    }
    return n;
}

/* ---- parsing ---- */

typedef struct perr {
    char *buf;
    size_t len;
} perr;

/* Writes the error message; returns -1 for the caller to pass on. */
static int __attribute__((format(printf, 2, 3))) perr_set(perr *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->buf, e->len, fmt, ap);
    va_end(ap);
    return -1;
}

static long num_or(const cJSON *o, const char *key, long dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? (long)v->valuedouble : dflt;
}

/* "pace_us" or "pace_ms" (converted) of o, -1 when neither is given. */
static long pace_us(const cJSON *o)
{
    long us = num_or(o, "pace_us", -1);
    long ms = num_or(o, "pace_ms", -1);
    return us >= 0 ? us : ms >= 0 ? ms * 1000 : -1;
}

static int parse_seg(const cJSON *j, fake_seg *g, fake_tok_mode mode, long nbytes, perr *e)
{
    memset(g, 0, sizeof *g);
    const cJSON *v;
    if (cJSON_IsString(j)) {
        g->kind = FAKE_SEG_TEXT;
        g->text = j->valuestring;
        g->len = strlen(j->valuestring);
        g->ntok = text_count(g->text, g->len, mode, nbytes);
    } else if (!cJSON_IsObject(j)) {
        return perr_set(e, "segment must be a string or an object");
    } else if (cJSON_IsString(v = cJSON_GetObjectItemCaseSensitive(j, "repeat"))) {
        g->kind = FAKE_SEG_REPEAT;
        g->text = v->valuestring;
        g->len = strlen(v->valuestring);
        g->times = num_or(j, "times", 1);
        g->ntok = text_count(g->text, g->len, mode, nbytes);
    } else if (cJSON_IsArray(v = cJSON_GetObjectItemCaseSensitive(j, "tokens"))) {
        const cJSON *t;
        cJSON_ArrayForEach(t, v) if (!cJSON_IsString(t)) return perr_set(
            e, "\"tokens\" must be an array of strings");
        g->kind = FAKE_SEG_TOKENS;
        g->toks = v;
    } else if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "stamp_tokens"))) {
        g->kind = FAKE_SEG_STAMP;
        g->times = (long)v->valuedouble;
    } else if (cJSON_IsNumber(v = cJSON_GetObjectItemCaseSensitive(j, "varied"))) {
        g->kind = FAKE_SEG_VARIED;
        g->times = (long)v->valuedouble;
        g->seed = (unsigned long)num_or(j, "seed", 1);
    } else {
        char *s = cJSON_PrintUnformatted(j);
        int rc = perr_set(e, "unknown segment %s", s ? s : "?");
        free(s);
        return rc;
    }
    return 0;
}

/* Parses a segment list (array, or one bare segment). NULL j gives an empty list. */
static int parse_segs(const cJSON *j, fake_segs *out, fake_tok_mode mode, long nbytes, perr *e)
{
    out->v = NULL;
    out->n = 0;
    if (!j || cJSON_IsNull(j)) return 0;
    size_t n = cJSON_IsArray(j) ? (size_t)cJSON_GetArraySize(j) : 1;
    out->v = calloc(n ? n : 1, sizeof *out->v);
    if (!out->v) return perr_set(e, "out of memory");
    if (!cJSON_IsArray(j)) {
        out->n = 1;
        return parse_seg(j, &out->v[0], mode, nbytes, e);
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, j)
    {
        if (parse_seg(it, &out->v[out->n], mode, nbytes, e) < 0) return -1;
        out->n++;
    }
    return 0;
}

static const struct {
    const char *name;
    fake_fault_kind kind;
} fault_names[] = {
    {"reset", FAKE_FAULT_RESET},
    {"stall", FAKE_FAULT_STALL},
    {"garbage", FAKE_FAULT_GARBAGE},
    {"error_event", FAKE_FAULT_ERROR_EVENT},
    {"http_status", FAKE_FAULT_HTTP_STATUS},
    {"not_sse", FAKE_FAULT_NOT_SSE},
    {"truncated_chunked", FAKE_FAULT_TRUNCATED_CHUNKED},
    {"close_before_headers", FAKE_FAULT_CLOSE_BEFORE_HEADERS},
    {"slow_start", FAKE_FAULT_SLOW_START},
};

static int parse_fault(const cJSON *j, fake_fault *f, perr *e)
{
    memset(f, 0, sizeof *f);
    f->status = 500;
    f->ms = -1;
    if (!j) return 0;
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "kind");
    if (!cJSON_IsString(k)) return perr_set(e, "fault needs a \"kind\"");
    for (size_t i = 0; i < sizeof fault_names / sizeof fault_names[0]; i++)
        if (!strcmp(k->valuestring, fault_names[i].name)) f->kind = fault_names[i].kind;
    if (f->kind == FAKE_FAULT_NONE) return perr_set(e, "unknown fault kind \"%s\"", k->valuestring);
    f->at_token = num_or(j, "at_token", 0);
    f->status = (int)num_or(j, "status", num_or(j, "code", 500));
    f->ms = num_or(j, "ms", f->kind == FAKE_FAULT_SLOW_START ? 5000 : -1);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "message");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    f->message = cJSON_IsString(m) ? m->valuestring : NULL;
    f->type = cJSON_IsString(t) ? t->valuestring : NULL;
    return 0;
}

/* Tag tokens for the inline dialect: an array of strings (one token each), else the
 * default single-token tag dflt, as in Qwen's tokenizer where <think> is one id. */
static int parse_tag(const cJSON *j, const char *dflt, fake_segs *out, perr *e)
{
    /* One tree per default tag, built on first use and kept for the life of the process. */
    static cJSON *defaults[2];
    if (!cJSON_IsArray(j)) {
        int which = dflt[1] == '/';
        if (!defaults[which]) defaults[which] = cJSON_CreateStringArray(&dflt, 1);
        j = defaults[which];
    }
    const cJSON *it;
    cJSON_ArrayForEach(it,
                       j) if (!cJSON_IsString(it)) return perr_set(e, "tag tokens must be strings");
    out->v = calloc(1, sizeof *out->v);
    if (!out->v || !j) return perr_set(e, "out of memory");
    out->n = 1;
    out->v[0].kind = FAKE_SEG_TOKENS;
    out->v[0].toks = j;
    return 0;
}

static int parse_resp(const cJSON *j, fake_resp *r, perr *e)
{
    memset(r, 0, sizeof *r);
    if (!cJSON_IsObject(j)) return perr_set(e, "each response must be an object");
    r->match = cJSON_GetObjectItemCaseSensitive(j, "match");
    if (r->match && !cJSON_IsObject(r->match)) return perr_set(e, "\"match\" must be an object");

    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    r->tok_mode = FAKE_TOK_WORDS;
    if (cJSON_IsString(tk)) {
        if (!strcmp(tk->valuestring, "chars"))
            r->tok_mode = FAKE_TOK_CHARS;
        else if (strcmp(tk->valuestring, "words"))
            return perr_set(e, "unknown \"tokens\" mode \"%s\"", tk->valuestring);
    } else if (cJSON_IsObject(tk)) {
        r->tok_mode = FAKE_TOK_BYTES;
        r->tok_bytes = num_or(tk, "bytes", 1);
        if (r->tok_bytes < 1) return perr_set(e, "\"tokens\": {\"bytes\": N} needs N >= 1");
    }
    if (parse_segs(cJSON_GetObjectItemCaseSensitive(j, "reasoning"), &r->reasoning, r->tok_mode,
                   r->tok_bytes, e) < 0 ||
        parse_segs(cJSON_GetObjectItemCaseSensitive(j, "content"), &r->content, r->tok_mode,
                   r->tok_bytes, e) < 0)
        return -1;

    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(j, "tool_calls");
    if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) {
        r->tools = calloc((size_t)cJSON_GetArraySize(tools), sizeof *r->tools);
        if (!r->tools) return perr_set(e, "out of memory");
        const cJSON *t;
        cJSON_ArrayForEach(t, tools)
        {
            fake_tool *ft = &r->tools[r->ntools++];
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(t, "id");
            if (!cJSON_IsString(name)) return perr_set(e, "tool call needs a \"name\"");
            ft->name = name->valuestring;
            ft->id = cJSON_IsString(id) ? id->valuestring : NULL;
            if (parse_segs(cJSON_GetObjectItemCaseSensitive(t, "arguments"), &ft->args, r->tok_mode,
                           r->tok_bytes, e) < 0)
                return -1;
        }
    }
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(j, "finish_reason");
    r->finish_reason = cJSON_IsString(fr) ? fr->valuestring : NULL;
    r->stop_reason = cJSON_GetObjectItemCaseSensitive(j, "stop_reason");
    r->matched_stop = cJSON_GetObjectItemCaseSensitive(j, "matched_stop");
    r->pace_us = pace_us(j);
    r->first_byte_ms = num_or(j, "first_byte_ms", -1);
    r->prompt_tokens = num_or(j, "prompt_tokens", -1);
    r->merge_boundary = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "merge_boundary"));
    r->stream_forever = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "stream_forever"));
    const cJSON *ot = cJSON_GetObjectItemCaseSensitive(j, "open_tag");
    r->open_tag = !cJSON_IsFalse(ot);
    if (parse_tag(cJSON_IsArray(ot) ? ot : NULL, "<think>", &r->open_seg, e) < 0 ||
        parse_tag(cJSON_GetObjectItemCaseSensitive(j, "close_tag"), "</think>", &r->close_seg, e) <
            0)
        return -1;
    return parse_fault(cJSON_GetObjectItemCaseSensitive(j, "fault"), &r->fault, e);
}

static void free_resp(fake_resp *r)
{
    free(r->reasoning.v);
    free(r->content.v);
    for (size_t i = 0; i < r->ntools; i++)
        free(r->tools[i].args.v);
    free(r->tools);
    free(r->open_seg.v);
    free(r->close_seg.v);
}

fake_scenario *fake_scenario_parse(const char *json, size_t len, char *err, size_t errlen)
{
    perr e = {err, errlen};
    fake_scenario *sc = calloc(1, sizeof *sc);
    if (!sc) {
        perr_set(&e, "out of memory");
        return NULL;
    }
    sc->refs = 1;
    sc->root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(sc->root)) {
        perr_set(&e, "scenario is not a JSON object");
        goto fail;
    }
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(sc->root, "dialect");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(sc->root, "model");
    sc->dialect = cJSON_IsString(d) ? d->valuestring : NULL;
    sc->model = cJSON_IsString(m) ? m->valuestring : NULL;
    sc->pace_us = pace_us(sc->root);
    sc->first_byte_ms = num_or(sc->root, "first_byte_ms", -1);
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(sc->root, "responses");
    if (!cJSON_IsArray(rs)) {
        perr_set(&e, "scenario needs a \"responses\" array");
        goto fail;
    }
    sc->resp = calloc((size_t)cJSON_GetArraySize(rs) + 1, sizeof *sc->resp);
    if (!sc->resp) goto fail;
    const cJSON *it;
    cJSON_ArrayForEach(it, rs)
    {
        int rc = parse_resp(it, &sc->resp[sc->nresp], &e);
        sc->nresp++; /* counted even on failure so that free_resp sees it */
        if (rc < 0) goto fail;
    }
    return sc;
fail:
    sc->refs = 1;
    fake_scenario_unref(sc);
    return NULL;
}

fake_scenario *fake_scenario_load(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    fbuf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        fbuf_put(&b, chunk, n);
    int bad = ferror(f);
    fclose(f);
    fake_scenario *sc = NULL;
    if (bad)
        snprintf(err, errlen, "%s: read error", path);
    else
        sc = fake_scenario_parse(b.p ? b.p : "", b.len, err, errlen);
    fbuf_free(&b);
    return sc;
}

fake_scenario *fake_scenario_ref(fake_scenario *sc)
{
    if (sc) sc->refs++;
    return sc;
}

void fake_scenario_unref(fake_scenario *sc)
{
    if (!sc || --sc->refs > 0) return;
    for (size_t i = 0; i < sc->nresp; i++)
        free_resp(&sc->resp[i]);
    free(sc->resp);
    cJSON_Delete(sc->root);
    free(sc);
}

void fake_scenario_reset_counters(fake_scenario *sc)
{
    for (size_t i = 0; i < sc->nresp; i++)
        sc->resp[i].nth_seen = 0;
}

/* ---- matching ---- */

/* body[path] where path may be dotted ("stream_options.include_usage"). */
static const cJSON *dig(const cJSON *o, const char *path)
{
    char key[256];
    while (o && *path) {
        const char *dot = strchr(path, '.');
        size_t n = dot ? (size_t)(dot - path) : strlen(path);
        if (n >= sizeof key) return NULL;
        memcpy(key, path, n);
        key[n] = '\0';
        o = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
        path += n + (dot ? 1 : 0);
    }
    return o;
}

static bool value_equal(const cJSON *want, const cJSON *got)
{
    if (cJSON_IsNull(want)) return !got || cJSON_IsNull(got);
    if (!got) return false;
    if (cJSON_IsNumber(want) && cJSON_IsNumber(got))
        return fabs(want->valuedouble - got->valuedouble) < 1e-9;
    return cJSON_Compare(want, got, true);
}

static bool text_contains(const cJSON *v, const char *needle)
{
    if (cJSON_IsString(v)) return strstr(v->valuestring, needle) != NULL;
    if (!cJSON_IsArray(v)) return false;
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        if (cJSON_IsString(it) && strstr(it->valuestring, needle)) return true;
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "text");
        if (cJSON_IsString(t) && strstr(t->valuestring, needle)) return true;
    }
    return false;
}

static bool prompt_contains(const cJSON *body, const char *needle)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages"), *m;
    cJSON_ArrayForEach(m, msgs) if (text_contains(cJSON_GetObjectItemCaseSensitive(m, "content"),
                                                  needle)) return true;
    return text_contains(cJSON_GetObjectItemCaseSensitive(body, "prompt"), needle) ||
           text_contains(cJSON_GetObjectItemCaseSensitive(body, "text"), needle);
}

bool fake_is_continuation(const cJSON *body)
{
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "continue_final_message")))
        return false;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    int n = cJSON_GetArraySize(msgs);
    const cJSON *role =
        n ? cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(msgs, n - 1), "role") : NULL;
    return cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
}

/* All criteria of m except nth. */
static bool fits(const cJSON *m, const char *path, const cJSON *headers, const cJSON *body)
{
    const cJSON *c, *it;
    if ((c = cJSON_GetObjectItemCaseSensitive(m, "fields"))) {
        cJSON_ArrayForEach(it, c) if (!value_equal(it, dig(body, it->string))) return false;
    }
    if (cJSON_IsString(c = cJSON_GetObjectItemCaseSensitive(m, "prompt_contains")) &&
        !prompt_contains(body, c->valuestring))
        return false;
    if (cJSON_IsBool(c = cJSON_GetObjectItemCaseSensitive(m, "continue")) &&
        cJSON_IsTrue(c) != fake_is_continuation(body))
        return false;
    if (cJSON_IsString(c = cJSON_GetObjectItemCaseSensitive(m, "path")) &&
        strcmp(c->valuestring, path))
        return false;
    if ((c = cJSON_GetObjectItemCaseSensitive(m, "header"))) {
        cJSON_ArrayForEach(it, c)
        {
            const cJSON *h = cJSON_GetObjectItem(headers, it->string); /* case-insensitive */
            if (!cJSON_IsString(it) || !cJSON_IsString(h) ||
                strcmp(it->valuestring, h->valuestring))
                return false;
        }
    }
    return true;
}

int fake_scenario_match(fake_scenario *sc, const char *path, const cJSON *headers,
                        const cJSON *body)
{
    int found = -1;
    for (size_t i = 0; i < sc->nresp; i++) {
        fake_resp *r = &sc->resp[i];
        if (!r->match) {
            if (found < 0) found = (int)i;
            continue;
        }
        if (!fits(r->match, path, headers, body)) continue;
        /* Every entry whose criteria held counts the request, even when an earlier entry
         * already won: "the nth request that fits" must not depend on entry order. */
        const cJSON *nth = cJSON_GetObjectItemCaseSensitive(r->match, "nth");
        long seen = ++r->nth_seen;
        if (cJSON_IsNumber(nth) && (long)nth->valuedouble != seen) continue;
        if (found < 0) found = (int)i;
    }
    return found;
}

long fake_prompt_tokens(const cJSON *body)
{
    long n = 0;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages"), *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        n += 4;
        if (cJSON_IsString(c))
            n += text_count(c->valuestring, strlen(c->valuestring), FAKE_TOK_WORDS, 0);
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (!cJSON_IsString(p)) p = cJSON_GetObjectItemCaseSensitive(body, "text");
    if (cJSON_IsString(p))
        n += text_count(p->valuestring, strlen(p->valuestring), FAKE_TOK_WORDS, 0);
    return n ? n : 1;
}

/* ---- plans ---- */

/* A few hundred common words for "varied" text: enough that word trigrams almost never
 * repeat within a few thousand tokens. */
static const char *const words[] = {
    "the",       "model",       "answer",        "question",   "number",      "function",
    "value",     "result",      "first",         "second",     "check",       "prime",
    "divisor",   "square",      "root",          "loop",       "range",       "return",
    "simple",    "approach",    "consider",      "case",       "small",       "large",
    "input",     "output",      "test",          "example",    "because",     "therefore",
    "however",   "since",       "while",         "every",      "each",        "other",
    "some",      "many",        "few",           "more",       "less",        "only",
    "also",      "then",        "when",          "where",      "which",       "what",
    "why",       "how",         "could",         "would",      "should",      "might",
    "must",      "will",        "can",           "may",        "make",        "take",
    "give",      "find",        "think",         "know",       "see",         "look",
    "want",      "use",         "work",          "call",       "try",         "ask",
    "need",      "feel",        "become",        "leave",      "put",         "mean",
    "keep",      "let",         "begin",         "seem",       "help",        "show",
    "hear",      "play",        "run",           "move",       "live",        "believe",
    "bring",     "happen",      "write",         "provide",    "sit",         "stand",
    "lose",      "pay",         "meet",          "include",    "continue",    "set",
    "learn",     "change",      "lead",          "understand", "watch",       "follow",
    "stop",      "create",      "speak",         "read",       "allow",       "add",
    "spend",     "grow",        "open",          "walk",       "win",         "offer",
    "remember",  "love",        "appear",        "buy",        "wait",        "serve",
    "die",       "send",        "expect",        "build",      "stay",        "fall",
    "cut",       "reach",       "kill",          "remain",     "suggest",     "raise",
    "pass",      "sell",        "require",       "report",     "decide",      "pull",
    "time",      "year",        "people",        "way",        "day",         "man",
    "thing",     "woman",       "life",          "child",      "world",       "school",
    "state",     "family",      "student",       "group",      "country",     "problem",
    "hand",      "part",        "place",         "week",       "company",     "system",
    "program",   "government",  "night",         "point",      "home",        "water",
    "room",      "mother",      "area",          "money",      "story",       "fact",
    "month",     "lot",         "right",         "study",      "book",        "eye",
    "job",       "word",        "business",      "issue",      "side",        "kind",
    "head",      "house",       "service",       "friend",     "father",      "power",
    "hour",      "game",        "line",          "end",        "member",      "law",
    "car",       "city",        "community",     "name",       "president",   "team",
    "minute",    "idea",        "kid",           "body",       "information", "back",
    "parent",    "face",        "others",        "level",      "office",      "door",
    "health",    "person",      "art",           "war",        "history",     "party",
    "change",    "morning",     "reason",        "research",   "girl",        "guy",
    "moment",    "air",         "teacher",       "force",      "education",   "good",
    "new",       "old",         "great",         "high",       "little",      "own",
    "long",      "young",       "important",     "different",  "real",        "best",
    "free",      "able",        "better",        "true",       "whole",       "clear",
    "recent",    "certain",     "personal",      "open",       "red",         "difficult",
    "available", "likely",      "short",         "single",     "medical",     "current",
    "wrong",     "private",     "past",          "foreign",    "fine",        "common",
    "poor",      "natural",     "significant",   "similar",    "hot",         "dead",
    "central",   "happy",       "serious",       "ready",      "simple",      "left",
    "physical",  "general",     "environmental", "financial",  "blue",        "democratic",
    "dark",      "various",     "entire",        "close",      "legal",       "religious",
    "cold",      "final",       "main",          "green",      "nice",        "huge",
    "popular",   "traditional", "cultural",
};

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64*: fast, deterministic, good enough to pick words. */
    uint64_t x = *s;
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static int add_part(fake_plan *pl, size_t *cap, fake_channel ch, int tool, const fake_segs *segs,
                    long count)
{
    if (pl->nparts == *cap) {
        *cap = *cap ? *cap * 2 : 8;
        fake_part *p = realloc(pl->parts, *cap * sizeof *p);
        if (!p) return -1;
        pl->parts = p;
    }
    pl->parts[pl->nparts++] = (fake_part){ch, tool, segs, count};
    return 0;
}

int fake_plan_init(fake_plan *pl, const fake_resp *r, fake_rmode rmode, long cap, bool stamp)
{
    memset(pl, 0, sizeof *pl);
    pl->r = r;
    pl->stamp = stamp;
    size_t pcap = 0;
    long nr = segs_count(&r->reasoning);
    bool has_r = nr > 0 && rmode != FAKE_R_DROP;
    int rc = 0;
    if (rmode != FAKE_R_SEPARATE && has_r) {
        if (r->open_tag && rmode == FAKE_R_INLINE)
            rc |= add_part(pl, &pcap, FAKE_CH_CONTENT, 0, &r->open_seg, segs_count(&r->open_seg));
        rc |= add_part(pl, &pcap, FAKE_CH_CONTENT, 0, &r->reasoning, nr);
        rc |= add_part(pl, &pcap, FAKE_CH_CONTENT, 0, &r->close_seg, segs_count(&r->close_seg));
    } else if (has_r) {
        rc |= add_part(pl, &pcap, FAKE_CH_REASONING, 0, &r->reasoning, nr);
    }
    long nc = segs_count(&r->content);
    if (r->stream_forever && nc > 0) nc = LONG_MAX;
    rc |= add_part(pl, &pcap, FAKE_CH_CONTENT, 0, &r->content, nc);
    for (size_t i = 0; i < r->ntools; i++) {
        rc |= add_part(pl, &pcap, FAKE_CH_TOOL_HEAD, (int)i, NULL, 1);
        rc |= add_part(pl, &pcap, FAKE_CH_TOOL_ARGS, (int)i, &r->tools[i].args,
                       segs_count(&r->tools[i].args));
    }
    if (rc) return -1;

    if (cap <= 0) cap = DEFAULT_CAP;
    if (r->stream_forever) cap = LONG_MAX;
    long left = cap;
    pl->raw_total = pl->total = 0;
    for (size_t i = 0; i < pl->nparts; i++) {
        fake_part *p = &pl->parts[i];
        long want = p->ntok;
        pl->raw_total =
            (want == LONG_MAX || pl->raw_total > LONG_MAX - want) ? LONG_MAX : pl->raw_total + want;
        p->ntok = want < left ? want : left;
        if (left != LONG_MAX) left -= p->ntok;
        pl->total = (p->ntok == LONG_MAX || pl->total == LONG_MAX) ? LONG_MAX : pl->total + p->ntok;
        if (p->segs == &r->reasoning) pl->reasoning_n = p->ntok;
    }
    pl->cut = pl->raw_total > pl->total;
    pl->left = pl->nparts ? pl->parts[0].ntok : 0;
    return 0;
}

void fake_plan_free(fake_plan *pl)
{
    if (!pl) return;
    free(pl->parts);
    pl->parts = NULL;
    pl->nparts = 0;
}

/* Produces the next token of segment g at the cursor; false when g is exhausted. */
static bool seg_next(fake_plan *pl, const fake_seg *g, const char **p, size_t *n)
{
    const fake_resp *r = pl->r;
    switch (g->kind) {
    case FAKE_SEG_TEXT:
    case FAKE_SEG_REPEAT:
        if (pl->off >= g->len) {
            if (g->kind == FAKE_SEG_TEXT || !g->len) return false;
            if (g->times >= 0 && pl->rep + 1 >= g->times) return false;
            pl->rep++;
            pl->off = 0;
        }
        if (g->kind == FAKE_SEG_REPEAT && g->times == 0) return false;
        *p = g->text + pl->off;
        *n = tok_len(g->text, g->len, pl->off, r->tok_mode, r->tok_bytes);
        pl->off += *n;
        return true;
    case FAKE_SEG_TOKENS: {
        const cJSON *t = cJSON_GetArrayItem(g->toks, (int)pl->idx);
        if (!t) return false;
        pl->idx++;
        *p = t->valuestring;
        *n = strlen(t->valuestring);
        return true;
    }
    case FAKE_SEG_STAMP: /* no text yet: fake_plan_next stamps the token as it returns it */
        if (g->times >= 0 && pl->idx >= g->times) return false;
        pl->idx++;
        *p = NULL;
        *n = 0;
        return true;
    case FAKE_SEG_VARIED: {
        if (g->times >= 0 && pl->idx >= g->times) return false;
        if (pl->idx == 0) pl->rng = (uint64_t)g->seed * 0x9E3779B97F4A7C15ULL + 1;
        pl->idx++;
        /* rep holds the words left in the current sentence. */
        if (pl->rep <= 0) pl->rep = 8 + (long)(rng_next(&pl->rng) % 13);
        const char *w = words[rng_next(&pl->rng) % (sizeof words / sizeof words[0])];
        bool end = --pl->rep == 0;
        int k = snprintf(pl->tmp, sizeof pl->tmp, "%s%s", w, end ? ". " : " ");
        if (pl->tmp[0] >= 'a' && pl->tmp[0] <= 'z' && pl->idx == 1) pl->tmp[0] -= 32;
        *p = pl->tmp;
        *n = (size_t)k;
        return true;
    }
    }
    return false;
}

/* Makes t the stamp "w<CLOCK_MONOTONIC ns> ", in the plan's scratch. */
static void stamp(fake_plan *pl, fake_token *t)
{
    pl->tmp[0] = 'w';
    size_t n = 1 + fake_dec_u64(pl->tmp + 1, fake_now_ns());
    pl->tmp[n++] = ' ';
    t->p = pl->tmp;
    t->n = n;
}

bool fake_plan_next(fake_plan *pl, fake_token *t)
{
    while (pl->part < pl->nparts) {
        fake_part *pt = &pl->parts[pl->part];
        if (pl->left > 0) {
            bool got = false;
            if (pt->ch == FAKE_CH_TOOL_HEAD) {
                t->p = pl->r->tools[pt->tool].name;
                t->n = strlen(t->p);
                got = true;
            } else {
                while (pl->seg < pt->segs->n) {
                    if (seg_next(pl, &pt->segs->v[pl->seg], &t->p, &t->n)) {
                        got = true;
                        break;
                    }
                    pl->seg++, pl->off = 0, pl->rep = 0, pl->idx = 0;
                    /* stream_forever: the content starts over when it runs out. */
                    if (pl->seg == pt->segs->n && pt->ntok == LONG_MAX && pt->segs->n &&
                        pt->ch == FAKE_CH_CONTENT)
                        pl->seg = 0;
                }
            }
            if (got) {
                if (pl->left != LONG_MAX) pl->left--;
                t->ch = pt->ch;
                t->tool = pt->tool;
                t->last_of_part = pl->left == 0;
                t->reasoning = pt->segs == &pl->r->reasoning;
                /* A stamp segment's token, and with --stamp every content token: the
                 * clock read once, now, as the token leaves the plan. */
                if (!t->p ||
                    (pl->stamp && pt->ch == FAKE_CH_CONTENT && pt->segs == &pl->r->content))
                    stamp(pl, t);
                return true;
            }
        }
        pl->part++;
        pl->seg = 0, pl->off = 0, pl->rep = 0, pl->idx = 0;
        pl->left = pl->part < pl->nparts ? pl->parts[pl->part].ntok : 0;
    }
    return false;
}
