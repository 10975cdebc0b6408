/* guard_params.c — the guard's thresholds: per-channel defaults, deep copies and the JSON
 * settings an operator writes under `guard.<channel>` (and `models[i].guard.<channel>`).
 *
 * Parsing a cJSON object is all this file does with the outside world: the config module
 * owns files and key paths, and passes us the object and the prefix to name keys with.
 * The defaults were chosen by running `loopguard scan` over the false-positive and recall
 * corpora (tests/corpus/); README.md ("The guard", "Tuning thresholds") tells the story and how to
 * re-tune. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard/guard_int.h"

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) abort();
    return p;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = xcalloc(n, 1);
    memcpy(d, s, n);
    return d;
}

const char *guard_rclass_name(guard_rclass c)
{
    static const char *const names[GR_COUNT] = {"normal", "rule", "data", "item", "line",
                                                "table",  "blob", "code", "text", "art"};
    return c < GR_COUNT ? names[c] : "?";
}

const char *guard_channel_name(lg_channel ch)
{
    switch (ch) {
    case LG_CH_REASONING:
        return "reasoning";
    case LG_CH_CONTENT:
        return "content";
    case LG_CH_TOOL_ARGS:
        return "tool_args";
    default:
        return "unknown";
    }
}

double guard_steps_repeats(const guard_params *p, uint32_t period)
{
    for (size_t i = 0; i < p->repeat.n_steps; i++)
        if (period <= p->repeat.steps[i].max_period) return p->repeat.steps[i].repeats;
    return 0;
}

uint32_t guard_need_for(uint32_t period, double repeats, uint32_t min_bytes)
{
    if (repeats <= 0) return UINT32_MAX;
    double n = repeats * period;
    if (n < min_bytes) n = min_bytes;
    return n > 4e9 ? UINT32_MAX : (uint32_t)ceil(n);
}

/* Fills the derived table after any change of the settings: O(max period). */
static void derive(guard_params *p)
{
    for (uint32_t d = 0; d <= GUARD_HISTORY / 2; d++)
        p->repeat.base_need[d] =
            guard_need_for(d ? d : 1, guard_steps_repeats(p, d ? d : 1), p->repeat.min_bytes);
    guard_leak_derive(p);
    guard_rules_derive(p);
}

/* Template tokens that never belong in an answer. `</think>` is a second one: the proxy
 * splits the first off before feeding content. */
static const char *const default_leaks[] = {"<|im_end|>", "<|im_start|>", "<|endoftext|>",
                                            "</think>"};

