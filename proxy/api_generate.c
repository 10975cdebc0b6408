/* api_generate.c — SGLang's native /generate as an API module (api.h).
 *
 * Request: {"text" | "input_ids", "sampling_params": {...}, "stream", "rid",
 * "return_logprob", ...}. Stream: `data: {"text", "output_ids", "meta_info": {"id",
 * "finish_reason", "prompt_tokens", "completion_tokens", ...}}` per step, then
 * `data: [DONE]`; finish_reason is null until the last event, then an object such as
 * {"type": "stop", "matched": 151645}, {"type": "length", "length": N} or {"type": "abort",
 * "message": ...}. By default `text` and `output_ids` are everything so far; with the
 * server's --incremental-streaming-output they are the new part only. The module learns
 * which from the first events — output_ids as long as meta_info.completion_tokens means
 * cumulative; else the text: an event whose text extends the text so far is cumulative —
 * derives each event's new text, guards it (one channel: the answer; the text is raw model
 * output, reasoning and </think> included, so it is guarded like a text completion) and
 * writes the client's events in the upstream's own mode: the text so far, or the released
 * piece.
 *
 * Retries set sampling_params (temperature, presence_penalty, frequency_penalty,
 * repetition_penalty, sampling_seed: SGLang's SamplingParams names) and a new rid; a
 * streaming client's retry continues its clean prefix when the prompt is text (the prefix is
 * appended to it). The client sees the first attempt's meta_info.id throughout.
 * Withheld: meta_info.finish_reason {"type": "abort", "message": ...}, as SGLang reports an
 * aborted request.
 *
 * Batch requests (a list of prompts, a list of sampling_params, or n > 1) are relayed
 * unguarded: SGLang gives each sample a rid of its own and could abort one, but a retry of
 * one sample inside a batch stream is not built; the README says so. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/exchange_int.h"
#include "proxy/xalloc.h"

enum { MODE_UNKNOWN, MODE_CUMULATIVE, MODE_INCREMENTAL };

typedef struct gen_state {
    int mode;        /* the upstream's stream mode, once known */
    lg_buf up_text;  /* this attempt's text so far */
    char *id;        /* the meta_info.id the client sees (the first attempt's) */
    cJSON *last;     /* the last event of the current attempt (owned): the shape */
    cJSON *ids;      /* whole answer: every event's output_ids, in order (owned) */
    lg_buf done_raw; /* the upstream's own [DONE] */
} gen_state;

static gen_state *GS(const exchange *ex)
{
    return ex->api_state;
}

/* ---- client output ----------------------------------------------------------------- */

/* obj[key] = item, in the place the key had (the upstream's key order), else appended. */
static void set_in_place(cJSON *obj, const char *key, cJSON *item)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, key)) {
        if (!cJSON_ReplaceItemInObjectCaseSensitive(obj, key, dl_json_must(item))) lg_oom(0);
    } else {
        dl_json_set(obj, key, item);
    }
}

/* The client's event: the upstream's event (or a skeleton) with the client's text and id. */
static cJSON *client_event(exchange *ex, const char *text, size_t n)
{
    gen_state *g = GS(ex);
    cJSON *o = dl_json_must(g->last ? cJSON_Duplicate(g->last, 1) : cJSON_CreateObject());
    char *t = strndup(text ? text : "", n);
    if (!t) lg_oom(n + 1);
    set_in_place(o, "text", cJSON_CreateString(t));
    free(t);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(o, "meta_info");
    if (!cJSON_IsObject(meta)) {
        meta = dl_json_must(cJSON_CreateObject());
        dl_json_set(o, "meta_info", meta);
    }
    if (g->id) set_in_place(meta, "id", cJSON_CreateString(g->id));
    return o;
}

/* Released text for a streaming client: the text so far (cumulative) or the piece. */
static void emit(exchange *ex, const char *piece, size_t n, bool final)
{
    gen_state *g = GS(ex);
    if (!ex->req.client_stream || (!n && !final)) return;
    const lg_buf *all = &ex->cl.sent[LG_CH_CONTENT];
    cJSON *o = g->mode == MODE_INCREMENTAL ? client_event(ex, piece, n)
                                           : client_event(ex, all->p, all->len);
    if (!final) { /* the upstream's finish goes out with the last event only */
        cJSON *meta = cJSON_GetObjectItemCaseSensitive(o, "meta_info");
        if (cJSON_GetObjectItemCaseSensitive(meta, "finish_reason"))
            set_in_place(meta, "finish_reason", cJSON_CreateNull());
    }
    char *json = dl_json_print_free(o);
    ex_out_event(ex, json);
    free(json);
}

/* ---- upstream events --------------------------------------------------------------- */

