/* rewrite.c — client request validation and the per-attempt upstream body
 * (see rewrite.h for the contract).
 *
 * Every attempt's body is an overlay of the client's parsed body (dl_json_overlay: the
 * members the attempt changes are replaced, the rest refer to the request's tree), so the
 * request stays pristine for the next attempt and for incident records, and an attempt
 * costs no deep copy of it. */
#include "proxy/rewrite.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/buf.h"
#include "proxy/dialect.h"
#include "proxy/jsonguard.h"
#include "proxy/jsontree.h"
#include "proxy/xalloc.h"

static int fail(rw_error *err, const char *message, const char *param)
{
    err->status = 400;
    err->message = message;
    err->param = param;
    err->code = NULL;
    return -1;
}

static bool absent(const cJSON *v)
{
    return !v || cJSON_IsNull(v);
}

/* The top-level members rw_parse reads: each the first of its name, as cJSON's look-up
 * finds it, but found in one walk over the body's members that compares a name only with
 * the names of its first byte (a look-up per name compared every member's name with it). */
enum {
    M_MESSAGES,
    M_PROMPT,
    M_STREAM,
    M_STREAM_OPTIONS,
    M_N,
    M_TEMPERATURE,
    M_MODEL,
    M_KWARGS,
    M_COUNT
};
static void top_members(const cJSON *root, const cJSON *found[M_COUNT])
{
    static const char *const names[M_COUNT] = {[M_MESSAGES] = "messages",
                                               [M_PROMPT] = "prompt",
                                               [M_STREAM] = "stream",
                                               [M_STREAM_OPTIONS] = "stream_options",
                                               [M_N] = "n",
                                               [M_TEMPERATURE] = "temperature",
                                               [M_MODEL] = "model",
                                               [M_KWARGS] = "chat_template_kwargs"};
    for (const cJSON *m = root->child; m && m->string; m = m->next) /* a nameless one stops it */
        for (size_t i = 0; i < M_COUNT; i++)
            if (!found[i] && m->string[0] == names[i][0] && strcmp(m->string, names[i]) == 0) {
                found[i] = m;
                break;
            }
}

/* The field checks that do not depend on the endpoint. Returns 0 or -1 with err. */
static int check_common(const cJSON *const top[M_COUNT], rw_request *out, rw_error *err)
{
    const cJSON *v = top[M_STREAM];
    if (!absent(v) && !cJSON_IsBool(v)) return fail(err, "'stream' must be a boolean", "stream");
    out->client_stream = cJSON_IsTrue(v);

    v = top[M_STREAM_OPTIONS];
    if (!absent(v) && !cJSON_IsObject(v))
        return fail(err, "'stream_options' must be an object", "stream_options");
    out->client_usage =
        out->client_stream && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(v, "include_usage"));

    v = top[M_N];
    out->n = 1;
    if (!absent(v)) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e6 ||
            v->valuedouble != (double)v->valueint)
            return fail(err, "'n' must be a positive integer", "n");
        out->n = v->valueint;
    }

    v = top[M_TEMPERATURE];
    if (!absent(v)) {
        if (!cJSON_IsNumber(v)) return fail(err, "'temperature' must be a number", "temperature");
        out->temperature = v->valuedouble;
        out->has_temperature = true;
    }

    v = top[M_MODEL];
    out->model = cJSON_IsString(v) ? v->valuestring : NULL;

    v = cJSON_GetObjectItemCaseSensitive(top[M_KWARGS], "enable_thinking");
    out->enable_thinking = cJSON_IsBool(v) ? cJSON_IsTrue(v) : -1;
    return 0;
}

/* True when s[0..n) is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates, nothing
 * past U+10FFFF). cJSON does not check, and an upstream must never get invalid text. O(n);
 * ASCII, most of a body, eight bytes at a time. */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint64_t w;
        if (n - i >= 8 && (memcpy(&w, s + i, 8), !(w & 0x8080808080808080ull))) {
            i += 8;
            continue;
        }
        unsigned c = s[i];
        size_t k = c < 0x80             ? 0
                   : (c & 0xe0) == 0xc0 ? 1
                   : (c & 0xf0) == 0xe0 ? 2
                   : (c & 0xf8) == 0xf0 ? 3
                                        : 4;
        if (k == 4 || k > n - i - 1) return false; /* bad lead byte, or cut short */
        unsigned cp = k == 0 ? c : c & (0x3f >> k);
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        static const unsigned min[] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += k + 1;
    }
    return true;
}