guard_params *guard_params_new(lg_channel ch)
{
    /* Repeats needed by period: a short unit must repeat many times before it is a loop
     * (real text has "ll", "!!!", "hahaha"), a long one only a few times. The steps are
     * measured: see README.md, "How the defaults were chosen". */
    static const struct {
        uint32_t max_period;
        double repeats;
    } steps[] = {{1, 20}, {2, 16},   {4, 12},    {8, 10},  {16, 8},
                 {32, 5}, {64, 3.5}, {192, 2.5}, {2048, 2}};
    static const struct {
        uint32_t min_bytes;
        double min_repeats;
        uint32_t max_period;
    } cls[GR_COUNT] = {
        [GR_NORMAL] = {0, 0, 0},  [GR_RULE] = {1024, 0, 0},   [GR_DATA] = {256, 4, 0},
        [GR_ITEM] = {96, 8, 0},   [GR_LINE] = {256, 12, 160}, [GR_TABLE] = {384, 12, 160},
        [GR_BLOB] = {512, 16, 0}, [GR_CODE] = {192, 5, 0},    [GR_TEXT] = {0, 6, 160},
        [GR_ART] = {64, 12, 160},
    };
    guard_params *p = xcalloc(1, sizeof(*p));
    p->ch = ch;
    p->enabled = true;

    p->repeat.enabled = true;
    p->repeat.min_bytes = 32;
    p->repeat.max_period = 2048;
    p->repeat.n_steps = sizeof(steps) / sizeof(steps[0]);
    for (size_t i = 0; i < p->repeat.n_steps; i++) {
        p->repeat.steps[i].max_period = steps[i].max_period;
        p->repeat.steps[i].repeats = steps[i].repeats;
    }
    p->repeat.fence_factor = 2.0;
    for (int c = 0; c < GR_COUNT; c++) {
        p->repeat.cls[c].min_bytes = cls[c].min_bytes;
        p->repeat.cls[c].min_repeats = cls[c].min_repeats;
        p->repeat.cls[c].max_period = cls[c].max_period;
    }
    /* Tool-call arguments are JSON: identical elements ({"x": 0}, {"x": 0}, ...) are a
     * legitimate request there, so code- and data-shaped units need far more. */
    if (ch == LG_CH_TOOL_ARGS) {
        p->repeat.cls[GR_CODE].min_bytes = p->repeat.cls[GR_DATA].min_bytes = 1024;
        p->repeat.cls[GR_CODE].min_repeats = p->repeat.cls[GR_DATA].min_repeats = 32;
    }

    p->lines.enabled = true;
    p->lines.min_repeats = 5;
    p->lines.window = 64;
    p->lines.min_segment_bytes = 16;
    p->lines.min_repeat_ratio = 0.9;
    p->lines.min_run = 16;
    /* Templated lines: 17 in a row, the template 16 bytes and 60 % of the line. On the
     * AlpacaEval answers this caught 7 paraphrase loops the other detectors missed, with no
     * new false trip; a run of 12, or a share of 50 %, tripped on legitimate lists ("How to
     * become a X" in a strong answer). Tool arguments are JSON, whose arrays of objects are
     * templated lines by design: off there. */
    p->lines.template_run = ch == LG_CH_TOOL_ARGS ? 0 : 16;
    p->lines.template_bytes = 16;
    p->lines.template_share = 0.6;
    /* Counting: 33 numbers in a row, each 1-3 above the last with the same text between
     * ("column7, column8, ", "21. 22. 23."). On AlpacaEval it caught 2 of the 4 counting
     * loops with no false trip (16 still had none; 32 leaves room for the held-out sets).
     * Off in tool arguments, where ids count up by design. */
    p->lines.count_run = ch == LG_CH_TOOL_ARGS ? 0 : 32;
    /* Blocks of lines: 4 copies and 12 lines (g_block.c says what that caught). Off in tool
     * arguments, whose arrays of objects are cycles of lines by design. */
    p->lines.block_copies = ch == LG_CH_TOOL_ARGS ? 0 : 4;
    p->lines.block_lines = 12;
    /* Art lines of one texture: 24 in a row. 12, 16 and 24 had no false trip on AlpacaEval
     * and caught its loop alike; 24 lets a diamond or pyramid of '*' 23 rows tall pass. */
    p->lines.art_run = ch == LG_CH_TOOL_ARGS ? 0 : 24;

    /* Paraphrase loops: fewer than min_ratio of the last `window` word trigrams are new, a
     * trigram being new unless it came twice before within memory_words (a block said twice,
     * a procedure told again for a second gene, an essay restarted, is no loop; a template
     * said a third time is), and at most max_new_words new words among them (a list of one
     * product in several colours, one campaign told country by country bring one an item).
     * On the AlpacaEval answers 0.2 caught three loops more than 0.1, and the new-word bound
     * took away the three false trips 0.2 had (lists of one product, the campaign); a bound
     * of 1 or 2 also lost a paraphrase loop, where words whose table entry another key had
     * evicted counted as new. Masking numbers caught two more paraphrases (sudoku steps) but
     * also a counter stepping through a sentence, which is content: off. Reasoning keeps
     * its 0.05 over 128: no labelled reasoning traces measure a higher bar. */
    p->novelty.enabled = true;
    p->novelty.window = ch == LG_CH_REASONING ? 128 : 160;
    p->novelty.min_ratio = ch == LG_CH_REASONING ? 0.05 : 0.2;
    p->novelty.memory_words = 256;
    p->novelty.min_seen = 2;
    p->novelty.mask_numbers = false;
    p->novelty.max_new_words = 3;

    /* Replayed sentences (g_cycle.c): a cycle of up to 63 segments come round once, 4 of its
     * segments equal with their numbers, 300 bytes. On the AlpacaEval answers 200 bytes
     * tripped on a short list whose last names were said three times over; requiring three
     * copies instead of two missed the chapter and dialogue cycles of 1 KiB. */
    p->cycle.enabled = true;
    p->cycle.window = 64;
    p->cycle.copies = 2;
    p->cycle.min_segments = 4;
    p->cycle.min_bytes = 300;
    /* Equal only with the numbers aside: 3 copies over 6 segments, a cycle of two or more
     * (g_cycle.c says why). On AlpacaEval it caught the sudoku steps of a strong model with
     * no new false trip; 3 copies over 3 segments had none either. */
    p->cycle.masked_copies = 3;
    p->cycle.masked_min_segments = 6;
    /* Mixed replays: 15 of the last 16 segments came before, 8 a third time, the order
     * changing 3 times. On AlpacaEval it caught the book titles drawn again in any order
     * with no new false trip; 2 changes of order tripped on a counter stepping through two
     * sentences, 2 new segments of 16 on a strong model's SPL play. */
    p->cycle.mix_window = 16;
    p->cycle.mix_new = 1;
    p->cycle.mix_breaks = 3;
    /* A sentence of 100 bytes said a third time after the passage around it was replayed
     * word for word: on AlpacaEval it caught an essay cut in its section's third copy, with
     * no false trip; 64 and 80 bytes tripped on a tutorial restating its long sentences. */
    p->cycle.third_bytes = 100;
    /* Fuzzy replays: 80 % of two rounds of 2-16 segments equal to the round before. On
     * AlpacaEval it caught a dialogue whose refrain block came round with a line changed,
     * with no new false trip; 75 % tripped on a weekly routine, and the dialogue passes 80 %
     * by one segment of sixteen: a thin margin on both sides. */
    p->cycle.fuzzy_share = 0.8;

    p->rule_max_match_bytes = 256;

    p->n_leaks = sizeof(default_leaks) / sizeof(default_leaks[0]);
    for (size_t i = 0; i < p->n_leaks; i++) {
        p->leak_len[i] = strlen(default_leaks[i]);
        memcpy(p->leaks[i], default_leaks[i], p->leak_len[i] + 1);
    }
    /* Reasoning that never ends: 256 KiB is about 64k tokens, past any thinking budget
     * Qwen3 or DeepSeek-R1 use by default. */
    p->budget_bytes = ch == LG_CH_REASONING ? 262144 : 0;
    p->empty_answer_min_reasoning = ch == LG_CH_CONTENT ? 1 : 0;
    p->holdback_max = 4096;
    derive(p);
    return p;
}

