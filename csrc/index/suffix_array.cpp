// Suffix-array construction for the token index (op schema + CPU kernel).
//
// suffix_array(tokens) -> sa
//   tokens: int16 (N,) holding uint16 ids, or int32 (N,) holding ids below 2^31 - 2
//   sa:     int32 (N,) whose bits are the uint32 start offsets of the suffixes of `tokens` in
//           lexicographic order (a suffix that is a prefix of another sorts first). N < 2^32.
//
// The algorithm is SA-IS (induced sorting, Nong, Zhang & Chan 2009), written here from the
// paper's description: linear time, ~9 bytes per token of working memory for N < 2^31 (32-bit
// indices) and ~17 for larger shards (64-bit indices), plus the output. A sentinel smaller
// than every token is appended, so token t is stored as t + 1. The reference twin is
// tscale/index/reference.py (sorted suffixes by brute force).
#include <torch/library.h>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <algorithm>
#include <type_traits>
#include <vector>

namespace tscale {
namespace {

template <typename I>
struct Sais {
  // bucket c spans [start(c), end(c)); `bkt` holds either starts or ends (exclusive)
  static void buckets(const I* s, I n, I K, std::vector<I>& bkt, bool ends) {
    bkt.assign(static_cast<size_t>(K) + 1, 0);
    for (I i = 0; i < n; ++i) ++bkt[s[i] + 1];
    for (I c = 1; c <= K; ++c) bkt[c] += bkt[c - 1];
    if (ends) {
      for (I c = 0; c < K; ++c) bkt[c] = bkt[c + 1];
    }
  }

  static bool lms(const std::vector<uint8_t>& t, I i) { return i > 0 && t[i] && !t[i - 1]; }

  static void induce(const I* s, I* sa, I n, I K, const std::vector<uint8_t>& t, std::vector<I>& bkt) {
    buckets(s, n, K, bkt, false);
    for (I i = 0; i < n; ++i) {
      const I j = sa[i] - 1;
      if (sa[i] > 0 && !t[j]) sa[bkt[s[j]]++] = j;
    }
    buckets(s, n, K, bkt, true);
    for (I i = n - 1; i >= 0; --i) {
      const I j = sa[i] - 1;
      if (sa[i] > 0 && t[j]) sa[--bkt[s[j]]] = j;
    }
  }

