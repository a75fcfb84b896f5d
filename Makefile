# gcomm build.  make            host-only library, examples, tests (any MPI's mpicc)
#               make CUDA=1     + CUDA kernels and IPC transport (nvcc; CUDA_ARCH="90 80" to choose)
#               make HIP=1      + HIP kernels (hipcc)
#               make OFI=1      + libfabric transport between nodes
#               make FORTRAN=1  + the Fortran module (default: when $(MPIFC) compiles Fortran)
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
MPIFC   ?= mpif90
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

# the core (gcomm.c: the API; gcomm_*.c: one concern each, docs/ARCHITECTURE.md) and the transports
CORE_SRC = gcomm_params.c gcomm_wait.c gcomm_order.c gcomm_net_direct.c \
           gcomm_executor.c gcomm_progress.c gcomm_profiler.c gcomm_tuning.c gcomm_args.c \
           gcomm_enqueue.c gcomm_bootstrap.c gcomm_agree.c gcomm_vcoll.c gcomm_shrink.c gcomm_gdr.c \
           gcomm_hostmem.c
LIB_SRC  = gcomm.c $(CORE_SRC) transports/shm.c
# the GPU engine (CUDA=1 or HIP=1) and the IPC transport between a node's GPUs
GPU_SRC  = gcomm_gpu_engine.c gcomm_gpu_copy.c gcomm_gpu_proxy.c gcomm_gpu_prof.c gcomm_gpu_net.c \
           transports/p2p.c
# the public headers (gcomm.h includes gcomm_types.h), then the internal ones
PUB_HDR  = gcomm.h gcomm_types.h
LIB_HDR  = $(PUB_HDR) gcomm_profiler.h gcomm_internal.h gcomm_core.h gcomm_gpu_engine.h gcomm_sched.h gcomm_reduce.h gcomm_device.h gcomm_gpu.h
LIB_OBJ  = $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC))

ifeq ($(CUDA),1)
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCH ?= 90
# --split-compile=0: the kernels' device code optimized on every core (one file's dozens of
# instantiations take minutes on one); docs/PERF.md's GPU numbers were measured built this way
NVCCFLAGS += -O3 -std=c++17 -Xcompiler -fPIC,-Wall,-Wextra,-Werror -Werror all-warnings \
             --split-compile=0 $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) -I.
CFLAGS    += -DGCOMM_CUDA -I$(CUDA_HOME)/include
LDLIBS    += -L$(CUDA_HOME)/lib64 -lcudart -lstdc++
LIB_SRC   += $(GPU_SRC) gcomm_gpu_shared.c gcomm_gpu_direct.c
LIB_OBJ   += $(BUILD)/obj/gcomm_kernels.o $(BUILD)/obj/gcomm_kernels_general.o \
             $(BUILD)/obj/gcomm_reduce_kernels.o $(BUILD)/obj/gcomm_direct_kernels.o
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
LIB_SRC   += $(GPU_SRC)
LIB_OBJ   += $(BUILD)/obj/gcomm_kernels_hip.o $(BUILD)/obj/gcomm_kernels_general_hip.o
endif
ifeq ($(OFI),1)
CFLAGS    += -DGCOMM_OFI $(OFI_CFLAGS)
LDLIBS    += $(or $(OFI_LIBS),-lfabric)
LIB_SRC   += transports/net_ofi.c
endif
# The Fortran module (fortran/): on by default where the MPI's Fortran wrapper works
FORTRAN ?= $(shell $(MPIFC) --version >/dev/null 2>&1 && echo 1 || echo 0)
ifeq ($(FORTRAN),1)
FFLAGS  += -O2 -g -fPIC -Wall -Werror -J$(BUILD)/fortran -I$(BUILD)/fortran
FLIB     = $(BUILD)/libgcomm_fortran.a
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

