/* api_messages.c — the Anthropic Messages API (/v1/messages) as an API module (api.h).
 *
 * SGLang and vLLM serve /v1/messages by translating their chat stream into Anthropic
 * events: `event: NAME` + `data: JSON` — message_start, then per content block
 * content_block_start (text, thinking, tool_use), content_block_delta (text_delta,
 * thinking_delta, input_json_delta, signature_delta), content_block_stop; message_delta
 * (stop_reason, usage), message_stop; ping and error anywhere. Channels: thinking_delta ->
 * reasoning, text_delta -> answer text, input_json_delta -> tool-call arguments; each delta
 * is guarded and held like chat text, and a block's held text is released at its
 * content_block_stop (the block ended: whatever was held there was not a running loop).
 *
 * A server without a reasoning parser leaves the reasoning inline in the text block,
 * between <think> and </think>: ex_think_split (exchange_think.c) moves it to the reasoning
 * channel, and the client gets it as a thinking block of its own before the text block
 * ({"type":"thinking","thinking":"","signature":""} as the SDK's ThinkingBlock has it; no
 * signature_delta: no server signed it). A text block's start is therefore held back until
 * its first text says whether it opens with reasoning.
 *
 * The client's event sequence stays valid across a retry: one message_start (the first
 * attempt's), block indexes continuous — a retry closes the client's open block and numbers
 * its own blocks after the client's last (client index = upstream index + offset; a thinking
 * block split out of a text block moves the offset on by one). While the offset is 0 and
 * nothing is held, events go out as the upstream's own bytes (a clean stream is
 * byte-identical); otherwise they are rebuilt.
 *
 * Retry sampling: SGLang's and vLLM's Anthropic request models carry temperature, top_p
 * and top_k (sglang entrypoints/anthropic/serving.py copies those three and stop_sequences
 * into its chat request, dropping any other field), so a retry changes temperature only.
 * Neither takes a rid: the cut is the closed connection, which their streaming responses
 * turn into an abort of the request.
 *
 * Withheld (every attempt looped): the message ends with stop_reason "refusal" — the
 * documented value for "the model declined to respond", which clients already treat as
 * "no usable answer" (the AI SDK maps it to content-filter, as chat's finish_reason
 * content_filter). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/exchange_int.h"
#include "proxy/xalloc.h"

/* A content block of a whole response, as released. */
typedef struct wblock {
    int ch;          /* lg_channel, or -1: a block type without text (kept as sent) */
    cJSON *start;    /* the upstream's content_block (owned) */
    lg_buf text;     /* released text */
    lg_buf think;    /* text: the reasoning split out of it (rendered as a thinking block) */
    char *signature; /* thinking: the signature_delta */
} wblock;

typedef struct msg_state {
    /* the client's stream */
    bool started;   /* message_start went out */
    int next;       /* the client's next block index */
    int open;       /* the client's open block index, -1: none */
    int open_ch;    /* its channel, -1: not text */
    int offset;     /* this attempt: client index = upstream index + offset */
    lg_buf pending; /* the upstream's text block start, held until its first text */
    cJSON *pending_root;
    bool errored;    /* an upstream error event ended the stream */
    lg_buf stop_raw; /* the upstream's message_stop event */
    /* this attempt's upstream block */
    int up_ch; /* channel of the upstream's open block, -1: none or not text */
    /* whole responses */
    cJSON *message; /* message_start's message (owned) */
    wblock *blocks;
    size_t n_blocks, cap_blocks;
    char *stop_reason;
    cJSON *usage; /* message_delta's usage (owned) */
} msg_state;

static msg_state *MS(const exchange *ex)
{
    return ex->api_state;
}

/* ---- client output ----------------------------------------------------------------- */

static void out_named(exchange *ex, const char *name, cJSON *data)
{
    char *json = dl_json_print_free(data);
    out_append(ex, "event: ", 7);
    out_append(ex, name, strlen(name));
    out_append(ex, "\ndata: ", 7);
    out_append(ex, json, strlen(json));
    out_append(ex, "\n\n", 2);
    free(json);
}