static void rules_free(guard_rule *rules, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(rules[i].name);
        free(rules[i].detector);
        free(rules[i].pattern);
        pcre2_code_free(rules[i].re);
    }
    free(rules);
}

void guard_params_free(guard_params *p)
{
    if (!p) return;
    rules_free(p->rules, p->n_rules);
    free(p);
}

bool guard_params_enabled(const guard_params *p)
{
    return p && p->enabled;
}

/* Compiles `pattern` (UTF-8 mode off: the guard works on bytes, and a UTF-8 pattern
 * would refuse the invalid UTF-8 a broken model can emit) and JIT-compiles it for both
 * complete and hard-partial matching. A JIT failure (no JIT on this CPU, or memory) is
 * not an error: pcre2_match falls back to the interpreter. Returns the code or NULL with
 * a message in err. */
static pcre2_code *rule_compile(const char *pattern, char *err, size_t errlen)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, 0, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        snprintf(err, errlen, "%s at offset %zu", (const char *)msg, (size_t)eo);
        return NULL;
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
    /* A pattern that matches nothing at all would trip every generation. */
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    if (!md) abort();
    int rc = pcre2_match(re, (PCRE2_SPTR) "", 0, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    if (rc >= 0) {
        snprintf(err, errlen, "pattern matches the empty string");
        pcre2_code_free(re);
        return NULL;
    }
    return re;
}

/* Which bytes can start a match, from PCRE2's own analysis: its start bitmap, or its
 * fixed first code unit (both cases of a letter, a safe superset for caseless patterns).
 * Without either (anchors, empty-able starts) every byte may start one. */
static void rule_first_bytes(guard_rule *r)
{
    const uint8_t *map = NULL;
    uint32_t type = 0, unit = 0;
    memset(r->first, 0, sizeof(r->first));
    r->has_first = false;
    if (pcre2_pattern_info(r->re, PCRE2_INFO_FIRSTBITMAP, &map) == 0 && map) {
        memcpy(r->first, map, sizeof(r->first));
        r->has_first = true;
    } else if (pcre2_pattern_info(r->re, PCRE2_INFO_FIRSTCODETYPE, &type) == 0 && type == 1 &&
               pcre2_pattern_info(r->re, PCRE2_INFO_FIRSTCODEUNIT, &unit) == 0 && unit < 256) {
        unsigned char c = (unsigned char)unit, o = c;
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') o = c ^ 0x20;
        r->first[c >> 3] |= (unsigned char)(1u << (c & 7));
        r->first[o >> 3] |= (unsigned char)(1u << (o & 7));
        r->has_first = true;
    }
}

