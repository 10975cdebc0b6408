/* fake_gen.c — the fake upstream's generator: plans, pacing, tokens in each endpoint's
 * shape, faults (see fake_int.h). */
#include "fake_int.h"

/* What the garbage fault writes (documented in the README). */
static const char junk[] = "this is not sse\n{\"partial\": tru\n: comment\nevent: junk\n\n";

/* ---- a generation's end ---- */

static void gen_free(gen *g)
{
    if (!g) return;
    for (size_t i = 0; i < g->nkids; i++)
        gen_free(g->kids[i]);
    free(g->kids);
    fake_plan_free(&g->plan);
    fake_scenario_unref(g->sc);
    free(g->rid);
    free(g->model);
    fbuf_free(&g->ev);
    fbuf_free(&g->head);
    fbuf_free(&g->reasoning);
    fbuf_free(&g->content);
    for (size_t i = 0; i < g->ntools; i++) {
        fbuf_free(&g->args[i]);
        free(g->tool_ids[i]);
    }
    free(g->args);
    free(g->tool_ids);
    fake_resp_free(&g->resp);
    free(g);
}

/* Ends c's generation (recording how it ended) and unlinks it. */
void gen_end(server *s, conn *c, const char *ended, bool client_gone)
{
    gen *g = c->g;
    if (!g) return;
    for (size_t i = 0; i < g->nkids; i++) /* a batch: the samples still running end too */
        if (!g->kids[i]->ended) {
            record_generation(s, g->kids[i], ended, client_gone);
            s->n_tokens += g->kids[i]->sent;
        }
    if (!g->nkids) record_generation(s, g, ended, client_gone);
    s->n_tokens += g->sent;
    s->n_active--;
    gen_free(g);
    c->g = NULL;
}

/* ---- generation ---- */

/* Writes v as JSON text into buf, or dflt when v is NULL. */
static void json_or_default(const cJSON *v, const char *dflt, char *buf, size_t n)
{
    char *p = v ? cJSON_PrintUnformatted(v) : NULL;
    snprintf(buf, n, "%s", p ? p : dflt);
    free(p);
}

static long body_long(const cJSON *o, const char *key, long dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? (long)v->valuedouble : dflt;
}

static fake_rmode reasoning_mode(fake_dialect d, fake_endpoint ep)
{
    if (ep == FAKE_EP_GENERATE) return FAKE_R_INLINE_NO_OPEN;
    if (ep == FAKE_EP_COMPLETION || d == FAKE_D_INLINE) return FAKE_R_INLINE;
    return d == FAKE_D_OPENAI ? FAKE_R_DROP : FAKE_R_SEPARATE;
}

/* Sets up a generation for the request on c using response ri. Returns NULL on
 * out-of-memory. */
