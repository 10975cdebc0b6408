/* fake_dialect.c — exact chunk and body shapes of each upstream dialect.
 *
 * Why hand-written JSON: the point of the fake is to reproduce what pydantic, msgspec and
 * json.dumps emit, including key order, which keys appear as null and which are left out,
 * and the spaces json.dumps puts in error events. The rules, per dialect:
 *
 *   sglang           msgspec era: delta {"reasoning_content":null|"…"[,"role"][,"content"]},
 *                    choice logprobs/finish_reason/matched_stop always, no "usage" key
 *                    except on the usage chunk; tool deltas are pydantic (SGLang builds
 *                    them with its pydantic models).
 *   sglang-pydantic  every delta key (role, content, reasoning_content, tool_calls), most
 *                    null; "usage":null on every chunk.
 *   sglang-old       pydantic shapes; finish on the last delta; "" finish on the first.
 *   vllm / -old / -both  exclude_unset: only the keys that were set; stop_reason with the
 *                    finish; reasoning key "reasoning", "reasoning_content" or both.
 *   openai / inline  OpenAI's shape: a separate final chunk with an empty delta. */
#include "fake_dialect.h"

#include <stdio.h>
#include <string.h>

static const char *const names[] = {
    [FAKE_D_SGLANG] = "sglang",         [FAKE_D_SGLANG_PYDANTIC] = "sglang-pydantic",
    [FAKE_D_SGLANG_OLD] = "sglang-old", [FAKE_D_VLLM] = "vllm",
    [FAKE_D_VLLM_OLD] = "vllm-old",     [FAKE_D_VLLM_BOTH] = "vllm-both",
    [FAKE_D_OPENAI] = "openai",         [FAKE_D_INLINE] = "inline",
};

int fake_dialect_parse(const char *name)
{
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i])) return (int)i;
    return -1;
}

const char *fake_dialect_name(fake_dialect d)
{
    return names[d];
}

bool fake_dialect_is_sglang(fake_dialect d)
{
    return d == FAKE_D_SGLANG || d == FAKE_D_SGLANG_PYDANTIC || d == FAKE_D_SGLANG_OLD;
}

bool fake_dialect_is_vllm(fake_dialect d)
{
    return d == FAKE_D_VLLM || d == FAKE_D_VLLM_OLD || d == FAKE_D_VLLM_BOTH;
}

bool fake_dialect_separate_finish(fake_dialect d, fake_endpoint ep)
{
    if (ep != FAKE_EP_CHAT) return false;
    return d == FAKE_D_SGLANG || d == FAKE_D_SGLANG_PYDANTIC || d == FAKE_D_OPENAI ||
           d == FAKE_D_INLINE;
}

static void put_str(fbuf *b, const char *s, size_t n)
{
    fbuf_json_str(b, s, n, false);
}

static void put_cstr(fbuf *b, const char *s)
{
    fbuf_json_str(b, s, s ? strlen(s) : 0, false);
}

/* key, then json: JSON text the caller already has (matched_stop, stop_reason). */
static void json_field(fbuf *b, const char *key, const char *json)
{
    fbuf_puts(b, key);
    fbuf_puts(b, json);
}

static void head(fbuf *b, const fake_ctx *c, const char *object)
{
    fbuf_puts(b, "{\"id\":");
    put_cstr(b, c->id);
    fbuf_puts(b, ",\"object\":\"");
    fbuf_puts(b, object);
    fbuf_puts(b, "\",\"created\":");
    fbuf_put_long(b, c->created);
    fbuf_puts(b, ",\"model\":");
    put_cstr(b, c->model);
}

void fake_render_chunk_head(fbuf *b, const fake_ctx *c)
{
    head(b, c, c->ep == FAKE_EP_COMPLETION ? "text_completion" : "chat.completion.chunk");
}

/* The head of a streamed chunk: the cached copy when the caller made one. */
static void chunk_head(fbuf *b, const fake_ctx *c)
{
    if (c->head)
        fbuf_put(b, c->head, c->head_len);
    else
        fake_render_chunk_head(b, c);
}