static const char *delta_type(int ch)
{
    return ch == LG_CH_REASONING ? "thinking_delta"
           : ch == LG_CH_CONTENT ? "text_delta"
                                 : "input_json_delta";
}

static const char *delta_key(int ch)
{
    return ch == LG_CH_REASONING ? "thinking" : ch == LG_CH_CONTENT ? "text" : "partial_json";
}

static void block_stop(exchange *ex, int index)
{
    cJSON *o = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", "content_block_stop");
    cJSON_AddNumberToObject(o, "index", index);
    out_named(ex, "content_block_stop", o);
}

static void out_indexed(exchange *ex, const char *raw, size_t raw_len, cJSON *root,
                        const char *type);

/* The held-back text block start of an attempt that ended is never shown. */
static void drop_pending(msg_state *m)
{
    cJSON_Delete(m->pending_root);
    m->pending_root = NULL;
    lg_buf_reset(&m->pending);
}

/* Opens the client's block for released text of channel ch (reasoning or answer): the
 * held-back upstream text block, or a thinking block split out of it (a block the upstream
 * does not have: the offset moves on). The open block, if any, ends first. */
static void open_block(exchange *ex, int ch)
{
    msg_state *m = MS(ex);
    if (m->open >= 0) block_stop(ex, m->open);
    if (ch == LG_CH_CONTENT && m->pending_root) {
        out_indexed(ex, m->pending.p, m->pending.len, m->pending_root, "content_block_start");
        cJSON_Delete(m->pending_root);
        m->pending_root = NULL;
        lg_buf_reset(&m->pending);
    } else {
        cJSON *o = dl_json_must(cJSON_CreateObject());
        cJSON_AddStringToObject(o, "type", "content_block_start");
        cJSON_AddNumberToObject(o, "index", m->next);
        cJSON *b = dl_json_must(cJSON_AddObjectToObject(o, "content_block"));
        if (ch == LG_CH_REASONING) {
            cJSON_AddStringToObject(b, "type", "thinking");
            cJSON_AddStringToObject(b, "thinking", "");
            cJSON_AddStringToObject(b, "signature", "");
        } else {
            cJSON_AddStringToObject(b, "type", "text");
            cJSON_AddStringToObject(b, "text", "");
        }
        out_named(ex, "content_block_start", o);
        m->offset++;
    }
    m->open = m->next++;
    m->open_ch = ch;
}

/* Released text of channel ch goes to the client's open block (stream) or the whole
 * response's last block (a text block's split reasoning to its thinking part). */
static void put_text(exchange *ex, int ch, const char *s, size_t n)
{
    msg_state *m = MS(ex);
    if (!n) return;
    if (!ex->req.client_stream) {
        if (!m->n_blocks) return;
        wblock *b = &m->blocks[m->n_blocks - 1];
        lg_buf_append(ch == LG_CH_REASONING && b->ch == LG_CH_CONTENT ? &b->think : &b->text, s, n);
        return;
    }
    if (ch != LG_CH_TOOL_ARGS && (m->open < 0 || m->open_ch != ch)) open_block(ex, ch);
    cJSON *o = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", "content_block_delta");
    cJSON_AddNumberToObject(o, "index", m->open >= 0 ? m->open : m->next);
    cJSON *d = dl_json_must(cJSON_AddObjectToObject(o, "delta"));
    cJSON_AddStringToObject(d, "type", delta_type(ch));
    char *t = strndup(s, n);
    if (!t) lg_oom(n + 1);
    cJSON_AddStringToObject(d, delta_key(ch), t);
    free(t);
    out_named(ex, "content_block_delta", o);
}

/* Releases every held byte of channel ch (its block ended) to the client. */
static void flush_channel(exchange *ex, int ch)
{
    if (ch < 0) return;
    lg_buf b = ex_text_borrow(ex, EX_TEXT_C);
    ex_release(ex, (lg_channel)ch, ex->at.ch[ch].held.len, &b);
    put_text(ex, ch, b.p, b.len);
    ex_text_return(ex, EX_TEXT_C, &b);
}

