/* scan.c — `loopguard scan [--config FILE] [--channel C] [--max-bytes N] [--prompt FILE]
 *                          [--records] FILE...`.
 *
 * Feeds each file through a fresh guard for one channel, in fixed 4 KiB chunks (the
 * verdict does not depend on the chunking), calls guard_finish at the end of the file,
 * and prints one JSON line:
 *   {"file","bytes","tripped","detector","at_byte","loop_start","unit","repeats"}
 * with detector/at_byte/loop_start/unit null when the file is clean. "bytes" counts the
 * bytes fed (all of the file, or the first --max-bytes). The guard settings come from the
 * config file's `guard.<channel>` (built-in defaults without --config), exactly as the
 * proxy would use them, which makes this the tool for tuning thresholds on saved logs.
 * --prompt FILE gives every guard that file as the request's prompt (guard_set_prompt), as
 * the proxy gives each guard its request's: repetition the prompt asks for or holds earns
 * slack.
 *
 * With --records each FILE holds request/answer records instead of one text: a JSON
 * array of objects (AlpacaEval's model_outputs.json as is) when its first non-space byte
 * is `[`, otherwise JSONL (one object per line, blank lines skipped). A record is
 * {"instruction"|"prompt"|"messages", "output", optional "generator"}; each record's
 * output goes through a fresh guard and gets its own line, which adds "record" (the
 * 0-based index in the file) and "generator" when the record has one. The record's prompt
 * (instruction, prompt, or the contents of its chat messages: guard_set_prompt_json) is
 * handed to the guard before the output, after --prompt's. A record
 * that is not an object with a string "output" is reported on stderr and skipped (exit
 * status 1); the file's other records are still scanned. */
#include <cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "proxy/buf.h"
#include "proxy/scan.h"

/* Writes `s` (n bytes) as a JSON string; invalid UTF-8 becomes U+FFFD so the line
 * always parses. */
static void put_json_string(FILE *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    fputc('"', out);
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        if (c < 0x80) {
            if (c == '"' || c == '\\')
                fprintf(out, "\\%c", c);
            else if (c == '\n')
                fputs("\\n", out);
            else if (c == '\t')
                fputs("\\t", out);
            else if (c < 0x20 || c == 0x7F)
                fprintf(out, "\\u%04x", c);
            else
                fputc(c, out);
            i++;
            continue;
        }
        size_t len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
        size_t k = 1;
        while (len && k < len && i + k < n && (u[i + k] & 0xC0) == 0x80)
            k++;
        if (len && k == len) {
            fwrite(u + i, 1, len, out);
            i += len;
        } else {
            fputs("\\ufffd", out);
            i += k;
        }
    }
    fputc('"', out);
}

/* What a record adds to its line: its index and generator (NULL: none). */
typedef struct scan_record_id {
    size_t index;
    const char *generator;
} scan_record_id;

/* Finishes `g` and prints its JSON line for `path` (and record `rec`, NULL for a plain
 * file). */
static void print_verdict(const char *path, const scan_record_id *rec, guard *g)
{
    guard_finish(g);
    const guard_verdict *v = guard_get_verdict(g);
    printf("{\"file\":");
    put_json_string(stdout, path, strlen(path));
    if (rec) {
        printf(",\"record\":%zu", rec->index);
        if (rec->generator) {
            printf(",\"generator\":");
            put_json_string(stdout, rec->generator, strlen(rec->generator));
        }
    }
    printf(",\"bytes\":%llu,\"tripped\":%s", (unsigned long long)guard_bytes(g),
           v ? "true" : "false");
    if (v) {
        printf(",\"detector\":");
        put_json_string(stdout, v->detector, strlen(v->detector));
        printf(",\"at_byte\":%llu,\"loop_start\":%llu,\"unit\":", (unsigned long long)v->at_byte,
               (unsigned long long)v->loop_start);
        put_json_string(stdout, v->unit, v->unit_len);
        printf(",\"repeats\":%u}\n", v->repeats);
    } else {
        printf(",\"detector\":null,\"at_byte\":null,\"loop_start\":null,\"unit\":null,"
               "\"repeats\":null}\n");
    }
}

