#include "ops/cpu/threadpool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DFL_PAUSE() _mm_pause()
#else
#define DFL_PAUSE() ((void)0)
#endif

// Decode runs hundreds of parallel regions of 1..20 us per token, so a region must cost well under a microsecond:
//  - parallel_for counts finished tasks, not workers: a worker that is asleep, preempted or late simply takes no
//    task, and the caller (which runs tasks too) never waits for it.
//  - Workers spin for a fixed time after their last task, then sleep; the caller pays the notify syscall only when
//    some worker sleeps. The spin is timed with a clock because PAUSE costs 10..140 cycles depending on the CPU.
//
// Why a late worker cannot run a task of an ended job, nor the new job's fn under the old job's index:
// work_ packs (epoch, next index), and a task is claimed by one fetch_add on the whole word (a CAS loop, as before,
// fails and retries under contention: at 16 threads a region's claims cost more than its work). The caller
// publishes job E+1 in three steps: work_ = (E+1, kClosed); then n_tasks_ and fn_ (release); then work_ = (E+1, 0).
// A claimer adds 1 (acq_rel), then loads n_tasks_ and fn_ (acquire):
//  - The value it got, (E, i) with i below kClosed, is the caller's (E, 0) or an increment of it: its release
//    sequence, so job E's n and fn (or a later job's) are visible.
//  - If i < n and the claimer already holds an unreported task of this job, the job cannot end, so n and fn are
//    E's. Otherwise it loads work_ again: a later job's n_tasks_ store comes after that job's (E+1, kClosed) store,
//    so having read a later n it sees a later epoch there, and drops the claim. Same epoch: n and fn are E's, and
//    i < n is a claim of job E's task i that no one else holds.
//  - kClosed (2^31) is at least every n, and the few increments past it while the fields are rewritten cannot reach
//    the epoch bits; the caller's (E+1, 0) store replaces them.
//  - The caller returns only after done_ (plus its own count) reaches n, and a worker adds its count only after
//    its tasks have returned, so fn is alive whenever a claimed task runs.
// The 32-bit epoch could only alias if one worker stalled between its fetch_add and its check for 2^32 jobs.
namespace dfl {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto kSpinTime = std::chrono::microseconds(300);
constexpr auto kYieldAfter = std::chrono::microseconds(20);
constexpr uint32_t kClosed = 0x80000000u;  // >= every job's n (kMaxJob), far from wrapping into the epoch
constexpr int64_t kMaxJob = int64_t(1) << 31;  // tasks per job: the index must fit below kClosed
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    for (int i = 1; i < n_threads_; i++) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);  // under the lock: a worker between its check and its wait still wakes
        stop_.store(true);
    }
    cv_.notify_all();
    for (auto &t : threads_) t.join();
}

bool ThreadPool::has_work() const {
    return (uint32_t)work_.load(std::memory_order_seq_cst) < n_tasks_.load(std::memory_order_acquire);
}

int64_t ThreadPool::run_tasks(int thread) {
    int64_t ran = 0;
    for (;;) {
        const uint64_t w = work_.fetch_add(1, std::memory_order_acq_rel);
        const uint32_t i = (uint32_t)w;
        const uint32_t n = n_tasks_.load(std::memory_order_acquire);
        const Fn *fn = fn_.load(std::memory_order_acquire);
        if (i >= n) return ran;
        if (ran == 0 && work_.load(std::memory_order_acquire) >> 32 != w >> 32) return ran;  // n and fn of a later job
        ran++;
        if (failed_.load(std::memory_order_relaxed)) continue;  // the remaining tasks are claimed but skipped
        try {
            (*fn)((int64_t)i, thread);
        } catch (...) {
            std::lock_guard<std::mutex> lk(mu_);
            if (!error_) error_ = std::current_exception();
            failed_.store(true, std::memory_order_relaxed);
        }
    }
}

void ThreadPool::worker(int id) {
    auto last = Clock::now();
    uint64_t seen = 0;  // the last epoch this worker saw
    for (uint32_t k = 1;; k++) {
        if (has_work()) {
            const int64_t ran = run_tasks(id);
            if (ran) done_.fetch_add(ran, std::memory_order_release);
            continue;
        }
        DFL_PAUSE();
        if (k % 64) continue;
        if (stop_.load(std::memory_order_relaxed)) return;
        // The spin lasts from the last job, whether or not this worker got a task of it: the regions are coming.
        const uint64_t epoch = work_.load(std::memory_order_relaxed) >> 32;
        const auto now = Clock::now();
        if (epoch != seen) seen = epoch, last = now;
        if (now - last < kSpinTime) {
            // A spinner sharing a core with the caller or with a preempted task holder delays the job it waits for
            // (a woken worker is often placed on the caller's core): hand the core over now and then.
            if (now - last > kYieldAfter) std::this_thread::yield();
            continue;
        }
        std::unique_lock<std::mutex> lk(mu_);
        // seq_cst pairs with parallel_for: either it sees this sleeper and notifies, or this sees its new epoch. Any
        // new job wakes the worker back into the spin, even one that ended before it woke: waiting again for one with
        // a task left would make every later region pay the notify for a worker that never catches one.
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lk, [&] { return stop_.load() || (work_.load(std::memory_order_seq_cst) >> 32) != seen; });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        if (stop_.load()) return;
        last = Clock::now();
    }
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)> &fn) {
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(t, 0);
        return;
    }
    if (n_tasks > kMaxJob) {
        for (int64_t b = 0; b < n_tasks; b += kMaxJob)
            parallel_for(std::min(kMaxJob, n_tasks - b), [&](int64_t t, int th) { fn(b + t, th); });
        return;
    }
    const uint64_t epoch = (work_.load(std::memory_order_relaxed) >> 32) + 1;
    work_.store(epoch << 32 | kClosed, std::memory_order_relaxed);
    n_tasks_.store((uint32_t)n_tasks, std::memory_order_release);
    fn_.store(&fn, std::memory_order_release);
    failed_.store(false, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    work_.store(epoch << 32, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
        { std::lock_guard<std::mutex> lk(mu_); }  // a sleeper that counted itself is now waiting: notify reaches it
        cv_.notify_all();
    }
    const int64_t others = n_tasks - run_tasks(0);
    for (uint32_t k = 1; done_.load(std::memory_order_acquire) != others; k++) {
        DFL_PAUSE();
        if (k > 256) std::this_thread::yield();  // a worker holding a task may be preempted: give it the core
    }
    if (!failed_.load(std::memory_order_relaxed)) return;  // a worker's store is visible: it precedes its done_ add
    std::exception_ptr e;
    {
        std::lock_guard<std::mutex> lk(mu_);
        std::swap(e, error_);
    }
    std::rethrow_exception(e);
}

}  // namespace dfl