/* The event with its index moved by the attempt's offset (or its own bytes when the
 * offset is 0). */
static void out_indexed(exchange *ex, const char *raw, size_t raw_len, cJSON *root,
                        const char *type)
{
    msg_state *m = MS(ex);
    if (m->offset == 0) {
        out_append(ex, raw, raw_len);
        return;
    }
    cJSON *copy = dl_json_must(cJSON_Duplicate(root, 1));
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(root, "index");
    dl_json_set(copy, "index",
                cJSON_CreateNumber((cJSON_IsNumber(idx) ? idx->valueint : 0) + m->offset));
    out_named(ex, type, copy);
}

/* ---- upstream events --------------------------------------------------------------- */

static int channel_of_block(const char *type)
{
    if (!type) return -1;
    if (!strcmp(type, "thinking")) return LG_CH_REASONING;
    if (!strcmp(type, "text")) return LG_CH_CONTENT;
    if (!strcmp(type, "tool_use")) return LG_CH_TOOL_ARGS;
    return -1;
}

static void whole_block(msg_state *m, int ch, const cJSON *start)
{
    if (m->n_blocks == m->cap_blocks) {
        m->cap_blocks = m->cap_blocks ? 2 * m->cap_blocks : 4;
        m->blocks = lg_xrealloc(m->blocks, m->cap_blocks * sizeof *m->blocks);
    }
    wblock *b = &m->blocks[m->n_blocks++];
    *b = (wblock){.ch = ch, .start = dl_json_must(cJSON_Duplicate(start, 1)), .text = LG_BUF_INIT};
}

static const char *str_at(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void on_block_start(exchange *ex, const sse_event *ev, cJSON *root)
{
    msg_state *m = MS(ex);
    const cJSON *cb = cJSON_GetObjectItemCaseSensitive(root, "content_block");
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(root, "index");
    m->up_ch = channel_of_block(str_at(cb, "type"));
    if (!ex->req.client_stream) {
        whole_block(m, m->up_ch, cb);
        return;
    }
    if (m->up_ch == LG_CH_CONTENT) { /* held until its text says whether it opens with <think> */
        lg_buf_reset(&m->pending);
        lg_buf_append(&m->pending, ev->raw, ev->raw_len);
        cJSON_Delete(m->pending_root);
        m->pending_root = dl_json_must(cJSON_Duplicate(root, 1));
        return;
    }
    out_indexed(ex, ev->raw, ev->raw_len, root, "content_block_start");
    m->open = (cJSON_IsNumber(idx) ? idx->valueint : 0) + m->offset;
    m->open_ch = m->up_ch;
    m->next = m->open + 1;
}

/* A delta: guarded, held, released. Returns 1 when the guard tripped. */
static int on_block_delta(exchange *ex, const sse_event *ev, cJSON *root)
{
    msg_state *m = MS(ex);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "delta");
    const char *type = str_at(d, "type");
    int ch = !type                               ? -1
             : !strcmp(type, "thinking_delta")   ? LG_CH_REASONING
             : !strcmp(type, "text_delta")       ? LG_CH_CONTENT
             : !strcmp(type, "input_json_delta") ? LG_CH_TOOL_ARGS
                                                 : -1;
    if (ch < 0) { /* signature_delta and others: after the block's text, as sent */
        if (type && !strcmp(type, "signature_delta") && !ex->req.client_stream && m->n_blocks) {
            const char *sig = str_at(d, "signature");
            free(m->blocks[m->n_blocks - 1].signature);
            m->blocks[m->n_blocks - 1].signature = sig ? lg_xstrdup(sig) : NULL;
        }
        if (ex->req.client_stream) {
            flush_channel(ex, m->up_ch);
            out_indexed(ex, ev->raw, ev->raw_len, root, "content_block_delta");
        }
        return 0;
    }
    const char *s = str_at(d, delta_key(ch));
    size_t n = s ? strlen(s) : 0;
    int rc = ch == LG_CH_CONTENT ? ex_think_text(ex, s, n, false, put_text) : -1;
    if (rc >= 0) return rc;
    bool held_before = ex_held_any(ex);
    if (ex_guard_text(ex, (lg_channel)ch, s, n)) return 1;
    if (n) ex->at.tokens++;
    if (m->pending_root && n) open_block(ex, LG_CH_CONTENT); /* plain text: its block starts */
    size_t k = ex_releasable(ex, (lg_channel)ch);
    if (ex->req.client_stream && m->offset == 0 && !held_before && k == ex->at.ch[ch].held.len) {
        ex_release(ex, (lg_channel)ch, k, NULL);
        out_append(ex, ev->raw, ev->raw_len);
        return 0;
    }
    lg_buf b = ex_text_borrow(ex, EX_TEXT_C);
    ex_release(ex, (lg_channel)ch, k, &b);
    put_text(ex, ch, b.p, b.len);
    ex_text_return(ex, EX_TEXT_C, &b);
    return 0;
}

