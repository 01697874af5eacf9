// A small fork-join thread pool: parallel_for hands task indices to the workers and the calling thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dfl {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int size() const { return n_threads_; }

    // Runs fn(task, thread) for task in [0, n_tasks) across the pool and returns when all are done. `thread` is in
    // [0, size()) and identifies per-thread scratch. The first exception thrown by a task is rethrown here.
    // One parallel_for at a time per pool (a task must not call parallel_for on its own pool).
    void parallel_for(int64_t n_tasks, const std::function<void(int64_t task, int thread)> &fn);

private:
    using Fn = std::function<void(int64_t, int)>;
    void worker(int id);
    bool has_work() const;
    int64_t run_tasks(int thread);

    int n_threads_;
    std::vector<std::thread> threads_;

    // The current job. work_ = epoch << 32 | next task index; a task is claimed by fetch_add on the whole word, and a
    // claim made with a stale view of the job is dropped (see threadpool.cpp). Read by every spinning worker; written
    // per claim.
    alignas(64) std::atomic<uint64_t> work_{0};
    std::atomic<uint32_t> n_tasks_{0};
    std::atomic<const Fn *> fn_{nullptr};
    std::atomic<bool> failed_{false};

    alignas(64) std::atomic<int64_t> done_{0};  // tasks of the current job finished by the workers

    alignas(64) std::mutex mu_;
    std::condition_variable cv_;
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::exception_ptr error_;  // guarded by mu_
};

}  // namespace dfl
