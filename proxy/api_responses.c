/* api_responses.c — the OpenAI Responses API (/v1/responses) as an API module (api.h).
 *
 * vLLM and SGLang stream a response as `event: TYPE` + `data: JSON`, every event carrying
 * a sequence_number: response.created, response.in_progress; per output item
 * response.output_item.added, its part (response.content_part.added for a message,
 * response.reasoning_part.added for reasoning), deltas (response.output_text.delta,
 * response.reasoning_text.delta, response.reasoning_summary_text.delta,
 * response.function_call_arguments.delta), the .done events with the item's full text, and
 * response.output_item.done; then response.completed, or response.incomplete (length cap),
 * or response.failed / error. Channels: reasoning text and summaries -> reasoning, output
 * text -> answer, function-call arguments -> tool arguments. An item's held text is
 * released before its first .done event.
 *
 * The client's stream stays valid across a retry: sequence_number is the client's own count
 * (monotonic over every attempt), a retry closes the client's open item with its .done
 * events (the text the client has, status "incomplete") and numbers its items after the
 * client's last (output_index + offset); the final response's output lists every item the
 * client saw, under the first attempt's response id. While nothing was held or renumbered,
 * events go out as the upstream's own bytes — except vLLM's reasoning_part events, renamed
 * to OpenAI's content_part events (openai_name).
 *
 * A server without a reasoning parser leaves the reasoning inline in the message's text,
 * between <think> and </think>: ex_think_split (exchange_think.c) moves it to the reasoning
 * channel and the client gets it as a reasoning item of its own before the message item
 * (vLLM's item {"id":"rs_…","summary":[],"type":"reasoning","content":[reasoning_text
 * parts]} with OpenAI's event names, response.reasoning_text.delta / .done). A message
 * item's opening events are therefore held back until its first text says whether it
 * opens with reasoning; a split item's events are all rebuilt from the client's text, and
 * the final response lists the items the client saw.
 *
 * Retry sampling: temperature (both servers' ResponsesRequest take it; SGLang's has no rid
 * field, vLLM's request_id is no abort handle), so the cut is the closed connection.
 * Withheld: response.incomplete with incomplete_details.reason "content_filter" — the
 * Responses API's own reason for output withheld by a filter. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/exchange_int.h"
#include "proxy/xalloc.h"

/* An upstream event held back: its tree and its own bytes. */
typedef struct held_event {
    cJSON *root;
    lg_buf raw;
    char name[48]; /* its `event:` name */
} held_event;

typedef struct rsp_state {
    long seq;              /* the client's next sequence_number */
    int offset;            /* this attempt: client output_index = upstream's + offset */
    int next;              /* the client's next output_index */
    int open;              /* the client's open item (output_index), -1: none */
    int open_ch;           /* its channel, -1: not text */
    bool open_synth;       /* the open item is loopguard's (a split-out reasoning item) */
    bool split;            /* the upstream's message item is being split (its events rebuilt) */
    bool any_split;        /* some item was: the final response lists the client's items */
    held_event pending[2]; /* the message item's added events, held until its first text */
    int n_pending;
    cJSON *open_item;  /* the open item as added (owned) */
    lg_buf open_text;  /* text released into the open item */
    cJSON *delta_tmpl; /* the last delta event of this attempt (owned): released text's shape */
    int up_ch;         /* channel of the upstream's open item, -1: none */
    cJSON *response;   /* response.created's response (owned) */
    cJSON *items;      /* items the client saw done, in order (owned array) */
    cJSON *end;        /* this attempt's terminal event (completed / incomplete) (owned) */
    lg_buf end_raw;    /* ... as the upstream's own bytes, when its number is the client's */
    bool withheld;
    bool errored;
} rsp_state;

static rsp_state *RS(const exchange *ex)
{
    return ex->api_state;
}

