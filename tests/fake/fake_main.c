/* fake_main.c — command line of the fake upstream (see tests/fake/README.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_dialect.h"
#include "fake_server.h"

static int usage(void)
{
    fprintf(stderr,
            "usage: fake_upstream --listen HOST:PORT [--kind sglang|vllm|openai] [--dialect D]\n"
            "                     [--scenario FILE] [--model NAME] [--stamp] [--pace-ms N]\n"
            "                     [--incremental-streaming-output]\n"
            "                     [--max-records N]\n");
    return 2;
}

int main(int argc, char **argv)
{
    fake_config cfg = {
        .host = "127.0.0.1",
        .kind = FAKE_KIND_SGLANG,
        .dialect = -1,
        .model = "fake-model",
        .max_records = 100000,
    };
    static char host[64];
    const char *scenario = NULL;
    bool listen_given = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--incremental-streaming-output")) {
            cfg.incremental = true;
            continue;
        }
        if (!strcmp(a, "--stamp")) {
            cfg.stamp = true;
            continue;
        }
        if (!v) return usage();
        i++;
        if (!strcmp(a, "--listen")) {
            const char *colon = strrchr(v, ':');
            if (!colon || (size_t)(colon - v) >= sizeof host) return usage();
            memcpy(host, v, (size_t)(colon - v));
            host[colon - v] = '\0';
            cfg.host = host;
            cfg.port = atoi(colon + 1);
            listen_given = true;
        } else if (!strcmp(a, "--kind")) {
            if (!strcmp(v, "sglang"))
                cfg.kind = FAKE_KIND_SGLANG;
            else if (!strcmp(v, "vllm"))
                cfg.kind = FAKE_KIND_VLLM;
            else if (!strcmp(v, "openai"))
                cfg.kind = FAKE_KIND_OPENAI;
            else
                return usage();
        } else if (!strcmp(a, "--dialect")) {
            cfg.dialect = fake_dialect_parse(v);
            if (cfg.dialect < 0) {
                fprintf(stderr, "fake_upstream: unknown dialect %s\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--scenario")) {
            scenario = v;
        } else if (!strcmp(a, "--model")) {
            cfg.model = v;
        } else if (!strcmp(a, "--pace-ms")) {
            cfg.pace_ms = atol(v);
        } else if (!strcmp(a, "--max-records")) {
            cfg.max_records = atol(v);
        } else {
            return usage();
        }
    }
    if (!listen_given) return usage();
    if (cfg.dialect < 0)
        cfg.dialect = cfg.kind == FAKE_KIND_SGLANG ? FAKE_D_SGLANG
                      : cfg.kind == FAKE_KIND_VLLM ? FAKE_D_VLLM
                                                   : FAKE_D_OPENAI;
    if (scenario) {
        char err[512];
        cfg.scenario = fake_scenario_load(scenario, err, sizeof err);
        if (!cfg.scenario) {
            fprintf(stderr, "fake_upstream: %s\n", err);
            return 2;
        }
    }
    return fake_server_run(&cfg);
}
