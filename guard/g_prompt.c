/* g_prompt.c — prompt-aware slack: what the request's prompt allows a generation to repeat.
 *
 * The guard judges every unit strictly unless the prompt gives it a reason not to, and the
 * slack a reason earns is bounded by what the prompt holds:
 *   asked — the largest count of copies the prompt asks for: a number (digits, or a word up
 *           to "hundred") before a word that counts copies ("50 times", "20 rows", "100
 *           lines"), a grid ("10x10", "9 by 9", "3×3": rows × columns cells), or any number
 *           in a prompt that says "repeat"; and a number before any other word ("a list
 *           of 100 None") for the units that hold that word. Capped at
 *           GUARD_PROMPT_ASK_MAX.
 *   holds — how many times the prompt itself contains the unit: a table to reformat, a file
 *           to rewrite, lyrics to copy. The output may hold as many copies, plus one (the
 *           unit a detector sees is a rotation of the one in the prompt).
 * A detector asks guard_prompt_slack(unit) once, when a unit is about to trip, and lets it
 * repeat up to that many copies. Cost: O(prompt) at guard_set_prompt; O(prompt) per question
 * (memmem over at most GUARD_PROMPT_MAX bytes), asked only at a unit's threshold. Memory: the
 * prompt's bytes (at most GUARD_PROMPT_MAX), only when one is set. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "guard/guard_int.h"

#define GUARD_PROMPT_MAX     32768 /* bytes of prompt a guard keeps: the last ones */
#define GUARD_PROMPT_ASK_MAX 10000 /* copies a prompt can ask for */

static bool is_alpha(unsigned char c)
{
    return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
}

static bool is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* The value of a number word ("ten", "fifty", "hundred"), or 0. Every word of a prompt
 * asks: a word is compared only with the number words of its length and first letter. */
static uint32_t number_word(const char *w, size_t n)
{
    static const struct {
        const char *w;
        size_t n;
        uint32_t v;
    } words[] = {
        {"one", 3, 1},        {"two", 3, 2},       {"three", 5, 3},     {"four", 4, 4},
        {"five", 4, 5},       {"six", 3, 6},       {"seven", 5, 7},     {"eight", 5, 8},
        {"nine", 4, 9},       {"ten", 3, 10},      {"eleven", 6, 11},   {"twelve", 6, 12},
        {"thirteen", 8, 13},  {"fourteen", 8, 14}, {"fifteen", 7, 15},  {"sixteen", 7, 16},
        {"seventeen", 9, 17}, {"eighteen", 8, 18}, {"nineteen", 8, 19}, {"twenty", 6, 20},
        {"thirty", 6, 30},    {"forty", 5, 40},    {"fifty", 5, 50},    {"sixty", 5, 60},
        {"seventy", 7, 70},   {"eighty", 6, 80},   {"ninety", 6, 90},   {"hundred", 7, 100}};
    if (n < 3 || n > 9) return 0;
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (words[i].n == n && words[i].w[0] == w[0] && !memcmp(w, words[i].w, n))
            return words[i].v;
    return 0;
}

/* Words that count copies after a number. */
static bool count_word(const char *w, size_t n)
{
    static const char *const cues[] = {"times", "rows",    "lines",       "copies",     "columns",
                                       "cells", "repeats", "repetitions", "iterations", "cols"};
    for (size_t i = 0; i < sizeof(cues) / sizeof(cues[0]); i++)
        if (strlen(cues[i]) == n && !strncmp(w, cues[i], n)) return true;
    return false;
}

/* One token of the prompt: a number (value) or a lower-cased word, or the grid sign. */
typedef struct ptok {
    enum { PT_NONE, PT_NUM, PT_WORD, PT_TIMES } kind;
    uint32_t value;
    char w[16];
    size_t n;
} ptok;

/* The next token of s[*i..len): numbers, words (≤ 15 letters kept), and "x"/"×"/"by" as the
 * grid sign; everything else separates. */