int rw_parse(const char *body, size_t len, bool chat, rw_request *out, rw_error *err)
{
    memset(out, 0, sizeof(*out));
    if (!valid_utf8((const unsigned char *)body, len))
        return fail(err, "The request body is not valid UTF-8.", NULL);
    /* One block for a body in jsonguard's form; anything else as cJSON parses it. */
    cJSON *root = jt_parse(body, len);
    bool one_block = root != NULL;
    if (!one_block) root = cJSON_ParseWithLength(body, len);
    if (!root)
        return fail(
            err, "We could not parse the JSON body of your request: expected a JSON object.", NULL);
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        fail(err, "The request body must be a JSON object.", NULL);
        goto out;
    }
    const cJSON *top[M_COUNT] = {0};
    top_members(root, top);
    if (chat) {
        const cJSON *msgs = top[M_MESSAGES], *m;
        if (absent(msgs)) {
            fail(err, "'messages' is a required property", "messages");
            goto out;
        }
        if (!cJSON_IsArray(msgs)) {
            fail(err, "'messages' must be an array", "messages");
            goto out;
        }
        cJSON_ArrayForEach(m, msgs)
        {
            if (!cJSON_IsObject(m)) {
                fail(err, "each item of 'messages' must be an object", "messages");
                goto out;
            }
        }
    } else {
        const cJSON *prompt = top[M_PROMPT];
        if (absent(prompt)) {
            fail(err, "'prompt' is a required property", "prompt");
            goto out;
        }
        out->prompt_is_string = cJSON_IsString(prompt);
    }
    if (check_common(top, out, err)) goto out;
    out->messages = top[M_MESSAGES];
    out->stream_options = top[M_STREAM_OPTIONS];
    out->root = root;
    out->one_block = one_block;
    out->chat = chat;
    rc = 0;
out:
    if (rc) {
        out->root = root;
        out->one_block = one_block;
        rw_request_clear(out);
    }
    return rc;
}

void rw_request_clear(rw_request *r)
{
    if (r->one_block)
        lg_xfree(r->root);
    else
        cJSON_Delete(r->root);
    memset(r, 0, sizeof(*r));
}

double rw_step_temperature(const rw_request *req, const lg_sampling_step *st)
{
    double t = (req->has_temperature ? req->temperature : 1.0) + st->temperature_add;
    t = t < 0 ? 0 : t > 2 ? 2 : t;
    return (double)(long long)(t * 1e6 + 0.5) / 1e6;
}

/* Applies a retry step's sampling to `obj` (the upstream body, or a record of the
 * client's sampling). Temperature is rounded to 6 decimals so that 0.6 + 0.2 prints as
 * 0.8, not 0.79999999999999993. */
static void apply_step(cJSON *obj, const rw_request *req, const rw_opts *o)
{
    const lg_sampling_step *st = o->step;
    if (!st) return;
    if (st->temperature_add != 0)
        dl_json_set(obj, "temperature", cJSON_CreateNumber(rw_step_temperature(req, st)));
    if (st->has_presence_penalty)
        dl_json_set(obj, "presence_penalty", cJSON_CreateNumber(st->presence_penalty));
    if (st->has_frequency_penalty)
        dl_json_set(obj, "frequency_penalty", cJSON_CreateNumber(st->frequency_penalty));
    if (st->has_repetition_penalty &&
        (o->upstream_kind == LG_UPSTREAM_SGLANG || o->upstream_kind == LG_UPSTREAM_VLLM))
        dl_json_set(obj, "repetition_penalty", cJSON_CreateNumber(st->repetition_penalty));
    if (st->new_seed) dl_json_set(obj, "seed", cJSON_CreateNumber((double)o->seed));
}

/* body["messages"] (an array of objects: rw_parse checked) replaced by an array of
 * overlays of its messages, each ready to edit; returned, owned by body. */
static cJSON *overlay_messages(cJSON *body)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages"), *m;
    cJSON *copy = dl_json_must(cJSON_CreateArray());
    cJSON_ArrayForEach(m, msgs) cJSON_AddItemToArray(copy, dl_json_overlay(m));
    dl_json_set(body, "messages", copy);
    return copy;
}

