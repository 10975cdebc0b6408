/* exchange_think.c — reasoning left inline in the answer text (exchange_int.h).
 *
 * A server without a reasoning parser (or llama.cpp --reasoning-format none) sends the
 * model's reasoning inside the answer text between <think> and </think>, whatever the API:
 * chat's content, an Anthropic text block, a Responses message item. The API modules hand
 * each event's answer text here; the think splitter (think.h) moves the reasoning to the
 * reasoning channel, where it is guarded as reasoning, and each module writes the two parts
 * in its API's own shape (reasoning fields, thinking blocks, reasoning items).
 *
 * When to split is decided once per attempt, at its first answer text (nothing of either
 * channel seen before): the text opens with <think> (a tag split across deltas included),
 * or the model's chat template opens it in the prompt (ex->think_opened), or — a whole
 * response, which the client sees only at the end — the text is read as reasoning until a
 * </think> proves it, and given back to the answer if none comes (ex_think_settle). */
#include <string.h>

#include "proxy/exchange_int.h"

/* How many bytes of s[0..n) after leading whitespace match "<think>" (0–7); *rest: the
 * bytes after the whitespace. */
static size_t open_tag_match(const char *s, size_t n, size_t *rest)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t'))
        i++;
    size_t k = 0;
    while (k < 7 && i + k < n && s[i + k] == "<think>"[k])
        k++;
    *rest = n - i;
    return k;
}

/* True when text starting with `s` could open a <think> block (whitespace, then a prefix of
 * the tag): a tag split across deltas is only recognised if we look now. */
static bool may_open_think(const char *s, size_t n)
{
    size_t rest, k = open_tag_match(s, n, &rest);
    return k == (rest < 7 ? rest : 7);
}

static bool starts_with_open_tag(const char *s, size_t n)
{
    size_t rest;
    return open_tag_match(s, n, &rest) == 7;
}

bool ex_think_split_run(exchange *ex, const char *reasoning, size_t rn, const char *text, size_t n,
                        bool final, lg_buf *r, lg_buf *c)
{
    if (!ex->at.think && ex_think_first_text(ex, rn, n)) {
        /* A whole response can be split in hindsight: read it as reasoning until a
         * </think> and, if none comes, give it back to the answer (ex_think_settle). */
        bool hindsight = !ex->req.client_stream && !ex->think_opened &&
                         (!ex->rule || ex->rule->think_opened != 0) && ex->req.enable_thinking != 0;
        if (ex->think_opened || hindsight || may_open_think(text, n)) {
            ex->at.think = think_new(ex->think_opened || hindsight);
            ex->think_inline = true;
            ex->at.think_hindsight = hindsight;
            ex->at.think_explicit = starts_with_open_tag(text, n);
        }
    }
    if (!ex->at.think) return false;
    *r = ex_text_borrow(ex, EX_TEXT_R), *c = ex_text_borrow(ex, EX_TEXT_C);
    if (rn) lg_buf_append(r, reasoning, rn);
    think_feed(ex->at.think, text, n, r, c);
    if (final) think_finish(ex->at.think, r, c);
    if (!think_inside(ex->at.think) && !think_closed(ex->at.think) && c->len) {
        /* decided: no <think> at the start; plain answer text from here on */
        think_free(ex->at.think);
        ex->at.think = NULL;
        ex->think_inline = false;
    }
    return true;
}

bool ex_think_settle(exchange *ex)
{
    if (!ex->at.think_hindsight) return false;
    ex->at.think_hindsight = false;
    if (!ex->at.think || think_closed(ex->at.think) || ex->at.think_explicit) return false;
    chan *r = &ex->at.ch[LG_CH_REASONING], *c = &ex->at.ch[LG_CH_CONTENT];
    lg_buf *rsent = &ex->cl.sent[LG_CH_REASONING];
    ex->at.fed |= 1u << LG_CH_CONTENT;
    lg_buf_append(&c->held, rsent->p, rsent->len);
    lg_buf_append(&c->held, r->held.p, r->held.len);
    c->attempt_bytes += r->attempt_bytes;
    r->attempt_bytes = 0;
    r->run.len = r->run.count = 0; /* a run is its channel's last bytes (token_run) */
    c->run.len = c->run.count = 0;
    lg_buf_reset(rsent);
    lg_buf_reset(&r->held);
    return true;
}

int ex_think_text(exchange *ex, const char *s, size_t n, bool final, ex_put_fn *put)
{
    lg_buf r, c;
    if (!ex_think_split(ex, NULL, 0, s, n, final, &r, &c)) return -1;
    bool tripped = ex_guard_text(ex, LG_CH_REASONING, r.p, r.len) ||
                   ex_guard_text(ex, LG_CH_CONTENT, c.p, c.len);
    if (r.len || c.len) ex->at.tokens++;
    ex_text_return(ex, EX_TEXT_R, &r);
    ex_text_return(ex, EX_TEXT_C, &c);
    if (tripped) return 1;
    /* Once the answer began, the reasoning is over: none of it can be a running loop. */
    const chan *hr = &ex->at.ch[LG_CH_REASONING], *hc = &ex->at.ch[LG_CH_CONTENT];
    bool reasoning_over = final || hc->attempt_bytes > 0;
    size_t nr = reasoning_over ? hr->held.len : ex_releasable(ex, LG_CH_REASONING);
    size_t nc = final ? hc->held.len : ex_releasable(ex, LG_CH_CONTENT);
    lg_buf b = ex_text_borrow(ex, EX_TEXT_C);
    ex_release(ex, LG_CH_REASONING, nr, &b);
    put(ex, LG_CH_REASONING, b.p, b.len);
    lg_buf_reset(&b);
    ex_release(ex, LG_CH_CONTENT, nc, &b);
    put(ex, LG_CH_CONTENT, b.p, b.len);
    ex_text_return(ex, EX_TEXT_C, &b);
    return 0;
}
