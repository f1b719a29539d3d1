# sift — build, run, test. `make` builds ./sift (CPU path always; CUDA path when nvcc exists;
# `make NVCC=` builds CPU only). `make run` fetches the default model and answers a prompt.
# `make test` runs every CPU test (C unit tests + Python reference tests in .venv).

CC      ?= cc
ARCH    ?= -march=x86-64-v3
CFLAGS  ?= -O3 $(ARCH) -g
CFLAGS  += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fopenmp -MMD -MP \
           -I/usr/include/x86_64-linux-gnu/openblas-openmp
OPENBLAS_A ?= /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.a
PCRE2_A    ?= /usr/lib/x86_64-linux-gnu/libpcre2-8.a
JANSSON_A  ?= /usr/lib/x86_64-linux-gnu/libjansson.a
# Static: OpenBLAS (OpenMP build), PCRE2, jansson (JSON), libgomp (the OpenMP runtime OpenBLAS and sift share),
# libgcc. Dynamic: glibc only (libc, libm, libpthread, libdl).
LDLIBS  += $(OPENBLAS_A) $(PCRE2_A) $(JANSSON_A) -Wl,-Bstatic -lgomp -Wl,-Bdynamic -lm -lpthread -ldl \
           -static-libgcc

# ASAN=1: AddressSanitizer + UndefinedBehaviorSanitizer build (used by `make test-asan`).
ifeq ($(ASAN),1)
SAN     := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
CFLAGS  += $(SAN) -O1
LDFLAGS += $(SAN)
endif

MODEL   ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CFLAGS  += -DSIFT_VERSION='"$(VERSION)"'

