#include "ops/cpu/threadpool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DFL_PAUSE() _mm_pause()
#else
#define DFL_PAUSE() ((void)0)
#endif

namespace dfl {

// Workers spin briefly before sleeping: a decode step runs dozens of short parallel regions back to back, and a
// condition-variable wake-up costs tens of microseconds each.
static constexpr int kSpin = 4000;

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
    for (int i = 1; i < n_threads_; i++) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lk(mu_);
        stop_ = true;
        gen_.fetch_add(1, std::memory_order_release);
    }
    cv_start_.notify_all();
    for (auto &t : threads_) t.join();
}

void ThreadPool::run_tasks(int thread) {
    for (;;) {
        const int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
        if (t >= n_tasks_) return;
        try {
            (*fn_)(t, thread);
        } catch (...) {
            std::lock_guard<std::mutex> lk(mu_);
            if (!error_) error_ = std::current_exception();
            next_.store(n_tasks_, std::memory_order_relaxed);
        }
    }
}

void ThreadPool::worker(int id) {
    uint64_t seen = 0;
    for (;;) {
        int k = 0;
        while (gen_.load(std::memory_order_acquire) == seen && k < kSpin) {
            DFL_PAUSE();
            k++;
        }
        if (gen_.load(std::memory_order_acquire) == seen) {
            std::unique_lock<std::mutex> lk(mu_);
            cv_start_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
        }
        seen = gen_.load(std::memory_order_acquire);
        if (stop_) return;
        run_tasks(id);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
            std::lock_guard<std::mutex> lk(mu_);
            cv_done_.notify_one();
        }
    }
}

void ThreadPool::parallel_for(int64_t n_tasks, const std::function<void(int64_t, int)> &fn) {
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(t, 0);
        return;
    }
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    {
        std::lock_guard<std::mutex> lk(mu_);
        gen_.fetch_add(1, std::memory_order_release);
    }
    cv_start_.notify_all();
    run_tasks(0);
    int k = 0;
    while (pending_.load(std::memory_order_acquire) != 0 && k < kSpin) {
        DFL_PAUSE();
        k++;
    }
    if (pending_.load(std::memory_order_acquire) != 0) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_done_.wait(lk, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    fn_ = nullptr;
    if (error_) {
        std::exception_ptr e = error_;
        error_ = nullptr;
        std::rethrow_exception(e);
    }
}

}  // namespace dfl