static ptok next_token(const char *s, size_t len, size_t *i)
{
    ptok t = {PT_NONE, 0, "", 0};
    while (*i < len) {
        unsigned char c = (unsigned char)s[*i];
        if (is_digit(c)) {
            uint64_t v = 0;
            while (*i < len && is_digit((unsigned char)s[*i])) {
                if (v < 1000000) v = v * 10 + (uint64_t)(s[*i] - '0');
                (*i)++;
            }
            t.kind = PT_NUM;
            t.value = (uint32_t)v;
            return t;
        }
        if (c == 0xC3 && *i + 1 < len && (unsigned char)s[*i + 1] == 0x97) { /* × */
            *i += 2;
            t.kind = PT_TIMES;
            return t;
        }
        if (is_alpha(c)) {
            size_t a = *i;
            while (*i < len && is_alpha((unsigned char)s[*i]))
                (*i)++;
            t.n = *i - a;
            for (size_t k = 0; k < t.n && k < sizeof(t.w) - 1; k++)
                t.w[k] = (char)(s[a + k] | 0x20);
            if (t.n >= sizeof(t.w)) t.n = sizeof(t.w) - 1;
            t.w[t.n] = 0;
            if ((t.n == 1 && t.w[0] == 'x') || (t.n == 2 && !strcmp(t.w, "by"))) {
                t.kind = PT_TIMES;
                return t;
            }
            uint32_t v = number_word(t.w, t.n);
            t.kind = v ? PT_NUM : PT_WORD;
            t.value = v;
            return t;
        }
        (*i)++;
    }
    return t;
}

/* The largest count of copies the text asks for (see the top of this file), or 0; records
 * the "number word" pairs and the largest number (prompt_number) in g. O(len). */
static uint32_t asked_count(guard *g, const char *s, size_t len)
{
    bool repeat = false;
    uint32_t best = 0, any = 0;
    ptok a = {PT_NONE, 0, "", 0}, b = a, c;
    size_t i = 0;
    do {
        c = next_token(s, len, &i);
        if (c.kind == PT_WORD && c.n >= 6 && !strncmp(c.w, "repeat", 6)) repeat = true;
        if (c.kind == PT_NUM && c.value > any) any = c.value;
        /* a grid: N x M, N by M, N×M */
        if (a.kind == PT_NUM && b.kind == PT_TIMES && c.kind == PT_NUM) {
            uint64_t cells = (uint64_t)a.value * c.value;
            if (cells > best)
                best = cells > GUARD_PROMPT_ASK_MAX ? GUARD_PROMPT_ASK_MAX : (uint32_t)cells;
        }
        if (b.kind == PT_NUM && c.kind == PT_WORD && count_word(c.w, c.n) && b.value > best)
            best = b.value;
        else if (b.kind == PT_NUM && b.value >= 2 && c.kind == PT_WORD && c.n >= 2 &&
                 g->prompt_nof < GUARD_PROMPT_COUNTS) {
            if (!g->prompt_of)
                g->prompt_of = guard_xcalloc(GUARD_PROMPT_COUNTS, sizeof(*g->prompt_of));
            g->prompt_of[g->prompt_nof].n =
                b.value > GUARD_PROMPT_ASK_MAX ? GUARD_PROMPT_ASK_MAX : b.value;
            memcpy(g->prompt_of[g->prompt_nof++].w, c.w, c.n + 1);
        }
        a = b;
        b = c;
    } while (c.kind != PT_NONE);
    if (any > g->prompt_number) g->prompt_number = any;
    if (repeat && any > best) best = any;
    return best > GUARD_PROMPT_ASK_MAX ? GUARD_PROMPT_ASK_MAX : best;
}

void guard_set_prompt(guard *g, const char *text, size_t len)
{
    if (!len) return;
    size_t sep = g->prompt_len ? 1 : 0;
    size_t total = g->prompt_len + sep + len;
    if (total > GUARD_PROMPT_MAX) { /* keep the last GUARD_PROMPT_MAX bytes */
        size_t drop = total - GUARD_PROMPT_MAX;
        if (drop >= g->prompt_len + sep) {
            text += drop - g->prompt_len - sep;
            len -= drop - g->prompt_len - sep;
            g->prompt_len = 0;
            sep = 0;
        } else {
            memmove(g->prompt, g->prompt + drop, g->prompt_len - drop);
            g->prompt_len -= drop;
        }
    }
    if (g->prompt_len + sep + len > g->prompt_cap) { /* as much as it holds, no more */
        size_t cap = g->prompt_len + sep + len;
        char *p = realloc(g->prompt, cap);
        if (!p) abort();
        g->prompt = p;
        g->prompt_cap = cap;
    }
    if (sep) g->prompt[g->prompt_len++] = '\n';
    memcpy(g->prompt + g->prompt_len, text, len);
    g->prompt_len += len;
    uint32_t asked = asked_count(g, text, len);
    if (asked > g->prompt_asked) g->prompt_asked = asked;
}

