/* jsonguard.c — see jsonguard.h.
 *
 * An iterative recursive-descent validator: an explicit stack of open containers (at most
 * max_depth), and one open-addressing hash set of (object serial, unescaped key) for the
 * duplicate check, whose key bytes live in one growing arena. */
#include "proxy/jsonguard.h"

#include "proxy/buf.h"
#include "proxy/xalloc.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A key's bytes: at `off` in the body when it holds no escape (most keys), else its
 * unescaped bytes at off & ~IN_ARENA in the arena. */
#define IN_ARENA ((size_t)1 << (sizeof(size_t) * 8 - 1))

typedef struct key_slot {
    uint64_t hash;   /* 0: empty */
    size_t obj;      /* serial of the object the key belongs to */
    size_t off, len; /* the unescaped key (IN_ARENA) */
} key_slot;

typedef struct jg {
    const char *s;
    size_t n, i;
    const jg_limits *lim;
    size_t nodes, objects;
    key_slot *slots; /* `first` until the keys outgrow it, then owned (heap) */
    size_t cap, used;
    key_slot first[32]; /* an ordinary request's keys fit: no allocation for them */
    lg_buf arena;       /* the unescaped keys that hold an escape, one after another */
    char *err;
    size_t errlen;
} jg;

static int fail(jg *g, const char *what)
{
    snprintf(g->err, g->errlen, "invalid JSON body at byte %zu: %s", g->i, what);
    return -1;
}

static inline void skip_ws(jg *g)
{
    while (g->i < g->n && (unsigned char)g->s[g->i] <= ' ' &&
           (g->s[g->i] == ' ' || g->s[g->i] == '\t' || g->s[g->i] == '\n' || g->s[g->i] == '\r'))
        g->i++;
}

/* The end of the run of plain string bytes (no control byte, '"' or '\\') from i: eight
 * bytes at a time, then one by one. */
static size_t plain_end(const char *s, size_t i, size_t n)
{
    while (n - i >= 8 && !jg_special8(s + i))
        i += 8;
    while (i < n && s[i] != '"' && s[i] != '\\' && (unsigned char)s[i] >= 0x20)
        i++;
    return i;
}

static int hex4(jg *g, uint32_t *out)
{
    if (g->n - g->i < 4) return fail(g, "short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        char c = g->s[g->i++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return fail(g, "bad \\u escape");
    }
    *out = v;
    return 0;
}

/* Parses a string at g->i (on the opening quote). With `keep`, its unescaped bytes are
 * appended to the arena. */
static int parse_string(jg *g, bool keep)
{
    g->i++;
    for (;;) {
        size_t b = g->i;
        g->i = plain_end(g->s, g->i, g->n);
        if (keep) lg_buf_append(&g->arena, g->s + b, g->i - b);
        if (g->i >= g->n) return fail(g, "unterminated string");
        char c = g->s[g->i];
        if (c == '"') {
            g->i++;
            return 0;
        }
        if (c != '\\') return fail(g, "control character in a string");
        g->i++;
        if (g->i >= g->n) return fail(g, "unterminated string");
        char e = g->s[g->i++];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            if (keep) lg_buf_append(&g->arena, &map[simple - "\"\\/bfnrt"], 1);
            continue;
        }
        if (e != 'u') return fail(g, "bad escape in a string");
        uint32_t cp;
        if (hex4(g, &cp)) return -1;
        if (cp >= 0xdc00 && cp <= 0xdfff) return fail(g, "lone low surrogate");
        if (cp >= 0xd800 && cp <= 0xdbff) {
            uint32_t lo;
            if (g->n - g->i < 2 || g->s[g->i] != '\\' || g->s[g->i + 1] != 'u')
                return fail(g, "lone high surrogate");
            g->i += 2;
            if (hex4(g, &lo)) return -1;
            if (lo < 0xdc00 || lo > 0xdfff) return fail(g, "bad surrogate pair");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (cp == 0) return fail(g, "\\u0000 in a string");
        if (keep) lg_buf_append_utf8(&g->arena, cp);
    }
}

static int parse_number(jg *g)
{
    const char *s = g->s;
    size_t n = g->n;
    if (g->i < n && s[g->i] == '-') g->i++;
    if (g->i >= n || s[g->i] < '0' || s[g->i] > '9') return fail(g, "bad number");
    if (s[g->i] == '0')
        g->i++;
    else
        while (g->i < n && s[g->i] >= '0' && s[g->i] <= '9')
            g->i++;
    if (g->i < n && s[g->i] == '.') {
        g->i++;
        if (g->i >= n || s[g->i] < '0' || s[g->i] > '9') return fail(g, "bad number");
        while (g->i < n && s[g->i] >= '0' && s[g->i] <= '9')
            g->i++;
    }
    if (g->i < n && (s[g->i] == 'e' || s[g->i] == 'E')) {
        g->i++;
        if (g->i < n && (s[g->i] == '+' || s[g->i] == '-')) g->i++;
        if (g->i >= n || s[g->i] < '0' || s[g->i] > '9') return fail(g, "bad number");
        while (g->i < n && s[g->i] >= '0' && s[g->i] <= '9')
            g->i++;
    }
    return 0;
}

