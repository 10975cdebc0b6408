/* api_chat.c — the first API module (api.h): OpenAI chat and text completions.
 *
 * The upstream speaks the same API as the client, in one of several dialects (dialect.h);
 * each chunk's reasoning, content and tool-call arguments go to the exchange's channels,
 * and the client gets the upstream's own bytes whenever nothing is held and nothing needs
 * reshaping (a clean stream reaches the client byte for byte), else chunks rebuilt from
 * the upstream's chunk as a template (dl_build_chunk) or from scratch. A server without a
 * reasoning parser leaves <think> inline in content: ex_think_split (exchange_think.c)
 * moves it to the reasoning channel. A whole response is assembled from what was released
 * (assemble.h). */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/exchange_int.h"
#include "proxy/xalloc.h"

/* A rebuilt chunk of the stream's current frame (chunkscan_state.frame_gen) whose released
 * text is of one channel (the answer, or the reasoning under its own key): every such chunk
 * is the same bytes around its text (the tree drops the template's text keys and adds that
 * one), so once one was built through the tree (dl_parse, dl_build_chunk: some 45k
 * instructions), the next ones are written as prefix, escaped text, suffix. */
typedef struct rebuilt {
    lg_buf around; /* the prefix, then the suffix */
    size_t head;   /* the prefix's length */
    unsigned gen;  /* the frame they were learned from (0: none) */
    int key;       /* and the text's key (text_keys) */
    bool bad;      /* not learned for that frame: the tree for it */
    lg_buf out;    /* the chunk being written */
} rebuilt;

/* The module's per-exchange state: its first line is all a framed token reads of it (`as`
 * and the scanner's first 44 bytes; exchange_int.h's layout note), 64-byte aligned
 * (chat_parse). */
typedef struct chat_state {
    _Alignas(64) lg_assembler *as; /* whole responses */
    chunkscan_state scan;          /* the fast path's buffers and the stream's chunk frame */
    /* The client stream's identity, from the first attempt's chunks. */
    char *c_id, *c_model;
    long long c_created;
    lg_buf done_raw;  /* the upstream's own [DONE] event */
    int inline_state; /* LG_REASONING_INLINE output: 0 nothing, 1 <think> open, 2 closed */
    rebuilt rb;
    void *block; /* the allocation the state was placed in */
} chat_state;

_Static_assert(offsetof(chat_state, scan.in_frame) < 64,
               "a framed token reads one line of the chat state");

static chat_state *CS(const exchange *ex)
{
    return ex->api_state;
}

static void remember_meta(exchange *ex, const dl_delta *d)
{
    if (d->id && !CS(ex)->c_id) CS(ex)->c_id = lg_xstrdup(d->id);
    if (d->model && !CS(ex)->c_model) CS(ex)->c_model = lg_xstrdup(d->model);
    if (d->has_created && !CS(ex)->c_created) CS(ex)->c_created = d->created;
}

/* Text for the client in the inline output mode: reasoning wrapped in <think>…</think>. */
static void inline_wrap(exchange *ex, const char *r, size_t rn, const char *c, size_t cn,
                        lg_buf *outc)
{
    if (rn) {
        if (CS(ex)->inline_state == 0) lg_buf_append_str(outc, "<think>");
        CS(ex)->inline_state = 1;
        lg_buf_append(outc, r, rn);
    }
    if (cn) {
        if (CS(ex)->inline_state == 1) lg_buf_append_str(outc, "</think>\n\n");
        CS(ex)->inline_state = 2;
        lg_buf_append(outc, c, cn);
    }
}

static void emit_chunk(exchange *ex, const dl_delta *tmpl, const char *r, size_t rn, const char *c,
                       size_t cn, const char *finish)
{
    lg_buf inl = LG_BUF_INIT;
    const char *rr = r, *cc = c;
    size_t rrn = rn, ccn = cn;
    if (ex->mode == LG_REASONING_INLINE && ex->req.chat) {
        inline_wrap(ex, r, rn, c, cn, &inl);
        rr = NULL, rrn = 0;
        cc = inl.len ? inl.p : NULL, ccn = inl.len;
    }
    if (!rrn) rr = NULL;
    if (!ccn) cc = NULL;
    char *json = tmpl
                     ? dl_build_chunk(tmpl, rr, rrn, cc, ccn, (int)ex->mode, true, finish)
                     : dl_build_synthetic(ex->req.chat, CS(ex)->c_id ? CS(ex)->c_id : ex->id,
                                          CS(ex)->c_model ? CS(ex)->c_model : "", CS(ex)->c_created,
                                          rr, rrn, cc, ccn, (int)ex->mode, finish);
    if (json) ex_out_event(ex, json);
    free(json);
    lg_buf_free(&inl);
}