gen *gen_new(server *s, conn *c, const cJSON *body, fake_endpoint ep, int ri)
{
    static const char dflt_scenario[] =
        "{\"responses\":[{\"content\":[\"Hello from the fake upstream.\"]}]}";
    static fake_scenario *fallback;
    gen *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->index = -1;
    if (ri >= 0) {
        g->sc = fake_scenario_ref(s->sc);
        g->r = &s->sc->resp[ri];
    } else {
        /* No response fits: the built-in clean answer (parsed once, kept forever). */
        char err[128];
        if (!fallback)
            fallback = fake_scenario_parse(dflt_scenario, strlen(dflt_scenario), err, sizeof err);
        g->sc = fake_scenario_ref(fallback);
        g->r = &fallback->resp[0];
    }
    g->resp_index = ri;
    g->t_start = c->t_req;
    g->path = ep == FAKE_EP_CHAT         ? "/v1/chat/completions"
              : ep == FAKE_EP_COMPLETION ? "/v1/completions"
              : ep == FAKE_EP_MESSAGES   ? "/v1/messages"
              : ep == FAKE_EP_RESPONSES  ? "/v1/responses"
                                         : "/generate";
    const fake_resp *r = g->r;
    fake_dialect d = s->dialect;

    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(body, "rid");
    if (cJSON_IsString(rid)) g->rid = strdup(rid->valuestring);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(body, "model");
    g->model = strdup(cJSON_IsString(model) ? model->valuestring : s->model);
    const cJSON *reqid = cJSON_GetObjectItemCaseSensitive(body, "request_id");
    char hex[40];
    rand_hex(s, hex, 32);
    if (ep == FAKE_EP_RESPONSES) /* rendered as resp_<hex> */
        snprintf(g->id, sizeof g->id, "%s", hex);
    else if (ep == FAKE_EP_MESSAGES) /* sglang: msg_<uuid hex>; vllm: the chat chunk's id */
        snprintf(g->id, sizeof g->id, "%s%s", fake_dialect_is_vllm(d) ? "chatcmpl-" : "msg_", hex);
    else if (fake_dialect_is_sglang(d) || ep == FAKE_EP_GENERATE)
        snprintf(g->id, sizeof g->id, "%s", g->rid ? g->rid : hex);
    else
        snprintf(g->id, sizeof g->id, "%s-%.80s", ep == FAKE_EP_CHAT ? "chatcmpl" : "cmpl",
                 cJSON_IsString(reqid) && fake_dialect_is_vllm(d) ? reqid->valuestring : hex);
    g->ctx = (fake_ctx){.d = d, .ep = ep, .id = g->id, .model = g->model, .created = time(NULL)};
    fake_render_chunk_head(&g->head, &g->ctx);
    g->ctx.head = g->head.p;
    g->ctx.head_len = g->head.len;

    g->stream = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(body, "stream"));
    g->usage = g->stream && ep != FAKE_EP_GENERATE &&
               cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(
                   cJSON_GetObjectItemCaseSensitive(body, "stream_options"), "include_usage"));
    if (ep == FAKE_EP_GENERATE)
        g->cap = body_long(cJSON_GetObjectItemCaseSensitive(body, "sampling_params"),
                           "max_new_tokens", 0);
    else
        g->cap = body_long(body, "max_completion_tokens",
                           body_long(body, "max_tokens", body_long(body, "max_output_tokens", 0)));
    g->prompt_tokens = r->prompt_tokens >= 0 ? r->prompt_tokens : fake_prompt_tokens(body);

    if (fake_plan_init(&g->plan, r, reasoning_mode(d, ep), g->cap, s->cfg.stamp) < 0) {
        gen_free(g);
        return NULL;
    }
    if (g->cap <= 0) g->cap = 4096;
    long pace = r->pace_us >= 0       ? r->pace_us
                : g->sc->pace_us >= 0 ? g->sc->pace_us
                                      : s->cfg.pace_ms * 1000;
    long fb = r->first_byte_ms >= 0       ? r->first_byte_ms
              : g->sc->first_byte_ms >= 0 ? g->sc->first_byte_ms
                                          : 0;
    g->pace_ns = pace > 0 ? (uint64_t)pace * 1000 : 0;
    g->wake = c->t_req + (uint64_t)fb * NS_PER_MS;
    g->phase = PH_DELAY;

    g->finish = g->plan.cut        ? "length"
                : r->finish_reason ? r->finish_reason
                : r->ntools        ? "tool_calls"
                                   : "stop";
    if (!strcmp(g->finish, "stop"))
        json_or_default(r->matched_stop, "151645", g->matched_stop, sizeof g->matched_stop);
    else
        snprintf(g->matched_stop, sizeof g->matched_stop, "null");
    json_or_default(r->stop_reason, "null", g->stop_reason, sizeof g->stop_reason);

    g->ntools = r->ntools;
    if (g->ntools) {
        g->args = calloc(g->ntools, sizeof *g->args);
        g->tool_ids = calloc(g->ntools, sizeof *g->tool_ids);
        if (!g->args || !g->tool_ids) {
            gen_free(g);
            return NULL;
        }
        for (size_t i = 0; i < g->ntools; i++) {
            char buf[64];
            rand_hex(s, hex, fake_dialect_is_vllm(d) ? 32 : 24);
            snprintf(buf, sizeof buf, "%s%s", fake_dialect_is_vllm(d) ? "chatcmpl-tool-" : "call_",
                     hex);
            g->tool_ids[i] = strdup(r->tools[i].id ? r->tools[i].id : buf);
        }
    }
    return g;
}

bool fake_generate_is_batch(const cJSON *body)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(body, "text");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(body, "input_ids");
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(body, "sampling_params"), "n");
    return cJSON_IsArray(text) || (cJSON_IsArray(ids) && cJSON_IsArray(ids->child)) ||
           (cJSON_IsNumber(n) && n->valuedouble > 1);
}

