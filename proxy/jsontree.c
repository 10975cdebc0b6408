/* jsontree.c — see jsontree.h.
 *
 * A scan counts the values a text can hold (one, plus one per '[', '{' and ',' outside its
 * strings: exact for a text without empty containers) and its strings' bytes cannot pass its
 * length (a string's unescaped bytes and NUL are fewer than its quoted ones); one block of
 * that size is allocated, and a recursive-descent parser writes the values into it, the
 * strings after them. */
#include "proxy/jsontree.h"

#include <ctype.h>
#include <limits.h>
#include <locale.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/jsonguard.h"
#include "proxy/xalloc.h"

typedef struct jt {
    const char *s;
    size_t n, i;
    cJSON *next, *end; /* the block's free values */
    char *text;        /* its next free string byte */
} jt;

static inline void ws(jt *t)
{
    while (t->i < t->n && (unsigned char)t->s[t->i] <= ' ' &&
           (t->s[t->i] == ' ' || t->s[t->i] == '\t' || t->s[t->i] == '\n' || t->s[t->i] == '\r'))
        t->i++;
}

/* A zeroed value from the block, or NULL when the scan's count is used up (a text the
 * parser then refuses anyway). */
static cJSON *new_value(jt *t)
{
    if (t->next == t->end) return NULL;
    cJSON *v = t->next++;
    memset(v, 0, sizeof *v);
    return v;
}

/* The code unit of the four hex digits at p (bounds checked by the caller), or -1. */
static long hex4(const char *p)
{
    char d[5] = {p[0], p[1], p[2], p[3], '\0'};
    for (int k = 0; k < 4; k++)
        if (!isxdigit((unsigned char)d[k])) return -1;
    return strtol(d, NULL, 16);
}

/* cJSON's UTF-8 for a code point (utf16_literal_to_utf8). */
static char *put_utf8(char *w, unsigned long cp)
{
    if (cp < 0x80) {
        *w++ = (char)cp;
    } else if (cp < 0x800) {
        *w++ = (char)(0xC0 | cp >> 6);
        *w++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        *w++ = (char)(0xE0 | cp >> 12);
        *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *w++ = (char)(0x80 | (cp & 0x3F));
    } else {
        *w++ = (char)(0xF0 | cp >> 18);
        *w++ = (char)(0x80 | (cp >> 12 & 0x3F));
        *w++ = (char)(0x80 | (cp >> 6 & 0x3F));
        *w++ = (char)(0x80 | (cp & 0x3F));
    }
    return w;
}

/* The string at t->i (its quote): its unescaped bytes, NUL-terminated, to the block and
 * *out. */
static bool string(jt *t, char **out)
{
    const char *s = t->s;
    size_t i = t->i + 1, n = t->n;
    char *w = t->text;
    *out = w;
    for (;;) {
        for (; n - i >= 8 && !jg_special8(s + i); i += 8, w += 8)
            memcpy(w, s + i, 8);
        while (i < n && s[i] != '"' && s[i] != '\\' && (unsigned char)s[i] >= 0x20)
            *w++ = s[i++];
        if (i >= n || (unsigned char)s[i] < 0x20) return false;
        if (s[i] == '"') break;
        if (n - i < 2) return false;
        char e = s[i + 1];
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *k = e ? strchr(from, e) : NULL;
        if (k) {
            *w++ = to[k - from];
            i += 2;
            continue;
        }
        if (e != 'u' || n - i < 6) return false;
        long cp = hex4(s + i + 2);
        i += 6;
        if (cp <= 0 || (cp >= 0xDC00 && cp <= 0xDFFF)) return false; /* \u0000, lone low */
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (n - i < 6 || s[i] != '\\' || s[i + 1] != 'u') return false;
            long lo = hex4(s + i + 2);
            if (lo < 0xDC00 || lo > 0xDFFF) return false;
            i += 6;
            cp = 0x10000 + ((cp & 0x3FF) << 10 | (lo & 0x3FF));
        }
        w = put_utf8(w, (unsigned long)cp);
    }
    *w++ = '\0';
    t->text = w;
    t->i = i + 1;
    return true;
}

/* An RFC 8259 number at t->i, read as cJSON reads it: strtod over its bytes with '.' as
 * the locale's decimal point; valueint saturated. An integer of at most 15 digits is exact
 * in a double, and strtod's correctly rounded result is that value: it is converted
 * directly. */
