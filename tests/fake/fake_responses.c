/* fake_responses.c — OpenAI Responses shapes (fake_responses.h). */
#include "fake_responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_messages.h" /* fake_msg_event: the same `event:` framing */

static void str(fbuf *b, const char *s)
{
    fbuf_json_str(b, s, s ? strlen(s) : 0, false);
}

/* Starts an event: {"type":T,"sequence_number":N — the caller appends the rest and "}". */
static void ev_begin(fbuf *b, fake_rsp *r, const char *type)
{
    fbuf_reset(b);
    fbuf_puts(b, "{\"type\":\"");
    fbuf_puts(b, type);
    fbuf_puts(b, "\",\"sequence_number\":");
    fbuf_put_long(b, r->seq++);
}

static void ev_send(fbuf *out, fbuf *b, const char *type)
{
    fbuf_puts(b, "}");
    fake_msg_event(out, type, b->p, b->len);
}

static void response_obj(fbuf *b, fake_rsp *r, const fake_ctx *c, const char *status,
                         const char *finish, bool with_items, long prompt, long completion,
                         long reasoning, long max_tokens)
{
    fbuf_puts(b, "{\"id\":");
    fbuf_printf(b, "\"resp_%s\"", c->id);
    fbuf_printf(b, ",\"created_at\":%ld,\"incomplete_details\":", c->created);
    if (finish && !strcmp(finish, "length"))
        fbuf_puts(b, "{\"reason\":\"max_output_tokens\"}");
    else
        fbuf_puts(b, "null");
    fbuf_puts(b, ",\"instructions\":null,\"metadata\":null,\"model\":");
    str(b, c->model);
    fbuf_puts(b, ",\"object\":\"response\",\"output\":[");
    if (with_items && r->items.len) fbuf_put(b, r->items.p, r->items.len);
    fbuf_puts(b, "],\"parallel_tool_calls\":true,\"temperature\":null,\"tool_choice\":\"auto\","
                 "\"tools\":[],\"top_p\":null,\"background\":false,\"max_output_tokens\":");
    if (max_tokens > 0)
        fbuf_printf(b, "%ld", max_tokens);
    else
        fbuf_puts(b, "null");
    fbuf_printf(b, ",\"previous_response_id\":null,\"status\":\"%s\",\"usage\":", status);
    if (completion < 0)
        fbuf_puts(b, "null");
    else
        fbuf_printf(b,
                    "{\"input_tokens\":%ld,\"input_tokens_details\":{\"cached_tokens\":0},"
                    "\"output_tokens\":%ld,\"output_tokens_details\":{\"reasoning_tokens\":%ld},"
                    "\"total_tokens\":%ld}",
                    prompt, completion, reasoning, prompt + completion);
    fbuf_puts(b, "}");
}

void fake_resp_start(fbuf *out, fbuf *b, fake_rsp *r, const fake_ctx *c, long max_tokens)
{
    static const char *const types[] = {"response.created", "response.in_progress"};
    for (int i = 0; i < 2; i++) {
        ev_begin(b, r, types[i]);
        fbuf_puts(b, ",\"response\":");
        response_obj(b, r, c, "in_progress", NULL, false, 0, -1, 0, max_tokens);
        ev_send(out, b, types[i]);
    }
}

/* The open item as a completed JSON object, appended to b. */
static void item_json(fbuf *b, const fake_rsp *r)
{
    const char *t = r->text.p ? r->text.p : "";
    if (r->open == FAKE_ITEM_REASONING) {
        fbuf_printf(b,
                    "{\"id\":\"%s\",\"summary\":[],\"type\":\"reasoning\",\"content\":[{\"text\":",
                    r->item_id);
        fbuf_json_str(b, t, r->text.len, false);
        fbuf_puts(
            b,
            ",\"type\":\"reasoning_text\"}],\"encrypted_content\":null,\"status\":\"completed\"}");
    } else if (r->open == FAKE_ITEM_MESSAGE) {
        fbuf_printf(b, "{\"id\":\"%s\",\"content\":[{\"annotations\":[],\"text\":", r->item_id);
        fbuf_json_str(b, t, r->text.len, false);
        fbuf_puts(b, ",\"type\":\"output_text\",\"logprobs\":null}],\"role\":\"assistant\","
                     "\"status\":\"completed\",\"type\":\"message\"}");
    } else {
        fbuf_puts(b, "{\"arguments\":");
        fbuf_json_str(b, t, r->text.len, false);
        fbuf_printf(b, ",\"call_id\":\"%s\",\"name\":", r->call_id);
        str(b, r->name);
        fbuf_printf(b, ",\"type\":\"function_call\",\"id\":\"%s\",\"status\":\"completed\"}",
                    r->item_id);
    }
}