/* s[0..n) as cJSON prints a string's bytes (cJSON 1.7's print_string_ptr): '"', '\\' and
 * \b \f \n \r \t escaped, other bytes below 0x20 as \u00xx, every other byte as is. False
 * at a NUL, where a cJSON string ends (the tree decides then). */
static bool append_escaped(lg_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    static const char short_esc[32] = {
        ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't'};
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c > 31 && c != '"' && c != '\\') continue;
        if (!c) return false;
        lg_buf_append(b, s + run, i - run);
        run = i + 1;
        char e[6] = {'\\', (char)c}; /* '"' and '\\' as they are after the backslash */
        size_t k = 2;
        if (c < 32 && short_esc[c]) {
            e[1] = short_esc[c];
        } else if (c < 32) {
            memcpy(e + 1, "u00", 3);
            e[4] = hex[c >> 4], e[5] = hex[c & 15];
            k = 6;
        }
        lg_buf_append(b, e, k);
    }
    lg_buf_append(b, s + run, n - run);
    return true;
}

/* rb's chunk for content text c[0..n) into rb->out (NUL-terminated); false at a NUL. */
static bool rebuild(rebuilt *rb, const char *c, size_t n)
{
    lg_buf_reset(&rb->out);
    lg_buf_append(&rb->out, rb->around.p, rb->head);
    if (!append_escaped(&rb->out, c, n)) return false;
    lg_buf_append(&rb->out, rb->around.p + rb->head, rb->around.len - rb->head);
    return true;
}

/* The delta keys a rebuilt text goes under (rebuilt.key; 0: none of them). */
static const char *const text_keys[] = {NULL, "content", "reasoning_content", "reasoning"};

/* Learns the bytes around the text of frame gen under text_keys[key] from json, the chunk
 * built through the tree for text c[0..n): the bytes before and after its one such key's
 * string holding that text (in JSON an unescaped quote only delimits strings, so the key's
 * bytes cannot sit inside another value). Two such strings, or none: the tree for this
 * frame and key. */
static void learn(rebuilt *rb, unsigned gen, int key, const char *json, const char *c, size_t n)
{
    rb->gen = gen;
    rb->key = key;
    rb->bad = true;
    lg_buf_reset(&rb->out);
    lg_buf_printf(&rb->out, "\"%s\":\"", text_keys[key]);
    size_t lead = rb->out.len;
    if (!append_escaped(&rb->out, c, n)) return;
    lg_buf_append(&rb->out, "\"", 1);
    size_t len = strlen(json), k = rb->out.len;
    const char *at = memmem(json, len, rb->out.p, k);
    if (!at || memmem(at + 1, len - (size_t)(at + 1 - json), rb->out.p, k)) return;
    size_t head = (size_t)(at - json) + lead, text = k - lead - 1;
    lg_buf_reset(&rb->around);
    lg_buf_append(&rb->around, json, head);
    lg_buf_append(&rb->around, json + head + text, len - head - text);
    rb->head = head;
    rb->bad = false;
}

static void flush_held(exchange *ex)
{
    lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
    ex_release(ex, LG_CH_REASONING, ex_held_len(ex, LG_CH_REASONING), &r);
    ex_release(ex, LG_CH_CONTENT, ex_held_len(ex, LG_CH_CONTENT), &c);
    ex_release(ex, LG_CH_TOOL_ARGS, ex_held_len(ex, LG_CH_TOOL_ARGS), NULL);
    if (r.len || c.len) emit_chunk(ex, NULL, r.p, r.len, c.p, c.len, NULL);
    lg_buf_free(&r);
    lg_buf_free(&c);
}

/* True when the event can go to the client as the upstream's own bytes, provided that
 * releasing it leaves nothing held (the caller's check). */
