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
    void parallel_for(int64_t n_tasks, const std::function<void(int64_t task, int thread)> &fn);

private:
    void worker(int id);
    void run_tasks(int thread);

    int n_threads_;
    std::vector<std::thread> threads_;
    std::mutex mu_;
    std::condition_variable cv_start_, cv_done_;
    std::atomic<uint64_t> gen_{0};
    std::atomic<int> pending_{0};
    bool stop_ = false;

    const std::function<void(int64_t, int)> *fn_ = nullptr;
    int64_t n_tasks_ = 0;
    std::atomic<int64_t> next_{0};
    std::exception_ptr error_;
};

}  // namespace dfl