/* Sample `k` of prompt `i`: the body with that prompt, its sampling_params and its rid. */
static cJSON *sample_body(const cJSON *body, int i, const char *rid)
{
    cJSON *b = cJSON_Duplicate(body, 1);
    if (!b) return NULL;
    const char *key = cJSON_GetObjectItemCaseSensitive(body, "text") ? "text" : "input_ids";
    const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(body, key);
    if (cJSON_IsArray(prompts) && (!strcmp(key, "text") || cJSON_IsArray(prompts->child)))
        cJSON_ReplaceItemInObjectCaseSensitive(b, key,
                                               cJSON_Duplicate(cJSON_GetArrayItem(prompts, i), 1));
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(body, "sampling_params");
    if (cJSON_IsArray(sp))
        cJSON_ReplaceItemInObjectCaseSensitive(b, "sampling_params",
                                               cJSON_Duplicate(cJSON_GetArrayItem(sp, i), 1));
    cJSON_DeleteItemFromObjectCaseSensitive(b, "rid");
    cJSON_AddStringToObject(b, "rid", rid);
    return b;
}

gen *gen_new_batch(server *s, conn *c, const cJSON *body, const cJSON *headers, char *err,
                   size_t errn)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(body, "text");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(body, "input_ids");
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(body, "sampling_params");
    const cJSON *rid = cJSON_GetObjectItemCaseSensitive(body, "rid");
    const cJSON *nv = cJSON_GetObjectItemCaseSensitive(sp, "n");
    int batch = cJSON_IsArray(text)                               ? cJSON_GetArraySize(text)
                : cJSON_IsArray(ids) && cJSON_IsArray(ids->child) ? cJSON_GetArraySize(ids)
                                                                  : 1;
    int n = cJSON_IsNumber(nv) && nv->valuedouble > 1 ? (int)nv->valuedouble : 1;
    err[0] = 0;
    if (cJSON_IsArray(rid) && cJSON_GetArraySize(rid) != batch) {
        snprintf(err, errn,
                 "The specified rids length mismatch with the batch_size for batch "
                 "processing.");
        return NULL;
    }
    if (cJSON_IsArray(sp) && cJSON_GetArraySize(sp) != batch) {
        snprintf(err, errn, "The sampling_params length mismatch with the batch_size.");
        return NULL;
    }
    if (batch < 1 || batch > 1024) {
        snprintf(err, errn, "A batch holds 1 to 1024 prompts.");
        return NULL;
    }
    /* The parent frames the stream (its own plan stays unused); it paces as sample 0. */
    cJSON *first = sample_body(body, 0, "");
    gen *g = first ? gen_new(s, c, first, FAKE_EP_GENERATE, -1) : NULL;
    cJSON_Delete(first);
    if (!g || !(g->kids = calloc((size_t)batch * (size_t)n, sizeof *g->kids))) {
        gen_free(g);
        return NULL;
    }
    for (int i = 0; i < batch; i++)
        for (int k = 0; k < n; k++) {
            char r[80], hex[40];
            rand_hex(s, hex, 32);
            if (n == 1 && cJSON_IsArray(rid) && cJSON_IsString(cJSON_GetArrayItem(rid, i)))
                snprintf(r, sizeof r, "%.79s", cJSON_GetArrayItem(rid, i)->valuestring);
            else if (n == 1 && cJSON_IsString(rid))
                snprintf(r, sizeof r, "%.60s_%d", rid->valuestring, i);
            else
                snprintf(r, sizeof r, "%s", hex);
            cJSON *sb = sample_body(body, i, r);
            gen *kid = sb ? gen_new(s, c, sb, FAKE_EP_GENERATE,
                                    fake_scenario_match(s->sc, "/generate", headers, sb))
                          : NULL;
            cJSON_Delete(sb);
            if (!kid) {
                gen_free(g);
                return NULL;
            }
            kid->index = (int)g->nkids;
            g->kids[g->nkids++] = kid;
        }
    g->pace_ns = g->kids[0]->pace_ns;
    g->wake = g->kids[0]->wake;
    return g;
}