static bool raw_ok(const exchange *ex, const dl_delta *d, bool held_before)
{
    if (held_before || ex->at.think || !ex->req.client_stream) return false;
    if (ex->mode == LG_REASONING_INLINE && CS(ex)->inline_state == 1 && d->content_len)
        return false;
    if (!d->reasoning_len) return true;
    switch (ex->mode) {
    case LG_REASONING_CONTENT:
        return d->reasoning_keys == DL_KEY_REASONING_CONTENT;
    case LG_REASONING_FIELD:
        return d->reasoning_keys == DL_KEY_REASONING;
    default:
        return false;
    }
}

/* The channel of chunk d of choice 0 when it is the usual token, as the upstream sent it:
 * one channel's text, no tool call, not its generation's last, and sent as the upstream's
 * own bytes (or not streamed); else -1. With nothing held before it and no split it goes
 * out as it came (on_chunk's `direct`). */
__attribute__((always_inline)) static inline int usual_channel(const exchange *ex,
                                                               const dl_delta *d)
{
    if (!d->reasoning_len == !d->content_len || d->n_tools || d->finish_reason ||
        (ex->req.client_stream && !raw_ok(ex, d, false)))
        return -1;
    return d->reasoning_len ? LG_CH_REASONING : LG_CH_CONTENT;
}