/* Adds a rule (name, pattern) to `p`. Returns 0 or -1 with err. */
static int rule_add(guard_params *p, const char *name, const char *pattern, char *err,
                    size_t errlen)
{
    pcre2_code *re = rule_compile(pattern, err, errlen);
    if (!re) return -1;
    guard_rule *r = realloc(p->rules, (p->n_rules + 1) * sizeof(*r));
    if (!r) abort();
    p->rules = r;
    r = &p->rules[p->n_rules++];
    r->name = xstrdup(name);
    r->pattern = xstrdup(pattern);
    r->re = re;
    rule_first_bytes(r);
    size_t n = strlen(name) + 6;
    r->detector = xcalloc(n, 1);
    snprintf(r->detector, n, "rule:%s", name);
    return 0;
}

guard_params *guard_params_clone(const guard_params *src)
{
    guard_params *p = xcalloc(1, sizeof(*p));
    *p = *src;
    p->rules = NULL;
    p->n_rules = 0;
    for (size_t i = 0; i < src->n_rules; i++) {
        char err[160];
        /* The pattern compiled once already; only memory can fail now. */
        if (rule_add(p, src->rules[i].name, src->rules[i].pattern, err, sizeof(err)) < 0) abort();
    }
    return p;
}

/* ---- JSON settings ------------------------------------------------------------------ */

/* Error reporting for the JSON walk: every message starts with the dotted key path. */
typedef struct jctx {
    char *err;
    size_t errlen;
} jctx;

static int jfail(jctx *c, const char *prefix, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int jfail(jctx *c, const char *prefix, const char *key, const char *fmt, ...)
{
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    snprintf(c->err, c->errlen, "%s%s%s: %s", prefix, key ? "." : "", key ? key : "", msg);
    return -1;
}

static int jbool(jctx *c, const char *prefix, const cJSON *it, bool *out)
{
    if (!cJSON_IsBool(it)) return jfail(c, prefix, it->string, "expected true or false");
    *out = cJSON_IsTrue(it);
    return 0;
}

/* A number in [lo, hi]; `integral` also demands a whole number. */
static int jnum(jctx *c, const char *prefix, const cJSON *it, double lo, double hi, bool integral,
                double *out)
{
    if (!cJSON_IsNumber(it)) return jfail(c, prefix, it->string, "expected a number");
    double v = it->valuedouble;
    if (!(v >= lo && v <= hi) || (integral && v != floor(v)))
        return jfail(c, prefix, it->string, "expected %s between %g and %g",
                     integral ? "an integer" : "a number", lo, hi);
    *out = v;
    return 0;
}

#define JU32(c, pre, it, lo, hi, dst)                                                              \
    do {                                                                                           \
        double v_;                                                                                 \
        if (jnum(c, pre, it, lo, hi, true, &v_) < 0) return -1;                                    \
        (dst) = (uint32_t)v_;                                                                      \
    } while (0)

#define JDBL(c, pre, it, lo, hi, dst)                                                              \
    do {                                                                                           \
        double v_;                                                                                 \
        if (jnum(c, pre, it, lo, hi, false, &v_) < 0) return -1;                                   \
        (dst) = v_;                                                                                \
    } while (0)

static int jobject(jctx *c, const char *prefix, const cJSON *it)
{
    if (!cJSON_IsObject(it)) return jfail(c, prefix, it->string, "expected an object");
    return 0;
}

static void subprefix(char *dst, size_t n, const char *prefix, const char *key)
{
    if (snprintf(dst, n, "%s.%s", prefix, key) < 0) dst[0] = 0;
}

/* [[max_period, repeats], ...] with strictly increasing periods. */
static int apply_steps(guard_params *p, jctx *c, const char *pre, const cJSON *arr)
{
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) < 1 ||
        cJSON_GetArraySize(arr) > GUARD_MAX_PERIOD_STEPS)
        return jfail(c, pre, arr->string, "expected 1 to %d pairs [max_period, repeats]",
                     GUARD_MAX_PERIOD_STEPS);
    size_t n = 0;
    uint32_t last = 0;
    const cJSON *pair;
    cJSON_ArrayForEach(pair, arr)
    {
        const cJSON *a = cJSON_GetArrayItem(pair, 0), *b = cJSON_GetArrayItem(pair, 1);
        if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 || !cJSON_IsNumber(a) ||
            !cJSON_IsNumber(b) || a->valuedouble != floor(a->valuedouble) ||
            a->valuedouble <= last || a->valuedouble > GUARD_HISTORY / 2 || b->valuedouble < 2 ||
            b->valuedouble > 100000)
            return jfail(c, pre, arr->string,
                         "pair %zu: expected [max_period, repeats] with max_period increasing "
                         "up to %d and repeats >= 2",
                         n, GUARD_HISTORY / 2);
        last = (uint32_t)a->valuedouble;
        p->repeat.steps[n].max_period = last;
        p->repeat.steps[n].repeats = b->valuedouble;
        n++;
    }
    p->repeat.n_steps = n;
    return 0;
}