static void emit_delta(conn *c, const fake_delta *d)
{
    gen *g = c->g;
    fbuf_reset(&g->ev);
    fake_render_chunk(&g->ev, &g->ctx, d);
    put_event(c, g->ev.p, g->ev.len);
}

static fake_delta delta_init(const gen *g)
{
    fake_delta d = {0};
    d.tool = -1;
    d.matched_stop = g->matched_stop;
    d.stop_reason = g->stop_reason;
    return d;
}

static fake_usage usage_of(const gen *g)
{
    return (fake_usage){g->prompt_tokens, g->sent, g->reasoning_sent};
}

static double latency_s(const gen *g)
{
    return (double)(fake_now_ns() - g->t_start) / 1e9;
}

/* One /generate event: the text so far; finish NULL until the last. */
static void emit_generate(server *s, conn *c, const char *finish)
{
    gen *g = c->g;
    fake_usage u = usage_of(g);
    bool inc = s->cfg.incremental;
    fbuf_reset(&g->ev);
    fake_render_generate(&g->ev, &g->ctx, &g->content, inc ? g->gen_text_sent : 0,
                         inc ? g->gen_ids_sent : 0, g->sent, finish, g->cap, &u, latency_s(g),
                         g->index);
    g->gen_text_sent = g->content.len;
    g->gen_ids_sent = g->sent;
    put_event(c, g->ev.p, g->ev.len);
}

/* Appends token t's text to the whole-response buffers, which only a whole response and
 * /generate's events read (a stream elsewhere sends each token as it goes). */
static void accumulate(gen *g, const fake_token *t)
{
    if (g->stream && g->ctx.ep != FAKE_EP_GENERATE) return;
    switch (t->ch) {
    case FAKE_CH_REASONING:
        fbuf_put(&g->reasoning, t->p, t->n);
        break;
    case FAKE_CH_CONTENT:
        fbuf_put(&g->content, t->p, t->n);
        break;
    case FAKE_CH_TOOL_HEAD:
        break;
    case FAKE_CH_TOOL_ARGS:
        fbuf_put(&g->args[t->tool], t->p, t->n);
        break;
    }
}

/* Produces the next token (two when vLLM merges the reasoning/content boundary) and, when
 * streaming, writes its event. Returns false when the plan is exhausted. */
