// Independent work items on up to hardware_concurrency threads: each item writes only its own
// result, so the results are the same, in the same order, whatever the thread count. The first
// exception a worker catches is rethrown once all have joined.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

namespace np {

template <typename F>
void parallel_for(size_t count, F work) {
  const size_t threads = std::min<size_t>(count, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (size_t i = 0; i < count; ++i) work(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> failed(threads);
  std::vector<std::thread> pool;
  for (size_t w = 0; w < threads; ++w)
    pool.emplace_back([&, w] {
      try {
        for (size_t i; (i = next++) < count;) work(i);
      } catch (...) {
        failed[w] = std::current_exception();
      }
    });
  for (std::thread& th : pool) th.join();
  for (const std::exception_ptr& e : failed)
    if (e) std::rethrow_exception(e);
}

}  // namespace np