static const char *str_at(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- client output ----------------------------------------------------------------- */

/* Queues `event: type` with data (taken; type may point into it), numbered with the client's
 * next sequence. */
static void out_numbered(exchange *ex, const char *type, cJSON *data)
{
    dl_json_set(data, "sequence_number", cJSON_CreateNumber((double)RS(ex)->seq++));
    out_append(ex, "event: ", 7);
    out_append(ex, type, strlen(type)); /* type may live in data: written before it is freed */
    out_append(ex, "\ndata: ", 7);
    char *json = dl_json_print_free(data);
    out_append(ex, json, strlen(json));
    out_append(ex, "\n\n", 2);
    free(json);
}

/* An upstream event for the client: its own bytes when its numbers are the client's, else
 * renumbered (sequence, output_index). */
static void out_event(exchange *ex, const sse_event *ev, const cJSON *root, const char *type)
{
    rsp_state *r = RS(ex);
    const cJSON *sq = cJSON_GetObjectItemCaseSensitive(root, "sequence_number");
    bool renamed = ev->event_len &&
                   (ev->event_len != strlen(type) || memcmp(ev->event, type, ev->event_len) != 0);
    if (r->offset == 0 && !renamed && cJSON_IsNumber(sq) && (long)sq->valuedouble == r->seq) {
        out_append(ex, ev->raw, ev->raw_len);
        r->seq++;
        return;
    }
    cJSON *copy = dl_json_must(cJSON_Duplicate(root, 1));
    const cJSON *oi = cJSON_GetObjectItemCaseSensitive(root, "output_index");
    if (cJSON_IsNumber(oi))
        dl_json_set(copy, "output_index", cJSON_CreateNumber(oi->valueint + r->offset));
    out_numbered(ex, type, copy);
}

static void close_open_item(exchange *ex, const char *status);
static cJSON *item_event(const rsp_state *r, const char *type);
static void out_event(exchange *ex, const sse_event *ev, const cJSON *root, const char *type);

static void drop_pending(rsp_state *r)
{
    for (int i = 0; i < r->n_pending; i++) {
        cJSON_Delete(r->pending[i].root);
        lg_buf_free(&r->pending[i].raw);
    }
    r->n_pending = 0;
}

static void flush_pending(exchange *ex);

/* Holds an opening event of the upstream's message item. Past the two it has (item added,
 * part added), the item goes out as it is and so does the event. */
static void hold_event(exchange *ex, const sse_event *ev, const cJSON *root, const char *type)
{
    rsp_state *r = RS(ex);
    if (r->n_pending == 2) {
        flush_pending(ex);
        out_event(ex, ev, root, type);
        return;
    }
    held_event *h = &r->pending[r->n_pending++];
    h->root = dl_json_must(cJSON_Duplicate(root, 1));
    h->raw = (lg_buf)LG_BUF_INIT;
    lg_buf_append(&h->raw, ev->raw, ev->raw_len);
    snprintf(h->name, sizeof h->name, "%.*s", (int)ev->event_len, ev->event);
}

/* The held-back added events of the upstream's message item, for the client (renumbered
 * after any item split out before it). */
static void flush_pending(exchange *ex)
{
    rsp_state *r = RS(ex);
    for (int i = 0; i < r->n_pending; i++) {
        held_event *h = &r->pending[i];
        const char *type = str_at(h->root, "type");
        if (!strcmp(type, "response.output_item.added")) {
            const cJSON *oi = cJSON_GetObjectItemCaseSensitive(h->root, "output_index");
            r->open = (cJSON_IsNumber(oi) ? oi->valueint : 0) + r->offset;
            r->next = r->open + 1;
            r->open_ch = LG_CH_CONTENT;
            r->open_synth = false;
            cJSON_Delete(r->open_item);
            r->open_item =
                dl_json_must(cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(h->root, "item"), 1));
            lg_buf_reset(&r->open_text);
        }
        sse_event ev = {
            .raw = h->raw.p, .raw_len = h->raw.len, .event = h->name, .event_len = strlen(h->name)};
        out_event(ex, &ev, h->root, type);
    }
    drop_pending(r);
}

/* A reasoning item of loopguard's, split out of a message's text, in vLLM's shape: its
 * content the reasoning text s[0..n) (none when s is NULL: the item was just added). */