  // s[0..n) with s[n-1] == 0 the unique smallest symbol, symbols < K; sa gets n entries.
  static void run(const I* s, I* sa, I n, I K) {
    std::vector<uint8_t> t(n);  // 1 = S-type, 0 = L-type
    t[n - 1] = 1;
    if (n >= 2) t[n - 2] = 0;
    for (I i = n - 3; i >= 0; --i) t[i] = s[i] < s[i + 1] || (s[i] == s[i + 1] && t[i + 1]);
    std::vector<I> bkt;

    // stage 1: sort the LMS substrings by induction
    buckets(s, n, K, bkt, true);
    std::fill(sa, sa + n, I(-1));
    for (I i = 1; i < n; ++i)
      if (lms(t, i)) sa[--bkt[s[i]]] = i;
    induce(s, sa, n, K, t, bkt);

    I n1 = 0;
    for (I i = 0; i < n; ++i)
      if (lms(t, sa[i])) sa[n1++] = sa[i];

    // name the LMS substrings; equal substrings get equal names
    std::fill(sa + n1, sa + n, I(-1));
    I name = 0, prev = -1;
    for (I i = 0; i < n1; ++i) {
      const I pos = sa[i];
      bool diff = prev < 0;
      for (I d = 0; !diff; ++d) {
        if (s[pos + d] != s[prev + d] || t[pos + d] != t[prev + d]) {
          diff = true;
        } else if (d > 0 && (lms(t, pos + d) || lms(t, prev + d))) {
          break;
        }
      }
      if (diff) {
        ++name;
        prev = pos;
      }
      sa[n1 + pos / 2] = name - 1;
    }
    for (I i = n - 1, j = n - 1; i >= n1; --i)
      if (sa[i] >= 0) sa[j--] = sa[i];

    // stage 2: sort the reduced string (recursively when names repeat)
    I* s1 = sa + n - n1;
    I* sa1 = sa;
    if (name < n1) {
      run(s1, sa1, n1, name);
    } else {
      for (I i = 0; i < n1; ++i) sa1[s1[i]] = i;
    }

    // stage 3: place the sorted LMS suffixes at their bucket ends and induce the rest
    buckets(s, n, K, bkt, true);
    for (I i = 1, j = 0; i < n; ++i)
      if (lms(t, i)) s1[j++] = i;
    for (I i = 0; i < n1; ++i) sa1[i] = s1[sa1[i]];
    std::fill(sa + n1, sa + n, I(-1));
    for (I i = n1 - 1; i >= 0; --i) {
      const I j = sa[i];
      sa[i] = -1;
      sa[--bkt[s[j]]] = j;
    }
    induce(s, sa, n, K, t, bkt);
  }
};

// Read token i as a non-negative id: int16 tensors hold uint16 ids, int32 tensors uint32 ids.
template <typename T>
int64_t token_at(const T* p, int64_t i) {
  return static_cast<int64_t>(static_cast<std::make_unsigned_t<T>>(p[i]));
}

template <typename I, typename T>
int64_t fill_text(const T* tp, int64_t n, I* s) {
  int64_t vocab = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = token_at(tp, i);
    vocab = std::max(vocab, v + 1);
    s[i] = static_cast<I>(v + 1);
  }
  s[n] = 0;
  return vocab;
}

// Sort with index type I into sa (n + 1 entries), then leave the uint32 result in out[0..n).
template <typename I, typename T>
void build(const T* tp, int64_t n, I* sa, uint32_t* out) {
  std::vector<I> s(n + 1);
  const int64_t vocab = fill_text(tp, n, s.data());
  TORCH_CHECK(vocab < (int64_t(1) << 31) - 1, "suffix_array: token ids must be below 2^31 - 2");
  Sais<I>::run(s.data(), sa, static_cast<I>(n + 1), static_cast<I>(vocab + 1));
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(sa[i + 1]);  // sa[0] is the sentinel
}

template <typename T>
at::Tensor build_for(const at::Tensor& tokens) {
  const int64_t n = tokens.numel();
  const T* tp = tokens.data_ptr<T>();
  if (n + 1 < (int64_t(1) << 31)) {
    at::Tensor sa = at::empty({n + 1}, tokens.options().dtype(at::kInt));
    int32_t* sp = sa.data_ptr<int32_t>();
    build<int32_t>(tp, n, sp, reinterpret_cast<uint32_t*>(sp));
    return sa.narrow(0, 0, n);  // one spare element in the storage, no copy
  }
  at::Tensor out = at::empty({n}, tokens.options().dtype(at::kInt));
  std::vector<int64_t> sa(n + 1);
  build<int64_t>(tp, n, sa.data(), reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()));
  return out;
}

at::Tensor suffix_array_cpu(const at::Tensor& tokens_in) {
  TORCH_CHECK(tokens_in.dim() == 1, "suffix_array: tokens must be 1-D");
  const auto st = tokens_in.scalar_type();
  TORCH_CHECK(st == at::kShort || st == at::kInt, "suffix_array: tokens must be int16 (uint16 ids) or int32 (uint32 ids)");
  const int64_t n = tokens_in.numel();
  TORCH_CHECK(n < (int64_t(1) << 32), "suffix_array: at most 2^32 - 1 tokens per shard, got ", n);
  if (n == 0) return at::empty({0}, tokens_in.options().dtype(at::kInt));
  const at::Tensor tokens = tokens_in.contiguous();
  return st == at::kShort ? build_for<int16_t>(tokens) : build_for<int32_t>(tokens);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(tscale, m) {
  m.def("suffix_array(Tensor tokens) -> Tensor");
}

TORCH_LIBRARY_IMPL(tscale, CPU, m) {
  m.impl("suffix_array", &suffix_array_cpu);
}

}  // namespace tscale
