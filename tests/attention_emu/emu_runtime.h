// A small SIMT emulator for testing CUDA kernels on a CPU: one block at a time (in grid order or a random
// permutation, block_order), one fiber per thread.
//
// Fibers (ucontext) switch only at synchronisation points: __syncthreads and warp collectives
// (ldmatrix, mma, shuffles), where the waiting fiber yields. The scheduler resumes a random ready
// fiber each time, so warps drift apart in random orders and a missing barrier shows up as stale
// data. cp.async copies complete at issue or at the wait that retires them (copy_mode: random per
// copy, all early, all late), the two ends of what hardware allows: early completion exposes a
// buffer refilled while another warp still reads it, late completion a read before the wait.
// Shared memory starts every block filled with 0xFF bytes (NaN as bf16 and fp32). A collective
// runs when the 32nd lane of a warp arrives; a barrier opens when every live thread has arrived.
// An mbarrier (Hopper's shared-memory barrier) is kept beside shared memory, by address: a thread that waits
// for a phase not yet completed sleeps until the arrival or transaction that completes it. TMA loads land at issue
// or at the first wait on their barrier (copy_mode again), counting their bytes then.
// Errors (divergent collectives, deadlocks, bad addresses) stop the block and are raised from
// launch() as std::runtime_error, never thrown across fiber stacks.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

enum class State { kReady, kBarrier, kWarp, kMbarrier, kNamedBarrier, kDone };

// Asynchronous operations of one issuer in groups (a thread's cp.async, a warpgroup's products): those issued
// since the last commit, then the committed groups, oldest first. Each pending operation runs when its group retires.
struct AsyncGroups {
  std::vector<std::function<void()>> open;
  std::vector<std::vector<std::function<void()>>> groups;

  void commit() {
    groups.push_back(std::move(open));
    open.clear();
  }
  // Runs the oldest groups until at most `keep` remain.
  void retire(size_t keep) {
    while (groups.size() > keep) {
      for (auto& run : groups.front()) run();
      groups.erase(groups.begin());
    }
  }
  bool idle() const { return open.empty() && groups.empty(); }
};

struct Fiber {
  ucontext_t ctx{};
  std::unique_ptr<char[]> stack;
  State state = State::kReady;
  Dim3 tid;
  int linear = 0;
  const void* in = nullptr;  // this lane's operand of the current warp collective
  void* out = nullptr;       // where its result goes
  uint32_t mbarrier = 0;     // the mbarrier it sleeps on (State::kMbarrier)
  int named_barrier = 0;     // the named barrier it waits at (State::kNamedBarrier)
  AsyncGroups copies;  // cp.async
};

// Where the threads of one warp (32 lanes) or one warpgroup (128) gather for a collective.
template <int LANES>
struct GroupSlot {
  int arrived = 0;
  int op = -1;
  Fiber* lanes[LANES] = {};
};
using WarpSlot = GroupSlot<32>;
using WarpgroupSlot = GroupSlot<128>;

// A warpgroup's asynchronous products (wgmma). Each runs when the copy mode says (at issue, or at the wait that
// retires its group), but in issue order, as the hardware runs them: a product runs at issue only when none issued
// before it is still deferred.
struct WarpgroupQueue : AsyncGroups {
  int deferred = 0;  // products queued that have not run
};

// One mbarrier: arrivals still expected in this phase (of `count`), bytes still expected, the phase's parity, and
// the TMA loads that will land at the first wait.
struct Mbarrier {
  int count = 0, pending = 0;
  int64_t tx = 0;
  int phase = 0;
  std::vector<std::function<void()>> late_loads;
};

constexpr size_t kStackBytes = 256 * 1024;

struct Runtime {
  Dim3 grid, block, block_idx;
  std::vector<std::unique_ptr<Fiber>> fibers;
  std::vector<WarpSlot> warps;
  std::vector<WarpgroupSlot> warpgroups;
  std::vector<WarpgroupQueue> wgmma;  // per warpgroup
  std::map<uint32_t, Mbarrier> mbarriers;  // by shared address
  std::map<int, int> named_arrivals;        // named barriers (bar.sync / bar.arrive): threads arrived, by id
  Fiber* current = nullptr;
  ucontext_t scheduler{};
  unsigned char* smem = nullptr;  // 16-byte aligned
  size_t smem_bytes = 0;
  std::unique_ptr<unsigned char[]> smem_store;
  int alive = 0, at_barrier = 0;
  std::function<void()> body;
  std::mt19937_64 rng{12345};
  std::string error;
  uint64_t switches = 0;
  int copy_mode = 0;  // cp.async completion: 0 random per copy, 1 at issue (early), 2 at the retiring wait (late)
  int block_order = 0;  // 0: blocks in x, y, z order; 1: a random permutation (hardware promises no order)
  size_t smem_limit = 99 * 1024;  // a launch's dynamic shared memory at most (sm_86's opt-in limit by default)
};