static cJSON *reasoning_item(const char *s, size_t n, const char *status)
{
    char id[40] = "rs_";
    ex_random_hex(id + 3, 16);
    cJSON *ri = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(ri, "id", id);
    cJSON_AddItemToObject(ri, "summary", cJSON_CreateArray());
    cJSON_AddStringToObject(ri, "type", "reasoning");
    cJSON *content = dl_json_must(cJSON_AddArrayToObject(ri, "content"));
    if (s) {
        char *t = strndup(s, n);
        if (!t) lg_oom(n + 1);
        cJSON *part = dl_json_must(cJSON_CreateObject());
        cJSON_AddStringToObject(part, "text", t);
        cJSON_AddStringToObject(part, "type", "reasoning_text");
        cJSON_AddItemToArray(content, part);
        free(t);
    }
    cJSON_AddNullToObject(ri, "encrypted_content");
    cJSON_AddStringToObject(ri, "status", status);
    return ri;
}

/* A reasoning item split out of the upstream's message item: added, its part added. */
static void open_reasoning_item(exchange *ex)
{
    rsp_state *r = RS(ex);
    if (r->open >= 0) close_open_item(ex, "completed");
    cJSON_Delete(r->open_item);
    r->open_item = reasoning_item(NULL, 0, "in_progress");
    r->open = r->next++;
    r->open_ch = LG_CH_REASONING;
    r->open_synth = true;
    r->offset++; /* an item the upstream does not have */
    lg_buf_reset(&r->open_text);
    cJSON *o = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", "response.output_item.added");
    cJSON_AddNumberToObject(o, "output_index", r->open);
    cJSON_AddItemToObject(o, "item", dl_json_must(cJSON_Duplicate(r->open_item, 1)));
    out_numbered(ex, "response.output_item.added", o);
    o = item_event(r, "response.content_part.added");
    cJSON_AddNumberToObject(o, "content_index", 0);
    cJSON *part = dl_json_must(cJSON_AddObjectToObject(o, "part"));
    cJSON_AddStringToObject(part, "text", "");
    cJSON_AddStringToObject(part, "type", "reasoning_text");
    out_numbered(ex, "response.content_part.added", o);
}

/* Released text of channel ch into the client's item of that channel (opened here when the
 * upstream's message item is being split): a delta event shaped like the last one. */
static void put_text(exchange *ex, int ch, const char *s, size_t n)
{
    rsp_state *r = RS(ex);
    if (!n) return;
    if (ex->req.client_stream && r->split && (r->open < 0 || r->open_ch != ch)) {
        if (ch == LG_CH_REASONING) {
            open_reasoning_item(ex);
        } else if (r->n_pending) {
            if (r->open >= 0) close_open_item(ex, "completed");
            flush_pending(ex);
        }
    }
    lg_buf_append(&r->open_text, s, n);
    if (!ex->req.client_stream) return;
    if (r->open_synth) {
        cJSON *e = item_event(r, "response.reasoning_text.delta");
        cJSON_AddNumberToObject(e, "content_index", 0);
        char *t = strndup(s, n);
        if (!t) lg_oom(n + 1);
        cJSON_AddStringToObject(e, "delta", t);
        free(t);
        out_numbered(ex, "response.reasoning_text.delta", e);
        return;
    }
    if (!r->delta_tmpl) return;
    cJSON *d = dl_json_must(cJSON_Duplicate(r->delta_tmpl, 1));
    char *t = strndup(s, n);
    if (!t) lg_oom(n + 1);
    dl_json_set(d, "delta", cJSON_CreateString(t));
    free(t);
    const cJSON *oi = cJSON_GetObjectItemCaseSensitive(d, "output_index");
    dl_json_set(d, "output_index",
                cJSON_CreateNumber((cJSON_IsNumber(oi) ? oi->valueint : 0) + r->offset));
    out_numbered(ex, str_at(d, "type"), d);
}

static void flush_channel(exchange *ex, int ch)
{
    if (ch < 0) return;
    lg_buf b = ex_text_borrow(ex, EX_TEXT_C);
    ex_release(ex, (lg_channel)ch, ex->at.ch[ch].held.len, &b);
    put_text(ex, ch, b.p, b.len);
    ex_text_return(ex, EX_TEXT_C, &b);
}

/* A synthesized event about the open item: {type, item_id, output_index, ...}. */
static cJSON *item_event(const rsp_state *r, const char *type)
{
    cJSON *o = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", type);
    const char *id = str_at(r->open_item, "id");
    cJSON_AddStringToObject(o, "item_id", id ? id : "");
    cJSON_AddNumberToObject(o, "output_index", r->open);
    return o;
}

