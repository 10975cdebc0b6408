# loopguard — build, test, bench, demo, install, fuzz.
#
# `make` builds build/loopguard and `make install` installs it; neither installs anything
# else: when a Debian build dependency is missing they name it and stop. `make test` and
# `make demo` (the README's two commands) first run `make setup`, which installs what is
# missing (Debian packages when root, the npm test clients) and says what it installs.
# `make test` runs every test twice: once on the plain build and once on the
# AddressSanitizer+UndefinedBehaviorSanitizer build (build/san); the threaded suites also on
# the ThreadSanitizer build (build/tsan).
#
# Nothing here forces parallelism: `make -j2` builds on two cores (.ci/run does).
#
# Sources are discovered by directory so that adding a module needs no Makefile edit:
#   guard/*.c config/*.c proxy/*.c   -> build/libloopguard.a (+ proxy/main.c -> loopguard)
#   tests/unit/test_*.c              -> one cmocka binary each
#   tests/fake/*.c                   -> build/fake_upstream
#   tests/bench/*.c                  -> one binary each (loadgen, guard_bench, ...), except a
#                                       .c with a .h beside it: a part linked into every one
#   tests/fuzz/fuzz_*.c              -> libFuzzer targets (clang), `make fuzz`
# Header dependencies come from the compiler (-MMD -MP: build/**/*.d).

MAKEFLAGS += --no-print-directory
PREFIX  ?= /usr/local
DESTDIR ?=
SAN     ?= 0

PKGS      := libmicrohttpd libcurl libcjson libpcre2-8
APT_BUILD := build-essential pkg-config libmicrohttpd-dev libcurl4-openssl-dev \
             libcjson-dev libpcre2-dev

# SAN=1: ASan+UBSan (build/san). SAN=tsan: ThreadSanitizer, which needs clang (build/tsan).
ifeq ($(SAN),1)
BUILD   ?= build/san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
OPT     := -O1
else ifeq ($(SAN),tsan)
BUILD   ?= build/tsan
CC      := clang
SANFLAGS := -fsanitize=thread -fno-omit-frame-pointer
OPT     := -O1
else
BUILD   ?= build
SANFLAGS :=
OPT     := -O2
# The guard reads every byte of every stream: at -O3 its per-byte loops run faster than at
# -O2 (tests/bench/HISTORY.md has the figures). The sanitizer builds keep their -O1, the
# fuzz build its own flags.
GUARD_OPT := -O3
endif
GUARD_OPT := $(or $(GUARD_OPT),$(OPT))

PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

WARN    := -Wall -Wextra -Werror -Wshadow -Wmissing-prototypes -Wstrict-prototypes -Wformat=2
CFLAGS  += -std=c11 -D_GNU_SOURCE $(WARN) -g $(OPT) $(SANFLAGS) -I. $(PKG_CFLAGS)
DEPFLAGS = -MMD -MP
LDFLAGS += $(SANFLAGS)
LDLIBS  += $(PKG_LIBS) -lpthread -lm

