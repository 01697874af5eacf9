# Builds the CUDA engine library and its op-by-op test against the CPU device.
#   make -C native -f cuda.mk OUT=../bin/lib      -> $(OUT)/libdflash_cuda.so
#   make -C native -f cuda.mk cuda-test           -> builds and runs $(BUILD)/cuda/test_cuda_ops and test_cuda_ds4
#   make -C native -f cuda.mk cuda-test-ds4       -> only the DeepSeek V4 op tests
# NVCC_ARCH overrides the GPU targets (default: sm_90 code plus compute_90 PTX, which later GPUs JIT-compile).
# Objects live in $(BUILD)/cuda; every rule writes its target atomically.

OUT   ?= ../bin/lib
BUILD ?= build
CXX   ?= g++
NVCC  ?= nvcc

NVCC_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# CUDA libraries for the g++ link lines (nvcc's own directory, then the usual toolkit places).
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC))))
CUDA_LIBDIRS := $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib $(CUDA_HOME)/lib/x86_64-linux-gnu)
# (never -I/usr/include: it breaks libstdc++'s #include_next)
CUDA_INC := $(addprefix -I,$(filter-out /usr/include,$(wildcard $(CUDA_HOME)/include)))
CUDA_LIBS = $(addprefix -L,$(CUDA_LIBDIRS)) $(addprefix -Wl$(comma)-rpath$(comma),$(CUDA_LIBDIRS)) -lcublas -lcudart_static -lpthread -ldl -lrt
comma := ,

CPPFLAGS += -Iinclude -Isrc
CXXOPT   ?= -O3 -march=x86-64-v2 -mtune=generic
override CXXFLAGS += $(CXXOPT) -std=c++17 -fPIC -fvisibility=hidden -pthread -Wall -Wextra -Wno-unused-parameter -Wno-psabi -ffp-contract=off
NVCCFLAGS ?= -O3
override NVCCFLAGS += -std=c++17 $(NVCC_ARCH) -Xcompiler -fPIC -Xcompiler -fvisibility=hidden
LIBFLAGS = -shared -pthread -static-libstdc++ -static-libgcc -Wl,--no-undefined -Wl,-z,noexecstack -Wl,--version-script=src/exports.map

