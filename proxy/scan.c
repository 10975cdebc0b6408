/* scan.c — `loopguard scan [--config FILE] [--channel C] [--max-bytes N] FILE...`.
 *
 * Feeds each file through a fresh guard for one channel, in fixed 4 KiB chunks (the
 * verdict does not depend on the chunking), calls guard_finish at the end of the file,
 * and prints one JSON line:
 *   {"file","bytes","tripped","detector","at_byte","loop_start","unit","repeats"}
 * with detector/at_byte/loop_start/unit null when the file is clean. "bytes" counts the
 * bytes fed (all of the file, or the first --max-bytes). The guard settings come from the
 * config file's `guard.<channel>` (built-in defaults without --config), exactly as the
 * proxy would use them, which makes this the tool for tuning thresholds on saved logs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
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

/* Scans one file; prints its line. Returns 0, or -1 after an I/O error message. */
static int scan_file(const char *path, const guard_params *gp, lg_channel ch, uint64_t max)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "loopguard scan: %s: %s\n", path, strerror(errno));
        return -1;
    }
    guard *g = guard_new(gp, ch);
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
    if (rc == 0) {
        guard_finish(g);
        const guard_verdict *v = guard_get_verdict(g);
        printf("{\"file\":");
        put_json_string(stdout, path, strlen(path));
        printf(",\"bytes\":%llu,\"tripped\":%s", (unsigned long long)guard_bytes(g),
               v ? "true" : "false");
        if (v) {
            printf(",\"detector\":");
            put_json_string(stdout, v->detector, strlen(v->detector));
            printf(",\"at_byte\":%llu,\"loop_start\":%llu,\"unit\":",
                   (unsigned long long)v->at_byte, (unsigned long long)v->loop_start);
            put_json_string(stdout, v->unit, v->unit_len);
            printf(",\"repeats\":%u}\n", v->repeats);
        } else {
            printf(",\"detector\":null,\"at_byte\":null,\"loop_start\":null,\"unit\":null,"
                   "\"repeats\":null}\n");
        }
    }
    guard_free(g);
    if (f != stdin) fclose(f);
    return rc;
}

/* Prints what was wrong (when `what` is not NULL), then the usage; returns 2. */
static int usage(const char *what, const char *arg)
{
    if (what) fprintf(stderr, "loopguard scan: %s%s\n", what, arg ? arg : "");
    fputs("usage: loopguard scan [--config FILE] [--channel content|reasoning|tool_args]\n"
          "                      [--max-bytes N] FILE...   (- is stdin)\n",
          stderr);
    return 2;
}

int scan_main(int argc, char **argv)
{
    const char *config = NULL;
    lg_channel ch = LG_CH_CONTENT;
    uint64_t max = 0;
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
    const guard_params *gp = config_guard_params(cfg, NULL, ch);
    for (; i < argc; i++, nfiles++) {
        if (scan_file(argv[i], gp, ch, max) < 0) status = 1;
        fflush(stdout);
    }
    config_free(cfg);
    return status;
}