/* The tool-call entry of a delta, pydantic (SGLang) or exclude_unset (vLLM/OpenAI). */
static void tool_delta(fbuf *b, const fake_ctx *c, const fake_delta *d)
{
    bool pyd = fake_dialect_is_sglang(c->d);
    fbuf_puts(b, "[{");
    if (pyd) {
        fbuf_puts(b, "\"id\":");
        put_cstr(b, d->tool_name ? d->tool_id : NULL);
        fbuf_puts(b, ",\"index\":");
        fbuf_put_long(b, d->tool);
        fbuf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
        put_cstr(b, d->tool_name);
        fbuf_puts(b, ",\"arguments\":");
        put_str(b, d->tool_name ? "" : d->args, d->tool_name ? 0 : d->an);
        fbuf_puts(b, "}}]");
        return;
    }
    if (d->tool_name) {
        fbuf_puts(b, "\"id\":");
        put_cstr(b, d->tool_id);
        fbuf_puts(b, ",\"type\":\"function\",\"index\":");
        fbuf_put_long(b, d->tool);
        fbuf_puts(b, ",\"function\":{\"name\":");
        put_cstr(b, d->tool_name);
        fbuf_puts(b, ",\"arguments\":\"\"}}]");
    } else {
        fbuf_puts(b, "\"index\":");
        fbuf_put_long(b, d->tool);
        fbuf_puts(b, ",\"function\":{\"arguments\":");
        put_str(b, d->args, d->an);
        fbuf_puts(b, "}}]");
    }
}

/* Delta object of a pydantic-era SGLang chunk: every key present. */
static void delta_pydantic(fbuf *b, const fake_ctx *c, const fake_delta *d)
{
    fbuf_puts(b, "{\"role\":");
    fbuf_puts(b, d->role ? "\"assistant\"" : "null");
    fbuf_puts(b, ",\"content\":");
    if (d->role)
        fbuf_puts(b, "\"\"");
    else
        put_str(b, d->content, d->cn);
    fbuf_puts(b, ",\"reasoning_content\":");
    put_str(b, d->reasoning, d->rn);
    fbuf_puts(b, ",\"tool_calls\":");
    if (d->tool >= 0)
        tool_delta(b, c, d);
    else
        fbuf_puts(b, "null");
    fbuf_puts(b, "}");
}

static void delta_msgspec(fbuf *b, const fake_delta *d)
{
    fbuf_puts(b, "{\"reasoning_content\":");
    put_str(b, d->reasoning, d->rn);
    if (d->role)
        fbuf_puts(b, ",\"role\":\"assistant\",\"content\":\"\"");
    else if (d->content)
        fbuf_puts(b, ",\"content\":"), put_str(b, d->content, d->cn);
    fbuf_puts(b, "}");
}

/* vLLM/OpenAI: only the keys that are set, in field order role, content, reasoning,
 * reasoning_content, tool_calls. */
static void delta_unset(fbuf *b, const fake_ctx *c, const fake_delta *d)
{
    const char *sep = "";
    fbuf_puts(b, "{");
    if (d->role) {
        fbuf_puts(b, "\"role\":\"assistant\",\"content\":\"\"");
        sep = ",";
    } else if (d->content) {
        fbuf_puts(b, "\"content\":");
        put_str(b, d->content, d->cn);
        sep = ",";
    }
    if (d->reasoning && (c->d == FAKE_D_VLLM || c->d == FAKE_D_VLLM_BOTH)) {
        fbuf_puts(b, sep);
        fbuf_puts(b, "\"reasoning\":");
        put_str(b, d->reasoning, d->rn);
        sep = ",";
    }
    if (d->reasoning && (c->d == FAKE_D_VLLM_OLD || c->d == FAKE_D_VLLM_BOTH)) {
        fbuf_puts(b, sep);
        fbuf_puts(b, "\"reasoning_content\":");
        put_str(b, d->reasoning, d->rn);
        sep = ",";
    }
    if (d->tool >= 0) {
        fbuf_puts(b, sep);
        fbuf_puts(b, "\"tool_calls\":");
        tool_delta(b, c, d);
    }
    fbuf_puts(b, "}");
}

static void chat_chunk(fbuf *b, const fake_ctx *c, const fake_delta *d)
{
    /* SGLang's msgspec era still builds tool-call chunks with its pydantic models. */
    bool sg = fake_dialect_is_sglang(c->d);
    bool pyd = c->d == FAKE_D_SGLANG_PYDANTIC || c->d == FAKE_D_SGLANG_OLD ||
               (c->d == FAKE_D_SGLANG && d->tool >= 0);
    chunk_head(b, c);
    fbuf_puts(b, ",\"choices\":[{\"index\":0,\"delta\":");
    if (pyd)
        delta_pydantic(b, c, d);
    else if (sg)
        delta_msgspec(b, d);
    else
        delta_unset(b, c, d);
    fbuf_puts(b, ",\"logprobs\":null,\"finish_reason\":");
    if (d->finish)
        put_cstr(b, d->finish);
    else
        fbuf_puts(b, c->d == FAKE_D_SGLANG_OLD && d->role ? "\"\"" : "null");
    if (sg) json_field(b, ",\"matched_stop\":", d->finish ? d->matched_stop : "null");
    if (fake_dialect_is_vllm(c->d) && d->finish) json_field(b, ",\"stop_reason\":", d->stop_reason);
    fbuf_puts(b, "}]");
    if (pyd) fbuf_puts(b, ",\"usage\":null");
    fbuf_puts(b, "}");
}