inline Runtime& rt() {
  static Runtime r;
  return r;
}

inline void yield() {
  Runtime& r = rt();
  ++r.switches;
  swapcontext(&r.current->ctx, &r.scheduler);
}

// Records the first error and parks this fiber for good; the scheduler then abandons the block.
[[noreturn]] inline void fail(const std::string& what) {
  Runtime& r = rt();
  if (r.error.empty()) r.error = what;
  r.current->state = State::kDone;
  for (;;) swapcontext(&r.current->ctx, &r.scheduler);
}

inline void fiber_main() {
  Runtime& r = rt();
  r.body();
  Fiber* f = r.current;
  if (!f->copies.idle()) fail("a thread exited with cp.async copies in flight");
  if (!r.wgmma.empty()) {
    const WarpgroupQueue& q = r.wgmma[f->linear / 128];
    if (!q.idle()) fail("a thread exited with wgmma products in flight");
  }
  f->state = State::kDone;
  --r.alive;
  if (r.at_barrier > 0 && r.at_barrier == r.alive) fail("a thread exited while others wait at __syncthreads");
  // returning resumes uc_link, the scheduler
}

inline void syncthreads() {
  Runtime& r = rt();
  r.current->state = State::kBarrier;
  if (++r.at_barrier == r.alive) {
    for (auto& f : r.fibers)
      if (f->state == State::kBarrier) f->state = State::kReady;
    r.at_barrier = 0;
  }
  yield();
}

// A group-wide operation: every lane of the slot's group deposits `in` / `out`; the last to arrive runs
// compute(lanes).
template <int LANES, typename F>
inline void group_collective(GroupSlot<LANES>& w, int op, const void* in, void* out, F&& compute) {
  Fiber* f = rt().current;
  if (w.arrived == 0) {
    w.op = op;
  } else if (w.op != op) {
    fail(LANES == 32 ? "divergent warp collective (lanes of one warp at different warp-wide instructions)"
                     : "divergent warpgroup collective (threads of one warpgroup at different wgmma instructions)");
  }
  f->in = in;
  f->out = out;
  w.lanes[f->linear % LANES] = f;
  if (++w.arrived == LANES) {
    compute(w.lanes);
    w.arrived = 0;
    for (Fiber* l : w.lanes) l->state = State::kReady;
  } else {
    f->state = State::kWarp;
  }
  yield();
}

// A warp-wide operation (ldmatrix, mma, shuffles).
template <typename F>
inline void collective(int op, const void* in, void* out, F&& compute) {
  group_collective(rt().warps[rt().current->linear / 32], op, in, out, std::forward<F>(compute));
}

// A warpgroup-wide operation (wgmma and its commits and waits): compute(lanes, the warpgroup's index).
template <typename F>
inline void warpgroup_collective(int op, const void* in, void* out, F&& compute) {
  Runtime& r = rt();
  if (r.warpgroups.empty()) fail("a warpgroup instruction in a block that is not a whole number of warpgroups");
  const int wg = r.current->linear / 128;
  group_collective(r.warpgroups[wg], op, in, out, [&](Fiber** lanes) { compute(lanes, wg); });
}

// The mbarrier at `addr` after an arrival or a delivery: a phase completes when nothing more is expected, waking
// its sleepers.
inline void mbarrier_progress(uint32_t addr, Mbarrier& m) {
  if (m.pending != 0 || m.tx != 0) return;
  m.phase ^= 1;
  m.pending = m.count;
  for (auto& f : rt().fibers)
    if (f->state == State::kMbarrier && f->mbarrier == addr) f->state = State::kReady;
}

inline Mbarrier& mbarrier_at(uint32_t addr) {
  auto it = rt().mbarriers.find(addr);
  if (it == rt().mbarriers.end()) fail("an mbarrier used before mbarrier.init (shared address " + std::to_string(addr) + ")");
  return it->second;
}

// Sleeps until the phase of parity `parity` of the mbarrier at `addr` has completed; first lands the loads left
// to the wait.
inline void mbarrier_wait(uint32_t addr, int parity) {
  Runtime& r = rt();
  for (;;) {
    Mbarrier& m = mbarrier_at(addr);
    std::vector<std::function<void()>> loads = std::move(m.late_loads);
    m.late_loads.clear();
    for (auto& load : loads) load();
    if (mbarrier_at(addr).phase != parity) return;
    r.current->state = State::kMbarrier;
    r.current->mbarrier = addr;
    yield();
  }
}