static int apply_classes(guard_params *p, jctx *c, const char *pre, const cJSON *obj)
{
    char sub[192], sub2[224];
    subprefix(sub, sizeof(sub), pre, obj->string);
    if (jobject(c, pre, obj) < 0) return -1;
    const cJSON *cl;
    cJSON_ArrayForEach(cl, obj)
    {
        int k;
        for (k = 1; k < GR_COUNT; k++)
            if (!strcmp(cl->string, guard_rclass_name((guard_rclass)k))) break;
        if (k == GR_COUNT) return jfail(c, sub, cl->string, "unknown key");
        if (jobject(c, sub, cl) < 0) return -1;
        subprefix(sub2, sizeof(sub2), sub, cl->string);
        const cJSON *it;
        cJSON_ArrayForEach(it, cl)
        {
            if (!strcmp(it->string, "min_bytes"))
                JU32(c, sub2, it, 0, 1 << 30, p->repeat.cls[k].min_bytes);
            else if (!strcmp(it->string, "min_repeats"))
                JDBL(c, sub2, it, 0, 1 << 30, p->repeat.cls[k].min_repeats);
            else if (!strcmp(it->string, "max_period"))
                JU32(c, sub2, it, 0, GUARD_HISTORY, p->repeat.cls[k].max_period);
            else
                return jfail(c, sub2, it->string, "unknown key");
        }
    }
    return 0;
}

/* One scalar setting of a detector object: its key, type, place and range. */
typedef struct jfield {
    const char *key;
    enum { JF_BOOL, JF_U32, JF_DBL } kind;
    size_t off; /* offsetof(guard_params, ...) */
    double lo, hi;
} jfield;

#define F_BOOL(k, f)                                                                               \
    {                                                                                              \
        k, JF_BOOL, offsetof(guard_params, f), 0, 0                                                \
    }
#define F_U32(k, f, lo, hi)                                                                        \
    {                                                                                              \
        k, JF_U32, offsetof(guard_params, f), lo, hi                                               \
    }
#define F_DBL(k, f, lo, hi)                                                                        \
    {                                                                                              \
        k, JF_DBL, offsetof(guard_params, f), lo, hi                                               \
    }