/* The end of a block: its held text is released (a tag's held bytes too). Returns 1 when a
 * guard tripped on them. */
static int on_block_stop(exchange *ex, const sse_event *ev, cJSON *root)
{
    msg_state *m = MS(ex);
    if (m->up_ch == LG_CH_CONTENT && ex_think_text(ex, "", 0, true, put_text) == 1) return 1;
    flush_channel(ex, LG_CH_REASONING);
    flush_channel(ex, m->up_ch);
    m->up_ch = -1;
    if (!ex->req.client_stream) return 0;
    if (m->pending_root && m->open >= 0) { /* all of the text was reasoning */
        drop_pending(m);
        block_stop(ex, m->open);
    } else {
        if (m->pending_root) open_block(ex, LG_CH_CONTENT); /* an empty text block */
        out_indexed(ex, ev->raw, ev->raw_len, root, "content_block_stop");
    }
    m->open = -1;
    return 0;
}

/* message_delta: the generation ended. Returns 1 when a last check tripped. */
static int on_message_delta(exchange *ex, const sse_event *ev, cJSON *root)
{
    msg_state *m = MS(ex);
    const char *stop = str_at(cJSON_GetObjectItemCaseSensitive(root, "delta"), "stop_reason");
    if (ex_think_settle(ex)) /* no </think>: the text block's reasoning was its answer */
        for (size_t i = 0; i < m->n_blocks; i++)
            lg_buf_reset(&m->blocks[i].think);
    if (ex_end_checks(ex, !stop || strcmp(stop, "max_tokens") != 0)) return 1;
    ex->at.finished_gen = true;
    for (int c = 0; c < LG_CH_COUNT; c++)
        flush_channel(ex, c);
    if (ex->req.client_stream) {
        out_append(ex, ev->raw, ev->raw_len);
        return 0;
    }
    free(m->stop_reason);
    m->stop_reason = stop ? lg_xstrdup(stop) : NULL;
    cJSON_Delete(m->usage);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(root, "usage");
    m->usage = u ? dl_json_must(cJSON_Duplicate(u, 1)) : NULL;
    return 0;
}

static void on_error_event(exchange *ex, const sse_event *ev, cJSON *root)
{
    msg_state *m = MS(ex);
    metrics_upstream_error(req_metrics(&ex->base), ex->replica, "protocol");
    ex_set_outcome(ex, "upstream_error");
    if (ex_streaming_started(ex)) {
        for (int c = 0; c < LG_CH_COUNT; c++)
            flush_channel(ex, c);
        out_append(ex, ev->raw, ev->raw_len);
        m->errored = true;
        ex->at.saw_done = true; /* the stream ends after the error */
        return;
    }
    const char *type = str_at(cJSON_GetObjectItemCaseSensitive(root, "error"), "type");
    ex_fail_whole(ex, type && !strcmp(type, "invalid_request_error") ? 400 : 502,
                  dl_json_print_free(dl_json_must(cJSON_Duplicate(root, 1))));
}

