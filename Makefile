# loopguard — build, test, bench, demo, install, fuzz.
#
# `make` builds build/loopguard (installing the Debian build dependencies first when they
# are missing and we run as root). `make test` runs every test twice: once on the plain
# build and once on the AddressSanitizer+UndefinedBehaviorSanitizer build (build/san).
#
# Sources are discovered by directory so that adding a module needs no Makefile edit:
#   guard/*.c config/*.c proxy/*.c   -> build/libloopguard.a (+ proxy/main.c -> loopguard)
#   tests/unit/test_*.c              -> one cmocka binary each
#   tests/fake/*.c                   -> build/fake_upstream
#   tests/bench/*.c                  -> one binary each (loadgen, guard_bench, ...)
#   tests/fuzz/fuzz_*.c              -> libFuzzer targets (clang), `make fuzz`

CC      ?= cc
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2) --no-print-directory
PREFIX  ?= /usr/local
DESTDIR ?=
SAN     ?= 0

PKGS      := libmicrohttpd libcurl libcjson libpcre2-8
APT_BUILD := build-essential pkg-config libmicrohttpd-dev libcurl4-openssl-dev \
             libcjson-dev libpcre2-dev

ifeq ($(SAN),1)
BUILD   ?= build/san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
OPT     := -O1
else
BUILD   ?= build
SANFLAGS :=
OPT     := -O2
endif

PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-format-truncation -g $(OPT) $(SANFLAGS) -I. $(PKG_CFLAGS)
LDFLAGS += $(SANFLAGS)
LDLIBS  += $(PKG_LIBS) -lpthread -lm