static void close_item(fbuf *out, fbuf *b, fake_rsp *r)
{
    if (r->open == FAKE_ITEM_NONE) return;
    const char *t = r->text.p ? r->text.p : "";
    const char *pre = r->open == FAKE_ITEM_REASONING ? "response.reasoning_text.done"
                      : r->open == FAKE_ITEM_MESSAGE ? "response.output_text.done"
                                                     : "response.function_call_arguments.done";
    ev_begin(b, r, pre);
    fbuf_printf(b, ",\"item_id\":\"%s\",\"output_index\":%d", r->item_id, r->index);
    if (r->open == FAKE_ITEM_CALL) {
        fbuf_puts(b, ",\"arguments\":");
        fbuf_json_str(b, t, r->text.len, false);
    } else {
        fbuf_puts(b, ",\"content_index\":0,\"text\":");
        fbuf_json_str(b, t, r->text.len, false);
        if (r->open == FAKE_ITEM_MESSAGE) fbuf_puts(b, ",\"logprobs\":[]");
    }
    ev_send(out, b, pre);
    if (r->open != FAKE_ITEM_CALL) {
        bool reason = r->open == FAKE_ITEM_REASONING;
        const char *type = reason ? "response.reasoning_part.done" : "response.content_part.done";
        ev_begin(b, r, type);
        fbuf_printf(b, ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"part\":",
                    r->item_id, r->index);
        if (reason) {
            fbuf_puts(b, "{\"text\":");
            fbuf_json_str(b, t, r->text.len, false);
            fbuf_puts(b, ",\"type\":\"reasoning_text\"}");
        } else {
            fbuf_puts(b, "{\"annotations\":[],\"text\":");
            fbuf_json_str(b, t, r->text.len, false);
            fbuf_puts(b, ",\"type\":\"output_text\",\"logprobs\":null}");
        }
        ev_send(out, b, type);
    }
    ev_begin(b, r, "response.output_item.done");
    fbuf_printf(b, ",\"output_index\":%d,\"item\":", r->index);
    item_json(b, r);
    ev_send(out, b, "response.output_item.done");
    if (r->items.len) fbuf_puts(&r->items, ",");
    item_json(&r->items, r);
    r->open = FAKE_ITEM_NONE;
    r->index++;
    fbuf_reset(&r->text);
}