/* Ends the client's open item where the client's text ends: its .done events with that
 * text and `status` ("incomplete" on a retry or the withheld answer). */
static void close_open_item(exchange *ex, const char *status)
{
    rsp_state *r = RS(ex);
    if (r->open < 0) return;
    lg_buf_append(&r->open_text, "", 0);
    const char *text = r->open_text.p ? r->open_text.p : "";
    cJSON *item = dl_json_must(cJSON_Duplicate(r->open_item, 1));
    cJSON *o;
    if (r->open_ch == LG_CH_TOOL_ARGS) {
        o = item_event(r, "response.function_call_arguments.done");
        cJSON_AddStringToObject(o, "arguments", text);
        out_numbered(ex, "response.function_call_arguments.done", o);
        dl_json_set(item, "arguments", cJSON_CreateString(text));
    } else if (r->open_ch >= 0) {
        bool reason = r->open_ch == LG_CH_REASONING;
        const char *done = reason ? "response.reasoning_text.done" : "response.output_text.done";
        const char *pdone = "response.content_part.done"; /* OpenAI's name, see openai_name */
        o = item_event(r, done);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddStringToObject(o, "text", text);
        out_numbered(ex, done, o);
        cJSON *part = dl_json_must(cJSON_CreateObject());
        cJSON_AddStringToObject(part, "type", reason ? "reasoning_text" : "output_text");
        cJSON_AddStringToObject(part, "text", text);
        if (!reason) cJSON_AddItemToObject(part, "annotations", cJSON_CreateArray());
        o = item_event(r, pdone);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddItemToObject(o, "part", dl_json_must(cJSON_Duplicate(part, 1)));
        out_numbered(ex, pdone, o);
        cJSON *content = dl_json_must(cJSON_CreateArray());
        cJSON_AddItemToArray(content, part);
        dl_json_set(item, "content", content);
    }
    dl_json_set(item, "status", cJSON_CreateString(status));
    o = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", "response.output_item.done");
    cJSON_AddNumberToObject(o, "output_index", r->open);
    cJSON_AddItemToObject(o, "item", dl_json_must(cJSON_Duplicate(item, 1)));
    out_numbered(ex, "response.output_item.done", o);
    cJSON_AddItemToArray(r->items, item);
    r->open = -1;
}

/* ---- upstream events --------------------------------------------------------------- */

static int item_channel(const char *type)
{
    if (!type) return -1;
    if (!strcmp(type, "reasoning")) return LG_CH_REASONING;
    if (!strcmp(type, "message")) return LG_CH_CONTENT;
    if (!strcmp(type, "function_call")) return LG_CH_TOOL_ARGS;
    return -1;
}