# Sources of the engine that do not depend on the device kind. CUDA_CPU_ONLY lists any left in src/ that belong to the
# CPU device only (the CPU kernels live in src/ops/cpu).
CUDA_CPU_ONLY ?=
COMMON_SRCS := $(filter-out $(CUDA_CPU_ONLY),$(wildcard src/*.cpp src/core/*.cpp src/arch/*.cpp))
CU_SRCS     := $(wildcard src/ops/cuda/*.cu)
CPU_SRCS    := $(filter-out src/ops/cpu/lib_cpu.cpp,$(wildcard src/ops/cpu/*.cpp))

CB := $(BUILD)/cuda
COMMON_OBJS := $(COMMON_SRCS:src/%.cpp=$(CB)/common/%.o)
CU_OBJS     := $(CU_SRCS:src/%.cu=$(CB)/%.o)
CPU_OBJS    := $(CPU_SRCS:src/%.cpp=$(CB)/cpu/%.o)
LIB := $(OUT)/libdflash_cuda.so
TEST := $(CB)/test_cuda_ops
TEST_DS4 := $(CB)/test_cuda_ds4

.PHONY: cuda cuda-test cuda-test-build cuda-test-ds4 cuda-clean
cuda: $(LIB)

$(LIB): $(COMMON_OBJS) $(CU_OBJS) src/exports.map
	@mkdir -p $(dir $@)
	$(CXX) $(LIBFLAGS) -o $@.tmp.$$$$ $(COMMON_OBJS) $(CU_OBJS) $(CUDA_LIBS) && mv -f $@.tmp.$$$$ $@

$(CB)/common/%.o: src/%.cpp cuda.mk
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -c -o $@.tmp.$$$$ $< && mv -f $@.tmp.$$$$ $@

$(CB)/cpu/%.o: src/%.cpp cuda.mk
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -c -o $@.tmp.$$$$ $< && mv -f $@.tmp.$$$$ $@

# The DeepSeek V4 kernels round element-wise arithmetic as the CPU reference (built with -ffp-contract=off) does, so
# that the indexer's scores and the router's choices match it bit for bit: no FMA contraction there.
$(CB)/ops/cuda/ds4.o: NVCC_FILE_FLAGS := -fmad=false
$(CB)/ops/cuda/ds4_%.o: NVCC_FILE_FLAGS := -fmad=false

$(CB)/%.o: src/%.cu cuda.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(CPPFLAGS) $(NVCCFLAGS) $(NVCC_FILE_FLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -c -o $@.tmp.$$$$.o $< && mv -f $@.tmp.$$$$.o $@

$(CB)/tests/%.o: tests/cuda/%.cpp cuda.mk
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) -Itests $(CUDA_INC) $(CXXFLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -c -o $@.tmp.$$$$ $< && mv -f $@.tmp.$$$$ $@

# test-only kernels (bench_sync.cu)
$(CB)/tests/%.o: tests/cuda/%.cu cuda.mk
	@mkdir -p $(dir $@)
	$(NVCC) $(CPPFLAGS) -Itests $(NVCCFLAGS) -MMD -MP -MT $@ -MF $(@:.o=.d) -c -o $@.tmp.$$$$.o $< && mv -f $@.tmp.$$$$.o $@

# Archives, so the test links only what it uses (the CPU device's lib_cpu.cpp and api-level code are not needed);
# grouped because the CPU, CUDA and common objects refer to each other.
$(CB)/libcommon.a: $(COMMON_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(CB)/libcpu.a: $(CPU_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(CB)/libcu.a: $(CU_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

TEST_OBJS := $(CB)/tests/test_cuda_ops.o $(CB)/tests/test_cuda_matmul.o $(CB)/tests/test_cuda_gdn.o $(CB)/tests/test_cuda_topk.o \
	$(CB)/tests/bench_cuda_ops.o $(CB)/tests/bench_sync.o
$(TEST): $(TEST_OBJS) $(CB)/libcpu.a $(CB)/libcu.a $(CB)/libcommon.a
	$(CXX) -pthread -o $@.tmp.$$$$ $(TEST_OBJS) -Wl,--start-group $(CB)/libcpu.a $(CB)/libcu.a \
		$(CB)/libcommon.a -Wl,--end-group $(CUDA_LIBS) && mv -f $@.tmp.$$$$ $@

TEST_DS4_OBJS := $(CB)/tests/test_cuda_ds4.o $(CB)/tests/test_cuda_ds4_hc.o
$(TEST_DS4): $(TEST_DS4_OBJS) $(CB)/libcpu.a $(CB)/libcu.a $(CB)/libcommon.a
	$(CXX) -pthread -o $@.tmp.$$$$ $(TEST_DS4_OBJS) -Wl,--start-group $(CB)/libcpu.a $(CB)/libcu.a \
		$(CB)/libcommon.a -Wl,--end-group $(CUDA_LIBS) && mv -f $@.tmp.$$$$ $@

cuda-test-build: $(TEST) $(TEST_DS4)
cuda-test: $(TEST) $(TEST_DS4)
	$(abspath $(TEST))
	$(abspath $(TEST_DS4))
cuda-test-ds4: $(TEST_DS4)
	$(abspath $(TEST_DS4))

cuda-clean:
	rm -rf $(CB) $(LIB)

-include $(COMMON_OBJS:.o=.d) $(CU_OBJS:.o=.d) $(CPU_OBJS:.o=.d) $(TEST_OBJS:.o=.d) $(TEST_DS4_OBJS:.o=.d)
