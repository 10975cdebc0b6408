/* think.c — the <think>…</think> splitter (see think.h for the rules).
 *
 * The splitter is a small state machine over bytes. Held bytes are never stored when they
 * can be recomputed: a partial "</think>" is always a prefix of that constant, so only its
 * length is kept. Only the leading whitespace before a possible "<think>" is copied (at
 * most THINK_MAX_LEAD bytes, which also bounds how long a whitespace-only generation can
 * stay hidden from the guard). */
#include "proxy/think.h"

#include <stdlib.h>
#include <string.h>

#include "proxy/xalloc.h"

static const char open_tag[] = "<think>";
static const char close_tag[] = "</think>";
#define OPEN_LEN  (sizeof(open_tag) - 1)
#define CLOSE_LEN (sizeof(close_tag) - 1)

typedef enum {
    TS_LEAD,    /* at the start: whitespace and maybe a partial "<think>" held */
    TS_INSIDE,  /* reasoning until "</think>" */
    TS_TRIM,    /* just after "</think>": dropping whitespace */
    TS_CONTENT, /* everything is content */
} think_state;

struct think_split {
    think_state st;
    bool starts_inside; /* where TS_LEAD falls back to when no "<think>" comes */
    bool closed;
    size_t m; /* bytes of open_tag (TS_LEAD) or close_tag (TS_INSIDE) matched and held */
    size_t ws_len;
    char ws[THINK_MAX_LEAD];
};

think_split *think_new(bool starts_inside)
{
    think_split *t = lg_xcalloc(1, sizeof(*t));
    t->st = TS_LEAD;
    t->starts_inside = starts_inside;
    return t;
}

void think_free(think_split *t)
{
    free(t);
}

bool think_inside(const think_split *t)
{
    return t->st == TS_INSIDE || (t->st == TS_LEAD && t->starts_inside);
}

bool think_closed(const think_split *t)
{
    return t->closed;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* No opening tag at the start: the held whitespace goes to the fallback side, the state
 * becomes the fallback, and the partially matched tag bytes are fed again in that state
 * (in reasoning, "<" may begin "</think>"). */
static void lead_fallback(think_split *t, lg_buf *r, lg_buf *c)
{
    size_t m = t->m;
    t->m = 0;
    t->st = t->starts_inside ? TS_INSIDE : TS_CONTENT;
    lg_buf_append(t->starts_inside ? r : c, t->ws, t->ws_len);
    t->ws_len = 0;
    think_feed(t, open_tag, m, r, c);
}

/* TS_LEAD on in[0..len): returns how many bytes it consumed before leaving the state. */
static size_t feed_lead(think_split *t, const char *in, size_t len, lg_buf *r, lg_buf *c)
{
    size_t i = 0;
    while (i < len && t->st == TS_LEAD) {
        char ch = in[i];
        if (t->m == 0 && is_ws(ch) && t->ws_len < THINK_MAX_LEAD) {
            t->ws[t->ws_len++] = ch;
            i++;
        } else if (ch == open_tag[t->m]) {
            i++;
            if (++t->m == OPEN_LEN) {
                t->m = t->ws_len = 0; /* whitespace before the tag is dropped */
                t->st = TS_INSIDE;
            }
        } else {
            lead_fallback(t, r, c);
        }
    }
    return i;
}

/* TS_INSIDE on in[0..len): reasoning until the first "</think>". Returns bytes consumed.
 * '<' occurs only at the head of "</think>", so a mismatch after a partial match never
 * hides the start of another match: the held prefix goes out and the byte is retried. */
static size_t feed_inside(think_split *t, const char *in, size_t len, lg_buf *r)
{
    size_t i = 0;
    while (i < len) {
        if (t->m == 0) {
            const char *lt = memchr(in + i, '<', len - i);
            size_t to = lt ? (size_t)(lt - in) : len;
            lg_buf_append(r, in + i, to - i);
            if (!lt) return len;
            t->m = 1;
            i = to + 1;
        } else if (in[i] == close_tag[t->m]) {
            i++;
            if (++t->m == CLOSE_LEN) {
                t->m = 0;
                t->closed = true;
                t->st = TS_TRIM;
                return i;
            }
        } else {
            lg_buf_append(r, close_tag, t->m);
            t->m = 0;
        }
    }
    return i;
}

void think_feed(think_split *t, const char *in, size_t len, lg_buf *r, lg_buf *c)
{
    size_t i = 0;
    while (i < len) {
        switch (t->st) {
        case TS_LEAD:
            i += feed_lead(t, in + i, len - i, r, c);
            break;
        case TS_INSIDE:
            i += feed_inside(t, in + i, len - i, r);
            break;
        case TS_TRIM:
            while (i < len && is_ws(in[i]))
                i++;
            if (i < len) t->st = TS_CONTENT;
            break;
        case TS_CONTENT:
            lg_buf_append(c, in + i, len - i);
            i = len;
            break;
        }
    }
}

void think_finish(think_split *t, lg_buf *r, lg_buf *c)
{
    if (t->st == TS_LEAD) {
        lg_buf *side = t->starts_inside ? r : c;
        lg_buf_append(side, t->ws, t->ws_len);
        lg_buf_append(side, open_tag, t->m);
    } else if (t->st == TS_INSIDE) {
        lg_buf_append(r, close_tag, t->m);
    }
    t->m = t->ws_len = 0;
}

bool think_split_whole(const char *text, size_t len, lg_buf *r, lg_buf *c)
{
    bool inside = memmem(text, len, close_tag, CLOSE_LEN) != NULL;
    think_split *t = think_new(inside);
    size_t r0 = r->len;
    think_feed(t, text, len, r, c);
    think_finish(t, r, c);
    bool found = t->closed || r->len > r0 || (t->st == TS_INSIDE);
    think_free(t);
    return found;
}