/* Moves, keeps or drops the reasoning of assistant messages in the history. */
static void rewrite_history(cJSON *msgs, const rw_opts *o)
{
    const char *target = o->upstream_kind == LG_UPSTREAM_VLLM     ? "reasoning"
                         : o->upstream_kind == LG_UPSTREAM_SGLANG ? "reasoning_content"
                                                                  : NULL;
    if (o->history == LG_HISTORY_KEEP || (o->history == LG_HISTORY_REWRITE && !target)) return;
    cJSON *m;
    cJSON_ArrayForEach(m, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "assistant")) continue;
        cJSON *rc = cJSON_DetachItemFromObjectCaseSensitive(m, "reasoning_content");
        cJSON *r = cJSON_DetachItemFromObjectCaseSensitive(m, "reasoning");
        dl_json_del(m, "reasoning_content"); /* JSON may repeat a key: drop every copy */
        dl_json_del(m, "reasoning");
        if (o->history == LG_HISTORY_REWRITE) {
            cJSON **keep = cJSON_IsString(rc) && rc->valuestring[0] ? &rc
                           : cJSON_IsString(r)                      ? &r
                                                                    : NULL;
            if (keep) {
                dl_json_set(m, target, *keep);
                *keep = NULL;
            }
        }
        cJSON_Delete(rc);
        cJSON_Delete(r);
    }
}

/* Appends text to the string at obj[key]. */
static void append_to(cJSON *obj, const char *key, const char *text, size_t n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    lg_buf b = LG_BUF_INIT;
    lg_buf_append_str(&b, v->valuestring);
    lg_buf_append(&b, text, n);
    dl_json_set(obj, key, cJSON_CreateString(b.p));
    lg_buf_free(&b);
}

/* The continuation of a clean prefix. Returns 0, or -1 with err when the upstream or the
 * request cannot continue (the caller then restarts). */
static int add_continuation(cJSON *body, const rw_request *req, const rw_opts *o, rw_error *err)
{
    if (o->upstream_kind != LG_UPSTREAM_SGLANG && o->upstream_kind != LG_UPSTREAM_VLLM) {
        fail(err, "continuation needs an SGLang or vLLM upstream", NULL);
        err->status = 500;
        err->code = "continue_unsupported";
        return -1;
    }
    if (!req->chat) {
        if (!req->prompt_is_string) {
            fail(err, "continuation needs a string prompt", "prompt");
            err->status = 500;
            err->code = "continue_unsupported";
            return -1;
        }
        append_to(body, "prompt", o->continue_text, o->continue_len);
        return 0;
    }
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(body, "messages");
    int n = cJSON_GetArraySize(msgs);
    cJSON *last = n ? cJSON_GetArrayItem(msgs, n - 1) : NULL;
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(last, "role");
    bool client_continues =
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "continue_final_message")) &&
        cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") &&
        cJSON_IsString(cJSON_GetObjectItemCaseSensitive(last, "content"));
    if (client_continues) {
        append_to(last, "content", o->continue_text, o->continue_len);
    } else {
        cJSON *m = dl_json_must(cJSON_CreateObject());
        dl_json_set(m, "role", cJSON_CreateString("assistant"));
        char *text = strndup(o->continue_text, o->continue_len);
        if (!text) lg_oom(o->continue_len + 1);
        dl_json_set(m, "content", cJSON_CreateString(text));
        free(text);
        cJSON_AddItemToArray(msgs, m);
    }
    dl_json_set(body, "continue_final_message", cJSON_CreateTrue());
    if (o->upstream_kind == LG_UPSTREAM_VLLM)
        dl_json_set(body, "add_generation_prompt", cJSON_CreateFalse());
    return 0;
}

/* ---- the splice (rw_build_upstream's fast path) --------------------------------------- */

/* A span of the client's body; rw_parse's body passed jsonguard, so it is exactly one
 * RFC 8259 value and the scanners below need not check its grammar. */