/* The new text of this event (into *delta), learning the stream's mode on the way. */
static void new_text(gen_state *g, const cJSON *ev, const char *text, size_t n, const char **delta,
                     size_t *dn)
{
    if (g->mode == MODE_UNKNOWN) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ev, "output_ids");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(ev, "meta_info"), "completion_tokens");
        if (cJSON_IsArray(ids) && cJSON_IsNumber(ct) && ct->valueint > 1)
            g->mode = cJSON_GetArraySize(ids) >= ct->valueint ? MODE_CUMULATIVE : MODE_INCREMENTAL;
        else if (g->up_text.len && n)
            g->mode = n > g->up_text.len && !memcmp(text, g->up_text.p, g->up_text.len)
                          ? MODE_CUMULATIVE
                          : MODE_INCREMENTAL;
    }
    bool prefix =
        n >= g->up_text.len && (!g->up_text.len || !memcmp(text, g->up_text.p, g->up_text.len));
    if (g->mode != MODE_INCREMENTAL && prefix) {
        *delta = text + g->up_text.len, *dn = n - g->up_text.len;
        lg_buf_reset(&g->up_text);
        lg_buf_append(&g->up_text, text, n);
    } else {
        *delta = text, *dn = n;
        lg_buf_append(&g->up_text, text, n);
    }
}

static int on_output(exchange *ex, const sse_event *ev, cJSON *root)
{
    gen_state *g = GS(ex);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "meta_info");
    const cJSON *fin = cJSON_GetObjectItemCaseSensitive(meta, "finish_reason");
    const char *id = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(meta, "id"))
                         ? cJSON_GetObjectItemCaseSensitive(meta, "id")->valuestring
                         : NULL;
    if (!g->id && id) g->id = lg_xstrdup(id);
    const char *delta;
    size_t dn;
    new_text(g, root, t->valuestring, strlen(t->valuestring), &delta, &dn);
    if (!ex->req.client_stream) { /* the whole answer's ids, should the stream be incremental */
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "output_ids");
        for (const cJSON *i = cJSON_IsArray(ids) ? ids->child : NULL; i; i = i->next)
            cJSON_AddItemToArray(g->ids, dl_json_must(cJSON_Duplicate(i, 0)));
    }
    cJSON_Delete(g->last);
    g->last = dl_json_must(cJSON_Duplicate(root, 1));

    bool held_before = ex->at.ch[LG_CH_CONTENT].held.len > 0;
    if (ex_guard_text(ex, LG_CH_CONTENT, delta, dn)) return 1;
    if (dn) ex->at.tokens++;
    bool final = cJSON_IsObject(fin);
    if (final) {
        const char *type = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fin, "type"))
                               ? cJSON_GetObjectItemCaseSensitive(fin, "type")->valuestring
                               : "";
        if (ex_end_checks(ex, strcmp(type, "length") != 0)) return 1;
        ex->at.finished_gen = true;
    }
    const chan *c = &ex->at.ch[LG_CH_CONTENT];
    size_t k = final ? c->held.len : ex_releasable(ex, LG_CH_CONTENT);
    if (ex->req.client_stream && ex->attempt == 1 && !held_before && k == c->held.len) {
        ex_release(ex, LG_CH_CONTENT, k, NULL);
        out_append(ex, ev->raw, ev->raw_len);
        return 0;
    }
    lg_buf b = ex_text_borrow(ex, EX_TEXT_C);
    ex_release(ex, LG_CH_CONTENT, k, &b);
    emit(ex, b.p, b.len, final);
    ex_text_return(ex, EX_TEXT_C, &b);
    return 0;
}

static int gen_on_event(exchange *ex, const sse_event *ev)
{
    gen_state *g = GS(ex);
    if (ev->data_len == 6 && !memcmp(ev->data, "[DONE]", 6)) {
        ex->at.saw_done = true;
        lg_buf_reset(&g->done_raw);
        lg_buf_append(&g->done_raw, ev->raw, ev->raw_len);
        return 0;
    }
    if (ex->passthrough) { /* a batch: every event as it came */
        out_append(ex, ev->raw, ev->raw_len);
        return 0;
    }
    cJSON *root = cJSON_ParseWithLength(ev->data, ev->data_len);
    int rc = 0;
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "error"))) {
        metrics_upstream_error(req_metrics(&ex->base), ex->replica, "protocol");
        ex_set_outcome(ex, "upstream_error");
        if (ex_streaming_started(ex)) {
            lg_buf b = ex_text_borrow(ex, EX_TEXT_C);
            ex_release(ex, LG_CH_CONTENT, ex->at.ch[LG_CH_CONTENT].held.len, &b);
            emit(ex, b.p, b.len, false);
            ex_text_return(ex, EX_TEXT_C, &b);
            out_append(ex, ev->raw, ev->raw_len);
            ex->at.finished_gen = true; /* [DONE] follows the error */
        } else {
            ex_fail_whole(ex, 502, dl_json_print_free(dl_json_must(cJSON_Duplicate(root, 1))));
        }
    } else if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "text"))) {
        metrics_upstream_error(req_metrics(&ex->base), ex->replica, "protocol");
        ex_set_outcome(ex, "upstream_error");
        ex_fail(ex, 502, "the upstream sent a malformed event", "upstream_error", "bad_upstream");
        rc = 1;
    } else {
        rc = on_output(ex, ev, root);
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- the module's hooks ------------------------------------------------------------- */

static bool is_batch(const cJSON *root)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "sampling_params");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(sp, "n");
    return cJSON_IsArray(text) || (cJSON_IsArray(ids) && cJSON_IsArray(ids->child)) ||
           cJSON_IsArray(sp) || (cJSON_IsNumber(n) && n->valuedouble > 1);
}