static int delta_channel(const char *type)
{
    if (!strcmp(type, "response.output_text.delta")) return LG_CH_CONTENT;
    if (!strcmp(type, "response.reasoning_text.delta") ||
        !strcmp(type, "response.reasoning_summary_text.delta"))
        return LG_CH_REASONING;
    if (!strcmp(type, "response.function_call_arguments.delta")) return LG_CH_TOOL_ARGS;
    return -1;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static int on_delta(exchange *ex, const sse_event *ev, const cJSON *root, int ch)
{
    rsp_state *r = RS(ex);
    const char *s = str_at(root, "delta");
    size_t n = s ? strlen(s) : 0;
    bool held_before = ex_held_any(ex);
    cJSON_Delete(r->delta_tmpl);
    r->delta_tmpl = dl_json_must(cJSON_Duplicate(root, 1));
    int rc = ch == LG_CH_CONTENT ? ex_think_text(ex, s, n, false, put_text) : -1;
    if (rc >= 0) {
        r->split = r->any_split = true;
        return rc;
    }
    if (ex_guard_text(ex, (lg_channel)ch, s, n)) return 1;
    if (n) ex->at.tokens++;
    if (r->n_pending && n && !r->split) flush_pending(ex); /* plain text: its item starts */
    size_t k = ex_releasable(ex, (lg_channel)ch);
    const cJSON *sq = cJSON_GetObjectItemCaseSensitive(root, "sequence_number");
    if (ex->req.client_stream && !held_before && k == ex->at.ch[ch].held.len && r->offset == 0 &&
        cJSON_IsNumber(sq) && (long)sq->valuedouble == r->seq) {
        ex_release(ex, (lg_channel)ch, k, NULL);
        lg_buf_append(&r->open_text, s, n);
        out_append(ex, ev->raw, ev->raw_len);
        r->seq++;
        return 0;
    }
    lg_buf b = ex_text_borrow(ex, EX_TEXT_C);
    ex_release(ex, (lg_channel)ch, k, &b);
    put_text(ex, ch, b.p, b.len);
    ex_text_return(ex, EX_TEXT_C, &b);
    return 0;
}

/* An item's .done event: its held text is released first. The upstream's message item
 * being split ends with .done events rebuilt from the client's text. Returns 1 when a
 * guard tripped on the text's last bytes. */
static int on_item_done(exchange *ex, const sse_event *ev, const cJSON *root, const char *type)
{
    rsp_state *r = RS(ex);
    bool stream = ex->req.client_stream;
    if (r->split && r->up_ch == LG_CH_CONTENT && ex_think_text(ex, "", 0, true, put_text) == 1)
        return 1;
    flush_channel(ex, LG_CH_REASONING);
    flush_channel(ex, r->up_ch); /* the item's text is complete */
    bool item_done = !strcmp(type, "response.output_item.done");
    if (stream && r->split) {
        if (!item_done) return 0;
        if (r->n_pending && r->open >= 0) { /* all of its text was reasoning */
            drop_pending(r);
        } else if (r->n_pending) {
            flush_pending(ex);
        }
        close_open_item(ex, "completed");
    } else if (stream) {
        if (r->n_pending) flush_pending(ex); /* an item without text */
        out_event(ex, ev, root, type);
        if (item_done)
            cJSON_AddItemToArray(r->items, dl_json_must(cJSON_Duplicate(
                                               cJSON_GetObjectItemCaseSensitive(root, "item"), 1)));
    }
    if (item_done) {
        r->open = r->up_ch = -1;
        r->split = false;
    }
    return 0;
}

/* The upstream failed (response.failed or an error event). */
static void on_failed(exchange *ex, const sse_event *ev, const cJSON *root, const char *type)
{
    rsp_state *r = RS(ex);
    metrics_upstream_error(req_metrics(&ex->base), ex->replica, "protocol");
    ex_set_outcome(ex, "upstream_error");
    if (ex_streaming_started(ex)) {
        for (int c = 0; c < LG_CH_COUNT; c++)
            flush_channel(ex, c);
        out_event(ex, ev, root, type);
        r->errored = true;
        ex->at.saw_done = true;
        return;
    }
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(root, "response"), "error");
    const char *msg = str_at(err ? err : root, "message");
    ex_fail_whole(ex, 502,
                  dl_error_json(msg ? msg : "upstream error", "upstream_error",
                                str_at(err ? err : root, "code"), 502));
}

/* vLLM names the part of a reasoning item response.reasoning_part.added / .done, which the
 * official SDKs do not know (openai-node's stream accumulator throws on them; openai-python
 * issue 2634): the client gets OpenAI's own names, response.content_part.added / .done,
 * whose part may be a reasoning_text. */
static const char *openai_name(cJSON *root, const char *type)
{
    const char *to = !strcmp(type, "response.reasoning_part.added")  ? "response.content_part.added"
                     : !strcmp(type, "response.reasoning_part.done") ? "response.content_part.done"
                                                                     : NULL;
    if (!to) return type;
    dl_json_set(root, "type", cJSON_CreateString(to));
    return to;
}