static const jfield repeat_fields[] = {
    F_BOOL("enabled", repeat.enabled),
    F_U32("min_bytes", repeat.min_bytes, 0, GUARD_HISTORY),
    F_U32("max_period", repeat.max_period, 1, GUARD_HISTORY / 2),
    F_DBL("fence_factor", repeat.fence_factor, 1, 100),
};
static const jfield lines_fields[] = {
    F_BOOL("enabled", lines.enabled),
    F_U32("min_repeats", lines.min_repeats, 2, 64),
    F_U32("window", lines.window, 4, 1024),
    F_U32("min_segment_bytes", lines.min_segment_bytes, 1, 4096),
    F_DBL("min_repeat_ratio", lines.min_repeat_ratio, 0, 1),
    F_U32("min_run", lines.min_run, 2, 1024),
    F_U32("template_run", lines.template_run, 0, 1024),
    F_U32("template_bytes", lines.template_bytes, 1, 4096),
    F_DBL("template_share", lines.template_share, 0, 1),
    F_U32("count_run", lines.count_run, 0, 100000),
    F_U32("block_copies", lines.block_copies, 0, 1024),
    F_U32("block_lines", lines.block_lines, 2, 100000),
    F_U32("art_run", lines.art_run, 0, 100000),
};
static const jfield cycle_fields[] = {
    F_BOOL("enabled", cycle.enabled),
    F_U32("window", cycle.window, 2,
          128), /* the ring, a power of two, < 256: bucket counts are bytes */
    F_U32("copies", cycle.copies, 2, 64),
    F_U32("min_segments", cycle.min_segments, 1, 1024),
    F_U32("min_bytes", cycle.min_bytes, 0, 1u << 20),
    F_U32("masked_copies", cycle.masked_copies, 0, 64),
    F_U32("masked_min_segments", cycle.masked_min_segments, 1, 1024),
    F_U32("mix_window", cycle.mix_window, 0, 32),
    F_U32("mix_new", cycle.mix_new, 0, 32),
    F_U32("mix_breaks", cycle.mix_breaks, 0, 32),
    F_U32("third_bytes", cycle.third_bytes, 0, 1u << 20),
    F_DBL("fuzzy_share", cycle.fuzzy_share, 0, 1),
};
static const jfield novelty_fields[] = {
    F_BOOL("enabled", novelty.enabled),
    F_U32("window", novelty.window, 8, 4096),
    F_DBL("min_ratio", novelty.min_ratio, 0, 1),
    F_U32("memory_words", novelty.memory_words, 16, 32768),
    F_U32("min_seen", novelty.min_seen, 1, 3),
    F_BOOL("mask_numbers", novelty.mask_numbers),
    F_U32("max_new_words", novelty.max_new_words, 0, 4096),
};

/* Applies the object `obj` (a detector's settings, named obj->string under `pre`): each
 * key is one of `fields`, or, for the repeat detector, one of its two nested settings.
 * Returns 0 or -1 with the key named in the error. */
static int apply_fields(guard_params *p, jctx *c, const char *pre, const cJSON *obj,
                        const jfield *fields, size_t n)
{
    char sub[192];
    if (jobject(c, pre, obj) < 0) return -1;
    subprefix(sub, sizeof(sub), pre, obj->string);
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        const char *k = it->string;
        size_t i;
        for (i = 0; i < n && strcmp(k, fields[i].key); i++)
            ;
        int rc = 0;
        double v = 0;
        if (i < n) {
            char *dst = (char *)p + fields[i].off;
            if (fields[i].kind == JF_BOOL) {
                rc = jbool(c, sub, it, (bool *)dst);
            } else {
                rc = jnum(c, sub, it, fields[i].lo, fields[i].hi, fields[i].kind == JF_U32, &v);
                if (fields[i].kind == JF_U32)
                    *(uint32_t *)dst = (uint32_t)v;
                else
                    *(double *)dst = v;
            }
        } else if (fields == repeat_fields && !strcmp(k, "repeats_by_period")) {
            rc = apply_steps(p, c, sub, it);
        } else if (fields == repeat_fields && !strcmp(k, "classes")) {
            rc = apply_classes(p, c, sub, it);
        } else {
            rc = jfail(c, sub, k, "unknown key");
        }
        if (rc < 0) return -1;
    }
    return 0;
}

#define APPLY(p, c, pre, it, f) apply_fields(p, c, pre, it, f, sizeof(f) / sizeof(f[0]))