static int gen_parse(exchange *ex, const char *body, size_t len, rw_error *err)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    *err = (rw_error){.status = 400};
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "sampling_params");
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(root, "stream");
    if (!cJSON_IsObject(root)) {
        err->message = "the request body must be a JSON object";
    } else if (!cJSON_IsString(text) && !cJSON_IsArray(text) && !cJSON_IsArray(ids)) {
        err->message = "text or input_ids is required";
        err->param = "text";
    } else if (sp && !cJSON_IsObject(sp) && !cJSON_IsArray(sp) && !cJSON_IsNull(sp)) {
        err->message = "sampling_params must be an object";
        err->param = "sampling_params";
    } else if (stream && !cJSON_IsBool(stream) && !cJSON_IsNull(stream)) {
        err->message = "stream: a boolean is required";
        err->param = "stream";
    } else {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(sp, "temperature");
        ex->req = (rw_request){.root = root,
                               .client_stream = cJSON_IsTrue(stream),
                               .n = 1,
                               .temperature = cJSON_IsNumber(t) ? t->valuedouble : 0,
                               .has_temperature = cJSON_IsNumber(t),
                               .enable_thinking = -1,
                               .prompt_is_string = cJSON_IsString(text)};
        ex->passthrough = is_batch(root);
        gen_state *g = lg_xcalloc(1, sizeof *g);
        g->ids = dl_json_must(cJSON_CreateArray());
        ex->api_state = g;
        return 0;
    }
    cJSON_Delete(root);
    return -1;
}

/* The retry step in SGLang's sampling_params names (obj: sampling_params or a record). */
static void apply_step(cJSON *obj, const exchange *ex, const rw_opts *o)
{
    const lg_sampling_step *st = o->step;
    if (!st) return;
    if (st->temperature_add != 0)
        dl_json_set(obj, "temperature", cJSON_CreateNumber(rw_step_temperature(&ex->req, st)));
    if (st->has_presence_penalty)
        dl_json_set(obj, "presence_penalty", cJSON_CreateNumber(st->presence_penalty));
    if (st->has_frequency_penalty)
        dl_json_set(obj, "frequency_penalty", cJSON_CreateNumber(st->frequency_penalty));
    if (st->has_repetition_penalty)
        dl_json_set(obj, "repetition_penalty", cJSON_CreateNumber(st->repetition_penalty));
    if (st->new_seed) dl_json_set(obj, "sampling_seed", cJSON_CreateNumber((double)o->seed));
}

static char *gen_build(exchange *ex, const rw_opts *o, rw_error *err)
{
    (void)err;
    cJSON *body = dl_json_must(cJSON_Duplicate(ex->req.root, 1));
    if (ex->passthrough) return dl_json_print_free(body); /* a batch: as sent */
    dl_json_set(body, "stream", cJSON_CreateTrue());
    /* The client's own rid is kept (the client may abort by it): as it is on the first
     * attempt, with "-lg<attempt>" on retries; the exchange aborts by the rid sent. */
    const cJSON *crid = cJSON_GetObjectItemCaseSensitive(ex->req.root, "rid");
    if (o->rid && cJSON_IsString(crid) && strlen(crid->valuestring) + 8 < sizeof ex->at.rid) {
        if (ex->attempt == 1)
            snprintf(ex->at.rid, sizeof ex->at.rid, "%s", crid->valuestring);
        else
            snprintf(ex->at.rid, sizeof ex->at.rid, "%s-lg%u", crid->valuestring, ex->attempt);
    }
    if (o->rid) dl_json_set(body, "rid", cJSON_CreateString(ex->at.rid));
    cJSON *sp = cJSON_GetObjectItemCaseSensitive(body, "sampling_params");
    if (!cJSON_IsObject(sp)) {
        sp = dl_json_must(cJSON_CreateObject());
        dl_json_set(body, "sampling_params", sp);
    }
    apply_step(sp, ex, o);
    if (o->continue_text) { /* the client's clean prefix, appended to the prompt */
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(body, "text");
        lg_buf b = LG_BUF_INIT;
        lg_buf_append_str(&b, text->valuestring);
        lg_buf_append(&b, o->continue_text, o->continue_len);
        dl_json_set(body, "text", cJSON_CreateString(b.p));
        lg_buf_free(&b);
    }
    return dl_json_print_free(body);
}

