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
 * Batches (a list of prompts, a list of sampling_params, or n > 1): SGLang runs each sample
 * as a request of its own with its own rid (the client's rid list, "<rid>_<i>", or fresh
 * ids; tokenizer_manager._handle_batch_request) and streams their events interleaved, each
 * with "index" (the sample's place) and meta_info.id (its rid); a whole batch answers a
 * list. Each sample is guarded on a channel of its own (ex_sample_swap); a sample that
 * loops is aborted alone by its rid (/abort_request takes one rid; the others run on), its
 * loop withheld, and it ends with finish_reason {"type": "abort", ...}, as an exhausted
 * request does. A sample is not retried: its retry would be a new request outside the
 * batch's stream. Samples past GEN_BATCH_GUARDED are relayed unguarded. The upstream always streams; a whole batch is the list of the samples'
 * answers as released. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proxy/exchange_int.h"
#include "proxy/xalloc.h"

enum { MODE_UNKNOWN, MODE_CUMULATIVE, MODE_INCREMENTAL };

/* A batch's samples past this many are relayed unguarded: a guard costs 16.5-32 KiB, and a
 * batch of thousands of prompts fits in a request body. */
#define GEN_BATCH_GUARDED 256

/* One sample of a batch. */
typedef struct sample {
    char *rid;      /* meta_info.id: SGLang's rid of the sample */
    chan ch;        /* its guard and held text (swapped into the attempt's to be fed) */
    lg_buf sent;    /* its released text */
    lg_buf up_text; /* its text so far upstream */
    cJSON *last;    /* its last event (owned): the shape of its events and its answer */
    cJSON *ids;     /* whole batch, incremental stream: its output_ids (owned) */
    uint64_t tokens;
    bool over; /* ended, or cut: later events of it are dropped */
} sample;

typedef struct gen_state {
    int mode; /* the upstream's stream mode, once known */
    bool batch;
    sample *samples; /* a batch's samples by index */
    size_t n_samples;
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

/* The client's event: the upstream's event tmpl (or a skeleton) with the client's text and
 * meta_info.id (id NULL: the event's own). */
static cJSON *client_event(const cJSON *tmpl, const char *id, const char *text, size_t n)
{
    cJSON *o = dl_json_must(tmpl ? cJSON_Duplicate(tmpl, 1) : cJSON_CreateObject());
    char *t = strndup(text ? text : "", n);
    if (!t) lg_oom(n + 1);
    set_in_place(o, "text", cJSON_CreateString(t));
    free(t);
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(o, "meta_info");
    if (!cJSON_IsObject(meta)) {
        meta = dl_json_must(cJSON_CreateObject());
        dl_json_set(o, "meta_info", meta);
    }
    if (id) set_in_place(meta, "id", cJSON_CreateString(id));
    return o;
}

/* Released text for a streaming client, in an event shaped like tmpl: the text so far
 * (cumulative: the released text, a batch sample's while it is swapped in) or the piece. */
static void emit(exchange *ex, const cJSON *tmpl, const char *id, const char *piece, size_t n,
                 bool final)
{
    gen_state *g = GS(ex);
    if (!ex->req.client_stream || (!n && !final)) return;
    const lg_buf *all = &ex->cl.sent[LG_CH_CONTENT];
    cJSON *o = g->mode == MODE_INCREMENTAL ? client_event(tmpl, id, piece, n)
                                           : client_event(tmpl, id, all->p, all->len);
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

/* The new text of this event (into *delta) after the text so far `up` (of the request, or
 * of a batch's sample), learning the stream's mode on the way. */
static void new_text(gen_state *g, lg_buf *up, const cJSON *ev, const char *text, size_t n,
                     const char **delta, size_t *dn)
{
    if (g->mode == MODE_UNKNOWN) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ev, "output_ids");
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(ev, "meta_info"), "completion_tokens");
        if (cJSON_IsArray(ids) && cJSON_IsNumber(ct) && ct->valueint > 1)
            g->mode = cJSON_GetArraySize(ids) >= ct->valueint ? MODE_CUMULATIVE : MODE_INCREMENTAL;
        else if (up->len && n)
            g->mode =
                n > up->len && !memcmp(text, up->p, up->len) ? MODE_CUMULATIVE : MODE_INCREMENTAL;
    }
    bool prefix = n >= up->len && (!up->len || !memcmp(text, up->p, up->len));
    if (g->mode != MODE_INCREMENTAL && prefix) {
        *delta = text + up->len, *dn = n - up->len;
        lg_buf_reset(up);
        lg_buf_append(up, text, n);
    } else {
        *delta = text, *dn = n;
        lg_buf_append(up, text, n);
    }
}