static void completion_chunk(fbuf *b, const fake_ctx *c, const fake_delta *d)
{
    chunk_head(b, c);
    fbuf_puts(b, ",\"choices\":[{\"index\":0,\"text\":");
    put_str(b, d->content ? d->content : "", d->content ? d->cn : 0);
    fbuf_puts(b, ",\"logprobs\":null,\"finish_reason\":");
    put_cstr(b, d->finish);
    if (fake_dialect_is_sglang(c->d))
        json_field(b, ",\"matched_stop\":", d->finish ? d->matched_stop : "null");
    if (fake_dialect_is_vllm(c->d))
        json_field(b, ",\"stop_reason\":", d->finish ? d->stop_reason : "null");
    fbuf_puts(b, "}]");
    if (fake_dialect_is_sglang(c->d) || fake_dialect_is_vllm(c->d)) fbuf_puts(b, ",\"usage\":null");
    fbuf_puts(b, "}");
}

void fake_render_chunk(fbuf *b, const fake_ctx *c, const fake_delta *d)
{
    if (c->ep == FAKE_EP_COMPLETION)
        completion_chunk(b, c, d);
    else
        chat_chunk(b, c, d);
}

static void usage_obj(fbuf *b, fake_dialect d, const fake_usage *u)
{
    long total = u->prompt + u->completion;
    if (fake_dialect_is_sglang(d))
        fbuf_printf(b,
                    "{\"prompt_tokens\":%ld,\"total_tokens\":%ld,\"completion_tokens\":%ld,"
                    "\"prompt_tokens_details\":null,\"reasoning_tokens\":%ld}",
                    u->prompt, total, u->completion, u->reasoning);
    else if (fake_dialect_is_vllm(d))
        fbuf_printf(b, "{\"prompt_tokens\":%ld,\"total_tokens\":%ld,\"completion_tokens\":%ld}",
                    u->prompt, total, u->completion);
    else
        fbuf_printf(b, "{\"prompt_tokens\":%ld,\"completion_tokens\":%ld,\"total_tokens\":%ld}",
                    u->prompt, u->completion, total);
}

void fake_render_usage_chunk(fbuf *b, const fake_ctx *c, const fake_usage *u)
{
    chunk_head(b, c);
    fbuf_puts(b, ",\"choices\":[],\"usage\":");
    usage_obj(b, c->d, u);
    fbuf_puts(b, "}");
}

void fake_render_error_event(fbuf *b, fake_dialect d, const char *msg, const char *type, int code)
{
    fbuf_puts(b, fake_dialect_is_sglang(d) ? "{\"error\": {\"object\": \"error\", \"message\": "
                                           : "{\"error\": {\"message\": ");
    fbuf_json_str(b, msg, strlen(msg), true);
    fbuf_puts(b, ", \"type\": ");
    fbuf_json_str(b, type, strlen(type), true);
    fbuf_printf(b, ", \"param\": null, \"code\": %d}}", code);
}

void fake_render_error_body(fbuf *b, fake_dialect d, const char *msg, const char *type, int code)
{
    fbuf_puts(b, fake_dialect_is_sglang(d) ? "{\"object\":\"error\",\"message\":"
                                           : "{\"error\":{\"message\":");
    put_cstr(b, msg);
    fbuf_puts(b, ",\"type\":");
    put_cstr(b, type);
    fbuf_printf(b, ",\"param\":null,\"code\":%d}%s", code, fake_dialect_is_sglang(d) ? "" : "}");
}

static void whole_tools(fbuf *b, const fake_ctx *c, const fake_whole *w)
{
    fbuf_puts(b, "[");
    for (size_t i = 0; i < w->ntools; i++) {
        fbuf_puts(b, i ? ",{\"id\":" : "{\"id\":");
        put_cstr(b, w->ids[i]);
        if (fake_dialect_is_sglang(c->d)) fbuf_printf(b, ",\"index\":%zu", i);
        fbuf_puts(b, ",\"type\":\"function\",\"function\":{\"name\":");
        put_cstr(b, w->names[i]);
        fbuf_puts(b, ",\"arguments\":");
        put_str(b, w->args[i].p ? w->args[i].p : "", w->args[i].len);
        fbuf_puts(b, "}}");
    }
    fbuf_puts(b, "]");
}