typedef struct span {
    const char *p;
    size_t n;
} span;

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Past the string that starts at p (its opening quote); *escaped is set when it holds a
 * backslash. A short string (a key, a role) is read byte by byte; past its first 16 bytes
 * (a prompt's text), eight bytes at a time. */
static inline const char *skip_string(const char *p, const char *end, bool *escaped)
{
    for (p++; p < end; p += 2) {
        const char *q = end - p > 16 ? p + 16 : end;
        while (p < q && *p != '"' && *p != '\\')
            p++;
        if (p == q) {
            while (end - p >= 8 && !jg_special8(p))
                p += 8;
            while (p < end && *p != '"' && *p != '\\')
                p++;
        }
        if (p >= end) break;
        if (*p == '"') return p + 1;
        *escaped = true;
    }
    return end;
}

/* Past the number that starts at p; false when cJSON's print of it would read as another
 * value or type in the upstream's parser: an integer of more than 9 digits (printed in
 * exponent form past 10^15, and past 2^53 not exactly), an integral number written with a
 * fraction or an exponent (printed as an integer), one out of a double's range (printed
 * as null). */
static bool skip_number(const char **pp, const char *end)
{
    const char *p = *pp, *start = p;
    bool plain = true;
    while (p < end && ((*p >= '0' && *p <= '9') || *p == '-' || *p == '+' || *p == '.' ||
                       *p == 'e' || *p == 'E')) {
        if (*p == '.' || *p == 'e' || *p == 'E') plain = false;
        p++;
    }
    *pp = p;
    size_t n = (size_t)(p - start);
    if (plain) return n - (*start == '-') <= 9;
    char tmp[64];
    if (n >= sizeof tmp) return false;
    memcpy(tmp, start, n);
    tmp[n] = '\0';
    double d = strtod(tmp, NULL);
    return isfinite(d) && d != floor(d);
}

/* Past the value that starts at p; false when a number in it fails skip_number. */
static bool skip_value(const char **pp, const char *end)
{
    const char *p = *pp;
    int depth = 0;
    bool escaped = false;
    do {
        if (*p == '"') {
            p = skip_string(p, end, &escaped);
        } else if (*p == '-' || (*p >= '0' && *p <= '9')) {
            if (!skip_number(&p, end)) return false;
        } else if (*p == '{' || *p == '[') {
            depth++, p++;
        } else if (*p == '}' || *p == ']') {
            depth--, p++;
        } else if (*p == 't' || *p == 'n') {
            p += 4; /* true, null */
        } else if (*p == 'f') {
            p += 5;
        } else {
            p++; /* whitespace, ',' and ':' inside a container */
        }
    } while (depth > 0 && p < end);
    *pp = p;
    return true;
}

static bool key_is(span key, const char *k)
{
    size_t n = strlen(k);
    return key.n == n + 2 && memcmp(key.p + 1, k, n) == 0;
}

/* Appends `,key:value` (no comma before the first member) in one step. */
static void put_member(lg_buf *b, bool *first, span key, const char *value, size_t n)
{
    lg_buf_reserve(b, key.n + n + 2);
    char *w = b->p + b->len;
    if (!*first) *w++ = ',';
    *first = false;
    memcpy(w, key.p, key.n);
    w += key.n;
    *w++ = ':';
    memcpy(w, value, n);
    w += n;
    *w = '\0';
    b->len = (size_t)(w - b->p);
}

/* Whether s[0..n) holds a byte that a JSON string must escape: a control byte, '"' or
 * '\\'. Eight bytes at a time. */
static bool needs_escape(const char *s, size_t n)
{
    size_t i = 0;
    for (; n - i >= 8; i += 8)
        if (jg_special8(s + i)) return true;
    for (; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == '"' || s[i] == '\\') return true;
    return false;
}

/* Whether rewrite_history would change a message: an assistant message with reasoning. */
static bool history_changes(const rw_request *req, const rw_opts *o)
{
    bool target = o->upstream_kind == LG_UPSTREAM_VLLM || o->upstream_kind == LG_UPSTREAM_SGLANG;
    if (o->history == LG_HISTORY_KEEP || (o->history == LG_HISTORY_REWRITE && !target))
        return false;
    const cJSON *m;
    cJSON_ArrayForEach(m, req->messages)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") &&
            (cJSON_GetObjectItemCaseSensitive(m, "reasoning_content") ||
             cJSON_GetObjectItemCaseSensitive(m, "reasoning")))
            return true;
    }
    return false;
}

/* rw_build_upstream's body without the tree: the client's top-level members as written,
 * in rw_build_upstream's order. NULL when the attempt needs the tree (see rewrite.h). */