/* Scans one file; prints its line. Returns 0, or -1 after an I/O error message. */
static int scan_file(const char *path, const guard_params *gp, lg_channel ch, uint64_t max,
                     const lg_buf *prompt)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "loopguard scan: %s: %s\n", path, strerror(errno));
        return -1;
    }
    guard *g = guard_new(gp, ch);
    guard_set_prompt(g, prompt->p ? prompt->p : "", prompt->len);
    char buf[4096];
    uint64_t total = 0;
    int rc = 0;
    while (!max || total < max) {
        size_t want = sizeof(buf);
        if (max && max - total < want) want = (size_t)(max - total);
        size_t n = fread(buf, 1, want, f);
        total += n;
        if (n && guard_feed(g, buf, n)) break;
        if (n < want) {
            if (ferror(f)) {
                fprintf(stderr, "loopguard scan: %s: read error\n", path);
                rc = -1;
            }
            break;
        }
    }
    if (rc == 0) print_verdict(path, NULL, g);
    guard_free(g);
    if (f != stdin) fclose(f);
    return rc;
}

/* Reads all of `f` into `b`. Returns 0, or -1 on a read error. */
static int read_all(FILE *f, lg_buf *b)
{
    for (;;) {
        lg_buf_reserve(b, 65536);
        size_t n = fread(b->p + b->len, 1, b->cap - b->len - 1, f);
        b->len += n;
        b->p[b->len] = '\0';
        if (n == 0) return ferror(f) ? -1 : 0;
    }
}

/* Scans record `index` of `path` through a fresh guard and prints its line. Returns 0, or
 * -1 after a message when the record is not an object with a string "output". */
static int scan_record(const char *path, size_t index, const cJSON *rec, const guard_params *gp,
                       lg_channel ch, uint64_t max, const lg_buf *prompt)
{
    const cJSON *output = cJSON_GetObjectItemCaseSensitive(rec, "output");
    if (!cJSON_IsObject(rec) || !cJSON_IsString(output)) {
        fprintf(stderr, "loopguard scan: %s: record %zu: not an object with a string \"output\"\n",
                path, index);
        return -1;
    }
    const cJSON *gen = cJSON_GetObjectItemCaseSensitive(rec, "generator");
    scan_record_id id = {index, cJSON_IsString(gen) ? gen->valuestring : NULL};
    guard *g = guard_new(gp, ch);
    guard_set_prompt(g, prompt->p ? prompt->p : "", prompt->len);
    guard_set_prompt_json(g, rec);
    const char *text = output->valuestring;
    size_t len = strlen(text);
    if (max && len > max) len = (size_t)max;
    for (size_t off = 0; off < len;) {
        size_t n = len - off < 4096 ? len - off : 4096;
        if (guard_feed(g, text + off, n)) break;
        off += n;
    }
    print_verdict(path, &id, g);
    guard_free(g);
    return 0;
}

/* Scans every record of a --records file (see the top of this file). Returns 0, or -1
 * after a message when the file could not be read or parsed, or a record was bad. */
static int scan_records(const char *path, const guard_params *gp, lg_channel ch, uint64_t max,
                        const lg_buf *prompt)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "loopguard scan: %s: %s\n", path, strerror(errno));
        return -1;
    }
    lg_buf in = LG_BUF_INIT;
    int rc = read_all(f, &in);
    if (f != stdin) fclose(f);
    if (rc < 0) {
        fprintf(stderr, "loopguard scan: %s: read error\n", path);
        lg_buf_free(&in);
        return -1;
    }
    const char *p = in.p ? in.p : "";
    p += strspn(p, " \t\r\n");
    if (*p == '[') {
        cJSON *arr = cJSON_ParseWithLength(p, in.len - (size_t)(p - in.p));
        if (!cJSON_IsArray(arr)) {
            fprintf(stderr, "loopguard scan: %s: not a JSON array of records\n", path);
            rc = -1;
        }
        const cJSON *list = cJSON_IsArray(arr) ? arr : NULL, *rec;
        size_t index = 0;
        cJSON_ArrayForEach(rec, list)
        {
            if (scan_record(path, index++, rec, gp, ch, max, prompt) < 0) rc = -1;
        }
        cJSON_Delete(arr);
    } else {
        size_t index = 0, lineno = 0;
        while (*p) {
            const char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            lineno++;
            if (strspn(p, " \t\r") < n) {
                cJSON *rec = cJSON_ParseWithLength(p, n);
                if (!rec) {
                    fprintf(stderr, "loopguard scan: %s: line %zu: not a JSON record\n", path,
                            lineno);
                    rc = -1;
                    index++;
                } else {
                    if (scan_record(path, index++, rec, gp, ch, max, prompt) < 0) rc = -1;
                    cJSON_Delete(rec);
                }
            }
            if (!nl) break;
            p = nl + 1;
        }
    }
    lg_buf_free(&in);
    return rc;
}

