# gcomm build.  make            host-only library, examples, tests (any MPI's mpicc)
#               make CUDA=1     + CUDA kernels and IPC transport (nvcc; CUDA_ARCH="90 80" to choose)
#               make HIP=1      + HIP kernels (hipcc)
#               make OFI=1      + libfabric transport between nodes
#               make SAN=1      AddressSanitizer + UndefinedBehaviorSanitizer
#               make SAN=thread ThreadSanitizer
#               make test       the test suite (test/run.sh)       make run   the main benchmark
#               make test-profiler   the example profiler plugin's trace of 4 ranks, checked
#               make test-fault kills, hang diagnosis, soak (test/test_fault.sh)
#               make fuzz       libFuzzer over argument checks and GCOMM_* parsing (clang)
#               make CUDA=1 nccl [NCCL_HOME=/usr/local/cuda]  libnccl.so.2: NCCL's API over gcomm
#               make CUDA=1 nccl-check   it exports every symbol of nccl/nccl_symbols.txt
MPICC   ?= mpicc
MPIEXEC ?= mpiexec
BUILD   ?= build
OPT     ?= -O3
CFLAGS  += -std=gnu11 $(OPT) -g -fPIC -Wall -Wextra -Werror -pthread -I. $(MPI_CFLAGS)
LDLIBS  += -pthread -lrt -ldl -lm $(MPI_LIBS)  # MPI_CFLAGS/MPI_LIBS: for MPICC=gcc without a wrapper

ifeq ($(SAN),1)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

ifeq ($(SAN),thread) # ThreadSanitizer (CI: the threaded progress mode, test/tsan.supp)
CFLAGS  += -fsanitize=thread -fno-omit-frame-pointer
LDFLAGS += -fsanitize=thread
endif

LIB_SRC  = gcomm.c transports/shm.c
LIB_HDR  = gcomm.h gcomm_profiler.h gcomm_internal.h gcomm_sched.h gcomm_reduce.h gcomm_device.h gcomm_gpu.h
LIB_OBJ  = $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC))

ifeq ($(CUDA),1)
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= 90
NVCCFLAGS += -O3 -std=c++17 -Xcompiler -fPIC,-Wall,-Wextra,-Werror -Werror all-warnings \
             $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) -I.
CFLAGS    += -DGCOMM_CUDA -I$(CUDA_HOME)/include
LDLIBS    += -L$(CUDA_HOME)/lib64 -lcudart -lstdc++
LIB_SRC   += transports/p2p.c
LIB_OBJ   += $(BUILD)/obj/gcomm_kernels.o
endif
ifeq ($(HIP),1)
HIPCC     ?= hipcc
# gfx90a (MI200) and gfx942 (MI300); Debian bookworm's hipcc 5.2 (clang 15) does not know gfx942:
# then gfx90a alone, with a warning (HIP_ARCH="..." to choose)
ifeq ($(origin HIP_ARCH),undefined)
HIP_ARCH  := gfx90a $(shell $(HIPCC) --offload-arch=gfx942 -x hip --cuda-device-only -E /dev/null \
                        >/dev/null 2>&1 && echo gfx942)
HIP_ARCH  := $(strip $(HIP_ARCH))
ifeq ($(filter gfx942,$(HIP_ARCH)),)
$(warning $(HIPCC) does not know gfx942 (MI300): building for $(HIP_ARCH) only)
endif
endif
HIPFLAGS  += -O3 -std=c++17 -fPIC -Wall -Wextra -Werror $(foreach a,$(HIP_ARCH),--offload-arch=$(a)) -I.
CFLAGS    += -DGCOMM_HIP -D__HIP_PLATFORM_AMD__
LDLIBS    += -lamdhip64
LIB_SRC   += transports/p2p.c
LIB_OBJ   += $(BUILD)/obj/gcomm_kernels_hip.o
endif
ifeq ($(OFI),1)
CFLAGS    += -DGCOMM_OFI $(OFI_CFLAGS)
LDLIBS    += $(or $(OFI_LIBS),-lfabric)
LIB_SRC   += transports/net_ofi.c
endif
ifeq ($(NCCL),1)
PERF_FLAGS += -DGCOMM_PERF_NCCL -I$(NCCL_HOME)/include
PERF_LIBS  += -L$(NCCL_HOME)/lib -l:libnccl.so.2 -Wl,-rpath,$(NCCL_HOME)/lib
endif