LIB_SRC   := $(filter-out proxy/main.c,$(wildcard guard/*.c config/*.c proxy/*.c))
LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
UNIT_SRC  := $(wildcard tests/unit/test_*.c)
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FAKE_SRC  := $(wildcard tests/fake/*.c)
BENCH_SRC := $(wildcard tests/bench/*.c)
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(BUILD)/%)
FUZZ_SRC  := $(wildcard tests/fuzz/fuzz_*.c)
HDRS      := $(wildcard guard/*.h config/*.h proxy/*.h tests/*/*.h)

.PHONY: all deps test-deps test check unit e2e bench demo run install fuzz fuzz-smoke \
        soak clean format valgrind

all: deps $(BUILD)/loopguard $(BUILD)/fake_upstream $(BENCH_BIN)

# Installs what the build needs when it is missing; as non-root prints the one command.
deps:
	@pkg-config --exists $(PKGS) 2>/dev/null && exit 0; \
	if [ "$$(id -u)" = 0 ]; then \
	  echo "installing build dependencies: $(APT_BUILD)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_BUILD)) >/dev/null; \
	else echo "missing build dependencies; run: sudo apt-get install -y $(APT_BUILD)"; exit 1; fi

# Only the packages whose probe fails are installed: a machine whose Node.js came from
# elsewhere (NodeSource's nodejs bundles npm and conflicts with Debian's npm) keeps it.
TEST_TOOLS := nginx:nginx-light wrk:wrk node:nodejs npm:npm clang:clang curl:curl \
              python3:python3 valgrind:valgrind
FUZZ_RT    := /usr/lib/llvm-14/lib/clang/14.0.6/lib/linux/libclang_rt.fuzzer-x86_64.a

test-deps: deps
	@missing=""; for p in $(TEST_TOOLS); do \
	  command -v $${p%%:*} >/dev/null || missing="$$missing $${p#*:}"; done; \
	pkg-config --exists cmocka || missing="$$missing libcmocka-dev"; \
	[ -e $(FUZZ_RT) ] || missing="$$missing libclang-rt-14-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "installing test dependencies:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null; \
	  else echo "missing test dependencies; run: sudo apt-get install -y$$missing"; exit 1; fi; fi
	@[ -d tests/client/node_modules/openai ] && [ -d tests/client/node_modules/@dwmkerr/mock-llm ] || \
	  (cd tests/client && npm ci --no-audit --no-fund --loglevel=error)

$(BUILD)/obj/%.o: %.c $(HDRS) | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/libloopguard.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/loopguard: $(BUILD)/obj/proxy/main.o $(BUILD)/libloopguard.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/fake_upstream: $(FAKE_SRC) $(HDRS) $(BUILD)/libloopguard.a | deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $(FAKE_SRC) $(BUILD)/libloopguard.a -o $@ $(LDLIBS)

$(BUILD)/%: tests/bench/%.c $(HDRS) $(BUILD)/libloopguard.a
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(BUILD)/libloopguard.a -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(HDRS) $(BUILD)/libloopguard.a | test-deps
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(BUILD)/libloopguard.a -o $@ $(LDLIBS) -lcmocka

# One pass of every suite on one build; tests/run.sh prints the summary line.
check: all $(UNIT_BIN)
	@BUILD=$(BUILD) tests/run.sh

# Every test: plain, under ASan+UBSan, the guarded e2e suites under valgrind memcheck, and a
# short smoke of each fuzz target. Each pass adds its counts to build/test-summary; the last
# line is the total.
test: test-deps
	@mkdir -p build; rm -f build/test-summary; st=0; \
	$(MAKE) --no-print-directory check SAN=0 || st=1; \
	$(MAKE) --no-print-directory check SAN=1 || st=1; \
	$(MAKE) --no-print-directory valgrind || st=1; \
	if $(MAKE) --no-print-directory fuzz-smoke; then f="$(words $(FUZZ_BIN)) 0"; \
	else st=1; f="0 1"; fi; echo "$$f" >> build/test-summary; \
	awk '{p += $$1; f += $$2} END {printf "%d passed, %d failed\n", p, f}' build/test-summary; \
	exit $$st

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

demo: all
	@BUILD=$(BUILD) tests/demo.sh

run: all
	$(BUILD)/loopguard --config config/loopguard.json

# libFuzzer targets: clang with ASan+UBSan; FUZZ_SECONDS per target (default 600). The
# library is compiled once with coverage instrumentation and linked into every target.
FUZZ_SECONDS ?= 600
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)
FUZZ_CFLAGS = -std=c11 -D_GNU_SOURCE -g -O1 -I. $(PKG_CFLAGS) -fno-sanitize-recover=all
FUZZ_OBJ := $(LIB_SRC:%.c=build/fuzz/obj/%.o)
build/fuzz/obj/%.o: %.c $(HDRS) | test-deps
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@
build/fuzz/libfuzzlg.a: $(FUZZ_OBJ)
	@rm -f $@
	ar rcs $@ $^
build/fuzz/%: tests/fuzz/%.c build/fuzz/libfuzzlg.a $(HDRS) | test-deps
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer,address,undefined $< build/fuzz/libfuzzlg.a \
	  -o $@ $(PKG_LIBS) -lpthread -lm

fuzz: test-deps $(FUZZ_BIN)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh

fuzz-smoke: test-deps $(FUZZ_BIN)
	@FUZZ_SECONDS=10 tests/fuzz/run.sh

soak: test-deps all
	@BUILD=$(BUILD) tests/soak.sh

install: deps $(BUILD)/loopguard
	install -D -m 0755 $(BUILD)/loopguard $(DESTDIR)$(PREFIX)/bin/loopguard
	install -D -m 0644 config/loopguard.example.json $(DESTDIR)$(PREFIX)/share/doc/loopguard/loopguard.example.json
	install -D -m 0644 docker/loopguard.service $(DESTDIR)$(PREFIX)/share/doc/loopguard/examples/loopguard.service
	install -D -m 0644 docker/loopguard.1 $(DESTDIR)$(PREFIX)/share/man/man1/loopguard.1

format:
	clang-format -i $(wildcard guard/*.[ch] config/*.[ch] proxy/*.[ch] tests/*/*.[ch])

clean:
	rm -rf build
