/* fake_messages.c — Anthropic Messages shapes (fake_messages.h). */
#include "fake_messages.h"

#include <stdio.h>
#include <string.h>

void fake_msg_event(fbuf *out, const char *name, const char *json, size_t n)
{
    size_t len = strlen("event: ") + strlen(name) + strlen("\ndata: ") + n + 2;
    fbuf_put_hex(out, len);
    fbuf_puts(out, "\r\nevent: ");
    fbuf_puts(out, name);
    fbuf_puts(out, "\ndata: ");
    fbuf_put(out, json, n);
    fbuf_put(out, "\n\n\r\n", 4);
}

static const char *stop_reason(const char *finish)
{
    if (!finish) return "end_turn";
    if (!strcmp(finish, "length")) return "max_tokens";
    if (!strcmp(finish, "tool_calls")) return "tool_use";
    return "end_turn";
}

void fake_msg_start(fbuf *out, fbuf *b, const fake_ctx *c, long prompt_tokens)
{
    fbuf_reset(b);
    fbuf_puts(b, "{\"type\":\"message_start\",\"message\":{\"id\":");
    fbuf_json_str(b, c->id, strlen(c->id), false);
    fbuf_puts(b, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":");
    fbuf_json_str(b, c->model, strlen(c->model), false);
    fbuf_printf(b,
                ",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":%ld,"
                "\"output_tokens\":0}}}",
                prompt_tokens);
    fake_msg_event(out, "message_start", b->p, b->len);
}

static void close_block(fbuf *out, fbuf *b, fake_msg *m)
{
    if (m->open == FAKE_BLK_NONE) return;
    if (m->open == FAKE_BLK_THINKING) {
        fbuf_reset(b);
        fbuf_printf(b,
                    "{\"type\":\"content_block_delta\",\"index\":%d,\"delta\":{\"type\":"
                    "\"signature_delta\",\"signature\":\"%s\"}}",
                    m->index, m->signature[0] ? m->signature : "fake-signature");
        fake_msg_event(out, "content_block_delta", b->p, b->len);
    }
    fbuf_reset(b);
    fbuf_printf(b, "{\"type\":\"content_block_stop\",\"index\":%d}", m->index);
    fake_msg_event(out, "content_block_stop", b->p, b->len);
    m->open = FAKE_BLK_NONE;
    m->index++;
}

void fake_msg_token(fbuf *out, fbuf *b, fake_msg *m, fake_blk k, const char *text, size_t n,
                    const char *tool_id, const char *tool_name)
{
    bool new_tool = k == FAKE_BLK_TOOL && tool_name;
    if (m->open != k || new_tool) {
        close_block(out, b, m);
        fbuf_reset(b);
        fbuf_printf(b,
                    "{\"type\":\"content_block_start\",\"index\":%d,\"content_block\":", m->index);
        if (k == FAKE_BLK_THINKING) {
            fbuf_puts(b, "{\"type\":\"thinking\",\"thinking\":\"\"}}");
        } else if (k == FAKE_BLK_TEXT) {
            fbuf_puts(b, "{\"type\":\"text\",\"text\":\"\"}}");
        } else {
            fbuf_puts(b, "{\"type\":\"tool_use\",\"id\":");
            fbuf_json_str(b, tool_id ? tool_id : "", tool_id ? strlen(tool_id) : 0, false);
            fbuf_puts(b, ",\"name\":");
            fbuf_json_str(b, tool_name ? tool_name : "", tool_name ? strlen(tool_name) : 0, false);
            fbuf_puts(b, ",\"input\":{}}}");
        }
        fake_msg_event(out, "content_block_start", b->p, b->len);
        m->open = k;
        if (new_tool) return; /* the header token carries the name only */
    }
    if (!n) return;
    static const char *const type[] = {"", "thinking_delta", "text_delta", "input_json_delta"};
    static const char *const key[] = {"", "thinking", "text", "partial_json"};
    fbuf_reset(b);
    fbuf_puts(b, "{\"type\":\"content_block_delta\",\"index\":");
    fbuf_put_long(b, m->index);
    fbuf_puts(b, ",\"delta\":{\"type\":\"");
    fbuf_puts(b, type[k]);
    fbuf_puts(b, "\",\"");
    fbuf_puts(b, key[k]);
    fbuf_puts(b, "\":");
    fbuf_json_str(b, text, n, false);
    fbuf_puts(b, "}}");
    fake_msg_event(out, "content_block_delta", b->p, b->len);
}

void fake_msg_finish(fbuf *out, fbuf *b, fake_msg *m, const char *finish, long prompt_tokens,
                     long completion_tokens)
{
    close_block(out, b, m);
    fbuf_reset(b);
    fbuf_printf(b,
                "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"%s\"},\"usage\":{"
                "\"input_tokens\":%ld,\"output_tokens\":%ld}}",
                stop_reason(finish), prompt_tokens, completion_tokens);
    fake_msg_event(out, "message_delta", b->p, b->len);
    fake_msg_event(out, "message_stop", "{\"type\":\"message_stop\"}", 23);
}

void fake_msg_error(fbuf *out, fbuf *b, const char *message)
{
    fbuf_reset(b);
    fake_msg_error_body(b, "api_error", message);
    fake_msg_event(out, "error", b->p, b->len);
}

void fake_msg_error_body(fbuf *b, const char *type, const char *message)
{
    fbuf_puts(b, "{\"type\":\"error\",\"error\":{\"type\":");
    fbuf_json_str(b, type, strlen(type), false);
    fbuf_puts(b, ",\"message\":");
    fbuf_json_str(b, message, strlen(message), false);
    fbuf_puts(b, "}}");
}

void fake_msg_whole(fbuf *b, const fake_ctx *c, const fake_whole *w)
{
    fbuf_puts(b, "{\"id\":");
    fbuf_json_str(b, c->id, strlen(c->id), false);
    fbuf_puts(b, ",\"type\":\"message\",\"role\":\"assistant\",\"content\":[");
    bool first = true;
    if (w->reasoning && w->reasoning->len) {
        fbuf_puts(b, "{\"type\":\"thinking\",\"thinking\":");
        fbuf_json_str(b, w->reasoning->p, w->reasoning->len, false);
        fbuf_puts(b, ",\"signature\":\"fake-signature\"}");
        first = false;
    }
    if (w->content && w->content->len) {
        fbuf_puts(b, first ? "" : ",");
        fbuf_puts(b, "{\"type\":\"text\",\"text\":");
        fbuf_json_str(b, w->content->p, w->content->len, false);
        fbuf_puts(b, "}");
        first = false;
    }
    for (size_t i = 0; i < w->ntools; i++) {
        fbuf_puts(b, first ? "" : ",");
        fbuf_puts(b, "{\"type\":\"tool_use\",\"id\":");
        fbuf_json_str(b, w->ids[i], strlen(w->ids[i]), false);
        fbuf_puts(b, ",\"name\":");
        fbuf_json_str(b, w->names[i], strlen(w->names[i]), false);
        fbuf_puts(b, ",\"input\":");
        /* the servers json.loads the arguments; the scenarios' arguments are JSON text */
        if (w->args[i].len)
            fbuf_put(b, w->args[i].p, w->args[i].len);
        else
            fbuf_puts(b, "{}");
        fbuf_puts(b, "}");
        first = false;
    }
    fbuf_puts(b, "],\"model\":");
    fbuf_json_str(b, c->model, strlen(c->model), false);
    fbuf_printf(b,
                ",\"stop_reason\":\"%s\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":%ld,"
                "\"output_tokens\":%ld}}",
                stop_reason(w->finish), w->usage.prompt, w->usage.completion);
}