/* Adds a string, or the strings of an array (and the "text" of its objects). */
static void add_text(guard *g, const cJSON *it)
{
    if (cJSON_IsString(it)) {
        guard_set_prompt(g, it->valuestring, strlen(it->valuestring));
        return;
    }
    if (!cJSON_IsArray(it)) return;
    const cJSON *part;
    cJSON_ArrayForEach(part, it)
    {
        if (cJSON_IsString(part))
            guard_set_prompt(g, part->valuestring, strlen(part->valuestring));
        else
            add_text(g, cJSON_GetObjectItemCaseSensitive(part, "text"));
        if (cJSON_IsObject(part)) add_text(g, cJSON_GetObjectItemCaseSensitive(part, "content"));
    }
}

void guard_set_prompt_json(guard *g, const cJSON *obj)
{
    /* The members read, in this order; each the first of its name, as cJSON's look-up finds
     * it, but found in one walk over obj's members that compares a name only with the keys
     * of its first byte (a look-up per key compared every member's name with it). */
    enum { MESSAGES = 5, NKEYS };
    static const char *const keys[NKEYS] = {"instruction",  "prompt", "system",
                                            "instructions", "input",  "messages"};
    const cJSON *found[NKEYS] = {0};
    if (!cJSON_IsObject(obj)) return;
    for (const cJSON *m = obj->child; m && m->string; m = m->next) /* a nameless one stops it */
        for (size_t i = 0; i < NKEYS; i++)
            if (!found[i] && m->string[0] == keys[i][0] && strcmp(m->string, keys[i]) == 0) {
                found[i] = m;
                break;
            }
    for (size_t i = 0; i < MESSAGES; i++)
        add_text(g, found[i]);
    const cJSON *msg, *msgs = found[MESSAGES];
    if (!cJSON_IsArray(msgs)) return;
    cJSON_ArrayForEach(msg, msgs)
    {
        add_text(g, cJSON_GetObjectItemCaseSensitive(msg, "content"));
    }
}

uint32_t guard_prompt_slack(const guard *g, const unsigned char *u, size_t n)
{
    if (!g->prompt_len || !n) return 0;
    uint32_t holds = 0;
    const char *p = g->prompt, *end = g->prompt + g->prompt_len;
    while (holds < GUARD_PROMPT_ASK_MAX && (size_t)(end - p) >= n) {
        const char *hit = memmem(p, (size_t)(end - p), u, n);
        if (!hit) break;
        holds++;
        p = hit + n;
    }
    uint32_t slack = holds ? holds + 1 : 0;
    if (g->prompt_asked > slack) slack = g->prompt_asked;
    if (g->prompt_nof) { /* "100 None": is the unit mostly the word? */
        char low[256];
        size_t k = n < sizeof(low) - 1 ? n : sizeof(low) - 1, letters = 0;
        for (size_t i = 0; i < k; i++) {
            low[i] = (char)(u[i] >= 'A' && u[i] <= 'Z' ? u[i] | 0x20 : u[i]);
            letters += is_alpha(u[i]);
        }
        low[k] = 0;
        /* The unit is the word with a little around it ("None, ", "- apple\n"): "18 Color"
         * in a product name asks for no 18 copies of a table row that mentions it. */
        for (unsigned i = 0; i < g->prompt_nof; i++)
            if (g->prompt_of[i].n > slack && letters <= 3 * strlen(g->prompt_of[i].w) &&
                strstr(low, g->prompt_of[i].w))
                slack = g->prompt_of[i].n;
    }
    return slack;
}

void guard_prompt_release(guard *g)
{
    free(g->prompt);
    free(g->prompt_of);
}