static uint64_t hash_key(size_t obj, const char *p, size_t k)
{
    uint64_t h = 1469598103934665603ull ^ (obj * 0x9e3779b97f4a7c15ull);
    for (size_t i = 0; i < k; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    /* murmur3's finaliser spreads FNV's weak low bits over the table index */
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h ? h : 1; /* never 0: 0 marks an empty slot */
}

static void slots_grow(jg *g)
{
    size_t cap = g->cap * 2;
    key_slot *s = lg_xcalloc(cap, sizeof *s);
    for (size_t i = 0; i < g->cap; i++) {
        if (!g->slots[i].hash) continue;
        size_t j = g->slots[i].hash & (cap - 1);
        while (s[j].hash)
            j = (j + 1) & (cap - 1);
        s[j] = g->slots[i];
    }
    if (g->slots != g->first) lg_xfree(g->slots);
    g->slots = s;
    g->cap = cap;
}

static const char *key_bytes(const jg *g, size_t off)
{
    return off & IN_ARENA ? g->arena.p + (off & ~IN_ARENA) : g->s + off;
}

/* Records the key of `len` bytes at `off` (key_slot) of object `obj`. Returns -1 when that
 * object already has it. */
static int key_add(jg *g, size_t obj, size_t off, size_t len)
{
    const char *k = key_bytes(g, off);
    if ((g->used + 1) * 2 > g->cap) slots_grow(g);
    uint64_t h = hash_key(obj, k, len);
    size_t j = h & (g->cap - 1);
    for (; g->slots[j].hash; j = (j + 1) & (g->cap - 1)) {
        key_slot *s = &g->slots[j];
        if (s->hash == h && s->obj == obj && s->len == len &&
            memcmp(key_bytes(g, s->off), k, len) == 0)
            return -1;
    }
    g->slots[j] = (key_slot){.hash = h, .obj = obj, .off = off, .len = len};
    g->used++;
    return 0;
}

typedef struct frame {
    size_t obj; /* object serial; SIZE_MAX for an array */
} frame;

/* Counts one more value; a container opens nesting level `depth`. */
static int count_value(jg *g, bool container, size_t depth)
{
    if (++g->nodes > g->lim->max_nodes) {
        snprintf(g->err, g->errlen, "JSON body has more than %zu values (limits.max_json_nodes)",
                 g->lim->max_nodes);
        return -1;
    }
    if (container && depth > g->lim->max_depth) {
        snprintf(g->err, g->errlen, "JSON body nests deeper than %u (limits.max_json_depth)",
                 g->lim->max_depth);
        return -1;
    }
    return 0;
}

/* Parses an object key and its colon at g->i, inside object `obj`. */
static int parse_key(jg *g, size_t obj)
{
    skip_ws(g);
    if (g->i >= g->n || g->s[g->i] != '"') return fail(g, "expected a string key");
    size_t at = g->i, off = at + 1, end = plain_end(g->s, off, g->n), len = end - off;
    if (end < g->n && g->s[end] == '"') {
        g->i = end + 1; /* no escape: the key is the body's bytes */
    } else {
        off = g->arena.len;
        if (parse_string(g, true)) return -1;
        len = g->arena.len - off;
        off |= IN_ARENA;
    }
    if (key_add(g, obj, off, len)) {
        snprintf(g->err, g->errlen, "duplicate key \"%.*s\" in a JSON object at byte %zu",
                 (int)(len > 64 ? 64 : len), key_bytes(g, off), at);
        return -1;
    }
    skip_ws(g);
    if (g->i >= g->n || g->s[g->i] != ':') return fail(g, "expected ':'");
    g->i++;
    return 0;
}

static int run(jg *g, frame *stack)
{
    size_t depth = 0;
    for (;;) {
        /* A value is expected at g->i. */
        skip_ws(g);
        if (g->i >= g->n) return fail(g, "expected a value");
        char c = g->s[g->i];
        if (count_value(g, c == '{' || c == '[', depth + 1)) return -1;
        if (c == '{' || c == '[') {
            g->i++;
            stack[depth++].obj = c == '{' ? g->objects++ : SIZE_MAX;
            skip_ws(g);
            if (g->i < g->n && g->s[g->i] == (c == '{' ? '}' : ']')) {
                g->i++;
                depth--;
            } else {
                if (c == '{' && parse_key(g, stack[depth - 1].obj)) return -1;
                continue;
            }
        } else if (c == '"') {
            if (parse_string(g, false)) return -1;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (parse_number(g)) return -1;
        } else {
            static const char *const lit[] = {"true", "false", "null"};
            size_t k = 0;
            while (k < 3 && !(g->n - g->i >= strlen(lit[k]) &&
                              memcmp(g->s + g->i, lit[k], strlen(lit[k])) == 0))
                k++;
            if (k == 3) return fail(g, "unexpected character");
            g->i += strlen(lit[k]);
        }
        /* After a value: close containers or move to the next member. */
        for (;;) {
            skip_ws(g);
            if (depth == 0) {
                if (g->i != g->n) return fail(g, "trailing bytes after the JSON value");
                return 0;
            }
            bool obj = stack[depth - 1].obj != SIZE_MAX;
            if (g->i >= g->n) return fail(g, "unexpected end of body");
            char d = g->s[g->i];
            if (d == ',') {
                g->i++;
                if (obj && parse_key(g, stack[depth - 1].obj)) return -1;
                break;
            }
            if (d != (obj ? '}' : ']'))
                return fail(g, obj ? "expected ',' or '}'" : "expected ',' or ']'");
            g->i++;
            depth--;
        }
    }
}

int jsonguard_check(const char *s, size_t n, const jg_limits *lim, char *err, size_t errlen)
{
    jg g = {.s = s, .n = n, .lim = lim, .arena = LG_BUF_INIT, .err = err, .errlen = errlen};
    g.slots = g.first;
    g.cap = sizeof g.first / sizeof g.first[0];
    frame *stack = lg_xmalloc(((size_t)lim->max_depth + 1) * sizeof *stack);
    int rc = run(&g, stack);
    lg_xfree(stack);
    if (g.slots != g.first) lg_xfree(g.slots);
    lg_buf_free(&g.arena);
    return rc;
}