static int rsp_on_event(exchange *ex, const sse_event *ev)
{
    rsp_state *r = RS(ex);
    cJSON *root = cJSON_ParseWithLength(ev->data, ev->data_len);
    const char *type = str_at(root, "type");
    if (type) type = openai_name(root, type);
    bool stream = ex->req.client_stream;
    int rc = 0, ch;
    if (!type) {
        metrics_upstream_error(req_metrics(&ex->base), ex->replica, "protocol");
        ex_set_outcome(ex, "upstream_error");
        ex_fail(ex, 502, "the upstream sent a malformed event", "upstream_error", "bad_upstream");
        rc = 1;
    } else if (!strcmp(type, "response.created") || !strcmp(type, "response.in_progress") ||
               !strcmp(type, "response.queued")) {
        if (!r->response) {
            const cJSON *resp = cJSON_GetObjectItemCaseSensitive(root, "response");
            r->response = dl_json_must(cJSON_IsObject(resp) ? cJSON_Duplicate(resp, 1)
                                                            : cJSON_CreateObject());
        }
        if (stream && ex->attempt == 1) out_event(ex, ev, root, type);
    } else if ((ch = delta_channel(type)) >= 0) {
        rc = on_delta(ex, ev, root, ch);
    } else if (!strcmp(type, "response.output_item.added")) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, "item");
        const cJSON *oi = cJSON_GetObjectItemCaseSensitive(root, "output_index");
        r->up_ch = item_channel(str_at(item, "type"));
        if (stream &&
            r->up_ch == LG_CH_CONTENT) { /* until its text says if it opens with <think> */
            drop_pending(r);
            hold_event(ex, ev, root, type);
        } else if (stream) {
            out_event(ex, ev, root, type);
            r->open = (cJSON_IsNumber(oi) ? oi->valueint : 0) + r->offset;
            r->open_ch = r->up_ch;
            cJSON_Delete(r->open_item);
            r->open_item = dl_json_must(cJSON_Duplicate(item, 1));
            lg_buf_reset(&r->open_text);
            r->next = r->open + 1;
        }
    } else if (ends_with(type, ".done") && strcmp(type, "response.done") != 0) {
        rc = on_item_done(ex, ev, root, type);
    } else if (!strcmp(type, "response.completed") || !strcmp(type, "response.incomplete")) {
        ex_think_settle(ex); /* no </think>: what looked like reasoning was the answer */
        if (ex_end_checks(ex, !strcmp(type, "response.completed"))) {
            rc = 1;
        } else {
            for (int c = 0; c < LG_CH_COUNT; c++)
                flush_channel(ex, c);
            ex->at.finished_gen = ex->at.saw_done = true;
            cJSON_Delete(r->end);
            r->end = dl_json_must(cJSON_Duplicate(root, 1));
            const cJSON *sq = cJSON_GetObjectItemCaseSensitive(root, "sequence_number");
            lg_buf_reset(&r->end_raw);
            if (r->offset == 0 && !r->any_split && cJSON_IsNumber(sq) &&
                (long)sq->valuedouble == r->seq)
                lg_buf_append(&r->end_raw, ev->raw, ev->raw_len);
        }
    } else if (!strcmp(type, "response.failed") || !strcmp(type, "error")) {
        on_failed(ex, ev, root, type);
    } else if (stream && r->n_pending) { /* the held message item's part */
        hold_event(ex, ev, root, type);
    } else if (stream) { /* parts added, and types this module does not know */
        out_event(ex, ev, root, type);
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- the module's hooks ------------------------------------------------------------- */

static int rsp_parse(exchange *ex, const char *body, size_t len, rw_error *err)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    *err = (rw_error){.status = 400};
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(root, "input");
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(root, "stream");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "temperature");
    if (!cJSON_IsObject(root)) {
        err->message = "the request body must be a JSON object";
    } else if (!cJSON_IsString(input) && !cJSON_IsArray(input)) {
        err->message = "input: a string or an array is required";
        err->param = "input";
    } else if (stream && !cJSON_IsBool(stream) && !cJSON_IsNull(stream)) {
        err->message = "stream: a boolean is required";
        err->param = "stream";
    } else if (t && !cJSON_IsNumber(t) && !cJSON_IsNull(t)) {
        err->message = "temperature: a number is required";
        err->param = "temperature";
    } else {
        ex->req = (rw_request){.root = root,
                               .client_stream = cJSON_IsTrue(stream),
                               .model = str_at(root, "model"),
                               .n = 1,
                               .temperature = cJSON_IsNumber(t) ? t->valuedouble : 0,
                               .has_temperature = cJSON_IsNumber(t),
                               .enable_thinking = -1};
        rsp_state *r = lg_xcalloc(1, sizeof *r);
        r->open = r->open_ch = r->up_ch = -1;
        r->items = dl_json_must(cJSON_CreateArray());
        ex->api_state = r;
        return 0;
    }
    cJSON_Delete(root);
    return -1;
}

static char *rsp_build(exchange *ex, const rw_opts *o, rw_error *err)
{
    (void)err;
    return rw_build_streamed(&ex->req, o);
}

