// poolbench: what one parallel region of the CPU engine's thread pool costs, the fixed price a decode step pays ~300
// times (issue 18: decode at 16 threads stayed below llama.cpp while 2 threads beat it). Each region runs `tasks`
// tasks of `work` spin iterations; the figure is microseconds a region, best of 5 runs of `regions` regions.
// Usage: poolbench [threads...]   (default: 2, 4, 8, 16 and every core)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "ops/cpu/threadpool.h"

namespace {

double us_per_region(dfl::ThreadPool &pool, int regions, int64_t tasks, int work) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < regions; r++)
            pool.parallel_for(tasks, [&](int64_t, int) {
                for (volatile int s = 0; s < work; s = s + 1) {
                }
            });
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, us / regions);
    }
    return best;
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<int> threads;
    for (int i = 1; i < argc; i++) threads.push_back(std::atoi(argv[i]));
    if (threads.empty()) {
        const int hc = (int)std::max(1u, std::thread::hardware_concurrency());
        for (int t : {2, 4, 8, 16})
            if (t < hc) threads.push_back(t);
        threads.push_back(hc);
    }
    std::printf("%8s %8s %8s %14s\n", "threads", "tasks", "work", "us/region");
    for (int th : threads) {
        dfl::ThreadPool pool(th);
        // tasks: one a thread, the ~4 a thread of the engine's matmuls, and a per-row op's many; work: empty (the
        // pool alone) and ~2 us a task (a decode step's small products)
        for (int64_t tasks : {(int64_t)th, (int64_t)4 * th, (int64_t)64 * th})
            for (int work : {0, 2000}) std::printf("%8d %8lld %8d %14.2f\n", th, (long long)tasks, work,
                                                   us_per_region(pool, 2000, tasks, work));
    }
    return 0;
}