static int on_chunk(exchange *ex, const sse_event *ev, dl_delta *d)
{
    /* An open burst takes the usual tokens of its channel; any other chunk ends it first. */
    if (ex->at.in_burst &&
        (!d->n_choices || d->choice_index || usual_channel(ex, d) != (int)ex->at.burst.ch) &&
        ex_burst_stop(ex))
        return 1;
    remember_meta(ex, d);
    if (CS(ex)->as) asm_meta(CS(ex)->as, d);
    if (d->n_choices == 0) {
        /* usage-only chunk: the client sees it only if it asked for usage */
        if (!ex->req.client_usage) return 0;
        if (ex->attempt > 1 && CS(ex)->c_id && d->id && strcmp(d->id, CS(ex)->c_id) != 0) {
            cJSON_ReplaceItemInObjectCaseSensitive(d->root, "id",
                                                   dl_json_must(cJSON_CreateString(CS(ex)->c_id)));
            d->id = CS(ex)->c_id;
            char *json = lg_xcheck(cJSON_PrintUnformatted(d->root));
            ex_out_event(ex, json);
            free(json);
        } else {
            out_append(ex, ev->raw, ev->raw_len);
        }
        return 0;
    }
    if (d->choice_index != 0) { /* n > 1: only choice 0 is guarded */
        out_append(ex, ev->raw, ev->raw_len);
        return 0;
    }
    bool held_before = ex_held_any(ex);
    if (ex->attempt > 1) {
        /* A retry continues the client's stream: same id, no second opening chunk. */
        if (d->role && !d->reasoning_len && !d->content_len && !d->n_tools && !d->finish_reason)
            return 0;
        if (CS(ex)->c_id && d->id && strcmp(d->id, CS(ex)->c_id) != 0) {
            cJSON_ReplaceItemInObjectCaseSensitive(d->root, "id",
                                                   dl_json_must(cJSON_CreateString(CS(ex)->c_id)));
            d->id = CS(ex)->c_id; /* the borrowed string just died */
        }
        held_before = true; /* never the retry's raw bytes */
    }

    /* Split inline <think> out of content (no server-side reasoning parser). */
    lg_buf r = LG_BUF_INIT, c = LG_BUF_INIT;
    const char *rs = d->reasoning, *cs = d->content;
    size_t rn = d->reasoning_len, cn = d->content_len;
    bool reshaped =
        ex->req.chat && ex_think_split(ex, d->reasoning, d->reasoning_len, d->content,
                                       d->content_len, d->finish_reason != NULL, &r, &c);
    if (reshaped) rs = r.p, rn = r.len, cs = c.p, cn = c.len;

    bool text = rn || cn;
    /* The usual token: one channel's text that nothing held before, released whole unless
     * the guard holds some of it, and sent as the upstream's own bytes (or not streamed). */
    bool direct = !held_before && !reshaped && usual_channel(ex, d) >= 0;
    bool tripped = direct ? ex_guard_text_release(ex, rn ? LG_CH_REASONING : LG_CH_CONTENT,
                                                  rn ? rs : cs, rn ? rn : cn)
                          : ex_guard_text(ex, LG_CH_REASONING, rs, rn) ||
                                ex_guard_text(ex, LG_CH_CONTENT, cs, cn);
    for (size_t i = 0; !tripped && i < d->n_tools; i++) {
        tripped = ex_guard_text(ex, LG_CH_TOOL_ARGS, d->tools[i].args, d->tools[i].args_len);
        text |= d->tools[i].args_len > 0;
    }
    if (reshaped) {
        ex_text_return(ex, EX_TEXT_R, &r);
        ex_text_return(ex, EX_TEXT_C, &c);
    }
    if (text) ex->at.tokens++;
    if (tripped) return 1; /* the verdict was taken */
    if (d->finish_reason) {
        ex->at.finished_gen = true;
        ex_think_settle(ex);
        if (ex_end_checks(ex, strcmp(d->finish_reason, "length") != 0)) return 1;
    }

    /* Release: everything at the end of the generation, else what the guard cleared. Tool
     * arguments are guarded but never held (they are forwarded in their own deltas). */
    bool all = d->finish_reason != NULL;
    size_t hr = ex_held_len(ex, LG_CH_REASONING), hc = ex_held_len(ex, LG_CH_CONTENT);
    size_t nr = all ? hr : ex_releasable(ex, LG_CH_REASONING);
    size_t nc = all ? hc : ex_releasable(ex, LG_CH_CONTENT);
    /* The upstream's own bytes go out when nothing stays held; the released text is then
     * not needed apart from `sent`. */
    bool raw = !reshaped && nr == hr && nc == hc && raw_ok(ex, d, held_before);
    ex_release(ex, LG_CH_TOOL_ARGS, ex_held_len(ex, LG_CH_TOOL_ARGS), NULL);
    if (raw || !ex->req.client_stream) {
        /* Nothing to rebuild (a whole response is assembled from `sent`): the usual token. */
        ex_release(ex, LG_CH_REASONING, nr, NULL);
        ex_release(ex, LG_CH_CONTENT, nc, NULL);
        if (raw) ex_out_raw(ex, ev->raw, ev->raw_len);
        return 0;
    }
    lg_buf rel_r = ex_text_borrow(ex, EX_TEXT_R), rel_c = ex_text_borrow(ex, EX_TEXT_C);
    ex_release(ex, LG_CH_REASONING, nr, &rel_r);
    ex_release(ex, LG_CH_CONTENT, nc, &rel_c);
    bool other = d->finish_reason || d->n_tools || d->role || d->usage;
    bool visible = rel_c.len || (rel_r.len && ex->mode != LG_REASONING_HIDE);
    if ((visible || other) && d->root) {
        emit_chunk(ex, d, rel_r.p, rel_r.len, rel_c.p, rel_c.len, d->finish_reason);
    } else if (visible || other) { /* scanned on the fast path: the template needs a tree */
        rebuilt *rb = &CS(ex)->rb;
        unsigned gen = CS(ex)->scan.frame_gen;
        /* the frame around one channel's released text (a framed chunk has no finish) */
        int key = rel_c.len                          ? (rel_r.len ? 0 : 1)
                  : ex->mode == LG_REASONING_CONTENT ? 2
                  : ex->mode == LG_REASONING_FIELD   ? 3
                                                     : 0;
        bool plain = key && !other && CS(ex)->scan.in_frame && ex->req.chat &&
                     ex->mode != LG_REASONING_INLINE;
        const char *t = rel_c.len ? rel_c.p : rel_r.p;
        size_t tn = rel_c.len ? rel_c.len : rel_r.len;
        if (plain && rb->gen == gen && rb->key == key && !rb->bad && rebuild(rb, t, tn)) {
            ex_out_event(ex, rb->out.p);
        } else {
            dl_delta full;
            dl_parse(ev->data, ev->data_len, &full);
            char *json = plain && (rb->gen != gen || rb->key != key) && !full.finish_reason
                             ? dl_build_chunk(&full, rel_r.len ? rel_r.p : NULL, rel_r.len,
                                              rel_c.len ? rel_c.p : NULL, rel_c.len, (int)ex->mode,
                                              true, NULL)
                             : NULL;
            if (json) { /* what emit_chunk builds for it, and the frame's bytes learned */
                ex_out_event(ex, json);
                learn(rb, gen, key, json, t, tn);
                free(json);
            } else {
                emit_chunk(ex, &full, rel_r.p, rel_r.len, rel_c.p, rel_c.len, full.finish_reason);
            }
            dl_delta_clear(&full);
        }
    }
    ex_text_return(ex, EX_TEXT_R, &rel_r);
    ex_text_return(ex, EX_TEXT_C, &rel_c);
    return 0;
}