EXAMPLES = $(patsubst examples/%.c,$(BUILD)/%,$(wildcard examples/*.c))
TESTS    = $(patsubst test/%.c,$(BUILD)/test/%,$(wildcard test/*.c))
# profiler plugins (gcomm_profiler.h): the example, and the tests' (outside $(BUILD)/test/*, which
# test/run.sh runs)
PLUGINS  = $(patsubst examples/profiler/%.c,$(BUILD)/examples/libgcomm-profiler-%.so,$(wildcard examples/profiler/*.c)) \
           $(patsubst test/plugins/%.c,$(BUILD)/test/plugins/libgcomm-profiler-%.so,$(wildcard test/plugins/*.c))

all: $(BUILD)/libgcomm.a $(BUILD)/libgcomm.so $(EXAMPLES) $(TESTS) $(PLUGINS)

# What $(BUILD) was last built with: every output depends on it, so that a make with other options
# in the same folder (`make OFI=1 test-net` after `make run`, SAN=1, ...) rebuilds everything
# instead of linking objects built without the network transport. Rewritten only when it changes.
BUILD_CONFIG := $(MPICC) $(CFLAGS) $(LDFLAGS) $(LDLIBS) $(NVCCFLAGS) $(HIPFLAGS) $(PERF_FLAGS) $(PERF_LIBS)
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(shell mkdir -p $(BUILD) && echo '$(BUILD_CONFIG)' | cmp -s - $(BUILD)/config || \
        echo '$(BUILD_CONFIG)' > $(BUILD)/config)
endif
CONFIG = $(BUILD)/config

$(BUILD)/obj/%.o: %.c $(LIB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -c $< -o $@
$(BUILD)/obj/gcomm_kernels.o: gcomm_kernels.cu $(LIB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/obj/gcomm_kernels_hip.o: gcomm_kernels.hip gcomm_kernels.cu $(LIB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(HIPCC) $(HIPFLAGS) -c $< -o $@

$(BUILD)/libgcomm.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/libgcomm.so: $(LIB_OBJ)
	$(MPICC) -shared $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/gcomm_perf: examples/gcomm_perf.c $(BUILD)/libgcomm.a gcomm.h $(CONFIG)
	$(MPICC) $(CFLAGS) $(PERF_FLAGS) -o $@ $< $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS) $(PERF_LIBS)
$(BUILD)/%: examples/%.c $(BUILD)/libgcomm.a gcomm.h $(CONFIG)
	$(MPICC) $(CFLAGS) -o $@ $< $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS)
$(BUILD)/examples/libgcomm-profiler-%.so: examples/profiler/%.c gcomm_profiler.h gcomm.h $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -shared -o $@ $< $(LDFLAGS)
$(BUILD)/test/plugins/libgcomm-profiler-%.so: test/plugins/%.c gcomm_profiler.h gcomm.h $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -shared -o $@ $< $(LDFLAGS)
$(BUILD)/test/%: test/%.c $(BUILD)/libgcomm.a gcomm.h $(wildcard test/*.h) $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -o $@ $< $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS)

test: all
	BUILD=$(BUILD) MPIEXEC=$(MPIEXEC) bash test/run.sh

# the example profiler plugin end to end: 4 ranks of gcomm_perf, merged trace checked
test-profiler: all
	BUILD=$(BUILD) MPIEXEC=$(MPIEXEC) bash test/test_profiler_trace.sh

# the network transport between pretend nodes (make OFI=1 BUILD=build-ofi test-net)
test-net: all
	BUILD=$(BUILD) MPIEXEC=$(MPIEXEC) bash test/test_net.sh

# failures one job cannot show: kills over shm, hang diagnosis, the soak (test/test_fault.sh)
test-fault: all
	BUILD=$(BUILD) MPIEXEC=$(MPIEXEC) bash test/test_fault.sh

# libFuzzer (clang) over argument checks and GCOMM_* parsing: FUZZ_SECONDS of inputs, no finding
FUZZ_CC      ?= clang
FUZZ_SECONDS ?= 60
$(BUILD)/fuzz/fuzz_gcomm: test/fuzz/fuzz_gcomm.c gcomm.c transports/shm.c $(LIB_HDR)
	@mkdir -p $(dir $@)
	MPICH_CC=$(FUZZ_CC) OMPI_CC=$(FUZZ_CC) $(MPICC) -std=gnu11 -O1 -g -Wall -Wextra -Werror \
	  -pthread -I. $(MPI_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -o $@ test/fuzz/fuzz_gcomm.c transports/shm.c -lrt -ldl -lm $(MPI_LIBS)
fuzz: $(BUILD)/fuzz/fuzz_gcomm
	bash test/fuzz/run.sh $< $(FUZZ_SECONDS)

run: $(BUILD)/gcomm_perf
	$(MPIEXEC) -n 4 $(BUILD)/gcomm_perf --coll allreduce -b 8 -e 64M -f 4 --backend gcomm,mpi

format:
	clang-format -i gcomm.h gcomm.c gcomm_*.h gcomm_kernels.cu gcomm_kernels.hip transports/*.c examples/*.c examples/profiler/*.c test/*.c test/*.h test/plugins/*.c test/gpu/*.c test/fuzz/*.c nccl/*.c

clean:
	rm -rf $(BUILD)

.PHONY: all test test-profiler test-net test-fault fuzz run format clean
.PRECIOUS: $(BUILD)/obj/%.o

# GPU tests and benchmark (test/gpu/run.sh): make CUDA=1 gpu-test [NCCL=1 NCCL_HOME=...]
ifeq ($(CUDA),1)
$(BUILD)/test/gpu/%: test/gpu/%.c $(BUILD)/libgcomm.a gcomm.h $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) $(PERF_FLAGS) -o $@ $< $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS) $(PERF_LIBS)
gpu-test: $(BUILD)/test/gpu/test_gpu $(BUILD)/test/gpu/test_gpu_fault $(BUILD)/gcomm_perf $(PLUGINS)
.PHONY: gpu-test
endif

# NCCL's API over gcomm (nccl/gcomm_nccl.c): $(BUILD)/nccl/libnccl.so.2 for MPI programs written
# for NCCL. NCCL_HOME gives NVIDIA's nccl.h only ($(NCCL_HOME)/include/nccl.h).
ifeq ($(CUDA),1)
NCCL_HOME ?= $(CUDA_HOME)
NCCL_LIB   = $(BUILD)/nccl/libnccl.so.2
$(BUILD)/obj/nccl/gcomm_nccl.o: CFLAGS += -I$(NCCL_HOME)/include
$(BUILD)/obj/nccl/gcomm_nccl.o: $(NCCL_HOME)/include/nccl.h
$(NCCL_HOME)/include/nccl.h:
	@echo "no nccl.h at $@: give NCCL_HOME=<folder with include/nccl.h>" >&2; exit 1
$(NCCL_LIB): $(LIB_OBJ) $(BUILD)/obj/nccl/gcomm_nccl.o nccl/libnccl.map
	@mkdir -p $(dir $@)
	$(MPICC) -shared $(LDFLAGS) -Wl,-soname,libnccl.so.2 -Wl,--version-script=nccl/libnccl.map \
	  -Wl,--no-undefined -o $@ $(LIB_OBJ) $(BUILD)/obj/nccl/gcomm_nccl.o $(LDLIBS)
	ln -sf libnccl.so.2 $(BUILD)/nccl/libnccl.so
# its test (nccl/test_nccl.c), linked to it as an NCCL program is
$(BUILD)/nccl/test_nccl: nccl/test_nccl.c test/testlib.h $(NCCL_LIB)
	$(MPICC) $(CFLAGS) -I$(NCCL_HOME)/include -o $@ $< $(LDFLAGS) -L$(BUILD)/nccl -l:libnccl.so.2 \
	  -Wl,-rpath,'$$ORIGIN' $(LDLIBS)
nccl: $(NCCL_LIB) $(BUILD)/nccl/test_nccl
nccl-check: $(NCCL_LIB)
	bash tools/nccl_symbols_check.sh $(NCCL_LIB) nccl/nccl_symbols.txt
else
nccl nccl-check:
	@echo "make $@ needs CUDA=1 (the NCCL API serves GPU communicators)" >&2; exit 1
endif
.PHONY: nccl nccl-check