static char *splice_upstream(const rw_request *req, const rw_opts *o)
{
    if (!o->raw || o->step || o->continue_text || o->max_tokens > 0) return NULL;
    if (req->chat && history_changes(req, o)) return NULL;
    const cJSON *so = req->stream_options;
    if (cJSON_IsObject(so) && so->child &&
        (so->child->next || strcmp(so->child->string, "include_usage") != 0))
        return NULL; /* members of its own to keep */
    bool rid = o->rid && o->upstream_kind == LG_UPSTREAM_SGLANG;
    size_t rid_len = rid ? strlen(o->rid) : 0;
    if (needs_escape(o->rid, rid_len)) return NULL;

    const char *end = o->raw + o->raw_len, *p = skip_ws(o->raw, end);
    if (p == end || *p != '{') return NULL;
    lg_buf b = LG_BUF_INIT;
    lg_buf_reserve(&b, o->raw_len + 96);
    lg_buf_append(&b, "{", 1);
    bool first = true;
    span messages = {0}, key = {0};
    for (p = skip_ws(p + 1, end); p < end && *p == '"';) {
        key.p = p;
        bool escaped = false;
        p = skip_string(p, end, &escaped);
        key.n = (size_t)(p - key.p);
        if (escaped) goto tree; /* an escaped key: compare it unescaped */
        p = skip_ws(p, end);
        if (p == end || *p != ':') goto tree; /* cannot be, for a body rw_parse took */
        p = skip_ws(p + 1, end);
        const char *v = p;
        if (p == end || !skip_value(&p, end) || p > end) goto tree;
        size_t vn = (size_t)(p - v);
        if (req->chat && key_is(key, "messages"))
            messages = (span){v, vn};
        else if (!key_is(key, "stream") && !key_is(key, "stream_options") &&
                 !(rid && key_is(key, "rid")))
            put_member(&b, &first, key, v, vn);
        p = skip_ws(p, end);
        if (p < end && *p == ',') p = skip_ws(p + 1, end);
    }
    put_member(&b, &first, (span){"\"stream\"", 8}, "true", 4);
    put_member(&b, &first, (span){"\"stream_options\"", 16}, "{\"include_usage\":true}", 22);
    if (rid) {
        lg_buf_append(&b, ",\"rid\":\"", 8);
        lg_buf_append(&b, o->rid, rid_len);
        lg_buf_append(&b, "\"", 1);
    }
    if (messages.p) put_member(&b, &first, (span){"\"messages\"", 10}, messages.p, messages.n);
    lg_buf_append(&b, "}", 1);
    return lg_buf_steal(&b);
tree:
    lg_buf_free(&b);
    return NULL;
}

char *rw_build_upstream(const rw_request *req, const rw_opts *o, rw_error *err)
{
    char *spliced = splice_upstream(req, o);
    if (spliced) return spliced;
    cJSON *body = dl_json_overlay(req->root);
    dl_json_set(body, "stream", cJSON_CreateTrue());
    dl_json_set(dl_json_overlay_member(body, "stream_options"), "include_usage",
                cJSON_CreateTrue());
    if (o->rid && o->upstream_kind == LG_UPSTREAM_SGLANG)
        dl_json_set(body, "rid", cJSON_CreateString(o->rid));
    apply_step(body, req, o);
    if (o->max_tokens > 0) {
        bool mct = cJSON_GetObjectItemCaseSensitive(body, "max_completion_tokens") != NULL;
        bool mt = cJSON_GetObjectItemCaseSensitive(body, "max_tokens") != NULL;
        if (mct) dl_json_set(body, "max_completion_tokens", cJSON_CreateNumber(o->max_tokens));
        if (mt || !mct) dl_json_set(body, "max_tokens", cJSON_CreateNumber(o->max_tokens));
    }
    if (req->chat) rewrite_history(overlay_messages(body), o);
    if (o->continue_text && add_continuation(body, req, o, err)) {
        cJSON_Delete(body);
        return NULL;
    }
    return dl_json_print_free(body);
}

char *rw_build_streamed(const rw_request *req, const rw_opts *o)
{
    cJSON *body = dl_json_overlay(req->root);
    dl_json_set(body, "stream", cJSON_CreateTrue());
    if (o->step && o->step->temperature_add != 0)
        dl_json_set(body, "temperature", cJSON_CreateNumber(rw_step_temperature(req, o->step)));
    return dl_json_print_free(body);
}

cJSON *rw_sampling_json(const rw_request *req, const rw_opts *o)
{
    static const char *const keys[] = {
        "temperature",        "top_p", "top_k", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "seed"};
    cJSON *obj = dl_json_must(cJSON_CreateObject());
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(req->root, keys[i]);
        if (!absent(v)) dl_json_set(obj, keys[i], cJSON_Duplicate(v, 1));
    }
    apply_step(obj, req, o);
    return obj;
}