static bool emit_token(server *s, conn *c)
{
    gen *g = c->g;
    fake_token t, t2;
    if (!fake_plan_next(&g->plan, &t)) return false;
    g->sent++;
    if (t.reasoning) g->reasoning_sent++;
    accumulate(g, &t);
    fake_delta d = delta_init(g);
    bool merged = false;
    fbuf *hold = &s->tmp;
    if (t.ch == FAKE_CH_REASONING && t.last_of_part && g->r->merge_boundary &&
        fake_dialect_is_vllm(g->ctx.d)) {
        /* t's text may live in the plan's scratch: keep a copy before peeking. */
        fbuf_reset(hold);
        fbuf_put(hold, t.p, t.n);
        t.p = hold->p;
        if (fake_plan_next(&g->plan, &t2)) {
            g->sent++;
            accumulate(g, &t2);
            if (t2.ch == FAKE_CH_CONTENT) {
                merged = true;
                d.reasoning = t.p, d.rn = t.n;
                d.content = t2.p, d.cn = t2.n;
            } else {
                /* Not a content token: send both deltas separately. */
                fake_delta d1 = delta_init(g);
                d1.reasoning = t.p, d1.rn = t.n;
                if (g->stream) emit_delta(c, &d1);
                t = t2;
            }
        }
    }
    if (!merged) {
        switch (t.ch) {
        case FAKE_CH_REASONING:
            d.reasoning = t.p, d.rn = t.n;
            break;
        case FAKE_CH_CONTENT:
            d.content = t.p, d.cn = t.n;
            break;
        case FAKE_CH_TOOL_HEAD:
            d.tool = t.tool, d.tool_id = g->tool_ids[t.tool], d.tool_name = t.p;
            break;
        case FAKE_CH_TOOL_ARGS:
            d.tool = t.tool, d.args = t.p, d.an = t.n;
            break;
        }
    }
    if (!g->stream) return true;
    bool last = g->plan.total != LONG_MAX && g->sent >= g->plan.total;
    if (last && !fake_dialect_separate_finish(g->ctx.d, g->ctx.ep)) {
        d.finish = g->finish;
        g->finish_sent = true;
    }
    if (g->ctx.ep == FAKE_EP_GENERATE) {
        emit_generate(s, c, d.finish);
    } else if (g->ctx.ep == FAKE_EP_RESPONSES) {
        if (merged) {
            fake_resp_token(&c->out, &g->ev, &g->resp, FAKE_ITEM_REASONING, t.p, t.n, NULL, NULL);
            t = t2;
        }
        bool head = t.ch == FAKE_CH_TOOL_HEAD;
        fake_item k = t.ch == FAKE_CH_REASONING ? FAKE_ITEM_REASONING
                      : t.ch == FAKE_CH_CONTENT ? FAKE_ITEM_MESSAGE
                                                : FAKE_ITEM_CALL;
        fake_resp_token(&c->out, &g->ev, &g->resp, k, head ? NULL : t.p, head ? 0 : t.n,
                        head ? g->tool_ids[t.tool] : NULL, head ? t.p : NULL);
    } else if (g->ctx.ep == FAKE_EP_MESSAGES) {
        fake_blk k = t.ch == FAKE_CH_REASONING ? FAKE_BLK_THINKING
                     : t.ch == FAKE_CH_CONTENT ? FAKE_BLK_TEXT
                                               : FAKE_BLK_TOOL;
        if (merged) /* vLLM's merge_boundary: both tokens, each in its block */
            fake_msg_token(&c->out, &g->ev, &g->msg, FAKE_BLK_THINKING, t.p, t.n, NULL, NULL);
        if (merged) k = FAKE_BLK_TEXT, t = t2;
        fake_msg_token(&c->out, &g->ev, &g->msg, k, t.ch == FAKE_CH_TOOL_HEAD ? NULL : t.p,
                       t.ch == FAKE_CH_TOOL_HEAD ? 0 : t.n,
                       t.ch == FAKE_CH_TOOL_HEAD ? g->tool_ids[t.tool] : NULL,
                       t.ch == FAKE_CH_TOOL_HEAD ? t.p : NULL);
    } else {
        emit_delta(c, &d);
    }
    return true;
}

/* The end of every stream: the usage chunk when asked for, [DONE], the last HTTP chunk. */
static void put_tail(conn *c)
{
    gen *g = c->g;
    if (g->ctx.ep == FAKE_EP_MESSAGES || g->ctx.ep == FAKE_EP_RESPONSES) {
        /* Anthropic and Responses streams end with their last event, no [DONE] */
        fbuf_puts(&c->out, "0\r\n\r\n");
        return;
    }
    if (g->usage) {
        fbuf_reset(&g->ev);
        fake_usage u = usage_of(g);
        fake_render_usage_chunk(&g->ev, &g->ctx, &u);
        put_event(c, g->ev.p, g->ev.len);
    }
    put_event(c, "[DONE]", 6);
    fbuf_puts(&c->out, "0\r\n\r\n");
}

/* The end of a stream: a separate finish chunk where the dialect has one (or where no
 * token carried the finish), the usage chunk, [DONE] and the last HTTP chunk. */
static void stream_finish(server *s, conn *c)
{
    gen *g = c->g;
    if (g->ctx.ep == FAKE_EP_MESSAGES) {
        fake_msg_finish(&c->out, &g->ev, &g->msg, g->finish, g->prompt_tokens, g->sent);
        put_tail(c);
        return;
    }
    if (g->ctx.ep == FAKE_EP_RESPONSES) {
        fake_resp_finish(&c->out, &g->ev, &g->resp, &g->ctx, g->finish, g->prompt_tokens, g->sent,
                         g->reasoning_sent);
        put_tail(c);
        return;
    }
    if (!g->finish_sent) {
        fake_delta d = delta_init(g);
        d.finish = g->finish;
        if (strcmp(g->finish, "stop")) d.matched_stop = "null";
        if (!fake_dialect_separate_finish(g->ctx.d, g->ctx.ep)) d.content = "", d.cn = 0;
        if (g->ctx.ep == FAKE_EP_GENERATE)
            emit_generate(s, c, g->finish);
        else
            emit_delta(c, &d);
        g->finish_sent = true;
    }
    put_tail(c);
}