static cJSON *gen_sampling(const exchange *ex, const rw_opts *o)
{
    static const char *const keys[] = {
        "temperature",        "top_p",        "top_k", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "sampling_seed"};
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(ex->req.root, "sampling_params");
    cJSON *obj = dl_json_must(cJSON_CreateObject());
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(sp, keys[i]);
        if (cJSON_IsNumber(v)) dl_json_set(obj, keys[i], cJSON_CreateNumber(v->valuedouble));
    }
    apply_step(obj, ex, o);
    return obj;
}

static cJSON *gen_prompt(const exchange *ex, bool full)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(ex->req.root, "text");
    if (cJSON_IsString(text) || full)
        return text ? cJSON_Duplicate(text, 1)
                    : cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(ex->req.root, "input_ids"),
                                      1);
    return NULL;
}

static void gen_attempt_begins(exchange *ex, bool restart)
{
    gen_state *g = GS(ex);
    (void)restart; /* the whole answer is the released text */
    lg_buf_reset(&g->up_text);
    cJSON_Delete(g->ids);
    g->ids = dl_json_must(cJSON_CreateArray());
}

static void gen_end_stream(exchange *ex)
{
    gen_state *g = GS(ex);
    if (g->done_raw.len && !ex->rec.trips)
        ex_end_stream(ex, g->done_raw.p, g->done_raw.len);
    else
        ex_end_stream(ex, "data: [DONE]\n\n", 14);
}

static void gen_finish(exchange *ex)
{
    gen_state *g = GS(ex);
    if (ex->req.client_stream) {
        gen_end_stream(ex);
        return;
    }
    const lg_buf *all = &ex->cl.sent[LG_CH_CONTENT];
    cJSON *o = client_event(ex, all->p, all->len);
    if (g->mode == MODE_INCREMENTAL)
        set_in_place(o, "output_ids", dl_json_must(cJSON_Duplicate(g->ids, 1)));
    ex->cl.final_status = 200;
    ex->cl.final_body = dl_json_print_free(o);
}

/* The answer as SGLang ends an aborted request: finish_reason {"type": "abort", ...}. */
static void gen_withheld(exchange *ex)
{
    gen_state *g = GS(ex);
    if (!g->last) g->last = dl_json_must(cJSON_CreateObject());
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(g->last, "meta_info");
    if (!cJSON_IsObject(meta)) {
        meta = dl_json_must(cJSON_CreateObject());
        dl_json_set(g->last, "meta_info", meta);
    }
    cJSON *f = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(f, "type", "abort");
    cJSON_AddStringToObject(f, "message",
                            "loopguard: the generation degenerated into a loop on every attempt");
    set_in_place(meta, "finish_reason", f);
    set_in_place(g->last, "output_ids", cJSON_CreateArray());
    if (ex->req.client_stream) emit(ex, "", 0, true);
}

static void gen_stream_error(exchange *ex, int status, const char *message, const char *type,
                             const char *code)
{
    char *json = dl_error_json(message, type, code, status);
    ex_out_event(ex, json);
    free(json);
    gen_end_stream(ex);
}

static void gen_destroy(exchange *ex)
{
    gen_state *g = GS(ex);
    if (!g) return;
    lg_buf_free(&g->up_text);
    lg_buf_free(&g->done_raw);
    free(g->id);
    cJSON_Delete(g->last);
    cJSON_Delete(g->ids);
    free(g);
    ex->api_state = NULL;
}

const lg_api api_generate = {
    .route = "/generate",
    .upstream_path = "/generate",
    .endpoint = LG_EP_GENERATE,
    .templated = false,
    .can_continue = true,
    .takes_rid = true,
    .parse = gen_parse,
    .build = gen_build,
    .sampling = gen_sampling,
    .prompt = gen_prompt,
    .attempt_begins = gen_attempt_begins,
    .on_event = gen_on_event,
    .finish = gen_finish,
    .withheld = gen_withheld,
    .stream_error = gen_stream_error,
    .error_body = ex_openai_error_body,
    .destroy = gen_destroy,
};