void fake_resp_token(fbuf *out, fbuf *b, fake_rsp *r, fake_item k, const char *text, size_t n,
                     const char *call_id, const char *name)
{
    bool new_call = k == FAKE_ITEM_CALL && name;
    if (r->open != k || new_call) {
        close_item(out, b, r);
        r->open = k;
        snprintf(r->item_id, sizeof r->item_id, "%s_%08x%024x",
                 k == FAKE_ITEM_CALL        ? "fc"
                 : k == FAKE_ITEM_REASONING ? "rs"
                                            : "msg",
                 ++r->serial, 0u);
        ev_begin(b, r, "response.output_item.added");
        fbuf_printf(b, ",\"output_index\":%d,\"item\":", r->index);
        if (k == FAKE_ITEM_REASONING) {
            fbuf_printf(b,
                        "{\"id\":\"%s\",\"summary\":[],\"type\":\"reasoning\",\"content\":null,"
                        "\"encrypted_content\":null,\"status\":\"in_progress\"}",
                        r->item_id);
        } else if (k == FAKE_ITEM_MESSAGE) {
            fbuf_printf(b,
                        "{\"id\":\"%s\",\"content\":[],\"role\":\"assistant\",\"status\":"
                        "\"in_progress\",\"type\":\"message\"}",
                        r->item_id);
        } else {
            snprintf(r->call_id, sizeof r->call_id, "%s", call_id ? call_id : "call_0");
            free(r->name);
            r->name = strdup(name ? name : "");
            fbuf_printf(b, "{\"arguments\":\"\",\"call_id\":\"%s\",\"name\":", r->call_id);
            str(b, r->name);
            fbuf_printf(b, ",\"type\":\"function_call\",\"id\":\"%s\",\"status\":\"in_progress\"}",
                        r->item_id);
        }
        ev_send(out, b, "response.output_item.added");
        if (k != FAKE_ITEM_CALL) {
            bool reason = k == FAKE_ITEM_REASONING;
            const char *type =
                reason ? "response.reasoning_part.added" : "response.content_part.added";
            ev_begin(b, r, type);
            fbuf_printf(b,
                        ",\"item_id\":\"%s\",\"output_index\":%d,\"content_index\":0,\"part\":%s",
                        r->item_id, r->index,
                        reason ? "{\"text\":\"\",\"type\":\"reasoning_text\"}"
                               : "{\"annotations\":[],\"text\":\"\",\"type\":\"output_text\","
                                 "\"logprobs\":[]}");
            ev_send(out, b, type);
        }
        if (new_call) return;
    }
    if (!n) return;
    fbuf_put(&r->text, text, n);
    const char *type = k == FAKE_ITEM_REASONING ? "response.reasoning_text.delta"
                       : k == FAKE_ITEM_MESSAGE ? "response.output_text.delta"
                                                : "response.function_call_arguments.delta";
    ev_begin(b, r, type);
    fbuf_puts(b, ",\"item_id\":\"");
    fbuf_puts(b, r->item_id);
    fbuf_puts(b, "\",\"output_index\":");
    fbuf_put_long(b, r->index);
    if (k != FAKE_ITEM_CALL) fbuf_puts(b, ",\"content_index\":0");
    fbuf_puts(b, ",\"delta\":");
    fbuf_json_str(b, text, n, false);
    if (k == FAKE_ITEM_MESSAGE) fbuf_puts(b, ",\"logprobs\":[]");
    ev_send(out, b, type);
}

void fake_resp_finish(fbuf *out, fbuf *b, fake_rsp *r, const fake_ctx *c, const char *finish,
                      long prompt, long completion, long reasoning)
{
    close_item(out, b, r);
    bool cut = finish && !strcmp(finish, "length");
    const char *type = cut ? "response.incomplete" : "response.completed";
    ev_begin(b, r, type);
    fbuf_puts(b, ",\"response\":");
    response_obj(b, r, c, cut ? "incomplete" : "completed", finish, true, prompt, completion,
                 reasoning, 0);
    ev_send(out, b, type);
}

void fake_resp_object(fbuf *b, fake_rsp *r, const fake_ctx *c, const char *status,
                      const char *finish, long prompt, long completion, long reasoning)
{
    fbuf scratch = {0}, sink = {0};
    close_item(&sink, &scratch, r);
    fbuf_free(&scratch);
    fbuf_free(&sink);
    response_obj(b, r, c, status, finish, true, prompt, completion, reasoning, 0);
}

void fake_resp_error(fbuf *out, fbuf *b, fake_rsp *r, const char *message)
{
    ev_begin(b, r, "error");
    fbuf_puts(b, ",\"code\":\"internal_error\",\"message\":");
    str(b, message);
    fbuf_puts(b, ",\"param\":null");
    ev_send(out, b, "error");
}

void fake_resp_free(fake_rsp *r)
{
    free(r->name);
    fbuf_free(&r->text);
    fbuf_free(&r->items);
    memset(r, 0, sizeof *r);
}
