// ThreadPool: each task runs exactly once, thread ids are unique among running tasks, exceptions propagate, and
// workers that slept or woke late neither lose nor repeat tasks.
#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "ops/cpu/threadpool.h"
#include "test.h"

using namespace dfl;
using namespace dfltest;

namespace {

// Runs `jobs` jobs of 1..max_tasks tasks back to back. Each job's fn and counters live on that iteration's stack,
// and a task checks that its job is still the current one, so a task run after its parallel_for returned (or under
// another job's fn) shows up as a mismatch or a wrong count. Returns the number of problems.
int64_t run_jobs(ThreadPool &pool, int jobs, int max_tasks, uint64_t seed, int work = 0) {
    Rng rng(seed);
    std::atomic<int64_t> current{-1}, bad{0};
    std::unique_ptr<std::atomic<int>[]> in_use(new std::atomic<int>[pool.size()]);
    for (int i = 0; i < pool.size(); i++) in_use[i] = 0;
    for (int j = 0; j < jobs; j++) {
        const int n = 1 + (int)(rng.next() % (uint64_t)max_tasks);
        std::unique_ptr<std::atomic<int>[]> count(new std::atomic<int>[n]);
        for (int t = 0; t < n; t++) count[t] = 0;
        current.store(j);
        pool.parallel_for(n, [&, j, n](int64_t t, int th) {
            if (current.load() != j || t < 0 || t >= n || th < 0 || th >= pool.size()) {
                bad++;
                return;
            }
            if (in_use[th].exchange(1) != 0) bad++;
            count[t]++;
            for (volatile int s = 0; s < work; s = s + 1) {
            }
            in_use[th].store(0);
        });
        current.store(-1);
        for (int t = 0; t < n; t++)
            if (count[t].load() != 1) bad++;
    }
    return bad.load();
}

}  // namespace

TEST(threadpool_each_task_once) {
    for (int threads : {2, 3, 8}) {
        ThreadPool pool(threads);
        CHECK(pool.size() == threads);
        CHECK(run_jobs(pool, 2000, 300, threads) == 0);
        CHECK(run_jobs(pool, 2000, 4, 100 + threads) == 0);  // fewer tasks than threads: most workers take none
        CHECK(run_jobs(pool, 200, 64, 200 + threads, 2000) == 0);  // longer tasks: threads overlap
    }
}

TEST(threadpool_inline) {
    for (int threads : {0, 1}) {
        ThreadPool pool(threads);
        CHECK(pool.size() == 1);
        CHECK(run_jobs(pool, 50, 20, 7) == 0);
    }
    ThreadPool pool(4);
    int calls = 0, th_seen = -1;
    pool.parallel_for(1, [&](int64_t t, int th) { calls++, th_seen = th; });
    CHECK(calls == 1 && th_seen == 0);
    pool.parallel_for(0, [&](int64_t, int) { calls++; });
    CHECK(calls == 1);
}

TEST(threadpool_exception) {
    ThreadPool pool(3);
    for (int rep = 0; rep < 50; rep++) {
        const int thrower = rep % 40;
        std::string msg;
        try {
            pool.parallel_for(40, [&](int64_t t, int) {
                if (t == thrower) throw std::runtime_error("task " + std::to_string(t));
            });
        } catch (const std::runtime_error &e) {
            msg = e.what();
        }
        CHECK(msg == "task " + std::to_string(thrower));
        CHECK(run_jobs(pool, 5, 100, rep) == 0);  // still works, and the error does not leak into the next job
    }
    int caught = 0;
    try {
        pool.parallel_for(100, [](int64_t t, int) { throw (int)t; });
    } catch (int) {
        caught++;
    }
    CHECK(caught == 1);
    CHECK(run_jobs(pool, 5, 100, 99) == 0);
}

// Workers spin ~300 us after their last task and then sleep: jobs after a longer gap must wake them (or run without
// them) and still count right.
TEST(threadpool_after_sleep) {
    ThreadPool pool(3);
    for (int rep = 0; rep < 20; rep++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(rep % 2 ? 5 : 1));
        CHECK(run_jobs(pool, 3, 50, rep, 200) == 0);
    }
}

TEST(threadpool_destroy) {
    for (int rep = 0; rep < 50; rep++) {
        ThreadPool idle(4);  // workers may not have started yet
    }
    for (int rep = 0; rep < 50; rep++) {
        ThreadPool pool(4);
        CHECK(run_jobs(pool, 1, 16, rep) == 0);  // destroyed while the workers spin
    }
    ThreadPool pool(4);
    CHECK(run_jobs(pool, 1, 16, 1) == 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // destroyed while they sleep
}