static cJSON *rsp_sampling(const exchange *ex, const rw_opts *o)
{
    cJSON *obj = dl_json_must(cJSON_CreateObject());
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(ex->req.root, "temperature");
    if (cJSON_IsNumber(v)) dl_json_set(obj, "temperature", cJSON_CreateNumber(v->valuedouble));
    v = cJSON_GetObjectItemCaseSensitive(ex->req.root, "top_p");
    if (cJSON_IsNumber(v)) dl_json_set(obj, "top_p", cJSON_CreateNumber(v->valuedouble));
    if (o->step && o->step->temperature_add != 0)
        dl_json_set(obj, "temperature", cJSON_CreateNumber(rw_step_temperature(&ex->req, o->step)));
    return obj;
}

/* input as a string, or the last user item's text (a string content or input_text part). */
static cJSON *rsp_prompt(const exchange *ex, bool full)
{
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(ex->req.root, "input");
    if (full || cJSON_IsString(input)) return cJSON_Duplicate(input, 1);
    const char *text = NULL;
    for (const cJSON *m = cJSON_IsArray(input) ? input->child : NULL; m; m = m->next) {
        const char *role = str_at(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!role || strcmp(role, "user")) continue;
        if (cJSON_IsString(content)) text = content->valuestring;
        for (const cJSON *p = cJSON_IsArray(content) ? content->child : NULL; p; p = p->next)
            if (str_at(p, "text")) text = str_at(p, "text");
    }
    return text ? cJSON_CreateString(text) : NULL;
}

static void rsp_attempt_begins(exchange *ex, bool restart)
{
    rsp_state *r = RS(ex);
    if (restart) r->any_split = false; /* a whole response is the last attempt's */
    r->up_ch = -1;
    r->split = false;
    drop_pending(r);
    cJSON_Delete(r->delta_tmpl);
    r->delta_tmpl = NULL;
    cJSON_Delete(r->end);
    r->end = NULL;
    if (ex->attempt > 1 && ex->req.client_stream) {
        close_open_item(ex, "incomplete");
        r->offset = r->next;
    }
}

/* A whole response whose message text was split: the message item gets the answer, and a
 * reasoning item with the reasoning goes before it. */
static void split_output(exchange *ex, cJSON *output)
{
    const lg_buf *rs = &ex->cl.sent[LG_CH_REASONING], *cs = &ex->cl.sent[LG_CH_CONTENT];
    int at = 0;
    for (cJSON *it = cJSON_IsArray(output) ? output->child : NULL; it; it = it->next, at++) {
        const char *type = str_at(it, "type");
        cJSON *part = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(it, "content"), 0);
        if (!type || strcmp(type, "message") != 0 || !cJSON_IsObject(part)) continue;
        char *t = strndup(cs->p ? cs->p : "", cs->len);
        if (!t) lg_oom(cs->len + 1);
        dl_json_set(part, "text", cJSON_CreateString(t));
        free(t);
        if (rs->len)
            cJSON_InsertItemInArray(output, at, reasoning_item(rs->p, rs->len, "completed"));
        break;
    }
}

/* The final response for the client: the terminal event's (or response.created's) object,
 * under the first attempt's id, with every item the client saw (streams) and, when every
 * attempt looped, status incomplete for content_filter. */