/* A whole batch: the samples' answers as a JSON array, in order. */
static void batch_whole(conn *c)
{
    gen *g = c->g;
    fbuf_reset(&g->ev);
    fbuf_puts(&g->ev, "[");
    for (size_t i = 0; i < g->nkids; i++) {
        gen *k = g->kids[i];
        fake_usage u = usage_of(k);
        fbuf_puts(&g->ev, i ? "," : "");
        fake_render_generate(&g->ev, &k->ctx, &k->content, 0, 0, k->sent, k->finish, k->cap, &u,
                             latency_s(k), -1);
    }
    fbuf_puts(&g->ev, "]");
    respond_json(c, 200, &g->ev);
}

static void whole_finish(conn *c)
{
    gen *g = c->g;
    if (g->nkids) {
        batch_whole(c);
        return;
    }
    const char *names[g->ntools ? g->ntools : 1];
    for (size_t i = 0; i < g->ntools; i++)
        names[i] = g->r->tools[i].name;
    fake_whole w = {
        .reasoning =
            g->plan.reasoning_n && (g->ctx.ep == FAKE_EP_CHAT || g->ctx.ep == FAKE_EP_MESSAGES)
                ? &g->reasoning
                : NULL,
        .content = &g->content,
        .ntools = g->ntools,
        .ids = (const char *const *)g->tool_ids,
        .names = names,
        .args = g->args,
        .finish = g->finish,
        .matched_stop = strcmp(g->finish, "stop") ? "null" : g->matched_stop,
        .stop_reason = g->stop_reason,
        .usage = usage_of(g),
        .latency_s = latency_s(g),
    };
    fbuf_reset(&g->ev);
    if (g->junk_whole) fbuf_put(&g->ev, junk, sizeof junk - 1);
    if (g->ctx.ep == FAKE_EP_MESSAGES) {
        fake_msg_whole(&g->ev, &g->ctx, &w);
    } else if (g->ctx.ep == FAKE_EP_RESPONSES) {
        /* the items as the stream would have built them */
        fbuf sink = {0}, scratch = {0};
        if (g->plan.reasoning_n && g->reasoning.len)
            fake_resp_token(&sink, &scratch, &g->resp, FAKE_ITEM_REASONING, g->reasoning.p,
                            g->reasoning.len, NULL, NULL);
        if (g->content.len)
            fake_resp_token(&sink, &scratch, &g->resp, FAKE_ITEM_MESSAGE, g->content.p,
                            g->content.len, NULL, NULL);
        for (size_t i = 0; i < g->ntools; i++) {
            fake_resp_token(&sink, &scratch, &g->resp, FAKE_ITEM_CALL, NULL, 0, g->tool_ids[i],
                            g->r->tools[i].name);
            fake_resp_token(&sink, &scratch, &g->resp, FAKE_ITEM_CALL, g->args[i].p, g->args[i].len,
                            NULL, NULL);
        }
        fbuf_free(&sink);
        fbuf_free(&scratch);
        fake_resp_object(&g->ev, &g->resp, &g->ctx,
                         strcmp(g->finish, "length") ? "completed" : "incomplete", g->finish,
                         g->prompt_tokens, g->sent, g->reasoning_sent);
    } else
        fake_render_whole(&g->ev, &g->ctx, &w);
    respond_json(c, 200, &g->ev);
}

static const char *fault_message(const fake_fault *f)
{
    return f->message ? f->message : "Internal server error";
}

static const char *fault_type(const fake_fault *f)
{
    return f->type ? f->type : "InternalServerError";
}

/* Faults that strike before the response starts. Returns true when one did (c may then be
 * closed: *alive tells). */
static bool prestream_fault(server *s, conn *c, bool *alive)
{
    gen *g = c->g;
    const fake_fault *f = &g->r->fault;
    *alive = true;
    switch (f->kind) {
    case FAKE_FAULT_HTTP_STATUS:
        fbuf_reset(&g->ev);
        fake_render_error_body(&g->ev, g->ctx.d, fault_message(f), fault_type(f), f->status);
        respond(c, f->status, "application/json", g->ev.p, g->ev.len);
        break;
    case FAKE_FAULT_NOT_SSE: {
        const char *m = f->message ? f->message : "Internal Server Error";
        respond(c, 200, "text/plain; charset=utf-8", m, strlen(m));
        break;
    }
    case FAKE_FAULT_CLOSE_BEFORE_HEADERS:
        gen_end(s, c, "fault", false);
        conn_close(s, c, false);
        *alive = false;
        return true;
    default:
        return false;
    }
    g->finish = NULL;
    gen_end(s, c, "fault", false);
    return true;
}