ifeq ($(FORTRAN),1)
EXAMPLES += $(patsubst examples/%.f90,$(BUILD)/fortran/%,$(wildcard examples/*.f90))
TESTS    += $(patsubst test/%.f90,$(BUILD)/test/%,$(wildcard test/*.f90))
endif

# the stand-in gdrcopy library test_knobs loads (test/gdr/)
TEST_LIBS = $(BUILD)/test/gdr/libgdrapi-fake.so

all: $(BUILD)/libgcomm.a $(BUILD)/libgcomm.so $(FLIB) $(EXAMPLES) $(TESTS) $(PLUGINS) $(TEST_LIBS)

# What $(BUILD) was last built with: every output depends on it, so that a make with other options
# in the same folder (`make OFI=1 test-net` after `make run`, SAN=1, ...) rebuilds everything
# instead of linking objects built without the network transport. Rewritten only when it changes.
BUILD_CONFIG := $(MPICC) $(CFLAGS) $(FFLAGS) $(LDFLAGS) $(LDLIBS) $(NVCCFLAGS) $(HIPFLAGS) $(PERF_FLAGS) $(PERF_LIBS)
ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(shell mkdir -p $(BUILD) && echo '$(BUILD_CONFIG)' | cmp -s - $(BUILD)/config || \
        echo '$(BUILD_CONFIG)' > $(BUILD)/config)
endif
CONFIG = $(BUILD)/config

$(BUILD)/obj/%.o: %.c $(LIB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -c $< -o $@
# the kernels: two objects from one source, compiled at once (gcomm_kernels.cu says how it splits)
$(BUILD)/obj/gcomm_kernels.o $(BUILD)/obj/gcomm_kernels_general.o: gcomm_kernels.cu $(LIB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/obj/gcomm_reduce_kernels.o $(BUILD)/obj/gcomm_direct_kernels.o: \
    $(BUILD)/obj/%.o: %.cu $(LIB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
$(BUILD)/obj/gcomm_kernels_hip.o $(BUILD)/obj/gcomm_kernels_general_hip.o: \
    gcomm_kernels.hip gcomm_kernels.cu $(LIB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(HIPCC) $(HIPFLAGS) -c $< -o $@
$(BUILD)/obj/gcomm_kernels_general.o: NVCCFLAGS += -DGCOMM_KERNELS_GENERAL
$(BUILD)/obj/gcomm_kernels_general_hip.o: HIPFLAGS += -DGCOMM_KERNELS_GENERAL

$(BUILD)/libgcomm.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/libgcomm.so: $(LIB_OBJ)
	$(MPICC) -shared -Wl,-soname,$(GCOMM_SONAME) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# Fortran: the module and its C side in libgcomm_fortran.a, linked before libgcomm.a
$(BUILD)/fortran/gcomm_mod.o: fortran/gcomm_mod.F90 $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPIFC) $(FFLAGS) -c $< -o $@
$(FLIB): $(BUILD)/fortran/gcomm_mod.o $(BUILD)/obj/fortran/gcomm_fortran.o
	rm -f $@ && ar rcs $@ $^
$(BUILD)/fortran/%: examples/%.f90 $(FLIB) $(BUILD)/libgcomm.a $(CONFIG)
	$(MPIFC) $(FFLAGS) -o $@ $< $(LDFLAGS) $(FLIB) $(BUILD)/libgcomm.a $(LDLIBS)
$(BUILD)/test/%: test/%.f90 $(FLIB) $(BUILD)/libgcomm.a $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPIFC) $(FFLAGS) -o $@ $< $(LDFLAGS) $(FLIB) $(BUILD)/libgcomm.a $(LDLIBS)

# heat2d (and its test) with, in a CUDA build, its GPU half
ifeq ($(CUDA),1)
HEAT_GPU = $(BUILD)/obj/examples/heat2d_gpu.o
endif
$(BUILD)/obj/examples/heat2d_gpu.o: examples/heat2d_gpu.cu examples/heat2d.h $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -DGCOMM_CUDA -c $< -o $@
$(BUILD)/heat2d: examples/heat2d.c examples/heat2d.h $(HEAT_GPU) $(BUILD)/libgcomm.a $(PUB_HDR) $(CONFIG)
	$(MPICC) $(CFLAGS) -o $@ $< $(HEAT_GPU) $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS)
$(BUILD)/test/test_heat2d: test/test_heat2d.c examples/heat2d.c examples/heat2d.h $(HEAT_GPU) \
                           $(BUILD)/libgcomm.a $(PUB_HDR) $(wildcard test/*.h) $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -o $@ $< $(HEAT_GPU) $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS)

$(BUILD)/gcomm_perf: examples/gcomm_perf.c $(BUILD)/libgcomm.a $(PUB_HDR) $(CONFIG)
	$(MPICC) $(CFLAGS) $(PERF_FLAGS) -o $@ $< $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS) $(PERF_LIBS)
$(BUILD)/%: examples/%.c $(BUILD)/libgcomm.a $(PUB_HDR) $(CONFIG)
	$(MPICC) $(CFLAGS) -o $@ $< $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS)
$(BUILD)/examples/libgcomm-profiler-%.so: examples/profiler/%.c gcomm_profiler.h $(PUB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -shared -o $@ $< $(LDFLAGS)
$(BUILD)/test/plugins/libgcomm-profiler-%.so: test/plugins/%.c gcomm_profiler.h $(PUB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -shared -o $@ $< $(LDFLAGS)
$(BUILD)/test/gdr/libgdrapi-fake.so: test/gdr/fake_gdrapi.c $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -shared -o $@ $< $(LDFLAGS)
$(BUILD)/test/%: test/%.c $(BUILD)/libgcomm.a $(PUB_HDR) $(wildcard test/*.h) $(CONFIG)
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
# (it includes gcomm_params.c for the static parsers and compiles the rest of the host library)
FUZZ_LIB_SRC = $(filter-out gcomm_params.c,$(LIB_SRC))
$(BUILD)/fuzz/fuzz_gcomm: test/fuzz/fuzz_gcomm.c gcomm_params.c $(FUZZ_LIB_SRC) $(LIB_HDR)
	@mkdir -p $(dir $@)
	MPICH_CC=$(FUZZ_CC) OMPI_CC=$(FUZZ_CC) $(MPICC) -std=gnu11 -O1 -g -Wall -Wextra -Werror \
	  -pthread -I. $(MPI_CFLAGS) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	  -o $@ test/fuzz/fuzz_gcomm.c $(FUZZ_LIB_SRC) -lrt -ldl -lm $(MPI_LIBS)
fuzz: $(BUILD)/fuzz/fuzz_gcomm
	bash test/fuzz/run.sh $< $(FUZZ_SECONDS)

run: $(BUILD)/gcomm_perf
	$(MPIEXEC) -n 4 $(BUILD)/gcomm_perf --coll allreduce -b 16 -e 64M -f 4 --backend gcomm,mpi

format:
	clang-format -i gcomm.h gcomm.c gcomm_*.h gcomm_kernels.cu gcomm_kernels.hip transports/*.c fortran/*.c examples/*.c examples/profiler/*.c test/*.c test/*.h test/plugins/*.c test/gdr/*.c test/gpu/*.c test/fuzz/*.c nccl/*.c

clean:
	rm -rf $(BUILD)

.PHONY: all test test-profiler test-net test-fault fuzz run format clean
.PRECIOUS: $(BUILD)/obj/%.o

# GPU tests and benchmark (test/gpu/run.sh): make CUDA=1 gpu-test [NCCL=1 NCCL_HOME=...]
ifeq ($(CUDA),1)
$(BUILD)/test/gpu/%: test/gpu/%.c test/gpu/gpucheck.h test/gpu/gpureport.h $(BUILD)/libgcomm.a $(PUB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) $(PERF_FLAGS) -o $@ $< $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS) $(PERF_LIBS)
# the vector collectives' comparison with MPI's, on device buffers
$(BUILD)/test/gpu/test_vcoll_gpu: test/test_vcoll.c test/testlib.h $(BUILD)/libgcomm.a $(PUB_HDR) $(CONFIG)
	@mkdir -p $(dir $@)
	$(MPICC) $(CFLAGS) -DTEST_ON_GPU -o $@ $< $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS)
gpu-test: $(BUILD)/test/gpu/test_gpu $(BUILD)/test/gpu/test_gpu_fault $(BUILD)/test/gpu/test_gpu_shrink $(BUILD)/test/gpu/test_gpu_stress $(BUILD)/test/gpu/test_vcoll_gpu $(BUILD)/gcomm_perf $(PLUGINS)
.PHONY: gpu-test
endif

# ---- install, packaging, help ----------------------------------------------------------------
# make install PREFIX=/usr/local [DESTDIR=/staging] [LIBDIR=lib]: headers, libgcomm.a, libgcomm.so
# (soname from gcomm.h's version), gcomm.pc, the CMake package (find_package(gcomm) gives
# gcomm::gcomm and gcomm::gcomm_static), the example profiler plugin and the tools. What the
# package says the library links with is what this build was configured with (CUDA=1, OFI=1, ...).
GCOMM_MAJOR   := $(shell sed -n 's/^\#define GCOMM_MAJOR \([0-9]*\).*/\1/p' gcomm.h)
GCOMM_MINOR   := $(shell sed -n 's/^\#define GCOMM_MINOR \([0-9]*\).*/\1/p' gcomm.h)
GCOMM_PATCH   := $(shell sed -n 's/^\#define GCOMM_PATCH \([0-9]*\).*/\1/p' gcomm.h)
GCOMM_RELEASE := $(GCOMM_MAJOR).$(GCOMM_MINOR).$(GCOMM_PATCH)
# below 1.0 a minor release may change the ABI, so it is part of the soname
GCOMM_SOVER   := $(if $(filter 0,$(GCOMM_MAJOR)),0.$(GCOMM_MINOR),$(GCOMM_MAJOR))
GCOMM_SONAME  := libgcomm.so.$(GCOMM_SOVER)

PREFIX  ?= /usr/local
LIBDIR  ?= lib
DESTDIR ?=
# programs installed in bin/: append built ones here (INSTALL_BINS += $(BUILD)/gcomm_info)
INSTALL_BINS = $(BUILD)/gcomm_perf $(wildcard $(BUILD)/gcomm_info) $(BUILD)/gcomm_schedule
INSTALL_HDRS = $(PUB_HDR) gcomm_profiler.h
INSTALL_PLUGINS = $(patsubst examples/profiler/%.c,$(BUILD)/examples/libgcomm-profiler-%.so,$(wildcard examples/profiler/*.c))
INSTALL_TOOLS = tools/gcomm_trace.py tools/hang_report.py tools/perf_table.py

onoff = $(if $(filter 1,$(1)),ON,OFF)
PKG_SED = -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
  -e 's|@VERSION@|$(GCOMM_RELEASE)|g' -e 's|@MAJOR@|$(GCOMM_MAJOR)|g' -e 's|@MINOR@|$(GCOMM_MINOR)|g' \
  -e 's|@SONAME@|$(GCOMM_SONAME)|g' -e 's|@LIBS_PRIVATE@|$(strip $(filter-out $(MPI_LIBS),$(LDLIBS)))|g' \
  -e 's|@FEATURES@|host$(if $(filter 1,$(CUDA)), CUDA)$(if $(filter 1,$(HIP)), HIP)$(if $(filter 1,$(OFI)), libfabric)|g' \
  -e 's|@CUDA@|$(call onoff,$(CUDA))|g' -e 's|@HIP@|$(call onoff,$(HIP))|g' -e 's|@OFI@|$(call onoff,$(OFI))|g' \
  -e 's|@OFI_LIBDIRS@|$(patsubst -L%,%,$(filter -L%,$(OFI_LIBS)))|g'

$(BUILD)/pkg/%: pkg/%.in gcomm.h $(CONFIG)
	@mkdir -p $(dir $@)
	sed $(PKG_SED) $< > $@

install: $(BUILD)/libgcomm.a $(BUILD)/libgcomm.so $(INSTALL_BINS) $(INSTALL_PLUGINS) \
         $(BUILD)/pkg/gcomm.pc $(BUILD)/pkg/gcommConfig.cmake $(BUILD)/pkg/gcommConfigVersion.cmake
	$(eval D := $(DESTDIR)$(PREFIX))
	install -d $(D)/include $(D)/$(LIBDIR)/pkgconfig $(D)/$(LIBDIR)/cmake/gcomm $(D)/bin $(D)/share/gcomm/tools
	install -m 644 $(INSTALL_HDRS) $(D)/include/
	install -m 644 $(BUILD)/libgcomm.a $(D)/$(LIBDIR)/
	install -m 755 $(BUILD)/libgcomm.so $(D)/$(LIBDIR)/libgcomm.so.$(GCOMM_RELEASE)
	ln -sf libgcomm.so.$(GCOMM_RELEASE) $(D)/$(LIBDIR)/$(GCOMM_SONAME)
	ln -sf $(GCOMM_SONAME) $(D)/$(LIBDIR)/libgcomm.so
	install -m 755 $(INSTALL_PLUGINS) $(D)/$(LIBDIR)/
	install -m 644 $(BUILD)/pkg/gcomm.pc $(D)/$(LIBDIR)/pkgconfig/
	install -m 644 $(BUILD)/pkg/gcommConfig.cmake $(BUILD)/pkg/gcommConfigVersion.cmake $(D)/$(LIBDIR)/cmake/gcomm/
	install -m 755 $(INSTALL_BINS) $(D)/bin/
	install -m 755 $(INSTALL_TOOLS) $(D)/share/gcomm/tools/

# install into a temporary prefix, then build examples/hello_allreduce.c against it out of the
# tree with pkg-config (examples/pkgconfig) and with CMake (examples/cmake), and run each
test-install: all
	BUILD=$(BUILD) MPIEXEC=$(MPIEXEC) bash test/test_install.sh

help:
	@echo "gcomm $(GCOMM_RELEASE): make [TARGET] [OPTION=value ...]"
	@echo "targets:"
	@echo "  all (default)   library (static and shared), examples, tests in \$$BUILD"
	@echo "  run             benchmark: all-reduce on 4 ranks, gcomm and MPI side by side"
	@echo "  test            the test suite (test/run.sh; TEST_ONLY, TEST_NPS, TEST_VERBOSE=1)"
	@echo "  test-net        the suite across pretend nodes over libfabric (with OFI=1)"
	@echo "  test-fault      kills, hang diagnosis, soak"
	@echo "  test-profiler   the example profiler plugin's trace of 4 ranks, checked"
	@echo "  test-install    install into a temporary prefix, build and run examples against it"
	@echo "  fuzz            libFuzzer over argument checks and GCOMM_* parsing (FUZZ_SECONDS)"
	@echo "  install         headers, libraries, gcomm.pc, CMake package, plugin, tools"
	@echo "  nccl, nccl-check   libnccl.so.2 over gcomm (CUDA=1, NCCL_HOME for nccl.h), its exports checked"
	@echo "  format, clean, help"
	@echo "options:"
	@echo "  PREFIX=$(PREFIX) DESTDIR= LIBDIR=$(LIBDIR)   where install puts things"
	@echo "  BUILD=$(BUILD)   build folder        MPICC=$(MPICC)   MPIEXEC=$(MPIEXEC)"
	@echo "  CUDA=1 [CUDA_ARCH=\"90 80\" CUDA_HOME=...]   GPU communicators (nvcc)"
	@echo "  NCCL=1 NCCL_HOME=...   gcomm_perf --backend nccl (with CUDA=1)"
	@echo "  HIP=1 [HIP_ARCH=gfx90a]   GPU communicators on AMD (hipcc; compile-checked only)"
	@echo "  OFI=1 [OFI_CFLAGS= OFI_LIBS=]   libfabric between nodes"
	@echo "  SAN=1 (ASan+UBSan), SAN=thread (TSan)   OPT=$(OPT)"

.PHONY: install test-install help

# gcomm_info: whether this machine is set up for gcomm, and why not (tools/gcomm_info.c)
all: $(BUILD)/gcomm_info
$(BUILD)/gcomm_info: tools/gcomm_info.c $(BUILD)/libgcomm.a $(LIB_HDR) $(CONFIG)
	$(MPICC) $(CFLAGS) -o $@ $< $(LDFLAGS) $(BUILD)/libgcomm.a $(LDLIBS)

# gcomm_schedule: a collective's schedule for n ranks as a table and an SVG picture, from
# gcomm_sched.h alone (tools/gcomm_schedule.c)
all: $(BUILD)/gcomm_schedule
$(BUILD)/gcomm_schedule: tools/gcomm_schedule.c $(LIB_HDR) $(CONFIG)
	$(MPICC) $(CFLAGS) -o $@ $< $(LDFLAGS)

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
	  -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN' $(LDLIBS)
nccl: $(NCCL_LIB) $(BUILD)/nccl/test_nccl
nccl-check: $(NCCL_LIB)
	bash tools/nccl_symbols_check.sh $(NCCL_LIB) nccl/nccl_symbols.txt
else
nccl nccl-check:
	@echo "make $@ needs CUDA=1 (the NCCL API serves GPU communicators)" >&2; exit 1
endif
.PHONY: nccl nccl-check