// bar.sync (wait) or bar.arrive on named barrier `id` of `count` threads: it opens when `count` have arrived,
// releasing the threads that wait at it.
inline void named_barrier(int id, int count, bool wait) {
  Runtime& r = rt();
  if (id < 1 || id > 15 || count % 32 != 0 || count < 32) fail("a named barrier needs an id in 1..15 and a count of whole warps");
  if (wait) {
    r.current->state = State::kNamedBarrier;
    r.current->named_barrier = id;
  }
  if (++r.named_arrivals[id] == count) {
    r.named_arrivals[id] = 0;
    for (auto& f : r.fibers)
      if (f->state == State::kNamedBarrier && f->named_barrier == id) f->state = State::kReady;
  }
  yield();
}

inline void run_block(size_t smem_bytes) {
  Runtime& r = rt();
  const int n = static_cast<int>(r.block.x * r.block.y * r.block.z);
  std::memset(r.smem, 0xFF, smem_bytes);
  r.smem_bytes = smem_bytes;
  r.alive = n;
  r.at_barrier = 0;
  for (auto& w : r.warps) w = WarpSlot{};
  for (auto& w : r.warpgroups) w = WarpgroupSlot{};
  for (auto& q : r.wgmma) q = WarpgroupQueue{};
  r.mbarriers.clear();
  r.named_arrivals.clear();
  for (int i = 0; i < n; ++i) {
    Fiber& f = *r.fibers[i];
    f.state = State::kReady;
    f.linear = i;
    f.tid = Dim3{static_cast<unsigned>(i % r.block.x), static_cast<unsigned>(i / r.block.x % r.block.y),
                 static_cast<unsigned>(i / (r.block.x * r.block.y))};
    f.copies = AsyncGroups{};
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &r.scheduler;
    makecontext(&f.ctx, fiber_main, 0);
  }
  std::vector<Fiber*> ready;
  ready.reserve(n);
  while (r.error.empty()) {
    ready.clear();
    for (int i = 0; i < n; ++i)
      if (r.fibers[i]->state == State::kReady) ready.push_back(r.fibers[i].get());
    if (ready.empty()) {
      if (r.alive != 0) r.error = "deadlock: threads wait at a barrier or warp collective that the others never reach";
      break;
    }
    r.current = ready[r.rng() % ready.size()];
    swapcontext(&r.scheduler, &r.current->ctx);
  }
  for (const auto& [id, n] : r.named_arrivals)
    if (r.error.empty() && n != 0) r.error = "named barrier " + std::to_string(id) + " left with arrivals at the block's end";
  for (const auto& [addr, m] : r.mbarriers)
    if (r.error.empty() && !m.late_loads.empty())
      r.error = "TMA loads into the mbarrier at " + std::to_string(addr) + " were never waited for";
  r.current = nullptr;
}

// Runs body() as a kernel: grid x block threads, smem_bytes of dynamic shared memory.
inline void launch(Dim3 grid, Dim3 block, size_t smem_bytes, std::function<void()> body) {
  Runtime& r = rt();
  const unsigned n = block.x * block.y * block.z;
  if (n == 0 || n % 32 != 0 || n > 1024) throw std::runtime_error("emu: block size must be a multiple of 32, at most 1024");
  while (r.fibers.size() < n) {
    auto f = std::make_unique<Fiber>();
    f->stack = std::make_unique<char[]>(kStackBytes);
    r.fibers.push_back(std::move(f));
  }
  r.warps.assign(n / 32, WarpSlot{});
  r.warpgroups.assign(n % 128 == 0 ? n / 128 : 0, WarpgroupSlot{});
  r.wgmma.assign(n / 128, WarpgroupQueue{});
  r.smem_store = std::make_unique<unsigned char[]>(smem_bytes + 32);
  r.smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(r.smem_store.get()) + 15) & ~uintptr_t{15});
  r.grid = grid;
  r.block = block;
  r.body = std::move(body);
  r.error.clear();
  std::vector<uint64_t> order(static_cast<size_t>(grid.x) * grid.y * grid.z);  // linear block ids, x fastest
  std::iota(order.begin(), order.end(), uint64_t{0});
  if (r.block_order == 1) std::shuffle(order.begin(), order.end(), r.rng);
  for (const uint64_t i : order) {
    const unsigned x = static_cast<unsigned>(i % grid.x), y = static_cast<unsigned>(i / grid.x % grid.y);
    const unsigned z = static_cast<unsigned>(i / (static_cast<uint64_t>(grid.x) * grid.y));
    r.block_idx = Dim3{x, y, z};
    run_block(smem_bytes);
    if (!r.error.empty()) {
      const std::string e = "emu: block (" + std::to_string(x) + ", " + std::to_string(y) + ", " +
                            std::to_string(z) + "): " + r.error;
      r.error.clear();
      throw std::runtime_error(e);
    }
  }
}

}  // namespace emu