/* Prints what was wrong (when `what` is not NULL), then the usage; returns 2. */
static int usage(const char *what, const char *arg)
{
    if (what) fprintf(stderr, "loopguard scan: %s%s\n", what, arg ? arg : "");
    fputs("usage: loopguard scan [--config FILE] [--channel content|reasoning|tool_args]\n"
          "                      [--max-bytes N] [--prompt FILE] [--records] FILE...\n"
          "                      (- is stdin)\n"
          "  --prompt:  FILE is the request's prompt: repetition it asks for or holds earns\n"
          "             slack\n"
          "  --records: each FILE is a JSON array or JSONL of {instruction|prompt|messages,\n"
          "             output[, generator]} records (AlpacaEval's model_outputs.json as is);\n"
          "             one line per record, with \"record\" (index) and \"generator\"\n",
          stderr);
    return 2;
}

int scan_main(int argc, char **argv)
{
    const char *config = NULL;
    lg_channel ch = LG_CH_CONTENT;
    uint64_t max = 0;
    bool records = false;
    const char *prompt_path = NULL;
    int i, status = 0, nfiles = 0;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config") && i + 1 < argc) {
            config = argv[++i];
        } else if (!strcmp(a, "--channel") && i + 1 < argc) {
            const char *c = argv[++i];
            int k;
            for (k = 0; k < LG_CH_COUNT; k++)
                if (!strcmp(c, guard_channel_name((lg_channel)k))) break;
            if (k == LG_CH_COUNT)
                return usage("--channel: expected content, reasoning or tool_args, got ", c);
            ch = (lg_channel)k;
        } else if (!strcmp(a, "--max-bytes") && i + 1 < argc) {
            char *end;
            max = strtoull(argv[++i], &end, 10);
            if (*end || !max || argv[i][0] == '-')
                return usage("--max-bytes: expected a positive number of bytes, got ", argv[i]);
        } else if (!strcmp(a, "--records")) {
            records = true;
        } else if (!strcmp(a, "--prompt") && i + 1 < argc) {
            prompt_path = argv[++i];
        } else if (!strcmp(a, "--") || a[0] != '-' || !strcmp(a, "-")) {
            break;
        } else if (!strcmp(a, "--config") || !strcmp(a, "--channel") || !strcmp(a, "--max-bytes")) {
            return usage("missing value after ", a);
        } else {
            return usage("unknown option ", a);
        }
    }
    if (i < argc && !strcmp(argv[i], "--")) i++;
    if (i >= argc) return usage("no FILE to scan (- reads stdin)", NULL);

    lg_config *cfg = config_new_defaults();
    if (config) {
        char err[512];
        if (config_load_file(cfg, config, err, sizeof(err)) < 0) {
            fprintf(stderr, "loopguard scan: %s\n", err);
            config_free(cfg);
            return 2;
        }
    }
    lg_buf prompt = LG_BUF_INIT;
    if (prompt_path) {
        FILE *f = fopen(prompt_path, "rb");
        int rc = f ? read_all(f, &prompt) : -1;
        if (f) fclose(f);
        if (rc < 0) {
            fprintf(stderr, "loopguard scan: --prompt %s: %s\n", prompt_path,
                    f ? "read error" : strerror(errno));
            lg_buf_free(&prompt);
            config_free(cfg);
            return 2;
        }
    }
    const guard_params *gp = config_guard_params(cfg, NULL, ch);
    for (; i < argc; i++, nfiles++) {
        int rc = records ? scan_records(argv[i], gp, ch, max, &prompt)
                         : scan_file(argv[i], gp, ch, max, &prompt);
        if (rc < 0) status = 1;
        fflush(stdout);
    }
    lg_buf_free(&prompt);
    config_free(cfg);
    return status;
}
