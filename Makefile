# moat -- build, run and test. `make run` and `make test` are the two commands in the README.
#
#   make            build build/moatd, build/moat, build/moat-guest
#   make run        install what is missing, build, start moatd, run a command in a sandbox
#   make test       every test: unit (TAP), integration and attack, then again under ASan+UBSan
#   make bench      benchmarks with side-by-side peers (see docs/benchmarks.md)
#   make SANITIZE=1 build into build/san with -fsanitize=address,undefined
#   make TSAN=1     build into build/tsan with -fsanitize=thread (the unit tests run there too)
#   make FUZZ=1 fuzzers   the libFuzzer targets tests/fuzz/fuzz_*.c into build/fuzz/fuzz (clang)
#   make fuzz       build the fuzz targets and run each for FUZZ_SECONDS (scripts/fuzz.sh)

CC ?= cc
CLANG ?= $(firstword $(shell command -v clang-14 clang 2>/dev/null) clang)
SANITIZE ?= 0
TSAN ?= 0
FUZZ ?= 0
ifeq ($(SANITIZE),1)
O ?= build/san
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else ifeq ($(TSAN),1)
O ?= build/tsan
SANFLAGS := -fsanitize=thread -fno-omit-frame-pointer
else ifeq ($(FUZZ),1)
# Everything is built with clang, instrumented for libFuzzer's coverage, ASan and UBSan; only the
# targets link libFuzzer itself (-fsanitize=fuzzer).
O ?= build/fuzz
CC := $(CLANG)
CFLAGS ?= -O1 -g
SANFLAGS := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
else
O ?= build
SANFLAGS :=
endif

WARN := -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2 -Wstrict-prototypes
ifeq ($(FUZZ),1)
# gcc's build checks these; clang's differ: it wants a format attribute on every va_list helper, and
# counts a _cleanup_ variable that is only freed as unused.
WARN += -Wno-format-nonliteral -Wno-unused-variable
endif
CFLAGS ?= -O2 -g
CFLAGS += -std=gnu11 $(WARN) -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -MMD -MP -Isrc $(SANFLAGS)
LDFLAGS += $(SANFLAGS)

DAEMON_LIBS := -lmicrohttpd -lwslay -ljansson -lsqlite3 -lseccomp -lmnl -lnftables -larchive -lssl -lcrypto -lz -lpthread
CLI_LIBS := -lcurl -lwslay -ljansson -larchive