/* The fast path for a stream's first attempt (its first chunk, a walk, brings the stream's
 * identity); whole responses and retries need the full tree (assembler, id rewriting). */
static bool chat_fast(const exchange *ex)
{
    return ex->req.client_stream && ex->attempt == 1;
}

/* Before the worker's read: the state's first line and the frame's own bytes, all that a
 * framed token reads of the module's state (lg_api.warm). */
static void chat_warm(const exchange *ex)
{
    const chat_state *cs = CS(ex);
    if (cs) chunkscan_warm(&cs->scan);
}

/* The delta of the chunk chat_vouch last read on this thread: its event is dispatched
 * right after the vouch (sse_parser_vouch), and its handling feeds no other parser. */
static _Thread_local dl_delta vouched;

/* The SSE parser's vouch: a chunk in the stream's frame around a new string holds no CR or
 * LF, and its delta is read here, once (chunkscan_frames). */
static bool chat_vouch(void *ud, const char *data, size_t len)
{
    exchange *ex = ud;
    return chat_fast(ex) && chunkscan_frames(data, len, &CS(ex)->scan, &vouched);
}

static int chat_on_event(exchange *ex, const sse_event *ev)
{
    if (ev->vouched) return on_chunk(ex, ev, &vouched);
    dl_delta d;
    bool fast = chat_fast(ex) && chunkscan(ev->data, ev->data_len, &CS(ex)->scan, &d);
    if (!fast) dl_parse(ev->data, ev->data_len, &d);
    int rc = 0;
    if (d.kind != DL_CHUNK && ex_burst_stop(ex)) { /* the burst tripped before this event */
        if (!fast) dl_delta_clear(&d);
        return 1;
    }
    switch (d.kind) {
    case DL_DONE:
        ex->at.saw_done = true;
        lg_buf_reset(&CS(ex)->done_raw);
        lg_buf_append(&CS(ex)->done_raw, ev->raw, ev->raw_len);
        break;
    case DL_ERROR:
        metrics_upstream_error(req_metrics(&ex->base), ex->replica, "protocol");
        ex_set_outcome(ex, "upstream_error");
        if (ex_streaming_started(ex)) {
            flush_held(ex);
            out_append(ex, ev->raw, ev->raw_len);
            ex->at.finished_gen = true; /* the stream ends with [DONE] after the error */
        } else {
            ex_fail_whole(ex, d.error_code >= 400 && d.error_code < 600 ? d.error_code : 502,
                          dl_json_print_free(dl_json_must(cJSON_Duplicate(d.root, 1))));
        }
        break;
    case DL_CHUNK:
        rc = on_chunk(ex, ev, &d);
        break;
    case DL_OTHER:
        out_append(ex, ev->raw, ev->raw_len);
        break;
    }
    if (!fast) dl_delta_clear(&d); /* chunkscan's delta owns nothing */
    return rc;
}

/* ---- the module's hooks ------------------------------------------------------------- */

static int chat_parse(exchange *ex, const char *body, size_t len, rw_error *err)
{
    if (rw_parse(body, len, ex->api == &api_chat, &ex->req, err) != 0) return -1;
    void *block;
    chat_state *cs = lg_xcalloc_lines(sizeof *cs, &block);
    cs->block = block;
    ex->api_state = cs;
    if (!ex->req.client_stream) cs->as = asm_new(ex->req.chat);
    return 0;
}

static char *chat_build(exchange *ex, const rw_opts *o, rw_error *err)
{
    return rw_build_upstream(&ex->req, o, err);
}

static cJSON *chat_sampling(const exchange *ex, const rw_opts *o)
{
    return rw_sampling_json(&ex->req, o);
}