static bool number(jt *t, cJSON *v)
{
    const char *s = t->s;
    size_t b = t->i, i = b, n = t->n;
    bool neg = i < n && s[i] == '-', plain = true;
    uint64_t whole = 0;
    i += neg;
    if (i >= n || s[i] < '0' || s[i] > '9') return false;
    if (s[i] == '0')
        i++;
    else
        while (i < n && s[i] >= '0' && s[i] <= '9')
            whole = whole * 10 + (uint64_t)(s[i++] - '0'); /* wraps past 19 digits: unused */
    if (i < n && s[i] == '.') {
        plain = false;
        if (++i >= n || s[i] < '0' || s[i] > '9') return false;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        plain = false;
        if (++i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || s[i] < '0' || s[i] > '9') return false;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    size_t len = i - b;
    double d;
    if (plain && len - neg <= 15) {
        d = neg ? -(double)whole : (double)whole;
    } else {
        char buf[64], *end, *point;
        if (len >= sizeof buf) return false;
        memcpy(buf, s + b, len);
        buf[len] = '\0';
        if ((point = strchr(buf, '.'))) *point = *localeconv()->decimal_point;
        d = strtod(buf, &end);
        if (end != buf + len) return false;
    }
    t->i = i;
    v->type = cJSON_Number;
    v->valuedouble = d;
    v->valueint = d >= INT_MAX ? INT_MAX : d <= (double)INT_MIN ? INT_MIN : (int)d;
    return true;
}

static bool word(jt *t, const char *w, size_t k)
{
    if (t->n - t->i < k || memcmp(t->s + t->i, w, k) != 0) return false;
    t->i += k;
    return true;
}

static bool value(jt *t, cJSON *v, unsigned depth);

/* The members (object) or elements of the container at t->i, linked as cJSON links them. */
static bool container(jt *t, cJSON *v, unsigned depth)
{
    bool object = t->s[t->i] == '{';
    char close = object ? '}' : ']';
    v->type = object ? cJSON_Object : cJSON_Array;
    if (depth >= JT_MAX_DEPTH) return false;
    t->i++;
    ws(t);
    if (t->i < t->n && t->s[t->i] == close) {
        t->i++;
        return true;
    }
    cJSON *last = NULL;
    for (;;) {
        cJSON *c = new_value(t);
        if (!c) return false;
        if (object) {
            ws(t);
            if (t->i >= t->n || t->s[t->i] != '"' || !string(t, &c->string)) return false;
            ws(t);
            if (t->i >= t->n || t->s[t->i] != ':') return false;
            t->i++;
        }
        if (!value(t, c, depth + 1)) return false;
        if (last) {
            last->next = c;
            c->prev = last;
        } else {
            v->child = c;
        }
        last = c;
        ws(t);
        if (t->i >= t->n) return false;
        if (t->s[t->i] == ',') {
            t->i++;
            continue;
        }
        if (t->s[t->i] != close) return false;
        t->i++;
        v->child->prev = last;
        return true;
    }
}

/* The value at t->i (whitespace first) into v. */
static bool value(jt *t, cJSON *v, unsigned depth)
{
    ws(t);
    if (t->i >= t->n) return false;
    switch (t->s[t->i]) {
    case '{':
    case '[':
        return container(t, v, depth);
    case '"':
        v->type = cJSON_String;
        return string(t, &v->valuestring);
    case 't':
        v->type = cJSON_True;
        v->valueint = 1;
        return word(t, "true", 4);
    case 'f':
        v->type = cJSON_False;
        return word(t, "false", 5);
    case 'n':
        v->type = cJSON_NULL;
        return word(t, "null", 4);
    default:
        return number(t, v);
    }
}

/* The values s[0..n) can hold (see the top of this file); for any text at least as many
 * as the parser takes from it. A string ends at the first '"' after it that an even run
 * of backslashes (none included) stands before: found by memchr, a prompt's text at once. */
static size_t count_values(const char *s, size_t n)
{
    static const unsigned char opens[256] = {[','] = 1, ['['] = 1, ['{'] = 1};
    size_t values = 1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '"') {
            values += opens[(unsigned char)s[i]];
            continue;
        }
        size_t from = i + 1;
        for (;;) {
            const char *q = memchr(s + from, '"', n - from);
            if (!q) return values; /* unterminated: the parser refuses it */
            size_t k = (size_t)(q - s), b = k;
            while (b > i + 1 && s[b - 1] == '\\')
                b--;
            from = k + 1;
            if ((k - b) % 2 == 0) break;
        }
        i = from - 1;
    }
    return values;
}

cJSON *jt_parse(const char *s, size_t n)
{
    size_t values = count_values(s, n);
    char *block = lg_xmalloc(values * sizeof(cJSON) + n);
    jt t = {.s = s, .n = n, .next = (cJSON *)(void *)block};
    t.end = t.next + values;
    t.text = (char *)t.end;
    cJSON *root = new_value(&t);
    if (value(&t, root, 0)) {
        ws(&t);
        if (t.i == n) return root;
    }
    lg_xfree(block);
    return NULL;
}
