// Interleaved execution of memory-bound searches: coroutine tasks, a frame pool and a round-robin scheduler.
//
// A lookup in a suffix array is a chain of dependent cache misses (sa[m], then the text at sa[m]), each
// ~100-200 ns on a large index, with the core idle in between. Written as coroutines, the searches of
// several independent query chunks run on one thread: before a load that likely misses, a search
// prefetches it and suspends (`co_await fetch(p)`), the scheduler resumes the next chunk's search, and
// by the time the first one is resumed its data has arrived. The misses of the chunks overlap.
//
//   Task<T>         a lazily started coroutine returning T; `co_await task` runs it to completion
//                   (suspending with it wherever it suspends) and gives its value
//   fetch(p)        prefetch p and yield the thread to the next stream; suspend() yields without one
//   run_interleaved(jobs, width, make)
//                   runs make(job, slot) -> Task<void> for every job in [0, jobs), `width` at a time,
//                   slot in [0, width) naming the stream that runs it (for per-stream scratch)
//
// Frames come from a per-thread free list by 64-byte size class: a lookup creates several per position.
// Tasks must not throw (an exception terminates). A width of 1 runs the jobs one after another.
#pragma once

#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <new>
#include <utility>
#include <vector>

namespace tscale::interleave {

class FramePool {
 public:
  static void* get(std::size_t size) {
    const std::size_t c = size_class(size);
    if (c >= kClasses) return ::operator new(size);
    auto& free = pool().free[c];
    if (free.empty()) return ::operator new(c * kGranule + kGranule);
    void* p = free.back();
    free.pop_back();
    return p;
  }
  static void put(void* p, std::size_t size) {
    const std::size_t c = size_class(size);
    if (c >= kClasses) {
      ::operator delete(p);
      return;
    }
    pool().free[c].push_back(p);
  }

 private:
  static constexpr std::size_t kGranule = 64, kClasses = 32;  // frames up to 2 KiB are pooled
  static std::size_t size_class(std::size_t size) { return (size - 1) / kGranule; }
  struct Lists {
    std::vector<void*> free[kClasses];
    ~Lists() {
      for (auto& list : free)
        for (void* p : list) ::operator delete(p);
    }
  };
  static Lists& pool() {
    static thread_local Lists lists;
    return lists;
  }
};

// The handle the running stream resumes at next; set by the scheduler before each resume.
inline thread_local std::coroutine_handle<>* resume_point = nullptr;

struct Yield {
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) const noexcept { *resume_point = h; }
  void await_resume() const noexcept {}
};

inline Yield suspend() { return {}; }

inline Yield fetch(const void* p) {
  __builtin_prefetch(p);
  return {};
}

template <typename T>
struct Result {
  T value{};
  void return_value(T v) { value = std::move(v); }
  T take() { return std::move(value); }
};

template <>
struct Result<void> {
  void return_void() {}
  void take() {}
};

template <typename T>
class [[nodiscard]] Task {
 public:
  struct promise_type : Result<T> {
    std::coroutine_handle<> parent;  // resumed when this task finishes; none for a stream's root

    Task get_return_object() { return Task(std::coroutine_handle<promise_type>::from_promise(*this)); }
    std::suspend_always initial_suspend() noexcept { return {}; }
    auto final_suspend() noexcept {
      struct ToParent {
        bool await_ready() const noexcept { return false; }
        std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) const noexcept {
          const std::coroutine_handle<> p = h.promise().parent;
          return p ? p : std::noop_coroutine();
        }
        void await_resume() const noexcept {}
      };
      return ToParent{};
    }
    void unhandled_exception() noexcept { std::terminate(); }
    static void* operator new(std::size_t size) { return FramePool::get(size); }
    static void operator delete(void* p, std::size_t size) { FramePool::put(p, size); }
  };

  Task() = default;
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() {
    if (h_) h_.destroy();
  }

  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> parent) noexcept {
    h_.promise().parent = parent;
    return h_;  // symmetric transfer: the child runs now, the parent resumes when it finishes
  }
  T await_resume() { return h_.promise().take(); }

  std::coroutine_handle<> handle() const { return h_; }
  bool done() const { return h_.done(); }

 private:
  explicit Task(std::coroutine_handle<promise_type> h) : h_(h) {}
  std::coroutine_handle<promise_type> h_;
};

template <typename Make>
void run_interleaved(int64_t jobs, int64_t width, Make make) {
  struct Stream {
    Task<void> root;
    std::coroutine_handle<> at;
    int64_t slot;
  };
  std::vector<Stream> live;
  int64_t next = 0;
  for (int64_t s = 0; s < width && next < jobs; ++s, ++next) {
    live.push_back({make(next, s), {}, s});
    live.back().at = live.back().root.handle();
  }
  while (!live.empty()) {
    for (std::size_t i = 0; i < live.size();) {
      Stream& s = live[i];
      resume_point = &s.at;
      s.at.resume();
      if (!s.root.done()) {
        ++i;
      } else if (next < jobs) {
        s.root = make(next++, s.slot);
        s.at = s.root.handle();
        ++i;
      } else {
        live[i] = std::move(live.back());
        live.pop_back();
      }
    }
  }
  resume_point = nullptr;
}

}  // namespace tscale::interleave
