/* assemble.c — the whole response built from a released stream (see assemble.h).
 *
 * Memory: the released text of each channel and each tool call's arguments are kept in
 * full (the response must hold them anyway); metadata is a few small cJSON objects.
 * Rendering is O(response). */
#include "proxy/assemble.h"

#include <stdlib.h>
#include <string.h>

#include "proxy/buf.h"
#include "proxy/xalloc.h"

typedef struct asm_tool {
    int index;
    char *id;
    char *name;
    lg_buf args;
} asm_tool;

struct lg_assembler {
    bool chat;
    bool args_external;
    char *id, *model;
    long long created;
    bool has_created;
    char *finish, *finish_override;
    cJSON *top_extra;    /* other top-level fields (system_fingerprint, ...) */
    cJSON *choice_extra; /* other choice fields (matched_stop, stop_reason, ...) */
    cJSON *usage;
    lg_buf text[2]; /* LG_CH_REASONING, LG_CH_CONTENT */
    asm_tool *tools;
    size_t n_tools, cap_tools;
};

lg_assembler *asm_new(bool chat)
{
    lg_assembler *a = lg_xcalloc(1, sizeof(*a));
    a->chat = chat;
    a->top_extra = dl_json_must(cJSON_CreateObject());
    a->choice_extra = dl_json_must(cJSON_CreateObject());
    return a;
}

void asm_free(lg_assembler *a)
{
    if (!a) return;
    free(a->id);
    free(a->model);
    free(a->finish);
    free(a->finish_override);
    cJSON_Delete(a->top_extra);
    cJSON_Delete(a->choice_extra);
    cJSON_Delete(a->usage);
    lg_buf_free(&a->text[0]);
    lg_buf_free(&a->text[1]);
    for (size_t i = 0; i < a->n_tools; i++) {
        free(a->tools[i].id);
        free(a->tools[i].name);
        lg_buf_free(&a->tools[i].args);
    }
    free(a->tools);
    free(a);
}

/* The tool call with this index, created (in arrival order) when new. */
static asm_tool *tool_at(lg_assembler *a, int index)
{
    for (size_t i = 0; i < a->n_tools; i++)
        if (a->tools[i].index == index) return &a->tools[i];
    if (a->n_tools == a->cap_tools) {
        a->cap_tools = a->cap_tools ? a->cap_tools * 2 : 4;
        a->tools = lg_xrealloc(a->tools, a->cap_tools * sizeof(*a->tools));
    }
    asm_tool *t = &a->tools[a->n_tools++];
    memset(t, 0, sizeof(*t));
    t->index = index;
    return t;
}

/* Copies every non-null member of `from` not named in skip[] into `into`, replacing: a
 * later value wins, null never erases one. */
static void merge_extra(cJSON *into, const cJSON *from, const char *const *skip, size_t nskip)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, from)
    {
        if (!it->string || cJSON_IsNull(it)) continue;
        size_t k = 0;
        while (k < nskip && strcmp(skip[k], it->string))
            k++;
        if (k == nskip) dl_json_set(into, it->string, cJSON_Duplicate(it, 1));
    }
}

static void keep_first(char **dst, const char *src)
{
    if (!*dst && src) *dst = lg_xstrdup(src);
}

void asm_meta(lg_assembler *a, const dl_delta *d)
{
    static const char *const top_skip[] = {"id", "object", "created", "model", "choices", "usage"};
    static const char *const choice_skip[] = {"index",    "delta",         "text",
                                              "logprobs", "finish_reason", "message"};
    if (d->kind != DL_CHUNK) return;
    keep_first(&a->id, d->id);
    keep_first(&a->model, d->model);
    if (d->has_created && !a->has_created) {
        a->created = d->created;
        a->has_created = true;
    }
    merge_extra(a->top_extra, d->root, top_skip, sizeof(top_skip) / sizeof(top_skip[0]));
    if (d->usage) {
        cJSON_Delete(a->usage);
        a->usage = dl_json_must(cJSON_Duplicate(d->usage, 1));
    }
    if (!d->choice || d->choice_index != 0) return;
    if (d->finish_reason) {
        free(a->finish);
        a->finish = lg_xstrdup(d->finish_reason);
    }
    merge_extra(a->choice_extra, d->choice, choice_skip,
                sizeof(choice_skip) / sizeof(choice_skip[0]));
    for (size_t i = 0; i < d->n_tools; i++) {
        const dl_tool *f = &d->tools[i];
        asm_tool *t = tool_at(a, f->index);
        keep_first(&t->id, f->id);
        keep_first(&t->name, f->name);
        if (!a->args_external) lg_buf_append(&t->args, f->args, f->args_len);
    }
}

void asm_tool_args_external(lg_assembler *a, bool external)
{
    a->args_external = external;
}