static int msg_on_event(exchange *ex, const sse_event *ev)
{
    msg_state *m = MS(ex);
    cJSON *root = cJSON_ParseWithLength(ev->data, ev->data_len);
    const char *type = str_at(root, "type");
    int rc = 0;
    if (!type) {
        metrics_upstream_error(req_metrics(&ex->base), ex->replica, "protocol");
        ex_set_outcome(ex, "upstream_error");
        ex_fail(ex, 502, "the upstream sent a malformed event", "upstream_error", "bad_upstream");
        rc = 1;
    } else if (!strcmp(type, "message_start")) {
        if (!m->message) {
            const cJSON *msg = cJSON_GetObjectItemCaseSensitive(root, "message");
            m->message =
                dl_json_must(cJSON_IsObject(msg) ? cJSON_Duplicate(msg, 1) : cJSON_CreateObject());
        }
        if (ex->req.client_stream && !m->started) out_append(ex, ev->raw, ev->raw_len);
        m->started = true;
    } else if (!strcmp(type, "content_block_start")) {
        on_block_start(ex, ev, root);
    } else if (!strcmp(type, "content_block_delta")) {
        rc = on_block_delta(ex, ev, root);
    } else if (!strcmp(type, "content_block_stop")) {
        rc = on_block_stop(ex, ev, root);
    } else if (!strcmp(type, "message_delta")) {
        rc = on_message_delta(ex, ev, root);
    } else if (!strcmp(type, "message_stop")) {
        ex->at.saw_done = true;
        lg_buf_reset(&m->stop_raw);
        lg_buf_append(&m->stop_raw, ev->raw, ev->raw_len);
    } else if (!strcmp(type, "error")) {
        on_error_event(ex, ev, root);
    } else if (ex->req.client_stream) { /* ping, and types this module does not know */
        out_append(ex, ev->raw, ev->raw_len);
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- the module's hooks ------------------------------------------------------------- */

static int msg_parse(exchange *ex, const char *body, size_t len, rw_error *err)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    *err = (rw_error){.status = 400};
    if (!cJSON_IsObject(root)) {
        err->message = "the request body must be a JSON object";
        goto fail;
    }
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(msgs)) {
        err->message = "messages: an array is required";
        err->param = "messages";
        goto fail;
    }
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(root, "stream");
    if (stream && !cJSON_IsBool(stream) && !cJSON_IsNull(stream)) {
        err->message = "stream: a boolean is required";
        err->param = "stream";
        goto fail;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "temperature");
    if (t && !cJSON_IsNumber(t) && !cJSON_IsNull(t)) {
        err->message = "temperature: a number is required";
        err->param = "temperature";
        goto fail;
    }
    ex->req = (rw_request){.root = root,
                           .client_stream = cJSON_IsTrue(stream),
                           .model = str_at(root, "model"),
                           .n = 1,
                           .temperature = cJSON_IsNumber(t) ? t->valuedouble : 0,
                           .has_temperature = cJSON_IsNumber(t),
                           .enable_thinking = -1};
    msg_state *m = lg_xcalloc(1, sizeof *m);
    m->open = m->open_ch = m->up_ch = -1;
    ex->api_state = m;
    return 0;
fail:
    cJSON_Delete(root);
    return -1;
}

static char *msg_build(exchange *ex, const rw_opts *o, rw_error *err)
{
    (void)err;
    return rw_build_streamed(&ex->req, o);
}

static cJSON *msg_sampling(const exchange *ex, const rw_opts *o)
{
    static const char *const keys[] = {"temperature", "top_p", "top_k"};
    cJSON *obj = dl_json_must(cJSON_CreateObject());
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(ex->req.root, keys[i]);
        if (cJSON_IsNumber(v)) dl_json_set(obj, keys[i], cJSON_CreateNumber(v->valuedouble));
    }
    if (o->step && o->step->temperature_add != 0)
        dl_json_set(obj, "temperature", cJSON_CreateNumber(rw_step_temperature(&ex->req, o->step)));
    return obj;
}