/* Faults that strike after at_token tokens. Returns false when c was closed. Sets *stop
 * when the pump must not produce more now. */
static bool stream_fault(server *s, conn *c, bool *stop)
{
    gen *g = c->g;
    const fake_fault *f = &g->r->fault;
    *stop = false;
    g->fault_done = true;
    switch (f->kind) {
    case FAKE_FAULT_RESET:
        gen_end(s, c, "fault", false);
        if (!conn_flush(s, c)) return false;
        conn_close(s, c, true);
        return false;
    case FAKE_FAULT_STALL:
        g->resume = g->phase;
        g->phase = PH_STALL;
        g->wake = fake_now_ns() + (uint64_t)(f->ms > 0 ? f->ms : 0) * NS_PER_MS;
        if (f->ms >= 0) schedule(s, c, g->wake);
        *stop = true;
        return true;
    case FAKE_FAULT_GARBAGE:
        if (g->stream) {
            fbuf_printf(&c->out, "%zx\r\n", sizeof junk - 1);
            fbuf_put(&c->out, junk, sizeof junk - 1);
            fbuf_puts(&c->out, "\r\n");
        } else {
            g->junk_whole = true;
        }
        return true;
    case FAKE_FAULT_ERROR_EVENT:
        g->finish = NULL;
        if (g->stream && g->ctx.ep == FAKE_EP_RESPONSES) {
            fake_resp_error(&c->out, &g->ev, &g->resp, fault_message(f));
            put_tail(c);
            c->state = C_DONE;
        } else if (g->stream && g->ctx.ep == FAKE_EP_MESSAGES) {
            fake_msg_error(&c->out, &g->ev, fault_message(f));
            put_tail(c);
            c->state = C_DONE;
        } else if (g->stream) {
            fbuf_reset(&g->ev);
            fake_render_error_event(&g->ev, g->ctx.d, fault_message(f), fault_type(f), f->status);
            put_event(c, g->ev.p, g->ev.len);
            put_tail(c);
            c->state = C_DONE;
        } else {
            fbuf_reset(&g->ev);
            fake_render_error_body(&g->ev, g->ctx.d, fault_message(f), fault_type(f), f->status);
            respond(c, f->status, "application/json", g->ev.p, g->ev.len);
        }
        gen_end(s, c, "fault", false);
        *stop = true;
        return true;
    case FAKE_FAULT_TRUNCATED_CHUNKED:
        if (!g->stream) put_head(c, 200, "application/json", -1);
        fbuf_puts(&c->out, "40\r\ndata: {\"i");
        gen_end(s, c, "fault", false);
        c->close_after = true;
        *stop = true;
        return true;
    default:
        return true;
    }
}

/* One tick of a batch: every running sample sends its next token, or ends (its plan done,
 * or aborted by its rid) with its last event and its record. Returns false once every
 * sample has ended. */
static bool batch_round(server *s, conn *c)
{
    gen *p = c->g;
    bool running = false;
    for (size_t i = 0; i < p->nkids; i++) {
        gen *k = p->kids[i];
        if (k->ended) continue;
        c->g = k; /* the token writers work on c's generation */
        bool more = !(k->aborted || p->aborted) && emit_token(s, c);
        if (!more) {
            if (k->aborted || p->aborted) k->aborted = true, k->finish = "abort";
            if (k->stream && !k->finish_sent) emit_generate(s, c, k->finish);
            record_generation(s, k, k->aborted ? "aborted" : "complete", false);
            s->n_tokens += k->sent;
            k->ended = true;
        }
        c->g = p;
        running |= more;
    }
    return running;
}

/* Advances c's generation as far as pacing, the output budget and faults allow. May close
 * c. */