# Every .c beneath a layer's folder (layers may have folders of their own: api/v1, host/linux, ...).
srcs = $(sort $(shell find $(1) -name '*.c' 2>/dev/null))
# proto/ is the guest protocol's wire format, both ends link it; proto/client is the host's end.
COMMON_SRC := $(call srcs,src/common) $(wildcard src/proto/*.c)
CLIENT_SRC := $(call srcs,src/proto/client)
HOST_SRC := $(call srcs,src/host)
STORE_SRC := $(call srcs,src/store)
CONTROL_SRC := $(call srcs,src/control)
API_SRC := $(call srcs,src/api)
MOATD_SRC := $(wildcard src/moatd/*.c)
GUEST_LIB_SRC := $(filter-out src/guest/main.c,$(wildcard src/guest/*.c))
CLI_SRC := $(wildcard src/cli/*.c)

obj = $(patsubst src/%.c,$(O)/obj/%.o,$(1))

LIBMOAT_OBJ := $(call obj,$(COMMON_SRC) $(CLIENT_SRC) $(HOST_SRC) $(STORE_SRC) $(CONTROL_SRC) $(API_SRC))
# The guest is static and never sanitized (ASan does not link statically): its own objects.
GUEST_O := build/guest
GUEST_OBJ := $(patsubst src/%.c,$(GUEST_O)/%.o,$(COMMON_SRC) $(GUEST_LIB_SRC) src/guest/main.c)
GUEST_CFLAGS := -O2 -g -std=gnu11 $(WARN) -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -MMD -MP -Isrc

UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(O)/tests/%,$(UNIT_SRC))
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(patsubst tests/fuzz/%.c,$(O)/fuzz/%,$(FUZZ_SRC))

.PHONY: all run test unit integration bench clean deps format check-format fuzz fuzzers units
all: $(O)/moatd $(O)/moat build/moat-guest build/ui/MANIFEST $(UNIT_BIN) $(O)/bench/criu_bench $(O)/tests/lib/pg_harness

$(O)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(GUEST_O)/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(GUEST_CFLAGS) -c -o $@ $<

# Code-context kernels are embedded into control/contexts.o with .incbin.
$(O)/obj/control/contexts.o: $(wildcard src/control/kernels/kernel.*)

$(O)/libmoat.a: $(LIBMOAT_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(O)/moatd: $(call obj,$(MOATD_SRC)) $(O)/libmoat.a
	$(CC) $(LDFLAGS) -o $@ $^ $(DAEMON_LIBS)

$(O)/moat: $(call obj,$(CLI_SRC) $(COMMON_SRC))
	$(CC) $(LDFLAGS) -o $@ $^ $(CLI_LIBS)

# The web dashboard (ui/): plain files plus vendored npm packages, no bundler (scripts/build_ui.sh;
# skipped with a message where node/npm are missing: moatd then answers /ui/ 503).
build/ui/MANIFEST: $(wildcard ui/src/*) ui/package.json ui/package-lock.json scripts/build_ui.sh
	@scripts/build_ui.sh build/ui

build/moat-guest: $(GUEST_OBJ)
	$(CC) -static -o $@ $^

$(O)/libguest.a: $(patsubst src/%.c,$(GUEST_O)/%.o,$(COMMON_SRC) $(GUEST_LIB_SRC))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# Unit tests link the library (and the guest's library for test_guest_*).
$(O)/tests/test_guest_%: tests/unit/test_guest_%.c $(O)/libguest.a
	@mkdir -p $(dir $@)
	$(CC) $(GUEST_CFLAGS) $(SANFLAGS) -Itests/unit -o $@ $(filter tests/unit/%.c %.a,$^) $(SANFLAGS)

$(O)/tests/%: tests/unit/%.c $(O)/libmoat.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $(filter tests/unit/%.c %.a,$^) $(LDFLAGS) $(DAEMON_LIBS)

# The checkpoint benchmark drives the host layer directly (bench/criu_bench.c; run by hand, see its
# header): built with everything so that it keeps up with the code.
$(O)/bench/criu_bench: bench/criu_bench.c $(O)/libmoat.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $(filter %.c %.a,$^) $(LDFLAGS) $(DAEMON_LIBS)

# The database proxy in a process of its own, routing to one real PostgreSQL (tests/lib/pgtest.py).
$(O)/tests/lib/pg_harness: tests/lib/pg_harness.c $(O)/libmoat.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $(filter %.c %.a,$^) $(LDFLAGS) $(DAEMON_LIBS)

# Fuzz targets (FUZZ=1): a target may #include the .c of a parser whose functions are static (its
# own copy of that file's symbols is then the one linked: the archive member is never pulled).
$(O)/libguestlib.a: $(call obj,$(GUEST_LIB_SRC))
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(O)/fuzz/%: tests/fuzz/%.c $(O)/libguestlib.a $(O)/libmoat.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Wno-unused-function -fsanitize=fuzzer -o $@ $< $(O)/libguestlib.a $(O)/libmoat.a \
	  $(LDFLAGS) -fsanitize=fuzzer $(DAEMON_LIBS)

fuzzers: $(FUZZ_BIN)

# The unit test binaries alone (what TSAN=1 needs).
units: $(UNIT_BIN)

deps:
	@scripts/deps.sh

run: deps all
	@scripts/run.sh

unit: all
	@scripts/unit.sh $(O)

integration: all
	@MOAT_BUILD=$(O) python3 tests/run.py

test: deps
	@scripts/test.sh

bench: deps all
	@scripts/bench.sh

fuzz:
	@scripts/fuzz.sh build/fuzz

CLANG_FORMAT ?= clang-format-14
FORMAT_SRC = $$(find src tests -name '*.[ch]' -not -path '*/node_modules/*')
format:
	$(CLANG_FORMAT) -i $(FORMAT_SRC)

check-format:
	@$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_SRC) && echo "1 passed, 0 failed (check-format)"

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)