/* The last user turn's text: a string content, or its first text block. */
static cJSON *msg_prompt(const exchange *ex, bool full)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(ex->req.root, "messages");
    if (full) return cJSON_Duplicate(msgs, 1);
    const char *text = NULL;
    for (const cJSON *m = cJSON_IsArray(msgs) ? msgs->child : NULL; m; m = m->next) {
        const char *role = str_at(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!role || strcmp(role, "user")) continue;
        if (cJSON_IsString(content)) text = content->valuestring;
        for (const cJSON *b = cJSON_IsArray(content) ? content->child : NULL; b; b = b->next)
            if (str_at(b, "type") && !strcmp(str_at(b, "type"), "text") && str_at(b, "text")) {
                text = str_at(b, "text");
                break;
            }
    }
    return text ? cJSON_CreateString(text) : NULL;
}

static void free_blocks(msg_state *m)
{
    for (size_t i = 0; i < m->n_blocks; i++) {
        cJSON_Delete(m->blocks[i].start);
        lg_buf_free(&m->blocks[i].text);
        lg_buf_free(&m->blocks[i].think);
        free(m->blocks[i].signature);
    }
    m->n_blocks = 0;
}

static void msg_attempt_begins(exchange *ex, bool restart)
{
    msg_state *m = MS(ex);
    m->up_ch = -1;
    if (restart) {
        free_blocks(m);
        free(m->stop_reason);
        m->stop_reason = NULL;
        cJSON_Delete(m->usage);
        m->usage = NULL;
    }
    if (ex->attempt > 1 && ex->req.client_stream) {
        /* The client keeps what it has: its open block ends, ours follow it. */
        if (m->open >= 0) block_stop(ex, m->open);
        m->open = -1;
        m->offset = m->next;
        drop_pending(m);
    }
}

static void msg_end_stream(exchange *ex)
{
    msg_state *m = MS(ex);
    if (m->errored) {
        ex_end_stream(ex, "", 0);
    } else if (m->stop_raw.len) {
        ex_end_stream(ex, m->stop_raw.p, m->stop_raw.len);
    } else {
        static const char stop[] = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        ex_end_stream(ex, stop, sizeof stop - 1);
    }
}

/* The whole message: the upstream's message_start object with the released blocks, the
 * stop reason and the usage of the last attempt. */
static char *render_whole(msg_state *m)
{
    cJSON *msg = dl_json_must(m->message ? cJSON_Duplicate(m->message, 1) : cJSON_CreateObject());
    cJSON *content = dl_json_must(cJSON_CreateArray());
    for (size_t i = 0; i < m->n_blocks; i++) {
        wblock *b = &m->blocks[i];
        if (b->think.len) { /* reasoning split out of the text block: a thinking block */
            lg_buf_append(&b->think, "", 0);
            cJSON *t = dl_json_must(cJSON_CreateObject());
            cJSON_AddStringToObject(t, "type", "thinking");
            cJSON_AddStringToObject(t, "thinking", b->think.p);
            cJSON_AddStringToObject(t, "signature", "");
            cJSON_AddItemToArray(content, t);
            if (!b->text.len) continue; /* all of it was reasoning */
        }
        cJSON *o = dl_json_must(cJSON_Duplicate(b->start, 1));
        lg_buf_append(&b->text, "", 0);
        const char *text = b->text.p ? b->text.p : "";
        if (b->ch == LG_CH_REASONING) {
            dl_json_set(o, "thinking", cJSON_CreateString(text));
            if (b->signature) dl_json_set(o, "signature", cJSON_CreateString(b->signature));
        } else if (b->ch == LG_CH_CONTENT) {
            dl_json_set(o, "text", cJSON_CreateString(text));
        } else if (b->ch == LG_CH_TOOL_ARGS) {
            cJSON *input = cJSON_ParseWithLength(text, b->text.len);
            dl_json_set(o, "input", cJSON_IsObject(input) ? input : cJSON_CreateObject());
            if (!cJSON_IsObject(input)) cJSON_Delete(input);
        }
        cJSON_AddItemToArray(content, o);
    }
    dl_json_set(msg, "content", content);
    dl_json_set(msg, "stop_reason",
                m->stop_reason ? cJSON_CreateString(m->stop_reason) : cJSON_CreateNull());
    if (!cJSON_GetObjectItemCaseSensitive(msg, "stop_sequence"))
        dl_json_set(msg, "stop_sequence", cJSON_CreateNull());
    if (m->usage) {
        cJSON *u = cJSON_GetObjectItemCaseSensitive(msg, "usage");
        if (!cJSON_IsObject(u)) {
            dl_json_set(msg, "usage", dl_json_must(cJSON_Duplicate(m->usage, 1)));
        } else {
            for (const cJSON *f = m->usage->child; f; f = f->next)
                dl_json_set(u, f->string, dl_json_must(cJSON_Duplicate(f, 1)));
        }
    }
    return dl_json_print_free(msg);
}