static cJSON *final_response(exchange *ex)
{
    rsp_state *r = RS(ex);
    const cJSON *src =
        r->end && !r->withheld ? cJSON_GetObjectItemCaseSensitive(r->end, "response") : r->response;
    cJSON *resp = dl_json_must(src ? cJSON_Duplicate(src, 1) : cJSON_CreateObject());
    const char *id = str_at(r->response, "id");
    if (id) dl_json_set(resp, "id", cJSON_CreateString(id));
    if (ex->req.client_stream && (ex->attempt > 1 || r->withheld || r->any_split))
        dl_json_set(resp, "output", dl_json_must(cJSON_Duplicate(r->items, 1)));
    else if (r->any_split && !r->withheld)
        split_output(ex, cJSON_GetObjectItemCaseSensitive(resp, "output"));
    if (r->withheld) {
        dl_json_set(resp, "status", cJSON_CreateString("incomplete"));
        cJSON *d = dl_json_must(cJSON_CreateObject());
        cJSON_AddStringToObject(d, "reason", "content_filter");
        dl_json_set(resp, "incomplete_details", d);
        if (!ex->req.client_stream) { /* what was released of the last attempt */
            cJSON *out = dl_json_must(cJSON_CreateArray());
            const lg_buf *t = &ex->cl.sent[LG_CH_CONTENT];
            if (t->len) {
                char *s = strndup(t->p, t->len);
                if (!s) lg_oom(t->len + 1);
                cJSON *item = dl_json_must(cJSON_CreateObject());
                cJSON_AddStringToObject(item, "type", "message");
                cJSON_AddStringToObject(item, "role", "assistant");
                cJSON_AddStringToObject(item, "status", "incomplete");
                cJSON *c = dl_json_must(cJSON_AddArrayToObject(item, "content"));
                cJSON *part = dl_json_must(cJSON_CreateObject());
                cJSON_AddStringToObject(part, "type", "output_text");
                cJSON_AddStringToObject(part, "text", s);
                cJSON_AddItemToObject(part, "annotations", cJSON_CreateArray());
                cJSON_AddItemToArray(c, part);
                cJSON_AddItemToArray(out, item);
                free(s);
            }
            dl_json_set(resp, "output", out);
        }
    }
    return resp;
}

static void rsp_finish(exchange *ex)
{
    rsp_state *r = RS(ex);
    if (!ex->req.client_stream) {
        ex->cl.final_status = 200;
        ex->cl.final_body = dl_json_print_free(final_response(ex));
        return;
    }
    if (r->errored) {
        ex_end_stream(ex, "", 0);
        return;
    }
    if (!r->withheld && r->end_raw.len) { /* a clean first attempt: its own bytes */
        ex_end_stream(ex, r->end_raw.p, r->end_raw.len);
        return;
    }
    const char *type = r->withheld || !r->end ? "response.incomplete" : str_at(r->end, "type");
    cJSON *e = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddItemToObject(e, "response", final_response(ex));
    dl_json_set(e, "sequence_number", cJSON_CreateNumber((double)r->seq++));
    char *json = dl_json_print_free(e);
    lg_buf b = LG_BUF_INIT;
    lg_buf_printf(&b, "event: %s\ndata: %s\n\n", type, json);
    free(json);
    ex_end_stream(ex, b.p, b.len);
    lg_buf_free(&b);
}

static void rsp_withheld(exchange *ex)
{
    RS(ex)->withheld = true;
    drop_pending(RS(ex));
    if (ex->req.client_stream) close_open_item(ex, "incomplete");
}

static void rsp_stream_error(exchange *ex, int status, const char *message, const char *type,
                             const char *code)
{
    (void)status, (void)type;
    cJSON *o = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", "error");
    if (code)
        cJSON_AddStringToObject(o, "code", code);
    else
        cJSON_AddNullToObject(o, "code");
    cJSON_AddStringToObject(o, "message", message ? message : "");
    cJSON_AddNullToObject(o, "param");
    out_numbered(ex, "error", o);
    RS(ex)->errored = true;
    ex_end_stream(ex, "", 0);
}

static void rsp_destroy(exchange *ex)
{
    rsp_state *r = RS(ex);
    if (!r) return;
    cJSON_Delete(r->open_item);
    cJSON_Delete(r->delta_tmpl);
    cJSON_Delete(r->response);
    cJSON_Delete(r->items);
    cJSON_Delete(r->end);
    drop_pending(r);
    lg_buf_free(&r->open_text);
    lg_buf_free(&r->end_raw);
    free(r);
    ex->api_state = NULL;
}

const lg_api api_responses = {
    .route = "/v1/responses",
    .upstream_path = "/v1/responses",
    .endpoint = LG_EP_RESPONSES,
    .templated = true,
    .parse = rsp_parse,
    .build = rsp_build,
    .sampling = rsp_sampling,
    .prompt = rsp_prompt,
    .attempt_begins = rsp_attempt_begins,
    .on_event = rsp_on_event,
    .finish = rsp_finish,
    .withheld = rsp_withheld,
    .stream_error = rsp_stream_error,
    .error_body = ex_openai_error_body,
    .destroy = rsp_destroy,
};