LIB_SRC   := $(filter-out proxy/main.c,$(wildcard guard/*.c config/*.c proxy/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FAKE_SRC  := $(wildcard tests/fake/*.c)
FAKE_OBJ  := $(FAKE_SRC:%.c=$(BUILD)/obj/%.o)
BENCH_LIB := $(patsubst %.h,%.c,$(wildcard tests/bench/*.h))
BENCH_SRC := $(filter-out $(BENCH_LIB),$(wildcard tests/bench/*.c))
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/%)
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
C_FILES   := $(wildcard guard/*.[ch] config/*.[ch] proxy/*.[ch] tests/*/*.[ch])

.PHONY: all deps setup test-deps test check unit e2e tsan bench demo run install fuzz \
        fuzz-smoke soak clean format format-check valgrind test-variants test-build-san \
        test-build-tsan servers unit-bins setup-debs setup-npm

all: $(BUILD)/loopguard $(BUILD)/fake_upstream $(BENCH_BIN)

# Only checks: names the missing build dependencies and stops (`make setup` installs them).
deps:
	@pkg-config --exists $(PKGS) 2>/dev/null && exit 0; \
	echo "missing build dependencies; run: sudo apt-get install -y $(APT_BUILD)" >&2; \
	echo "(or \`make setup\` as root, which \`make test\` and \`make demo\` run first)" >&2; exit 1

# What the tests need beyond the build: a probe command (or pkg-config module, or a file
# clang must find) and the Debian package that provides it. Only the packages whose probe
# fails are installed: a machine whose Node.js came from elsewhere (NodeSource's nodejs
# bundles npm and conflicts with Debian's npm) keeps it.
TEST_TOOLS := nginx:nginx-light wrk:wrk node:nodejs npm:npm clang:clang curl:curl \
              python3:python3 valgrind:valgrind clang-format:clang-format \
              chromium:chromium promtool:prometheus
# The fuzzer and TSan runtimes ship with clang's version-numbered libclang-rt-N-dev.
CLANG_MAJOR = $(shell clang -dumpversion 2>/dev/null | cut -d. -f1)
FUZZ_RT     = $(shell clang -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null)

# Lists what is missing for `make test` (Debian packages), one word each.
define missing_test_deps
missing=""; pkg-config --exists $(PKGS) 2>/dev/null || missing="$(APT_BUILD)"; \
for p in $(TEST_TOOLS); do command -v $${p%%:*} >/dev/null || missing="$$missing $${p#*:}"; done; \
pkg-config --exists cmocka 2>/dev/null || missing="$$missing libcmocka-dev"; \
if command -v clang >/dev/null; then [ -e "$(FUZZ_RT)" ] || missing="$$missing libclang-rt-$(CLANG_MAJOR)-dev"; fi
endef
# Adds the Debian packages whose files the guard's machine-file corpus reads (listed in
# tests/corpus/corpus.py, which fails without them); only setup installs them.
define missing_corpus_debs
command -v python3 >/dev/null && missing="$$missing $$(python3 tests/corpus/corpus.py debs)"
endef

# Installs what the build and the tests need (Debian packages as root, else it names the one
# command; the npm clients under tests/client) and says what it installs. `make test` and
# `make demo` run it first. Two rounds: clang, once installed, may name its runtime package.
# setup-npm installs from npm's cache when it has the locked versions (--prefer-offline).
setup:
	@$(MAKE) setup-debs
	@$(MAKE) setup-npm
setup-debs:
	@for round in 1 2 3; do \
	  $(missing_test_deps); $(missing_corpus_debs); [ -z "$$(echo $$missing)" ] && break; \
	  if [ "$$(id -u)" != 0 ]; then echo "setup: missing; run: sudo apt-get install -y$$missing" >&2; exit 1; fi; \
	  if [ $$round = 3 ]; then echo "setup: still missing after apt-get:$$missing" >&2; exit 1; fi; \
	  echo "setup: installing Debian packages:$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null || exit 1; \
	done
setup-npm:
	@[ -d tests/client/node_modules/openai ] && [ -d tests/client/node_modules/@dwmkerr/mock-llm ] && \
	   [ -d tests/client/node_modules/@anthropic-ai/sdk ] || \
	  { echo "setup: installing the npm test clients (npm ci in tests/client)"; \
	    cd tests/client && npm ci --prefer-offline --no-audit --no-fund --loglevel=error; }
	@[ -d tests/browser/node_modules/puppeteer-core ] || \
	  { echo "setup: installing puppeteer-core for the status page test (npm ci in tests/browser)"; \
	    cd tests/browser && npm ci --prefer-offline --no-audit --no-fund --loglevel=error; }

# Like deps, for the test tools: names what is missing and stops.
test-deps: deps
	@$(missing_test_deps); [ -z "$$missing" ] && exit 0; \
	echo "missing test dependencies; run: sudo apt-get install -y$$missing (or make setup)" >&2; exit 1

$(BUILD)/obj/%.o: %.c | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@
# The guard's per-byte code at GUARD_OPT (its settings, guard_params.c, are read once).
$(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out guard/guard_params.c,$(wildcard guard/*.c))): \
  OPT = $(GUARD_OPT)

# The status page's HTML is assembled into this object (.incbin), out of the compiler's sight.
$(BUILD)/obj/proxy/status_page.o build/fuzz/obj/proxy/status_page.o: proxy/status_page.html

$(BUILD)/libloopguard.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/loopguard: $(BUILD)/obj/proxy/main.o $(BUILD)/libloopguard.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

# The fake is independent of the code it checks: it links cJSON, not libloopguard.a.
$(BUILD)/fake_upstream: $(FAKE_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ -lcjson -lm

$(BUILD)/%: $(BUILD)/obj/tests/bench/%.o $(BENCH_LIB:%.c=$(BUILD)/obj/%.o) $(BUILD)/libloopguard.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(BUILD)/libloopguard.a | test-deps
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS) -lcmocka

# One pass of every suite on one build; tests/run.sh prints the summary line. With
# FORMAT_CHECK=1 (the default) it first checks the C files' formatting (FORMAT_CHECK=0
# skips it).
FORMAT_CHECK ?= 1
check: all $(UNIT_BIN) $(if $(filter 1,$(FORMAT_CHECK)),format-check)
	@BUILD=$(BUILD) JOBS=$(TEST_JOBS) tests/run.sh

# Every test: plain, under ASan+UBSan, the threaded suites under ThreadSanitizer, the guarded
# e2e suites under valgrind memcheck, and a short smoke of each fuzz target (a target is a
# suite and a case). The suites mostly wait (paced upstreams, timeouts, process start-up), so
# tests/run.sh runs TEST_JOBS of them at a time, in two rounds:
#   1. once the plain build and npm ci (setup-npm: the SDK clients, and npm files the
#      machine-file corpus reads) are done: the valgrind suites, alone, because their pacing
#      checks need an unloaded machine. Beside them, at nice 19 so as not to slow them: the
#      plain corpus suites and the other variants' build (test-variants).
#   2. (what still runs beside back at nice 0) every other suite, the slowest builds' first,
#      TEST_JOBS at a time.
# Each round adds its counts to build/test-summary; the last line is the total of cases,
# "N passed, N failed".
TEST_JOBS ?= 3
TEST_ROUND1 := build:valgrind build:corpus
TEST_ROUND2 := build/tsan:tsan build/san:e2e,unit,client,browser,corpus \
               build:e2e,unit,client,browser build/fuzz:fuzz
test:
	@echo "make test: every suite on the plain, ASan+UBSan and TSan builds, valgrind, fuzz"
	@echo "smoke: 7-8 minutes on 2 idle cores (make -j2 test builds on both)."
	@$(MAKE) setup-debs
	@mkdir -p build; rm -f build/test-summary; st=0; t0=$$(date +%s); \
	$(MAKE) SAN=0 all unit-bins format-check || st=1; \
	$(MAKE) setup-npm || st=1; \
	echo "-- plain build and npm ci: $$(( $$(date +%s) - t0 )) s"; \
	nice -n 19 $(MAKE) -k test-variants > build/test-variants.log 2>&1 & bg=$$!; \
	JOBS=$(TEST_JOBS) PASSES="$(TEST_ROUND1)" tests/run.sh || st=1; \
	tests/run.sh --unnice $$bg; wait $$bg || { st=1; echo "test-variants failed:"; }; \
	cat build/test-variants.log; echo "-- round 1: $$(( $$(date +%s) - t0 )) s"; \
	JOBS=$(TEST_JOBS) PASSES="$(TEST_ROUND2)" FUZZ_SECONDS=$(FUZZ_SMOKE_SECONDS) \
	  tests/run.sh || st=1; \
	echo "-- make test: $$(( $$(date +%s) - t0 )) s"; \
	tests/run.sh --total build/test-summary || st=1; \
	exit $$st

# The exchange, upstream and fault e2e suites on the ThreadSanitizer build (clang) with
# four workers, so that requests, health checks and ejections cross threads; and the unit
# tests whose threads share a structure (TSAN_UNIT).
TSAN_UNIT := test_handoff
tsan:
	@$(MAKE) SAN=tsan servers $(TSAN_UNIT:%=build/tsan/tests/%)
	@BUILD=build/tsan SUITES=tsan tests/run.sh

# The guarded-exchange, normalisation, fault and shutdown e2e suites with loopguard under
# valgrind memcheck.
valgrind: all
	@BUILD=build SUITES=valgrind tests/run.sh

unit: all $(UNIT_BIN)
	@BUILD=$(BUILD) SUITES=unit tests/run.sh

e2e: all
	@BUILD=$(BUILD) SUITES=e2e tests/run.sh

bench: test-deps all
	@BUILD=$(BUILD) QUICK=$(QUICK) tests/bench/run.sh

demo: setup
	@$(MAKE) all
	@BUILD=$(BUILD) tests/demo.sh

run: all
	$(BUILD)/loopguard --config config/loopguard.json

# libFuzzer targets: clang with ASan+UBSan; FUZZ_SECONDS per target (default 600). The
# library is compiled once with coverage instrumentation and linked into every target.
FUZZ_SECONDS ?= 600
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)
FUZZ_CFLAGS = -std=c11 -D_GNU_SOURCE -g -O1 -I. $(PKG_CFLAGS) -fno-sanitize-recover=all
FUZZ_OBJ := $(LIB_SRC:%.c=build/fuzz/obj/%.o)
build/fuzz/obj/%.o: %.c | test-deps
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) $(DEPFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@
build/fuzz/libfuzzlg.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^
build/fuzz/%: tests/fuzz/%.c build/fuzz/libfuzzlg.a | test-deps
	clang $(FUZZ_CFLAGS) $(DEPFLAGS) -MF $@.d -MT $@ -fsanitize=fuzzer,address,undefined $< \
	  build/fuzz/libfuzzlg.a -o $@ $(PKG_LIBS) -lpthread -lm

fuzz: test-deps $(FUZZ_BIN)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh

# make test's smoke: every target on its seeds and a few seconds of mutations (the deep run is
# `make fuzz`, FUZZ_SECONDS per target).
FUZZ_SMOKE_SECONDS ?= 5
fuzz-smoke: test-deps $(FUZZ_BIN)
	@FUZZ_SECONDS=$(FUZZ_SMOKE_SECONDS) tests/fuzz/run.sh

# What `make test` builds beside its first round: the servers and unit tests under
# ASan+UBSan (build/san), the servers under ThreadSanitizer (build/tsan) and the fuzz
# targets. The sub-makes share this make's job slots.
test-variants: $(FUZZ_BIN) test-build-san test-build-tsan
test-build-san:
	@$(MAKE) SAN=1 servers unit-bins
test-build-tsan:
	@$(MAKE) SAN=tsan servers $(TSAN_UNIT:%=build/tsan/tests/%)
servers: $(BUILD)/loopguard $(BUILD)/fake_upstream
unit-bins: $(UNIT_BIN)

soak: test-deps all
	@BUILD=$(BUILD) tests/soak.sh

install: deps $(BUILD)/loopguard
	install -D -m 0755 $(BUILD)/loopguard $(DESTDIR)$(PREFIX)/bin/loopguard
	install -D -m 0644 config/loopguard.example.json $(DESTDIR)$(PREFIX)/share/doc/loopguard/loopguard.example.json
	install -D -m 0644 docker/loopguard.service $(DESTDIR)$(PREFIX)/share/doc/loopguard/examples/loopguard.service
	install -D -m 0644 docker/loopguard.1 $(DESTDIR)$(PREFIX)/share/man/man1/loopguard.1

format:
	clang-format -i $(C_FILES)

# Fails, naming the places, when a C file differs from what `make format` would write
# (.clang-format; clang-format 14 as Debian 12 ships it).
format-check: test-deps
	@out=$$(clang-format --dry-run --Werror $(C_FILES) 2>&1); st=$$?; \
	printf '%s\n' "$$out" | sed -n 's/: error: .*/: not formatted (make format)/p'; \
	[ $$st = 0 ] && echo "format-check: OK"

clean:
	rm -rf build

# Objects between a source and a binary are kept, so that a relink does not recompile them.
.SECONDARY:

# The compiler's header dependencies of every object built so far.
-include $(wildcard $(BUILD)/obj/*/*.d $(BUILD)/obj/*/*/*.d build/fuzz/*.d build/fuzz/obj/*/*.d)