LIB_SRC := $(wildcard util/*.c weights/*.c tok/*.c kv/*.c attn/*.c qgemm/*.c backend/*.c model/*.c \
                      policies/*.c fit/*.c jobs/*.c eval/*.c cmd/*.c)
LIB_OBJ := $(LIB_SRC:%.c=build/%.o)
# CUDA path: compiled when nvcc is found. cudart and libstdc++ link statically; cuBLASLt has no
# static library in the toolkit and is opened at run time (dlopen), so the binary starts anywhere.
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifneq ($(strip $(NVCC)),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# sm_90a (H100/H200: sm_90 plus wgmma, which the code guards with SIFT_WGMMA); compute_90 PTX
# for later GPUs, where the guarded bodies are empty and the host never launches them.
CUARCH  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90a,code=sm_90a \
           -gencode arch=compute_90,code=compute_90
NVFLAGS ?= -O3 -g -lineinfo
NVFLAGS += -std=c++17 $(CUARCH) -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings -MMD -MP
CU_SRC  := $(wildcard backend/*.cu attn/*.cu)
LIB_OBJ += $(CU_SRC:%.cu=build/%.o)
CFLAGS  += -DSIFT_CUDA
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart_static -lrt -Wl,-Bstatic -lstdc++ -Wl,-Bdynamic
GPU_BIN := build/tests/gpu_check build/tests/gpu_tables
# The SIMT emulation build (simt/, clang++): the same .cu sources compiled as C++ for the
# CPU, every load and store instrumented (-fsanitize-coverage) for the emulator's checkers
# (-fno-builtin: no stores merged into a memset or memcpy, which the hooks would not see;
# test_simt's case zero-fill-oob);
# build/sift-simt and build/tests/gpu_check-simt run the CUDA backend on the CPU, and
# build/tests/test_simt checks the emulator itself. Linked -no-pie (reports name source lines
# through addr2line) and -rdynamic (gemm_cuda.cu finds the emulated cuBLASLt by dlsym).
SIMT_CXX ?= $(shell command -v clang++ 2>/dev/null)
endif
ifneq ($(strip $(SIMT_CXX)),)
SIMT_FLAGS := -std=c++17 -DSIFT_SIMT -D__CUDACC__ -Isimt/include -O2 -gline-tables-only -fno-pie \
              -ffp-contract=off -fno-vectorize -fno-slp-vectorize -fno-optimize-sibling-calls \
              -Wall -Wextra -Werror -MMD -MP
SIMT_COV   := -fsanitize-coverage=func,trace-loads,trace-stores -fno-builtin
SIMT_RT    := $(patsubst %.cpp,build/simt/%.o,$(wildcard simt/*.cpp)) build/simt/simt/switch.o
SIMT_KOBJ  := $(CU_SRC:%.cu=build/simt/%.o)
C_OBJ      := $(filter-out $(CU_SRC:%.cu=build/%.o),$(LIB_OBJ))
SIMT_LINK  := -no-pie -rdynamic
SIMT_LIBS  := $(OPENBLAS_A) $(PCRE2_A) $(JANSSON_A) -Wl,-Bstatic -lgomp -Wl,-Bdynamic -lm -lpthread \
              -ldl -lstdc++
SIMT_BIN   := build/sift-simt build/tests/gpu_check-simt build/tests/test_simt
endif

.DEFAULT_GOAL := all
# Objects are rebuilt when the configuration changes (CUDA on or off, target architectures, the
# emulation build's flags).
FLAGS_STAMP := build/flags-$(if $(strip $(NVCC)),cuda,cpu)-$(shell echo '$(ARCH) $(CUARCH) $(SIMT_FLAGS) $(SIMT_COV)' | md5sum | cut -c1-8)
$(FLAGS_STAMP):
	@mkdir -p build && rm -f build/flags-* && touch $@
# The two objects that print the version are rebuilt when it changes (a new commit, or the tree
# turning dirty), so `sift --version` and the records' sift_version never name an older commit.
VERSION_STAMP := build/version-$(shell echo '$(VERSION)' | md5sum | cut -c1-8)
$(VERSION_STAMP):
	@mkdir -p build && rm -f build/version-* && touch $@
build/main.o build/jobs/record.o: $(VERSION_STAMP)

build/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -c $< -o $@

# ---- the SIMT emulation build ----
build/simt/%.o: %.cu $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(SIMT_CXX) -x c++ $(SIMT_FLAGS) $(SIMT_COV) -c $< -o $@
build/simt/simt/%.o: simt/%.cpp $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(SIMT_CXX) $(SIMT_FLAGS) -c $< -o $@
build/simt/simt/switch.o: simt/switch.S
	@mkdir -p $(dir $@)
	$(SIMT_CXX) -c $< -o $@
build/simt/tests/%.o: tests/%.cpp $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(SIMT_CXX) $(SIMT_FLAGS) $(SIMT_COV) -c $< -o $@
build/sift-simt: build/main.o $(C_OBJ) $(SIMT_KOBJ) $(SIMT_RT)
	$(CC) $(SIMT_LINK) -o $@ $^ $(SIMT_LIBS)
build/tests/gpu_check-simt: build/tests/gpu_check.o $(C_OBJ) $(SIMT_KOBJ) $(SIMT_RT)
	$(CC) $(SIMT_LINK) -o $@ $^ $(SIMT_LIBS)
# gpu_check-simt with one kernel source replaced by a copy with a planted bug (build/plant/NAME/
# kernel.cu, a copy of PLANT_FILE; tests/test_simt_plant.py)
build/plant/%/kernel.o: build/plant/%/kernel.cu
	$(SIMT_CXX) -x c++ $(SIMT_FLAGS) $(SIMT_COV) -iquote $(dir $(PLANT_FILE)) -c $< -o $@
build/plant/%/gpu_check-simt: build/plant/%/kernel.o build/tests/gpu_check.o $(C_OBJ) $(SIMT_KOBJ) $(SIMT_RT)
	$(CC) $(SIMT_LINK) -o $@ build/tests/gpu_check.o $(C_OBJ) \
	    $(filter-out build/simt/$(PLANT_FILE:.cu=.o),$(SIMT_KOBJ)) $< $(SIMT_RT) $(SIMT_LIBS)
build/tests/test_simt: build/simt/tests/test_simt.o $(SIMT_RT)
	$(CC) $(SIMT_LINK) -o $@ $^ -lpthread -ldl -lm -lstdc++

# the emulator's checks of the PTX tables, on a real GPU (bench/gpu.sh runs it)
build/tests/gpu_tables: tests/test_simt.cpp $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -x cu -o $@ $<

TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=build/tests/%)
# tests/tool_*.c: small programs the Python tests drive (dequantise a buffer, tokenize, dump logits).
TOOL_SRC := $(wildcard tests/tool_*.c)
TOOL_BIN := $(TOOL_SRC:tests/%.c=build/tests/%)

.SECONDARY: build/tests/gpu_check.o
.PHONY: all run test test-c test-bins test-asan test-valgrind test-gpu test-gpu-sanitize fuzz model deps clean \
        man install
all: sift

build/%.o: %.c $(FLAGS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

build/libsift.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

sift: build/main.o build/libsift.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

build/tests/%: build/tests/%.o build/libsift.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# libFuzzer targets (clang): the GGUF reader, the tokenizer and chat templates, safetensors.
FUZZ_CC    ?= clang
FUZZ_FLAGS := -g -O1 -std=c11 -D_GNU_SOURCE $(ARCH) -fsanitize=fuzzer,address,undefined \
              -fno-sanitize-recover=undefined
FUZZ_SECONDS ?= 10
build/fuzz/fuzz_gguf: fuzz/fuzz_gguf.c weights/gguf.c weights/dequant.c util/check.c $(wildcard weights/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ -lm
build/fuzz/fuzz_tok: fuzz/fuzz_tok.c $(wildcard tok/*.c tok/*.h) weights/gguf.c weights/dequant.c \
                     weights/hf.c weights/safetensors.c util/check.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ $(PCRE2_A) $(JANSSON_A) -lm
build/fuzz/fuzz_safetensors: fuzz/fuzz_safetensors.c weights/safetensors.c util/check.c $(wildcard weights/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(filter %.c,$^) -o $@ $(JANSSON_A) -lm

build/fuzz/fuzz_phi: fuzz/fuzz_phi.c attn/phi_file.c attn/phi_cpu.c util/check.c util/outfile.c attn/phi.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -I/usr/include/x86_64-linux-gnu/openblas-openmp $(filter %.c,$^) -o $@ \
	    $(OPENBLAS_A) -lgomp -lm -lpthread

# The CLI parsers: cmd/*.c are included by the target; the rest of the library is linked, from
# objects compiled once under the same sanitizers (build/fuzzobj/, one per file: shared by
# fuzz_cli and fuzz_requests, and built in parallel under make -j).
CLI_LIB_SRC := $(filter-out cmd/%,$(LIB_SRC))
FUZZ_OBJ := $(CLI_LIB_SRC:%.c=build/fuzzobj/%.o)
FUZZ_LIB_FLAGS := $(subst -fsanitize=fuzzer,-fsanitize=fuzzer-no-link,$(FUZZ_FLAGS)) -Wno-unknown-pragmas \
                  -I/usr/include/x86_64-linux-gnu/openblas-openmp
build/fuzzobj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_LIB_FLAGS) -MMD -MP -c $< -o $@
build/fuzz/fuzz_cli: fuzz/fuzz_cli.c $(wildcard cmd/*.c cmd/*.h) $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -Wno-unknown-pragmas -I/usr/include/x86_64-linux-gnu/openblas-openmp \
	    fuzz/fuzz_cli.c $(FUZZ_OBJ) -o $@ $(OPENBLAS_A) $(PCRE2_A) $(JANSSON_A) -lgomp -lm -lpthread
# The request reader (--prompts lines of both shapes): the library without the command line.
build/fuzz/fuzz_requests: fuzz/fuzz_requests.c $(wildcard jobs/*.c jobs/*.h) $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -Wno-unknown-pragmas -I/usr/include/x86_64-linux-gnu/openblas-openmp \
	    fuzz/fuzz_requests.c $(FUZZ_OBJ) -o $@ $(OPENBLAS_A) $(PCRE2_A) $(JANSSON_A) -lgomp -lm -lpthread
# The --resume reader of an earlier run's records (jobs/resume.c), through a FILE* on the input.
build/fuzz/fuzz_resume: fuzz/fuzz_resume.c jobs/resume.c util/check.c util/outfile.c jobs/internal.h jobs/jobs.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -I/usr/include/x86_64-linux-gnu/openblas-openmp $(filter %.c,$^) -o $@ \
	    $(JANSSON_A) -lm
# The --prompt-cache reader (policies/prompt_cache.c), on the library built for fuzz_cli.
build/fuzz/fuzz_pcache: fuzz/fuzz_pcache.c policies/prompt_cache.h $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) -Wno-unknown-pragmas -I/usr/include/x86_64-linux-gnu/openblas-openmp \
	    fuzz/fuzz_pcache.c $(FUZZ_OBJ) -o $@ $(OPENBLAS_A) $(PCRE2_A) $(JANSSON_A) -lgomp -lm -lpthread
FUZZ_BIN := build/fuzz/fuzz_gguf build/fuzz/fuzz_tok build/fuzz/fuzz_safetensors build/fuzz/fuzz_phi \
            build/fuzz/fuzz_cli build/fuzz/fuzz_requests build/fuzz/fuzz_resume build/fuzz/fuzz_pcache

fuzz: $(FUZZ_BIN) $(MODEL)
	@bash fuzz/run.sh $(FUZZ_SECONDS)

# Prerequisites: Debian packages (when missing) and the Python reference venv.
# The man page and completions are printed by sift from its one flag table (cmd/flags.c).
man: build/sift.1
build/sift.1: sift
	@mkdir -p build
	./sift --man > $@

# make install PREFIX=/usr/local (DESTDIR=... for a staged install): the binary, the man page and
# the bash, zsh and fish completions.
PREFIX ?= /usr/local
install: sift build/sift.1
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
	    $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions \
	    $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	install -m 755 sift $(DESTDIR)$(PREFIX)/bin/sift
	install -m 644 build/sift.1 $(DESTDIR)$(PREFIX)/share/man/man1/sift.1
	./sift --completion bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/sift
	./sift --completion zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_sift
	./sift --completion fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/sift.fish

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

test-bins: $(TEST_BIN) $(TOOL_BIN) $(GPU_BIN) $(SIMT_BIN)

test: deps
	@$(MAKE) --no-print-directory -j$$(nproc) sift test-bins $(FUZZ_BIN) model
	@bash tests/run.sh

# One end-to-end prompt per strategy under valgrind memcheck (minutes; not part of `make test`).
test-valgrind: sift model
	@bash tests/valgrind.sh

# The whole CPU suite on sanitized binaries (built in build/asan/).
test-asan: deps model
	@bash tests/asan.sh

# GPU tests (a machine with an NVIDIA GPU): every backend op and every strategy, CUDA vs CPU.
test-gpu: $(GPU_BIN)
	@test -n "$(GPU_BIN)" || { echo "test-gpu: this build has no CUDA path (nvcc not found)"; exit 1; }
	build/tests/gpu_tables
	build/tests/gpu_check

test-gpu-sanitize: $(GPU_BIN)
	@test -n "$(GPU_BIN)" || { echo "test-gpu: this build has no CUDA path (nvcc not found)"; exit 1; }
	@bash tests/gpu_sanitize.sh build/tests/gpu_check

clean:
	rm -rf build sift

-include $(FUZZ_OBJ:.o=.d) $(LIB_OBJ:.o=.d) build/main.d $(TEST_BIN:%=%.d) $(TOOL_BIN:%=%.d) $(GPU_BIN:%=%.d) \
         $(SIMT_KOBJ:.o=.d) $(SIMT_RT:.o=.d)