void gen_pump(server *s, conn *c)
{
    size_t budget_end = c->out.len + BURST;
    long tokens = 0;
    while (c->g) {
        gen *g = c->g;
        if (pending(c) >= OUT_HIGH) {
            if (!conn_flush(s, c)) return;
            if (pending(c) >= OUT_HIGH) return; /* EPOLLOUT resumes us */
            budget_end = c->out.len + BURST;
        }
        if (c->out.len >= budget_end || tokens >= TOKENS_PER_PUMP) {
            schedule(s, c, fake_now_ns()); /* let other streams run */
            break;
        }
        /* Every phase but an unpaced stream's tokens times something: read the clock
         * for those only (--stamp reads it for each stamp itself). */
        uint64_t now = g->phase == PH_TOKENS && !g->pace_ns ? 0 : fake_now_ns();
        bool alive = true, stop = false;
        if (g->aborted) g->wake = 0; /* an abort cuts first_byte and slow_start waits short */
        switch (g->phase) {
        case PH_DELAY:
            if (now < g->wake) {
                schedule(s, c, g->wake);
                goto out;
            }
            g->phase = PH_HEADERS;
            break;
        case PH_HEADERS:
            if (prestream_fault(s, c, &alive)) {
                if (!alive) return;
                goto out;
            }
            if (g->stream) put_head(c, 200, "text/event-stream; charset=utf-8", -1);
            g->phase = PH_START;
            g->wake = now;
            if (g->r->fault.kind == FAKE_FAULT_SLOW_START) {
                g->fault_done = true;
                g->wake = now + (uint64_t)(g->r->fault.ms > 0 ? g->r->fault.ms : 0) * NS_PER_MS;
            }
            break;
        case PH_START:
            if (now < g->wake) {
                schedule(s, c, g->wake);
                goto out;
            }
            if (!g->fault_done && !g->aborted && !g->nkids && g->r->fault.at_token <= 0 &&
                g->r->fault.kind != FAKE_FAULT_NONE) {
                if (!stream_fault(s, c, &stop)) return;
                if (stop) goto out;
            }
            if (g->stream && g->ctx.ep == FAKE_EP_MESSAGES)
                fake_msg_start(&c->out, &g->ev, &g->ctx, g->prompt_tokens);
            if (g->stream && g->ctx.ep == FAKE_EP_RESPONSES)
                fake_resp_start(&c->out, &g->ev, &g->resp, &g->ctx, g->cap);
            if (g->stream && g->ctx.ep == FAKE_EP_CHAT) {
                fake_delta d = delta_init(g);
                d.role = true;
                emit_delta(c, &d);
            }
            g->phase = PH_TOKENS;
            g->next_tick = now + g->pace_ns;
            break;
        case PH_TOKENS:
            if (g->nkids) { /* a batch: one token of each running sample a tick */
                if (g->pace_ns && now < g->next_tick) {
                    schedule(s, c, g->next_tick);
                    goto out;
                }
                tokens += (long)g->nkids;
                if (!batch_round(s, c)) g->phase = PH_FINISH;
                g->next_tick += g->pace_ns;
                break;
            }
            if (g->aborted) {
                g->finish = "abort";
                g->phase = PH_FINISH;
                break;
            }
            if (!g->fault_done && g->r->fault.kind != FAKE_FAULT_NONE &&
                g->sent >= g->r->fault.at_token) {
                if (!stream_fault(s, c, &stop)) return;
                if (stop) goto out;
            }
            if (g->pace_ns && now < g->next_tick) {
                schedule(s, c, g->next_tick);
                goto out;
            }
            tokens++;
            if (!emit_token(s, c))
                g->phase = PH_FINISH;
            else if (g->pace_ns)
                g->next_tick += g->pace_ns;
            break;
        case PH_STALL:
            /* Woken by the end of a timed stall: carry on as if nothing happened. */
            if (g->r->fault.ms >= 0 && now >= g->wake) {
                g->phase = g->resume;
                g->wake = g->next_tick = now;
                break;
            }
            goto out;
        case PH_FINISH:
            if (g->stream && g->nkids) { /* each sample sent its last event */
                put_tail(c);
                c->state = C_DONE;
            } else if (g->stream) {
                stream_finish(s, c);
                c->state = C_DONE;
            } else {
                whole_finish(c);
            }
            /* Recorded as soon as the end is queued: a flush that closes the
             * connection afterwards must not turn a complete stream into a lost one. */
            gen_end(s, c, g->aborted ? "aborted" : "complete", false);
            goto out;
        }
    }
out:
    conn_flush(s, c);
}