/* An event's meta_info, and whether it ends the generation (*final); its meta_info.id is
 * kept in *id (malloc'd) when *id is still NULL. */
static const cJSON *event_meta(const cJSON *root, char **id, bool *final)
{
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "meta_info");
    const cJSON *mid = cJSON_GetObjectItemCaseSensitive(meta, "id");
    *final = cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(meta, "finish_reason"));
    if (!*id && cJSON_IsString(mid)) *id = lg_xstrdup(mid->valuestring);
    return meta;
}

/* Takes one event of a text stream (the request's, or a batch sample's): its new text after
 * the text so far *up, its output_ids kept for a whole answer, the event kept as *last. */
static void take_event(exchange *ex, const cJSON *root, lg_buf *up, cJSON *ids, cJSON **last,
                       const char **delta, size_t *dn)
{
    const char *text = cJSON_GetObjectItemCaseSensitive(root, "text")->valuestring;
    new_text(GS(ex), up, root, text, strlen(text), delta, dn);
    const cJSON *oi = cJSON_GetObjectItemCaseSensitive(root, "output_ids");
    for (const cJSON *i = cJSON_IsArray(oi) && !ex->req.client_stream ? oi->child : NULL; i;
         i = i->next) /* the whole answer's ids, should the stream be incremental */
        cJSON_AddItemToArray(ids, dl_json_must(cJSON_Duplicate(i, 0)));
    cJSON_Delete(*last);
    *last = dl_json_must(cJSON_Duplicate(root, 1));
}

/* Guards an event's new text on the content channel (the request's, or a swapped-in
 * sample's), and when the event ends the generation (final) the last checks. Returns true
 * when a guard tripped. */
static bool guard_event(exchange *ex, const cJSON *meta, const char *delta, size_t dn, bool final)
{
    if (ex_guard_text(ex, LG_CH_CONTENT, delta, dn)) return true;
    if (!final) return false;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(meta, "finish_reason"), "type");
    return ex_end_checks(ex, !cJSON_IsString(type) || strcmp(type->valuestring, "length") != 0);
}

/* Releases what the guard cleared of the content channel (all of it when final): as the
 * upstream's own event when raw_ok and nothing stays held, else an event shaped like tmpl. */
static void release_event(exchange *ex, const sse_event *ev, bool raw_ok, const cJSON *tmpl,
                          const char *id, bool final)
{
    const chan *c = &ex->at.ch[LG_CH_CONTENT];
    size_t k = final ? c->held.len : ex_releasable(ex, LG_CH_CONTENT);
    if (ex->req.client_stream && raw_ok && k == c->held.len) {
        ex_release(ex, LG_CH_CONTENT, k, NULL);
        out_append(ex, ev->raw, ev->raw_len);
        return;
    }
    lg_buf b = ex_text_borrow(ex, EX_TEXT_C);
    ex_release(ex, LG_CH_CONTENT, k, &b);
    emit(ex, tmpl, id, b.p, b.len, final);
    ex_text_return(ex, EX_TEXT_C, &b);
}