static void whole_message(fbuf *b, const fake_ctx *c, const fake_whole *w)
{
    const char *content = w->content->len ? w->content->p : NULL;
    const char *reasoning = w->reasoning && w->reasoning->len ? w->reasoning->p : NULL;
    size_t rn = reasoning ? w->reasoning->len : 0;
    fbuf_puts(b, "{\"role\":\"assistant\",\"content\":");
    put_str(b, content, w->content->len);
    if (fake_dialect_is_sglang(c->d)) {
        fbuf_puts(b, ",\"reasoning_content\":");
        put_str(b, reasoning, rn);
        fbuf_puts(b, ",\"tool_calls\":");
        if (w->ntools)
            whole_tools(b, c, w);
        else
            fbuf_puts(b, "null");
    } else if (fake_dialect_is_vllm(c->d)) {
        fbuf_puts(b, ",\"refusal\":null,\"annotations\":null,\"audio\":null,"
                     "\"function_call\":null,\"tool_calls\":");
        whole_tools(b, c, w);
        if (c->d != FAKE_D_VLLM_OLD) fbuf_puts(b, ",\"reasoning\":"), put_str(b, reasoning, rn);
        if (c->d != FAKE_D_VLLM) fbuf_puts(b, ",\"reasoning_content\":"), put_str(b, reasoning, rn);
    } else {
        fbuf_puts(b, ",\"refusal\":null,\"annotations\":[]");
        if (w->ntools) fbuf_puts(b, ",\"tool_calls\":"), whole_tools(b, c, w);
    }
    fbuf_puts(b, "}");
}

void fake_render_whole(fbuf *b, const fake_ctx *c, const fake_whole *w)
{
    if (c->ep == FAKE_EP_GENERATE) {
        fake_render_generate(b, c, w->content, 0, 0, w->usage.completion, w->finish,
                             w->usage.completion, &w->usage, w->latency_s, -1);
        return;
    }
    bool chat = c->ep == FAKE_EP_CHAT;
    head(b, c, chat ? "chat.completion" : "text_completion");
    fbuf_puts(b, ",\"choices\":[{\"index\":0,");
    if (chat) {
        fbuf_puts(b, "\"message\":");
        whole_message(b, c, w);
    } else {
        fbuf_puts(b, "\"text\":");
        put_str(b, w->content->p ? w->content->p : "", w->content->len);
    }
    fbuf_puts(b, ",\"logprobs\":null,\"finish_reason\":");
    put_cstr(b, w->finish);
    if (fake_dialect_is_sglang(c->d)) json_field(b, ",\"matched_stop\":", w->matched_stop);
    if (fake_dialect_is_vllm(c->d)) json_field(b, ",\"stop_reason\":", w->stop_reason);
    fbuf_puts(b, "}],\"usage\":");
    usage_obj(b, c->d, &w->usage);
    if (fake_dialect_is_sglang(c->d)) fbuf_puts(b, ",\"metadata\":null");
    fbuf_puts(b, "}");
}

void fake_render_generate(fbuf *b, const fake_ctx *c, const fbuf *text, size_t from, long ids_from,
                          long ids_to, const char *finish, long length_cap, const fake_usage *u,
                          double latency_s, int index)
{
    fbuf_puts(b, "{\"text\":");
    put_str(b, text->p ? text->p + from : "", text->len - from);
    fbuf_puts(b, ",\"output_ids\":[");
    for (long i = ids_from; i < ids_to; i++) {
        if (i > ids_from) fbuf_puts(b, ",");
        fbuf_put_long(b, 1000 + i);
    }
    fbuf_puts(b, "],\"meta_info\":{\"id\":");
    put_cstr(b, c->id);
    fbuf_puts(b, ",\"finish_reason\":");
    if (!finish)
        fbuf_puts(b, "null");
    else if (!strcmp(finish, "stop"))
        fbuf_puts(b, "{\"type\":\"stop\",\"matched\":151645}");
    else if (!strcmp(finish, "length"))
        fbuf_printf(b, "{\"type\":\"length\",\"length\":%ld}", length_cap);
    else
        fbuf_printf(b, "{\"type\":\"%s\"}", finish);
    fbuf_puts(b, ",\"prompt_tokens\":");
    fbuf_put_long(b, u->prompt);
    fbuf_puts(b, ",\"completion_tokens\":");
    fbuf_put_long(b, u->completion);
    fbuf_printf(b, ",\"cached_tokens\":0,\"e2e_latency\":%.6f}", latency_s);
    if (index >= 0) fbuf_puts(b, ",\"index\":"), fbuf_put_long(b, index);
    fbuf_puts(b, "}");
}
