// A CUDA injection library (CUDA_INJECTION64_PATH) that writes every kernel's start, end, stream, grid and name, as
// CUPTI's concurrent-kernel activity records them (graph nodes included), to $CUPTI_TRACE_OUT as CSV: the in-graph
// timeline that Nsight Systems would give where it is not installed (run.sh step_trace; scripts/gpu/trace-steps.py
// reads the CSV). Go programs leave without running atexit handlers, so a thread flushes the records every 100 ms and
// the last ones of a run may be missing. Built by run.sh with -DKREC=CUpti_ActivityKernelN, the newest N the
// toolkit's header has (the record version its CUPTI writes).
#include <cupti.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

FILE *out = nullptr;
std::atomic<long> kept{0};
long limit = 0;

void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 8 << 20;
    *buffer = static_cast<uint8_t *>(aligned_alloc(8, *size));
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t *buffer, size_t, size_t valid) {
    CUpti_Activity *rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || kept.load() >= limit) continue;
        const auto *k = reinterpret_cast<const KREC *>(rec);
        std::fprintf(out, "%llu,%llu,%u,%d,%d,%d,\"%s\"\n", (unsigned long long)k->start, (unsigned long long)k->end,
                     k->streamId, k->gridX, k->gridY, k->gridZ, k->name ? k->name : "?");
        kept++;
    }
    std::fflush(out);
    std::free(buffer);
}

}  // namespace

extern "C" int InitializeInjection(void) {
    const char *path = std::getenv("CUPTI_TRACE_OUT");
    out = std::fopen(path ? path : "/tmp/cupti-trace.csv", "w");
    if (!out) return 0;
    const char *lim = std::getenv("CUPTI_TRACE_LIMIT");
    limit = lim ? std::atol(lim) : 2000000;
    std::fprintf(out, "start,end,stream,gx,gy,gz,name\n");
    cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    std::thread([] {
        for (;;) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            cuptiActivityFlushAll(0);
        }
    }).detach();
    return 1;
}
