# sift — build, run, test. `make` builds ./sift (CPU path always; CUDA path when nvcc exists,
# added by the CUDA backend). `make run` fetches the default model and answers a prompt.
# `make test` runs every CPU test (C unit tests + Python reference tests in .venv).

CC      ?= cc
ARCH    ?= -march=x86-64-v3
CFLAGS  ?= -O3 $(ARCH) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fopenmp -MMD -MP \
           -I/usr/include/x86_64-linux-gnu/openblas-openmp
OPENBLAS_A ?= /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.a
PCRE2_A    ?= /usr/lib/x86_64-linux-gnu/libpcre2-8.a
# Static: OpenBLAS (OpenMP build), PCRE2, libgomp (the OpenMP runtime OpenBLAS and sift share),
# libgcc. Dynamic: glibc only (libc, libm, libpthread, libdl).
LDLIBS  += $(OPENBLAS_A) $(PCRE2_A) -Wl,-Bstatic -lgomp -Wl,-Bdynamic -lm -lpthread -ldl \
           -static-libgcc

MODEL   ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CFLAGS  += -DSIFT_VERSION='"$(VERSION)"'

LIB_SRC := $(wildcard cmd/*.c util/*.c weights/*.c tok/*.c model/*.c attn/*.c kv/*.c policies/*.c)
LIB_OBJ := $(LIB_SRC:%.c=build/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=build/tests/%)
# tests/tool_*.c: small programs the Python tests drive (dequantise a buffer, tokenize, dump logits).
TOOL_SRC := $(wildcard tests/tool_*.c)
TOOL_BIN := $(TOOL_SRC:tests/%.c=build/tests/%)

.PHONY: all run test test-c fuzz model deps clean
all: sift

build/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

build/libsift.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

sift: build/main.o build/libsift.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

build/tests/%: build/tests/%.o build/libsift.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# libFuzzer targets (clang): the GGUF reader, the tokenizer and chat templates.
FUZZ_CC    ?= clang
FUZZ_FLAGS := -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
              -fno-sanitize-recover=undefined
FUZZ_SECONDS ?= 10
build/fuzz/fuzz_gguf: fuzz/fuzz_gguf.c weights/gguf.c weights/dequant.c util/check.c $(wildcard weights/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ -lm
build/fuzz/fuzz_tok: fuzz/fuzz_tok.c $(wildcard tok/*.c tok/*.h) weights/gguf.c weights/dequant.c util/check.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ $(PCRE2_A) -lm

build/fuzz/fuzz_phi: fuzz/fuzz_phi.c attn/phi_file.c attn/phi_cpu.c util/check.c attn/phi.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ -lm

fuzz: build/fuzz/fuzz_gguf build/fuzz/fuzz_tok build/fuzz/fuzz_phi $(MODEL)
	@bash fuzz/run.sh $(FUZZ_SECONDS)

# Prerequisites: Debian packages (when missing) and the Python reference venv.
deps:
	@bash tests/setup.sh

model: $(MODEL)
$(MODEL):
	@bash weights/fetch_default.sh $(MODEL)

run: deps
	@$(MAKE) --no-print-directory sift model
	./sift -m $(MODEL) --chat -p "What is the capital of France? Answer in one sentence." -n 48 --temp 0

test-c: $(TEST_BIN)
	@bash tests/run_c.sh $(TEST_BIN)

test: deps
	@$(MAKE) --no-print-directory sift $(TEST_BIN) $(TOOL_BIN) build/fuzz/fuzz_gguf build/fuzz/fuzz_tok build/fuzz/fuzz_phi model
	@bash tests/run.sh

clean:
	rm -rf build sift

-include $(LIB_OBJ:.o=.d) build/main.d $(TEST_BIN:%=%.d) $(TOOL_BIN:%=%.d)