static void msg_finish(exchange *ex)
{
    if (ex->req.client_stream) {
        msg_end_stream(ex);
        return;
    }
    ex->cl.final_status = 200;
    ex->cl.final_body = render_whole(MS(ex));
}

static void msg_withheld(exchange *ex)
{
    msg_state *m = MS(ex);
    if (!ex->req.client_stream) {
        free(m->stop_reason);
        m->stop_reason = lg_xstrdup("refusal");
        return;
    }
    if (m->open >= 0) block_stop(ex, m->open);
    m->open = -1;
    drop_pending(m);
    cJSON *o = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", "message_delta");
    cJSON *d = dl_json_must(cJSON_AddObjectToObject(o, "delta"));
    cJSON_AddStringToObject(d, "stop_reason", "refusal");
    cJSON_AddNullToObject(d, "stop_sequence");
    cJSON *u = dl_json_must(cJSON_AddObjectToObject(o, "usage"));
    cJSON_AddNumberToObject(u, "output_tokens", 0);
    out_named(ex, "message_delta", o);
}

/* Anthropic's error types: the client's own mistakes keep theirs, the rest is api_error. */
static cJSON *error_json(const char *message, const char *type)
{
    bool client =
        type && (!strcmp(type, "invalid_request_error") || !strcmp(type, "authentication_error"));
    cJSON *o = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", "error");
    cJSON *e = dl_json_must(cJSON_AddObjectToObject(o, "error"));
    cJSON_AddStringToObject(e, "type", client ? type : "api_error");
    cJSON_AddStringToObject(e, "message", message ? message : "");
    return o;
}

static void msg_stream_error(exchange *ex, int status, const char *message, const char *type,
                             const char *code)
{
    (void)status, (void)code;
    out_named(ex, "error", error_json(message, type));
    MS(ex)->errored = true;
    msg_end_stream(ex);
}

static char *msg_error_body(int status, const char *message, const char *type, const char *code)
{
    (void)status, (void)code;
    return dl_json_print_free(error_json(message, type));
}

static void msg_destroy(exchange *ex)
{
    msg_state *m = MS(ex);
    if (!m) return;
    free_blocks(m);
    free(m->blocks);
    lg_buf_free(&m->stop_raw);
    lg_buf_free(&m->pending);
    cJSON_Delete(m->pending_root);
    cJSON_Delete(m->message);
    cJSON_Delete(m->usage);
    free(m->stop_reason);
    free(m);
    ex->api_state = NULL;
}

const lg_api api_messages = {
    .route = "/v1/messages",
    .upstream_path = "/v1/messages",
    .endpoint = LG_EP_MESSAGES,
    .templated = true,
    .parse = msg_parse,
    .build = msg_build,
    .sampling = msg_sampling,
    .prompt = msg_prompt,
    .attempt_begins = msg_attempt_begins,
    .on_event = msg_on_event,
    .finish = msg_finish,
    .withheld = msg_withheld,
    .stream_error = msg_stream_error,
    .error_body = msg_error_body,
    .destroy = msg_destroy,
};