/* "rules": [{"name", "pattern", "action": "trip"}] replaces the channel's rule list. */
static int apply_rules(guard_params *p, jctx *c, const char *pre, const cJSON *arr)
{
    char sub[192];
    subprefix(sub, sizeof(sub), pre, arr->string);
    if (!cJSON_IsArray(arr))
        return jfail(c, pre, arr->string, "expected an array of {name, pattern, action}");
    rules_free(p->rules, p->n_rules);
    p->rules = NULL;
    p->n_rules = 0;
    int i = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, arr)
    {
        char idx[224], msg[160];
        snprintf(idx, sizeof(idx), "%s[%d]", sub, i++);
        if (!cJSON_IsObject(r))
            return jfail(c, idx, NULL, "expected an object {name, pattern, action}");
        const char *name = NULL, *pattern = NULL;
        const cJSON *it;
        cJSON_ArrayForEach(it, r)
        {
            const char *k = it->string;
            if (!strcmp(k, "name") || !strcmp(k, "pattern")) {
                if (!cJSON_IsString(it) || !it->valuestring[0])
                    return jfail(c, idx, k, "expected a non-empty string");
                *(k[0] == 'n' ? &name : &pattern) = it->valuestring;
            } else if (!strcmp(k, "action")) {
                if (!cJSON_IsString(it) || strcmp(it->valuestring, "trip"))
                    return jfail(c, idx, k, "expected \"trip\"");
            } else
                return jfail(c, idx, k, "unknown key");
        }
        if (!name || !pattern) return jfail(c, idx, name ? "pattern" : "name", "missing");
        if (rule_add(p, name, pattern, msg, sizeof(msg)) < 0)
            return jfail(c, idx, "pattern", "%s", msg);
    }
    return 0;
}

static int apply_leaks(guard_params *p, jctx *c, const char *pre, const cJSON *arr)
{
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) > GUARD_MAX_LEAKS)
        return jfail(c, pre, arr->string, "expected an array of at most %d strings",
                     GUARD_MAX_LEAKS);
    size_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr)
    {
        if (!cJSON_IsString(it) || !it->valuestring[0] ||
            strlen(it->valuestring) > GUARD_MAX_LEAK_LEN)
            return jfail(c, pre, arr->string, "item %zu: expected a string of 1 to %d bytes", n,
                         GUARD_MAX_LEAK_LEN);
        p->leak_len[n] = strlen(it->valuestring);
        memcpy(p->leaks[n], it->valuestring, p->leak_len[n] + 1);
        n++;
    }
    p->n_leaks = n;
    return 0;
}

static int apply_top(guard_params *p, jctx *c, const char *pre, const cJSON *obj)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        const char *k = it->string;
        double v;
        int rc = 0;
        if (!strcmp(k, "enabled"))
            rc = jbool(c, pre, it, &p->enabled);
        else if (!strcmp(k, "repeat"))
            rc = APPLY(p, c, pre, it, repeat_fields);
        else if (!strcmp(k, "lines"))
            rc = APPLY(p, c, pre, it, lines_fields);
        else if (!strcmp(k, "novelty"))
            rc = APPLY(p, c, pre, it, novelty_fields);
        else if (!strcmp(k, "cycle"))
            rc = APPLY(p, c, pre, it, cycle_fields);
        else if (!strcmp(k, "rules"))
            rc = apply_rules(p, c, pre, it);
        else if (!strcmp(k, "rule_max_match_bytes"))
            JU32(c, pre, it, 1, GUARD_HISTORY / 2, p->rule_max_match_bytes);
        else if (!strcmp(k, "leak_tokens"))
            rc = apply_leaks(p, c, pre, it);
        else if (!strcmp(k, "budget_bytes")) {
            rc = jnum(c, pre, it, 0, 1e15, true, &v);
            p->budget_bytes = (uint64_t)v;
        } else if (!strcmp(k, "empty_answer_min_reasoning_bytes")) {
            rc = jnum(c, pre, it, 0, 1e15, true, &v);
            p->empty_answer_min_reasoning = (uint64_t)v;
        } else if (!strcmp(k, "holdback_max_bytes")) {
            rc = jnum(c, pre, it, 4, 1 << 30, true, &v);
            p->holdback_max = (size_t)v;
        } else
            return jfail(c, pre, k, "unknown key");
        if (rc < 0) return -1;
    }
    return 0;
}

int guard_params_apply_json(guard_params *p, const cJSON *obj, const char *prefix, char *err,
                            size_t errlen)
{
    jctx c = {err, errlen};
    const char *pre = prefix ? prefix : "guard";
    if (!cJSON_IsObject(obj)) return jfail(&c, pre, NULL, "expected an object");
    /* Work on a copy so that a failed apply leaves `p` as it was. */
    guard_params *tmp = guard_params_clone(p);
    if (apply_top(tmp, &c, pre, obj) < 0) {
        guard_params_free(tmp);
        return -1;
    }
    derive(tmp);
    guard_rule *old = p->rules;
    size_t n_old = p->n_rules;
    *p = *tmp;
    tmp->rules = old;
    tmp->n_rules = n_old;
    guard_params_free(tmp);
    return 0;
}