static cJSON *chat_prompt(const exchange *ex, bool full)
{
    const cJSON *p =
        cJSON_GetObjectItemCaseSensitive(ex->req.root, ex->req.chat ? "messages" : "prompt");
    if (full) return cJSON_Duplicate(p, 1);
    const char *text = NULL;
    if (cJSON_IsString(p)) text = p->valuestring;
    for (const cJSON *m = cJSON_IsArray(p) ? p->child : NULL; m; m = m->next) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsString(role) && strcmp(role->valuestring, "user") == 0 &&
            cJSON_IsString(content))
            text = content->valuestring;
    }
    return text ? cJSON_CreateString(text) : NULL;
}

static void chat_attempt_begins(exchange *ex, bool restart)
{
    if (!restart) return;
    asm_free(CS(ex)->as);
    CS(ex)->as = asm_new(ex->req.chat);
}

/* The stream's last event: the upstream's own [DONE] on a clean stream. */
static void chat_end_stream(exchange *ex)
{
    chat_state *cs = CS(ex);
    if (cs->done_raw.len && !ex->rec.trips)
        ex_end_stream(ex, cs->done_raw.p, cs->done_raw.len);
    else
        ex_end_stream(ex, "data: [DONE]\n\n", 14);
}

static void chat_finish(exchange *ex)
{
    chat_state *cs = CS(ex);
    if (ex->req.client_stream) {
        if (ex->mode == LG_REASONING_INLINE && cs->inline_state == 1 && ex->req.chat) {
            static const char close[] = "</think>\n\n";
            char *json = dl_build_synthetic(ex->req.chat, cs->c_id ? cs->c_id : ex->id,
                                            cs->c_model ? cs->c_model : "", cs->c_created, NULL, 0,
                                            close, sizeof close - 1, (int)ex->mode, NULL);
            ex_out_event(ex, json);
            free(json);
        }
        chat_end_stream(ex);
        return;
    }
    for (int c = LG_CH_REASONING; c <= LG_CH_CONTENT; c++)
        asm_text(cs->as, c, ex->cl.sent[c].p, ex->cl.sent[c].len);
    ex->cl.final_status = 200;
    ex->cl.final_body = asm_render(cs->as, (int)ex->mode);
}

/* OpenAI's own word for an answer withheld by a filter. */
static void chat_withheld(exchange *ex)
{
    if (ex->req.client_stream)
        emit_chunk(ex, NULL, NULL, 0, NULL, 0, "content_filter");
    else
        asm_set_finish(CS(ex)->as, "content_filter");
}

static void chat_stream_error(exchange *ex, int status, const char *message, const char *type,
                              const char *code)
{
    char *json = dl_error_json(message, type, code, status);
    ex_out_event(ex, json);
    free(json);
    chat_end_stream(ex);
}

static void chat_destroy(exchange *ex)
{
    chat_state *cs = CS(ex);
    if (!cs) return;
    asm_free(cs->as);
    lg_xfree(cs->c_id);
    lg_xfree(cs->c_model);
    lg_buf_free(&cs->done_raw);
    chunkscan_free(&cs->scan);
    lg_buf_free(&cs->rb.around);
    lg_buf_free(&cs->rb.out);
    lg_xfree(cs->block);
    ex->api_state = NULL;
}

#define CHAT_HOOKS                                                                                 \
    .parse = chat_parse, .build = chat_build, .sampling = chat_sampling, .prompt = chat_prompt,    \
    .attempt_begins = chat_attempt_begins, .on_event = chat_on_event, .vouch = chat_vouch,         \
    .warm = chat_warm, .finish = chat_finish, .withheld = chat_withheld,                           \
    .stream_error = chat_stream_error, .error_body = ex_openai_error_body,                         \
    .destroy = chat_destroy, .can_continue = true, .takes_rid = true

const lg_api api_chat = {
    .route = "/v1/chat/completions",
    .upstream_path = "/v1/chat/completions",
    .endpoint = LG_EP_CHAT,
    .templated = true,
    CHAT_HOOKS,
};

const lg_api api_completions = {
    .route = "/v1/completions",
    .upstream_path = "/v1/completions",
    .endpoint = LG_EP_COMPLETIONS,
    .templated = false,
    CHAT_HOOKS,
};