static int on_output(exchange *ex, const sse_event *ev, cJSON *root)
{
    gen_state *g = GS(ex);
    bool final;
    const cJSON *meta = event_meta(root, &g->id, &final);
    const char *delta;
    size_t dn;
    take_event(ex, root, &g->up_text, g->ids, &g->last, &delta, &dn);
    bool held_before = ex->at.ch[LG_CH_CONTENT].held.len > 0;
    if (guard_event(ex, meta, delta, dn, final)) return 1;
    if (dn) ex->at.tokens++;
    if (final) ex->at.finished_gen = true;
    release_event(ex, ev, ex->attempt == 1 && !held_before, g->last, g->id, final);
    return 0;
}

/* meta_info.finish_reason of an answer withheld (SGLang's shape of an aborted request). */
static void mark_withheld(cJSON *ev, const char *message)
{
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(ev, "meta_info");
    if (!cJSON_IsObject(meta)) {
        meta = dl_json_must(cJSON_CreateObject());
        dl_json_set(ev, "meta_info", meta);
    }
    cJSON *f = dl_json_must(cJSON_CreateObject());
    cJSON_AddStringToObject(f, "type", "abort");
    cJSON_AddStringToObject(f, "message", message);
    set_in_place(meta, "finish_reason", f);
    set_in_place(ev, "output_ids", cJSON_CreateArray());
}

/* The sample of a batch event (made when first seen), or NULL when it has none. */
static sample *sample_of(gen_state *g, const cJSON *root)
{
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(root, "index");
    if (!cJSON_IsNumber(idx) || idx->valuedouble < 0 || idx->valuedouble >= 65536) return NULL;
    size_t i = (size_t)idx->valuedouble;
    if (i >= g->n_samples) {
        g->samples = lg_xrealloc(g->samples, (i + 1) * sizeof *g->samples);
        memset(g->samples + g->n_samples, 0, (i + 1 - g->n_samples) * sizeof *g->samples);
        for (size_t k = g->n_samples; k <= i; k++)
            g->samples[k].ids = dl_json_must(cJSON_CreateArray());
        g->n_samples = i + 1;
    }
    return &g->samples[i];
}

/* One event of a batch: its sample's text, guarded on the sample's own channel. A sample
 * that loops is cut alone (ex_sample_tripped) and ends withheld; returns 1 only for an event
 * that names no sample. */