void asm_tool_args(lg_assembler *a, int index, const char *s, size_t n)
{
    lg_buf_append(&tool_at(a, index)->args, s, n);
}

void asm_text(lg_assembler *a, int channel, const char *s, size_t n)
{
    if (channel == LG_CH_TOOL_ARGS) {
        asm_tool *t = a->n_tools ? &a->tools[a->n_tools - 1] : tool_at(a, 0);
        lg_buf_append(&t->args, s, n);
    } else if (channel == LG_CH_REASONING || channel == LG_CH_CONTENT) {
        lg_buf_append(&a->text[channel == LG_CH_CONTENT], s, n);
    }
}

void asm_set_finish(lg_assembler *a, const char *finish_reason)
{
    free(a->finish_override);
    a->finish_override = finish_reason ? lg_xstrdup(finish_reason) : NULL;
}

size_t asm_text_len(const lg_assembler *a, int channel)
{
    if (channel != LG_CH_REASONING && channel != LG_CH_CONTENT) return 0;
    return a->text[channel == LG_CH_CONTENT].len;
}

static cJSON *str_item(const lg_buf *b)
{
    return cJSON_CreateString(b->p ? b->p : "");
}

static cJSON *render_tools(const lg_assembler *a)
{
    cJSON *arr = dl_json_must(cJSON_CreateArray());
    /* by index; n is small, so a selection over the indices is fine (O(n^2)) */
    int last = -1;
    for (size_t k = 0; k < a->n_tools; k++) {
        const asm_tool *best = NULL;
        for (size_t i = 0; i < a->n_tools; i++)
            if (a->tools[i].index > last && (!best || a->tools[i].index < best->index))
                best = &a->tools[i];
        last = best->index;
        cJSON *tc = dl_json_must(cJSON_CreateObject()), *fn = dl_json_must(cJSON_CreateObject());
        if (best->id) dl_json_set(tc, "id", cJSON_CreateString(best->id));
        dl_json_set(tc, "type", cJSON_CreateString("function"));
        dl_json_set(fn, "name", cJSON_CreateString(best->name ? best->name : ""));
        dl_json_set(fn, "arguments", str_item(&best->args));
        dl_json_set(tc, "function", fn);
        cJSON_AddItemToArray(arr, tc);
    }
    return arr;
}

char *asm_render(const lg_assembler *a, int mode)
{
    const lg_buf *r = &a->text[0], *c = &a->text[1];
    cJSON *root = dl_json_must(cJSON_CreateObject());
    if (a->id) dl_json_set(root, "id", cJSON_CreateString(a->id));
    dl_json_set(root, "object",
                cJSON_CreateString(a->chat ? "chat.completion" : "text_completion"));
    if (a->has_created) dl_json_set(root, "created", cJSON_CreateNumber((double)a->created));
    if (a->model) dl_json_set(root, "model", cJSON_CreateString(a->model));
    merge_extra(root, a->top_extra, NULL, 0);

    /* content with the inline reasoning prefix when asked for */
    lg_buf text = LG_BUF_INIT;
    if (mode == 2 && r->len) {
        lg_buf_append_str(&text, "<think>");
        lg_buf_append(&text, r->p, r->len);
        lg_buf_append_str(&text, "</think>\n\n");
    }
    lg_buf_append(&text, c->p, c->len);
    const char *rkey = mode == 0 ? "reasoning_content" : mode == 1 ? "reasoning" : NULL;

    cJSON *choices = dl_json_must(cJSON_CreateArray()),
          *choice = dl_json_must(cJSON_CreateObject());
    dl_json_set(root, "choices", choices);
    cJSON_AddItemToArray(choices, choice);
    dl_json_set(choice, "index", cJSON_CreateNumber(0));
    if (a->chat) {
        cJSON *msg = dl_json_must(cJSON_CreateObject());
        dl_json_set(msg, "role", cJSON_CreateString("assistant"));
        dl_json_set(msg, "content",
                    text.len == 0 && a->n_tools ? cJSON_CreateNull() : str_item(&text));
        if (rkey && r->len) dl_json_set(msg, rkey, str_item(r));
        if (a->n_tools) dl_json_set(msg, "tool_calls", render_tools(a));
        dl_json_set(choice, "message", msg);
    } else {
        dl_json_set(choice, "text", str_item(&text));
        if (rkey && r->len) dl_json_set(choice, rkey, str_item(r));
    }
    lg_buf_free(&text);
    dl_json_set(choice, "logprobs", cJSON_CreateNull());
    const char *fin = a->finish_override ? a->finish_override : a->finish;
    dl_json_set(choice, "finish_reason", fin ? cJSON_CreateString(fin) : cJSON_CreateNull());
    merge_extra(choice, a->choice_extra, NULL, 0);
    if (a->usage) dl_json_set(root, "usage", cJSON_Duplicate(a->usage, 1));

    return dl_json_print_free(root);
}