static int on_sample(exchange *ex, const sse_event *ev, cJSON *root)
{
    gen_state *g = GS(ex);
    sample *s = sample_of(g, root);
    if (!s) {
        ex_set_outcome(ex, "upstream_error");
        ex_fail(ex, 502, "the upstream sent a batch event without index", "upstream_error",
                "bad_upstream");
        return 1;
    }
    if (s->over) return 0; /* the abort's own end of a sample cut here, and anything after */
    bool final;
    const cJSON *meta = event_meta(root, &s->rid, &final);
    const char *delta;
    size_t dn;
    take_event(ex, root, &s->up_text, s->ids, &s->last, &delta, &dn);
    if (dn) s->tokens++, ex->at.tokens++;
    if (s - g->samples >= GEN_BATCH_GUARDED) {
        lg_buf_append(&s->sent, delta, dn);
        out_append(ex, ev->raw, ev->raw_len);
        s->over = final;
        return 0;
    }
    ex_sample_swap(ex, LG_CH_CONTENT, &s->ch, &s->sent);
    bool held_before = ex->at.ch[LG_CH_CONTENT].held.len > 0;
    if (guard_event(ex, meta, delta, dn, final)) {
        /* this sample alone: cut, its loop withheld, its end says so */
        ex_sample_tripped(ex, s->rid, s->tokens);
        mark_withheld(s->last, "loopguard: this sample degenerated into a loop and was cut (a "
                               "batch's samples are not retried)");
        emit(ex, s->last, NULL, "", 0, true);
        s->over = true;
    } else {
        release_event(ex, ev, !held_before, s->last, NULL, final);
        s->over = final;
    }
    ex_sample_swap(ex, LG_CH_CONTENT, &s->ch, &s->sent);
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
    cJSON *root = cJSON_ParseWithLength(ev->data, ev->data_len);
    int rc = 0;
    if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "error"))) {
        metrics_upstream_error(req_metrics(&ex->base), ex->replica, "protocol");
        ex_set_outcome(ex, "upstream_error");
        if (ex_streaming_started(ex)) {
            lg_buf b = ex_text_borrow(ex, EX_TEXT_C);
            ex_release(ex, LG_CH_CONTENT, ex->at.ch[LG_CH_CONTENT].held.len, &b);
            emit(ex, g->last, g->id, b.p, b.len, false);
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
        rc = g->batch ? on_sample(ex, ev, root) : on_output(ex, ev, root);
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
        gen_state *g = lg_xcalloc(1, sizeof *g);
        g->batch = is_batch(root);
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
    cJSON *body = dl_json_overlay(ex->req.root);
    dl_json_set(body, "stream", cJSON_CreateTrue());
    if (GS(ex)->batch) { /* its rids are the client's (or SGLang's): each sample is aborted by
                          * its own, learnt from its events */
        ex->at.rid[0] = 0;
        return dl_json_print_free(body);
    }
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
    apply_step(dl_json_overlay_member(body, "sampling_params"), ex, o);
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
    ex->cl.final_status = 200;
    if (g->batch) { /* the samples' answers, in order, as SGLang lists them */
        cJSON *list = dl_json_must(cJSON_CreateArray());
        for (size_t i = 0; i < g->n_samples; i++) {
            sample *s = &g->samples[i];
            cJSON *o = client_event(s->last, NULL, s->sent.p, s->sent.len);
            if (g->mode == MODE_INCREMENTAL &&
                cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "output_ids")))
                set_in_place(o, "output_ids", dl_json_must(cJSON_Duplicate(s->ids, 1)));
            cJSON_DeleteItemFromObjectCaseSensitive(o, "index");
            cJSON_AddItemToArray(list, o);
        }
        ex->cl.final_body = dl_json_print_free(list);
        return;
    }
    const lg_buf *all = &ex->cl.sent[LG_CH_CONTENT];
    cJSON *o = client_event(g->last, g->id, all->p, all->len);
    if (g->mode == MODE_INCREMENTAL)
        set_in_place(o, "output_ids", dl_json_must(cJSON_Duplicate(g->ids, 1)));
    ex->cl.final_body = dl_json_print_free(o);
}

/* The answer as SGLang ends an aborted request: finish_reason {"type": "abort", ...}. */
static void gen_withheld(exchange *ex)
{
    gen_state *g = GS(ex);
    if (!g->last) g->last = dl_json_must(cJSON_CreateObject());
    mark_withheld(g->last, "loopguard: the generation degenerated into a loop on every attempt");
    if (ex->req.client_stream) emit(ex, g->last, g->id, "", 0, true);
}

static void gen_stream_error(exchange *ex, int status, const char *message, const char *type,
                             const char *code)
{
    char *json = dl_error_json(message, type, code, status);
    ex_out_event(ex, json);
    free(json);
    gen_end_stream(ex);
}

/* A batch abandoned: every sample still running is aborted by its rid. */
static void gen_abandon(exchange *ex)
{
    gen_state *g = GS(ex);
    for (size_t i = 0; i < g->n_samples; i++)
        if (!g->samples[i].over && g->samples[i].rid)
            lg_buf_append(&ex->at.aborts, g->samples[i].rid, strlen(g->samples[i].rid) + 1);
}

static void gen_destroy(exchange *ex)
{
    gen_state *g = GS(ex);
    if (!g) return;
    for (size_t i = 0; i < g->n_samples; i++) {
        sample *s = &g->samples[i];
        free(s->rid);
        worker_guard_put(ex->base.w, s->ch.g);
        lg_buf_free(&s->ch.held);
        lg_buf_free(&s->sent);
        lg_buf_free(&s->up_text);
        cJSON_Delete(s->last);
        cJSON_Delete(s->ids);
    }
    free(g->samples);
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
    .abandon = gen_abandon,
    .destroy = gen_destroy,
};
